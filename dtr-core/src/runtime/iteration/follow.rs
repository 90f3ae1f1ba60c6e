//! The plan follower: at each allocation of an iteration that follows its
//! plan, take the evictions the plan made there and place the allocation at
//! its planned offset in one [`ArenaMemory`]. The first call that differs from
//! the plan's recording, or a plan step that cannot be taken, is a divergence
//! ([`Runtime::diverge`]): the rest of the iteration runs online.
//!
//! The planner's simulations write the same steps the follower reads: a
//! simulation logs its policy evictions and failed allocations
//! ([`Runtime::log_eviction`]), and the log becomes the plan.

use std::sync::Arc;

use super::super::Runtime;
use crate::error::{Error, Result};
use crate::graph::NONE;
use crate::ids::{StorageId, TensorId};
use crate::memory::arena::{arena_size, ArenaLayout, ArenaMemory};
use crate::memory::{MemoryModel, Slot};
use crate::plan::{Cursor, IterationPlan, PlanStep, StepKind};
use crate::planner::prefetch::{SimTimes, SwapInTime};

/// The follower's state (and the simulations' step log).
#[derive(Default)]
pub(crate) struct Follower {
    /// The plan of this iteration.
    pub plan: Option<Arc<IterationPlan>>,
    /// The arena layout of a plan (its allocations and their predecessors),
    /// made once per plan and shared by the arenas of the iterations that
    /// follow it.
    pub layout: Option<(Arc<IterationPlan>, Arc<ArenaLayout>)>,
    /// Still following `plan` (no divergence yet).
    pub following: bool,
    /// Calls of this iteration that matched the plan's recording and were
    /// therefore not recorded one by one: the plan's recording stands for them
    /// (copied into the recording at a divergence, see [`Runtime::diverge`]).
    pub matched: usize,
    /// The next plan step to take.
    pub cursor: Cursor,
    /// Divergences this iteration.
    pub divergences: u32,
    /// Order regeneration inputs by creation, not slab index (while following
    /// a plan, and in simulations that make one).
    pub stable_order: bool,
    /// Simulations log their policy evictions and failed allocations here to
    /// become a plan.
    pub plan_log: Option<Vec<PlanStep>>,
    /// Since when nothing needed each planned allocation of the arena's
    /// layout, for those freed this iteration (the wall clock, ns; NaN: not
    /// freed yet): a swap-in placed over them may start its copy then
    /// ([`Runtime::release_slot`], [`Runtime::prefetch_issue`]).
    pub freed_at: Vec<f64>,
    /// Simulations that log a plan also log when they freed each slot and
    /// when they read each swap-in, so the planner can re-time the swap-ins
    /// as the follower will prefetch them ([`crate::planner::prefetch`]).
    pub sim_times: Option<SimTimes>,
    /// Blocks may move while following a plan or simulating one: the plan
    /// (or the simulation that may become one) compacts its arena
    /// ([`IterationPlan::moves`]), and the moves are its steps.
    pub moving: bool,
}

impl<V> Runtime<V> {
    /// Log a policy eviction of `s` (simulations that become plans).
    pub(in crate::runtime) fn log_eviction(&mut self, s: StorageId, parked: bool) {
        if self.iter.follower.plan_log.is_some() {
            let seq = self.graph.st(s).seq;
            let kind = if parked {
                StepKind::EvictParked(seq)
            } else {
                StepKind::Evict(seq)
            };
            self.log_step(kind);
        }
    }

    /// Log a swap-out of `s` (simulations that become plans): by sequence
    /// number, else by its position in the boundary the iteration started
    /// from. A storage neither names (past the sequence numbers' table) is
    /// not logged: a plan follower then diverges at the allocation it made
    /// room for.
    pub(in crate::runtime) fn log_swap(&mut self, s: StorageId, parked: bool) {
        if self.iter.follower.plan_log.is_none() {
            return;
        }
        let seq = self.graph.st(s).seq;
        let named = if self.iter.seq_storages.get(seq as usize) == Some(&s) {
            Some((seq, false))
        } else {
            self.iter.prefix_pos.get(&s.0).map(|&p| (p, true))
        };
        if let Some((at, prefix)) = named {
            self.log_step(StepKind::SwapOut { at, prefix, parked });
        }
    }

    /// Log an allocation that failed as impossible (simulations).
    pub(in crate::runtime) fn log_step(&mut self, kind: StepKind) {
        let at = self.iter.allocs;
        if let Some(log) = &mut self.iter.follower.plan_log {
            log.push(PlanStep { at, kind });
        }
    }

