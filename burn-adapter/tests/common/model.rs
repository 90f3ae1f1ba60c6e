//! A small burn-nn model shared by the tests, the demo and the bench: token
//! embedding, blocks of multi-head self-attention + LayerNorm + Conv2d + Linear
//! feed-forward, mean pooling and a Linear head, trained with Adam on a
//! deterministic synthetic task. Nothing here knows about DTR.

#![allow(dead_code)]

use burn_core as burn;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{
    Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig, PaddingConfig2d,
};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};

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

    /// The demo / bench size.
    pub fn demo() -> Self {
        Self {
            batch: 16,
            seq: 64,
            d_model: 64,
            heads: 4,
            vocab: 200,
            classes: 10,
            channels: 8,
            blocks: 8,
        }
    }
}

#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    attn: MultiHeadAttention<B>,
    norm1: LayerNorm<B>,
    conv: Conv2d<B>,
    ff1: Linear<B>,
    ff2: Linear<B>,
    norm2: LayerNorm<B>,
}

impl<B: Backend> Block<B> {
    fn new(d: &Dims, device: &B::Device) -> Self {
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

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
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
pub struct TinyNet<B: Backend> {
    embed: Embedding<B>,
    blocks: Vec<Block<B>>,
    head: Linear<B>,
}

impl<B: Backend> TinyNet<B> {
    pub fn new(d: &Dims, device: &B::Device) -> Self {
        Self {
            embed: EmbeddingConfig::new(d.vocab, d.d_model).init(device),
            blocks: (0..d.blocks).map(|_| Block::new(d, device)).collect(),
            head: LinearConfig::new(d.d_model, d.classes).init(device),
        }
    }

    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let mut x = self.embed.forward(tokens);
        for b in &self.blocks {
            x = b.forward(x);
        }
        self.head.forward(x.mean_dim(1).squeeze_dim(1))
    }
}

/// A deterministic batch (an LCG; the label is a function of the tokens).
pub fn batch<B: Backend>(
    d: &Dims,
    step: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 1, Int>) {
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

/// Bits of every float parameter, and of its gradient when `grads` is given.
struct Collect<'a, B: AutodiffBackend> {
    grads: Option<&'a B::Gradients>,
    out: Vec<Vec<u32>>,
}

fn bits(data: TensorData) -> Vec<u32> {
    data.to_vec::<f32>()
        .expect("f32 data")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        match self.grads {
            Some(g) => {
                if let Some(grad) = t.grad(g) {
                    self.out.push(bits(grad.into_data()));
                }
            }
            None => self.out.push(bits(t.into_data())),
        }
    }
}

/// Bits of every parameter of `model`.
pub fn param_bits<B: AutodiffBackend>(model: &TinyNet<B>) -> Vec<Vec<u32>> {
    let mut c = Collect::<B> {
        grads: None,
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

/// What one training run produced, bit for bit.
#[derive(Debug, Default, PartialEq)]
pub struct Trace {
    /// Loss of each step.
    pub losses: Vec<u32>,
    /// Gradient bits of every parameter, per step.
    pub grads: Vec<Vec<Vec<u32>>>,
    /// Parameter bits after the last step.
    pub params: Vec<Vec<u32>>,
}

/// Adam with burn-optim's defaults, the optimizer every run uses.
pub fn adam<B: AutodiffBackend>() -> impl Optimizer<TinyNet<B>, B> {
    AdamConfig::new().init::<B, TinyNet<B>>()
}

/// Train `model` for `steps` steps of `optim`; record losses (and gradients
/// when `record_grads`). The DTR runs wrap Adam in `remat_burn::Sealing`, which
/// seals their device after each step; the training loop is the same.
pub fn train<B: AutodiffBackend, O: Optimizer<TinyNet<B>, B>>(
    model: TinyNet<B>,
    d: &Dims,
    steps: usize,
    record_grads: bool,
    device: &B::Device,
    optim: O,
) -> Trace {
    train_batches(model, d, steps, record_grads, device, optim, |_| d.batch)
}

/// [`train`] with the batch size of each step given by `batch_of(step)` (a
/// shape that changes between steps).
pub fn train_batches<B: AutodiffBackend, O: Optimizer<TinyNet<B>, B>>(
    mut model: TinyNet<B>,
    d: &Dims,
    steps: usize,
    record_grads: bool,
    device: &B::Device,
    mut optim: O,
    batch_of: impl Fn(usize) -> usize,
) -> Trace {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut trace = Trace::default();
    for step in 0..steps {
        let dims = Dims {
            batch: batch_of(step),
            ..*d
        };
        let (tokens, labels) = batch::<B>(&dims, step, device);
        let logits = model.forward(tokens);
        let loss = loss_fn.forward(logits, labels);
        let loss_bits = bits(loss.clone().into_data());
        trace.losses.extend(loss_bits);
        let grads = loss.backward();
        if record_grads {
            let mut c = Collect::<B> {
                grads: Some(&grads),
                out: Vec::new(),
            };
            model.visit(&mut c);
            trace.grads.push(c.out);
        }
        let grads = GradientsParams::from_grads(grads, &model);
        model = optim.step(1e-3, model, grads);
    }
    trace.params = param_bits(&model);
    trace
}
