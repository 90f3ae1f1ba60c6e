//! [`Activation`]'s forward (candle-nn's formulas) and [`Dropout`].

use super::{ops, Activation, Module, ModuleT};
use crate::error::Result;
use crate::tensor::RTensor;

impl Module for Activation {
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        match *self {
            Activation::Gelu => xs.gelu_erf(),
            Activation::NewGelu | Activation::GeluPytorchTanh => xs.gelu(),
            Activation::Relu => xs.relu(),
            Activation::Relu2 => xs.relu()?.sqr(),
            Activation::Relu6 => xs.clamp(0., 6.),
            Activation::Silu => xs.silu(),
            Activation::Sigmoid => xs.sigmoid(),
            Activation::HardSigmoid => ops::hard_sigmoid(xs),
            Activation::Swiglu => ops::swiglu(xs),
            Activation::Swish => xs * xs.sigmoid()?,
            Activation::HardSwish => xs * ops::hard_sigmoid(xs)?,
            Activation::Mish => ops::mish(xs),
            Activation::Elu(alpha) => xs.elu(alpha),
            Activation::LeakyRelu(slope) => ops::leaky_relu(xs, slope),
        }
    }
}

/// Dropout with probability `p` in training, the identity otherwise
/// (candle-nn's `Dropout`, a [`ModuleT`]). Each training call draws a recorded
/// seed (see [`RTensor::dropout`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Drop probability.
    pub p: f32,
}

impl Dropout {
    /// Dropout with probability `p` (checked when applied: `[0, 1)`).
    pub fn new(p: f32) -> Self {
        Self { p }
    }

    /// candle-nn's `Dropout::forward(xs, train)`.
    pub fn forward(&self, xs: &RTensor, train: bool) -> Result<RTensor> {
        if train {
            xs.dropout(self.p)
        } else {
            Ok(xs.clone())
        }
    }
}

impl ModuleT for Dropout {
    fn forward_t(&self, xs: &RTensor, train: bool) -> Result<RTensor> {
        self.forward(xs, train)
    }
}
