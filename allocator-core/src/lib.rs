//! # remat-alloc — a PyTorch-grade caching device allocator
//!
//! `remat-alloc` re-implements PyTorch's `CUDACachingAllocator` rule for rule over a
//! pluggable raw-memory [`Device`]: requests are rounded (512 B, optionally to
//! power-of-two divisions), served best-fit from per-stream pools of cached free
//! blocks (a *small* pool for ≤ 1 MiB, a *large* pool above), split and merged over
//! address-contiguous blocks of one device allocation (a *segment*), and only when
//! nothing fits does the allocator ask the device for a new segment — freeing cached
//! segments and retrying before it gives up with an out-of-memory error that says
//! where the memory went.
//!
//! ```text
//!   segment (one Device::allocate)                       pools (free blocks only)
//!   ┌──────────┬──────┬────────────┬──────────────┐      small, large: per stream, size bins
//!   │ alloc'd  │ free │  alloc'd   │     free     │      sorted by (size, ptr) + a two-level
//!   └──────────┴──────┴────────────┴──────────────┘      bitmap of non-empty bins (TLSF layout)
//!     prev ⇄ next links between address-contiguous blocks: split on malloc,
//!     merge on free, never two free neighbours; get_adjacent_free_size reads
//!     the two neighbours of a block in O(1).
//! ```
//!
//! ## Module layout
//!
//! | module | what it owns |
//! |---|---|
//! | [`device`] | the [`Device`] trait (segments, memory info, streams/events, optional virtual memory) and the simulated, host and CUDA (`cuda` feature) devices |
//! | [`config`] | [`AllocatorConfig`]: `PYTORCH_CUDA_ALLOC_CONF` syntax, parsed once from `REMAT_ALLOC_CONF` / `PYTORCH_CUDA_ALLOC_CONF`; `config/` holds the struct and builders (`mod.rs`), [`ConfigError`] (`error.rs`), the tokenizer and grammar (`parse.rs`), value checks (`values.rs`), applying a string (`apply.rs`) and writing one back (`display.rs`) |
//! | [`size`] | constants and size arithmetic (`round_size`, segment sizes, `format_size`) |
//! | [`allocator`] | [`CachingAllocator`]: malloc / free / record_stream / empty_cache / expandable segments / memory fraction, and [`AllocatorBatch`] / [`AllocatorView`]; one hot-path malloc serves both the locked API and the batch |
//! | `allocator::{block, pool}` (private) | the block arena (ids, not pointers, for prev/next) and the best-fit pools: PyTorch's exact choice (smallest block ≥ the request on its stream, lowest address among equals) from segregated size bins |
//! | `allocator::{state, release, expandable, views, invariants}` (private) | `State`, the bookkeeping every rule acts on; giving memory back (cached segments, garbage collection, memory fraction, the OOM error); expandable segments; the snapshot and block list; the invariant scan (tests, `invariant-checks` feature) |
//! | `allocator::tests` (tests only) | the ported PyTorch tests, rule and model tests, and `reference/`: the pre-rewrite allocator the differential test compares against |
//! | [`host`] | [`CachingHostAllocator`]: PyTorch's pinned host caching allocator (power-of-two blocks reused after the events of the streams that used them complete, `empty_cache`, [`host::HostStats`], a host budget, the `pinned_*` keys) over a [`host::HostProvider`]: aligned host memory, or CUDA page-locked memory (`cuda` feature) |
//! | [`stats`] | [`DeviceStats`] with PyTorch's key names |
//! | [`snapshot`] | [`Snapshot`] of segments and blocks, alloc/free trace, JSON and pickle export (`serde` feature) |
//! | [`plan`] | static planning of repeated allocation sequences |
//! | `error` (private, re-exported) | [`Error`] and [`OutOfMemoryError`] |
//! | `summary`, `pickle` (private) | `memory_summary`'s table; the pickle writer (`serde` feature) |
//! | `sync` (private) | the std/loom switch: the only place that names a mutex |
//!
//! ## Public API in one glance
//!
//! ```
//! use remat_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
//!
//! # fn main() -> Result<(), remat_alloc::Error> {
//! let device = SimulatedDevice::new(1 << 30); // 1 GiB of pretend device memory
//! let alloc = CachingAllocator::new(device, AllocatorConfig::parse("max_split_size_mb:64")?)?;
//! let a = alloc.malloc(3 << 20, StreamId::DEFAULT)?;     // 3 MiB from a 20 MiB segment
//! let b = alloc.malloc(2 << 20, StreamId::DEFAULT)?;     // carved right after `a`
//! alloc.free(a)?;
//! let free = alloc.adjacent_free_size(&b)?;               // O(1): the hole a freed neighbour left
//! assert_eq!((free.left, free.right), (3 << 20, 15 << 20));
//! assert_eq!(alloc.stats().reserved_bytes.all.current, 20 << 20);
//! println!("{}", alloc.memory_summary());
//! # alloc.free(b)?;
//! # Ok(()) }
//! ```
//!
//! Each call takes the allocator's mutex once. For many operations in a row (an
//! eviction loop, a trace replayer, a framework's single stream),
//! [`CachingAllocator::batch`] takes it once for all of them and makes the same
//! decisions; [`CachingAllocator::inspect`] does the same for read-only queries.
//!
//! Errors are typed ([`Error`]); an out-of-memory error ([`OutOfMemoryError`])
//! carries the figures and prints PyTorch's message. Library code never panics on
//! user input.

pub mod allocator;
pub mod config;
pub mod device;
mod error;
pub mod host;
pub mod plan;
pub mod size;
pub mod snapshot;
pub mod stats;

#[cfg(feature = "serde")]
mod pickle;
mod summary;
mod sync;

pub use allocator::{
    AdjacentFree, Allocation, AllocatorBatch, AllocatorView, BlockInfo, CachingAllocator,
    FreeMemoryCallback, OomObserver,
};
pub use config::{AllocatorConfig, ConfigError};
pub use device::{
    Device, DeviceError, DevicePtr, EventId, HostDevice, MemInfo, SimulatedDevice, StreamId,
    VirtualMemory,
};
pub use error::{Error, OutOfMemoryError};
pub use host::{CachingHostAllocator, HostBlock};
pub use snapshot::{BlockState, Snapshot, TraceAction, TraceEntry};
pub use stats::{DeviceStats, Stat, StatArray};

#[cfg(feature = "cuda")]
pub use device::{CudaDevice, CudaPool, PoolUsage};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
