//! candle-nn's `rotary_emb` under the same names: `rope` (halves rotated) and
//! `rope_i` (interleaved pairs) on `xs: (b, h, t, d)` with `cos`/`sin: (t', d/2)`
//! (`t' >= t`). They are candle-nn's `rope_slow` / `rope_i_slow` compositions:
//! candle-nn's fused `rope` / `rope_i` are built with `apply_op3_no_bwd`, so no
//! gradient flows through them in plain candle (a plain reference must call the
//! `_slow` forms to train).

use candle_core::D;

use crate::error::{Error, Result};
use crate::tensor::RTensor;

fn check(xs: &RTensor, cos: &RTensor, sin: &RTensor) -> Result<(usize, usize, usize, usize)> {
    let (b, h, t, d) = xs.dims4()?;
    let (ct, cd) = cos.dims2()?;
    let (st, sd) = sin.dims2()?;
    if cd * 2 != d || sd * 2 != d || t > ct || t > st {
        return Err(Error::unsupported(
            "rope",
            format!(
                "inconsistent shapes: xs {:?}, cos {:?}, sin {:?} (expected (t', d/2), t' >= t)",
                xs.dims(),
                cos.dims(),
                sin.dims()
            ),
        ));
    }
    Ok((b, h, t, d))
}

fn rotate_half(xs: &RTensor) -> Result<RTensor> {
    let last_dim = xs.dim(D::Minus1)?;
    let xs1 = xs.narrow(D::Minus1, 0, last_dim / 2)?;
    let xs2 = xs.narrow(D::Minus1, last_dim / 2, last_dim - last_dim / 2)?;
    RTensor::cat(&[&xs2.neg()?, &xs1], D::Minus1)
}

/// Rotary embedding on rotated halves (candle-nn's `rope_slow`).
pub fn rope(xs: &RTensor, cos: &RTensor, sin: &RTensor) -> Result<RTensor> {
    let (_b, _h, seq_len, _d) = check(xs, cos, sin)?;
    let cos = RTensor::cat(&[cos, cos], D::Minus1)?;
    let sin = RTensor::cat(&[sin, sin], D::Minus1)?;
    let cos = cos.narrow(0, 0, seq_len)?;
    let sin = sin.narrow(0, 0, seq_len)?;
    let cos = cos.unsqueeze(0)?.unsqueeze(0)?;
    let sin = sin.unsqueeze(0)?.unsqueeze(0)?;
    xs.broadcast_mul(&cos)? + rotate_half(xs)?.broadcast_mul(&sin)?
}

/// Rotary embedding on interleaved pairs (candle-nn's `rope_i_slow`).
pub fn rope_i(xs: &RTensor, cos: &RTensor, sin: &RTensor) -> Result<RTensor> {
    let (b_sz, n_head, seq_len, n_embd) = check(xs, cos, sin)?;
    let cos = cos
        .narrow(0, 0, seq_len)?
        .reshape((seq_len, n_embd / 2, 1))?;
    let sin = sin
        .narrow(0, 0, seq_len)?
        .reshape((seq_len, n_embd / 2, 1))?;
    let cos = cos.broadcast_as((b_sz, 1, seq_len, n_embd / 2, 1))?;
    let sin = sin.broadcast_as((b_sz, 1, seq_len, n_embd / 2, 1))?;
    let x = xs.reshape((b_sz, n_head, seq_len, n_embd / 2, 2))?;
    let x0 = x.narrow(D::Minus1, 0, 1)?;
    let x1 = x.narrow(D::Minus1, 1, 1)?;
    let y0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
    let y1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
    let rope = RTensor::cat(&[y0, y1], D::Minus1)?;
    rope.flatten_from(D::Minus2)
}
