//! # remat
//!
//! The memory layer Rust ML frameworks lack, as one dependency:
//!
//! - [`alloc`] (`remat-alloc`): a PyTorch-grade caching device allocator with an
//!   O(1) adjacent-free query, PyTorch-style stats, snapshots and OOM messages,
//!   configured by `REMAT_ALLOC_CONF` (or `PYTORCH_CUDA_ALLOC_CONF`);
//! - [`dtr`] (`remat-dtr`): Dynamic Tensor Rematerialization under a memory budget;
//! - [`trace`] (`remat-trace`): the DTR paper's training traces, for replay and planning;
//! - `candle` (`remat-candle`, feature `candle`): Candle models under a budget;
//! - `burn` (`remat-burn`, feature `burn`): a `Dtr<B>` backend for Burn.
//!
//! The `remat` binary wraps them: `remat config check "<settings>"`, `remat demo`, …

pub use remat_alloc as alloc;
pub use remat_dtr as dtr;
pub use remat_trace as trace;

#[cfg(feature = "burn")]
pub use remat_burn as burn;
#[cfg(feature = "candle")]
pub use remat_candle as candle;

pub mod alloc_replay;
