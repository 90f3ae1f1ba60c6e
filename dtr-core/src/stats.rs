//! [`RuntimeStats`]: counters of one runtime, plain data.

use std::fmt;

/// Counters; compute figures in ns of op cost as reported by the adapter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeStats {
    /// Cost of first computations (every `apply`/`record`).
    pub compute_ns: f64,
    /// Cost of rematerializations.
    pub remat_ns: f64,
    /// Storages evicted by the policy or by [`crate::Runtime::evict`].
    pub evictions: u64,
    /// Released storages whose memory was freed while their record stays (fake
    /// deletes).
    pub fake_deletes: u64,
    /// Of [`RuntimeStats::evictions`]: finished inputs of a pending regeneration
    /// step evicted because nothing else could make room (they are regenerated
    /// again when their consumer runs).
    pub parked_evictions: u64,
    /// Regenerations that hit an impossible budget in creation order and were
    /// retried with the inputs ordered by need.
    pub reordered_regenerations: u64,
    /// Compute paths replayed to rematerialize.
    pub rematerializations: u64,
    /// Allocation attempts that failed and were retried after an eviction.
    pub oom_retries: u64,
    /// Op calls repeated after the real device ran out of memory inside them
    /// ([`crate::OpError::out_of_memory`]) and the runtime evicted.
    pub device_oom_retries: u64,
    /// Allocations that needed at least one eviction.
    pub evicting_allocations: u64,
    /// Sum over [`RuntimeStats::evicting_allocations`] of the free bytes inside the
    /// budget at their first failure (Coop's fragmentation numerator).
    pub free_at_failure_bytes: f64,
    /// Of [`RuntimeStats::free_at_failure_bytes`], for models with pools: the
    /// sums of free bytes in small-pool segments, in large-pool segments, and
    /// not reserved at all (see [`crate::FreeByPool`]).
    pub free_at_failure_by_pool: [f64; 3],
    /// Policy decisions taken.
    pub decisions: u64,
    /// Of [`RuntimeStats::decisions`], under a caching-allocator budget:
    /// those that emptied several whole segments together for one request
    /// (no cached segment held it, and the device had no room for a new
    /// segment). Everything resident in them went, whatever its price: the
    /// allocator's layout, not the live bytes, chose those victims. Where
    /// an online step costs far more than the same step under a logical
    /// budget, this is the count to look at (docs/dtr-results.md, *The
    /// caching allocator's segments*).
    pub segment_releases: u64,
    /// Candidates offered to the policy over all decisions (the sum of the
    /// pools' sizes): how much the decisions had to scan.
    pub candidates_offered: u64,
    /// Bytes of resident storages now.
    pub live_bytes: u64,
    /// Peak of `live_bytes`.
    pub peak_live_bytes: u64,
    /// Iterations ended ([`crate::Runtime::end_iteration`]).
    pub iterations: u64,
    /// Of [`RuntimeStats::evictions`]: evictions a plan scheduled.
    pub planned_evictions: u64,
    /// Defragmentations of an online arena (and the one switch to an arena
    /// when an online iteration thrashes under a caching-allocator model).
    pub defragmentations: u64,
    /// Bytes moved by defragmentation (device-to-device copies a real arena
    /// would make).
    pub defrag_bytes: u64,
    /// What those moves cost at [`crate::DtrConfig::move_bandwidth`] (ns;
    /// 0 where moves are not charged), part of [`RuntimeStats::wall_ns`].
    pub defrag_ns: f64,
    /// Cached free bytes a caching-allocator budget gave back to the device
    /// at iteration boundaries ([`crate::DtrConfig::release_at_boundary`]).
    pub boundary_released_bytes: u64,
    /// Online iterations that were losing (replays past their computations)
    /// and finished under the lineage-priced policy (see
    /// `Runtime::rescue_from_thrashing`).
    pub policy_rescues: u64,
    /// Regenerations that kept what they regenerated until they ended,
    /// because their own replays passed the iteration's computations (see
    /// `Runtime::keep_regenerated`).
    pub kept_regenerations: u64,
    /// Regenerations that replayed what was left of their region once, in a
    /// topological order, because that pass fit the budget: ones that ran
    /// away (also counted in [`RuntimeStats::kept_regenerations`]) and ones
    /// of an online step already losing ([`crate::DtrConfig::ordered_regen`]).
    pub ordered_regenerations: u64,
    /// Ops an ordered pass replayed again to make a value it had dropped
    /// inside the pass ([`crate::DtrConfig::ordered_recompute`]); each is
    /// also a rematerialization.
    pub ordered_recomputes: u64,
    /// Switches from the caching-allocator model to a compacting arena because
    /// no eviction could place an allocation whose working set fits the budget
    /// (segments larger than the budget, or pinned blocks scattered over
    /// segments). At most one per runtime.
    pub arena_fallbacks: u64,
    /// Iterations that left their plan (a call differed from the recorded
    /// iteration, or a plan step could not be taken).
    pub divergences: u64,
    /// Compute stalled waiting for copies to or from the host tier (ns): a
    /// swap-out whose memory was needed before its copy completed, a swap-in
    /// read before its copy completed.
    pub stall_ns: f64,
    /// Storages swapped out to the host tier (those of
    /// [`RuntimeStats::clean_swap_outs`] included).
    pub swap_outs: u64,
    /// Of [`RuntimeStats::swap_outs`]: storages whose clean host copy was
    /// still valid, so nothing was copied.
    pub clean_swap_outs: u64,
    /// Storages an online step copied to the host tier ahead, while the
    /// device-to-host engine was idle, keeping them resident
    /// ([`crate::SwapConfig::copy_ahead`]); their bytes are in
    /// [`RuntimeStats::swapped_out_bytes`], and a later swap-out of one is
    /// clean.
    pub copies_ahead: u64,
    /// Storages swapped back in.
    pub swap_ins: u64,
    /// Of [`RuntimeStats::swap_ins`]: copies a plan started ahead of the
    /// read, once their destination range was free (see
    /// `Runtime::prefetch_issue`); the others started at the read.
    pub prefetches: u64,
    /// Bytes copied to the host tier.
    pub swapped_out_bytes: u64,
    /// Bytes copied back from the host tier.
    pub swapped_in_bytes: u64,
    /// Bytes in the host tier now.
    pub host_bytes: u64,
    /// Peak of [`RuntimeStats::host_bytes`].
    pub peak_host_bytes: u64,
    /// Swap-outs the host budget refused (the storage stayed resident, or was
    /// evicted for recomputation instead).
    pub swap_refusals: u64,
    /// Copies that failed (nothing lost: a failed swap-out leaves the value
    /// resident; a failed swap-in keeps the host copy).
    pub swap_failures: u64,
}

