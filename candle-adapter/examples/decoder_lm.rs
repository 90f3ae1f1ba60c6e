//! Train a Llama-style decoder-only language model (RmsNorm, rotary embeddings,
//! a causal mask, a SiLU-gated MLP, output layer tied to the embedding table) on
//! synthetic tokens: in plain candle-nn, then with remat-candle unconstrained and
//! at 100 %, 50 % and 30 % of its measured activation peak. Every run must give
//! the plain run's losses and parameters, bit for bit.
//!
//! ```text
//! cargo run --release -p remat-candle --example decoder_lm -- [--steps N] [--batch B]
//! ```
//!
//! The budget is enforced in the default (physical) mode; `REMAT_DTR_CONF` may
//! pick another (`budget_mode:logical`) and the policy; the example sets the
//! budget itself. Each step ends with `Remat::end_iteration()`, so later steps
//! follow a plan. Exits with status 1 if anything differs, 2 on an error.
//!
//! The model is `examples/shared/lm.rs`: the remat-candle version and the plain
//! one differ only where candle-nn's fused kernels have no backward (the plain
//! one calls `forward_diff`, `softmax` and `rope_slow`; docs/candle.md).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use remat_candle::nn::loss;
use remat_candle::{Remat, RematConfig};

#[path = "shared/lm.rs"]
mod lm;
#[path = "shared/setup.rs"]
mod setup;
use lm::{Config, Lm, PlainLm};
use setup::{arg, mib, snapshot};

const CFG: Config = Config {
    vocab: 256,
    dim: 64,
    heads: 4,
    hidden: 176,
    layers: 2,
    seq: 32,
    rms_eps: 1e-6,
    rope_theta: 10000.,
};

struct Run {
    losses: Vec<f32>,
    params: BTreeMap<String, Vec<u32>>,
    time: Duration,
    peak: u64,
    evictions: u64,
    remats: u64,
}

fn train_plain(steps: usize, batch: usize) -> candle_core::Result<Run> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let model = PlainLm::new(CFG, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    setup::seeded_init(&varmap, |n| n.contains("rms") || n.starts_with("norm"))?;
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let (x, y) = lm::tokens(&CFG, batch, &dev)?;
    let start = Instant::now();
    let mut losses = Vec::new();
    for _ in 0..steps {
        let logits = model.forward(&x)?.reshape((batch * CFG.seq, CFG.vocab))?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let grads = loss.backward()?;
        losses.push(loss.to_scalar::<f32>()?);
        opt.step(&grads)?;
    }
    Ok(Run {
        losses,
        params: snapshot(&varmap)?,
        time: start.elapsed(),
        peak: 0,
        evictions: 0,
        remats: 0,
    })
}

fn train_remat(steps: usize, batch: usize, budget: Option<u64>) -> candle_core::Result<Run> {
    let dev = Device::Cpu;
    let dtr = RematConfig::from_env()?.dtr;
    let remat = Remat::new(
        RematConfig::new()
            .with_dtr(dtr)
            .with_budget_bytes(budget.unwrap_or(1 << 40)),
    )?;
    let varmap = VarMap::new();
    let model = Lm::new(
        CFG,
        &remat,
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    )?;
    setup::seeded_init(&varmap, |n| n.contains("rms") || n.starts_with("norm"))?;
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let (x, y) = lm::tokens(&CFG, batch, &dev)?;
    let (x, y) = (remat.input(&x)?, remat.input(&y)?);
    let start = Instant::now();
    let mut losses = Vec::new();
    for _ in 0..steps {
        let logits = model.forward(&x)?.reshape((batch * CFG.seq, CFG.vocab))?;
        let loss = loss::cross_entropy(&logits, &y)?;
        let grads = loss.backward()?;
        losses.push(loss.to_scalar::<f32>()?);
        drop((loss, logits));
        opt.step(&grads)?;
        remat.end_iteration()?;
    }
    let stats = remat.stats()?;
    Ok(Run {
        losses,
        params: snapshot(&varmap)?,
        time: start.elapsed(),
        peak: remat.memory_usage()?.peak_allocated,
        evictions: stats.evictions,
        remats: stats.rematerializations,
    })
}

fn run() -> Result<bool, String> {
    let steps = arg("--steps", 8)?;
    let batch = arg("--batch", 8)?;
    let e = |e: candle_core::Error| e.to_string();
    let plain = train_plain(steps, batch).map_err(e)?;
    let free = train_remat(steps, batch, None).map_err(e)?;
    let params: u64 = free.params.values().map(|p| p.len() as u64 * 4).sum();
    // Parameters (the tied table once), rotary tables, mask, one batch.
    let external = params + CFG.table_bytes() + (2 * batch * CFG.seq * 4) as u64;
    let act = free.peak.saturating_sub(external);
    println!(
        "decoder LM: vocab {}, dim {}, {} layers × {} heads, MLP {}, seq {}, batch {batch}, {steps} AdamW steps",
        CFG.vocab, CFG.dim, CFG.layers, CFG.heads, CFG.hidden, CFG.seq
    );
    println!(
        "parameters {:.2} MiB (output layer tied to the embedding, counted once), activation peak {:.2} MiB",
        mib(params),
        mib(act)
    );
    println!(
        "{:<16} {:>12} {:>10} {:>10} {:>9} {:>9}  bit-identical to plain candle",
        "run", "budget MiB", "peak MiB", "time", "evictions", "remats"
    );
    let same = |r: &Run| {
        r.losses
            .iter()
            .map(|l| l.to_bits())
            .eq(plain.losses.iter().map(|l| l.to_bits()))
            && r.params == plain.params
    };
    println!(
        "{:<16} {:>12} {:>10} {:>9.2}s {:>9} {:>9}  —",
        "plain candle-nn",
        "—",
        "—",
        plain.time.as_secs_f64(),
        0,
        0
    );
    let mut ok = true;
    let mut row = |name: String, budget: Option<u64>, r: &Run| {
        let b = budget.map_or("—".to_string(), |b| format!("{:.2}", mib(b)));
        let s = same(r);
        ok &= s;
        println!(
            "{name:<16} {b:>12} {:>10.2} {:>9.2}s {:>9} {:>9}  {s}",
            mib(r.peak),
            r.time.as_secs_f64(),
            r.evictions,
            r.remats
        );
    };
    row("remat, no budget".into(), None, &free);
    for pct in [100u64, 50, 30] {
        let budget = external + act * pct / 100;
        let r = train_remat(steps, batch, Some(budget)).map_err(e)?;
        if r.peak > budget {
            return Err(format!("peak {} B above the budget {budget} B", r.peak));
        }
        row(format!("remat, {pct} %"), Some(budget), &r);
    }
    println!(
        "losses: first {:.4}, last {:.4}",
        plain.losses[0],
        plain.losses[plain.losses.len() - 1]
    );
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("a run under a budget differs from plain candle");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
