//! [`DtrConfig`]: the runtime's settings, parsed from `REMAT_DTR_CONF` with the
//! allocator's `key:value,key:value` syntax. A bad key or value is a typed
//! [`ConfigError`] that names it, never a silent default.
//!
//! | key | values | default |
//! |---|---|---|
//! | `budget` | bytes, with optional `KB`/`MB`/`GB`/`KiB`/`MiB`/`GiB` suffix, or `none` | `none` |
//! | `budget_mode` | `physical` \| `logical` | `physical` |
//! | `policy` | see [`PolicyKind::NAMES`] | `remat` |
//! | `sampling` | `on`/`off` (√N random candidates per decision) | `on` |
//! | `filter` | `on`/`off` (ignore candidates < 1 % of the mean size) | `on` |
//! | `min_evictee_bytes` | bytes: storages below are never candidates | `0` |
//! | `threshold` | bytes or `none`: before each op, evict while above, never an input of the op nor a storage whose evicted region would pass 8 storages (a target, not a budget) | `none` |
//! | `seed` | u64 for the sampler | `0x5eed` |
//! | `expandable_segments` | `on`/`off`: physical budgets grow expandable segments | `off` |
//! | `plan_ahead` | `on`/`off`: plan each iteration from the last one at `end_iteration()` | `on` |
//! | `plan_background` | `on`/`off`: plan on a background thread; the next iteration runs online and the plan is followed from the one after | `off` |
//! | `plan_restarts` | 0 ..= 64: rounds of random restarts of the planner's learned entries, in both placements; a recording that is light to simulate also gets its full-scan entries restarted and, under a physical budget, more rounds in the flat arena, up to 64 (0: no restarts at all) | `8` |
//! | `thrash_rescue` | `on`/`off`: an online iteration whose replays pass its computations finishes under `msps` (with plan-ahead; the boundary restores `policy`), and a regeneration whose own replays pass them keeps what it regenerates | `on` |
//! | `swap` | `on`/`off`: swap storages to the host tier when a copy costs less than recomputing them, and non-recomputable ones (parameters, inputs) between uses ([`crate::swap`]) | `off` |
//! | `swap_bandwidth` | GB/s per direction, > 0 (24 for PCIe 4.0 ×16); unset, the adapter measures it, and a runtime with neither refuses swap | unset |
//! | `copy_ahead` | `on`/`off`: with swap on, an online step keeps the idle device-to-host engine copying an old candidate that would be swapped if taken (else the oldest) to the host tier, so its later swap-out frees its memory at once; never changes which victim is taken; needs a transfer whose copies run beside compute ([`crate::swap`], *Copying ahead*) | `on` |
//! | `host_budget` | bytes, `<n>%` of the device budget, or `none`: the most the host tier holds | `none` |
//! | `plan_moves` | `on`/`off`: the planner may make plans that compact their arena as an online step does, its moves charged: where no plan placed without moving blocks fits the budget, and where moves have a price and cost less than the fixed placement's extra evictions (see [`DtrConfig::plan_moves`]) | `on` |
//! | `release_at_boundary` | `on`/`off`: at each iteration boundary a caching-allocator budget gives back its cached free segments (PyTorch's `empty_cache`), so an iteration that runs online starts from the layout the first did (see [`DtrConfig::release_at_boundary`]) | `on` |
//! | `online_arena` | `on`/`off`: under a physical budget, an iteration that runs online places its storages in a compacting arena of the budget from its first op, so only live bytes count (see [`DtrConfig::online_arena`]) | `off` |
//! | `request_stamp` | `on`/`off`: a regeneration stamps the storages it reads as used when it was asked for, not after its replays ran (see [`DtrConfig::request_stamp`]) | `off` |
//! | `online_hold_first` | `on`/`off`: an online step's regenerations hold their resident targets whose lineage is gone before replaying anything, as the planner's simulations always do (see [`DtrConfig::online_hold_first`]) | `off` |
//! | `ordered_regen` | `on`/`off`: a regeneration that runs away, and every regeneration of a losing online step, replays what is left of its region once, in a topological order, where that pass fits the budget, instead of keeping what it regenerates or replaying it op by op (see [`DtrConfig::ordered_regen`]) | `on` |
//! | `ordered_recompute` | `on`/`off`: where the ordered pass over a region does not fit the budget, recompute values inside the pass (each drop one more replay of one op, at most as many drops as the region has ops) until it fits; otherwise the regeneration keeps as before (see [`DtrConfig::ordered_recompute`]) | `off` |
//! | `keep_read_again` | `on`/`off`: a regeneration the thrash rescue makes keep what it regenerates holds only what it reads again (see [`DtrConfig::keep_read_again`]) | `off` |
//! | `move_bandwidth` | GB/s of device memory, > 0, or `none`: what a defragmenting arena's moves cost in the time model (a move of B bytes reads and writes them: 2·B / bandwidth); `none` charges nothing, right where the arena is a placement model and nothing real moves (the adapters) | `none` |
//! | `megengine_cost`, `megengine_memory`, `megengine_staleness`, `megengine_recompute` | exponents / base of MegEngine's score | 1, 1, 1, 1.0001 |
//!
//! The allocator behind a physical budget has its own settings
//! ([`DtrConfig::allocator`], PyTorch's defaults unless set): in code with
//! [`DtrConfig::with_allocator`], for `remat replay` with `--alloc-conf` in
//! `REMAT_ALLOC_CONF` syntax.

