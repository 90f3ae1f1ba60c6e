//! The analysis oracles read the trace's future correctly (a hand-built case where
//! only knowing the next read avoids a rematerialization) and replay traces with
//! views, in-place ops and releases to the end in both budget modes.

use remat_dtr::replay::oracle::OracleKind;
use remat_dtr::replay::{replay, ReplayOptions, ReplayStatus};
use remat_dtr::{BudgetMode, PolicyKind};
use remat_trace::Trace;

/// `CALL name(args) -> out` with a fresh output of `bytes`.
fn call(name: &str, args: &[&str], out: &str, bytes: u64) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "{{\"INSTRUCTION\":\"CALL\",\"NAME\":\"{name}\",\"ARGS\":[{}],\"RESULT\":[\"{out}\"],\"TIME\":\"1000\"}}\n\
         {{\"INSTRUCTION\":\"MEMORY\",\"NAME\":\"{out}\",\"MEMORY\":\"{bytes}\"}}\n\
         {{\"INSTRUCTION\":\"ALIAS\",\"NAME\":\"{out}\",\"ALIAS\":\"-1\"}}\n",
        args.join(",")
    )
}

fn release(name: &str) -> String {
    format!("{{\"INSTRUCTION\":\"RELEASE\",\"NAME\":\"{name}\"}}\n")
}

/// `a` and `b` are alike (same op cost and size) but `a` is older; when `c`
/// needs room, only `b` is never read again, and `a` is read right after.
fn next_read_case(bytes: u64) -> Trace {
    let mut t = String::from("{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"}\n");
    t += "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"x\"}\n";
    t += &format!("{{\"INSTRUCTION\":\"MEMORY\",\"NAME\":\"x\",\"MEMORY\":\"{bytes}\"}}\n");
    t += &call("f", &["x"], "a", bytes);
    t += &call("g", &["x"], "b", bytes);
    t += &call("h", &["x"], "c", bytes);
    t += &call("k", &["a"], "d", bytes);
    for n in ["x", "a", "b", "c", "d"] {
        t += &release(n);
    }
    Trace::parse("next-read", &t).expect("hand-built trace parses")
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
    let mut t = String::from("{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"}\n");
    t += "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"w\"}\n";
    t += &format!("{{\"INSTRUCTION\":\"MEMORY\",\"NAME\":\"w\",\"MEMORY\":\"{kb}\"}}\n");
    let mut prev = "w".to_string();
    for i in 0..12 {
        let out = format!("y{i}");
        t += &call("f", &[&prev, "w"], &out, kb);
        prev = out;
    }
    t += "{\"INSTRUCTION\":\"CALL\",\"NAME\":\"view\",\"ARGS\":[\"y11\"],\"RESULT\":[\"v\"],\"TIME\":\"10\"}\n";
    t += &format!("{{\"INSTRUCTION\":\"MEMORY\",\"NAME\":\"v\",\"MEMORY\":\"{kb}\"}}\n");
    t += "{\"INSTRUCTION\":\"ALIAS\",\"NAME\":\"v\",\"ALIAS\":\"0\"}\n";
    t += "{\"INSTRUCTION\":\"MUTATE\",\"NAME\":\"add_\",\"ARGS\":[\"y5\",\"v\"],\"MUTATE\":[0],\"TIME\":\"500\"}\n";
    t += "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"BACKWARD\"}\n";
    for i in (0..12).rev() {
        t += &call("g", &[&format!("y{i}"), "v"], &format!("z{i}"), kb);
        t += &release(&format!("z{i}"));
        t += &release(&format!("y{i}"));
    }
    t += &release("v");
    Trace::parse("chain", &t).expect("chain parses")
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
