//! candle-nn's `ops` under the same names, over [`RTensor`]s. Fused candle-nn
//! kernels without a CPU backward (`softmax_last_dim`, `rms_norm`, `layer_norm`)
//! are their differentiable compositions here (`softmax`, `rms_norm_slow`,
//! `layer_norm_slow`): the same values, and a gradient.

use candle_core::shape::Dim;
use candle_core::D;

use super::norm::normalize;
use crate::error::Result;
use crate::tensor::RTensor;

/// Softmax over `dim` (candle-nn's composition).
pub fn softmax<T: Dim>(xs: &RTensor, dim: T) -> Result<RTensor> {
    xs.softmax(dim)
}
/// Softmax over the last dimension (candle-nn's `softmax(xs, D::Minus1)`; its
/// fused `softmax_last_dim` has no CPU backward).
pub fn softmax_last_dim(xs: &RTensor) -> Result<RTensor> {
    xs.softmax(D::Minus1)
}
/// Log-softmax over `d` (candle-nn's composition).
pub fn log_softmax<T: Dim>(xs: &RTensor, d: T) -> Result<RTensor> {
    xs.log_softmax(d)
}
/// SiLU.
pub fn silu(xs: &RTensor) -> Result<RTensor> {
    xs.silu()
}
/// `silu(a) * b` of the two halves of the last dimension.
pub fn swiglu(xs: &RTensor) -> Result<RTensor> {
    let xs = xs.chunk(2, D::Minus1)?;
    &xs[0].silu()? * &xs[1]
}
/// Logistic sigmoid (candle-nn's op and its backward).
pub fn sigmoid(xs: &RTensor) -> Result<RTensor> {
    xs.sigmoid()
}
/// Dropout with probability `p` (a recorded seed, see [`RTensor::dropout`]).
pub fn dropout(xs: &RTensor, p: f32) -> Result<RTensor> {
    xs.dropout(p)
}
/// candle-nn's `hard_sigmoid`: `clamp((x + 3) / 6, 0, 1)`.
pub fn hard_sigmoid(xs: &RTensor) -> Result<RTensor> {
    ((xs + 3.0)? / 6.0)?.clamp(0., 1.)
}
/// candle-nn's `mish`: `x · tanh(ln(1 + eˣ))`.
pub fn mish(xs: &RTensor) -> Result<RTensor> {
    xs * (1.0 + xs.exp()?)?.log()?.tanh()?
}
/// candle-nn's `leaky_relu`: `max(x, 0) + min(x, 0) · slope`.
pub fn leaky_relu(xs: &RTensor, negative_slope: f64) -> Result<RTensor> {
    let zeros = xs.zeros_like()?;
    xs.maximum(&zeros)? + (xs.minimum(&zeros)? * negative_slope)?
}
/// RMS normalization of the last dimension scaled by `alpha` (candle-nn's
/// `rms_norm_slow`, the differentiable form of its fused `rms_norm`).
pub fn rms_norm(x: &RTensor, alpha: &RTensor, eps: f32) -> Result<RTensor> {
    normalize(x, false, eps as f64)?.broadcast_mul(alpha)
}
/// Layer normalization of the last dimension (candle-nn's `layer_norm_slow`,
/// the differentiable form of its fused `layer_norm`).
pub fn layer_norm(x: &RTensor, alpha: &RTensor, beta: &RTensor, eps: f32) -> Result<RTensor> {
    normalize(x, true, eps as f64)?
        .broadcast_mul(alpha)?
        .broadcast_add(beta)
}
