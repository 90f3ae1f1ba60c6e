//! # remat-burn — Dynamic Tensor Rematerialization under Burn
//!
//! [`Dtr<B>`] is a Burn backend that runs every op of an inner backend `B` (NdArray
//! on the CPU, `burn_cuda::Cuda` with the `cuda` feature) through a
//! [remat-dtr](remat_dtr) runtime, so that `Autodiff<Dtr<B>>` trains an unchanged
//! burn-nn model under a memory budget: when the budget is full the runtime evicts
//! results (the inner tensor is dropped) and replays their recorded ops when they
//! are read again — bit-identically, since the replayed op is the very IR op that
//! produced them.
//!
//! ```text
//!  user code / burn-nn / burn-optim      Tensor<Autodiff<Dtr<B>>, D>
//!     │
//!  burn-autodiff                          autograd (NoCheckpointing)
//!     │
//!  burn-router  BackendRouter<DtrChannel<B>>   every op → OperationIr
//!     │
//!  DtrClient (this crate) ── register_op / read / drop
//!     │   ├─ remat_dtr::Runtime<Resident<B>>   records, budget (remat-alloc's
//!     │   │     caching allocator over a SimulatedDevice), eviction, regeneration
//!     │   │     on an explicit work list (no recursion)
//!     │   └─ IrOp: the recorded OperationIr (inputs read-only), replayed on ↓
//!     ▼
//!  burn_router::Runner<B>  handle container = the resident inner tensors
//! ```
//!
//! ## Module layout
//!
//! | module | what it owns |
//! |---|---|
//! | `channel` | [`DtrChannel`], the router channel that puts the runtime between Burn and `B` ([`Dtr<B>`] is `BackendRouter<DtrChannel<B>>`), and [`DtrBridge`], which moves inner handles between DTR devices |
//! | `client` | [`DtrClient`], the router client of one device: runs each op on burn's IR runner, records it in the remat-dtr runtime (views as aliases, uploads and non-recomputable ops as roots), reads, drops, seals, ends iterations, keeps the first error; [`DtrStats`] |
//! | `op` | the compute path: the recorded IR op replayed on the runner (`IrOp`, the runtime's op handle), [`Resident`] (the guard whose drop frees an inner tensor), view chains, which ops are views and which are recomputable |
//! | `device` | [`DtrDevice`] (one slot each: one client, one runtime, one budget; slot 0 from `REMAT_DTR_CONF`), [`DtrOptions`], calibration against the inner pools ([`PoolReport`], [`DeviceMemory`]), `empty_cache` |
//! | `cost` | [`CostModel`]: wall-clock time on synchronous backends, an analytic estimate from the IR (bytes, matmul/conv flops) on asynchronous ones |
//! | `swap` | the host tier: `HostCopies` (the runtime's `HostTransfer`: a swap-out reads the inner tensor into `TensorData`, a swap-in registers it again under the same id), the start-up bandwidth probe, [`SwapFaults`] (the test hook) |
//! | `optim` (feature `optim`) | [`Sealing`], the optimizer wrapper that seals the device and ends the iteration after each step |
//! | `error` | [`Error`] and [`Result`] |
//!
//! ## Why burn 0.21
//!
//! Burn 0.21.x is pinned (`=0.21.0`) on purpose: it is the **last release whose
//! `Tensor<B, D>` is generic over the backend**. From 0.22 `burn::Tensor` dispatches
//! over a fixed set of built-in backends, so a third-party backend such as
//! `Dtr<B>` is unreachable from user code and burn-nn models in process. For
//! Burn 0.22 users, the `remat-burn-server` crate ports this router channel and
//! client to burn-router 0.22 and serves `Dtr<B>` behind burn-remote, which
//! stock Burn reaches through a remote device (loopback by default).
//!
//! ## The model
//!
//! - **Compute path.** burn-router turns each of the ~430 backend methods into an
//!   [`OperationIr`](burn_ir::OperationIr). The client marks the op's inputs
//!   read-only (no in-place reuse, so replay always finds its inputs), runs it on
//!   burn's IR [`Runner`](burn_router::Runner), and records it in the runtime as
//!   the compute path of its outputs, with its cost.
//! - **Residency.** The runner's handle container holds the inner tensors. The
//!   runtime owns one [`Resident`] guard per resident storage; eviction drops the
//!   guard, which removes the handle and so drops the inner tensor (its memory is
//!   freed by `B`). Reading an evicted tensor pins it: the runtime rematerializes
//!   its inputs and replays the op, without recursion.
//! - **Views.** Reshape, swap-dims, permute, expand, slice and flip are aliases:
//!   the new tensor names the same storage (no bytes, no record). The view's ops
//!   are kept as a chain and materialized in the runner only while an op reads it.
//! - **Never evicted.** Uploaded data (parameters, inputs), random ops (no
//!   recorded seed: the generator has moved on) and `empty` are not recomputable.
//!   Custom ops are rejected with [`Error::Unsupported`].
//! - **Costs.** [`CostModel::WallClock`] times the op on synchronous backends;
//!   on asynchronous ones (CUDA) use [`CostModel::Analytic`] (bytes × ns/byte +
//!   matmul/conv flops × ns/flop), since a launch returns before the kernel ends.
//! - **Budget and policy** come from a [`remat_dtr::DtrConfig`] given to
//!   [`DtrDevice::new`], or from `REMAT_DTR_CONF` (the default device,
//!   [`DtrDevice::from_env`]). The physical budget mode places every storage with
//!   remat-alloc's caching allocator over a simulated device of the budget's size,
//!   so rounding and fragmentation count. With `cuda`, cubecl's memory management
//!   exposes no allocator hook in any version: remat-alloc stays a placement
//!   model. [`DtrDevice::calibrate`] (for backends implementing [`PoolReport`]:
//!   cubecl's, with `cuda`) reads the pools' bytes in use, takes what the model
//!   does not count and lowers the eviction threshold to `budget − outside`;
//!   [`DtrDevice::calibrate_to`] does the same with a figure you supply, and
//!   [`DtrDevice::empty_cache`] syncs and calls the inner backend's
//!   `memory_cleanup`.
//! - **Training seals after each step.** Burn's optimizers are functional (new
//!   parameters are computed from the old ones), so the device must be sealed
//!   after each optimizer step: every live tensor becomes a root and the step's
//!   records are dropped. Without it the parameters' lineage, and the uploads it
//!   reads, would stay recorded (and those uploads resident) for the whole run.
//!   Wrap the optimizer in [`Sealing`] (feature `optim`, default) and it happens
//!   inside `step`; or call [`DtrDevice::seal`] yourself.
//! - **Swap to host memory** (off by default). With `swap:on` in
//!   `REMAT_DTR_CONF`, or [`DtrOptions::with_swap`] /
//!   [`DtrOptions::with_swap_bandwidth`], the runtime may swap a storage —
//!   copy it to host memory with the inner backend's `into_data` and drop the
//!   inner tensor — instead of evicting it, when the two copies cost less than
//!   its recomputation; parameters, inputs and optimizer state, which cannot be
//!   recomputed, leave the device between their uses. A swap-in registers the
//!   bytes again (`from_data`) under the same tensor id: float, int and bool
//!   tensors round-trip bit for bit. Without a configured `swap_bandwidth` the
//!   device measures it when it starts (a 4 MiB round trip;
//!   [`DtrDevice::swap_bandwidth`]). A failed swap-out leaves the value
//!   resident; a failed swap-in fails the op or read that needed the value with
//!   [`remat_dtr::Error::Transfer`] ([`Error::transfer`]), keeps the host copy,
//!   and the next use copies it back. [`SwapFaults`] injects such failures in
//!   tests. [`DtrStats`] counts swaps, bytes, the modelled stall and the real
//!   copy time.
//! - **Errors.** Burn's op methods return nothing, so an op that fails (for
//!   instance with [`remat_dtr::Error::ImpossibleBudget`]) marks its outputs as
//!   not computed. Reading one (`Tensor::try_into_data`; `into_data` panics with
//!   the same text) returns an `ExecutionError` carrying remat's message and
//!   figures; ops that read one are skipped, their outputs not computed either.
//!   Everything else keeps working: one failure does not poison the device. The
//!   next `Backend::sync` reports the first failure since the last sync, and
//!   [`DtrDevice::take_error`] gives the typed [`Error`].
//!
//! ## Use
//!
//! ```no_run
//! use burn_autodiff::Autodiff;
//! use burn_ndarray::NdArray;
//! use burn_tensor::Tensor;
//! use remat_burn::{Dtr, DtrDevice};
//! use remat_dtr::DtrConfig;
//!
//! type B = Autodiff<Dtr<NdArray>>;
//! let device = DtrDevice::<NdArray>::new(Default::default(), DtrConfig::default().with_budget(8 << 20))
//!     .expect("device");
//! let x = Tensor::<B, 2>::ones([64, 64], &device).require_grad();
//! let loss = x.clone().matmul(x.clone()).exp().sum();
//! let grads = loss.backward();
//! let _g = x.grad(&grads);
//! println!("{}", device.stats());
//! ```

mod channel;
mod client;
mod cost;
mod device;
mod error;
mod op;
#[cfg(feature = "optim")]
mod optim;
mod swap;

pub use channel::{DtrBridge, DtrChannel};
pub use client::{DtrClient, DtrStats};
pub use cost::CostModel;
pub use device::{DeviceMemory, DtrDevice, DtrOptions, PoolReport};
pub use error::{Error, Result};
pub use op::Resident;
#[cfg(feature = "optim")]
pub use optim::Sealing;
pub use swap::SwapFaults;

/// Re-exported so that users name one version of the DTR runtime's config.
pub use remat_dtr;

/// Burn backend with Dynamic Tensor Rematerialization over the inner backend `B`.
pub type Dtr<B> = burn_router::BackendRouter<DtrChannel<B>>;

/// The remat-alloc crate the physical budget places storages with.
pub use remat_alloc;

/// `Dtr` over burn-cuda's CubeCL backend (feature `cuda`; without fusion, which
/// would hide the IR from the router). Use [`CostModel::gpu`] or another
/// [`CostModel::Analytic`]: CUDA ops are asynchronous, wall-clock time around a
/// launch is not their cost.
#[cfg(feature = "cuda")]
pub type DtrCuda = Dtr<burn_cuda::Cuda>;
