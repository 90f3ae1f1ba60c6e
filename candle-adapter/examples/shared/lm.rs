//! A Llama-style decoder-only language model, twice: over remat-candle's
//! `RTensor` and `nn`, and over plain candle-nn. Shared by the `decoder_lm`
//! example and `tests/tied.rs`.
//!
//! Each layer: RmsNorm, causal multi-head attention with rotary embeddings
//! (`rope`) and a mask applied by `masked_fill`, a residual; RmsNorm, a SiLU-gated
//! MLP, a residual. A final RmsNorm, then an output layer **tied** to the
//! embedding table. The two versions differ only where candle-nn's fused kernels
//! have no backward: the plain one calls `forward_diff`, `softmax` and
//! `rope_slow` (see docs/candle.md, "Reference losses").
#![allow(dead_code)]

use candle_core::{DType, Device, Module as _, Tensor, D};
use candle_nn::VarBuilder;
use remat_candle::nn::{self, ops, rotary_emb, Module};
use remat_candle::{RTensor, Remat};

/// The model's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub vocab: usize,
    pub dim: usize,
    pub heads: usize,
    pub hidden: usize,
    pub layers: usize,
    /// Sequence length.
    pub seq: usize,
    pub rms_eps: f64,
    pub rope_theta: f32,
}

impl Config {
    fn head_dim(&self) -> usize {
        self.dim / self.heads
    }

    /// Bytes of the constants each model holds: the rotary tables and the mask.
    pub fn table_bytes(&self) -> u64 {
        (2 * self.seq * self.head_dim() / 2 * 4 + self.seq * self.seq) as u64
    }
}

/// Llama's rotary tables `(seq, head_dim / 2)` and the causal mask `(seq, seq)`
/// (1 above the diagonal).
pub fn tables(cfg: &Config, dev: &Device) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let hd = cfg.head_dim();
    let inv: Vec<f32> = (0..hd)
        .step_by(2)
        .map(|i| 1f32 / cfg.rope_theta.powf(i as f32 / hd as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, hd / 2), dev)?;
    let t = Tensor::arange(0u32, cfg.seq as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((cfg.seq, 1))?;
    let freqs = t.matmul(&inv)?;
    let mask: Vec<u8> = (0..cfg.seq)
        .flat_map(|i| (0..cfg.seq).map(move |j| u8::from(j > i)))
        .collect();
    Ok((
        freqs.cos()?,
        freqs.sin()?,
        Tensor::from_vec(mask, (cfg.seq, cfg.seq), dev)?,
    ))
}

/// A batch of synthetic tokens `(batch, seq)` and its next-token targets
/// `(batch · seq,)`: each row counts up by a row-specific stride, so the next
/// token is learnable.
pub fn tokens(cfg: &Config, batch: usize, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = (0..batch)
        .flat_map(|b| (0..=cfg.seq).map(move |i| ((b * 7 + i * (1 + b % 3)) % cfg.vocab) as u32))
        .collect();
    let all = Tensor::from_vec(ids, (batch, cfg.seq + 1), dev)?;
    Ok((
        all.narrow(1, 0, cfg.seq)?.contiguous()?,
        all.narrow(1, 1, cfg.seq)?.contiguous()?.flatten_all()?,
    ))
}

// ----- remat-candle --------------------------------------------------------------------

struct Layer {
    rms1: nn::RmsNorm,
    q: nn::Linear,
    k: nn::Linear,
    v: nn::Linear,
    o: nn::Linear,
    rms2: nn::RmsNorm,
    gate: nn::Linear,
    up: nn::Linear,
    down: nn::Linear,
}

/// The model over remat-candle.
pub struct Lm {
    cfg: Config,
    embed: nn::Embedding,
    layers: Vec<Layer>,
    norm: nn::RmsNorm,
    head: nn::Linear,
    cos: RTensor,
    sin: RTensor,
    mask: RTensor,
}

impl Lm {
    pub fn new(cfg: Config, remat: &Remat, vb: VarBuilder) -> remat_candle::Result<Self> {
        let vb = nn::VarBuilder::new(remat, vb);
        let (dim, hidden) = (cfg.dim, cfg.hidden);
        let embed = nn::embedding(cfg.vocab, dim, vb.pp("embed"))?;
        let lin = |i, o, p: &str, vb: &nn::VarBuilder| nn::linear_no_bias(i, o, vb.pp(p));
        let layers = (0..cfg.layers)
            .map(|l| {
                let vb = vb.pp(format!("layers.{l}"));
                Ok(Layer {
                    rms1: nn::rms_norm(dim, cfg.rms_eps, vb.pp("rms1"))?,
                    q: lin(dim, dim, "q", &vb)?,
                    k: lin(dim, dim, "k", &vb)?,
                    v: lin(dim, dim, "v", &vb)?,
                    o: lin(dim, dim, "o", &vb)?,
                    rms2: nn::rms_norm(dim, cfg.rms_eps, vb.pp("rms2"))?,
                    gate: lin(dim, hidden, "gate", &vb)?,
                    up: lin(dim, hidden, "up", &vb)?,
                    down: lin(hidden, dim, "down", &vb)?,
                })
            })
            .collect::<remat_candle::Result<Vec<_>>>()?;
        let norm = nn::rms_norm(dim, cfg.rms_eps, vb.pp("norm"))?;
        // Tied as candle-transformers writes it: a candle-nn Linear over the
        // embedding's tensor, wrapped. The storage is shared, counted once.
        let table = vb.candle().pp("embed").get((cfg.vocab, dim), "weight")?;
        let head = nn::Linear::from_candle(remat, &candle_nn::Linear::new(table, None))?;
        let (cos, sin, mask) = tables(&cfg, vb.device())?;
        Ok(Self {
            cfg,
            embed,
            layers,
            norm,
            head,
            cos: remat.input(&cos)?,
            sin: remat.input(&sin)?,
            mask: remat.input(&mask)?,
        })
    }