use std::fmt;
use std::str::FromStr;

use remat_alloc::AllocatorConfig;

pub use crate::swap::{HostBudget, SwapConfig};

/// The environment variable read by [`DtrConfig::from_env`].
pub const ENV_VAR: &str = "REMAT_DTR_CONF";

/// Thrash limit of an iteration of several that starts without a plan (× its
/// first computations): the first, and any after a boundary that planned
/// nothing. It runs online and may be slow; a budget that needs more is
/// reported as thrash by the replayer, and is no budget
/// [`crate::Runtime::min_feasible_budget`] answers. An iteration that starts
/// on a plan is held to the replayer's thrash limit (2.0).
pub const FIRST_ITERATION_LIMIT: f64 = 20.0;

/// How the budget is accounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum BudgetMode {
    /// A remat-alloc caching allocator over a device whose capacity is the budget:
    /// rounding, segments and fragmentation count; a failed allocation triggers
    /// eviction and a retry.
    #[default]
    Physical,
    /// The sum of live storage bytes (the DTR paper's accounting).
    Logical,
}

impl BudgetMode {
    /// Name used in configs, CLI and JSON.
    pub fn name(self) -> &'static str {
        match self {
            BudgetMode::Physical => "physical",
            BudgetMode::Logical => "logical",
        }
    }
}

impl FromStr for BudgetMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "physical" => Ok(Self::Physical),
            "logical" => Ok(Self::Logical),
            _ => Err(ConfigError::bad("budget_mode", s, "physical | logical")),
        }
    }
}

impl fmt::Display for BudgetMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The eviction policies shipped with remat-dtr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum PolicyKind {
    /// remat's default: h_DTR^eq over a sample, re-ranked by the hole each
    /// eviction opens in the allocator (see [`crate::policy::RematPolicy`]).
    #[default]
    Remat,
    /// h_DTR with the exact evicted neighbourhood e*.
    Dtr,
    /// h_DTR^eq: e* approximated by union-find over evicted components.
    DtrEq,
    /// h_DTR^local: own cost only.
    DtrLocal,
    /// Memory saved per second of recomputation (Capuchin-style, no staleness).
    Msps,
    /// Least recently used.
    Lru,
    /// Largest storage first.
    LargestFirst,
    /// MegEngine's score with free_left + free_right and a recompute-count penalty.
    MegEngine,
    /// Coop-style cheapest contiguous window over address-ordered blocks.
    Coop,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 9] = [
        PolicyKind::Remat,
        PolicyKind::Dtr,
        PolicyKind::DtrEq,
        PolicyKind::DtrLocal,
        PolicyKind::Msps,
        PolicyKind::Lru,
        PolicyKind::LargestFirst,
        PolicyKind::MegEngine,
        PolicyKind::Coop,
    ];
    /// Accepted names, in the order of [`PolicyKind::ALL`].
    pub const NAMES: [&'static str; 9] = [
        "remat",
        "dtr",
        "dtr-eq",
        "dtr-local",
        "msps",
        "lru",
        "largest",
        "megengine",
        "coop",
    ];

    /// Name used in configs, CLI and JSON.
    pub fn name(self) -> &'static str {
        let i = Self::ALL.iter().position(|p| *p == self).unwrap_or(0);
        Self::NAMES[i]
    }
}

impl FromStr for PolicyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let alias = match s {
            "h_dtr" | "dtr-exact" => "dtr",
            "h_dtr_eq" | "dtr_eq" => "dtr-eq",
            "h_dtr_local" | "dtr_local" => "dtr-local",
            "largest-first" | "largest_first" => "largest",
            other => other,
        };
        Self::NAMES
            .iter()
            .position(|n| *n == alias)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| ConfigError::bad("policy", s, &Self::NAMES.join(" | ")))
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Exponents of MegEngine's score `(cost + 1e-3)^a · r^recomputes /
/// (((bytes + free_left + free_right) / MiB)^b · (staleness + 1e-3)^c)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MegEngineParams {
    /// Exponent of the neighbourhood cost.
    pub cost: f64,
    /// Exponent of the memory term.
    pub memory: f64,
    /// Exponent of the staleness term.
    pub staleness: f64,
    /// Base of the recompute-count penalty (`r^recomputes`).
    pub recompute_base: f64,
}

impl Default for MegEngineParams {
    /// MegEngine 1.4's values: 1, 1, 1, 1.0001.
    fn default() -> Self {
        Self {
            cost: 1.0,
            memory: 1.0,
            staleness: 1.0,
            recompute_base: 1.0001,
        }
    }
}

