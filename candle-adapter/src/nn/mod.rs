//! Layers mirroring candle-nn, over [`RTensor`]s: porting a model is mostly a
//! change of imports. Parameters come from a candle-nn `VarBuilder` (so a `VarMap`
//! and candle-nn's optimizers work unchanged) with candle-nn's initializations, and
//! each forward uses the same candle ops in the same order as candle-nn's, so the
//! results equal a plain candle-nn model's bit for bit.
//!
//! Everything is under `nn::` as in candle-nn; the files split it by idea:
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`Module`], [`ModuleT`], candle-nn's re-exported configs and [`Activation`] |
//! | `var_builder.rs` | [`VarBuilder`]: candle-nn's builder carrying the [`Remat`](crate::Remat) context |
//! | `optim.rs` | [`Optimizer`]: candle-nn's optimizers stepping from an [`RTensor`] loss |
//! | `linear.rs` | [`Linear`], [`linear`], [`linear_b`], [`linear_no_bias`] |
//! | `conv.rs` | [`Conv`] over a [`ConvKind`] ([`Conv1d`], [`Conv2d`], [`ConvTranspose2d`]) and their builders |
//! | `norm.rs` | [`LayerNorm`], [`RmsNorm`], [`BatchNorm`] and their builders |
//! | `embedding.rs` | [`Embedding`], [`embedding`] |
//! | `activation.rs` | [`Activation`]'s forward, [`Dropout`] |
//! | `attention.rs` | [`MultiHeadAttention`], [`causal_mask`] |
//! | [`loss`], [`ops`], [`rotary_emb`] | candle-nn's modules of those names |
//! | [`with_tracing`] | candle-transformers' `models::with_tracing` layers |

/// candle-nn's configuration structs, initializers, optimizers and variable
/// map, taken where candle-nn takes them.
pub use candle_nn::{
    init, AdamW, BatchNormConfig, Conv1dConfig, Conv2dConfig, ConvTranspose2dConfig, Init,
    LayerNormConfig, ParamsAdamW, VarMap, SGD,
};

/// candle-nn's `Activation` itself (so configs that deserialize it, such as
/// candle-transformers' `hidden_act`, work unchanged), applied to [`RTensor`]s
/// with candle-nn's formula for every variant: `Gelu` is the erf GELU,
/// `NewGelu` and `GeluPytorchTanh` the tanh approximation.
pub use candle_nn::Activation;

use crate::error::Result;
use crate::tensor::RTensor;

mod activation;
mod attention;
mod conv;
mod embedding;
mod linear;
pub mod loss;
mod norm;
pub mod ops;
mod optim;
pub mod rotary_emb;
mod var_builder;
pub mod with_tracing;

pub use activation::Dropout;
pub use attention::{causal_mask, MultiHeadAttention};
pub use conv::{
    conv1d, conv1d_no_bias, conv2d, conv2d_no_bias, conv_transpose2d, Conv, Conv1d, Conv2d,
    ConvKind, ConvTranspose2d,
};
pub use embedding::{embedding, Embedding};
pub use linear::{linear, linear_b, linear_no_bias, Linear};
pub use norm::{
    batch_norm, layer_norm, layer_norm_no_bias, rms_norm, BatchNorm, LayerNorm, RmsNorm,
};
pub use optim::Optimizer;
pub use var_builder::VarBuilder;

/// A layer: `forward` on rematerializing tensors.
pub trait Module {
    /// Apply the layer.
    fn forward(&self, xs: &RTensor) -> Result<RTensor>;
}

impl<F: Fn(&RTensor) -> Result<RTensor>> Module for F {
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        self(xs)
    }
}

impl<M: Module> Module for Option<&M> {
    /// The identity when `None` (candle-nn's impl).
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        match self {
            None => Ok(xs.clone()),
            Some(m) => m.forward(xs),
        }
    }
}

/// A layer whose forward depends on training (candle-nn's `ModuleT`): dropout,
/// for instance. Every [`Module`] is one, ignoring the flag.
pub trait ModuleT {
    /// Apply the layer, in training mode when `train`.
    fn forward_t(&self, xs: &RTensor, train: bool) -> Result<RTensor>;
}

impl<M: Module> ModuleT for M {
    fn forward_t(&self, xs: &RTensor, _train: bool) -> Result<RTensor> {
        self.forward(xs)
    }
}
