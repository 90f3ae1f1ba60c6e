//! [`Sealing`]: an optimizer wrapper that seals the DTR device after every step
//! (feature `optim`, on by default).
//!
//! Burn's optimizers are functional: a step computes new parameters (and new
//! optimizer state) from the old ones. Under DTR that lineage would stay
//! recorded, and the uploads it reads resident, for the whole run, unless the
//! device is sealed between steps ([`DtrDevice::seal`]). `Sealing` does that
//! inside `Optimizer::step`, so a training loop, or burn-train's `Learner`, that
//! only sees the optimizer needs no other change:
//!
//! ```no_run
//! # use burn_optim::{AdamConfig, Optimizer};
//! # fn wrap<M, B>(device: &remat_burn::DtrDevice<burn_ndarray::NdArray>)
//! # where M: burn_core::module::AutodiffModule<B>, B: burn_core::tensor::backend::AutodiffBackend {
//! let optim = remat_burn::Sealing::new(AdamConfig::new().init::<B, M>(), device);
//! # let _ = optim; }
//! ```
//!
//! After the seal, `Sealing` ends the runtime's iteration
//! ([`DtrDevice::end_iteration`]): each step is recorded, and once steps repeat
//! each one follows a plan made from the step before (plan-ahead DTR, see
//! `remat_dtr::planner`); `DtrDevice::stats().last_iteration` says whether the
//! last step did.
//!
//! A seal that fails (for instance with an impossible budget while an evicted
//! live tensor is regenerated) is kept like any op error: the next sync returns
//! it, and [`DtrDevice::take_error`] gives the typed error. What was sealed stays
//! sealed, and the device keeps working. The iteration is then not ended:
//! a live tensor the seal could not make a root may still be evicted, and
//! after a boundary reading it would be a `StaleValue` error. The step's calls
//! stay in the runtime's iteration, which the next step's boundary ends. A
//! failed call makes that recording unusable (`PlanStatus::CallFailed`): no
//! plan is made from it, the step after it runs online and is recorded, and
//! plans follow again from there.

use burn_core::module::AutodiffModule;
use burn_core::tensor::backend::AutodiffBackend;
use burn_ir::BackendIr;
use burn_optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};

use crate::device::DtrDevice;

/// An optimizer that seals `device` after each step (see the module doc).
#[derive(Clone)]
pub struct Sealing<O, BI: BackendIr> {
    inner: O,
    device: DtrDevice<BI>,
    seals: u64,
}

impl<O, BI: BackendIr> Sealing<O, BI> {
    /// Wrap `inner`; every step then ends with `device.seal()`.
    pub fn new(inner: O, device: &DtrDevice<BI>) -> Self {
        Self {
            inner,
            device: device.clone(),
            seals: 0,
        }
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// Seals done (one per step; a failed seal counts too).
    pub fn seals(&self) -> u64 {
        self.seals
    }

    fn seal(&mut self) {
        self.seals += 1;
        // `step` has no error channel: a failure is kept for the next sync and
        // `take_error` (see the module doc). The step's end is the runtime's
        // iteration boundary: once steps repeat, each follows a plan made from
        // the one before.
        let ended = self.device.seal().and_then(|_| self.device.end_iteration());
        if let Err(e) = ended {
            self.device.report(e);
        }
    }
}

impl<O, BI: BackendIr> std::fmt::Debug for Sealing<O, BI> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealing")
            .field("device", &self.device)
            .field("seals", &self.seals)
            .finish_non_exhaustive()
    }
}

impl<M, B, O, BI> Optimizer<M, B> for Sealing<O, BI>
where
    M: AutodiffModule<B>,
    B: AutodiffBackend,
    O: Optimizer<M, B>,
    BI: BackendIr,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        let module = self.inner.step(lr, module, grads);
        self.seal();
        module
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        let module = self.inner.step_multi(lr, module, grads);
        self.seal();
        module
    }

    fn to_record(&self) -> Self::Record {
        self.inner.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            inner: self.inner.load_record(record),
            ..self
        }
    }
}
