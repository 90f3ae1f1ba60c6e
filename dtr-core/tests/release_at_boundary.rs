//! `release_at_boundary` (on by default): at an iteration boundary a
//! caching-allocator budget gives its cached free segments back, so an
//! iteration that runs online places its storages as the first did, not in
//! the segments the end of the previous iteration left cached
//! (docs/dtr-results.md, *The online step on a cache the step before left*).

use remat_dtr::replay::{replay_ratio_iterations, IterationRow, ReplayStatus};
use remat_dtr::{BudgetMode, DtrConfig, PolicyKind};
use remat_trace::Trace;

mod mixed;
use mixed::{mixed_step, KIB};

/// Backward sizes unlike the forward's, so the segments cached at a step's
/// end are cut for the backward's requests, not the forward's.
fn backward_size(i: usize) -> u64 {
    [700u64, 11 << 10, 2 << 10, 5 << 10][i % 4] * KIB
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
    let trace = mixed_step(40, backward_size);
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
        &mixed_step(20, backward_size),
        0.4,
        BudgetMode::Logical,
        PolicyKind::Remat,
        &config,
        2,
    )
    .unwrap();
    assert!(r.iterations.iter().all(|it| it.released_bytes == 0));
}
