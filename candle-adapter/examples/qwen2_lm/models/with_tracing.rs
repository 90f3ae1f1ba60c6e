//! candle-transformers' `models::with_tracing` (0.11.1; MIT OR Apache-2.0, the
//! Candle authors), the four items `qwen2.rs` imports, without tracing spans,
//! for the plain-candle reference. One change: `RmsNorm::forward` calls
//! candle-nn's `forward_diff` (the differentiable composition), because the
//! fused `rms_norm` kernel has no backward in plain candle (docs/candle.md,
//! "Reference losses").
use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

#[derive(Debug, Clone)]
pub struct Linear {
    inner: candle_nn::Linear,
}

impl Linear {
    pub fn from_weights(weights: Tensor, bias: Option<Tensor>) -> Self {
        let inner = candle_nn::Linear::new(weights, bias);
        Self { inner }
    }
}

pub fn linear(d1: usize, d2: usize, vb: VarBuilder) -> Result<Linear> {
    let inner = candle_nn::linear(d1, d2, vb)?;
    Ok(Linear { inner })
}

pub fn linear_no_bias(d1: usize, d2: usize, vb: VarBuilder) -> Result<Linear> {
    let inner = candle_nn::linear_no_bias(d1, d2, vb)?;
    Ok(Linear { inner })
}

impl Module for Linear {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.inner.forward(xs)
    }
}

#[derive(Debug, Clone)]
pub struct RmsNorm {
    inner: candle_nn::RmsNorm,
}

impl RmsNorm {
    pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        let inner = candle_nn::rms_norm(size, eps, vb)?;
        Ok(Self { inner })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Upstream: `self.inner.forward(x)` (the fused kernel, no backward).
        self.inner.forward_diff(x)
    }
}
