//! The GPU check kit's Burn step (`scripts/gpu-check`, issue 35; feature
//! `cuda`): the burn-nn test model trained on `Autodiff<Dtr<Cuda>>`
//! unconstrained and under 100 / 50 / 30 % of the unconstrained peak (logical
//! budget), then under 30 % and 10 % with swap to host memory (issue 33;
//! Burn's own copies, the bandwidth measured when the device starts), against
//! `Autodiff<Cuda>` run twice.
//!
//! ```text
//! cargo run --release -p remat-burn --features cuda --example burn_cuda_budgets \
//!     [-- STEPS [--json FILE]]
//! ```
//!
//! Losses and final parameters must be bit-identical to `Autodiff<Cuda>` when
//! `Autodiff<Cuda>` itself is bit-reproducible run to run (its two runs agree).
//! Where it is not, the tolerance is the relative loss difference measured
//! between those two runs, times 4 (at least 1e-6): rematerialization replays
//! the same kernels, so a DTR run should not drift further than the reference
//! does from itself; the measured figure is printed. After the backward pass
//! and after the optimizer step of every step, cubecl's pools (bytes in use)
//! and the runtime's resident bytes are sampled and compared with the budget.
//! Exit code 1 on a mismatch or a failed run; without a CUDA device (GPU 0 not
//! opened by remat-alloc's `CudaDevice`) it prints `no CUDA device: skipped`
//! and exits 0.

#[path = "../tests/common/model.rs"]
mod model;
#[path = "../tests/common/muted.rs"]
mod muted;

use std::process::ExitCode;
use std::time::Instant;

use burn_autodiff::Autodiff;
use burn_cuda::{Cuda, CudaDevice};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::{GradientsParams, Optimizer};
use burn_tensor::backend::AutodiffBackend;
use model::{adam, batch, param_bits, Dims, TinyNet};
use muted::catch_muted;
use remat_burn::{Dtr, DtrDevice, Sealing};
use remat_dtr::{BudgetMode, DtrConfig};

type Ours = Autodiff<Dtr<Cuda>>;
type Reference = Autodiff<Cuda>;

/// One training run: losses and parameters (bits), memory samples, time.
#[derive(Default, Clone)]
struct Run {
    losses: Vec<u32>,
    params: Vec<Vec<u32>>,
    /// Max over the samples of cubecl's bytes in use / the model's resident bytes.
    pool_used_max: u64,
    model_live_max: u64,
    peak_allocated: u64,
    evictions: u64,
    rematerializations: u64,
    secs: f64,
    /// With swap: the bandwidth the device measured (GB/s), bytes copied to
    /// host, swap-outs, and the copy time the transfer measured (ns).
    swap: Option<(f64, u64, u64, u64)>,
}

/// `steps` Adam steps of the test model on `device`; `sample` is called after
/// each backward pass and each optimizer step.
fn train<B: AutodiffBackend, O: Optimizer<TinyNet<B>, B>>(
    d: &Dims,
    steps: usize,
    device: &B::Device,
    mut optim: O,
    mut sample: impl FnMut(),
) -> (Vec<u32>, Vec<Vec<u32>>) {
    B::seed(device, 7);
    let mut model = TinyNet::<B>::new(d, device);
    let _ = param_bits(&model); // initialize every parameter now, in a fixed order
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut losses = Vec::new();
    for step in 0..steps {
        let (tokens, labels) = batch::<B>(d, step, device);
        let loss = loss_fn.forward(model.forward(tokens), labels);
        let data = loss.clone().into_data();
        losses.extend(
            data.to_vec::<f32>()
                .expect("f32 loss")
                .into_iter()
                .map(f32::to_bits),
        );
        let grads = loss.backward();
        sample();
        let grads = GradientsParams::from_grads(grads, &model);
        model = optim.step(1e-3, model, grads);
        sample();
    }
    (losses, param_bits(&model))
}

