//! Training driver shared by the `qwen2_lm` example and `tests/qwen2_port.rs`:
//! candle-transformers' Qwen2 (`ModelForCausalLM`, output layer tied to the
//! embedding table) trained on synthetic tokens, once in plain candle
//! (`crate::models::qwen2`, the reference) and once through remat-candle
//! (`crate::qwen2`, the port) under a budget. The model code is upstream's; the
//! loops below are the only code written here.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use remat_candle::candle::{DType, Device, Result, Tensor};
use remat_candle::candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};
use remat_candle::{DtrConfig, Remat, RematConfig};

use crate::setup::{seeded_init, snapshot};

/// The model's and the run's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Sequence length (also `max_position_embeddings`, the rotary table's length).
    pub seq: usize,
    pub batch: usize,
    pub steps: usize,
}

/// One training run's results.
pub struct Run {
    /// The loss of each step.
    pub losses: Vec<f32>,
    /// The bits of every parameter after the last step, by name.
    pub params: BTreeMap<String, Vec<u32>>,
    pub time: Duration,
    /// Peak allocated bytes in the placement model (remat runs).
    pub peak: u64,
    /// Bytes allocated before the first step: parameters (the tied table once),
    /// the rotary tables, the batch (remat runs).
    pub external: u64,
    pub evictions: u64,
    pub remats: u64,
}

impl Run {
    /// Same losses and parameters, bit for bit.
    pub fn same_as(&self, other: &Run) -> bool {
        self.losses
            .iter()
            .map(|l| l.to_bits())
            .eq(other.losses.iter().map(|l| l.to_bits()))
            && self.params == other.params
    }
}

/// Qwen2's configuration at `s` (SiLU, tied embeddings, no sliding window).
macro_rules! config {
    ($t:ident, $s:expr) => {
        $t {
            vocab_size: $s.vocab,
            hidden_size: $s.hidden,
            intermediate_size: $s.intermediate,
            num_hidden_layers: $s.layers,
            num_attention_heads: $s.heads,
            num_key_value_heads: $s.kv_heads,
            max_position_embeddings: $s.seq,
            sliding_window: $s.seq,
            max_window_layers: $s.layers,
            tie_word_embeddings: true,
            rope_theta: 10000.,
            rms_norm_eps: 1e-6,
            use_sliding_window: false,
            hidden_act: remat_candle::nn::Activation::Silu,
        }
    };
}

/// A batch of synthetic token rows `(batch, seq)` and the token that follows
/// each row `(batch,)`: each row counts up by a row-specific stride, so the
/// next token is learnable.
pub fn tokens(s: &Size, dev: &Device) -> Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = (0..s.batch)
        .flat_map(|b| (0..=s.seq).map(move |i| ((b * 7 + i * (1 + b % 3)) % s.vocab) as u32))
        .collect();
    let all = Tensor::from_vec(ids, (s.batch, s.seq + 1), dev)?;
    Ok((
        all.narrow(1, 0, s.seq)?.contiguous()?,
        all.narrow(1, s.seq, 1)?.flatten_all()?.contiguous()?,
    ))
}

/// The reference: upstream's file (with the reference swaps) in plain candle.
pub fn train_plain(s: &Size) -> Result<Run> {
    use crate::models::qwen2::{Config, ModelForCausalLM};
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = remat_candle::candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mut model = ModelForCausalLM::new(&config!(Config, s), vb)?;
    seeded_init(&varmap, |n| n.contains("norm"))?;
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let (x, y) = tokens(s, &dev)?;
    let start = Instant::now();
    let mut losses = Vec::new();
    for _ in 0..s.steps {
        let logits = model.forward(&x, 0)?.squeeze(1)?;
        model.clear_kv_cache();
        let loss = remat_candle::candle_nn::loss::cross_entropy(&logits, &y)?;
        let grads = loss.backward()?;
        losses.push(loss.to_scalar::<f32>()?);
        opt.step(&grads)?;
    }
    Ok(Run {
        losses,
        params: snapshot(&varmap)?,
        time: start.elapsed(),
        peak: 0,
        external: 0,
        evictions: 0,
        remats: 0,
    })
}

/// The port through remat-candle, under `budget` bytes (`None`: unbounded).
pub fn train_remat(s: &Size, dtr: DtrConfig, budget: Option<u64>) -> Result<Run> {
    use crate::qwen2::{Config, ModelForCausalLM};
    use remat_candle::nn::{loss, VarBuilder};
    let dev = Device::Cpu;
    let cfg = RematConfig::new().with_dtr(dtr);
    let remat = Remat::new(match budget {
        Some(b) => cfg.with_budget_bytes(b),
        None => cfg,
    })?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mut model = ModelForCausalLM::new(&config!(Config, s), vb)?;
    seeded_init(&varmap, |n| n.contains("norm"))?;
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let (x, y) = tokens(s, &dev)?;
    let (x, y) = (remat.input(&x)?, remat.input(&y)?);
    let external = remat.memory_usage()?.allocated;
    let start = Instant::now();
    let mut losses = Vec::new();
    for _ in 0..s.steps {
        let logits = model.forward(&x, 0)?.squeeze(1)?;
        model.clear_kv_cache();
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
        external,
        evictions: stats.evictions,
        remats: stats.rematerializations,
    })
}