/// The plan adopted for the next iteration, in figures.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSummary {
    /// The portfolio entry that won and its placement
    /// (`learned:next-use/arena`, `remat/placed`, …).
    pub policy: String,
    /// Simulated overhead (first computations plus rematerializations, over
    /// first computations).
    pub overhead: f64,
    /// Bytes of the arena that holds the whole iteration (≤ budget).
    pub arena_bytes: u64,
    /// The logical budget the winning simulation ran under.
    pub simulated_budget: u64,
    /// Planning wall time in ms.
    pub plan_ms: f64,
    /// Simulations run.
    pub simulations: u32,
    /// Rounds of random restarts run.
    pub restart_rounds: u32,
    /// Ops in the planned iteration.
    pub ops: usize,
}

impl From<&crate::plan::IterationPlan> for PlanSummary {
    fn from(p: &crate::plan::IterationPlan) -> Self {
        let ops = crate::record::op_count(&p.recording.events);
        Self {
            policy: p.policy.clone(),
            overhead: p.overhead(),
            arena_bytes: p.arena_bytes,
            simulated_budget: p.simulated_budget,
            plan_ms: p.plan_ms,
            simulations: p.simulations,
            restart_rounds: p.restart_rounds,
            ops,
        }
    }
}

/// What one iteration did ([`crate::Runtime::end_iteration`]).
#[derive(Debug, Clone, PartialEq)]
pub struct IterationReport {
    /// 0 for the first iteration.
    pub index: u32,
    /// The iteration started under a plan.
    pub planned: bool,
    /// Times it left its plan (0 or 1).
    pub divergences: u32,
    /// First computations (ns).
    pub compute_ns: f64,
    /// Rematerializations (ns).
    pub remat_ns: f64,
    /// Evictions.
    pub evictions: u64,
    /// Rematerializations.
    pub rematerializations: u64,
    /// Compute stalled on host-tier copies (ns; 0 with swap off).
    pub stall_ns: f64,
    /// Charged defragmentation moves (ns; [`RuntimeStats::defrag_ns`]).
    pub defrag_ns: f64,
    /// Bytes swapped out to the host tier.
    pub swapped_out_bytes: u64,
    /// Bytes swapped back in.
    pub swapped_in_bytes: u64,
    /// The arena of its plan, when it had one.
    pub arena_bytes: Option<u64>,
    /// Cached free bytes the budget's caching allocator gave back at the
    /// boundary that ended it ([`crate::DtrConfig::release_at_boundary`];
    /// 0 under logical and arena budgets, which cache nothing).
    pub released_bytes: u64,
    /// The runtime had to rescue it online ([`RuntimeStats::rescued_since`]);
    /// its plan may then cost more than it did, up to 2× its first
    /// computations, since its own cost is no figure the next online
    /// iteration repeats.
    pub rescued: bool,
    /// The plan adopted for the next iteration (`None`: it runs online).
    pub next_plan: Option<PlanSummary>,
    /// What happened to planning at this boundary, and why when no plan was
    /// adopted.
    pub planning: PlanStatus,
    /// When the next iteration starts from another state than the ended one
    /// did: what differs, and whether the next iteration was still planned
    /// from the ended one (its recording carried to this boundary).
    pub start_diff: Option<StartDiff>,
    /// With [`PlanStatus::NoPlan`]: what the planner's simulations found
    /// instead of a plan.
    pub no_plan: Option<NoPlan>,
}

