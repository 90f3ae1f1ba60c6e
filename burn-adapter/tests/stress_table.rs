//! The table of docs/burn.md's "Under stress": issue 16's table of Burn's
//! conformance suite, re-measured with our own stress cases (`common/cases.rs`,
//! the cases of `stress.rs`) since Burn's suite is not vendored.
//!
//! Every case runs on a fresh device (as the issue ran one process per test)
//! under each row's configuration, and is compared bit for bit with plain
//! `NdArray`. A case that fails must fail with a typed `ImpossibleBudget`; the
//! table says whether the case's own working set exceeds the budget, from the
//! error's figures. No case may give a wrong value or fail otherwise (asserted).
//! Burn's `test_ctc_loss_grad` (`ctc_grad.rs`) gets its own column.
//!
//! Ignored by default (a thrashing row takes seconds in a release build); run
//! it by hand, in release:
//!
//! ```sh
//! cargo test --release -p remat-burn --test stress_table -- --ignored --nocapture
//! ```
//!
//! `STRESS_COST=gpu` costs ops with `CostModel::gpu()` (analytic, so every run
//! takes the same decisions) instead of the default wall clock.

#[path = "common/cases.rs"]
mod cases;

use std::time::{Duration, Instant};

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use cases::*;
use remat_burn::{CostModel, Dtr, DtrDevice, DtrOptions};
use remat_dtr::{BudgetMode, DtrConfig, ImpossibleBudget, PolicyKind};

type Ours = Dtr<NdArray>;

/// How one case ended on one device.
enum Outcome {
    /// Every output bit-identical to NdArray.
    Same,
    /// A typed `ImpossibleBudget`.
    Impossible(ImpossibleBudget),
    /// Finished without an error, but some output differs from NdArray.
    Wrong,
    /// Failed without a typed `ImpossibleBudget`.
    Other(String),
}

/// Whether the case's own working set exceeds the budget, from the error's
/// figures: what must stay resident (pinned, not recomputable, below the
/// minimum evictee) plus the request.
fn working_set_exceeds(b: &ImpossibleBudget) -> bool {
    b.pinned + b.not_recomputable + b.below_min_evictee + b.needed > b.budget
}

fn same(want: &Out, got: &Out) -> bool {
    want.len() == got.len()
        && want
            .iter()
            .zip(got)
            .all(|(w, g)| w.shape == g.shape && w.dtype == g.dtype && w.as_bytes() == g.as_bytes())
}

