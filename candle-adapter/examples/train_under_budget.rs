//! Train a small CNN on a deterministic synthetic image set twice — without a
//! budget, then at 30 % of its measured peak activation memory — and check that
//! the two loss sequences (and the final parameters) are bit-identical.
//!
//! Each step ends with `Remat::end_iteration()`: the first steps run online
//! (DTR deciding from the past), later ones follow a plan made from the step
//! before (plan-ahead DTR); the example prints both overheads.
//!
//! ```text
//! cargo run --release -p remat-candle --example train_under_budget -- [--steps N] [--fraction F]
//! ```
//!
//! `REMAT_DTR_CONF` may pick the policy and budget mode (for example
//! `policy:dtr-eq,budget_mode:logical`); the budget itself is set by the example.
//! Exits with status 1 if anything differs, 2 on an error.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use remat_candle::nn::loss;
use remat_candle::{Remat, RematConfig};

#[path = "shared/cnn.rs"]
mod cnn;
use cnn::{dataset, seeded_init, Cnn, PlainCnn, BATCH, DATASET, SIDE};

struct Run {
    losses: Vec<f32>,
    params: Vec<(String, Vec<u32>)>,
    time: Duration,
    /// Wall time of each step.
    step_times: Vec<Duration>,
    /// Steps that followed a plan.
    planned: usize,
    /// Remat time over compute time of the first and of the last step, as the
    /// runtime measured them.
    first_remat: f64,
    last_remat: f64,
    /// Peak allocated bytes of the placement model, and the external bytes
    /// (parameters plus one batch) resident before the first forward.
    peak: u64,
    external: u64,
    summary: String,
    evictions: u64,
    remats: u64,
}

fn train(budget: Option<u64>, steps: usize) -> remat_candle::Result<Run> {
    let dev = Device::Cpu;
    // The placement model is remat-alloc's caching allocator in both runs; the
    // unconstrained run gets a device far larger than the model needs.
    // Policy, budget mode and sampling may come from REMAT_DTR_CONF (default:
    // remat's policy over the physical model); the budget is set here.
    let dtr = RematConfig::from_env()?.dtr;
    let cfg = RematConfig::new()
        .with_dtr(dtr)
        .with_budget_bytes(budget.unwrap_or(1 << 40))
        .with_dropout_seed(7);
    let remat = Remat::new(cfg)?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    // Identical initial parameters in both runs: candle-nn's init draws from a
    // thread RNG, so overwrite them with a seeded draw.
    let model = Cnn::new(&remat, vb)?;
    let names = seeded_init(&varmap, &dev)?;
    let mut opt = optimizer(&varmap)?;
    let (images, labels) = data(&dev)?;
    let mut losses = Vec::with_capacity(steps);
    let mut external = 0;
    let mut step_times = Vec::with_capacity(steps);
    let mut reports = Vec::with_capacity(steps);
    let start = Instant::now();
    for step in 0..steps {
        let t0 = Instant::now();
        let first = (step * BATCH) % DATASET;
        let x = remat.input(&images.narrow(0, first, BATCH)?)?;
        let y = remat.input(&labels.narrow(0, first, BATCH)?)?;
        if step == 0 {
            external = remat.memory_usage()?.allocated;
        }
        let loss = loss::cross_entropy(&model.forward(&x)?, &y)?;
        let grads = loss.backward()?;
        losses.push(loss.to_scalar::<f32>()?);
        drop((loss, x, y, grads_holder(grads, &mut opt)?));
        reports.push(remat.end_iteration()?);
        step_times.push(t0.elapsed());
    }
    let planned = reports.iter().filter(|r| r.planned).count();
    let ratio = |r: &remat_candle::IterationReport| r.remat_ns / r.compute_ns.max(1.0);
    let first_remat = reports.first().map_or(0.0, ratio);
    let last_remat = reports.last().map_or(0.0, ratio);
    let time = start.elapsed();
    let stats = remat.stats()?;
    let peak = remat.memory_usage()?.peak_allocated;
    let summary = remat.memory_summary()?;
    let params = names
        .iter()
        .map(|n| {
            let data = varmap.data().lock().unwrap();
            let v = data[n].flatten_all()?.to_vec1::<f32>()?;
            Ok((n.clone(), v.into_iter().map(f32::to_bits).collect()))
        })
        .collect::<remat_candle::Result<Vec<_>>>()?;
    drop(model);
    remat.flush()?;
    if remat.storage_count()? != 0 {
        eprintln!(
            "warning: {} records left after the run",
            remat.storage_count()?
        );
    }
    Ok(Run {
        losses,
        params,
        time,
        step_times,
        planned,
        first_remat,
        last_remat,
        peak,
        external,
        summary,
        evictions: stats.evictions,
        remats: stats.rematerializations,
    })
}

