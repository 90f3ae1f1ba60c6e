//! Regeneration: make evicted storages resident again.
//!
//! [`Runtime::hold`] runs an explicit work list (`Frame`s): `Need(s)` either
//! holds a resident `s` or schedules `Run(op)` after `Need` of each input of
//! `s`'s compute path; `Run(op)` finds its inputs held, places and computes the
//! missing outputs ([`Runtime::rematerialize`]), releases the inputs and holds
//! its target for the frame that needed it. A resident target whose own
//! lineage is gone is held before anything is replayed
//! ([`Runtime::hold_first`]). Nothing recurses on the call stack,
//! so a 100k-op chain regenerates in constant stack. A regeneration whose own
//! replays pass the iteration's first computations keeps the inputs it
//! releases held instead, until it ends or memory runs out (with
//! `keep_read_again`, only while it reads them again;
//! [`Runtime::keep_regenerated`]), unless one ordered pass over what is left
//! of its region fits the budget: then that pass replays it, each op once
//! (`regen_order`, tried too before the first replay of every regeneration
//! of an online step already losing).

use std::sync::Arc;

use super::{Frame, Keeping, Runtime, REGEN_ORDER_NODES};
use crate::error::{DeviceOutOfMemory, Error, Result};
use crate::graph::Residency;
use crate::ids::{OpId, StorageId};
use crate::op::OpHandle;

impl<V> Runtime<V> {
    /// Make every storage of `targets` resident and hold each once (pins += 1,
    /// holds += 1). On error every hold taken by this call is dropped.
    ///
    /// Work list, no recursion: `Need(s)` makes `s` resident (pushing its
    /// producer's `Run` and the `Need`s of its inputs when evicted); `Run` replays
    /// the producer once its inputs are held and releases their holds. A finished
    /// input waits held ("parked") until its consumer runs; when nothing else can
    /// make room, [`Runtime::evict_parked`] may evict it and the consumer's `Run`
    /// needs it again. Each storage is evicted that way at most once per call, so
    /// the work is bounded. A regeneration that still finds the budget impossible
    /// is retried once with the inputs ordered by need and, with swap on, once
    /// more swapping its parked victims instead of dropping them.
    pub(super) fn hold(&mut self, targets: &[StorageId]) -> Result<()> {
        // Between regenerations, no allocation in flight: where a losing
        // iteration changes policy.
        self.rescue_from_thrashing()?;
        match self.hold_once(targets, false) {
            Err(Error::ImpossibleBudget(_)) if self.replayed => {
                // Creation order parked too much: retry (what was regenerated
                // stays resident) with the hungriest lineage first.
                self.stats.reordered_regenerations += 1;
                match self.hold_once(targets, true) {
                    Err(Error::ImpossibleBudget(_)) if self.replayed && self.swap_enabled() => {
                        // Parked victims dropped for recomputation need their
                        // inputs again beside what is held: retry once more
                        // swapping them, so each comes back alone.
                        self.swap_parked = true;
                        let r = self.hold_once(targets, true);
                        self.swap_parked = false;
                        r
                    }
                    r => r,
                }
            }
            r => r,
        }
    }

    /// One attempt of [`Runtime::hold`]; `by_need` orders the inputs of each
    /// replayed op by the bytes their evicted lineage must place, largest first
    /// (Sethi–Ullman), instead of by creation.
    fn hold_once(&mut self, targets: &[StorageId], by_need: bool) -> Result<()> {
        self.touched.clear();
        self.frames.clear();
        self.parked_evicted.clear();
        self.regenerating = true;
        self.by_need = by_need;
        self.replayed = false;
        self.keeping = Keeping::Armed(self.stats.remat_ns);
        if self.config.keep_read_again {
            // Only with the switch: a hold is on the planned path too.
            self.reads_to_come.clear();
            self.counted.clear();
            self.regen_targets.clear();
            self.regen_targets.extend_from_slice(targets);
        }
        let result = self.hold_loop(targets);
        self.regenerating = false;
        self.keeping = Keeping::Off;
        // Release what was kept (after an error, the holds of everything
        // touched are dropped below).
        let mut kept = std::mem::take(&mut self.kept);
        if result.is_ok() {
            for &s in &kept {
                self.unpin_storage(s, true);
            }
        }
        kept.clear();
        self.kept = kept;
        if let Err(e) = result {
            self.frames.clear();
            let touched = std::mem::take(&mut self.touched);
            for &s in &touched {
                if let Some(r) = self.graph.storages.get_mut(s.0) {
                    r.pins -= r.holds;
                    r.holds = 0;
                    if r.pins == 0 {
                        self.graph.offer(s);
                    }
                }
            }
            self.touched = touched;
            return Err(e);
        }
        Ok(())
    }

