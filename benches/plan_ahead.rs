//! Cost per op of the planned path against the online one (criterion).
//!
//! One training-like step on a value-free `Runtime<()>`: a forward chain of
//! `LAYERS` activations (each reads the one before and a weight), a backward pass
//! that reads them in reverse, an in-place update of each weight; then
//! `end_iteration`. Three runtimes, measured side by side per op:
//!
//! - `unbudgeted`: no budget (no recording, no eviction): the bookkeeping floor;
//! - `online`: a physical budget of 40 % of the peak, plan-ahead off: every
//!   eviction is a policy decision over the caching allocator;
//! - `planned`: the same budget with plan-ahead on, measured after the plan is in
//!   force (evictions and offsets come from the plan; `end_iteration` keeps it).
//!
//! `cargo bench --bench plan_ahead`; the figures are in docs/dtr-results.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use remat_dtr::{DtrConfig, FnOp, OpError, OpHandle, OutputSpec, Runtime, TensorId};

const LAYERS: usize = 400;
const ACT: u64 = 4 << 20;

struct Update;
impl OpHandle<()> for Update {
    fn name(&self) -> &str {
        "update"
    }
    fn compute(&self, _: &[&()]) -> Result<Vec<()>, OpError> {
        Ok(vec![()])
    }
    fn recomputable(&self) -> bool {
        false
    }
}

/// One step; returns the number of runtime calls it made.
fn step(rt: &mut Runtime<()>, weights: &[TensorId], ops: &Ops) -> u64 {
    let [fwd, bwd, upd] = ops;
    let mut calls = 0u64;
    let x = rt.put((), ACT).expect("put");
    let mut acts = vec![x];
    for (i, &w) in weights.iter().enumerate() {
        let prev = acts[acts.len() - 1];
        let cost = 10_000 + (i as u64 % 7) * 1_000;
        acts.push(
            rt.apply(fwd.clone(), &[prev, w], &[OutputSpec::fresh(ACT)], cost)
                .expect("fwd")[0],
        );
    }
    calls += 1 + weights.len() as u64;
    let mut d = rt
        .apply(
            bwd.clone(),
            &[acts[acts.len() - 1]],
            &[OutputSpec::fresh(ACT)],
            5_000,
        )
        .expect("loss")[0];
    calls += 1;
    for (i, &w) in weights.iter().enumerate().rev() {
        let nd = rt
            .apply(
                bwd.clone(),
                &[d, acts[i], w],
                &[OutputSpec::fresh(ACT)],
                20_000,
            )
            .expect("bwd")[0];
        rt.mutate(upd.clone(), &[w, nd], &[0], 3_000)
            .expect("update");
        rt.release(d).expect("release");
        rt.release(acts[i + 1]).expect("release");
        d = nd;
        calls += 4;
    }
    rt.release(d).expect("release");
    rt.release(acts[0]).expect("release");
    calls += 2;
    rt.end_iteration().expect("end_iteration");
    calls
}

/// The forward, backward and update ops of a step.
type Ops = [Arc<dyn OpHandle<()>>; 3];

fn runtime(config: DtrConfig) -> (Runtime<()>, Vec<TensorId>, Ops) {
    let mut rt: Runtime<()> = Runtime::new(config).expect("runtime");
    let weights = (0..LAYERS)
        .map(|_| rt.put((), 64 << 10).expect("weight"))
        .collect();
    let f = |name: &'static str| -> Arc<dyn OpHandle<()>> {
        Arc::new(FnOp::new(name, |_: &[&()]| Ok::<_, OpError>(vec![()])))
    };
    (rt, weights, [f("fwd"), f("bwd"), Arc::new(Update)])
}

fn plan_ahead(c: &mut Criterion) {
    // The unbudgeted peak, then 40 % of it.
    let (mut rt, ws, ops) = runtime(DtrConfig::default());
    let calls = step(&mut rt, &ws, &ops);
    let budget = rt.stats().peak_live_bytes * 4 / 10;
    let mut g = c.benchmark_group("plan_ahead_per_call");
    g.throughput(Throughput::Elements(calls));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    let cases = [
        ("unbudgeted", DtrConfig::default()),
        (
            "online",
            DtrConfig::default()
                .with_budget(budget)
                .with_plan_ahead(false),
        ),
        ("planned", DtrConfig::default().with_budget(budget)),
    ];
    for (name, config) in cases {
        let (mut rt, ws, ops) = runtime(config);
        // Three steps: record, record from a repeating start, plan.
        for _ in 0..3 {
            step(&mut rt, &ws, &ops);
        }
        if name == "planned" {
            assert!(rt.current_plan().is_some(), "no plan in force");
        }
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(step(&mut rt, &ws, &ops));
                }
                t.elapsed()
            })
        });
        if name == "planned" {
            assert_eq!(rt.stats().divergences, 0, "the planned steps diverged");
        }
    }
    g.finish();
}

criterion_group!(benches, plan_ahead);
criterion_main!(benches);