/// Runs `case` on a fresh device with `config`.
fn run(
    config: &DtrConfig,
    cost: CostModel,
    want: &Out,
    case: impl FnOnce(&DtrDevice<NdArray>) -> Out,
) -> (Outcome, Duration, u64, u64) {
    let options = DtrOptions::new(config.clone()).with_cost_model(cost);
    let device = DtrDevice::<NdArray>::with_options(NdArrayDevice::Cpu, options).expect("device");
    let start = Instant::now();
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&device)));
    let time = start.elapsed();
    let error = device.take_error();
    let outcome = match (got, error) {
        (_, Some(e)) => match e.impossible_budget() {
            Some(b) => Outcome::Impossible(b.clone()),
            None => Outcome::Other(e.to_string()),
        },
        (Ok(got), None) if same(want, &got) => Outcome::Same,
        (Ok(_), None) => Outcome::Wrong,
        (Err(panic), None) => Outcome::Other(format!(
            "a panic without a device error: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    };
    let s = device.stats();
    (
        outcome,
        time,
        s.runtime.evictions,
        s.runtime.rematerializations,
    )
}

fn rows() -> Vec<(&'static str, Option<DtrConfig>)> {
    let t0 = |policy| {
        DtrConfig::default()
            .with_budget_mode(BudgetMode::Logical)
            .with_threshold(Some(0))
            .with_policy(policy)
    };
    vec![
        ("plain `NdArray`", None),
        ("`Dtr<NdArray>`, no budget", Some(DtrConfig::default())),
        ("`threshold:0`, `remat`", Some(t0(PolicyKind::Remat))),
        ("`threshold:0`, `msps`", Some(t0(PolicyKind::Msps))),
        (
            "physical 2 MiB (default mode)",
            Some(DtrConfig::default().with_budget(2 << 20)),
        ),
        (
            "physical 16 KiB",
            Some(DtrConfig::default().with_budget(16 << 10)),
        ),
        (
            "logical 4 KiB",
            Some(
                DtrConfig::default()
                    .with_budget_mode(BudgetMode::Logical)
                    .with_budget(4 << 10),
            ),
        ),
    ]
}

fn describe(outcome: &Outcome, time: Duration, evictions: u64, remats: u64) -> String {
    let how = match outcome {
        Outcome::Same => "bit-identical".to_string(),
        Outcome::Impossible(b) => format!(
            "`ImpossibleBudget` ({}; working set {} the budget)",
            b.cause.name(),
            if working_set_exceeds(b) {
                "exceeds"
            } else {
                "within"
            }
        ),
        Outcome::Wrong => "WRONG VALUES".to_string(),
        Outcome::Other(e) => format!("other failure: {e}"),
    };
    format!(
        "{how}, {:.1} ms, {evictions} ev., {remats} remat.",
        time.as_secs_f64() * 1e3
    )
}

#[test]
#[ignore = "a by-hand measurement for docs/burn.md; run in release"]
fn stress_table() {
    let cost = match std::env::var("STRESS_COST").as_deref() {
        Ok("gpu") => CostModel::gpu(),
        _ => CostModel::default(),
    };
    let plain = NdArrayDevice::Cpu;
    let mut cases: Vec<(&str, Out)> = plain_cases::<NdArray>()
        .into_iter()
        .map(|(name, case)| (name, case(&plain)))
        .collect();
    cases.push(("gradients", gradients::<Autodiff<NdArray>>(&plain)));
    let ctc_want = ctc_loss_grad::<Autodiff<NdArray>>(&plain);
    let total = cases.len();
    // Failed reads panic in `into_data`; the typed error is taken from the device.
    std::panic::set_hook(Box::new(|_| {}));
    let mut table = vec![
        format!(
            "| row | bit-identical (of {total}) | typed `ImpossibleBudget`: working set > budget / ≤ budget | \
             wrong values | time | evictions | rematerializations | `ctc_loss_grad` |"
        ),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut bad = Vec::new();
    for (row, config) in rows() {
        let (mut identical, mut over, mut within, mut wrong) = (0, 0, 0, 0);
        let (mut time, mut evictions, mut remats) = (Duration::ZERO, 0u64, 0u64);
        let mut failed = Vec::new();
        let mut tally = |name: &str, outcome: &Outcome, t, e, r| {
            time += t;
            evictions += e;
            remats += r;
            match outcome {
                Outcome::Same => identical += 1,
                Outcome::Impossible(b) if working_set_exceeds(b) => {
                    over += 1;
                    failed.push(format!("{name} ({b})"));
                }
                Outcome::Impossible(b) => {
                    within += 1;
                    failed.push(format!("{name} ({b})"));
                }
                Outcome::Wrong => wrong += 1,
                Outcome::Other(e) => bad.push(format!("{row}: {name}: {e}")),
            }
        };
        let ctc = match &config {
            None => {
                // Plain NdArray: run again, compare with the first run.
                let plain_cases = plain_cases::<NdArray>();
                for ((name, want), (_, case)) in cases.iter().zip(plain_cases) {
                    let start = Instant::now();
                    let got = case(&plain);
                    let outcome = if same(want, &got) {
                        Outcome::Same
                    } else {
                        Outcome::Wrong
                    };
                    tally(name, &outcome, start.elapsed(), 0, 0);
                }
                let start = Instant::now();
                let got = gradients::<Autodiff<NdArray>>(&plain);
                let outcome = if same(&cases[total - 1].1, &got) {
                    Outcome::Same
                } else {
                    Outcome::Wrong
                };
                tally("gradients", &outcome, start.elapsed(), 0, 0);
                let start = Instant::now();
                let got = ctc_loss_grad::<Autodiff<NdArray>>(&plain);
                let outcome = if same(&ctc_want, &got) {
                    Outcome::Same
                } else {
                    Outcome::Wrong
                };
                describe(&outcome, start.elapsed(), 0, 0)
            }
            Some(config) => {
                for ((name, want), (_, case)) in cases.iter().zip(plain_cases::<Ours>()) {
                    let (outcome, t, e, r) = run(config, cost, want, case);
                    tally(name, &outcome, t, e, r);
                }
                let (outcome, t, e, r) = run(config, cost, &cases[total - 1].1, |d| {
                    gradients::<Autodiff<Ours>>(d)
                });
                tally("gradients", &outcome, t, e, r);
                let (outcome, t, e, r) = run(config, cost, &ctc_want, |d| {
                    ctc_loss_grad::<Autodiff<Ours>>(d)
                });
                if let Outcome::Other(e) = &outcome {
                    bad.push(format!("{row}: ctc_loss_grad: {e}"));
                }
                if let Outcome::Wrong = outcome {
                    wrong += 1;
                }
                describe(&outcome, t, e, r)
            }
        };
        table.push(format!(
            "| {row} | {identical} | {over} / {within} | {wrong} | {:.1} ms | {evictions} | {remats} | {ctc} |",
            time.as_secs_f64() * 1e3
        ));
        for f in &failed {
            eprintln!("{row}: failed: {f}");
        }
        assert_eq!(wrong, 0, "{row}: wrong values");
    }
    let _ = std::panic::take_hook();
    println!("{}", table.join("\n"));
    assert!(bad.is_empty(), "failures without a typed error: {bad:#?}");
}
