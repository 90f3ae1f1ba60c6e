//! The ordered pass: a regeneration that runs away replays what is left of
//! its region once, in a topological order, where that fits the budget.
//!
//! A work-list regeneration ([`Runtime::hold`]) replays each op as its
//! target is needed and releases each input after its consumer ran. Under
//! pressure a released input is evicted before the next consumer in the
//! same region reads it, and is replayed again, with its own lineage: the
//! region is replayed many times over (gpt2's first step at 0.5 replayed
//! 1.2× the step's computations in one regeneration whose region costs
//! 3.8 ms once). Keeping every input until the regeneration ends (the
//! thrash rescue's answer, `Runtime::keep_regenerated`) bounds the repeats
//! but holds values the region never reads again, whose room pushes the
//! program's own live storages out.
//!
//! When a regeneration starts to run away (its replays pass the step's
//! first computations, the moment it would start keeping), and at the start
//! of every regeneration once the online step itself is losing (its
//! replays past its computations, where the policy switches to MSPS: the
//! repeats are then across regenerations too), this pass takes
//! the evicted region still needed for its targets and tests, before
//! replaying anything, whether one pass fits: what stays pinned once the
//! work list's own holds are dropped, plus the most bytes the region's
//! values hold at once (each from its replay, or from the start for a
//! resident input, to its last read in the region), must be within the
//! budget. That peak is computed for three topological orders (creation
//! order; depth-first from the targets, inputs first to last and last to
//! first) and the lowest is taken. Where it fits, the work list is dropped,
//! every value with a read left in the region is reserved (pinned, out of
//! the policy's and the parked eviction's reach) and the ops run in that
//! order, each once: the regeneration costs one pass over its region,
//! whatever the policy does. Where it does not fit, the regeneration keeps
//! what it regenerates, as before.
//!
//! Why this holds on graphs it was not measured on: each order is
//! topological, so every input is resident when its op runs; reserved
//! values cannot be evicted, so no op runs twice; and the test is the exact
//! peak of that pass under a logical count of bytes. A caching allocator
//! may still fail to place a block the count says fits (fragmentation); the
//! pass then stops, releases its reservations, and a fresh work list
//! finishes the region with what the pass made resident, keeping.

use ahash::{AHashMap, AHashSet};

use super::{Frame, Keeping, Runtime};
use crate::error::{Error, Result};
use crate::graph::{Residency, NONE};
use crate::ids::{OpId, StorageId};

/// The region a regeneration has left to replay.
struct Region {
    /// Ops whose evicted outputs are needed.
    ops: AHashSet<OpId>,
    /// Reads still to come by storage: one per unique input of each op in
    /// `ops`, and one per target (held when the regeneration returns).
    reads: AHashMap<StorageId, u32>,
}

impl<V> Runtime<V> {
    /// The ordered pass, due since the running regeneration began to run
    /// away ([`Keeping::Due`]), or before its first replay in a losing
    /// online step. `Ok(false)` when what is left of its region
    /// cannot be replayed in order (a stale or external storage in it: the
    /// work list names it) or the pass does not fit: nothing changed, and
    /// the caller goes on (a runaway keeps). Otherwise the work list is restarted: its frames
    /// and holds are dropped (every op they wait for is in the region), the
    /// region is replayed in order, and a `Need` frame per target is pushed,
    /// which finds it resident. A pass that stops early (a caching
    /// allocator that cannot place what the count says fits) leaves that
    /// work list to finish the region, keeping what it regenerates.
    pub(super) fn replay_region_in_order(&mut self, targets: &[StorageId]) -> Result<bool> {
        let Some(capacity) = self.memory.capacity() else {
            return Ok(false);
        };
        let Some(region) = self.region_left(targets) else {
            return Ok(false);
        };
        // What stays pinned once the work list's holds are dropped.
        let fixed = (self.stats.live_bytes)
            .saturating_sub(self.graph.candidate_bytes)
            .saturating_sub(self.held_only_bytes());
        let (peak, order) = [
            self.region_creation_order(&region),
            self.depth_first_order(targets, &region, false),
            self.depth_first_order(targets, &region, true),
        ]
        .into_iter()
        .map(|order| (self.pass_peak(&order, &region.reads), order))
        .min_by_key(|(peak, _)| *peak)
        .unwrap_or_default();
        if fixed + peak > capacity {
            return Ok(false);
        }
        self.drop_work_list();
        let mut reserved: Vec<StorageId> = Vec::new();
        let result = self.run_region(&order, region.reads, &mut reserved);
        match result {
            Ok(true) => {
                self.stats.ordered_regenerations += 1;
                self.keeping = Keeping::Off;
            }
            Ok(false) | Err(Error::ImpossibleBudget(_)) => self.keeping = Keeping::On,
            Err(e) => {
                for s in reserved {
                    self.unpin_storage(s, false);
                }
                return Err(e);
            }
        }
        for &t in targets.iter().rev() {
            self.frames.push(Frame::Need(t));
        }
        for s in reserved {
            self.unpin_storage(s, false);
        }
        Ok(true)
    }