    /// Whether the running regeneration keeps the inputs of the op it just
    /// replayed held, instead of releasing them for eviction. It starts to
    /// once its own replays cost more than the iteration's first computations
    /// so far (a regeneration that alone makes the iteration lose): a lineage
    /// released after its first consumer is otherwise regenerated again for
    /// the next one, without bound (lstm at 0.25: one regeneration replayed
    /// ~2 600 ops up to 90 times each). Kept storages are parked:
    /// [`Runtime::evict_parked`] may still evict each once.
    ///
    /// With [`crate::DtrConfig::keep_read_again`], what is kept is only what
    /// the regeneration reads again: when keeping starts, the reads still to
    /// come are counted over its region ([`Runtime::count_region_reads`]),
    /// and an input is released at its last counted read, with every hold
    /// kept for it before (inputs of an op outside the counted region,
    /// replayed again after a parked eviction, are kept as before). A value
    /// with no read left in the region cannot be regenerated again by it,
    /// and its room pushes the program's own live storages out (GPT-2's and
    /// T5's first steps pass 4× at 0.5 and 0.4 that way); but it may be
    /// lineage the *next* regeneration replays (Burn's transformer near its
    /// floor), which no count inside one regeneration sees. Hence opt-in:
    /// `docs/dtr-results.md`, session 34.
    fn keep_regenerated(&mut self) -> bool {
        let Keeping::Armed(start) = self.keeping else {
            return matches!(self.keeping, Keeping::On | Keeping::Due);
        };
        if !self.may_rescue() {
            self.keeping = Keeping::Off;
        } else if self.losing_since(start) {
            self.keeping = match self.config.ordered_regen {
                true => Keeping::Due,
                false => Keeping::On,
            };
            self.stats.kept_regenerations += 1;
            if self.config.keep_read_again {
                self.count_region_reads();
            }
        }
        matches!(self.keeping, Keeping::On | Keeping::Due)
    }

    /// Count the reads still to come in the running regeneration: one per
    /// unique input of each op that must still run to make its targets
    /// resident (the producers of the targets' evicted ancestors; a swapped
    /// storage is a leaf, its copy needs no input). Those ops go to
    /// `counted` until each runs. Called once, when keeping starts; the walk
    /// visits each evicted ancestor once.
    fn count_region_reads(&mut self) {
        let targets = std::mem::take(&mut self.regen_targets);
        (self.counted, self.reads_to_come, _) = self.evicted_region(&targets);
        self.regen_targets = targets;
    }

    fn hold_loop(&mut self, targets: &[StorageId]) -> Result<()> {
        // Something to replay, in a planner simulation or with
        // `online_hold_first`: the resident targets whose own lineage is gone
        // are held before it starts (`Runtime::hold_first`).
        let first = (self.iter.follower.plan_log.is_some() || self.config.online_hold_first)
            && targets.iter().any(|&t| !self.graph.st(t).is_resident());
        for &t in targets.iter().rev() {
            if first && self.hold_first(t) {
                self.take_hold(t);
            } else {
                self.frames.push(Frame::Need(t));
            }
        }
        // In an online step already losing (past 2×, where the policy
        // switches to MSPS), every regeneration tries the ordered pass
        // before its first replay; elsewhere only one that runs away does
        // (`Keeping::Due`). Where it does not fit, nothing changed.
        if self.config.ordered_regen
            && self.may_rescue()
            && self.losing()
            && targets
                .iter()
                .any(|&t| self.graph.st(t).residency == Residency::Evicted)
        {
            self.replay_region_in_order(targets)?;
        }
        loop {
            while let Some(frame) = self.frames.pop() {
                match frame {
                    Frame::Need(s) => self.need(s)?,
                    Frame::Run {
                        op,
                        target,
                        asked_at,
                    } => self.run(op, target, asked_at)?,
                }
                if self.keeping == Keeping::Due && !self.replay_region_in_order(targets)? {
                    self.keeping = Keeping::On;
                }
            }
            // A target finished early may have been evicted while parked.
            for &t in targets.iter().rev() {
                if !self.graph.st(t).is_resident() {
                    self.unpin_storage(t, true);
                    self.frames.push(Frame::Need(t));
                }
            }
            if self.frames.is_empty() {
                return Ok(());
            }
        }
    }