/// Runtime settings. Plain data with builder methods; see the module doc for keys.
#[derive(Debug, Clone, PartialEq)]
pub struct DtrConfig {
    /// Budget in bytes; `None` is unbounded (no eviction ever).
    pub budget: Option<u64>,
    /// How the budget is accounted.
    pub budget_mode: BudgetMode,
    /// Which eviction policy decides.
    pub policy: PolicyKind,
    /// Sample ⌈√N⌉ candidates per decision instead of scanning all N.
    pub sampling: bool,
    /// Ignore candidates smaller than 1 % of the mean candidate size.
    pub filter: bool,
    /// Storages smaller than this are never eviction candidates.
    pub min_evictee_bytes: u64,
    /// Evict before each op while resident bytes exceed this (never the op's
    /// inputs, nor a storage whose evicted region would pass
    /// `Graph::THRESHOLD_REGION` storages: a target, not a budget).
    pub threshold: Option<u64>,
    /// Seed of the candidate sampler (decisions are deterministic for a seed).
    pub seed: u64,
    /// MegEngine score exponents.
    pub megengine: MegEngineParams,
    /// Physical budgets: let the allocator grow expandable segments (PyTorch's
    /// `expandable_segments:True`) instead of fixed 2/20 MiB segments.
    pub expandable_segments: bool,
    /// Settings of the caching allocator behind a physical budget
    /// (`expandable_segments` above turns its expandable segments on too).
    pub allocator: AllocatorConfig,
    /// Plan ahead: record each iteration and, at
    /// [`crate::Runtime::end_iteration`], plan the next one offline (with a budget
    /// and no threshold; see [`crate::planner`]).
    pub plan_ahead: bool,
    /// Plan on a background thread instead of at the boundary: the iteration
    /// after a boundary runs online while its predecessor's recording is
    /// planned, and the plan is followed from the iteration after that, if the
    /// program and the starting state repeat (see
    /// [`crate::Runtime::end_iteration`]).
    pub plan_background: bool,
    /// Rounds of random restarts of the planner's learned entries, each a
    /// perturbed copy simulated exactly (see [`crate::planner`]): more rounds
    /// can find cheaper plans and take longer to plan; 0 turns them off. At
    /// most [`DtrConfig::MAX_PLAN_RESTARTS`]. These rounds run in both
    /// placements. While the planning work stays under a fixed amount per
    /// recorded event (a recording that is light to simulate), the full-scan
    /// entries are restarted in them too, and, under a physical budget, more
    /// rounds follow in the flat arena only, up to the maximum: so this is
    /// the least number of rounds, not the most (only 0 turns every restart
    /// off).
    pub plan_restarts: u32,
    /// With plan-ahead on, an online iteration whose replays pass its first
    /// computations finishes under MSPS, and its boundary restores
    /// [`DtrConfig::policy`] (see [`crate::RuntimeStats::policy_rescues`]); a
    /// regeneration whose own replays pass them keeps what it regenerates
    /// until it ends ([`crate::RuntimeStats::kept_regenerations`]; only what
    /// it reads again with [`DtrConfig::keep_read_again`]). Off: the
    /// configured policy decides every eviction, and a regeneration releases
    /// each input once its op has run. Off trades lstm's lowest budgets for
    /// cheaper first steps on GPT-2 and T5 (the figures: docs/dtr-results.md,
    /// *Where gpt2's and t5_small's first steps pass 3×*).
    pub thrash_rescue: bool,
    /// The host tier: swap storages to host memory when a copy costs less
    /// than recomputing them (see [`crate::swap`]). Off by default.
    pub swap: SwapConfig,
    /// Device memory bandwidth (GB/s) that prices a defragmenting arena's
    /// moves: a move of B bytes reads and writes them, 2·B / bandwidth ns,
    /// added to the time model ([`crate::RuntimeStats::defrag_ns`]). `None`:
    /// moves are not charged, right where the arena is a placement model
    /// over memory the runtime does not move (the adapters: each storage is
    /// its own allocation). The replayer charges them (`remat replay
    /// --move-bandwidth`, 1 500 GB/s unless set).
    pub move_bandwidth: Option<f64>,
    /// Under a physical budget, an iteration that runs online (no plan to
    /// follow) lays its storages out in a compacting arena of the budget from
    /// its first op, instead of in the caching allocator until it is losing
    /// (the fragmentation rescue). An allocation then fails only when the
    /// live bytes (each rounded to the arena's alignment) do not fit, as
    /// under a logical budget, and the moves that open its hole are charged
    /// at [`DtrConfig::move_bandwidth`]. With `policy:dtr,sampling:off,
    /// thrash_rescue:off` it makes the online step the reference: full-scan
    /// h_DTR under the budget's live bytes, whose evictions it takes one for
    /// one (see docs/dtr-results.md, *The reference as a first step*). Off
    /// by default.
    pub online_arena: bool,
    /// A regeneration stamps the storages it reads as last used at the clock
    /// when it was asked for, not at the clock after the replays below it
    /// ran (what the DTR authors' simulator does). Staleness then counts
    /// the program's reads only, and a long cascade's intermediates look as
    /// old as the cascade and go first. With it full-scan h_DTR finishes
    /// lstm at 0.3, resnet50 at 0.3 and mobilenet_v3 at 0.25 under a logical
    /// budget, where it thrashes without; but a value that two replays of
    /// one regeneration read looks stale between them, and on Burn's CTC
    /// gradient at 4 KiB the default policy replays 3 039 times for 573 ops
    /// (197 without). Off by default (docs/dtr-results.md, *A regeneration's
    /// reads stamped at the request*).
    pub request_stamp: bool,
    /// Online steps hold, at each regeneration, the resident targets whose
    /// lineage is gone before replaying anything, as the planner's
    /// simulations always do (the runtime's `hold_first`, in
    /// `runtime/regen.rs`). Over six sampling seeds it takes GPT-2's first
    /// step at 0.5 from 4.24–4.32× to 2.38–2.48× and T5's at 0.4 from
    /// 4.57–5.73× to 1.85–1.97×, but lstm at 0.25 then thrashes in all six
    /// (7.1–7.5× without) and treelstm at 0.3 finishes in one of six (four
    /// without). Off by default (docs/dtr-results.md, *Resident targets held
    /// first*).
    pub online_hold_first: bool,
    /// A regeneration that the thrash rescue makes keep what it regenerates
    /// ([`DtrConfig::thrash_rescue`]) holds only what it reads again: when
    /// keeping starts, the reads still to come are counted over its region,
    /// and each input is released at its last one, instead of every input
    /// being held to the regeneration's end (the runtime's
    /// `keep_regenerated`, in `runtime/regen.rs`). On the PyTorch-logged
    /// traces it takes GPT-2's first steps at 0.5 / 0.4 from 4.25 / 4.65×
    /// to 3.12 / 3.28×, T5's at 0.4 from 4.84× to 2.53× and ResNet-50's at
    /// 0.3 from 17.6× to 7.6×; but Burn's 12-block transformer at 35 % of
    /// its peak (physical, near its floor of 33 %) replays 5.10× its
    /// computations over three steps instead of 2.05×: the values it
    /// releases are lineage the *next* regeneration replays again, which no
    /// count inside one regeneration sees. Off by default
    /// (docs/dtr-results.md, *A kept regeneration that holds only what it
    /// reads again*). With [`DtrConfig::ordered_regen`] (the default) only
    /// a runaway regeneration whose ordered pass does not fit keeps at all;
    /// the figures above are from before it.
    pub keep_read_again: bool,
    /// A regeneration that runs away (the moment the thrash rescue would
    /// make it keep what it regenerates, [`DtrConfig::keep_read_again`]),
    /// and every regeneration of an online step that is already losing
    /// (where the thrash rescue switches policy), first tests whether one
    /// pass over what is left of its evicted region,
    /// its ops in creation order and each value held to its last read in
    /// the region, fits beside what cannot be evicted; where it does, the
    /// region's values with reads left are reserved against eviction and
    /// each op runs once (the runtime's `replay_region_in_order`, in
    /// `runtime/regen_order.rs`, says why this bounds it on any graph).
    /// Where it does not fit, the regeneration keeps as before. On by
    /// default (docs/dtr-results.md, *An ordered pass where the region
    /// fits*).
    pub ordered_regen: bool,
    /// Where the ordered pass ([`DtrConfig::ordered_regen`]) does not fit
    /// the budget, drop values inside it and make each again, by one more
    /// replay of its op, before its next read, choosing the drops that
    /// lower the bytes over the budget the most per ns replayed, until the
    /// pass fits (at most as many drops as the region has ops, so the pass
    /// runs at most twice as many ops); where no drops make it fit, the
    /// regeneration keeps as before. Off by default: on the ten shared
    /// traces it lowers ResNet-50's first step at 0.3 from 19.8× to 12.3×
    /// and finishes it at 0.25 (18.3×), and on a held-out ResNeXt-50 it
    /// raises the first step at 0.3 from 4.57× to 5.42× and no longer
    /// finishes it at 0.25 (docs/dtr-results.md, *Recomputing inside a
    /// region that does not fit*).
    pub ordered_recompute: bool,
    /// At each iteration boundary, a physical (caching-allocator) budget
    /// gives its cached free segments back to the device, as
    /// `torch.cuda.empty_cache()` does; live blocks stay where they are. An
    /// iteration that then runs online (no plan fits, plan-ahead off, a
    /// start the planner cannot carry) places its storages in segments cut
    /// for its own requests, as the first iteration did, not in the ones the
    /// end of the previous iteration left cached. Without it, lstm at 0.3
    /// with plan-ahead off costs 1.365 in its first iteration and passes 20×
    /// in its second; with it the second costs 1.348 (docs/dtr-results.md,
    /// *The online step on a cache the step before left*). Planned
    /// iterations place by their plan and are unaffected. On by default.
    pub release_at_boundary: bool,
    /// Let the planner make plans that move blocks: a schedule simulated in
    /// a compacting arena of the budget, its compactions steps of the plan
    /// that the following iteration makes again, each moved byte charged at
    /// [`DtrConfig::move_bandwidth`] ([`crate::IterationPlan::moves`]).
    /// Every entry is tried so where no schedule placed without moves fits
    /// the budget (else every step runs online: MobileNetV3 at 25 % of its
    /// peak, 2.14× against 1.448 planned with moves); where moves have a
    /// price (`move_bandwidth` set), the winning entry's schedule, and each
    /// entry whose schedule at the full budget cost less than the best plan
    /// but did not place, taken where it costs less (docs/dtr-results.md,
    /// *Plans that move blocks*). With swap on, plans never move blocks. On
    /// by default.
    pub plan_moves: bool,
}

