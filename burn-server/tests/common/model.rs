//! A small model written against stock `burn` 0.22 (no backend generic):
//! token embedding, blocks of multi-head self-attention + LayerNorm + Conv2d +
//! Linear feed-forward, mean pooling and a Linear head, trained with Adam on a
//! deterministic synthetic task. Nothing here knows about remat, except the
//! `after_step` hook the training loop calls after each optimizer step.

#![allow(dead_code)]

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{
    Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig, PaddingConfig2d,
};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};

/// Sizes of the model and of one batch.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub batch: usize,
    pub seq: usize,
    pub d_model: usize,
    pub heads: usize,
    pub vocab: usize,
    pub classes: usize,
    pub channels: usize,
    pub blocks: usize,
}

impl Dims {
    /// Small enough for debug-build tests.
    pub fn tiny() -> Self {
        Self {
            batch: 8,
            seq: 16,
            d_model: 16,
            heads: 2,
            vocab: 50,
            classes: 5,
            channels: 8,
            blocks: 4,
        }
    }
}

#[derive(Module, Debug)]
pub struct Block {
    attn: MultiHeadAttention,
    norm1: LayerNorm,
    conv: Conv2d,
    ff1: Linear,
    ff2: Linear,
    norm2: LayerNorm,
}

impl Block {
    fn new(d: &Dims, device: &Device) -> Self {
        Self {
            attn: MultiHeadAttentionConfig::new(d.d_model, d.heads)
                .with_dropout(0.0)
                .init(device),
            norm1: LayerNormConfig::new(d.d_model).init(device),
            conv: Conv2dConfig::new([1, d.channels], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            ff1: LinearConfig::new(d.d_model, 2 * d.d_model).init(device),
            ff2: LinearConfig::new(2 * d.d_model, d.d_model).init(device),
            norm2: LayerNormConfig::new(d.d_model).init(device),
        }
    }

    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let a = self.attn.forward(MhaInput::self_attn(x.clone())).context;
        let x = self.norm1.forward(x + a);
        // The sequence as a one-channel image: [b, 1, s, d] → [b, c, s, d] → mean.
        let img = self.conv.forward(x.clone().unsqueeze_dim(1));
        let c = burn::tensor::activation::relu(img)
            .mean_dim(1)
            .squeeze_dim(1);
        let h = burn::tensor::activation::gelu(self.ff1.forward(x.clone() + c));
        self.norm2.forward(x + self.ff2.forward(h))
    }
}

#[derive(Module, Debug)]
pub struct TinyNet {
    embed: Embedding,
    blocks: Vec<Block>,
    head: Linear,
}

impl TinyNet {
    pub fn new(d: &Dims, device: &Device) -> Self {
        Self {
            embed: EmbeddingConfig::new(d.vocab, d.d_model).init(device),
            blocks: (0..d.blocks).map(|_| Block::new(d, device)).collect(),
            head: LinearConfig::new(d.d_model, d.classes).init(device),
        }
    }

    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<2> {
        let mut x = self.embed.forward(tokens);
        for b in &self.blocks {
            x = b.forward(x);
        }
        self.head.forward(x.mean_dim(1).squeeze_dim(1))
    }
}

/// A deterministic batch (an LCG; the label is a function of the tokens).
pub fn batch(d: &Dims, step: usize, device: &Device) -> (Tensor<2, Int>, Tensor<1, Int>) {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (s >> 33) as i64
    };
    let mut tokens = Vec::with_capacity(d.batch * d.seq);
    let mut labels = Vec::with_capacity(d.batch);
    for _ in 0..d.batch {
        let row: Vec<i64> = (0..d.seq).map(|_| next() % d.vocab as i64).collect();
        labels.push(row.iter().take(3).sum::<i64>() % d.classes as i64);
        tokens.extend(row);
    }
    let tokens = Tensor::from_data(TensorData::new(tokens, [d.batch, d.seq]), device);
    let labels = Tensor::from_data(TensorData::new(labels, [d.batch]), device);
    (tokens, labels)
}

pub fn bits(data: TensorData) -> Vec<u32> {
    data.try_to_vec::<f32>()
        .expect("f32 data")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// Bits of every float parameter.
struct Collect {
    out: Vec<Vec<u32>>,
}

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.out.push(bits(param.val().into_data()));
    }
}

/// Bits of every parameter of `model`.
pub fn param_bits(model: &TinyNet) -> Vec<Vec<u32>> {
    let mut c = Collect { out: Vec::new() };
    model.visit(&mut c);
    c.out
}

/// What one training run produced, bit for bit.
#[derive(Debug, Default, PartialEq)]
pub struct Trace {
    /// Loss of each step.
    pub losses: Vec<u32>,
    /// Parameter bits after the last step.
    pub params: Vec<Vec<u32>>,
}

/// Train `model` on `device` (an autodiff device) for `steps` steps of Adam
/// (burn-optim's defaults); `after_step` runs after each optimizer step.
pub fn train(
    mut model: TinyNet,
    d: &Dims,
    steps: usize,
    device: &Device,
    after_step: impl Fn(),
) -> Trace {
    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut trace = Trace::default();
    for step in 0..steps {
        let (tokens, labels) = batch(d, step, device);
        let logits = model.forward(tokens);
        let loss = loss_fn.forward(logits, labels);
        trace.losses.extend(bits(loss.clone().into_data()));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        after_step();
    }
    trace.params = param_bits(&model);
    trace
}