/// The same training with plain candle-nn (no adapter): the reference losses.
fn train_plain(steps: usize) -> candle_core::Result<Vec<f32>> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let model = PlainCnn::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    seeded_init(&varmap, &dev)?;
    let mut opt = optimizer(&varmap)?;
    let (images, labels) = data(&dev)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let first = (step * BATCH) % DATASET;
        let x = images.narrow(0, first, BATCH)?;
        let y = labels.narrow(0, first, BATCH)?;
        // The adapter's i-th dropout call uses seed + i * 0x9e3779b97f4a7c15.
        let seed = 7u64.wrapping_add((step as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x, seed)?, &y)?;
        let grads = loss.backward()?;
        losses.push(loss.to_scalar::<f32>()?);
        opt.step(&grads)?;
    }
    Ok(losses)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn run() -> remat_candle::Result<bool> {
    let mut steps = 20usize;
    let mut fraction = 0.3f64;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let bad = |what: &str| {
            candle_core::Error::Msg(format!(
                "{what}; usage: train_under_budget [--steps N (≥ 1)] [--fraction F (in (0, 1])]"
            ))
        };
        match (args[i].as_str(), args.get(i + 1)) {
            ("--steps", Some(v)) => {
                steps = (v.parse().ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad(&format!("--steps {v}")))?
            }
            ("--fraction", Some(v)) => {
                fraction = (v.parse().ok())
                    .filter(|&f: &f64| f > 0.0 && f <= 1.0)
                    .ok_or_else(|| bad(&format!("--fraction {v}")))?
            }
            (a, _) => return Err(bad(&format!("unexpected argument `{a}`"))),
        }
        i += 2;
    }
    println!("small CNN, {BATCH} images of {SIDE}x{SIDE} per step, {steps} steps, AdamW");
    let free = train(None, steps)?;
    let act = free.peak.saturating_sub(free.external);
    let budget = free.external + (act as f64 * fraction) as u64;
    println!(
        "unconstrained: peak {:.2} MiB ({:.2} MiB parameters + batch, {:.2} MiB activations), {:.2} s",
        mib(free.peak),
        mib(free.external),
        mib(act),
        free.time.as_secs_f64()
    );
    println!(
        "budget: {:.2} MiB = parameters + batch + {:.0} % of the activation peak",
        mib(budget),
        fraction * 100.0
    );
    let tight = train(Some(budget), steps)?;
    let tight_act = tight.peak.saturating_sub(tight.external);
    println!(
        "under budget:  peak {:.2} MiB ({:.2} MiB activations, {:.0} % of unconstrained), {:.2} s",
        mib(tight.peak),
        mib(tight_act),
        100.0 * tight_act as f64 / act.max(1) as f64,
        tight.time.as_secs_f64()
    );
    println!(
        "time overhead: {:+.1} %   evictions: {}   rematerializations: {}",
        100.0 * (tight.time.as_secs_f64() / free.time.as_secs_f64() - 1.0),
        tight.evictions,
        tight.remats
    );
    // Steady state: the median step after the third (the first steps run
    // online while remat records; a plan starts once steps repeat).
    let over =
        |a: Duration, b: Duration| 100.0 * (a.as_secs_f64() / b.as_secs_f64().max(1e-9) - 1.0);
    println!(
        "first step: {:+.1} % wall time, replays {:.1} % of compute (online)",
        over(tight.step_times[0], free.step_times[0]),
        100.0 * tight.first_remat
    );
    println!(
        "steady step: {:+.1} % wall time (median after step 3), replays {:.1} % of compute; {} of {} steps followed a plan",
        over(median(&tight.step_times, 3), median(&free.step_times, 3)),
        100.0 * tight.last_remat,
        tight.planned,
        steps
    );
    println!("{}", tight.summary);
    println!("step  loss (unconstrained)  loss (budget)");
    for (k, (a, b)) in free.losses.iter().zip(&tight.losses).enumerate() {
        if k % 5 == 0 || k + 1 == steps {
            println!("{k:>4}  {a:>20.7}  {b:>13.7}");
        }
    }
    let same_losses = free
        .losses
        .iter()
        .map(|l| l.to_bits())
        .eq(tight.losses.iter().map(|l| l.to_bits()));
    let same_params = free.params == tight.params;
    let plain = train_plain(steps)?;
    let same_as_plain = plain
        .iter()
        .map(|l| l.to_bits())
        .eq(free.losses.iter().map(|l| l.to_bits()));
    println!(
        "losses bit-identical: {same_losses}   parameters bit-identical: {same_params}   peak within budget: {}",
        tight.peak <= budget
    );
    println!("losses bit-identical to plain candle-nn: {same_as_plain}");
    Ok(same_losses && same_params && tight.peak <= budget && same_as_plain)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: the constrained run differs from the unconstrained one");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The optimizer step (the gradients are dropped after it).
fn grads_holder(
    grads: candle_core::backprop::GradStore,
    opt: &mut AdamW,
) -> candle_core::Result<()> {
    opt.step(&grads)
}

/// Median of the wall times of `steps[from..]`.
fn median(steps: &[Duration], from: usize) -> Duration {
    let mut v: Vec<Duration> = steps.iter().skip(from).copied().collect();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// The optimizer both runs use.
fn optimizer(varmap: &VarMap) -> candle_core::Result<AdamW> {
    AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: 2e-3,
            ..Default::default()
        },
    )
}

/// The synthetic image set as `(images, labels)` tensors.
fn data(dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let (xs, ys) = dataset();
    Ok((
        Tensor::from_vec(xs, (DATASET, 1, SIDE, SIDE), dev)?,
        Tensor::from_vec(ys, DATASET, dev)?,
    ))
}
