//! candle-nn's optimizers stepping from an [`RTensor`] loss.

use crate::error::Result;
use crate::tensor::RTensor;

/// A candle-nn optimizer stepping from an [`RTensor`] loss: candle-nn's
/// `Optimizer` under the same name, implemented for every candle-nn optimizer
/// (`AdamW`, `SGD`), with `backward_step` taking the adapter's loss. Import it
/// instead of candle-nn's.
pub trait Optimizer: Sized {
    /// The optimizer's settings (`ParamsAdamW`, `f64` for SGD).
    type Config: Sized;
    /// An optimizer over `vars`.
    fn new(vars: Vec<candle_core::Var>, config: Self::Config) -> Result<Self>;
    /// One step from the gradients.
    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()>;
    /// The learning rate.
    fn learning_rate(&self) -> f64;
    /// Set the learning rate.
    fn set_learning_rate(&mut self, lr: f64);
    /// One training step from the adapter's loss: `loss.backward()`, the loss
    /// made resident, [`Optimizer::step`], then [`Remat::end_iteration`](crate::Remat::end_iteration).
    ///
    /// Ending the iteration is what keeps a value read after the step honest:
    /// the step changes the parameters in place, so a value evicted before it
    /// could otherwise be recomputed from the new weights. The loss is resident
    /// when this returns (reading it gives this step's value, as in candle's
    /// `backward_step` then `loss.to_vec0()`), and any value the step left
    /// evicted reads as a typed `StaleValue` error, never as a recomputation.
    /// Under a budget, the step's activations that only the loss's graph still
    /// holds (no tensor of the user's refers to them) are evicted before the
    /// iteration ends: a loop that keeps the loss through an evaluation (as
    /// candle's mnist-training does) then does not keep the step's activations
    /// resident with it.
    /// Do not call `end_iteration` again for this step.
    fn backward_step(&mut self, loss: &RTensor) -> Result<()> {
        let grads = loss.backward()?;
        drop(loss.pinned()?);
        self.step(&grads)?;
        loss.remat().end_iteration_after_backward()?;
        Ok(())
    }
}

impl<O: candle_nn::Optimizer> Optimizer for O {
    type Config = O::Config;
    fn new(vars: Vec<candle_core::Var>, config: Self::Config) -> Result<Self> {
        <O as candle_nn::Optimizer>::new(vars, config)
    }
    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()> {
        <O as candle_nn::Optimizer>::step(self, grads)
    }
    fn learning_rate(&self) -> f64 {
        <O as candle_nn::Optimizer>::learning_rate(self)
    }
    fn set_learning_rate(&mut self, lr: f64) {
        <O as candle_nn::Optimizer>::set_learning_rate(self, lr)
    }
}
