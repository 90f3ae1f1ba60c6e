//! Training-step time and peak memory of the demo CNN under budgets of 100, 70, 50,
//! 40 and 30 % of its peak activation memory, against plain candle-nn and against
//! the adapter without a budget. A bench binary that prints a Markdown table:
//!
//! ```text
//! cargo bench -p remat-candle --bench train_step -- [--steps N] [--batch B]
//! ```
//!
//! Every configuration trains from the same seeded parameters on the same batches;
//! the table says whether all loss sequences were bit-identical.

use std::hint::black_box;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use remat_candle::nn::loss;
use remat_candle::{CandleErrorExt, Remat, RematConfig};
use remat_dtr::{BudgetMode, DtrConfig};

#[path = "../examples/shared/cnn.rs"]
mod cnn;
use cnn::{dataset, seeded_init, Cnn, PlainCnn, DATASET, SIDE};

const DROPOUT_SEED: u64 = 7;
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
const WARMUP: usize = 2;

struct Result {
    name: String,
    step: Duration,
    fastest: Duration,
    peak: Option<u64>,
    external: Option<u64>,
    evictions: u64,
    remats: u64,
    /// Measured time of first computations / of rematerializations, ms per step.
    compute_ms: f64,
    remat_ms: f64,
    losses: Vec<u32>,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn fastest(v: &[Duration]) -> Duration {
    v.iter().copied().min().unwrap_or_default()
}

fn data(batch: usize) -> (Tensor, Tensor) {
    let (xs, ys) = dataset();
    let dev = Device::Cpu;
    let images = Tensor::from_vec(xs, (DATASET, 1, SIDE, SIDE), &dev).unwrap();
    let labels = Tensor::from_vec(ys, DATASET, &dev).unwrap();
    assert!(batch <= DATASET);
    (images, labels)
}

fn plain(steps: usize, batch: usize) -> Result {
    let dev = Device::Cpu;
    let (images, labels) = data(batch);
    let varmap = VarMap::new();
    let model = PlainCnn::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev)).unwrap();
    seeded_init(&varmap, &dev).unwrap();
    let mut opt = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: 2e-3,
            ..Default::default()
        },
    )
    .unwrap();
    let mut times = Vec::new();
    let mut losses = Vec::new();
    for step in 0..WARMUP + steps {
        let first = (step * batch) % (DATASET - batch + 1);
        let x = images.narrow(0, first, batch).unwrap();
        let y = labels.narrow(0, first, batch).unwrap();
        let t = Instant::now();
        let seed = DROPOUT_SEED.wrapping_add((step as u64).wrapping_mul(GOLDEN));
        let l = loss_plain(&model, &x, &y, seed);
        let grads = l.backward().unwrap();
        opt.step(&grads).unwrap();
        let v = l.to_scalar::<f32>().unwrap();
        black_box(&grads);
        if step >= WARMUP {
            times.push(t.elapsed());
        }
        losses.push(v.to_bits());
    }
    Result {
        name: "plain candle-nn".into(),
        step: median(&times),
        fastest: fastest(&times),
        peak: None,
        external: None,
        evictions: 0,
        remats: 0,
        compute_ms: 0.0,
        remat_ms: 0.0,
        losses,
    }
}

fn loss_plain(m: &PlainCnn, x: &Tensor, y: &Tensor, seed: u64) -> Tensor {
    candle_nn::loss::cross_entropy(&m.forward(x, seed).unwrap(), y).unwrap()
}

