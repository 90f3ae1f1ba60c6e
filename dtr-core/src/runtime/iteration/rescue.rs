//! The online rescues: what an iteration that runs online (no plan, or after a
//! divergence) does when it is losing.
//!
//! - **Fragmentation.** Under a physical budget, an allocator that fragments
//!   (a failed allocation with a fifth of the budget free) or an iteration that
//!   is losing (replays past its computations) moves into a defragmenting
//!   arena at its next op ([`Runtime::rescue_from_fragmentation`],
//!   [`Runtime::defragment`]).
//! - **Thrashing.** A losing online iteration, in either budget mode, finishes
//!   under the lineage-priced policy (MSPS) instead of the configured one
//!   ([`Runtime::rescue_from_thrashing`]); the boundary restores the configured
//!   policy. Under a physical budget it first moves into the arena above
//!   and switches only if it loses again there. A regeneration that alone
//!   makes it lose keeps what it regenerates until it ends (with
//!   `keep_read_again`, while it reads it again; `Runtime::keep_regenerated`,
//!   in `regen.rs`).
//! - **From the start** (`online_arena:on`): an online iteration under a
//!   physical budget is laid out in that arena at its first op, so only its
//!   live bytes count ([`crate::DtrConfig::online_arena`]).
//! - **Fallback.** Under a physical budget, an allocation that no eviction can
//!   place while the working set fits the budget moves the runtime into the
//!   same arena, plan-ahead or not ([`Runtime::fall_back_to_arena`]): the
//!   budget, not PyTorch's segment sizes, is the floor.

use super::super::Runtime;
use crate::config::PolicyKind;
use crate::error::Result;
use crate::ids::StorageId;
use crate::memory::arena::{arena_size, ArenaMemory};
use crate::memory::MemoryModel;
use crate::policy::{make_policy, EvictionPolicy};

/// Share of the budget that, free but unusable at a failed allocation, marks the
/// layout as the problem. Failed allocations of a working set that simply does
/// not fit find little free (a few percent of the budget on the DTR traces);
/// a layout that fragmented under eviction leaves far more (over a third on
/// treelstm's small-pool requests).
const FRAGMENTED_SHARE: f64 = 0.2;

/// The rescues' state.
#[derive(Default)]
pub(crate) struct Rescue {
    /// An allocation failed with a large share of the budget free but in
    /// pieces (see [`Runtime::note_fragmentation`]).
    pub fragmented: bool,
    /// The configured policy, set aside while a losing online iteration runs
    /// under the lineage-priced one ([`Runtime::rescue_from_thrashing`]);
    /// restored at the boundary.
    pub set_aside_policy: Option<Box<dyn EvictionPolicy>>,
    /// `(replays, first computations)` so far (ns) when this iteration
    /// moved into the compacting arena; `None` before (or in an iteration
    /// that started there).
    pub arena_since: Option<(f64, f64)>,
}

impl<V> Runtime<V> {
    /// Whether this runtime may move blocks: plan-ahead on, not a planner
    /// simulation (its offsets become a plan), not following a plan.
    pub(super) fn may_defragment(&self) -> bool {
        self.iter.enabled && self.can_move()
    }

    /// Whether this runtime may move resident blocks at all: not a planner
    /// simulation (its offsets become a plan), not following a plan.
    pub(super) fn can_move(&self) -> bool {
        self.iter.follower.plan_log.is_none() && !self.iter.follower.following
    }

    /// Whether [`Runtime::defragment`] may move blocks at all: online, or
    /// following (or simulating) a plan that moves them.
    fn may_move_blocks(&self) -> bool {
        self.can_move() || self.iter.follower.moving
    }

    /// Whether [`Runtime::defragment`] would move blocks of this memory.
    pub(in crate::runtime) fn defragmenting(&self) -> bool {
        self.may_move_blocks() && self.memory.can_compact()
    }

    /// Called where no allocation is in flight (before an op places its
    /// outputs): an online iteration under a physical budget whose replays have
    /// cost more than its first computations is losing to fragmentation; lay
    /// its resident storages out compactly in an [`ArenaMemory`] of the budget,
    /// which can then be defragmented ([`Runtime::defragment`]).
    ///
    /// With [`crate::DtrConfig::online_arena`], an online runtime that may
    /// move blocks (plan-ahead on or off) moves into the arena at its first
    /// op instead, losing or not.
    pub(in crate::runtime) fn rescue_from_fragmentation(&mut self) -> Result<()> {
        if !self.can_move() || !self.memory.has_addresses() || self.memory.can_compact() {
            return Ok(());
        }
        // Without `online_arena`, only a losing or fragmented step moves.
        let rescue = self.may_defragment()
            && (self.losing() || self.graph.thrashing() || self.iter.rescue.fragmented);
        if !self.config.online_arena && !rescue {
            return Ok(());
        }
        self.iter.rescue.fragmented = false;
        if self.pack_into_arena()? {
            tracing::debug!(target: "remat_dtr::plan", "thrashing online: switched to a defragmented arena");
        }
        Ok(())
    }

