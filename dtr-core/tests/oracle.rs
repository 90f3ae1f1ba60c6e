//! The analysis oracles read the trace's future correctly (a hand-built case where
//! only knowing the next read avoids a rematerialization) and replay traces with
//! views, in-place ops and releases to the end in both budget modes.

use remat_dtr::replay::oracle::OracleKind;
use remat_dtr::replay::{replay, ReplayOptions, ReplayStatus};
use remat_dtr::{BudgetMode, PolicyKind};
use remat_trace::{Trace, TraceBuilder};

/// `a` and `b` are alike (same op cost and size) but `a` is older; when `c`
/// needs room, only `b` is never read again, and `a` is read right after.
fn next_read_case(bytes: u64) -> Trace {
    let mut t = TraceBuilder::new("next-read")
        .constant("x", bytes)
        .call("f", &["x"], "a", bytes, 1000)
        .call("g", &["x"], "b", bytes, 1000)
        .call("h", &["x"], "c", bytes, 1000)
        .call("k", &["a"], "d", bytes, 1000);
    for n in ["x", "a", "b", "c", "d"] {
        t = t.release(n);
    }
    t.build().expect("hand-built trace replays")
}

/// Replays `trace`; returns the policy name, rematerializations and evictions.
fn run(
    trace: &Trace,
    budget: u64,
    mode: BudgetMode,
    oracle: Option<OracleKind>,
) -> (String, u64, u64) {
    let base = remat_trace::baseline(trace).expect("baseline");
    let mut opts = ReplayOptions::budget(budget, mode, PolicyKind::Remat);
    opts.oracle = oracle;
    let r = replay(trace, &opts, base.compute_ns).expect("replay");
    assert_eq!(r.status, ReplayStatus::Ok, "{r:?}");
    (r.policy, r.rematerializations, r.evictions)
}

#[test]
fn the_next_use_oracle_evicts_what_is_never_read_again() {
    // Logical: three of the four storages fit.
    let trace = next_read_case(1000);
    let (name, remats, _) = run(&trace, 3000, BudgetMode::Logical, Some(OracleKind::NextUse));
    assert_eq!(name, "oracle:next-use");
    assert_eq!(
        remats, 0,
        "the oracle must keep `a`, read at the next instruction"
    );
    let (_, remats, _) = run(&trace, 3000, BudgetMode::Logical, None);
    assert!(
        remats > 0,
        "without the future, staleness picks the older `a`"
    );
    // Physical: 600 KiB blocks, three per 2 MiB small segment, one segment.
    let trace = next_read_case(600 << 10);
    let (_, remats, _) = run(
        &trace,
        2 << 20,
        BudgetMode::Physical,
        Some(OracleKind::NextUse),
    );
    assert_eq!(remats, 0);
    let (_, remats, _) = run(&trace, 2 << 20, BudgetMode::Physical, None);
    assert!(remats > 0);
}

/// A chain with a view, an in-place op, a backward annotation and releases.
fn chain() -> Trace {
    let kb = 300 << 10;
    let mut t = TraceBuilder::new("chain").constant("w", kb);
    let mut prev = "w".to_string();
    for i in 0..12 {
        let out = format!("y{i}");
        t = t.call("f", &[&prev, "w"], &out, kb, 1000);
        prev = out;
    }
    t = t
        .view("view", &["y11"], "v", 0, kb, 10)
        .mutate("add_", &["y5", "v"], &[0], 500)
        .backward();
    for i in (0..12).rev() {
        let (y, z) = (format!("y{i}"), format!("z{i}"));
        t = t
            .call("g", &[&y, "v"], &z, kb, 1000)
            .release(&z)
            .release(&y);
    }
    t.release("v").build().expect("chain replays")
}

#[test]
fn every_oracle_replays_views_mutation_and_releases_to_the_end() {
    let trace = chain();
    let peak = remat_trace::baseline(&trace).unwrap().peak_bytes;
    for oracle in OracleKind::ALL {
        for (mode, budget) in [
            (BudgetMode::Logical, peak / 2),
            (BudgetMode::Physical, 4 << 20),
        ] {
            let (name, _, evictions) = run(&trace, budget, mode, Some(oracle));
            assert_eq!(name, format!("oracle:{}", oracle.name()));
            assert!(evictions > 0, "{oracle} {mode}: the budget must bind");
        }
    }
}
