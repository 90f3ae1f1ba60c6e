//! Eviction decision time at 5 000 candidates, per policy (criterion).
//!
//! A runtime holds 5 000 resident, evictable storages produced by a random DAG of
//! ops (every 10th evicted, so e* walks and union-find components are not empty);
//! each iteration asks the policy for its victims for one request
//! ([`remat_dtr::Runtime::decide`], a dry run: nothing is evicted, so every
//! iteration sees the same state). The default (`remat`, √N sampling) is the figure
//! the issue's ≤ 1 µs target is about; full scans are shown for comparison.
//!
//! `dtr_decision_levers_5k`: the whole decision, the victims and, for each,
//! the lever ([`remat_dtr::Runtime::decide_levers`]: swap it to host memory
//! or evict it for recomputation), with swap off (every victim recomputed,
//! the baseline) and on at 24 GB/s, on the same graph: what a swap decision
//! costs against a recompute decision.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use remat_dtr::swap::NoValues;
use remat_dtr::{BudgetMode, DtrConfig, FnOp, OpError, OpHandle, OutputSpec, PolicyKind, Runtime};

const CANDIDATES: usize = 5_000;

fn build(policy: PolicyKind, mode: BudgetMode, sampling: bool) -> Runtime<()> {
    build_with(policy, mode, sampling, None)
}

/// [`build`] with swap on at `swap_gbps` (the replayer's value-free copies).
fn build_with(
    policy: PolicyKind,
    mode: BudgetMode,
    sampling: bool,
    swap_gbps: Option<f64>,
) -> Runtime<()> {
    let c = DtrConfig::default()
        .with_budget(64 << 30)
        .with_budget_mode(mode)
        .with_policy(policy)
        .with_sampling(sampling)
        .with_seed(42)
        .with_swap(swap_gbps);
    let mut rt: Runtime<()> = Runtime::new(c).expect("runtime");
    if swap_gbps.is_some() {
        rt.set_host_transfer(Box::new(NoValues)).expect("swap on");
    }
    let f: Arc<dyn OpHandle<()>> = Arc::new(FnOp::new("f", |_: &[&()]| Ok::<_, OpError>(vec![()])));
    let x = rt.put((), 1 << 20).expect("put");
    let mut ts = vec![x];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for i in 0..CANDIDATES + CANDIDATES / 9 + 2 {
        let a = ts[ts.len() - 1];
        let b = ts[rnd(ts.len())];
        let bytes = (64 << 10) + (rnd(64) as u64) * (96 << 10);
        let t = rt
            .apply(
                f.clone(),
                &[a, b],
                &[OutputSpec::fresh(bytes)],
                1_000 + (i as u64 % 97) * 100,
            )
            .expect("apply")[0];
        ts.push(t);
    }
    for t in ts.iter().skip(1).step_by(10) {
        rt.evict(*t).expect("evict");
    }
    rt
}

fn decision(c: &mut Criterion) {
    let mut g = c.benchmark_group("dtr_decision_5k");
    g.throughput(Throughput::Elements(1));
    let cases = [
        ("remat", PolicyKind::Remat, BudgetMode::Logical, true),
        ("dtr-eq", PolicyKind::DtrEq, BudgetMode::Logical, true),
        (
            "megengine",
            PolicyKind::MegEngine,
            BudgetMode::Physical,
            true,
        ),
        ("lru", PolicyKind::Lru, BudgetMode::Logical, true),
        ("dtr", PolicyKind::Dtr, BudgetMode::Logical, true),
        (
            "dtr-eq-full-scan",
            PolicyKind::DtrEq,
            BudgetMode::Logical,
            false,
        ),
        (
            "remat-physical-window",
            PolicyKind::Remat,
            BudgetMode::Physical,
            true,
        ),
        (
            "coop-physical",
            PolicyKind::Coop,
            BudgetMode::Physical,
            true,
        ),
    ];
    for (name, policy, mode, sampling) in cases {
        let mut rt = build(policy, mode, sampling);
        assert!(
            rt.candidate_count() >= CANDIDATES,
            "{}",
            rt.candidate_count()
        );
        g.bench_with_input(BenchmarkId::new(name, CANDIDATES), &(), |b, _| {
            b.iter(|| black_box(rt.decide(black_box(8 << 20)).first().copied()))
        });
    }
    g.finish();
}

fn levers(c: &mut Criterion) {
    let mut g = c.benchmark_group("dtr_decision_levers_5k");
    g.throughput(Throughput::Elements(1));
    for (name, mode) in [
        ("remat", BudgetMode::Logical),
        ("remat-physical-window", BudgetMode::Physical),
    ] {
        for (lever, gbps) in [("recompute-only", None), ("swap-24GBps", Some(24.0))] {
            let mut rt = build_with(PolicyKind::Remat, mode, true, gbps);
            assert_eq!(rt.swap_enabled(), gbps.is_some());
            let id = BenchmarkId::new(format!("{name}/{lever}"), CANDIDATES);
            g.bench_with_input(id, &(), |b, _| {
                b.iter(|| black_box(rt.decide_levers(black_box(8 << 20)).len()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, decision, levers);
criterion_main!(benches);