fn adapter(
    name: &str,
    mode: BudgetMode,
    budget: Option<u64>,
    steps: usize,
    batch: usize,
) -> std::result::Result<Result, candle_core::Error> {
    let dev = Device::Cpu;
    let (images, labels) = data(batch);
    let dtr = DtrConfig::default().with_budget_mode(mode);
    let remat = Remat::new(
        RematConfig::new()
            .with_dtr(dtr)
            .with_budget_bytes(budget.unwrap_or(1 << 40))
            .with_dropout_seed(DROPOUT_SEED),
    )?;
    let varmap = VarMap::new();
    let model = Cnn::new(&remat, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    seeded_init(&varmap, &dev).unwrap();
    let mut opt = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: 2e-3,
            ..Default::default()
        },
    )
    .unwrap();
    let mut times = Vec::new();
    let mut losses = Vec::new();
    let mut external = 0;
    let mut base = (0, 0, 0.0, 0.0);
    for step in 0..WARMUP + steps {
        if step == WARMUP {
            let s = remat.stats().unwrap();
            base = (s.evictions, s.rematerializations, s.compute_ns, s.remat_ns);
        }
        let first = (step * batch) % (DATASET - batch + 1);
        let t = Instant::now();
        let x = remat.input(&images.narrow(0, first, batch)?)?;
        let y = remat.input(&labels.narrow(0, first, batch)?)?;
        if step == 0 {
            external = remat.memory_usage()?.allocated;
        }
        let l = loss::cross_entropy(&model.forward(&x)?, &y)?;
        let grads = l.backward()?;
        let v = l.to_scalar::<f32>()?;
        drop((l, x, y));
        opt.step(&grads).unwrap();
        black_box(&grads);
        if step >= WARMUP {
            times.push(t.elapsed());
        }
        losses.push(v.to_bits());
    }
    let s = remat.stats()?;
    Ok(Result {
        name: name.into(),
        step: median(&times),
        fastest: fastest(&times),
        peak: Some(remat.memory_usage()?.peak_allocated),
        external: Some(external),
        evictions: (s.evictions - base.0) / steps as u64,
        remats: (s.rematerializations - base.1) / steps as u64,
        compute_ms: (s.compute_ns - base.2) / steps as f64 / 1e6,
        remat_ms: (s.remat_ns - base.3) / steps as f64 / 1e6,
        losses,
    })
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1u64 << 20) as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str, default: usize| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let steps = arg("--steps", 8);
    let batch = arg("--batch", 64);
    let mut rows = vec![plain(steps, batch)];
    let mut impossible = Vec::new();
    for mode in [BudgetMode::Physical, BudgetMode::Logical] {
        let free = match adapter(
            &format!("remat {mode}, no budget"),
            mode,
            None,
            steps,
            batch,
        ) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        };
        let ext = free.external.unwrap_or(0);
        let act = free.peak.unwrap_or(0) - ext;
        rows.push(free);
        for pct in [100u64, 70, 50, 40, 30] {
            let budget = ext + act * pct / 100;
            let name = format!("remat {mode}, {pct} % ({} MiB)", mib(budget));
            match adapter(&name, mode, Some(budget), steps, batch) {
                Ok(r) => rows.push(r),
                Err(e) if e.is_impossible_budget() => impossible.push(format!("{name}: {e}")),
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(2);
                }
            }
        }
    }
    let same = rows.iter().all(|r| r.losses == rows[0].losses);
    let base = rows[0].fastest.as_secs_f64();
    println!(
        "\ndemo CNN, batch {batch} of 1x{SIDE}x{SIDE}, {steps} timed steps after {WARMUP} warm-up \
         (fastest and median step); budgets are parameters + batch + the given share of the \
         activation peak; physical = remat-alloc caching allocator over a simulated device \
         of the budget's size, logical = sum of live bytes\n"
    );
    println!(
        "| configuration | ms/step (min) | ms/step (median) | min vs plain | peak MiB | activations MiB | evictions/step | remats/step | fwd op ms/step | remat ms/step |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let (peak, acts) = match (r.peak, r.external) {
            (Some(p), Some(e)) => (mib(p), mib(p.saturating_sub(e))),
            _ => ("—".into(), "—".into()),
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.2}× | {} | {} | {} | {} | {:.1} | {:.1} |",
            r.name,
            r.fastest.as_secs_f64() * 1e3,
            r.step.as_secs_f64() * 1e3,
            r.fastest.as_secs_f64() / base,
            peak,
            acts,
            r.evictions,
            r.remats,
            r.compute_ms,
            r.remat_ms
        );
    }
    for line in &impossible {
        println!("\nimpossible: {line}");
    }
    println!("\nall loss sequences bit-identical (plain candle included): {same}");
    if !same {
        std::process::exit(1);
    }
}
