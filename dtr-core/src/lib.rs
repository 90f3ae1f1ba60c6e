//! # remat-dtr — Dynamic Tensor Rematerialization that asks the allocator where the holes are
//!
//! A framework-agnostic DTR runtime (Kirisame et al., ICLR 2021; MegEngine's
//! interpreter design). Every tensor is either *external* (`put`: inputs,
//! parameters — never evicted) or produced by a *compute path* (an adapter-supplied
//! [`OpHandle`], its input storages, its fresh outputs, its cost). Views share their
//! input's *storage*, the unit of eviction. When the budget is exceeded the runtime
//! evicts storages chosen by a pluggable [`EvictionPolicy`], and regenerates them by
//! replaying their compute paths when they are needed again — bit-identically,
//! because op handles are deterministic (non-deterministic, in-place and collective
//! ops declare themselves non-recomputable and are never evicted).
//!
//! ```text
//!  adapter (candle / burn / trace replayer)
//!     │ put · apply · record · access · retain · release · pin · unpin · evict
//!     ▼
//!  Runtime<V> ── values: Vec<Option<V>>, op handles
//!     │  Graph: StorageRec / OpRec, candidates, union-find (evicted components)
//!     │  regeneration: explicit work list (Need / Run frames), no recursion
//!     ├── EvictionPolicy ◄── DecisionView: pool (√N sample, 1 % filter), e*, staleness,
//!     │                                    adjacent free bytes, address-ordered blocks
//!     └── MemoryModel: LogicalBudget (sum of live bytes) │ PhysicalBudget (remat-alloc
//!                      CachingAllocator over a SimulatedDevice of capacity = budget)
//! ```
//!
//! ## Module layout
//!
//! | module | what it owns |
//! |---|---|
//! | [`runtime`] | [`Runtime`]: the interpreter primitives, fake/real delete, regeneration, eviction loop, invariants; `runtime/iteration/`: boundaries, the recorder, the plan follower, the online rescues |
//! | [`record`] | the recorder's format: [`Event`]s of one iteration, [`Ref`] names, the [`Boundary`] it starts from |
//! | [`export`] | a [`Recording`] as a trace in the DTR paper's format ([`Recording::to_trace`], [`export::write_trace`]): a user's own step for `remat replay` / `plan` / `advise` |
//! | [`planner`] | plan-ahead: replay a [`Recording`] offline under the budget with a portfolio, place the winner in one arena |
//! | [`plan`] | the plan the runtime follows: [`IterationPlan`], its eviction steps and offsets |
//! | [`memory`] | [`MemoryModel`], [`Slot`], [`BlockView`] and the three models: [`LogicalBudget`] (`memory::logical`), [`PhysicalBudget`] (`memory::physical`), [`ArenaMemory`] (`memory::arena`) |
//! | [`op`] | [`OpHandle`] (recompute from input storages), [`FnOp`], [`OutputSpec`] (fresh / view) |
//! | [`policy`] | [`EvictionPolicy`], [`DecisionView`], score policies, Coop window, remat's default; `policy::oracle`: the policies that read the future (the planner's portfolio, the replayer's analysis) |
//! | [`config`] | [`DtrConfig`], `REMAT_DTR_CONF` parsing, [`PolicyKind`], [`BudgetMode`] |
//! | [`swap`] | the host tier: [`SwapConfig`], [`HostTransfer`] (the adapter's copies), [`HostValue`], the copy-time model; the runtime's side is `runtime/swap.rs` |
//! | [`unionfind`] | the union-find over evicted storages (h_DTR^eq) |
//! | [`error`] | [`Error`], [`ImpossibleBudget`], [`ImpossibleCause`], [`OpError`] |
//! | [`stats`] | [`RuntimeStats`], [`IterationReport`] |
//! | [`replay`] | a leaf the library never calls: the trace replayer (DTR paper traces) and sweeps, for the CLI, benches and tests |
//! | `graph`, `ids`, `rng` (private/ids) | records and slabs, handles, the seeded sampler |
//!
//! Old paths stay: `remat_dtr::arena` and `remat_dtr::physical` re-export
//! `memory::arena` and `memory::physical`, `remat_dtr::replay::oracle` re-exports
//! `policy::oracle`.
//!
//! ## The API in one glance
//!
//! ```
//! use std::sync::Arc;
//! use remat_dtr::{BudgetMode, DtrConfig, FnOp, OpError, OutputSpec, PolicyKind, Runtime};
//!
//! # fn main() -> Result<(), remat_dtr::Error> {
//! let config = DtrConfig::default()
//!     .with_budget(3_000)
//!     .with_budget_mode(BudgetMode::Logical)
//!     .with_policy(PolicyKind::DtrEq);
//! let mut rt: Runtime<u64> = Runtime::new(config)?;
//! let x = rt.put(7, 1_000)?; // external: never evicted
//! let double = Arc::new(FnOp::new("double", |v: &[&u64]| Ok::<_, OpError>(vec![*v[0] * 2])));
//! let mut t = x;
//! let mut all = Vec::new();
//! for _ in 0..5 {
//!     t = rt.apply(double.clone(), &[t], &[OutputSpec::fresh(1_000)], 10)?[0];
//!     all.push(t);
//! }
//! // Only 3 000 B fit: older values were evicted and come back on access.
//! assert_eq!(*rt.access(all[0])?, 14);
//! assert_eq!(*rt.access(all[4])?, 7 << 5);
//! assert!(rt.stats().evictions > 0);
//! # Ok(()) }
//! ```
//!
//! Budgets are *physical* by default: a remat-alloc caching allocator whose device
//! holds exactly the budget, so rounding, segments and fragmentation count, and an
//! allocation failure triggers eviction and a retry. *Logical* budgets count live
//! bytes as the DTR paper does. A byte threshold (evict before each op while above
//! it) is also available. When no eviction can make room, the runtime returns
//! [`Error::ImpossibleBudget`] with the figures — never a hang.
//!
//! ## Plan-ahead: training repeats its iteration
//!
//! Call [`Runtime::end_iteration`] after each training step. The runtime records
//! every step ([`record`]); at a boundary where the next step starts from the
//! same state, the [`planner`] replays the recording offline under the budget —
//! knowing its future — and picks the cheapest schedule whose allocations fit one
//! arena; the next step then follows it ([`plan`]): planned evictions at their
//! planned allocations, every allocation at its planned offset in an
//! [`ArenaMemory`]. A step that differs (another shape, another branch) leaves the
//! plan at its first differing call and runs online; it is recorded as it ran
//! and planned again. Values stay bit-identical on both paths: the plan only
//! decides *what* to evict and *where* to place, never what an op computes.
//!
//! The online and planned paths share the same records: the recorder runs in
//! both, the planner drives the same `Runtime` code over `()` values, and the
//! executor's steps name storages by the sequence numbers both paths assign.
//! Among the data modules the arrows go one way: `record` (the recording's
//! types) ← `plan` (the plan's types) ← `planner`, `record` ← `export`
//! (which writes a recording with `remat-trace`, as `replay` reads one), and `memory`, `policy`
//! (with `policy::oracle`, the future-reading policies of the planner's
//! portfolio) ← `runtime` ← `planner` ← `replay`. Nothing in the library calls
//! `replay`: it is a leaf for the command line, benches and tests. The
//! recorder, the plan follower and the online rescues are parts of the runtime
//! (`runtime::iteration::{record, follow, rescue, boundary}`, each with its own
//! state; that module's doc draws how a planned access flows through them),
//! and the runtime and the planner meet in two places only: the runtime calls
//! `planner::plan_iteration` (and `min_feasible_budget`) at a boundary, and the
//! planner's simulations are `Runtime<()>`s, which is what makes a simulated
//! schedule the one the next step runs.
//!
//! After a boundary, a value the ended step left evicted is stale: reading it is
//! [`Error::StaleValue`], never a recompute from weights an optimizer has changed.
//!
//! Events: `tracing` targets `remat_dtr::evict`, `remat_dtr::remat`,
//! `remat_dtr::oom`, `remat_dtr::plan`.