    pub(super) fn diverge(&mut self, why: &str) {
        if self.iter.follower.following {
            // The calls that matched were not recorded: the plan's recording
            // of them is this iteration's up to here.
            let n = self.iter.follower.matched;
            if let (Some(rec), Some(plan)) = (
                self.iter.recorder.recording.as_mut(),
                self.iter.follower.plan.as_ref(),
            ) {
                rec.events.extend_from_slice(&plan.recording.events[..n]);
                rec.reads.extend_from_slice(&plan.recording.reads[..n]);
            }
            self.iter.follower.matched = 0;
            self.iter.follower.following = false;
            self.iter.follower.stable_order = false;
            self.iter.follower.divergences += 1;
            self.stats.divergences += 1;
            tracing::debug!(target: "remat_dtr::plan", call = self.graph.pos, allocation = self.iter.allocs, why, "left the plan");
        }
    }

    /// Following a plan: take its evictions for the next allocation and place
    /// `bytes` at its planned offset. `None` after a divergence (the caller
    /// allocates online).
    pub(in crate::runtime) fn planned_alloc(&mut self, bytes: u64) -> Result<Option<Slot>> {
        let Some(plan) = self.iter.follower.plan.clone() else {
            return Ok(None);
        };
        let n = self.iter.allocs;
        while let Some(&step) = plan.steps.get(self.iter.follower.cursor.next_step) {
            if step.at > n {
                break;
            }
            self.iter.follower.cursor.next_step += 1;
            if step.at < n {
                self.diverge("a planned step was skipped");
                return Ok(None);
            }
            let (seq, parked) = match step.kind {
                StepKind::Evict(seq) => (seq, false),
                StepKind::EvictParked(seq) => (seq, true),
                // The simulation found this allocation impossible here and its
                // regeneration retried: fail it the same way.
                StepKind::Fail => return Err(self.impossible(bytes)),
                StepKind::SwapOut { at, prefix, parked } => {
                    if !self.planned_swap_out(at, prefix, parked)? {
                        self.diverge("a planned swap-out could not be taken");
                        return Ok(None);
                    }
                    continue;
                }
                StepKind::Compact { need } => {
                    if !self.defragment(Some(need))? {
                        self.diverge("a planned compaction could not be made");
                        return Ok(None);
                    }
                    continue;
                }
            };
            let s = self.iter.seq_storages.get(seq as usize).copied();
            let held = s.is_some_and(|s| self.parked(s));
            let ok = s.is_some_and(|s| {
                self.graph.storages.get(s.0).is_some_and(|r| {
                    // A victim the simulation took held by a regeneration may
                    // be an ordinary candidate here: taken as one.
                    r.cand_pos != NONE || (parked && r.recomputable && held)
                })
            });
            let Some(s) = s.filter(|_| ok) else {
                self.diverge("a planned victim is not evictable");
                return Ok(None);
            };
            if parked && held {
                self.parked_evicted.push(s);
                self.stats.parked_evictions += 1;
            }
            self.evict_storage(s, false)?;
            self.stats.planned_evictions += 1;
        }
        let idx = plan.prefix_len() + n as usize;
        if plan.sizes.get(idx) != Some(&arena_size(bytes)) {
            self.diverge("an allocation differs from the plan");
            return Ok(None);
        }
        match self.memory.allocate_at(bytes, plan.offsets[idx]) {
            Ok(slot) => Ok(Some(slot)),
            Err(_) => {
                self.diverge("the planned range is not free");
                Ok(None)
            }
        }
    }

    /// Free `slot`, whose contents nothing has needed since `dead_at` (wall
    /// clock, ns: the storage's last read, or the completion of its copy to
    /// the host tier; at most now). While the iteration follows its plan,
    /// note that time for its planned allocation: the plan knows nothing
    /// reads the range again, so a planned swap-in placed over it may start
    /// its copy then ([`Runtime::prefetch_issue`]). Simulations that make a
    /// plan log it for the planner's re-timing.
    pub(in crate::runtime) fn release_slot(&mut self, slot: Slot, dead_at: f64) -> Result<()> {
        if self.times_frees() {
            let dead_at = dead_at.min(self.copy_clock_ns());
            if self.iter.follower.following {
                if let Some(t) = self.iter.follower.freed_at.get_mut(slot.key as usize) {
                    *t = dead_at;
                }
            } else if let Some(times) = &mut self.iter.follower.sim_times {
                times.frees.push((slot.key, dead_at));
            }
        }
        self.memory.free(slot).map_err(Error::Memory)
    }