    /// The ops still to run for `targets`: the producers of their evicted
    /// ancestors (a swapped storage is a leaf: its copy needs no input).
    /// `None` when one of them cannot be replayed (stale, external): the work
    /// list then names it with its typed error.
    fn region_left(&self, targets: &[StorageId]) -> Option<Region> {
        let (ops, mut reads, replayable) = self.evicted_region(targets);
        if !replayable {
            return None;
        }
        for &t in targets {
            *reads.entry(t).or_insert(0) += 1;
        }
        Some(Region { ops, reads })
    }

    /// The walk behind [`Runtime::region_left`] and `count_region_reads`:
    /// the producers of `targets`' evicted ancestors, each visited once, the
    /// reads their unique inputs get from them, and whether every evicted
    /// storage on the way can be replayed in this iteration (recomputable,
    /// not stale).
    pub(super) fn evicted_region(
        &self,
        targets: &[StorageId],
    ) -> (AHashSet<OpId>, AHashMap<StorageId, u32>, bool) {
        let mut work: Vec<StorageId> = (targets.iter().copied())
            .filter(|&t| self.graph.st(t).residency == Residency::Evicted)
            .collect();
        let mut seen: AHashSet<StorageId> = work.iter().copied().collect();
        let mut ops: AHashSet<OpId> = AHashSet::new();
        let mut reads: AHashMap<StorageId, u32> = AHashMap::new();
        let mut replayable = true;
        while let Some(e) = work.pop() {
            let r = self.graph.st(e);
            replayable &= r.epoch >= self.iter.epoch && r.recomputable;
            let Some(op) = r.producer else {
                replayable = false;
                continue;
            };
            if !ops.insert(op) {
                continue;
            }
            for &i in &self.graph.ops[op.0].unique_inputs {
                *reads.entry(i).or_insert(0) += 1;
                if self.graph.st(i).residency == Residency::Evicted && seen.insert(i) {
                    work.push(i);
                }
            }
        }
        (ops, reads, replayable)
    }

    /// The region's ops in creation order (by their first output's
    /// iteration and sequence number): a topological order.
    fn region_creation_order(&self, region: &Region) -> Vec<OpId> {
        let mut ops: Vec<(u32, u32, OpId)> = (region.ops.iter())
            .map(|&op| {
                let (epoch, seq) = (self.graph.ops[op.0].outputs.iter().flatten())
                    .map(|&o| (self.graph.st(o).epoch, self.graph.st(o).seq))
                    .min()
                    .unwrap_or((u32::MAX, u32::MAX));
                (epoch, seq, op)
            })
            .collect();
        ops.sort_unstable_by_key(|&(epoch, seq, op)| (epoch, seq, op.0));
        ops.into_iter().map(|(_, _, op)| op).collect()
    }

    /// The region's ops depth-first from the targets, each after the
    /// producers of its evicted inputs (post-order: topological too). Where
    /// branches are long and join late, this holds one branch's values at
    /// a time where creation order may hold several.
    fn depth_first_order(
        &self,
        targets: &[StorageId],
        region: &Region,
        last_input_first: bool,
    ) -> Vec<OpId> {
        let mut order = Vec::with_capacity(region.ops.len());
        let mut visited: AHashSet<OpId> = AHashSet::with_capacity(region.ops.len());
        let mut stack: Vec<(OpId, usize)> = Vec::new();
        let producer = |s: StorageId| {
            let r = self.graph.st(s);
            (r.residency == Residency::Evicted)
                .then_some(r.producer)
                .flatten()
                .filter(|op| region.ops.contains(op))
        };
        for &t in targets {
            let Some(op) = producer(t) else { continue };
            if !visited.insert(op) {
                continue;
            }
            stack.push((op, 0));
            while let Some((op, next)) = stack.last_mut() {
                let inputs = &self.graph.ops[op.0].unique_inputs;
                let at = match last_input_first {
                    false => *next,
                    true => inputs.len().wrapping_sub(*next + 1),
                };
                if let Some(&i) = inputs.get(at) {
                    *next += 1;
                    if let Some(p) = producer(i) {
                        if visited.insert(p) {
                            stack.push((p, 0));
                        }
                    }
                } else {
                    order.push(*op);
                    stack.pop();
                }
            }
        }
        order
    }

    /// Bytes held only by the running regeneration's work list (its holds,
    /// its kept inputs): free to go once that work list is dropped.
    fn held_only_bytes(&self) -> u64 {
        let mut seen: AHashSet<StorageId> = AHashSet::new();
        (self.touched.iter())
            .filter(|&&s| seen.insert(s))
            .map(|&s| self.graph.st(s))
            .filter(|r| r.is_resident() && r.holds > 0 && r.pins == r.holds)
            .map(|r| r.bytes)
            .sum()
    }