/// Why the planner made no plan at a boundary ([`PlanStatus::NoPlan`]): what
/// each of its simulations of the recorded iteration ran into. A plan is a
/// schedule that runs to the end under the budget, whose allocations place in
/// one arena within the budget, and that costs no more than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NoPlan {
    /// The most a plan could cost (ns): what the recorded iteration cost,
    /// or more after a rescued one.
    pub bound_ns: f64,
    /// The recorded iteration's first computations (ns): the unit of the
    /// costs below as overheads.
    pub compute_ns: f64,
    /// The budget a plan's arena must fit (bytes).
    pub budget: u64,
    /// Simulations run.
    pub simulations: u32,
    /// Simulations that found the budget impossible at some allocation: an
    /// op's own inputs and outputs over the (simulated) budget, or, in a
    /// flat arena, enough free bytes but not in one piece.
    pub impossible: u32,
    /// Simulations cut off once they could not cost less than the bound or
    /// the cheapest schedule so far.
    pub too_costly: u32,
    /// Simulations that ran to the end but whose allocations the static
    /// planner could not place within the budget.
    pub over_budget: u32,
    /// The cheapest of those: its cost (ns) and the arena its placement
    /// needed (bytes).
    pub cheapest_unplaced: Option<(f64, u64)>,
    /// The cheapest placed schedule, when it cost more than the bound (ns).
    pub cheapest_over_bound_ns: Option<f64>,
}

impl NoPlan {
    /// Add another planning pass's findings (swap on plans twice): counts add
    /// up, the cheapest schedules are the cheaper of the two.
    pub(crate) fn merge(&mut self, other: &NoPlan) {
        let cheaper = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        self.bound_ns = self.bound_ns.max(other.bound_ns);
        self.compute_ns = self.compute_ns.max(other.compute_ns);
        self.budget = self.budget.max(other.budget);
        self.simulations += other.simulations;
        self.impossible += other.impossible;
        self.too_costly += other.too_costly;
        self.over_budget += other.over_budget;
        self.cheapest_unplaced = match (self.cheapest_unplaced, other.cheapest_unplaced) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        };
        self.cheapest_over_bound_ns =
            cheaper(self.cheapest_over_bound_ns, other.cheapest_over_bound_ns);
    }

    /// `ns` as an overhead over the recorded first computations.
    fn ratio(&self, ns: f64) -> f64 {
        if self.compute_ns > 0.0 {
            ns / self.compute_ns
        } else {
            1.0
        }
    }
}