fn run_reference(d: &Dims, steps: usize) -> Run {
    let device = CudaDevice::new(0);
    let start = Instant::now();
    let (losses, params) = train::<Reference, _>(d, steps, &device, adam(), || {});
    Run {
        losses,
        params,
        secs: start.elapsed().as_secs_f64(),
        ..Run::default()
    }
}

fn run_dtr(d: &Dims, steps: usize, budget: Option<u64>, swap: bool) -> Result<Run, String> {
    let mut config = DtrConfig::from_env()
        .map_err(|e| e.to_string())?
        .with_budget_mode(BudgetMode::Logical);
    config.budget = None;
    if let Some(b) = budget {
        config = config.with_budget(b);
    }
    // Swap to host memory through Burn's own copies, at the
    // bandwidth the device measures when it starts.
    config.swap.enabled = swap;
    let device = DtrDevice::<Cuda>::new(CudaDevice::new(0), config).map_err(|e| e.to_string())?;
    let mut run = Run::default();
    let mut sample_error = None;
    let start = Instant::now();
    let trained = catch_muted(|| {
        train::<Ours, _>(
            d,
            steps,
            &device,
            Sealing::new(adam(), &device),
            || match device.device_memory() {
                Ok(m) => {
                    run.pool_used_max = run.pool_used_max.max(m.pool_used.unwrap_or(0));
                    run.model_live_max = run.model_live_max.max(m.model_live);
                }
                Err(e) => sample_error = Some(e.to_string()),
            },
        )
    });
    run.secs = start.elapsed().as_secs_f64();
    if let Some(e) = device.take_error() {
        return Err(e.to_string());
    }
    let (losses, params) = trained.map_err(|_| "training panicked".to_string())?;
    if let Some(e) = sample_error {
        return Err(format!("device_memory: {e}"));
    }
    let stats = device.stats();
    run.losses = losses;
    run.params = params;
    run.peak_allocated = stats.memory.peak_allocated;
    run.evictions = stats.runtime.evictions;
    run.rematerializations = stats.runtime.rematerializations;
    if swap {
        run.swap = Some((
            device.swap_bandwidth().unwrap_or(0.0),
            stats.runtime.swapped_out_bytes,
            stats.runtime.swap_outs,
            stats.host_copy_ns,
        ));
    }
    Ok(run)
}

