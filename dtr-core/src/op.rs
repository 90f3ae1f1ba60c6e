//! The op handle an adapter supplies ([`OpHandle`]) and the shape of an op's outputs
//! ([`OutputSpec`]).

use crate::error::OpError;

/// A compute path's operator, supplied by the adapter.
///
/// `compute` must be deterministic: given the same input values it returns values
/// that are bit-identical to the ones it returned the first time, because the
/// runtime calls it again to rematerialize evicted outputs. Ops that cannot promise
/// this (random without a recorded seed, in-place mutation, collectives) return
/// `false` from [`OpHandle::recomputable`]; their outputs are never evicted.
pub trait OpHandle<V>: Send + Sync {
    /// A short name for errors and tracing events.
    fn name(&self) -> &str {
        "op"
    }

    /// Compute the op's *fresh* outputs (views are not returned: they share an
    /// input's storage) from the values of its input storages, in argument order.
    fn compute(&self, inputs: &[&V]) -> Result<Vec<V>, OpError>;

    /// Whether the op may be replayed to rematerialize its outputs.
    fn recomputable(&self) -> bool {
        true
    }
}

/// Any `Fn(&[&V]) -> Result<Vec<V>, OpError>` closure is a recomputable op handle.
pub struct FnOp<F> {
    name: String,
    f: F,
}

impl<F> FnOp<F> {
    /// Wrap a closure under a name.
    pub fn new(name: impl Into<String>, f: F) -> Self {
        Self {
            name: name.into(),
            f,
        }
    }
}

impl<V, F> OpHandle<V> for FnOp<F>
where
    F: Fn(&[&V]) -> Result<Vec<V>, OpError> + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn compute(&self, inputs: &[&V]) -> Result<Vec<V>, OpError> {
        (self.f)(inputs)
    }
}

/// One output of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputSpec {
    /// A new storage of `bytes` bytes.
    Fresh {
        /// Size in bytes.
        bytes: u64,
    },
    /// A view (alias) of input `input`'s storage: no new bytes.
    View {
        /// Index into the op's inputs.
        input: usize,
    },
}

impl OutputSpec {
    /// A fresh output of `bytes` bytes.
    pub fn fresh(bytes: u64) -> Self {
        OutputSpec::Fresh { bytes }
    }
    /// A view of input `input`.
    pub fn view(input: usize) -> Self {
        OutputSpec::View { input }
    }
}