    /// Whether this iteration's replays have cost more than its first
    /// computations so far: past 2×, failing by the replayer's measure.
    pub(in crate::runtime) fn losing(&self) -> bool {
        self.losing_since(self.iter.start_stats.remat_ns)
    }

    /// Whether the replays since the replay cost was `remat_ns` alone cost more
    /// than this iteration's first computations so far.
    pub(in crate::runtime) fn losing_since(&self, remat_ns: f64) -> bool {
        self.stats.remat_ns - remat_ns > self.stats.compute_ns - self.iter.start_stats.compute_ns
    }

    /// Whether the thrash rescues may act: plan-ahead on, `thrash_rescue` on,
    /// online (not a planner simulation, not following a plan).
    pub(in crate::runtime) fn may_rescue(&self) -> bool {
        self.iter.enabled && self.config.thrash_rescue && self.can_move()
    }

    /// An online iteration (plan-ahead on, either budget mode) that is losing
    /// ([`Runtime::losing`]) goes on, until its boundary, under MSPS: each
    /// candidate priced by the recompute cost of the whole evicted lineage its
    /// eviction would create, per byte, with no staleness term. Staleness-based
    /// scores (h_DTR, remat's) can cascade under extreme pressure: they evict
    /// the links next to an evicted chain, whose replays then evict the next
    /// links. A lineage price rises with every eviction nearby, so it spreads
    /// the evictions out instead. Only the first iteration of a training run
    /// should need this: the iterations after it follow a plan. Called before
    /// each hold (an op's inputs, a read, a pin), where no allocation is in
    /// flight.
    ///
    /// Under a physical budget the layout is rescued first. A step can lose
    /// for two reasons: the allocator's layout choosing its victims (whole
    /// segments emptied for one large request, holes too small for the
    /// next), which the compacting arena removes, and a price that cascades,
    /// which only another price removes. So a losing step that is not in the
    /// arena moves into it ([`Runtime::rescue_from_fragmentation`]) and keeps
    /// its policy; it switches only if it loses again there: its replays since
    /// the move pass its first computations since the move. GPT-2's first
    /// step at 0.5 of its peak loses to its layout: switched at once, it cost
    /// 4.25× its computations, moved first 3.83× (lstm at 0.25 and 0.2,
    /// whose loss is a cascade, switch as before: `docs/dtr-results.md`,
    /// session 37).
    pub(in crate::runtime) fn rescue_from_thrashing(&mut self) -> Result<()> {
        if !self.may_rescue()
            || self.iter.rescue.set_aside_policy.is_some()
            || self.config.policy == PolicyKind::Msps
            || !self.losing()
        {
            return Ok(());
        }
        if self.memory.has_addresses() && !self.memory.can_compact() {
            self.rescue_from_fragmentation()?;
            if self.memory.can_compact() {
                return Ok(());
            }
        }
        if let (true, Some((remat, compute))) =
            (self.memory.can_compact(), self.iter.rescue.arena_since)
        {
            if self.stats.remat_ns - remat <= self.stats.compute_ns - compute {
                return Ok(());
            }
        }
        let rescue = make_policy(PolicyKind::Msps, &self.config);
        self.iter.rescue.set_aside_policy = Some(std::mem::replace(&mut self.policy, rescue));
        self.stats.policy_rescues += 1;
        tracing::debug!(target: "remat_dtr::plan", "thrashing online: switched to the lineage-priced policy until the boundary");
        Ok(())
    }