impl std::fmt::Display for NoPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no plan within {:.3}x: {} simulations, {} impossible, {} cut off as too costly, {} not placeable in the budget",
            self.ratio(self.bound_ns),
            self.simulations,
            self.impossible,
            self.too_costly,
            self.over_budget,
        )?;
        if let Some((ns, arena)) = self.cheapest_unplaced {
            write!(
                f,
                "; the cheapest schedule ({:.3}x) needed a {arena} B arena for a {} B budget",
                self.ratio(ns),
                self.budget
            )?;
        }
        if let Some(ns) = self.cheapest_over_bound_ns {
            write!(f, "; the cheapest placed one cost {:.3}x", self.ratio(ns))?;
        }
        Ok(())
    }
}

/// How the state at a boundary differs from the state the ended iteration
/// started from ([`IterationReport::start_diff`]). The first step of a
/// training run typically starts from nothing and ends with its parameters,
/// inputs and optimizer state live: the difference is what the step itself
/// made, and the next step is planned from the recording carried to the
/// boundary ([`crate::Recording::carried_to`]). Anything else (an op's output
/// kept across the boundary, a start tensor dropped) leaves the next step
/// online, and the boundary after it plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartDiff {
    /// Resident storages at the ended iteration's start.
    pub recorded_storages: usize,
    /// Their bytes.
    pub recorded_bytes: u64,
    /// Live tensors at the ended iteration's start.
    pub recorded_tensors: usize,
    /// Resident storages at this boundary.
    pub boundary_storages: usize,
    /// Their bytes.
    pub boundary_bytes: u64,
    /// Live tensors at this boundary.
    pub boundary_tensors: usize,
    /// Resident storages at this boundary that the ended iteration made
    /// (new versions of start storages it mutated included).
    pub made_storages: usize,
    /// Their bytes.
    pub made_bytes: u64,
    /// Why the ended iteration's recording could not be carried to this
    /// boundary (`None`: it was, and the next iteration's plan was sought
    /// from it; [`IterationReport::planning`] says whether one was found).
    pub not_carried: Option<crate::record::CarryRefusal>,
}

impl std::fmt::Display for StartDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "started from {} storages ({} B) and {} tensors, ended with {} storages ({} B) and {} tensors, {} of them ({} B) made by the iteration; ",
            self.recorded_storages,
            self.recorded_bytes,
            self.recorded_tensors,
            self.boundary_storages,
            self.boundary_bytes,
            self.boundary_tensors,
            self.made_storages,
            self.made_bytes,
        )?;
        match self.not_carried {
            None => f.write_str("its recording was carried to the boundary to plan the next"),
            Some(why) => write!(f, "not planned: {why}"),
        }
    }
}

/// What [`crate::Runtime::end_iteration`] did about the next iteration's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanStatus {
    /// Plan-ahead is off: no budget, a byte threshold, or `plan_ahead:off`.
    Off,
    /// Nothing was recorded (the iteration made no call, or made more than a
    /// recording holds).
    NotRecorded,
    /// A call of the iteration failed: its recording is no program to repeat.
    CallFailed,
    /// The next iteration starts from a different state (other resident sizes
    /// or tensors) than the recorded one did, and the recording could not be
    /// carried to it ([`IterationReport::start_diff`] says what differs and
    /// why): typically a first step whose optimizer makes its updated
    /// parameters with ops. The next boundary plans. (A first step that only
    /// put what it kept is carried: the next step is planned from it.)
    StartDiffers,
    /// The iteration followed its plan exactly; the plan stands. With swap
    /// on, also where the boundary differed from the plan's start only in
    /// which storages were in the host tier and copying those out again
    /// cost no more than a new plan (the copies are the next step's).
    Kept,
    /// A new plan was made.
    Planned,
    /// No simulated schedule both fits the budget and costs no more than the
    /// recorded iteration did; the next iteration runs online.
    NoPlan,
    /// The recording is being planned on a background thread
    /// ([`crate::DtrConfig::plan_background`]); the next iteration runs online.
    Planning,
}

