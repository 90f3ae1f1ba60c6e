//! Train the burn-nn test model (`Dims::demo()`, Adam) on `Autodiff<Dtr<NdArray>>`
//! unconstrained, then at each budget (a percentage of the unconstrained peak)
//! twice: recomputation only, and with the host tier (swap) on. Prints one
//! Markdown table row per run: peak, time per step, evictions and replays,
//! bytes swapped out and in, the host tier's peak, the modelled stall, the
//! real copy time, whether the last step followed a plan, and whether losses
//! and parameters equal the unconstrained run bit for bit (exit code 1 if a
//! run that finished differs). A failed run's error goes to stderr.
//!
//! ```text
//! cargo run --release -p remat-burn --example burn_swap [-- STEPS PERCENT...]
//! ```
//!
//! The bandwidth is measured at start-up unless `REMAT_DTR_CONF` sets
//! `swap_bandwidth` (its other keys apply too; the budget and the swap switch
//! are the example's).

#[path = "../tests/common/model.rs"]
mod model;
#[path = "../tests/common/muted.rs"]
mod muted;

use std::process::ExitCode;
use std::time::Instant;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use model::{adam, param_bits, train, Dims, TinyNet, Trace};
use muted::catch_muted;
use remat_burn::{Dtr, DtrDevice, DtrOptions, DtrStats, Sealing};
use remat_dtr::{BudgetMode, DtrConfig};

type Ours = Autodiff<Dtr<NdArray>>;

struct Run {
    trace: Trace,
    stats: DtrStats,
    secs: f64,
    gbps: Option<f64>,
}

fn run(d: &Dims, steps: usize, budget: Option<u64>, swap: bool) -> Result<Run, String> {
    let mut config = DtrConfig::from_env()
        .map_err(|e| e.to_string())?
        .with_budget_mode(BudgetMode::Logical);
    config.budget = budget;
    config.swap.enabled = false;
    let mut options = DtrOptions::new(config);
    if swap {
        options = options.with_swap();
    }
    let device = DtrDevice::<NdArray>::with_options(NdArrayDevice::Cpu, options)
        .map_err(|e| e.to_string())?;
    Ours::seed(&device, 7);
    let model = TinyNet::<Ours>::new(d, &device);
    let _ = param_bits(&model); // initialize every parameter now, in a fixed order
    let gbps = device.swap_bandwidth();
    let start = Instant::now();
    let optim = Sealing::new(adam(), &device);
    let trace = catch_muted(|| train(model, d, steps, false, &device, optim));
    let secs = start.elapsed().as_secs_f64();
    if let Some(e) = device.take_error() {
        let text = e.to_string();
        eprintln!("budget {budget:?} B, swap {swap}: {text}");
        let short = if e.impossible_budget().is_some() {
            "ImpossibleBudget"
        } else {
            text.as_str()
        };
        return Err(short.to_string());
    }
    let trace = trace.map_err(|_| "training panicked".to_string())?;
    Ok(Run {
        trace,
        stats: device.stats(),
        secs,
        gbps,
    })
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let mut percents: Vec<f64> = args.filter_map(|s| s.parse().ok()).collect();
    if percents.is_empty() {
        percents = vec![50.0, 30.0, 10.0];
    }
    let d = Dims::demo();
    let params = {
        let device = NdArrayDevice::Cpu;
        let model = TinyNet::<Autodiff<NdArray>>::new(&d, &device);
        param_bits(&model)
            .iter()
            .map(|p| p.len() as u64 * 4)
            .sum::<u64>()
    };
    println!("model: {d:?}, {steps} Adam steps, inner backend NdArray");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "parameters {:.2} MiB; with Adam's two moments {:.2} MiB",
        mib(params),
        mib(3 * params)
    );
    let free = match run(&d, steps, None, false) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("unconstrained run failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let peak = free.stats.memory.peak_allocated;
    let per_step = |secs: f64| 1e3 * secs / steps as f64;
    println!(
        "unconstrained: peak {:.2} MiB, {:.0} ms/step",
        mib(peak),
        per_step(free.secs)
    );
    println!();
    println!(
        "| budget | swap | peak | ms/step | evictions / replays | swapped out / in | host peak | \
         stall (model) | copies (real) | (compute + replay + stall) / compute | last step | \
         bit-identical |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let mut ok = true;
    for &percent in &percents {
        let budget = (peak as f64 * percent / 100.0) as u64;
        for swap in [false, true] {
            let label = format!("{percent} % ({:.2} MiB)", mib(budget));
            match run(&d, steps, Some(budget), swap) {
                Ok(r) => {
                    let s = &r.stats.runtime;
                    let same = r.trace == free.trace;
                    ok &= same;
                    let on = match r.gbps {
                        Some(g) => format!("on ({g:.2} GB/s)"),
                        None => "off".into(),
                    };
                    println!(
                        "| {label} | {on} | {:.2} MiB | {:.0} | {} / {} | {:.1} / {:.1} MiB | \
                         {:.2} MiB | {:.1} ms | {:.1} ms | {:.3} | {} | {} |",
                        mib(r.stats.memory.peak_allocated),
                        per_step(r.secs),
                        s.evictions,
                        s.rematerializations,
                        mib(s.swapped_out_bytes),
                        mib(s.swapped_in_bytes),
                        mib(s.peak_host_bytes),
                        s.stall_ns / 1e6,
                        r.stats.host_copy_ns as f64 / 1e6,
                        (s.compute_ns + s.remat_ns + s.stall_ns) / s.compute_ns.max(1.0),
                        match &r.stats.last_iteration {
                            Some(l) if l.planned => "planned",
                            Some(_) => "online",
                            None => "–",
                        },
                        if same { "yes" } else { "NO" }
                    );
                }
                Err(e) => {
                    let on = if swap { "on" } else { "off" };
                    println!("| {label} | {on} | — | — | — | — | — | — | — | — | — | {e} |");
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
