//! The cost per runtime call of the planned path, for instruction counts
//! (load-independent, unlike the `plan_ahead` bench's times).
//!
//! Runs `steps` training-like steps (see `shared/training_step.rs`) after three
//! warm-up steps, in one of three runtimes: `unbudgeted` (the bookkeeping
//! floor), `online` (a physical budget of 40 % of the peak, plan-ahead off) or
//! `planned` (the same budget, following a plan). Instructions per call are
//! the difference of two runs over the difference of their calls:
//!
//! ```text
//! cargo build --release -p remat-dtr --example planned_path
//! for n in 10 20; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/examples/planned_path planned $n 2>&1 | grep refs; done
//! ```
//!
//! A profile of the measured steps alone: `valgrind --tool=callgrind
//! --collect-atstart=no --toggle-collect='planned_path::measured' …`, then
//! `callgrind_annotate`.

use std::process::ExitCode;

use remat_dtr::DtrConfig;

#[path = "shared/training_step.rs"]
mod training_step;
use training_step::{runtime, step, Ops};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: planned_path unbudgeted|online|planned STEPS";
    let (Some(mode), Some(steps)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
    ) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    // The unbudgeted peak, then 40 % of it.
    let (mut rt, ws, ops) = runtime(DtrConfig::default());
    step(&mut rt, &ws, &ops);
    let budget = rt.stats().peak_live_bytes * 4 / 10;
    let config = match mode.as_str() {
        "unbudgeted" => DtrConfig::default(),
        "online" => DtrConfig::default()
            .with_budget(budget)
            .with_plan_ahead(false),
        "planned" => DtrConfig::default().with_budget(budget),
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let (mut rt, ws, ops) = runtime(config);
    for _ in 0..3 {
        step(&mut rt, &ws, &ops);
    }
    if mode == "planned" && rt.current_plan().is_none() {
        eprintln!("no plan in force after three steps");
        return ExitCode::from(1);
    }
    let calls = measured(&mut rt, &ws, &ops, steps);
    println!(
        "{mode}: {steps} steps, {calls} calls, {} divergences",
        rt.stats().divergences
    );
    ExitCode::SUCCESS
}

/// The measured steps, apart for a profile of them alone
/// (`--collect-atstart=no --toggle-collect='planned_path::measured'`).
#[inline(never)]
fn measured(
    rt: &mut remat_dtr::Runtime<()>,
    ws: &[remat_dtr::TensorId],
    ops: &Ops,
    steps: u64,
) -> u64 {
    (0..steps).map(|_| step(rt, ws, ops)).sum()
}
