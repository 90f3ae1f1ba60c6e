//! candle-transformers' `models::with_tracing` layers under their names and
//! signatures (its models import `linear`, `linear_no_bias`, `Linear`,
//! `RmsNorm`, `LayerNorm`, `layer_norm`, `Embedding`, `conv2d` from there):
//! `RmsNorm::new(size, eps, vb)` and `Embedding::new(n, hidden, vb)` build from a
//! builder, `Linear::from_weights` and `Embedding::from_weights` wrap a tensor,
//! `LayerNorm::new(weight, bias, eps)` and `layer_norm(size, config, vb)` are
//! candle-nn's. No tracing spans. (`QMatMul`, over quantized tensors, is not
//! here: quantized tensors have no backward.)

pub use super::{conv2d, layer_norm, linear, linear_b, linear_no_bias, Conv2d, LayerNorm, Linear};

use super::{Module, VarBuilder};
use crate::error::Result;
use crate::tensor::RTensor;

/// RMS normalization built from a builder (`with_tracing::RmsNorm`).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    inner: super::RmsNorm,
}

impl RmsNorm {
    /// candle-nn's `rms_norm(size, eps, vb)`.
    pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            inner: super::rms_norm(size, eps, vb)?,
        })
    }
    /// The same as `forward` (candle-nn's name for the differentiable path).
    pub fn forward_diff(&self, x: &RTensor) -> Result<RTensor> {
        self.inner.forward(x)
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        self.inner.forward(x)
    }
}

/// An embedding table built from a builder (`with_tracing::Embedding`).
#[derive(Debug, Clone)]
pub struct Embedding {
    inner: super::Embedding,
}

impl Embedding {
    /// candle-nn's `embedding(n, hidden, vb)`.
    pub fn new(n: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            inner: super::embedding(n, hidden, vb)?,
        })
    }
    /// A layer over the table `weights`, `(n, hidden)` (shared, not copied).
    pub fn from_weights(weights: RTensor) -> Result<Self> {
        let (_n, hidden) = weights.dims2()?;
        Ok(Self {
            inner: super::Embedding::new(weights, hidden),
        })
    }
    /// The table, `(n, hidden)`.
    pub fn embeddings(&self) -> &RTensor {
        self.inner.embeddings()
    }
}

impl Module for Embedding {
    fn forward(&self, ids: &RTensor) -> Result<RTensor> {
        self.inner.forward(ids)
    }
}
