//! A burn-nn model written against stock Burn 0.22 (`burn::Device`, no backend
//! generic) trains on plain Flex, then on a remote device served by
//! `remat_burn_server::serve` over loopback at 100 / 50 / 30 % of its peak;
//! prints each run's figures and whether the losses and the final parameters
//! are bit-identical to plain Flex's. Exits non-zero if they are not.
//!
//! ```text
//! cargo run --release -p remat-burn-server --example burn22_train_under_budget
//! ```
//!
//! The training code is the same function for every run; the only remat call
//! is `remat.end_step()` after each optimizer step.

#[path = "../tests/common/model.rs"]
mod model;

use std::process::ExitCode;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use burn_flex::Flex;
use model::{train, Dims, TinyNet, Trace};
use remat_burn_server::{serve, CostModel, RemoteDtr, ServeConfig};
use remat_dtr::{BudgetMode, DtrConfig};

const STEPS: usize = 4;

/// Train `model` for `STEPS` steps on a remote DTR device under `budget`
/// (logical bytes; `None`: unbounded). Returns the run and the server's
/// figures.
fn remote_run(
    model: &TinyNet,
    d: &Dims,
    budget: Option<u64>,
) -> Result<(Trace, remat_burn_server::RemoteStats), remat_burn_server::Error> {
    let mut config = DtrConfig::default().with_budget_mode(BudgetMode::Logical);
    config.budget = budget;
    let server = serve::<Flex>(
        ServeConfig::new(Default::default(), config).with_cost_model(CostModel::gpu()),
    )?;
    let remat = RemoteDtr::connect(&server.url())?;
    let device = remat.device().autodiff();
    let trace = train(model.clone().fork(&device), d, STEPS, &device, || {
        remat.end_step()
    });
    device
        .sync()
        .map_err(|e| remat_burn_server::Error::Remote(e.to_string()))?;
    let stats = remat.stats()?;
    server.shutdown()?;
    Ok((trace, stats))
}

fn main() -> ExitCode {
    let d = Dims {
        blocks: 8,
        ..Dims::tiny()
    };
    let init = Device::flex().autodiff();
    init.seed(7);
    let model = TinyNet::new(&d, &init);

    let started = Instant::now();
    let flex = Device::flex().autodiff();
    let want = train(model.clone().fork(&flex), &d, STEPS, &flex, || {});
    println!(
        "plain Flex: {STEPS} steps in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    let mut ok = true;
    let mut peak = 0;
    for percent in [None, Some(100u64), Some(50), Some(30)] {
        let budget = percent.map(|p| peak * p / 100);
        let started = Instant::now();
        let label = percent.map_or("unbounded".to_string(), |p| format!("{p} %"));
        match remote_run(&model, &d, budget) {
            Ok((trace, stats)) => {
                if percent.is_none() {
                    peak = stats.peak_allocated;
                }
                let same = trace == want;
                ok &= same;
                println!(
                    "remote Dtr<Flex> {label:>9}: {:.2} s, {stats}; bit-identical: {same}",
                    started.elapsed().as_secs_f64()
                );
            }
            Err(e) => {
                ok = false;
                println!("remote Dtr<Flex> {label:>9}: failed: {e}");
            }
        }
    }
    if ok {
        println!("losses and parameters are bit-identical to plain Flex in every run");
        ExitCode::SUCCESS
    } else {
        println!("MISMATCH or failure: see above");
        ExitCode::FAILURE
    }
}