impl Default for DtrConfig {
    fn default() -> Self {
        Self {
            budget: None,
            budget_mode: BudgetMode::Physical,
            policy: PolicyKind::Remat,
            sampling: true,
            filter: true,
            min_evictee_bytes: 0,
            threshold: None,
            seed: 0x5eed,
            megengine: MegEngineParams::default(),
            expandable_segments: false,
            allocator: AllocatorConfig::default(),
            plan_ahead: true,
            plan_background: false,
            plan_restarts: 8,
            thrash_rescue: true,
            swap: SwapConfig::default(),
            move_bandwidth: None,
            online_arena: false,
            request_stamp: false,
            online_hold_first: false,
            keep_read_again: false,
            ordered_regen: true,
            ordered_recompute: false,
            release_at_boundary: true,
            plan_moves: true,
        }
    }
}

impl DtrConfig {
    /// Set the budget.
    pub fn with_budget(mut self, bytes: u64) -> Self {
        self.budget = Some(bytes);
        self
    }
    /// Set the budget mode.
    pub fn with_budget_mode(mut self, mode: BudgetMode) -> Self {
        self.budget_mode = mode;
        self
    }
    /// Set the policy.
    pub fn with_policy(mut self, policy: PolicyKind) -> Self {
        self.policy = policy;
        self
    }
    /// Switch √N sampling.
    pub fn with_sampling(mut self, on: bool) -> Self {
        self.sampling = on;
        self
    }
    /// Switch the small-candidate filter.
    pub fn with_filter(mut self, on: bool) -> Self {
        self.filter = on;
        self
    }
    /// Set the sampler seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Set the allocator settings of physical budgets.
    pub fn with_allocator(mut self, allocator: AllocatorConfig) -> Self {
        self.allocator = allocator;
        self
    }
    /// The settings a physical budget's allocator runs with: [`DtrConfig::allocator`],
    /// with expandable segments on when [`DtrConfig::expandable_segments`] is.
    pub fn physical_allocator(&self) -> AllocatorConfig {
        let mut a = self.allocator.clone();
        a.expandable_segments |= self.expandable_segments;
        a
    }
    /// Set the byte threshold trigger.
    pub fn with_threshold(mut self, bytes: Option<u64>) -> Self {
        self.threshold = bytes;
        self
    }

