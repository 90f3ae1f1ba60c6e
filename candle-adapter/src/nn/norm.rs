//! Normalization layers: layer, RMS and batch normalization (candle-nn's
//! `LayerNorm`, `RmsNorm`, `BatchNorm`) and their builders.

use candle_core::{DType, D};

use super::{BatchNormConfig, LayerNormConfig, Module, VarBuilder};
use crate::context::Remat;
use crate::error::{Error, Result};
use crate::tensor::RTensor;

/// Layer normalization over the last dimension (candle-nn's `LayerNorm`): the
/// composition of candle-nn's `LayerNorm::forward` (its non-fused path, which
/// has a gradient; the fused kernel has none), with or without bias, and
/// without the mean for RMS normalization.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: RTensor,
    bias: Option<RTensor>,
    remove_mean: bool,
    eps: f64,
}

impl LayerNorm {
    /// With weight and bias (candle-nn's `LayerNorm::new`).
    pub fn new(weight: RTensor, bias: RTensor, eps: f64) -> Self {
        Self {
            weight,
            bias: Some(bias),
            remove_mean: true,
            eps,
        }
    }
    /// Without bias (candle-nn's `LayerNorm::new_no_bias`).
    pub fn new_no_bias(weight: RTensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            remove_mean: true,
            eps,
        }
    }
    /// RMS normalization: no mean, no bias (candle-nn's `LayerNorm::rms_norm`).
    pub fn rms_norm(weight: RTensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            remove_mean: false,
            eps,
        }
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, ln: &candle_nn::LayerNorm) -> Result<Self> {
        Ok(Self {
            weight: remat.input(ln.weight())?,
            bias: ln.bias().map(|b| remat.input(b)).transpose()?,
            remove_mean: ln.remove_mean(),
            eps: ln.eps(),
        })
    }
    /// The scale, `(size,)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The shift, `(size,)`, when there is one.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
}

/// candle-nn's normalization of the last dimension, shared by its layers and
/// [`ops`](super::ops): in F32 for half types, centred when `remove_mean`,
/// divided by `√(mean square + eps)`, back in `x`'s dtype (the scale and shift
/// are the caller's).
pub(super) fn normalize(x: &RTensor, remove_mean: bool, eps: f64) -> Result<RTensor> {
    let x_dtype = x.dtype();
    let internal_dtype = match x_dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    };
    let hidden_size = x.dim(D::Minus1)?;
    let x = x.to_dtype(internal_dtype)?;
    let x = if remove_mean {
        let mean_x = (x.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
        x.broadcast_sub(&mean_x)?
    } else {
        x
    };
    let norm_x = (x.sqr()?.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
    let x_normed = x.broadcast_div(&(norm_x + eps)?.sqrt()?)?;
    x_normed.to_dtype(x_dtype)
}

impl Module for LayerNorm {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let x = normalize(x, self.remove_mean, self.eps)?.broadcast_mul(&self.weight)?;
        match &self.bias {
            None => Ok(x),
            Some(bias) => x.broadcast_add(bias),
        }
    }
}

/// candle-nn's `layer_norm` over `vb` (weight 1, bias 0 when `affine`); `config`
/// is a `LayerNormConfig` or an `eps: f64`.
pub fn layer_norm<C: Into<LayerNormConfig>>(
    size: usize,
    config: C,
    vb: VarBuilder,
) -> Result<LayerNorm> {
    LayerNorm::from_candle(
        &vb.remat()?,
        &candle_nn::layer_norm(size, config, vb.candle().clone())?,
    )
}

/// candle-nn's `layer_norm_no_bias` over `vb`.
pub fn layer_norm_no_bias(size: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
    LayerNorm::from_candle(
        &vb.remat()?,
        &candle_nn::layer_norm_no_bias(size, eps, vb.candle().clone())?,
    )
}

/// RMS normalization (candle-nn's `RmsNorm`). Its forward is candle-nn's
/// `RmsNorm::forward_diff` (the differentiable composition): candle-nn's
/// `forward` uses a fused kernel without backward on contiguous input, so a
/// plain-candle reference must call `forward_diff` to train (see docs/candle.md).
#[derive(Debug, Clone)]
pub struct RmsNorm(LayerNorm);

impl RmsNorm {
    /// Over `weight: (size,)` (candle-nn's `RmsNorm::new`).
    pub fn new(weight: RTensor, eps: f64) -> Self {
        Self(LayerNorm::rms_norm(weight, eps))
    }
    /// The layer norm it is.
    pub fn into_inner(self) -> LayerNorm {
        self.0
    }
    /// The scale, `(size,)`.
    pub fn weight(&self) -> &RTensor {
        self.0.weight()
    }
    /// The same as `forward` (candle-nn's name for the differentiable path).
    pub fn forward_diff(&self, xs: &RTensor) -> Result<RTensor> {
        self.0.forward(xs)
    }
}

impl Module for RmsNorm {
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        self.0.forward(xs)
    }
}

/// candle-nn's `rms_norm` over `vb` (weight 1).
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<RmsNorm> {
    let rms = candle_nn::rms_norm(size, eps, vb.candle().clone())?;
    Ok(RmsNorm::new(vb.remat()?.input(rms.weight())?, eps))
}

/// Batch normalization in training mode over dimension 1 (batch statistics, the
/// composition of candle-nn's `BatchNorm::forward_train` without its running
/// statistics, which candle-nn updates in place and a replay could not repeat).
#[derive(Debug, Clone)]
pub struct BatchNorm {
    weight: RTensor,
    bias: RTensor,
    eps: f64,
}

impl Module for BatchNorm {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        if x.rank() < 2 {
            return Err(Error::Unsupported {
                op: "batch_norm",
                message: format!("input of rank {} (at least 2)", x.rank()),
            }
            .into());
        }
        let x_t = x.transpose(0, 1)?;
        let dims_t = x_t.dims().to_vec();
        let x_t = x_t.flatten_from(1)?.contiguous()?;
        let mean_x = x_t.mean_keepdim(1)?;
        let x_t = x_t.broadcast_sub(&mean_x)?;
        let norm_x = x_t.sqr()?.mean_keepdim(1)?;
        let x_t = x_t.broadcast_div(&(norm_x + self.eps)?.sqrt()?)?;
        let c = self.weight.dims()[0];
        let w = self.weight.reshape((c, 1))?;
        let b = self.bias.reshape((c, 1))?;
        let x_t = x_t.broadcast_mul(&w)?.broadcast_add(&b)?;
        x_t.reshape(dims_t)?.transpose(0, 1)
    }
}

/// Batch norm parameters (weight 1, bias 0) over `vb`, as candle-nn's
/// `batch_norm` names them.
/// `config` is candle-nn's `BatchNormConfig` or an `eps: f64`; only its `eps`
/// is used (no running statistics).
pub fn batch_norm<C: Into<BatchNormConfig>>(
    channels: usize,
    config: C,
    vb: VarBuilder,
) -> Result<BatchNorm> {
    Ok(BatchNorm {
        weight: vb.get_with_hints(channels, "weight", candle_nn::Init::Const(1.))?,
        bias: vb.get_with_hints(channels, "bias", candle_nn::Init::Const(0.))?,
        eps: config.into().eps,
    })
}