impl PlanStatus {
    /// A short name for reports (`off`, `not-recorded`, `call-failed`,
    /// `start-differs`, `kept`, `planned`, `no-plan`, `planning`).
    pub fn name(self) -> &'static str {
        match self {
            PlanStatus::Off => "off",
            PlanStatus::NotRecorded => "not-recorded",
            PlanStatus::CallFailed => "call-failed",
            PlanStatus::StartDiffers => "start-differs",
            PlanStatus::Kept => "kept",
            PlanStatus::Planned => "planned",
            PlanStatus::NoPlan => "no-plan",
            PlanStatus::Planning => "planning",
        }
    }
}

impl IterationReport {
    /// First computations, rematerializations, stalls on host-tier copies
    /// and charged defragmentation moves: what the iteration took in the cost
    /// model (ns).
    pub fn wall_ns(&self) -> f64 {
        self.compute_ns + self.remat_ns + self.stall_ns + self.defrag_ns
    }

    /// (first computations + rematerializations + stalls on host-tier copies
    /// + charged defragmentation moves) / first computations.
    pub fn overhead(&self) -> f64 {
        if self.compute_ns > 0.0 {
            self.wall_ns() / self.compute_ns
        } else {
            1.0
        }
    }
}

impl RuntimeStats {
    /// Whether the runtime rescued an online iteration since `earlier` (the
    /// stats at its start): moved into a defragmenting arena, fell back to a
    /// compacting one, switched to the lineage-priced policy because its
    /// replays passed its computations, or had a regeneration keep what it
    /// regenerated for the same reason.
    pub fn rescued_since(&self, earlier: &RuntimeStats) -> bool {
        self.defragmentations > earlier.defragmentations
            || self.arena_fallbacks > earlier.arena_fallbacks
            || self.policy_rescues > earlier.policy_rescues
            || self.kept_regenerations > earlier.kept_regenerations
    }

    /// First computations plus rematerializations.
    pub fn total_compute_ns(&self) -> f64 {
        self.compute_ns + self.remat_ns
    }

    /// First computations, rematerializations, stalls on host-tier copies
    /// and charged defragmentation moves: the time the run took in the cost
    /// model (ns).
    pub fn wall_ns(&self) -> f64 {
        self.copy_clock_ns() + self.defrag_ns
    }

    /// The clock the host tier's copies are timed on: first computations,
    /// rematerializations and stalls (ns), what a compute-clock reading plus
    /// the stalls before it converts to. Charged moves stand outside it (the
    /// copies are modelled as waiting while blocks move).
    pub fn copy_clock_ns(&self) -> f64 {
        self.compute_ns + self.remat_ns + self.stall_ns
    }

    /// Coop's fragmentation metric: mean free bytes at allocations that needed
    /// eviction, over `budget`.
    pub fn mean_free_at_failure(&self, budget: u64) -> f64 {
        if self.evicting_allocations == 0 || budget == 0 {
            0.0
        } else {
            self.free_at_failure_bytes / self.evicting_allocations as f64 / budget as f64
        }
    }

    /// [`RuntimeStats::mean_free_at_failure`] split into small pool, large pool
    /// and unreserved bytes (each over `budget`; zeros without pools).
    pub fn mean_free_at_failure_by_pool(&self, budget: u64) -> [f64; 3] {
        if self.evicting_allocations == 0 || budget == 0 {
            return [0.0; 3];
        }
        let n = self.evicting_allocations as f64 * budget as f64;
        self.free_at_failure_by_pool.map(|b| b / n)
    }
}

impl fmt::Display for RuntimeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "compute {:.0} ns + remat {:.0} ns, {} evictions, {} rematerializations, {} OOM retries, \
             live {} B (peak {} B)",
            self.compute_ns,
            self.remat_ns,
            self.evictions,
            self.rematerializations,
            self.oom_retries,
            self.live_bytes,
            self.peak_live_bytes
        )
    }
}