    /// Turn plan-ahead on or off.
    pub fn with_plan_ahead(mut self, on: bool) -> Self {
        self.plan_ahead = on;
        self
    }

    /// Plan on a background thread (see [`DtrConfig::plan_background`]).
    pub fn with_plan_background(mut self, on: bool) -> Self {
        self.plan_background = on;
        self
    }

    /// Set the planner's rounds of random restarts (see
    /// [`DtrConfig::plan_restarts`]; more than
    /// [`DtrConfig::MAX_PLAN_RESTARTS`] is a [`ConfigError`] from
    /// [`DtrConfig::check`], which [`crate::Runtime::new`] and the planner call).
    pub fn with_plan_restarts(mut self, rounds: u32) -> Self {
        self.plan_restarts = rounds;
        self
    }

    /// The settings' ranges that their types do not enforce: a
    /// [`ConfigError::BadValue`] naming the first value out of range.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.plan_restarts > Self::MAX_PLAN_RESTARTS {
            let value = self.plan_restarts.to_string();
            return Err(ConfigError::bad("plan_restarts", &value, &restarts_range()));
        }
        if let Some(bw) = self.swap.bandwidth_gbps {
            if !(bw.is_finite() && bw > 0.0) {
                return Err(ConfigError::bad(
                    "swap_bandwidth",
                    &bw.to_string(),
                    BANDWIDTH,
                ));
            }
        }
        if let Some(bw) = self.move_bandwidth {
            if !(bw.is_finite() && bw > 0.0) {
                return Err(ConfigError::bad(
                    "move_bandwidth",
                    &bw.to_string(),
                    MOVE_BANDWIDTH,
                ));
            }
        }
        if let Some(HostBudget::PercentOfBudget(p)) = self.swap.host_budget {
            if !(p.is_finite() && p >= 0.0) {
                return Err(ConfigError::bad(
                    "host_budget",
                    &format!("{p}%"),
                    HOST_BUDGET,
                ));
            }
        }
        Ok(())
    }

    /// The most rounds of random restarts: each round simulates every
    /// competing learned or full-scan entry again.
    pub const MAX_PLAN_RESTARTS: u32 = 64;

    /// Turn swapping to the host tier on at `gbps` GB/s per direction
    /// (`None`: swap off). See [`crate::swap`].
    pub fn with_swap(mut self, gbps: Option<f64>) -> Self {
        self.swap.enabled = gbps.is_some();
        self.swap.bandwidth_gbps = gbps;
        self
    }

    /// Limit the host tier (`None`: unbounded).
    pub fn with_host_budget(mut self, budget: Option<HostBudget>) -> Self {
        self.swap.host_budget = budget;
        self
    }

    /// Charge a defragmenting arena's moves at `gbps` GB/s of device memory
    /// (`None`: not charged; see [`DtrConfig::move_bandwidth`]).
    pub fn with_move_bandwidth(mut self, gbps: Option<f64>) -> Self {
        self.move_bandwidth = gbps;
        self
    }

    /// Lay online iterations out in a compacting arena from their first op
    /// (see [`DtrConfig::online_arena`]).
    pub fn with_online_arena(mut self, on: bool) -> Self {
        self.online_arena = on;
        self
    }

    /// Stamp a regeneration's reads at the clock it was asked for (see
    /// [`DtrConfig::request_stamp`]).
    pub fn with_request_stamp(mut self, on: bool) -> Self {
        self.request_stamp = on;
        self
    }

    /// Hold a regeneration's resident targets whose lineage is gone first in
    /// online steps too (see [`DtrConfig::online_hold_first`]).
    pub fn with_online_hold_first(mut self, on: bool) -> Self {
        self.online_hold_first = on;
        self
    }

    /// Make a kept regeneration hold only what it reads again (see
    /// [`DtrConfig::keep_read_again`]).
    pub fn with_keep_read_again(mut self, on: bool) -> Self {
        self.keep_read_again = on;
        self
    }

    /// Replay a runaway regeneration's region once in order where it fits,
    /// or keep what it regenerates as before (see
    /// [`DtrConfig::ordered_regen`]).
    pub fn with_ordered_regen(mut self, on: bool) -> Self {
        self.ordered_regen = on;
        self
    }

    /// Recompute inside an ordered pass that does not fit, or keep as before
    /// (see [`DtrConfig::ordered_recompute`]).
    pub fn with_ordered_recompute(mut self, on: bool) -> Self {
        self.ordered_recompute = on;
        self
    }

    /// Give a caching-allocator budget's cached segments back at each
    /// iteration boundary, or keep them (see [`DtrConfig::release_at_boundary`]).
    pub fn with_release_at_boundary(mut self, on: bool) -> Self {
        self.release_at_boundary = on;
        self
    }

    /// Let the planner make plans that move blocks, or never (see
    /// [`DtrConfig::plan_moves`]).
    pub fn with_plan_moves(mut self, on: bool) -> Self {
        self.plan_moves = on;
        self
    }

    /// Turn the thrash rescue on or off (see [`DtrConfig::thrash_rescue`]).
    pub fn with_thrash_rescue(mut self, on: bool) -> Self {
        self.thrash_rescue = on;
        self
    }

    /// Every key [`DtrConfig::parse`] knows.
    pub const KEYS: &'static [&'static str] = &[
        "budget",
        "budget_mode",
        "policy",
        "sampling",
        "filter",
        "min_evictee_bytes",
        "threshold",
        "seed",
        "expandable_segments",
        "plan_ahead",
        "plan_background",
        "plan_restarts",
        "thrash_rescue",
        "swap",
        "swap_bandwidth",
        "host_budget",
        "copy_ahead",
        "move_bandwidth",
        "online_arena",
        "request_stamp",
        "online_hold_first",
        "keep_read_again",
        "ordered_regen",
        "ordered_recompute",
        "release_at_boundary",
        "plan_moves",
        "megengine_cost",
        "megengine_memory",
        "megengine_staleness",
        "megengine_recompute",
    ];

    /// Parse `key:value,key:value` (whitespace around items is ignored; an empty
    /// string is the default config).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| ConfigError::Syntax(item.to_string()))?;
            match key {
                "budget" => c.budget = parse_opt_bytes(key, value)?,
                "budget_mode" => c.budget_mode = value.parse()?,
                "policy" => c.policy = value.parse()?,
                "sampling" => c.sampling = parse_switch(key, value)?,
                "filter" => c.filter = parse_switch(key, value)?,
                "min_evictee_bytes" => c.min_evictee_bytes = parse_bytes(key, value)?,
                "threshold" => c.threshold = parse_opt_bytes(key, value)?,
                "seed" => {
                    c.seed = value
                        .parse()
                        .map_err(|_| ConfigError::bad(key, value, "an unsigned integer"))?
                }
                "expandable_segments" => c.expandable_segments = parse_switch(key, value)?,
                "plan_ahead" => c.plan_ahead = parse_switch(key, value)?,
                "plan_background" => c.plan_background = parse_switch(key, value)?,
                "plan_restarts" => {
                    c.plan_restarts = value
                        .parse()
                        .ok()
                        .filter(|&n| n <= Self::MAX_PLAN_RESTARTS)
                        .ok_or_else(|| ConfigError::bad(key, value, &restarts_range()))?
                }
                "thrash_rescue" => c.thrash_rescue = parse_switch(key, value)?,
                "online_arena" => c.online_arena = parse_switch(key, value)?,
                "request_stamp" => c.request_stamp = parse_switch(key, value)?,
                "online_hold_first" => c.online_hold_first = parse_switch(key, value)?,
                "keep_read_again" => c.keep_read_again = parse_switch(key, value)?,
                "ordered_regen" => c.ordered_regen = parse_switch(key, value)?,
                "ordered_recompute" => c.ordered_recompute = parse_switch(key, value)?,
                "release_at_boundary" => c.release_at_boundary = parse_switch(key, value)?,
                "plan_moves" => c.plan_moves = parse_switch(key, value)?,
                "swap" => c.swap.enabled = parse_switch(key, value)?,
                "swap_bandwidth" => {
                    c.swap.bandwidth_gbps = Some(
                        value
                            .parse::<f64>()
                            .ok()
                            .filter(|b| b.is_finite() && *b > 0.0)
                            .ok_or_else(|| ConfigError::bad(key, value, BANDWIDTH))?,
                    )
                }
                "host_budget" => c.swap.host_budget = parse_host_budget(key, value)?,
                "copy_ahead" => c.swap.copy_ahead = parse_switch(key, value)?,
                "move_bandwidth" => {
                    c.move_bandwidth = if value == "none" {
                        None
                    } else {
                        Some(
                            value
                                .parse::<f64>()
                                .ok()
                                .filter(|b| b.is_finite() && *b > 0.0)
                                .ok_or_else(|| ConfigError::bad(key, value, MOVE_BANDWIDTH))?,
                        )
                    }
                }
                "megengine_cost" => c.megengine.cost = parse_f64(key, value)?,
                "megengine_memory" => c.megengine.memory = parse_f64(key, value)?,
                "megengine_staleness" => c.megengine.staleness = parse_f64(key, value)?,
                "megengine_recompute" => c.megengine.recompute_base = parse_f64(key, value)?,
                _ => return Err(ConfigError::UnknownKey(key.to_string())),
            }
        }
        Ok(c)
    }

    /// Read [`ENV_VAR`]; unset is the default config.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(ENV_VAR) {
            Ok(s) => Self::parse(&s),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(ConfigError::bad(ENV_VAR, "<non-unicode>", "UTF-8 text"))
            }
        }
    }
}

