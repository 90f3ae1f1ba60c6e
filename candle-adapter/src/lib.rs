//! # remat-candle — Candle models train under a memory budget, bit-identically
//!
//! Dynamic Tensor Rematerialization (remat-dtr) under [Candle](candle_core): an
//! [`RTensor`] mirrors candle's `Tensor` surface; every op runs the real candle op,
//! registers its output with the DTR runtime together with a recompute closure, and
//! attaches it to candle's own autograd graph through a custom op. When the budget
//! is exceeded the runtime evicts storages (their memory is freed); reading one
//! again — in a later op or in `backward()` — replays its op, bit-identically.
//!
//! ```text
//!  model code (RTensor ops, remat_candle::nn layers)
//!     │  graph::apply: pin inputs · run candle op on detached inputs ·
//!     │                move storage out · apply_opN(Attach) · runtime.record
//!     ▼
//!  candle autograd graph ── Attach::bwd: pin inputs (rematerialize) · vjp · unpin
//!     │
//!  remat-dtr Runtime<Cell> ── evict = drop Cell = move the storage out of candle's
//!     │                       shared cell; remat = recompute, move it back in
//!     └── PhysicalBudget: remat-alloc caching allocator over a simulated device
//!                         of capacity = budget (CPU placement model)
//! ```
//!
//! ## Module layout
//!
//! | module | what it owns |
//! |---|---|
//! | [`context`] | [`Remat`]: the context owning one DTR runtime and handing out tensors; [`RematConfig`], [`Budget`], [`CostModel`] |
//! | [`tensor`] | [`RTensor`]: candle's `Tensor` surface (views, reductions, matmul, constructors, composites); `tensor/`: `unary`, `binary` (and the operators), `conv`, `indexing`, `compare`; [`Pinned`], [`dropout_mask`] |
//! | [`index`] | `.i(..)`: [`IndexOp`], [`Indexer`] |
//! | [`nn`] | candle-nn's layers, `VarBuilder`, `Optimizer`, `ops`, `loss`, `rotary_emb`, `with_tracing`; `nn/` splits them by idea (its doc has the map), one generic [`nn::Conv`] for every convolution layer |
//! | [`transformers`] | candle-transformers' shared helpers (`utils`, `models::with_tracing`) |
//! | `graph` (private) | the evict/restore mechanism: one adapter op (`apply`), the `Attach` custom op at every arity, the recompute handle, the backward hook |
//! | [`cell`] | [`Cell`]: moving a storage out of and back into candle's shared storage cell |
//! | [`swap`] | the host tier: remat-dtr's `HostTransfer` for [`Cell`]s (swap a storage to host memory and back, bit for bit) |
//! | [`device`] | the real device: device OOM recognition, evict-and-retry, [`DeviceMemory`] (CUDA driver pool) |
//! | [`error`] | [`Error`], [`Result`] (candle's), [`CandleErrorExt`] |
//! | [`as_candle`] | candle-core's names with [`RTensor`] as `Tensor`, for ported model files |
//!
//! ## Using it
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use remat_candle::nn::{self, Module, Optimizer, VarBuilder, VarMap, SGD};
//! use remat_candle::{Remat, RematConfig};
//!
//! # fn main() -> remat_candle::Result<()> {
//! let dev = Device::Cpu;
//! let varmap = VarMap::new();
//! let remat = Remat::new(RematConfig::new().with_budget_bytes(16 << 20))?;
//! // candle-nn's VarBuilder, carrying the context: layers are built as in candle-nn.
//! let vb = VarBuilder::from_varmap_in(&remat, &varmap, DType::F32, &dev);
//! let l1 = nn::linear(8, 32, vb.pp("l1"))?;
//! let l2 = nn::linear(32, 1, vb.pp("l2"))?;
//! let mut opt = SGD::new(varmap.all_vars(), 0.1)?;
//! let x = remat.input(&Tensor::ones((4, 8), DType::F32, &dev)?)?;
//! let loss = l2.forward(&l1.forward(&x)?.relu()?)?.sqr()?.mean_all()?;
//! opt.backward_step(&loss)?; // candle-nn's optimizer, from the adapter's loss
//! # Ok(()) }
//! ```
//!
//! ## Porting from candle
//!
//! Model code keeps candle's shape: every function returns candle's
//! [`Result`] (remat's typed [`Error`] rides inside, see [`CandleErrorExt`]);
//! [`nn`] has candle-nn's layers, `VarBuilder`, `Optimizer`, `ops`,
//! `rotary_emb` and `loss` under their names and signatures; [`RTensor`] has
//! candle's ops, constructors and `.i(..)` ([`IndexOp`]). Import
//! `remat_candle::nn as candle_nn` and `RTensor as Tensor`; the training loop
//! creates the [`Remat`] context, builds the `VarBuilder` with it and wraps its
//! inputs with [`Remat::input`]. docs/candle.md maps every name and lists what is
//! not covered. Tied weights (an output layer over the embedding table) are
//! bit-identical to plain candle and counted once.
//!
//! ## What is and is not rematerializable
//!
//! - Outputs of [`RTensor`] ops are; inputs ([`Remat::input`]) and parameters
//!   ([`Remat::param`]) are counted in the budget but never evicted.
//! - candle has no read hook: a storage handed to plain candle must be resident.
//!   [`RTensor::pinned`] pins it for the guard's lifetime; [`RTensor::to_candle`]
//!   makes an independent copy (outside the budget) that stays in candle's graph.
//! - Parameters are shared with their `Var`s: an optimizer step changes them in
//!   place, so drop the previous step's activations before stepping (the usual
//!   training loop does); a rematerialization after a step would see new weights.
//! - Gradients live in candle's `GradStore`, outside the budget; the budget covers
//!   inputs, parameters and every activation, including those rematerialized
//!   during `backward()`.
//! - Dropout draws its mask from a recorded seed ([`dropout_mask`]); in-place
//!   candle ops on adapter tensors are not supported.
//! - Eviction happens at op boundaries only. On CPU the budget is a placement
//!   model (remat-alloc's caching allocator over a simulated device of the
//!   budget's size): an allocation that fails there evicts and retries.
//! - A device out-of-memory error inside an op (forward, rematerialization or
//!   backward) evicts and runs the op again; when nothing is left to evict it is
//!   a typed [`remat_dtr::Error::DeviceOutOfMemory`] with the runtime's figures.
//! - Feature `cuda` enables candle's CUDA backend (needs nvcc); the evict/restore
//!   in-place ops support CUDA storages. Candle allocates through cudarc, which has
//!   no allocator hook: the budget is enforced on the placement model, and
//!   [`Remat::calibrate`] / [`Remat::empty_cache`] (feature `cuda-pool`, part of
//!   `cuda`) read and trim the driver pool. The [`device`] module says exactly
//!   what remat-alloc does and does not serve. Without nvcc, CI type-checks
//!   `cuda` with a stub nvcc (nothing linked or run); `cuda-pool` needs no nvcc.