    /// The most bytes the region's values hold at once when its ops run in
    /// `order`: the resident ones it reads that nothing else pins
    /// (reserved from the start), plus each value it makes resident
    /// (replayed outputs, swapped inputs copied back), each until its last
    /// read in the region; an output no op of it reads counts only while
    /// its op runs.
    fn pass_peak(&self, order: &[OpId], reads: &AHashMap<StorageId, u32>) -> u64 {
        let mut reads = reads.clone();
        let mut counted: AHashSet<StorageId> = AHashSet::new();
        let mut live = 0u64;
        for (&s, _) in reads.iter() {
            let r = self.graph.st(s);
            // A candidate, or held by the work list only: not in `fixed`.
            if r.is_resident() && (r.cand_pos != NONE || (r.holds > 0 && r.pins == r.holds)) {
                counted.insert(s);
                live += r.bytes;
            }
        }
        let mut peak = live;
        for &op in order {
            let rec = &self.graph.ops[op.0];
            for &i in &rec.unique_inputs {
                let r = self.graph.st(i);
                if r.residency == Residency::Swapped && counted.insert(i) {
                    live += r.bytes;
                }
            }
            let mut fresh = Vec::new();
            for &o in rec.outputs.iter().flatten() {
                if self.graph.st(o).residency == Residency::Evicted && counted.insert(o) {
                    live += self.graph.st(o).bytes;
                    fresh.push(o);
                }
            }
            peak = peak.max(live);
            for &i in &rec.unique_inputs {
                if let Some(n) = reads.get_mut(&i) {
                    *n -= 1;
                    if *n == 0 && counted.contains(&i) {
                        live -= self.graph.st(i).bytes;
                    }
                }
            }
            for o in fresh {
                if !reads.contains_key(&o) {
                    live -= self.graph.st(o).bytes;
                }
            }
        }
        peak
    }

    /// Run the region's ops in `order`, each once, every value with a read
    /// left reserved (pinned) until its last read; the pins still taken are
    /// in `reserved` when it returns. `Ok(false)` when an input is not
    /// there to be read (the reservations rule it out; the work list then
    /// goes on).
    fn run_region(
        &mut self,
        order: &[OpId],
        mut reads: AHashMap<StorageId, u32>,
        reserved: &mut Vec<StorageId>,
    ) -> Result<bool> {
        let mut keys: Vec<StorageId> = reads.keys().copied().collect();
        keys.sort_unstable_by_key(|s| s.0);
        // Membership of `reserved` (a vector, so that releases keep one order).
        let mut pinned: AHashSet<StorageId> = AHashSet::with_capacity(keys.len());
        for s in keys {
            if self.graph.st(s).is_resident() {
                self.graph.pin(s);
                reserved.push(s);
                pinned.insert(s);
            }
        }
        for &op in order {
            let unique = self.graph.ops[op.0].unique_inputs.clone();
            for &i in &unique {
                match self.graph.st(i).residency {
                    Residency::Resident => {}
                    Residency::Swapped => {
                        self.swap_in(i)?;
                        self.graph.pin(i);
                        reserved.push(i);
                        pinned.insert(i);
                    }
                    Residency::Evicted => return Ok(false),
                }
            }
            self.rematerialize_pinned(op, &unique)?;
            let now = self.graph.clock;
            for k in 0..self.graph.ops[op.0].outputs.len() {
                let Some(o) = self.graph.ops[op.0].outputs[k] else {
                    continue;
                };
                if reads.get(&o).is_some_and(|&n| n > 0)
                    && self.graph.st(o).is_resident()
                    && pinned.insert(o)
                {
                    self.graph.pin(o);
                    reserved.push(o);
                }
            }
            for i in unique {
                self.graph.st_mut(i).last_used = now;
                let Some(n) = reads.get_mut(&i) else {
                    continue;
                };
                *n -= 1;
                if *n == 0 && pinned.remove(&i) {
                    if let Some(p) = reserved.iter().rposition(|&r| r == i) {
                        reserved.swap_remove(p);
                    }
                    self.unpin_storage(i, false);
                }
            }
        }
        Ok(true)
    }