    /// Whether target `t` of a regeneration that replays is held before
    /// anything is replayed, instead of when its turn comes: it is resident,
    /// recomputable, and an input of its producer is evicted or swapped (its
    /// lineage is gone). A target that cannot be recomputed is no candidate
    /// for recomputation anyway.
    ///
    /// Waiting for its turn, a resident target is an ordinary candidate while
    /// the other targets are replayed. Evicted to make room for them, it needs
    /// its own lineage replayed after them, beside what they hold. On
    /// MobileNetV3 at 0.3 that target was the gradient a batch-norm backward
    /// read beside an evicted activation, its lineage the backward so far:
    /// one regeneration replayed the forward three times, and none of the
    /// planner's learned schedules finished. Held, it costs no room it does
    /// not take already. A target one replay from resident inputs stays a
    /// candidate: losing it costs one op, which the policy prices like any
    /// other, and holding it too keeps room from a long regeneration of the
    /// others (measured online: treelstm at 0.25 and lstm at 0.2 thrash when
    /// every resident target is held first). Only the order of the holds
    /// changes; what the call holds when it returns does not.
    fn hold_first(&self, t: StorageId) -> bool {
        let r = self.graph.st(t);
        if !r.is_resident() {
            return false;
        }
        match r.producer {
            Some(op) if r.recomputable => self.graph.ops[op.0]
                .unique_inputs
                .iter()
                .any(|&i| !self.graph.st(i).is_resident()),
            _ => false,
        }
    }

    /// Last resort of [`Runtime::make_room`] during a regeneration: evict one
    /// parked storage (held only by this regeneration, not an input of the op
    /// being replayed, not evicted this way before in this call), preferring the
    /// most bytes per ns of recompute. `false` when there is none.
    #[cold]
    pub(super) fn evict_parked(&mut self) -> Result<bool> {
        if !self.regenerating {
            return Ok(false);
        }
        let mut best: Option<(f64, StorageId)> = None;
        for &s in &self.touched {
            let r = self.graph.st(s);
            let parked = r.is_resident()
                && r.recomputable
                && r.holds > 0
                && r.pins == r.holds
                && !self.parked_evicted.contains(&s);
            if parked {
                let score = r.bytes as f64 / r.cost.max(1.0);
                if best.is_none_or(|(b, _)| score > b) {
                    best = Some((score, s));
                }
            }
        }
        let Some((_, s)) = best else {
            // What a regeneration kept yields when memory runs out: released,
            // it is an ordinary candidate again.
            if self.keeping == Keeping::On && !self.kept.is_empty() {
                self.keeping = Keeping::Off;
                for s in std::mem::take(&mut self.kept) {
                    self.unpin_storage(s, true);
                }
                return Ok(true);
            }
            return Ok(false);
        };
        self.parked_evicted.push(s);
        self.stats.parked_evictions += 1;
        self.evict_victim(s, true)
    }

    fn take_hold(&mut self, s: StorageId) {
        self.graph.pin(s);
        self.graph.st_mut(s).holds += 1;
        self.touched.push(s);
    }

    fn need(&mut self, s: StorageId) -> Result<()> {
        let r = self.graph.st(s);
        if r.is_resident() {
            self.take_hold(s);
            return Ok(());
        }
        if r.residency == Residency::Swapped {
            // One copy back, none of its inputs: a swap does not cascade (and a
            // copy is never stale: it is the value as it was computed).
            self.swap_in(s)?;
            self.take_hold(s);
            return Ok(());
        }
        if r.epoch < self.iter.epoch {
            return Err(Error::StaleValue {
                storage: s,
                created_in: r.epoch,
                current: self.iter.epoch,
            });
        }
        let op = match r.producer {
            Some(op) if r.recomputable => op,
            _ => return Err(Error::NotRegenerable(s)),
        };
        self.frames.push(Frame::Run {
            op,
            target: s,
            asked_at: self.graph.clock,
        });
        self.replayed = true;
        let inputs = &self.graph.ops[op.0].unique_inputs;
        if !self.by_need || inputs.len() < 2 {
            for &i in inputs {
                self.frames.push(Frame::Need(i));
            }
            return Ok(());
        }
        // Resident inputs first (held at once: they take no room), then the
        // evicted ones, the lineage that must place the most bytes first, while
        // the fewest finished siblings are parked.
        let mut order: Vec<(u64, StorageId)> = inputs.iter().map(|&i| (u64::MAX, i)).collect();
        for entry in &mut order {
            if !self.graph.st(entry.1).is_resident() {
                entry.0 = self
                    .graph
                    .evicted_ancestor_bytes(entry.1, REGEN_ORDER_NODES);
            }
        }
        // A stack: push the last to run first.
        order.sort_by_key(|&(bytes, s)| (bytes, std::cmp::Reverse(self.creation_key(s))));
        for (_, i) in order {
            self.frames.push(Frame::Need(i));
        }
        Ok(())
    }

