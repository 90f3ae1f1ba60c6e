//! Iterations: the runtime's side of plan-ahead DTR, in four parts. Each owns
//! its state (a field of [`IterationState`]) and its file; the rest of the
//! runtime calls them through the hooks named below, and the parts call each
//! other only where the table says.
//!
//! | part | state | what it does | hooks the runtime calls |
//! |---|---|---|---|
//! | [`record`] | [`Recorder`] | notes every public call as an [`crate::Event`] of the iteration's [`crate::Recording`], names live tensors ([`crate::Ref`]) | `note` (each public call), `track` (its result), `on_new_tensor`, `on_tensor_gone` |
//! | [`follow`] | [`Follower`] | follows the plan: at each allocation, the plan's evictions (and, in a plan that moves blocks, compactions) there and its offset; a call or step that differs is a divergence; simulations log the steps that become a plan | `planned_alloc` (evict.rs, each allocation), `log_eviction` / `log_step` (evict.rs, in simulations) |
//! | [`rescue`] | [`Rescue`] | an online iteration that is losing: defragmenting arena, lineage-priced policy (MSPS), the arena fallback when the allocator's layout is the floor | `rescue_from_thrashing` (regen.rs, each hold), `rescue_from_fragmentation` (mod.rs, before an op), `fall_back_to_arena` / `defragment` / `note_fragmentation` (evict.rs), `losing_since` (regen.rs) |
//! | [`boundary`] | [`Planning`] | `end_iteration`: freeze the resident, make the evicted stale, name the start state, plan the next iteration (now or on a thread), adopt the plan's layout | the public `end_iteration` and `min_feasible_budget` |
//!
//! The counters that number calls, storages and allocations within the
//! iteration (`pos`, `seq_storages`, `allocs`, `epoch`) belong to the iteration
//! itself: the recorder writes with them, the follower and the planner's
//! simulations name storages and allocations by them.
//!
//! ## How a planned access flows
//!
//! A read of an evicted tensor while the iteration follows its plan:
//!
//! ```text
//! Runtime::access (mod.rs)
//!   └ note ─────────────── record: matches the plan's recording → counted, not recorded
//!   └ hold (regen.rs) ──── rescue_from_thrashing: no-op while following
//!      └ work list: Need → Run → rematerialize (regen.rs)
//!         └ place_all / make_room (evict.rs)
//!            └ planned_alloc ──── follow: the plan's evictions at this allocation
//!               │                 (evict_storage, evict.rs), then the planned
//!               │                 offset (memory::arena::ArenaMemory::allocate_at)
//!               └ None after a divergence → online: policy choice, evictions, retry
//!         └ compute_retrying (regen.rs): the op's handle runs; values bit-identical
//! ```
//!
//! The online path is the same without the plan: `planned_alloc` returns `None`
//! at once and `make_room` asks the policy.
//!
//! The online and planned paths share the same records: the recorder runs in
//! both, so an iteration that diverged is recorded as it really ran and planned
//! again at the next boundary.

mod boundary;
mod follow;
mod record;
mod rescue;

use super::Runtime;
use crate::graph::NONE;
use crate::ids::StorageId;
use crate::plan::IterationPlan;
use crate::stats::RuntimeStats;

pub(crate) use boundary::Planning;
pub(crate) use follow::Follower;
pub(crate) use record::Recorder;
use record::MAX_EVENTS;
pub(crate) use rescue::Rescue;

/// The iteration counters and the state of the iteration machinery's parts.
#[derive(Default)]
pub(crate) struct IterationState {
    /// Iterations ended so far (the current iteration's number).
    pub epoch: u32,
    /// Storages created this iteration, by sequence number.
    pub seq_storages: Vec<StorageId>,
    /// Allocations placed this iteration.
    pub allocs: u32,
    /// Public calls made this iteration.
    pub pos: u32,
    /// Plan ahead at boundaries (budget set, no threshold, `plan_ahead` on).
    pub enabled: bool,
    /// Counters at the iteration's start.
    pub start_stats: RuntimeStats,
    /// Peak allocated and reserved bytes of memory models replaced so far.
    pub retired_peaks: (u64, u64),
    /// The recorder ([`record`]).
    pub recorder: Recorder,
    /// The plan follower and the simulations' step log ([`follow`]).
    pub follower: Follower,
    /// The online rescues ([`rescue`]).
    pub rescue: Rescue,
    /// Planning across boundaries ([`boundary`]).
    pub planning: Planning,
    /// The storages of the boundary this iteration started from, by position
    /// ([`crate::Boundary::storages`]; resident then swapped), and each
    /// one's position by storage index: how a plan names the boundary's
    /// storages it swaps.
    pub prefix: Vec<StorageId>,
    pub prefix_pos: ahash::AHashMap<u32, u32>,
}

impl IterationState {
    /// Name the storages of the boundary the iteration starts from.
    pub(in crate::runtime) fn set_prefix(&mut self, storages: &[StorageId]) {
        self.prefix = storages.to_vec();
        self.prefix_pos = (storages.iter().enumerate())
            .map(|(k, s)| (s.0, k as u32))
            .collect();
    }

    /// The sequence number of the next storage; [`NONE`] past [`MAX_EVENTS`]
    /// storages in one iteration (a run that never calls `end_iteration` must not
    /// grow this table without bound; such storages are never named by a plan).
    pub(in crate::runtime) fn next_seq(&self) -> u32 {
        let n = self.seq_storages.len();
        if n < MAX_EVENTS {
            n as u32
        } else {
            NONE
        }
    }
}

impl<V> Runtime<V> {
    /// The plan being followed this iteration, if any.
    pub fn current_plan(&self) -> Option<&IterationPlan> {
        self.iter.follower.plan.as_deref()
    }

    /// Whether the current iteration still follows its plan.
    pub fn following_plan(&self) -> bool {
        self.iter.follower.following
    }

    /// Iterations ended so far.
    pub fn iteration(&self) -> u32 {
        self.iter.epoch
    }
}
