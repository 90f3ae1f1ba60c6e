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
            };
            let s = self.iter.seq_storages.get(seq as usize).copied();
            let ok = s.is_some_and(|s| {
                self.graph.storages.get(s.0).is_some_and(|r| {
                    if parked {
                        r.is_resident() && r.recomputable && r.holds > 0 && r.pins == r.holds
                    } else {
                        r.cand_pos != NONE
                    }
                })
            });
            let Some(s) = s.filter(|_| ok) else {
                self.diverge("a planned victim is not evictable");
                return Ok(None);
            };
            if parked {
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

    /// Take a plan's swap-out: `false` when the storage it names is not
    /// there to swap (resident, and a candidate or parked) or the host tier
    /// refused it.
    fn planned_swap_out(&mut self, at: u32, prefix: bool, parked: bool) -> Result<bool> {
        let s = if prefix {
            self.iter.prefix.get(at as usize).copied()
        } else {
            self.iter.seq_storages.get(at as usize).copied()
        };
        let Some(s) = s.filter(|s| {
            self.graph.storages.get(s.0).is_some_and(|r| {
                r.is_resident()
                    && if parked {
                        r.holds > 0 && r.pins == r.holds
                    } else {
                        r.cand_pos != NONE
                    }
            })
        }) else {
            return Ok(false);
        };
        if parked {
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
        let layout = match &self.iter.follower.layout {
            Some((p, l)) if Arc::ptr_eq(p, plan) => l.clone(),
            _ => {
                let l = Arc::new(ArenaLayout::new(&plan.offsets, &plan.sizes));
                self.iter.follower.layout = Some((plan.clone(), l.clone()));
                l
            }
        };
        let capacity = self.memory.capacity().unwrap_or(plan.arena_bytes);
        let placed = residents.iter().copied().zip(plan.offsets.iter().copied());
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

    /// The simulation's evictions and failures (see [`Runtime::restart_numbering`]).
    pub(crate) fn take_plan_log(&mut self) -> Vec<PlanStep> {
        self.iter.follower.plan_log.take().unwrap_or_default()
    }
}
