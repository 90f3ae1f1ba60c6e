//! remat's default policy under a full scan (`sampling:off`) picks the h_DTR
//! argmin over every candidate, not over the 16 that its local screen keeps.
//!
//! The locally cheapest candidates (own cost / (bytes · staleness)) are often
//! cheap only because their own op is cheap while their evicted parents are
//! not: ranking just those evicts them, ties their regeneration to their
//! parents', and on Burn's test model at 30 % of its peak this thrashed
//! (docs/burn.md, "Low budgets and policies").
//!
//! With √N sampling on, remat still ranks a pool of at most
//! `RematPolicy::SCREEN`² = 256 candidates whole: a √N sample of it would hold
//! at most the screen's 16, so sampling would save no walk and only hide the
//! argmin (Burn's CTC gradient at 4 KiB replayed 199× its ops that way).

use std::sync::Arc;

use remat_dtr::{BudgetMode, DtrConfig, FnOp, OpError, OpHandle, OutputSpec, PolicyKind, Runtime};

fn op() -> Arc<dyn OpHandle<u64>> {
    Arc::new(FnOp::new("f", |ins: &[&u64]| {
        Ok::<_, OpError>(vec![ins
            .iter()
            .fold(1u64, |h, v| h.wrapping_mul(31).wrapping_add(**v))])
    }))
}

/// Pairs p_i → q_i (p: 1000 ns, evicted by hand; q: 1 ns, 100 B), then w
/// (10 ns, 100 000 B, newest). Every q is locally cheaper than w, more of them
/// than the screen keeps, but each q's e* carries its evicted parent:
/// h(q_0) = 1001 / (100 · ~16 000) ≈ 6e-4 at best, h(w) = 10 / (100 000 · 1) = 1e-4.
/// One eviction places the request. Returns (q evicted?, w evicted?).
fn run(policy: PolicyKind, pairs: usize) -> (Vec<bool>, bool) {
    run_sampled(policy, pairs, false)
}

fn run_sampled(policy: PolicyKind, pairs: usize, sampling: bool) -> (Vec<bool>, bool) {
    let resident = 10 + pairs as u64 * 100 + 100_000;
    let c = DtrConfig::default()
        .with_budget(resident + 50)
        .with_budget_mode(BudgetMode::Logical)
        .with_policy(policy)
        .with_sampling(sampling)
        .with_filter(false);
    let mut rt: Runtime<u64> = Runtime::new(c).unwrap();
    let x = rt.put(0, 10).unwrap();
    let f = op();
    let mut qs = Vec::new();
    for _ in 0..pairs {
        let p = rt
            .apply(f.clone(), &[x], &[OutputSpec::fresh(100)], 1000)
            .unwrap()[0];
        let q = rt
            .apply(f.clone(), &[p], &[OutputSpec::fresh(100)], 1)
            .unwrap()[0];
        assert!(rt.evict(p).unwrap());
        qs.push(q);
    }
    let w = rt
        .apply(f.clone(), &[x], &[OutputSpec::fresh(100_000)], 10)
        .unwrap()[0];
    let before = rt.stats().evictions;
    rt.apply(f, &[x], &[OutputSpec::fresh(100)], 1).unwrap();
    assert_eq!(rt.stats().evictions, before + 1, "{policy}");
    rt.check_invariants().unwrap();
    let q_evicted = qs.iter().map(|q| !rt.is_resident(*q).unwrap()).collect();
    (q_evicted, !rt.is_resident(w).unwrap())
}

#[test]
fn full_scan_remat_ranks_past_the_screen() {
    // 17 pairs: more locally cheap candidates than the screen's 16.
    for policy in [PolicyKind::Dtr, PolicyKind::Remat] {
        let (q, w) = run(policy, 17);
        assert!(w, "{policy}: w (the h_DTR argmin) not evicted");
        assert!(q.iter().all(|e| !e), "{policy}: evicted a q: {q:?}");
    }
}

#[test]
fn full_scan_remat_agrees_with_a_small_screen() {
    // 4 pairs: everybody fits in the screen; the argmin is the same.
    let (q, w) = run(PolicyKind::Remat, 4);
    assert!(w && q.iter().all(|e| !e), "{q:?} {w}");
}

#[test]
fn sampled_remat_ranks_a_small_pool_whole() {
    // 17 and 40 pairs: 18 and 41 candidates, at most 256, so the √N sample
    // is not drawn and the argmin w is found as under a full scan. Under the
    // old rule (sample above 16) a sample of 5–7 of them missed w (more pairs
    // would make the oldest q the argmin: its staleness grows).
    for pairs in [17, 40] {
        let (q, w) = run_sampled(PolicyKind::Remat, pairs, true);
        assert!(w, "{pairs} pairs: w (the h_DTR argmin) not evicted");
        assert!(q.iter().all(|e| !e), "{pairs} pairs: evicted a q");
    }
}