/// Largest relative difference between two loss sequences.
fn loss_diff(a: &[u32], b: &[u32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let (x, y) = (f32::from_bits(x) as f64, f32::from_bits(y) as f64);
            (x - y).abs() / x.abs().max(y.abs()).max(1e-30)
        })
        .fold(0.0, f64::max)
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut json_path = None;
    if let Some(i) = args.iter().position(|a| a == "--json") {
        if i + 1 < args.len() {
            json_path = Some(args.remove(i + 1));
        }
        args.remove(i);
    }
    let steps: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(5);
    if let Err(e) = remat_alloc::CudaDevice::new(0) {
        println!("no CUDA device: skipped ({e})");
        return ExitCode::SUCCESS;
    }
    let d = Dims::demo();
    println!("model: {d:?}, {steps} Adam steps, inner backend burn-cuda");

    let ref_a = run_reference(&d, steps);
    let ref_b = run_reference(&d, steps);
    let reproducible = ref_a.losses == ref_b.losses && ref_a.params == ref_b.params;
    let noise = loss_diff(&ref_a.losses, &ref_b.losses);
    let tolerance = if reproducible {
        0.0
    } else {
        (4.0 * noise).max(1e-6)
    };
    println!(
        "Autodiff<Cuda>: {:.2} s, then {:.2} s; bit-reproducible run to run: {reproducible} \
         (max relative loss difference {noise:.3e}); tolerance {tolerance:.3e}",
        ref_a.secs, ref_b.secs
    );
    let losses: Vec<f32> = ref_a.losses.iter().map(|&b| f32::from_bits(b)).collect();
    println!("losses: {losses:?}");

    let mut ok = true;
    let mut rows = Vec::new();
    let free = match run_dtr(&d, steps, None, false) {
        Ok(r) => r,
        Err(e) => {
            println!("Autodiff<Dtr<Cuda>> unconstrained failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let peak = free.peak_allocated;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let runs = [
        (None, false),
        (Some(100u64), false),
        (Some(50), false),
        (Some(30), false),
        (Some(30), true),
        (Some(10), true),
    ];
    for (percent, swap) in runs {
        let budget = percent.map(|p| peak * p / 100);
        let label = percent.map_or("unconstrained".to_string(), |p| {
            format!("budget {p} %{}", if swap { " + swap" } else { "" })
        });
        let run = if percent.is_none() {
            Ok(free.clone())
        } else {
            run_dtr(&d, steps, budget, swap)
        };
        match run {
            Ok(r) => {
                let diff = loss_diff(&ref_a.losses, &r.losses);
                let same = if reproducible {
                    r.losses == ref_a.losses && r.params == ref_a.params
                } else {
                    diff <= tolerance
                };
                let within = budget.is_none_or(|b| r.model_live_max <= b);
                ok &= same && within;
                println!(
                    "{label:>14}: model peak {:8.2} MiB (budget {}), resident max {:8.2} MiB, \
                     cubecl in use max {:8.2} MiB, {:.2} s, evictions {}, remats {}; \
                     losses {} (max rel. diff {diff:.3e}); resident within budget: {within}",
                    mib(r.peak_allocated),
                    budget.map_or("none".into(), |b| format!("{:.2} MiB", mib(b))),
                    mib(r.model_live_max),
                    mib(r.pool_used_max),
                    r.secs,
                    r.evictions,
                    r.rematerializations,
                    if same { "match" } else { "DIFFER" },
                );
                if let Some((gbps, bytes, outs, copy_ns)) = r.swap {
                    println!(
                        "{:>14}  swap: measured {gbps:.2} GB/s, {outs} swap-outs, {:.2} MiB to host, \
                         copies took {:.3} s",
                        "",
                        mib(bytes),
                        copy_ns as f64 / 1e9
                    );
                }
                let swap_json = r.swap.map_or("null".to_string(), |(g, b, o, c)| {
                    format!(
                        "{{\"gbps\":{g:.3},\"swapped_out_bytes\":{b},\"swap_outs\":{o},\"copy_ns\":{c}}}"
                    )
                });
                rows.push(format!(
                    "{{\"run\":\"{label}\",\"budget\":{},\"ok\":{},\"losses_match\":{same},\
                     \"max_rel_loss_diff\":{diff:e},\"peak_allocated\":{},\"model_live_max\":{},\
                     \"pool_used_max\":{},\"evictions\":{},\"rematerializations\":{},\"secs\":{:.3},\
                     \"swap\":{swap_json}}}",
                    budget.map_or("null".into(), |b| b.to_string()),
                    same && within,
                    r.peak_allocated,
                    r.model_live_max,
                    r.pool_used_max,
                    r.evictions,
                    r.rematerializations,
                    r.secs
                ));
            }
            Err(e) => {
                ok = false;
                println!("{label:>14}: failed: {e}");
                rows.push(format!(
                    "{{\"run\":\"{label}\",\"ok\":false,\"error\":{}}}",
                    json_str(&e)
                ));
            }
        }
    }
    if let Some(p) = json_path {
        let body = format!(
            "{{\"reference_reproducible\":{reproducible},\"reference_noise\":{noise:e},\
             \"tolerance\":{tolerance:e},\"runs\":[{}]}}\n",
            rows.join(",")
        );
        if let Err(e) = std::fs::write(&p, body) {
            eprintln!("{p}: {e}");
            ok = false;
        }
    }
    if ok {
        println!("Autodiff<Dtr<Cuda>> matches Autodiff<Cuda> under every budget");
        ExitCode::SUCCESS
    } else {
        println!("Autodiff<Dtr<Cuda>>: a run failed or differed");
        ExitCode::FAILURE
    }
}