    /// Whether frees are timed: with the host tier, while following a plan
    /// (for its prefetches) or in a simulation that makes one (for the
    /// planner's re-timing). Without it nothing reads the times.
    pub(in crate::runtime) fn times_frees(&self) -> bool {
        self.host.is_some()
            && (self.iter.follower.following || self.iter.follower.sim_times.is_some())
    }

    /// Since when storage `s` has not been read (wall clock, ns): its last
    /// read on the compute clock plus the stalls before it (for a read
    /// before this iteration, at most its start's stalls, later than it
    /// was).
    pub(in crate::runtime) fn dead_since(&self, s: StorageId) -> f64 {
        let last = self.graph.st(s).last_used;
        let stalls = self
            .host
            .as_ref()
            .map_or(self.stats.stall_ns, |t| t.stalls_before(last));
        last + stalls
    }

    /// When a swap-in into `slot`, placed by the plan being followed, could
    /// have started its copy (wall clock, ns): once nothing needed the
    /// contents of any allocation of the plan that last covered its range
    /// (see [`Runtime::release_slot`]), and not before the iteration began.
    /// The plan knows the storage's next read, so a prefetcher issues the
    /// copy as soon as its destination is free: the arena is the plan's, so
    /// the range holds nothing else until then. `None` off the plan, off its
    /// arena layout, or where a predecessor's free was not seen (the copy
    /// then starts at the read, as online).
    pub(in crate::runtime) fn prefetch_issue(&self, slot: &Slot) -> Option<f64> {
        let f = &self.iter.follower;
        if !f.following {
            return None;
        }
        let (plan, layout) = f.layout.as_ref()?;
        if !f.plan.as_ref().is_some_and(|p| Arc::ptr_eq(p, plan)) {
            return None;
        }
        let k = slot.key as usize;
        if !layout.is_at(k, slot.ptr, slot.size) {
            return None;
        }
        let mut issue = self.iter.start_stats.copy_clock_ns();
        for &p in layout.preds(k) {
            let freed = *f.freed_at.get(p as usize)?;
            if freed.is_nan() {
                return None;
            }
            issue = issue.max(freed);
        }
        Some(issue)
    }

    /// Log an allocation's wall clock (simulations that become plans).
    pub(in crate::runtime) fn log_alloc(&mut self, slot: &Slot) {
        if self.iter.follower.sim_times.is_some() {
            let wall = self.copy_clock_ns();
            if let Some(times) = &mut self.iter.follower.sim_times {
                times.allocs.push((slot.key, wall));
            }
        }
    }

    /// Log a swap-in into `slot` read at `read_ns` that stalled `stall_ns`
    /// (simulations that become plans).
    pub(in crate::runtime) fn log_swap_in(
        &mut self,
        slot: &Slot,
        read_ns: f64,
        stall_ns: f64,
        ready_ns: f64,
        bytes: u64,
    ) {
        if let Some(times) = &mut self.iter.follower.sim_times {
            times.swap_ins.push(SwapInTime {
                key: slot.key,
                read_ns,
                stall_ns,
                ready_ns,
                bytes,
            });
        }
    }

    /// Whether `s` is resident and held only by the regeneration under way
    /// (parked): what a plan's parked steps take.
    fn parked(&self, s: StorageId) -> bool {
        (self.graph.storages.get(s.0))
            .is_some_and(|r| r.is_resident() && r.holds > 0 && r.pins == r.holds)
    }

    /// Take a plan's swap-out: `false` when the storage it names is not
    /// there to swap (resident, and a candidate or parked) or the host tier
    /// refused it.
    fn planned_swap_out(&mut self, at: u32, prefix: bool, parked: bool) -> Result<bool> {
        let s = if prefix {
            self.iter.prefix.get(at as usize).copied()
        } else {
            self.iter.seq_storages.get(at as usize).copied()
        };
        let held = s.is_some_and(|s| self.parked(s));
        let Some(s) = s.filter(|s| {
            // As for a planned eviction: one held in the simulation may be
            // an ordinary candidate here.
            self.graph
                .storages
                .get(s.0)
                .is_some_and(|r| r.is_resident() && (r.cand_pos != NONE || (parked && held)))
        }) else {
            return Ok(false);
        };
        if parked && held {
            self.parked_evicted.push(s);
            self.stats.parked_evictions += 1;
        }
        self.stats.planned_evictions += 1;
        self.swap_out(s)
    }