    fn attention(&self, l: &Layer, x: &RTensor) -> remat_candle::Result<RTensor> {
        let (b, t, _) = x.dims3()?;
        let (h, hd) = (self.cfg.heads, self.cfg.head_dim());
        let split = |y: RTensor| y.reshape((b, t, h, hd))?.transpose(1, 2)?.contiguous();
        let q = rotary_emb::rope(&split(l.q.forward(x)?)?, &self.cos, &self.sin)?;
        let k = rotary_emb::rope(&split(l.k.forward(x)?)?, &self.cos, &self.sin)?;
        let v = split(l.v.forward(x)?)?;
        let att = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let mask = self.mask.broadcast_as(att.shape())?;
        let att = ops::softmax_last_dim(&att.masked_fill(&mask, f32::NEG_INFINITY)?)?;
        let y = att
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, self.cfg.dim))?;
        l.o.forward(&y)
    }

    /// Logits `(batch, seq, vocab)` of token ids `(batch, seq)`.
    pub fn forward(&self, ids: &RTensor) -> remat_candle::Result<RTensor> {
        let mut x = self.embed.forward(ids)?;
        for l in &self.layers {
            x = (&x + self.attention(l, &l.rms1.forward(&x)?)?)?;
            let h = l.rms2.forward(&x)?;
            let m = l
                .down
                .forward(&(ops::silu(&l.gate.forward(&h)?)? * l.up.forward(&h)?)?)?;
            x = (&x + m)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}

// ----- plain candle ------------------------------------------------------------------------

struct PlainLayer {
    rms1: candle_nn::RmsNorm,
    q: candle_nn::Linear,
    k: candle_nn::Linear,
    v: candle_nn::Linear,
    o: candle_nn::Linear,
    rms2: candle_nn::RmsNorm,
    gate: candle_nn::Linear,
    up: candle_nn::Linear,
    down: candle_nn::Linear,
}

/// The same model over plain candle-nn.
pub struct PlainLm {
    cfg: Config,
    embed: candle_nn::Embedding,
    layers: Vec<PlainLayer>,
    norm: candle_nn::RmsNorm,
    head: candle_nn::Linear,
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
}

impl PlainLm {
    pub fn new(cfg: Config, vb: VarBuilder) -> candle_core::Result<Self> {
        let (dim, hidden) = (cfg.dim, cfg.hidden);
        let embed = candle_nn::embedding(cfg.vocab, dim, vb.pp("embed"))?;
        let lin = |i, o, p: &str, vb: &VarBuilder| candle_nn::linear_no_bias(i, o, vb.pp(p));
        let layers = (0..cfg.layers)
            .map(|l| {
                let vb = vb.pp(format!("layers.{l}"));
                Ok(PlainLayer {
                    rms1: candle_nn::rms_norm(dim, cfg.rms_eps, vb.pp("rms1"))?,
                    q: lin(dim, dim, "q", &vb)?,
                    k: lin(dim, dim, "k", &vb)?,
                    v: lin(dim, dim, "v", &vb)?,
                    o: lin(dim, dim, "o", &vb)?,
                    rms2: candle_nn::rms_norm(dim, cfg.rms_eps, vb.pp("rms2"))?,
                    gate: lin(dim, hidden, "gate", &vb)?,
                    up: lin(dim, hidden, "up", &vb)?,
                    down: lin(hidden, dim, "down", &vb)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let norm = candle_nn::rms_norm(dim, cfg.rms_eps, vb.pp("norm"))?;
        let head = candle_nn::Linear::new(embed.embeddings().clone(), None);
        let (cos, sin, mask) = tables(&cfg, vb.device())?;
        Ok(Self {
            cfg,
            embed,
            layers,
            norm,
            head,
            cos,
            sin,
            mask,
        })
    }

    fn attention(&self, l: &PlainLayer, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (h, hd) = (self.cfg.heads, self.cfg.head_dim());
        let split = |y: Tensor| y.reshape((b, t, h, hd))?.transpose(1, 2)?.contiguous();
        // The differentiable forms: candle-nn's fused rope and softmax_last_dim
        // have no backward.
        let q = candle_nn::rotary_emb::rope_slow(&split(l.q.forward(x)?)?, &self.cos, &self.sin)?;
        let k = candle_nn::rotary_emb::rope_slow(&split(l.k.forward(x)?)?, &self.cos, &self.sin)?;
        let v = split(l.v.forward(x)?)?;
        let att = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let mask = self.mask.broadcast_as(att.shape())?;
        let on_true = Tensor::new(f32::NEG_INFINITY, att.device())?.broadcast_as(mask.shape())?;
        let att = candle_nn::ops::softmax(&mask.where_cond(&on_true, &att)?, D::Minus1)?;
        let y = att
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, self.cfg.dim))?;
        l.o.forward(&y)
    }

    /// Logits `(batch, seq, vocab)` of token ids `(batch, seq)`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = self.embed.forward(ids)?;
        for l in &self.layers {
            x = (&x + self.attention(l, &l.rms1.forward_diff(&x)?)?)?;
            let h = l.rms2.forward_diff(&x)?;
            let m = l
                .down
                .forward(&(candle_nn::ops::silu(&l.gate.forward(&h)?)? * l.up.forward(&h)?)?)?;
            x = (&x + m)?;
        }
        self.head.forward(&self.norm.forward_diff(&x)?)
    }
}
