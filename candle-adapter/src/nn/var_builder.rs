//! candle-nn's `VarBuilder` carrying the [`Remat`] context.

use candle_core::DType;

use super::{Init, VarMap};
use crate::context::Remat;
use crate::error::Result;
use crate::tensor::RTensor;

/// candle-nn's `VarBuilder` carrying its [`Remat`] context: the layer builders
/// of this module take it where candle-nn's take theirs (`linear(in, out, vb)`),
/// and [`VarBuilder::get`] returns the variable as an [`RTensor`] of the context
/// (shared with the `Var`, counted once however often it is fetched).
///
/// [`VarBuilder::from_varmap`] has candle-nn's signature and takes the thread's
/// current context ([`Remat::current`]), so a training loop that builds its
/// model with `VarBuilder::from_varmap(&varmap, DType::F32, &dev)` ports
/// unchanged; [`VarBuilder::from_varmap_in`] names the context.
#[derive(Clone)]
pub struct VarBuilder<'a> {
    inner: candle_nn::VarBuilder<'a>,
    /// The context; `None` when none was current at creation (then the one
    /// current when a variable is fetched, or a typed error).
    remat: Option<Remat>,
}

impl<'a> VarBuilder<'a> {
    /// Wrap candle-nn's builder for `remat`.
    pub fn new(remat: &Remat, inner: candle_nn::VarBuilder<'a>) -> Self {
        Self {
            inner,
            remat: Some(remat.clone()),
        }
    }
    /// Variables of `varmap` (created on first use with the builders'
    /// initializations), in the thread's current context: candle-nn's
    /// `VarBuilder::from_varmap`, same signature. The context is the one
    /// current now ([`Remat::current`]: created last on this thread, or made
    /// current); if none is, the one current when a variable is fetched, and a
    /// typed error then if there is still none.
    pub fn from_varmap(varmap: &VarMap, dtype: DType, device: &candle_core::Device) -> Self {
        Self {
            inner: candle_nn::VarBuilder::from_varmap(varmap, dtype, device),
            remat: Remat::current().ok(),
        }
    }
    /// Variables of `varmap` in the context `remat` (see
    /// [`VarBuilder::from_varmap`]).
    pub fn from_varmap_in(
        remat: &Remat,
        varmap: &VarMap,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Self {
        Self::new(
            remat,
            candle_nn::VarBuilder::from_varmap(varmap, dtype, device),
        )
    }
    /// The context (see [`VarBuilder::from_varmap`]); a typed error when the
    /// builder has none and none is current.
    pub fn remat(&self) -> Result<Remat> {
        match &self.remat {
            Some(r) => Ok(r.clone()),
            None => Remat::current(),
        }
    }
    /// candle-nn's builder underneath (for plain candle-nn layers).
    pub fn candle(&self) -> &candle_nn::VarBuilder<'a> {
        &self.inner
    }
    /// The builder under the prefix `s` (candle-nn's `pp`).
    pub fn pp<S: ToString>(&self, s: S) -> Self {
        Self {
            inner: self.inner.pp(s),
            remat: self.remat.clone(),
        }
    }
    /// The same as [`VarBuilder::pp`].
    pub fn push_prefix<S: ToString>(&self, s: S) -> Self {
        self.pp(s)
    }
    /// The device of the variables.
    pub fn device(&self) -> &candle_core::Device {
        self.inner.device()
    }
    /// The dtype of the variables.
    pub fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    /// Whether a variable `name` exists under the prefix.
    pub fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
    /// The variable `name` of shape `s` (candle-nn's default initialization when
    /// created), as an input of the context.
    pub fn get<S: Into<candle_core::Shape>>(&self, s: S, name: &str) -> Result<RTensor> {
        self.remat()?.input(&self.inner.get(s, name)?)
    }
    /// The variable `name` of shape `s`, initialized by `init` when created.
    pub fn get_with_hints<S: Into<candle_core::Shape>>(
        &self,
        s: S,
        name: &str,
        init: Init,
    ) -> Result<RTensor> {
        self.remat()?
            .input(&self.inner.get_with_hints(s, name, init)?)
    }
}
