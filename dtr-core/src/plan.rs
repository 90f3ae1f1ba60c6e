//! The plan executor's data: an [`IterationPlan`] (what the planner hands the
//! runtime) and the cursor that walks it while the next iteration runs.
//!
//! Following a plan, the runtime (see `Runtime::make_room`) does at allocation
//! `n` of the iteration exactly what the plan's simulation did: evict the
//! storages it evicted before that allocation (named by sequence number, see
//! [`crate::record`]), then place the allocation at its planned offset. Every
//! public call is first compared with the recorded program
//! ([`crate::record::Event::same_program`]); the first mismatch, a planned victim
//! that is not evictable, or a planned range that is not free ends the plan for
//! the rest of the iteration (a *divergence*): the runtime goes on online, with
//! the configured policy, in the same memory.

use std::sync::Arc;

use crate::record::Recording;

/// A schedule for one iteration, chosen offline (see [`crate::planner`]).
#[derive(Debug, Clone, PartialEq)]
pub struct IterationPlan {
    /// The recorded iteration the plan was made from: the state the next one
    /// must start from ([`Recording::start`]) and the program it must repeat
    /// ([`Recording::events`]). While an iteration follows the plan, this is
    /// its recording too (nothing is recorded call by call).
    pub recording: Arc<Recording>,
    /// What the simulation did before each allocation, in order.
    pub steps: Vec<PlanStep>,
    /// Offsets of the allocations: first one per storage of [`crate::record::Boundary::storages`],
    /// then one per allocation of the iteration, in order.
    pub offsets: Vec<u64>,
    /// Rounded sizes of the same allocations (see [`crate::memory::arena::arena_size`]).
    pub sizes: Vec<u64>,
    /// Bytes of the arena that holds every allocation of the plan (≤ budget).
    pub arena_bytes: u64,
    /// The logical budget the simulation ran under (≤ budget: shrunk until the
    /// placement fits).
    pub simulated_budget: u64,
    /// The portfolio entry that won and how it was placed (`arena`: best fit
    /// in a flat arena during the simulation; `placed`: logical simulation,
    /// then the static planner; `prefetch`: either, placed again by the
    /// static planner with each swap-in's destination free from when its
    /// copy must start (the planner's `prefetch` module); `logical`: logical
    /// budgets). A restarted entry's perturbed copy with seed `k` is named
    /// `<entry>~k`.
    pub policy: String,
    /// Simulated first computations plus rematerializations and stalls on
    /// host-tier copies, the swap-ins re-timed as the follower prefetches
    /// them (ns).
    pub total_ns: f64,
    /// The same with every swap-in copied at its read, as simulated (ns): what
    /// following the plan costs at most (starting copies earlier never makes
    /// a later event later). Equal to `total_ns` without swap-ins.
    pub bound_ns: f64,
    /// Simulated first computations (ns).
    pub compute_ns: f64,
    /// Wall time spent planning (ms).
    pub plan_ms: f64,
    /// Simulations run.
    pub simulations: u32,
    /// Rounds of random restarts run (see [`crate::planner`]): at most
    /// [`crate::DtrConfig::MAX_PLAN_RESTARTS`], 0 with `plan_restarts:0`.
    pub restart_rounds: u32,
    /// The plan moves blocks (placement `moving`): its schedule was simulated
    /// in a compacting arena of the budget, and its [`StepKind::Compact`]
    /// steps slide blocks where that simulation did, each moved byte charged
    /// as a move ([`crate::DtrConfig::move_bandwidth`]). Its offsets are where
    /// each allocation was placed when made; a block moved since is where the
    /// compaction put it. Made where no plan placed without moves fits the
    /// budget, or where moves have a price and the winning schedule costs
    /// less with them (see [`crate::planner`]).
    pub moves: bool,
}

impl IterationPlan {
    /// Simulated overhead: total compute over first computations.
    pub fn overhead(&self) -> f64 {
        if self.compute_ns > 0.0 {
            self.total_ns / self.compute_ns
        } else {
            1.0
        }
    }

    /// The most following the plan costs, over first computations (see
    /// [`IterationPlan::bound_ns`]).
    pub fn bound_overhead(&self) -> f64 {
        if self.compute_ns > 0.0 {
            self.bound_ns.max(self.total_ns) / self.compute_ns
        } else {
            1.0
        }
    }

    /// Allocations placed before the iteration starts (the boundary's
    /// resident storages; its swapped ones have no place until read).
    pub fn prefix_len(&self) -> usize {
        self.recording.start.resident().len()
    }
}

/// One step the simulation took while making room for allocation `at` of the
/// iteration (counting placed allocations only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanStep {
    /// The allocation it made room for.
    pub at: u32,
    /// What it did.
    pub kind: StepKind,
}

/// See [`PlanStep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Evict the candidate with this sequence number.
    Evict(u32),
    /// Evict this finished input of a pending regeneration (a parked storage).
    EvictParked(u32),
    /// The allocation failed as impossible: a regeneration then retries in
    /// another order. The executor fails it too, so both take the same path.
    Fail,
    /// Swap this storage out to the host tier: the candidate (or, `parked`,
    /// the finished input of a pending regeneration) with this sequence
    /// number, or (`prefix`) the storage at this position of the boundary
    /// the iteration started from ([`crate::Boundary::storages`]).
    SwapOut {
        /// Sequence number, or boundary position with `prefix`.
        at: u32,
        /// `at` is a boundary position.
        prefix: bool,
        /// The storage is parked (see [`StepKind::EvictParked`]).
        parked: bool,
    },
    /// Open a hole as the simulation did (plans that move blocks,
    /// [`IterationPlan::moves`]): one free run of `need` bytes, by sliding
    /// the blocks of the window that moves fewest bytes, or, where no window
    /// holds it, every resident block down
    /// ([`crate::memory::arena::ArenaMemory::compact_for`],
    /// [`crate::memory::arena::ArenaMemory::compact`]). The arena is
    /// deterministic, so from the simulation's layout it moves the same
    /// blocks to the same places. (The compaction before a group of
    /// allocations is placed again after one failed is no step: the
    /// follower fails at the plan's `Fail` step and compacts there itself.)
    Compact {
        /// The run to open (bytes as requested).
        need: u64,
    },
}

/// Where a running iteration is in its plan.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// Next entry of [`IterationPlan::steps`].
    pub next_step: usize,
}