    /// Lay the resident storages out where `plan` puts them: in one arena of the
    /// budget's size for physical budgets (logical budgets have no addresses).
    ///
    /// The arena follows the plan's layout without an address-ordered map while
    /// the iteration follows the plan (see [`crate::memory::arena`]).
    pub(super) fn adopt(
        &mut self,
        plan: &Arc<IterationPlan>,
        residents: &[StorageId],
    ) -> Result<()> {
        if !self.memory.has_addresses() {
            return Ok(());
        }
        let capacity = self.memory.capacity().unwrap_or(plan.arena_bytes);
        let placed = residents.iter().copied().zip(plan.offsets.iter().copied());
        if plan.moves {
            // Blocks move: an address-ordered arena, checked at each
            // allocation, instead of the layout's fixed predecessors.
            let arena = ArenaMemory::new(capacity, plan.arena_bytes);
            self.iter.follower.freed_at.clear();
            self.by_ptr_stale = true;
            return self.move_into_arena(arena, placed);
        }
        let layout = match &self.iter.follower.layout {
            Some((p, l)) if Arc::ptr_eq(p, plan) => l.clone(),
            _ => {
                let l = Arc::new(ArenaLayout::new(&plan.offsets, &plan.sizes));
                self.iter.follower.layout = Some((plan.clone(), l.clone()));
                l
            }
        };
        self.iter.follower.freed_at.clear();
        if self.host.is_some() {
            self.iter.follower.freed_at.resize(layout.len(), f64::NAN);
        }
        let arena = ArenaMemory::with_layout(capacity, plan.arena_bytes, layout);
        // Following the plan never reads the address map: keep it lazily.
        self.by_ptr_stale = true;
        self.move_into_arena(arena, placed)
    }

    /// Move resident storages into `arena` at the given offsets (their slots in
    /// the old memory model are freed) and make it the memory model.
    pub(super) fn move_into_arena(
        &mut self,
        mut arena: ArenaMemory,
        placed: impl Iterator<Item = (StorageId, u64)>,
    ) -> Result<()> {
        self.by_ptr.clear();
        for (s, offset) in placed {
            let old = self.graph.st_mut(s).slot.take();
            let bytes = self.graph.st(s).bytes;
            if let Some(old) = old {
                self.memory.free(old).map_err(Error::Memory)?;
            }
            let slot = arena
                .allocate_at(bytes, offset)
                .map_err(|e| Error::Internal(format!("arena layout does not fit: {e:?}")))?;
            if slot.size > 0 && !self.by_ptr_stale {
                self.by_ptr.insert(slot.ptr, s);
            }
            self.graph.st_mut(s).slot = Some(slot);
        }
        self.replace_memory(Box::new(arena));
        Ok(())
    }

    /// Start numbering calls, storages and allocations afresh without ending an
    /// iteration (the planner's simulations, after placing the boundary state).
    pub(crate) fn restart_numbering(&mut self, log_steps: bool) {
        // What exists now predates the iteration, as at a real boundary.
        self.iter.epoch += 1;
        self.iter.follower.stable_order = true;
        self.iter.seq_storages.clear();
        self.iter.allocs = 0;
        self.iter.pos = 0;
        self.iter.follower.plan_log = log_steps.then(Vec::new);
        self.iter.follower.sim_times = (log_steps && self.host.is_some()).then(SimTimes::default);
    }

    /// Name the storages of `ts`, in order, as the boundary a simulation
    /// starts from (positions of [`crate::Boundary::storages`]).
    pub(crate) fn set_prefix_tensors(&mut self, ts: &[TensorId]) -> Result<()> {
        let mut storages = Vec::with_capacity(ts.len());
        for &t in ts {
            storages.push(self.storage_of(t)?);
        }
        self.iter.set_prefix(&storages);
        Ok(())
    }

    /// Let this simulation move blocks: its compactions become
    /// [`StepKind::Compact`] steps of the plan it may become.
    pub(crate) fn allow_moves(&mut self) {
        self.iter.follower.moving = true;
    }

    /// The simulation's frees and swap-ins, timed (see [`Runtime::restart_numbering`]).
    pub(crate) fn take_sim_times(&mut self) -> SimTimes {
        self.iter.follower.sim_times.take().unwrap_or_default()
    }

    /// The simulation's evictions and failures (see [`Runtime::restart_numbering`]).
    pub(crate) fn take_plan_log(&mut self) -> Vec<PlanStep> {
        self.iter.follower.plan_log.take().unwrap_or_default()
    }
}
