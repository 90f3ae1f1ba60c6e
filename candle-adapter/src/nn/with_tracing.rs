//! candle-transformers' `models::with_tracing` layers under their names and
//! signatures (its models import `linear`, `linear_no_bias`, `Linear`, `RmsNorm`
//! from there): `RmsNorm::new(size, eps, vb)` builds from a builder, and
//! `Linear::from_weights` ties a layer to a tensor. No tracing spans.

pub use super::{linear, linear_b, linear_no_bias, Linear};

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
