//! candle-transformers' Qwen2 (`models/qwen2.rs` of candle-transformers 0.11.1:
//! grouped-query attention, RmsNorm, rotary embeddings, an additive causal mask,
//! a SiLU-gated MLP, an output layer tied to the embedding table), ported to
//! remat-candle by changing its imports, trained on synthetic tokens at small
//! dimensions: in plain candle (the reference), then through remat-candle
//! unconstrained and at 100 %, 50 % and 30 % of its measured activation peak.
//! Every run must give the reference's losses and parameters, bit for bit.
//!
//! ```text
//! cargo run --release -p remat-candle --example qwen2_lm -- [--steps N] [--batch B]
//! ```
//!
//! - `qwen2.rs`: the port (upstream's file, imports changed: docs/candle.md
//!   shows the diff).
//! - `models/qwen2.rs`: the reference, upstream's file in plain candle with the
//!   reference swaps for candle-nn's fused kernels that have no backward
//!   (`rope_slow`, `softmax`); `models/with_tracing.rs` the plain layers
//!   (`RmsNorm` through `forward_diff`).
//! - `utils.rs`: candle-transformers' `crate::utils::repeat_kv` for both.
//!
//! The budget is enforced in the default (physical) mode; `REMAT_DTR_CONF` may
//! pick another (`budget_mode:logical`) and the policy. Each step ends with
//! `Remat::end_iteration()`. Exits with status 1 if a run differs from the
//! reference or exceeds its budget, 2 on an error.

// The reference's `use candle::…` (candle-transformers names candle-core `candle`).
extern crate candle_core as candle;

#[allow(dead_code, clippy::all)]
mod models;
#[allow(dead_code, clippy::all)]
mod qwen2;
#[path = "../shared/setup.rs"]
mod setup;
mod train;
mod utils;

use std::process::ExitCode;

use setup::{arg, mib};
use train::{Run, Size};

fn run() -> Result<bool, String> {
    let s = Size {
        vocab: 256,
        hidden: 64,
        intermediate: 176,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        seq: 32,
        batch: arg("--batch", 16)?,
        steps: arg("--steps", 8)?,
    };
    let e = |e: remat_candle::candle::Error| e.to_string();
    let dtr = remat_candle::RematConfig::from_env().map_err(e)?.dtr;
    let plain = train::train_plain(&s).map_err(e)?;
    let free = train::train_remat(&s, dtr.clone(), None).map_err(e)?;
    let act = free.peak.saturating_sub(free.external);
    println!(
        "Qwen2 (candle-transformers): vocab {}, hidden {}, {} layers × {} heads ({} kv), MLP {}, seq {}, batch {}, {} AdamW steps",
        s.vocab, s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, s.seq, s.batch, s.steps
    );
    println!(
        "before the first step {:.3} MiB (parameters, the tied table once; rotary tables; batch), activation peak {:.3} MiB",
        mib(free.external),
        mib(act)
    );
    println!(
        "{:<16} {:>12} {:>10} {:>10} {:>9} {:>9}  bit-identical to plain candle",
        "run", "budget MiB", "peak MiB", "time", "evictions", "remats"
    );
    println!(
        "{:<16} {:>12} {:>10} {:>9.2}s {:>9} {:>9}  —",
        "plain candle",
        "—",
        "—",
        plain.time.as_secs_f64(),
        0,
        0
    );
    let mut ok = true;
    let mut row = |name: String, budget: Option<u64>, r: &Run| {
        let b = budget.map_or("—".to_string(), |b| format!("{:.3}", mib(b)));
        let same = r.same_as(&plain);
        ok &= same && budget.is_none_or(|b| r.peak <= b);
        println!(
            "{name:<16} {b:>12} {:>10.3} {:>9.2}s {:>9} {:>9}  {same}",
            mib(r.peak),
            r.time.as_secs_f64(),
            r.evictions,
            r.remats
        );
    };
    row("remat, no budget".into(), None, &free);
    for pct in [100u64, 50, 30] {
        let budget = free.external + act * pct / 100;
        let r = train::train_remat(&s, dtr.clone(), Some(budget)).map_err(e)?;
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
            eprintln!("a run under a budget differs from plain candle or exceeds its budget");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
