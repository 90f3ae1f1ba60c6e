//! Multi-head self-attention and its causal mask.

use candle_core::{DType, Tensor};

use super::{linear, Linear, Module, VarBuilder};
use crate::error::{Error, Result};
use crate::tensor::RTensor;

/// Multi-head self-attention: `softmax(q kᵀ / √d + mask) v` over `heads` heads,
/// with input, key, value and output projections.
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
    head_dim: usize,
}

impl MultiHeadAttention {
    /// Projections `q`, `k`, `v`, `o` of `dim × dim` under `vb`.
    pub fn new(dim: usize, heads: usize, vb: VarBuilder) -> Result<Self> {
        if heads == 0 || dim % heads != 0 {
            return Err(Error::Unsupported {
                op: "attention",
                message: format!("{dim} is not divisible into {heads} heads"),
            }
            .into());
        }
        Ok(Self {
            q: linear(dim, dim, vb.pp("q"))?,
            k: linear(dim, dim, vb.pp("k"))?,
            v: linear(dim, dim, vb.pp("v"))?,
            o: linear(dim, dim, vb.pp("o"))?,
            heads,
            head_dim: dim / heads,
        })
    }

    /// Attention over `x: (b, t, dim)` with an optional additive `mask: (t, t)`.
    pub fn forward_masked(&self, x: &RTensor, mask: Option<&RTensor>) -> Result<RTensor> {
        let (b, t, dim) = match *x.dims() {
            [b, t, d] => (b, t, d),
            _ => {
                return Err(Error::Unsupported {
                    op: "attention",
                    message: format!("input of shape {:?} (expected (b, t, dim))", x.dims()),
                }
                .into())
            }
        };
        let split = |y: RTensor| -> Result<RTensor> {
            y.reshape((b, t, self.heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.q.forward(x)?)?;
        let k = split(self.k.forward(x)?)?;
        let v = split(self.v.forward(x)?)?;
        let scale = 1f64 / (self.head_dim as f64).sqrt();
        let att = (q.matmul(&k.t()?)? * scale)?;
        let att = match mask {
            Some(m) => att.broadcast_add(m)?,
            None => att,
        };
        let att = att.softmax_last_dim()?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, dim))?;
        self.o.forward(&y)
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        self.forward_masked(x, None)
    }
}

/// A causal mask `(t, t)`: 0 on and below the diagonal, −∞ above (plain tensor;
/// bring it in with [`Remat::input`](crate::Remat::input)).
pub fn causal_mask(t: usize, dtype: DType, device: &candle_core::Device) -> Result<Tensor> {
    let v: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(v, (t, t), device)?.to_dtype(dtype)
}