/// candle-core's names for model code, with remat-candle's tensor: a model file
/// that starts with `use candle::{DType, Device, IndexOp, Module, Result, Tensor,
/// D};` ports by changing that line to `use remat_candle::as_candle::{…};`
/// (`Tensor` is [`RTensor`], `IndexOp` is [`IndexOp`], `Module` is
/// [`nn::Module`]; the rest are candle-core's own).
pub mod as_candle {
    pub use crate::index::IndexOp;
    pub use crate::nn::{Module, ModuleT};
    pub use crate::tensor::RTensor as Tensor;
    pub use candle_core::{bail, DType, Device, Error, Result, Shape, WithDType, D};
}
pub mod cell;
pub mod context;
pub mod device;
pub mod error;
mod graph;
pub mod index;
pub mod nn;
pub mod swap;
pub mod tensor;
pub mod transformers;

pub use cell::Cell;
pub use context::{Budget, CostModel, PinnedParams, Remat, RematConfig};
pub use device::{is_device_oom, DeviceMemory};
pub use error::{CandleErrorExt, Error, Result};
pub use index::{IndexOp, Indexer};
/// The runtime's figures, settings and typed errors, re-exported so that a user
/// of this crate needs no direct dependency on `remat-dtr` or `remat-alloc`:
/// `remat.stats()` is a [`RuntimeStats`], `remat.memory_usage()` a
/// [`MemoryUsage`], an impossible budget carries an [`ImpossibleBudget`].
pub use remat_dtr::{
    AllocatorConfig, BudgetMode, ConfigError, DeviceOutOfMemory, DtrConfig, HostBudget,
    ImpossibleBudget, ImpossibleCause, IterationReport, MemoryUsage, PlanStatus, PlanSummary,
    PolicyKind, RuntimeStats, StorageId, SwapConfig, TensorId, TransferError,
};
pub use tensor::{dropout_mask, Pinned, RTensor};
/// candle-core and candle-nn at the version this crate is built with
/// (`remat_candle::candle::bail!`, `remat_candle::candle_nn::VarBuilder`).
pub use {candle_core as candle, candle_nn};
/// The crates underneath, at the versions this crate is built with: `remat_candle::dtr`
/// is remat-dtr, `remat_candle::alloc` remat-alloc.
pub use {remat_alloc as alloc, remat_dtr as dtr};
