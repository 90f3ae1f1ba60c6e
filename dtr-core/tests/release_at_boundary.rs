//! `release_at_boundary` (on by default): at an iteration boundary a
//! caching-allocator budget gives its cached free segments back, so an
//! iteration that runs online places its storages as the first did, not in
//! the segments the end of the previous iteration left cached
//! (docs/dtr-results.md, *The online step on a cache the step before left*).

use remat_dtr::replay::{replay_ratio_iterations, IterationRow, ReplayStatus};
use remat_dtr::{BudgetMode, DtrConfig, PolicyKind};
use remat_trace::{Trace, TraceBuilder};

const KIB: u64 = 1 << 10;

/// A training step whose forward and backward allocate different sizes (so
/// the segments cached at its end are cut for the backward's requests, not
/// the forward's): a forward chain, a loss, a backward reading each
/// activation in reverse.
fn step(layers: usize) -> Trace {
    let mut t = TraceBuilder::new("mixed").constant("x", 256 * KIB);
    let mut prev = "x".to_string();
    let fwd = |i: usize| [3u64 << 10, 17 << 10, 9 << 10, 25 << 10, 6 << 10, 600][i % 6] * KIB;
    let bwd = |i: usize| [700u64, 11 << 10, 2 << 10, 5 << 10][i % 4] * KIB;
    for i in 0..layers {
        let a = format!("a{i}");
        t = t.call("fwd", &[&prev], &a, fwd(i), 1_000 + 300 * (i as u64 % 3));
        prev = a;
    }
    t = t.call("loss", &[&prev], "loss", KIB, 100).backward();
    let mut grad = "loss".to_string();
    for i in (0..layers).rev() {
        let a = format!("a{i}");
        let g = format!("g{i}");
        t = t
            .call("bwd", &[&grad, &a], &g, bwd(i), 2_000)
            .release(&grad)
            .release(&a);
        grad = g;
    }
    t.release(&grad).build().expect("the step replays")
}

/// Three iterations, all online (plan-ahead off), under a physical budget.
fn online(trace: &Trace, ratio: f64, release: bool) -> Vec<IterationRow> {
    let config = DtrConfig::default()
        .with_plan_ahead(false)
        .with_release_at_boundary(release);
    let r = replay_ratio_iterations(
        trace,
        ratio,
        BudgetMode::Physical,
        PolicyKind::Remat,
        &config,
        3,
    )
    .unwrap();
    assert_eq!(r.iterations.len(), 3, "{ratio}: {:?}", r.iterations);
    r.iterations
}

fn figures(it: &IterationRow) -> (ReplayStatus, u64, u64, u64) {
    (
        it.status,
        it.evictions,
        it.rematerializations,
        (it.overhead * 1e9) as u64,
    )
}

#[test]
fn an_online_iteration_after_the_first_starts_from_an_empty_cache() {
    let trace = step(40);
    let mut differs_without = 0;
    for ratio in [0.6, 0.5, 0.4, 0.3] {
        let with = online(&trace, ratio, true);
        assert!(with[0].evictions > 0, "{ratio}: the budget must bind");
        for it in &with {
            assert!(it.released_bytes > 0, "{ratio}: {it:?}");
        }
        // Nothing but the constant is live at a boundary: with the cache
        // given back, each online iteration repeats the first.
        assert_eq!(figures(&with[1]), figures(&with[0]), "{ratio}");
        assert_eq!(figures(&with[2]), figures(&with[0]), "{ratio}");
        let without = online(&trace, ratio, false);
        assert_eq!(figures(&without[0]), figures(&with[0]), "{ratio}: step 1");
        assert!(without.iter().all(|it| it.released_bytes == 0));
        if figures(&without[1]) != figures(&with[1]) {
            differs_without += 1;
        }
    }
    // The cache the first iteration left changes what the second does.
    assert!(differs_without > 0, "the test must see the cache matter");
}

#[test]
fn a_logical_budget_caches_nothing_to_release() {
    let config = DtrConfig::default().with_plan_ahead(false);
    let r = replay_ratio_iterations(
        &step(20),
        0.4,
        BudgetMode::Logical,
        PolicyKind::Remat,
        &config,
        2,
    )
    .unwrap();
    assert!(r.iterations.iter().all(|it| it.released_bytes == 0));
}