    /// The last resort of an allocation under a physical budget: no eviction
    /// can make room for `request` (the bytes of the allocations being placed
    /// together), yet the storages that must stay resident and the request fit
    /// the budget. The allocator's layout is then what fails (PyTorch's 2 MiB
    /// and 20 MiB segments larger than the budget, or the few blocks that must
    /// stay scattered over several segments), not the budget: the runtime lays
    /// its storages out itself, in a compacting [`ArenaMemory`] of the budget,
    /// for the rest of its life. `false` (nothing changed) when the working set
    /// does not fit either, or in a model that cannot move.
    ///
    /// With this, every budget at or above the working set (each storage
    /// rounded to [`crate::memory::arena::ARENA_ALIGN`]) is feasible in the physical
    /// mode too, whatever the size of the model.
    pub(in crate::runtime) fn fall_back_to_arena(&mut self, request: &[u64]) -> Result<bool> {
        if !self.can_move() || !self.memory.has_addresses() || self.memory.can_compact() {
            return Ok(false);
        }
        let Some(capacity) = self.memory.capacity() else {
            return Ok(false);
        };
        let resident: u64 = self
            .graph
            .storages
            .iter()
            .filter(|(_, r)| r.slot.is_some())
            .map(|(_, r)| arena_size(r.bytes))
            .sum();
        let needed: u64 = request.iter().map(|&b| arena_size(b)).sum();
        if resident.saturating_add(needed) > capacity {
            return Ok(false);
        }
        if !self.pack_into_arena()? {
            return Ok(false);
        }
        self.stats.arena_fallbacks += 1;
        tracing::debug!(
            target: "remat_dtr::oom",
            resident, needed, capacity,
            "the allocator's layout cannot hold a working set that fits: switched to a compacting arena"
        );
        Ok(true)
    }

    /// Move every resident storage into a fresh [`ArenaMemory`] of the budget,
    /// packed in address order. `false` for a model without a capacity.
    pub(super) fn pack_into_arena(&mut self) -> Result<bool> {
        let Some(capacity) = self.memory.capacity() else {
            return Ok(false);
        };
        let mut residents: Vec<(u64, StorageId)> = self
            .graph
            .storages
            .iter()
            .filter_map(|(i, r)| r.slot.as_ref().map(|sl| (sl.ptr, StorageId(i))))
            .collect();
        residents.sort_unstable();
        let mut at = 0u64;
        let placed: Vec<(StorageId, u64)> = residents
            .into_iter()
            .map(|(_, s)| {
                let offset = at;
                at += arena_size(self.graph.st(s).bytes);
                (s, offset)
            })
            .collect();
        self.move_into_arena(ArenaMemory::new(capacity, 0), placed.into_iter())?;
        self.iter.rescue.arena_since = Some((self.stats.remat_ns, self.stats.compute_ns));
        self.stats.defragmentations += 1;
        Ok(true)
    }

    /// An allocation of `bytes` found no room with `free_bytes` free: when at
    /// least [`FRAGMENTED_SHARE`] of the budget is free but unusable, the
    /// allocator's layout, not the working set, is what fails; the next op
    /// switches to a defragmenting arena ([`Runtime::rescue_from_fragmentation`]).
    pub(in crate::runtime) fn note_fragmentation(&mut self, bytes: u64, free_bytes: u64) {
        if let Some(capacity) = self.memory.capacity() {
            if free_bytes >= bytes && free_bytes as f64 >= FRAGMENTED_SHARE * capacity as f64 {
                self.iter.rescue.fragmented = true;
            }
        }
    }

    /// Defragment the arena (blocks of allocations in flight stay): with
    /// `need`, move only the resident storages of the window that opens one
    /// free run of `need` bytes at the least bytes moved, else slide every
    /// resident storage down. `false` when the model cannot.
    pub(in crate::runtime) fn defragment(&mut self, need: Option<u64>) -> Result<bool> {
        if !self.may_move_blocks() {
            return Ok(false);
        }
        self.refresh_by_ptr();
        let by_ptr = &self.by_ptr;
        let Some(moves) = self.memory.compact(&|p| by_ptr.contains_key(&p), need) else {
            return Ok(false);
        };
        let moved: Vec<(StorageId, u64)> = moves
            .iter()
            .filter_map(|&(old, new)| self.by_ptr.get(&old).map(|&s| (s, new)))
            .collect();
        for &(old, _) in &moves {
            self.by_ptr.remove(&old);
        }
        let before = self.stats.defrag_bytes;
        for (s, new) in moved {
            self.by_ptr.insert(new, s);
            if let Some(slot) = self.graph.st_mut(s).slot.as_mut() {
                slot.ptr = new;
                self.stats.defrag_bytes += slot.size;
            }
        }
        // Each moved byte is read and written once (GB/s = B/ns).
        if let Some(gbps) = self.config.move_bandwidth {
            self.stats.defrag_ns += 2.0 * (self.stats.defrag_bytes - before) as f64 / gbps;
        }
        self.stats.defragmentations += 1;
        Ok(true)
    }

    /// Swap the memory model, keeping the old one's peaks for
    /// [`Runtime::memory_usage`].
    pub(super) fn replace_memory(&mut self, memory: Box<dyn MemoryModel>) {
        let u = self.memory.usage();
        let (a, r) = self.iter.retired_peaks;
        self.iter.retired_peaks = (a.max(u.peak_allocated), r.max(u.peak_reserved));
        self.memory = memory;
    }
}