    /// Replay `op` for `target` once its inputs are held, then stamp those
    /// inputs as used: at `asked_at`, the clock when `target` was asked for,
    /// with [`DtrConfig::request_stamp`](crate::DtrConfig::request_stamp),
    /// else at the clock after the replays below them (the default).
    ///
    /// Staleness is meant to say how long ago the *program* last read a
    /// storage. A regeneration's reads are not the program's: they serve the
    /// one access that asked for `target`, so they carry that access's time.
    /// Stamped instead with the clock after the replays below them, the
    /// intermediates of a long cascade would be the freshest storages in
    /// memory right after it, though nothing reads them again until
    /// something downstream is evicted and regenerated. They would outlive the
    /// storages the program is about to read, and each of those, evicted,
    /// starts a cascade of its own: the thrash loop. Stamped at `asked_at`,
    /// they look as old as the cascade is long and go first. This is also
    /// what the DTR authors' simulator does (it stamps an op's inputs before
    /// regenerating any of them); with it, full-scan h_DTR under a logical
    /// budget finishes lstm at 0.3 (1.308; the authors: 1.301) where it
    /// thrashes. It is not the default because the argument fails for a
    /// value two replays of the same regeneration read: stamped old after the
    /// first, it is evicted and replayed again for the second
    /// (`docs/dtr-results.md`, session 24).
    fn run(&mut self, op: OpId, target: StorageId, asked_at: f64) -> Result<()> {
        let unique = self.graph.ops[op.0].unique_inputs.clone();
        if !self.graph.st(target).is_resident() {
            let missing: Vec<StorageId> = unique
                .iter()
                .copied()
                .filter(|&i| !self.graph.st(i).is_resident())
                .collect();
            if !missing.is_empty() {
                // Parked inputs evicted since they were made resident: drop their
                // stale holds and need them again before running.
                self.frames.push(Frame::Run {
                    op,
                    target,
                    asked_at,
                });
                for &i in &missing {
                    self.unpin_storage(i, true);
                    self.frames.push(Frame::Need(i));
                }
                return Ok(());
            }
            self.rematerialize_pinned(op, &unique)?;
        }
        let stamp = if self.config.request_stamp {
            asked_at
        } else {
            self.graph.clock
        };
        let keep = self.keep_regenerated();
        // An op of the region counted when keeping began runs for the first
        // time: its reads are no longer to come.
        let counted = !self.counted.is_empty() && self.counted.remove(&op);
        for s in unique {
            self.graph.st_mut(s).last_used = stamp;
            let reads_left = counted.then(|| match self.reads_to_come.get_mut(&s) {
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n
                }
                None => 0,
            });
            if keep && reads_left != Some(0) {
                self.kept.push(s);
                continue;
            }
            self.unpin_storage(s, true);
            if reads_left == Some(0) {
                // Its last read in this regeneration: the holds kept for it
                // go too, and it is an ordinary candidate again.
                let mut n = 0;
                self.kept.retain(|&k| {
                    n += (k == s) as u32;
                    k != s
                });
                for _ in 0..n {
                    self.unpin_storage(s, true);
                }
            }
        }
        self.take_hold(target);
        Ok(())
    }

    /// [`Runtime::rematerialize`] with an extra pin (not a hold) on each of
    /// `unique`, the op's inputs: they are not parked, so `evict_parked`
    /// stays off them while the outputs are placed.
    pub(super) fn rematerialize_pinned(&mut self, op: OpId, unique: &[StorageId]) -> Result<()> {
        for &i in unique {
            self.graph.st_mut(i).pins += 1;
        }
        let result = self.rematerialize(op);
        for &i in unique {
            self.graph.st_mut(i).pins -= 1;
        }
        result
    }

    /// Replay `op` (inputs held) and fill its non-resident outputs.
    #[cold]
    fn rematerialize(&mut self, op: OpId) -> Result<()> {
        if let Some(limit) = self.compute_limit {
            if self.stats.wall_ns() > limit {
                return Err(Error::ComputeLimit {
                    limit_ns: limit,
                    spent_ns: self.stats.wall_ns(),
                });
            }
        }
        let missing: Vec<(usize, StorageId)> = self.graph.ops[op.0]
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(k, o)| {
                // A swapped sibling stays in the host tier (its copy is its
                // value); only evicted outputs are refilled.
                o.filter(|s| self.graph.st(*s).residency == Residency::Evicted)
                    .map(|s| (k, s))
            })
            .collect();
        // Keep the outputs out of the candidates while their siblings are placed.
        let sizes: Vec<u64> = missing
            .iter()
            .map(|&(_, s)| self.graph.st(s).bytes)
            .collect();
        let handle = self.handles[op.0 as usize]
            .clone()
            .ok_or_else(|| Error::Internal("op without handle".into()))?;
        let slots = match self.place_all(&sizes) {
            Ok(slots) => slots,
            Err(e) => {
                let unique = self.graph.ops[op.0].unique_inputs.clone();
                return Err(self.name_op_working_set(e, &handle, &unique, &sizes));
            }
        };
        let rec = &self.graph.ops[op.0];
        let (cost, n_out) = (rec.cost, rec.outputs.len());
        let inputs = rec.inputs.clone();
        // The missing outputs hold their slots but are not resident yet: no
        // candidates, so a device-OOM eviction cannot touch them.
        let hint = missing.iter().map(|&(_, s)| self.graph.st(s).bytes).sum();
        let result = self.compute_retrying(&handle, &inputs, hint);
        let (slots, values) = self.outputs_or_free(handle.name(), result, n_out, slots)?;
        let mut values: Vec<Option<V>> = values.into_iter().map(Some).collect();
        self.graph.clock += cost;
        self.stats.remat_ns += cost;
        self.graph.note_op_cost(cost, true);
        self.stats.rematerializations += 1;
        let now = self.graph.clock;
        for (&(k, s), slot) in missing.iter().zip(slots) {
            self.values[s.0 as usize] = values[k].take();
            let ptr = slot.ptr;
            let r = self.graph.st_mut(s);
            r.residency = Residency::Resident;
            r.slot = Some(slot);
            r.recomputes += 1;
            r.last_used = now;
            let bytes = r.bytes;
            self.graph.dsu_on_remat(s);
            if self.graph.st(s).slot.as_ref().is_some_and(|x| x.size > 0) {
                self.map_ptr(ptr, s);
            }
            self.stats.live_bytes += bytes;
            self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
            self.graph.offer(s);
        }
        tracing::trace!(target: "remat_dtr::remat", op = op.0, cost, "rematerialize");
        Ok(())
    }

    /// Call `op` on the values of `inputs` (all resident and held). When the op
    /// reports that the real device ran out of memory, evict policy-chosen
    /// storages worth at least `hint` bytes (one storage when `hint` is 0) and
    /// call it again, until it succeeds or nothing is left to evict.
    pub(super) fn compute_retrying(
        &mut self,
        op: &Arc<dyn OpHandle<V>>,
        inputs: &[StorageId],
        hint: u64,
    ) -> Result<Vec<V>> {
        let mut retries = 0u32;
        loop {
            let outcome = {
                let args: Option<Vec<&V>> = inputs
                    .iter()
                    .map(|s| self.values[s.0 as usize].as_ref())
                    .collect();
                match args {
                    Some(args) => op.compute(&args),
                    None => return Err(Error::Internal("an op input is not resident".into())),
                }
            };
            let err = match outcome {
                Ok(values) => return Ok(values),
                Err(e) if e.out_of_memory => e,
                Err(e) => return Err(e.into()),
            };
            tracing::debug!(target: "remat_dtr::oom", op = op.name(), hint, retries, message = %err.message, "device out of memory; evicting");
            if self.recover_from_device_oom(hint)? == 0 {
                return Err(Error::DeviceOutOfMemory(Box::new(DeviceOutOfMemory {
                    op: err.op,
                    message: err.message,
                    retries,
                    figures: self.memory_report(hint),
                })));
            }
            retries += 1;
        }
    }
}