/// A bad `REMAT_DTR_CONF`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An item without `key:value` shape.
    #[error("REMAT_DTR_CONF: `{0}` is not `key:value`")]
    Syntax(String),
    /// A key remat-dtr does not know.
    #[error("REMAT_DTR_CONF: unknown key `{0}` (known: {keys})", keys = DtrConfig::KEYS.join(", "))]
    UnknownKey(String),
    /// A known key with a bad value.
    #[error("REMAT_DTR_CONF: bad value `{value}` for `{key}`: expected {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What would have been accepted.
        expected: String,
    },
}

impl ConfigError {
    pub(crate) fn bad(key: &str, value: &str, expected: &str) -> Self {
        ConfigError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }
}

/// What `plan_restarts` accepts, for its errors.
/// What `swap_bandwidth` takes.
const BANDWIDTH: &str = "a bandwidth in GB/s per direction, a finite number above 0 (e.g. 24)";
/// What `move_bandwidth` takes.
const MOVE_BANDWIDTH: &str =
    "none, or a device memory bandwidth in GB/s, a finite number above 0 (e.g. 1500)";
/// What `host_budget` takes.
const HOST_BUDGET: &str =
    "none, a byte count such as 64GiB, or a percentage of the device budget such as 400%";

fn parse_host_budget(key: &str, v: &str) -> Result<Option<HostBudget>, ConfigError> {
    if v == "none" {
        return Ok(None);
    }
    if let Some(p) = v.strip_suffix('%') {
        return p
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .map(|p| Some(HostBudget::PercentOfBudget(p)))
            .ok_or_else(|| ConfigError::bad(key, v, HOST_BUDGET));
    }
    parse_bytes(key, v)
        .map(|b| Some(HostBudget::Bytes(b)))
        .map_err(|_| ConfigError::bad(key, v, HOST_BUDGET))
}

