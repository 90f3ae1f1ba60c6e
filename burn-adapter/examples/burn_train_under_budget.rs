//! Train a burn-nn model (Embedding, multi-head attention, LayerNorm, Conv2d,
//! Linear; Adam from burn-optim) twice on `Autodiff<Dtr<NdArray>>`: unconstrained,
//! then under a budget of ~40 % of the unconstrained peak. Prints both peaks, the
//! time overhead, evictions and rematerializations, and checks that the losses are
//! bit-identical (exit code 1 if they are not).
//!
//! ```text
//! cargo run --release -p remat-burn --example burn_train_under_budget [-- STEPS PERCENT]
//! ```

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
use remat_burn::{Dtr, DtrDevice, DtrStats, Sealing};
use remat_dtr::{BudgetMode, DtrConfig};

type Ours = Autodiff<Dtr<NdArray>>;

fn run(d: &Dims, steps: usize, budget: Option<u64>) -> Result<(Trace, DtrStats, f64), String> {
    // Policy, seed… from REMAT_DTR_CONF (unset: defaults); the budget is ours.
    let mut config = DtrConfig::from_env()
        .map_err(|e| e.to_string())?
        .with_budget_mode(BudgetMode::Logical);
    config.budget = None;
    if let Some(b) = budget {
        config = config.with_budget(b);
    }
    let device =
        DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).map_err(|e| e.to_string())?;
    Ours::seed(&device, 7);
    let model = TinyNet::<Ours>::new(d, &device);
    let _ = param_bits(&model); // initialize every parameter now, in a fixed order
    let start = Instant::now();
    // Between steps the new parameters and optimizer state become roots: the
    // optimizer wrapper seals the device after each step.
    let optim = Sealing::new(adam(), &device);
    // Reads inside the training loop (`into_data`) panic on a device error; the
    // typed error is then taken from the device (the panic message is muted).
    let trace = catch_muted(|| train(model, d, steps, false, &device, optim));
    let secs = start.elapsed().as_secs_f64();
    if let Some(e) = device.take_error() {
        return Err(e.to_string());
    }
    let trace = trace.map_err(|_| "training panicked".to_string())?;
    Ok((trace, device.stats(), secs))
}

/// The same training on plain `Autodiff<NdArray>` (the reference).
fn run_reference(d: &Dims, steps: usize) -> (Trace, f64) {
    let device = NdArrayDevice::Cpu;
    Autodiff::<NdArray>::seed(&device, 7);
    let model = TinyNet::<Autodiff<NdArray>>::new(d, &device);
    let _ = param_bits(&model);
    let start = Instant::now();
    let trace = train(model, d, steps, false, &device, adam());
    (trace, start.elapsed().as_secs_f64())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let percent: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(40);
    let d = Dims::demo();
    println!("model: {d:?}, {steps} Adam steps, inner backend NdArray");

    let (free, free_stats, free_s) = match run(&d, steps, None) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("unconstrained run failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let peak = free_stats.memory.peak_allocated;
    let budget = peak * percent / 100;
    let (tight, tight_stats, tight_s) = match run(&d, steps, Some(budget)) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("run under {budget} B failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (reference, ref_s) = run_reference(&d, steps);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "Autodiff<NdArray>:            {:6.2} s ({:.0} ms/step)",
        ref_s,
        1e3 * ref_s / steps as f64
    );
    println!(
        "unconstrained: peak {:8.2} MiB, {:6.2} s ({:.0} ms/step)",
        mib(peak),
        free_s,
        1e3 * free_s / steps as f64
    );
    println!(
        "budget {percent:3} %:   peak {:8.2} MiB (budget {:.2} MiB), {:6.2} s ({:.0} ms/step)",
        mib(tight_stats.memory.peak_allocated),
        mib(budget),
        tight_s,
        1e3 * tight_s / steps as f64
    );
    println!(
        "overhead: {:+.1} % wall time, {:+.1} % compute (replayed op time / first-run op time); \
         evictions {}, rematerializations {}",
        100.0 * (tight_s / free_s - 1.0),
        100.0 * tight_stats.runtime.remat_ns / tight_stats.runtime.compute_ns.max(1.0),
        tight_stats.runtime.evictions,
        tight_stats.runtime.rematerializations
    );
    let losses: Vec<f32> = free.losses.iter().map(|&b| f32::from_bits(b)).collect();
    println!("losses: {losses:?}");
    let same_as_ndarray = reference == free;
    println!(
        "unconstrained Dtr bit-identical to Autodiff<NdArray>: {}",
        if same_as_ndarray { "yes" } else { "NO" }
    );
    if same_as_ndarray && free.losses == tight.losses && free.params == tight.params {
        println!("bit-identical losses and parameters: yes");
        ExitCode::SUCCESS
    } else {
        println!("bit-identical losses and parameters: NO");
        ExitCode::FAILURE
    }
}
