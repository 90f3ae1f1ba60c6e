//! The fully connected layer (candle-nn's `Linear`) and its builders.

use super::{Module, VarBuilder};
use crate::context::Remat;
use crate::error::Result;
use crate::tensor::RTensor;

/// A fully connected layer, `x Wᵀ + b` (candle-nn's `Linear`).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: RTensor,
    bias: Option<RTensor>,
}

impl Linear {
    /// A layer over `weight: (out, in)` and an optional `bias: (out,)`
    /// (candle-nn's `Linear::new`). Give the embedding table itself to tie an
    /// output layer to it: one storage, counted once.
    pub fn new(weight: RTensor, bias: Option<RTensor>) -> Self {
        Self { weight, bias }
    }
    /// The same as [`Linear::new`] (candle-transformers' `with_tracing` name).
    pub fn from_weights(weight: RTensor, bias: Option<RTensor>) -> Self {
        Self::new(weight, bias)
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, l: &candle_nn::Linear) -> Result<Self> {
        Ok(Self {
            weight: remat.input(l.weight())?,
            bias: l.bias().map(|b| remat.input(b)).transpose()?,
        })
    }
    /// The weight, `(out, in)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The bias, `(out,)`.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
}

impl Module for Linear {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let x = match *x.dims() {
            [b1, b2, m, k] => {
                if x.is_contiguous() {
                    let w = self.weight.t()?;
                    x.reshape((b1 * b2 * m, k))?
                        .matmul(&w)?
                        .reshape((b1, b2, m, ()))?
                } else {
                    let w = self.weight.broadcast_left((b1, b2))?.t()?;
                    x.matmul(&w)?
                }
            }
            [bsize, m, k] => {
                if x.is_contiguous() {
                    let w = self.weight.t()?;
                    x.reshape((bsize * m, k))?
                        .matmul(&w)?
                        .reshape((bsize, m, ()))?
                } else {
                    let w = self.weight.broadcast_left(bsize)?.t()?;
                    x.matmul(&w)?
                }
            }
            _ => {
                let w = self.weight.t()?;
                x.matmul(&w)?
            }
        };
        match &self.bias {
            None => Ok(x),
            Some(bias) => x.broadcast_add(bias),
        }
    }
}

/// candle-nn's `linear` (with bias) over `vb`.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    Linear::from_candle(
        &vb.remat()?,
        &candle_nn::linear(in_dim, out_dim, vb.candle().clone())?,
    )
}

/// candle-nn's `linear_b`: with a bias when `bias`.
pub fn linear_b(in_dim: usize, out_dim: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    Linear::from_candle(
        &vb.remat()?,
        &candle_nn::linear_b(in_dim, out_dim, bias, vb.candle().clone())?,
    )
}

/// candle-nn's `linear_no_bias` over `vb`.
pub fn linear_no_bias(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    Linear::from_candle(
        &vb.remat()?,
        &candle_nn::linear_no_bias(in_dim, out_dim, vb.candle().clone())?,
    )
}