fn restarts_range() -> String {
    format!("an integer from 0 to {}", DtrConfig::MAX_PLAN_RESTARTS)
}

fn parse_switch(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(ConfigError::bad(key, v, "on | off")),
    }
}

fn parse_f64(key: &str, v: &str) -> Result<f64, ConfigError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| ConfigError::bad(key, v, "a finite number"))
}

fn parse_opt_bytes(key: &str, v: &str) -> Result<Option<u64>, ConfigError> {
    if v == "none" {
        Ok(None)
    } else {
        parse_bytes(key, v).map(Some)
    }
}

/// Parse a byte count: digits with an optional unit suffix (`B`, `KB`, `MB`, `GB`,
/// `KiB`, `MiB`, `GiB`, `TiB`); a fractional number is allowed with a unit.
pub fn parse_bytes(key: &str, v: &str) -> Result<u64, ConfigError> {
    let expected = "a byte count such as 1048576, 512MiB or 1.5GB";
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = (v[..split].trim(), v[split..].trim());
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(ConfigError::bad(key, v, expected)),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| ConfigError::bad(key, v, expected));
    }
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && mult > 1 && x * (mult as f64) < 1.8e19 => {
            Ok((x * mult as f64).round() as u64)
        }
        _ => Err(ConfigError::bad(key, v, expected)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let c = DtrConfig::parse(
            "budget:2GiB, budget_mode:logical,policy:dtr-eq,sampling:off,filter:off,\
             min_evictee_bytes:1KiB,threshold:1.5GB,seed:7,megengine_recompute:1.5,\
             thrash_rescue:off,plan_restarts:0,online_arena:on,request_stamp:on,\
             online_hold_first:on,keep_read_again:on,release_at_boundary:off,copy_ahead:off,\
             plan_moves:off,ordered_regen:off,ordered_recompute:on",
        )
        .unwrap();
        assert_eq!(c.budget, Some(2 << 30));
        assert_eq!(c.budget_mode, BudgetMode::Logical);
        assert_eq!(c.policy, PolicyKind::DtrEq);
        assert!(!c.sampling && !c.filter);
        assert_eq!(c.min_evictee_bytes, 1024);
        assert_eq!(c.threshold, Some(1_500_000_000));
        assert_eq!(c.seed, 7);
        assert_eq!(c.megengine.recompute_base, 1.5);
        assert!(!c.thrash_rescue && DtrConfig::default().thrash_rescue);
        assert_eq!(c.plan_restarts, 0);
        assert_eq!(DtrConfig::default().plan_restarts, 8);
        assert!(c.online_arena && !DtrConfig::default().online_arena);
        assert!(c.request_stamp && !DtrConfig::default().request_stamp);
        assert!(c.online_hold_first && !DtrConfig::default().online_hold_first);
        assert!(c.keep_read_again && !DtrConfig::default().keep_read_again);
        assert!(!c.ordered_regen && DtrConfig::default().ordered_regen);
        assert!(c.ordered_recompute && !DtrConfig::default().ordered_recompute);
        assert!(!c.release_at_boundary && DtrConfig::default().release_at_boundary);
        assert!(!c.plan_moves && DtrConfig::default().plan_moves);
        assert!(!c.swap.copy_ahead && DtrConfig::default().swap.copy_ahead);
        assert_eq!(DtrConfig::parse("").unwrap(), DtrConfig::default());
    }

    #[test]
    fn move_bandwidth_parses_and_names_what_is_allowed() {
        assert_eq!(DtrConfig::default().move_bandwidth, None);
        let c = DtrConfig::parse("move_bandwidth:1500").unwrap();
        assert_eq!(c.move_bandwidth, Some(1500.0));
        assert_eq!(
            DtrConfig::parse("move_bandwidth:none")
                .unwrap()
                .move_bandwidth,
            None
        );
        for bad in ["0", "-2", "fast", "inf", "NaN"] {
            let e = DtrConfig::parse(&format!("move_bandwidth:{bad}")).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("move_bandwidth") && text.contains("GB/s"),
                "{text}"
            );
        }
        let e = DtrConfig::default()
            .with_move_bandwidth(Some(-1.0))
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("move_bandwidth"), "{e}");
    }

    #[test]
    fn swap_keys_parse_and_name_what_is_allowed() {
        let c = DtrConfig::parse("swap:on,swap_bandwidth:24,host_budget:400%").unwrap();
        assert!(c.swap.enabled);
        assert_eq!(c.swap.bandwidth_gbps, Some(24.0));
        assert_eq!(c.swap.host_budget, Some(HostBudget::PercentOfBudget(400.0)));
        let c = DtrConfig::parse("host_budget:64GiB").unwrap();
        assert_eq!(c.swap.host_budget, Some(HostBudget::Bytes(64 << 30)));
        assert!(!c.swap.enabled, "a host budget alone does not turn swap on");
        assert_eq!(
            DtrConfig::parse("host_budget:none")
                .unwrap()
                .swap
                .host_budget,
            None
        );
        for (item, expected) in [
            ("swap_bandwidth:0", "GB/s"),
            ("swap_bandwidth:-3", "GB/s"),
            ("swap_bandwidth:fast", "GB/s"),
            ("swap_bandwidth:inf", "GB/s"),
            ("host_budget:-5%", "percentage"),
            ("host_budget:lots", "percentage"),
            ("swap:sometimes", "on | off"),
        ] {
            let e = DtrConfig::parse(item).unwrap_err().to_string();
            assert!(e.contains(expected), "{item}: {e}");
        }
        let mut c = DtrConfig::default().with_swap(Some(12.0));
        assert!(c.swap.enabled && c.check().is_ok());
        c.swap.bandwidth_gbps = Some(f64::NAN);
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .contains("swap_bandwidth"));
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(
            DtrConfig::parse("bogus:1"),
            Err(ConfigError::UnknownKey("bogus".into()))
        );
        assert!(matches!(
            DtrConfig::parse("budget"),
            Err(ConfigError::Syntax(_))
        ));
        match DtrConfig::parse("policy:fifo") {
            Err(ConfigError::BadValue { key, value, .. }) => {
                assert_eq!((key.as_str(), value.as_str()), ("policy", "fifo"))
            }
            other => panic!("{other:?}"),
        }
        assert!(DtrConfig::parse("budget:12XB").is_err());
        assert!(DtrConfig::parse("sampling:maybe").is_err());
        for bad in ["65", "-1", "8.5", "many"] {
            let e = DtrConfig::parse(&format!("plan_restarts:{bad}")).unwrap_err();
            assert!(e.to_string().contains("from 0 to 64"), "{e}");
        }
        assert_eq!(
            DtrConfig::parse("plan_restarts:64").unwrap().plan_restarts,
            64
        );
        // Set in code, the same range is checked, never clamped.
        let c = DtrConfig::default().with_plan_restarts(65);
        assert_eq!(c.plan_restarts, 65);
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("`plan_restarts`") && e.contains("from 0 to 64"),
            "{e}"
        );
        assert!(DtrConfig::default().with_plan_restarts(64).check().is_ok());
        let r = crate::Runtime::<u64>::new(DtrConfig::default().with_plan_restarts(65));
        assert!(matches!(r, Err(crate::Error::Config(_))));
        assert!(DtrConfig::parse("budget:99999999999999999999").is_err());
    }

    #[test]
    fn every_listed_key_is_known_and_every_known_key_is_listed() {
        for key in DtrConfig::KEYS {
            // A bad value for a known key is a BadValue, never UnknownKey.
            let err = DtrConfig::parse(&format!("{key}:\u{1}")).unwrap_err();
            assert!(!matches!(err, ConfigError::UnknownKey(_)), "{key}: {err}");
        }
        // The keys of the module doc's table are the listed ones.
        let doc = include_str!("config.rs");
        let mut documented: Vec<&str> = doc
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .filter_map(|l| l.strip_prefix("//! | `"))
            .flat_map(|l| {
                let cell = l.split(" |").next().unwrap_or("");
                cell.split(", ").map(|k| k.trim_matches('`'))
            })
            .collect();
        let mut listed = DtrConfig::KEYS.to_vec();
        listed.sort_unstable();
        documented.sort_unstable();
        assert_eq!(documented, listed);
        let msg = ConfigError::UnknownKey("bogus".into()).to_string();
        assert!(DtrConfig::KEYS.iter().all(|k| msg.contains(k)), "{msg}");
    }

    #[test]
    fn policy_names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), p);
        }
    }
}