pub mod config;
pub mod error;
pub mod export;
mod graph;
pub mod ids;
pub mod memory;
pub mod op;
pub mod plan;
pub mod planner;
pub mod policy;
pub mod record;
pub mod replay;
mod rng;
pub mod runtime;
pub mod stats;
pub mod swap;
pub mod unionfind;

/// The arena model's old path, kept for code that names it
/// (now [`memory::arena`]).
pub use memory::arena;
/// The physical model's old path, kept for code that names it
/// (now [`memory::physical`]).
pub use memory::physical;
/// The plan's types' old path, kept for code that names it (now [`plan`]).
#[doc(hidden)]
pub use plan as execute;

pub use config::{BudgetMode, ConfigError, DtrConfig, MegEngineParams, PolicyKind};
pub use error::{
    DeviceOutOfMemory, Error, ImpossibleBudget, ImpossibleCause, OpError, OpWorkingSet, Result,
};
pub use graph::{Hot, Residency};
pub use ids::{OpId, StorageId, TensorId};
pub use memory::ArenaMemory;
pub use memory::PhysicalBudget;
pub use memory::{
    AllocFailure, BlockView, FreeByPool, LogicalBudget, MemoryModel, MemoryUsage, RequestShape,
    Slot,
};
pub use op::{FnOp, OpHandle, OutputSpec};
pub use plan::IterationPlan;
pub use policy::{make_policy, DecisionView, EvictionPolicy, Request};
pub use record::{Boundary, CarryRefusal, Event, Recording, Ref};
pub use remat_alloc::AllocatorConfig;
/// remat-trace, at the version this crate is built with: the format
/// [`Recording::to_trace`] writes and [`replay`] reads
/// (`remat_dtr::trace::Trace`).
pub use remat_trace as trace;
pub use runtime::Runtime;
pub use stats::{IterationReport, NoPlan, PlanStatus, PlanSummary, RuntimeStats, StartDiff};
pub use swap::{HostBudget, HostTransfer, HostValue, NoValues, SwapConfig, TransferError};