    /// Drop the running regeneration's work list: its frames, and the
    /// holds its `Need`s took and its kept inputs still have (each storage
    /// is an ordinary candidate again unless something else pins it).
    fn drop_work_list(&mut self) {
        self.frames.clear();
        self.kept.clear();
        let mut touched = std::mem::take(&mut self.touched);
        for &s in &touched {
            for _ in 0..self.graph.st(s).holds {
                self.unpin_storage(s, true);
            }
        }
        touched.clear();
        self.touched = touched;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{BudgetMode, DtrConfig, FnOp, OpError, OpHandle, OutputSpec, PolicyKind, TensorId};

    const B: u64 = 64;

    fn op(seed: u64) -> Arc<dyn OpHandle<u64>> {
        Arc::new(FnOp::new(format!("op{seed}"), move |ins: &[&u64]| {
            let h = ins
                .iter()
                .fold(seed, |h, v| h.rotate_left(9) ^ **v ^ 0x9e37);
            Ok::<_, OpError>(vec![h.wrapping_mul(0xbf58_476d_1ce4_e5b9)])
        }))
    }

    /// `x → a → b`, `c = f(a, b)`, `d = f(b, c)`; `big` (4 blocks) pinned;
    /// every intermediate evicted; `x` and `big` cannot be evicted (5
    /// blocks). Returns the runtime, the tensors
    /// `[x, a, b, c, d]` and their values.
    fn evicted_diamond(budget: u64) -> (Runtime<u64>, Vec<TensorId>, Vec<u64>) {
        let c = DtrConfig::default()
            .with_budget(budget)
            .with_budget_mode(BudgetMode::Logical)
            .with_policy(PolicyKind::DtrEq)
            .with_sampling(false);
        let mut rt = Runtime::new(c).unwrap();
        let x = rt.put(1, B).unwrap();
        let fresh = [OutputSpec::fresh(B)];
        let a = rt.apply(op(2), &[x], &fresh, 1).unwrap()[0];
        let b = rt.apply(op(3), &[a], &fresh, 1).unwrap()[0];
        let c = rt.apply(op(4), &[a, b], &fresh, 1).unwrap()[0];
        let d = rt.apply(op(5), &[b, c], &fresh, 1).unwrap()[0];
        let ts = vec![x, a, b, c, d];
        let values = ts.iter().map(|&t| *rt.access(t).unwrap()).collect();
        for &t in &ts[1..] {
            assert!(rt.evict(t).unwrap());
        }
        let big = rt.put(7, 4 * B).unwrap();
        rt.pin(big).unwrap();
        (rt, ts, values)
    }

    /// The region of `d` is its four producers; every order runs each after
    /// the producers of its inputs, and the pass's peak is exact: at most
    /// three of `a`..`d` at once (`a` is last read by `c`'s op, `b` by
    /// `d`'s; `x` cannot be evicted, so it is not the pass's).
    #[test]
    fn orders_are_topological_and_the_peak_is_the_passes() {
        let (rt, ts, _) = evicted_diamond(1 << 20);
        let d = rt.storage_of(ts[4]).unwrap();
        let region = rt.region_left(&[d]).unwrap();
        assert_eq!(region.ops.len(), 4);
        let orders = [
            rt.region_creation_order(&region),
            rt.depth_first_order(&[d], &region, false),
            rt.depth_first_order(&[d], &region, true),
        ];
        for order in &orders {
            assert_eq!(order.len(), 4);
            let pos = |op: OpId| order.iter().position(|&o| o == op).unwrap();
            for &op in order {
                for &i in &rt.graph.ops[op.0].unique_inputs {
                    if let Some(p) = rt.graph.st(i).producer.filter(|p| region.ops.contains(p)) {
                        assert!(pos(p) < pos(op), "{order:?}");
                    }
                }
            }
            assert_eq!(rt.pass_peak(order, &region.reads), 3 * B);
        }
    }

    /// Where the pass fits, each op of the region runs once and every value
    /// comes back bit-identical; where what cannot be evicted (5 blocks)
    /// and the pass's peak (3) pass the budget by one byte, nothing is
    /// replayed and keeping goes on.
    #[test]
    fn the_pass_runs_each_op_once_where_it_fits_and_nothing_where_not() {
        let (mut rt, ts, _) = evicted_diamond(8 * B - 1);
        let d = rt.storage_of(ts[4]).unwrap();
        assert!(!rt.replay_region_in_order(&[d]).unwrap());
        assert_eq!(rt.stats().rematerializations, 0);
        assert!(rt.frames.is_empty());

        let (mut rt, ts, values) = evicted_diamond(8 * B);
        let d = rt.storage_of(ts[4]).unwrap();
        assert!(rt.replay_region_in_order(&[d]).unwrap());
        assert_eq!(rt.stats().rematerializations, 4);
        assert_eq!(rt.stats().ordered_regenerations, 1);
        assert!(matches!(rt.frames[..], [Frame::Need(t)] if t == d));
        rt.frames.clear();
        assert!(rt.is_resident(ts[4]).unwrap());
        rt.check_invariants().unwrap();
        for (&t, &v) in ts.iter().zip(&values) {
            assert_eq!(*rt.access(t).unwrap(), v);
        }
    }
}
