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
    ///
    /// candle-nn's optimizers read and write each `Var` in place, outside
    /// remat. With swap on ([`RematConfig::with_swap`](crate::RematConfig::with_swap))
    /// a parameter may be in the host tier, its candle storage empty, so the
    /// step first makes every parameter with a gradient in `grads` resident in
    /// the thread's current context and keeps it so until the update is done
    /// ([`Remat::pin_params_for`](crate::Remat::pin_params_for)); they must fit
    /// the budget together. Without swap nothing is pinned. Calling candle-nn's
    /// `Optimizer::step` directly skips this: pin the parameters first.
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
    ///
    /// With swap on, the parameters the step updates are made resident (and
    /// kept so) for the update: see [`Optimizer::step`].
    fn backward_step(&mut self, loss: &RTensor) -> Result<()> {
        let grads = loss.backward()?;
        drop(loss.pinned()?);
        let params = loss.remat().pin_params_for(&grads)?;
        self.step(&grads)?;
        drop(params);
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
        let params = match crate::Remat::current() {
            Ok(remat) => Some(remat.pin_params_for(grads)?),
            Err(_) => None,
        };
        <O as candle_nn::Optimizer>::step(self, grads)?;
        drop(params);
        Ok(())
    }
    fn learning_rate(&self) -> f64 {
        <O as candle_nn::Optimizer>::learning_rate(self)
    }
    fn set_learning_rate(&mut self, lr: f64) {
        <O as candle_nn::Optimizer>::set_learning_rate(self, lr)
    }
}
