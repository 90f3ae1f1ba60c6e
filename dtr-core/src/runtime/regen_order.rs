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
//! what it regenerates, as before, unless `ordered_recompute` is on (off by
//! default): then values are dropped inside the pass and made again by one
//! more replay of their op just before their next read, chosen greedily by
//! the bytes over the budget each drop removes per ns it replays, until the
//! pass fits or no drop helps ([`Runtime::fit_pass`]). At most as many
//! drops as the region has ops, so such a pass runs at most twice as many
//! ops as its region; its peak is computed exactly like the plain pass's,
//! for the pass with its drops.
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
}

/// One pass over a region, as it runs.
struct Pass {
    /// Its entries in order: an op, and `true` where it runs again to make
    /// a value the pass dropped (its only output) before that value's next
    /// read.
    ops: Vec<(OpId, bool)>,
    /// The resident values it reads: reserved from the start.
    start: Vec<StorageId>,
    /// After each entry: the values it made that are read before they are
    /// made again (reserved until then).
    keep: Vec<Vec<StorageId>>,
    /// After each entry: the values it read for the last time before they
    /// are made again, or at all (released).
    release: Vec<Vec<StorageId>>,
    /// Bytes the pass holds at each position (0: the start; `i + 1`: while
    /// entry `i` runs; the last: after the end), beyond what stays pinned.
    live: Vec<u64>,
    /// The most of `live`.
    peak: u64,
    /// Bytes the pass holds both at position `q` and at `q + 1` (the values
    /// an entry inserted between them finds resident).
    across: Vec<u64>,
    /// Each value's intervals in order: where it became resident, where it
    /// was last held (positions), and its bytes if they are the pass's.
    spans: AHashMap<StorageId, Vec<(usize, usize, u64)>>,
    /// Each value made by an entry and read later: the entry, and the
    /// entries that read it before it is made again (`ops.len()`: a target,
    /// read at the end).
    made: Vec<Interval>,
}

/// A value made by one entry of a pass, and its reads until it is made again.
struct Interval {
    made_at: usize,
    reads: Vec<usize>,
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
        let Some(pass) = [
            self.region_creation_order(&region),
            self.depth_first_order(targets, &region, false),
            self.depth_first_order(targets, &region, true),
        ]
        .into_iter()
        .filter_map(|order| {
            let ops = order.into_iter().map(|op| (op, false)).collect();
            self.analyse_pass(ops, targets)
        })
        .min_by_key(|pass| pass.peak) else {
            return Ok(false);
        };
        let avail = capacity.saturating_sub(fixed);
        let pass = match pass.peak <= avail || self.config.ordered_recompute {
            true => self.fit_pass(pass, targets, avail),
            false => None,
        };
        let Some(pass) = pass else {
            return Ok(false);
        };
        self.drop_work_list();
        let mut reserved: Vec<StorageId> = Vec::new();
        let result = self.run_region(&pass, &mut reserved);
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
        let (ops, _, replayable) = self.evicted_region(targets);
        replayable.then_some(Region { ops })
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

    /// The pass that runs `ops` in order, or `None` where an entry reads a
    /// value no earlier entry makes (not a topological order). The bytes it
    /// holds are the resident values it reads that nothing else pins
    /// (reserved from the start), plus each value it makes resident (replayed
    /// outputs, swapped inputs copied back), each until its last read before
    /// it is made again (or at all); an output nothing reads counts only
    /// while its op runs. The targets are read at the end.
    fn analyse_pass(&self, ops: Vec<(OpId, bool)>, targets: &[StorageId]) -> Option<Pass> {
        /// A value's current interval: how it became resident, the
        /// position it did (0: the start; `i + 1`: entry `i`), the entries
        /// that read it since, and whether its bytes are the pass's.
        struct Open {
            made: bool,
            swapped: bool,
            at: usize,
            reads: Vec<usize>,
            counted: bool,
        }
        let n = ops.len();
        let mut pass = Pass {
            start: Vec::new(),
            keep: vec![Vec::new(); n],
            release: vec![Vec::new(); n],
            live: Vec::new(),
            peak: 0,
            across: Vec::new(),
            spans: AHashMap::new(),
            made: Vec::new(),
            ops,
        };
        // Bytes by position: +bytes where an interval starts, -bytes one
        // past where it ends (positions 0 ..= n + 1; n + 1: after the end).
        let mut delta = vec![0i64; n + 3];
        let mut delta_across = vec![0i64; n + 3];
        let mut close = |pass: &mut Pass, s: StorageId, o: Open| {
            let end = o.reads.last().map_or(o.at, |&r| r + 1);
            let bytes = if o.counted { self.graph.st(s).bytes } else { 0 };
            delta[o.at] += bytes as i64;
            delta[end + 1] -= bytes as i64;
            delta_across[o.at] += bytes as i64;
            delta_across[end] -= bytes as i64;
            pass.spans.entry(s).or_default().push((o.at, end, bytes));
            if let Some(&last) = o.reads.last().filter(|&&r| r < n) {
                pass.release[last].push(s);
            }
            if o.made && !o.reads.is_empty() {
                pass.keep[o.at - 1].push(s);
                pass.made.push(Interval {
                    made_at: o.at - 1,
                    reads: o.reads,
                });
            } else if !o.made && !o.swapped {
                pass.start.push(s);
            }
        };
        let mut open: AHashMap<StorageId, Open> = AHashMap::new();
        let read = |open: &mut AHashMap<StorageId, Open>, u: StorageId, i: usize| {
            if let Some(o) = open.get_mut(&u) {
                o.reads.push(i);
                return Some(());
            }
            let r = self.graph.st(u);
            let (swapped, at, counted) = match r.residency {
                Residency::Resident => (
                    false,
                    0,
                    r.cand_pos != NONE || (r.holds > 0 && r.pins == r.holds),
                ),
                // A target in the host tier comes back through its `Need`.
                Residency::Swapped if i == n => return Some(()),
                Residency::Swapped => (true, i + 1, true),
                Residency::Evicted => return None,
            };
            let reads = vec![i];
            open.insert(
                u,
                Open {
                    made: false,
                    swapped,
                    at,
                    reads,
                    counted,
                },
            );
            Some(())
        };
        for i in 0..n {
            let (op, again) = pass.ops[i];
            let rec = &self.graph.ops[op.0];
            for &u in &rec.unique_inputs {
                read(&mut open, u, i)?;
            }
            for &o in rec.outputs.iter().flatten() {
                // An op's first entry makes its evicted outputs; an entry
                // again, its only output (the value the pass dropped).
                if !again && self.graph.st(o).residency != Residency::Evicted {
                    continue;
                }
                if let Some(prev) = open.remove(&o) {
                    close(&mut pass, o, prev);
                }
                let reads = Vec::new();
                let at = i + 1;
                open.insert(
                    o,
                    Open {
                        made: true,
                        swapped: false,
                        at,
                        reads,
                        counted: true,
                    },
                );
            }
        }
        for &t in targets {
            read(&mut open, t, n)?;
        }
        let mut left: Vec<(StorageId, Open)> = open.into_iter().collect();
        left.sort_unstable_by_key(|(s, _)| s.0);
        for (s, o) in left {
            close(&mut pass, s, o);
        }
        pass.start.sort_unstable_by_key(|s| s.0);
        pass.live = running_sum(&delta[..n + 2]);
        pass.peak = pass.live.iter().copied().max().unwrap_or(0);
        pass.across = running_sum(&delta_across[..n + 2]);
        Some(pass)
    }

    /// `pass`, or where its peak passes `avail`, the same order with values
    /// dropped inside it and made again before their next read, until it
    /// fits; `None` where it cannot be made to fit.
    ///
    /// Each step takes the position of the peak and, among the values live
    /// there but not read there (made by an entry of the pass, the only
    /// output of their op), drops the one whose drop lowers the bytes
    /// over `avail`, summed over the pass, the most per ns of the op run
    /// again; it ends where no drop lowers them. A drop adds one replay of
    /// one op, and there are at most as many drops as the region has ops,
    /// so a pass runs at most twice as many ops as its region (a count: an
    /// op may be dropped more than once). The op run again reads its inputs
    /// then, which holds them longer: each candidate is priced with that
    /// ([`Runtime::over_after_drop`], exact: the pass taken is analysed
    /// whole, and debug builds check the two agree), in the order of an
    /// upper bound on what it can remove, and the search ends once no
    /// bound left beats the best.
    fn fit_pass(&self, mut pass: Pass, targets: &[StorageId], avail: u64) -> Option<Pass> {
        let over = |p: &Pass| -> u64 { p.live.iter().map(|&l| l.saturating_sub(avail)).sum() };
        // What a drop replays: its op's ns, and one so a free op still costs.
        let price = |op: OpId| self.graph.ops[op.0].cost.max(0.0) + 1.0;
        let limit = pass.ops.len();
        let mut drops = 0;
        if pass.peak > avail && !self.may_fit(&pass, avail) {
            return None;
        }
        while pass.peak > avail {
            let (pos, _) =
                (pass.live.iter().enumerate()).max_by_key(|&(p, &l)| (l, std::cmp::Reverse(p)))?;
            if drops >= limit || pos == 0 || pos > pass.ops.len() {
                return None;
            }
            let e = pos - 1;
            let now = over(&pass);
            // Bytes over `avail` by position, summed from the start (`sum`),
            // and the positions over it (`count`): a drop that frees `bytes`
            // over positions a..=b lowers the sum by at most
            // min(bytes × count, sum) over them, which orders the
            // candidates and ends the search once none can beat the best.
            let (mut sum, mut count) = (vec![0u64], vec![0u64]);
            for &l in &pass.live {
                sum.push(sum.last().copied().unwrap_or(0) + l.saturating_sub(avail));
                count.push(count.last().copied().unwrap_or(0) + u64::from(l > avail));
            }
            let mut candidates: Vec<(f64, usize, OpId, u64, usize)> = Vec::new();
            let mut droppable = 0u64;
            for iv in &pass.made {
                if iv.made_at >= e || iv.reads.contains(&e) {
                    continue;
                }
                let Some(&next) = iv.reads.iter().find(|&&r| r > e) else {
                    continue;
                };
                let op = pass.ops[iv.made_at].0;
                let Some(value) = self.only_output(op) else {
                    continue;
                };
                // Out from after its last read before `e` (or its entry)
                // to its next read: positions a ..= b.
                let last = iv.reads.iter().rev().find(|&&r| r < e).copied();
                let (a, b) = (last.unwrap_or(iv.made_at) + 2, next);
                let bytes = self.graph.st(value).bytes;
                droppable += bytes;
                let bound = (bytes * (count[b + 1] - count[a])).min(sum[b + 1] - sum[a]);
                candidates.push((bound as f64 / price(op), next, op, bytes, a));
            }
            // What no drop can take from the peak's position stays there.
            if pass.live[pos].saturating_sub(droppable) > avail {
                return None;
            }
            candidates.sort_by(|x, y| y.0.total_cmp(&x.0));
            let mut best: Option<(f64, usize, OpId, u64)> = None;
            for (bound, next, op, bytes, out) in candidates {
                if best.as_ref().is_some_and(|b| bound <= b.0) {
                    break;
                }
                let Some(after) = self.over_after_drop(&pass, avail, now, op, bytes, out, next)
                else {
                    continue;
                };
                let gain = now.saturating_sub(after);
                let score = gain as f64 / price(op);
                if gain > 0 && best.as_ref().is_none_or(|b| score > b.0) {
                    best = Some((score, next, op, after));
                }
            }
            let (_, next, op, after) = best?;
            let mut ops = pass.ops.clone();
            ops.insert(next, (op, true));
            pass = self.analyse_pass(ops, targets)?;
            debug_assert_eq!(over(&pass), after, "a drop's price is its pass's");
            drops += 1;
        }
        Some(pass)
    }

    /// The bytes over `avail`, summed over the positions of `pass` (`now`
    /// before), once `op` runs again as a new entry at index `next` to make
    /// its only output, of `bytes`, which is then out of memory from
    /// position `out` to `next`'s; its inputs are held from their last read
    /// to the new entry. What [`Runtime::analyse_pass`] would count for that
    /// pass, without building it; `None` where an input is not resident by
    /// then (not a topological order).
    #[allow(clippy::too_many_arguments)]
    fn over_after_drop(
        &self,
        pass: &Pass,
        avail: u64,
        now: u64,
        op: OpId,
        bytes: u64,
        out: usize,
        next: usize,
    ) -> Option<u64> {
        // Inputs held longer: (first position they now cover, bytes).
        let mut longer: Vec<(usize, u64)> = Vec::new();
        for &i in &self.graph.ops[op.0].unique_inputs {
            let &(_, end, held) = (pass.spans.get(&i)?.iter())
                .rev()
                .find(|&&(at, _, _)| at <= next)?;
            if end < next + 1 {
                longer.push((end + 1, held));
            }
        }
        let from = longer.iter().map(|&(p, _)| p).fold(out, usize::min);
        let (mut before, mut after) = (0u64, 0u64);
        for p in from..=next {
            let mut live = pass.live[p];
            before += live.saturating_sub(avail);
            if p >= out {
                live -= bytes;
            }
            live += (longer.iter())
                .filter(|&&(q, _)| p >= q)
                .map(|&(_, b)| b)
                .sum::<u64>();
            after += live.saturating_sub(avail);
        }
        // The new entry's position: what spans it, and the inputs held to it.
        let inserted = pass.across[next] + longer.iter().map(|&(_, b)| b).sum::<u64>();
        Some(now - before + after + inserted.saturating_sub(avail))
    }

    /// Whether at every position of `pass`, what no drop can take away
    /// (values read there or made there, the start's, the host tier's, the
    /// outputs of ops with several) fits `avail`: a necessary condition for
    /// [`Runtime::fit_pass`], and one walk over the pass.
    fn may_fit(&self, pass: &Pass, avail: u64) -> bool {
        let mut delta = vec![0i64; pass.live.len() + 1];
        for iv in &pass.made {
            let Some(value) = self.only_output(pass.ops[iv.made_at].0) else {
                continue;
            };
            let bytes = self.graph.st(value).bytes as i64;
            // Strictly between consecutive events (positions: entry + 1).
            let mut at = iv.made_at + 1;
            for &r in &iv.reads {
                if r + 1 > at + 1 {
                    delta[at + 1] += bytes;
                    delta[r + 1] -= bytes;
                }
                at = r + 1;
            }
        }
        let mut droppable = 0i64;
        (pass.live.iter().zip(&delta)).all(|(&live, &d)| {
            droppable += d;
            live.saturating_sub(droppable.max(0) as u64) <= avail
        })
    }

    /// `op`'s output where it has exactly one (not yet deleted): the only
    /// outputs a pass may drop, since running the op again makes just it.
    fn only_output(&self, op: OpId) -> Option<StorageId> {
        let mut outputs = self.graph.ops[op.0].outputs.iter().flatten();
        match (outputs.next(), outputs.next()) {
            (Some(&value), None) => Some(value),
            _ => None,
        }
    }

    /// Run `pass`: every value with a read left is reserved (pinned) from
    /// when it is resident to its last read before it is made again; an
    /// entry that makes a dropped value again runs only if that value was
    /// evicted meanwhile. The pins still taken are in `reserved` when it
    /// returns. `Ok(false)` when an input is not there to be read (the
    /// reservations rule it out; the work list then goes on).
    fn run_region(&mut self, pass: &Pass, reserved: &mut Vec<StorageId>) -> Result<bool> {
        // Membership of `reserved` (a vector, so that releases keep one order).
        let mut pinned: AHashSet<StorageId> = AHashSet::with_capacity(pass.start.len());
        for &s in &pass.start {
            if self.graph.st(s).is_resident() {
                self.graph.pin(s);
                reserved.push(s);
                pinned.insert(s);
            }
        }
        for (i, &(op, again)) in pass.ops.iter().enumerate() {
            let unique = self.graph.ops[op.0].unique_inputs.clone();
            for &u in &unique {
                match self.graph.st(u).residency {
                    Residency::Resident => {}
                    Residency::Swapped => {
                        self.swap_in(u)?;
                        self.graph.pin(u);
                        reserved.push(u);
                        pinned.insert(u);
                    }
                    Residency::Evicted => return Ok(false),
                }
            }
            let evicted = |o: &StorageId| self.graph.st(*o).residency == Residency::Evicted;
            if !again || pass.keep[i].iter().any(evicted) {
                self.rematerialize_pinned(op, &unique)?;
                self.stats.ordered_recomputes += u64::from(again);
            }
            let now = self.graph.clock;
            for &o in &pass.keep[i] {
                if self.graph.st(o).is_resident() && pinned.insert(o) {
                    self.graph.pin(o);
                    reserved.push(o);
                }
            }
            for &u in &unique {
                self.graph.st_mut(u).last_used = now;
            }
            for &s in &pass.release[i] {
                if pinned.remove(&s) {
                    if let Some(p) = reserved.iter().rposition(|&r| r == s) {
                        reserved.swap_remove(p);
                    }
                    self.unpin_storage(s, false);
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

/// The running sums of `deltas`, each at least 0: bytes by position from
/// the changes at each.
fn running_sum(deltas: &[i64]) -> Vec<u64> {
    let mut sum = 0i64;
    (deltas.iter())
        .map(|&d| {
            sum += d;
            sum.max(0) as u64
        })
        .collect()
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
            let ops = order.iter().map(|&op| (op, false)).collect();
            assert_eq!(rt.analyse_pass(ops, &[d]).unwrap().peak, 3 * B);
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

    /// `x → a → b → c → e`, `d = f(a, e)`; `b`, `c`, `e` are 2 blocks, the
    /// rest one; all but `x` evicted. The pass over `d`'s region holds `a`
    /// from its replay to `d`'s: 5 blocks at `c`'s op, 6 with `x`. With
    /// `ordered_recompute` and a budget of 5 blocks, it drops `a` after `b`
    /// reads it and replays `a`'s op again before `d` (4 blocks at most):
    /// one op more, the same values; without it nothing is replayed.
    #[test]
    fn a_pass_that_does_not_fit_recomputes_inside_it_where_that_fits() {
        let run = |recompute: bool| {
            let c = DtrConfig::default()
                .with_budget(5 * B)
                .with_budget_mode(BudgetMode::Logical)
                .with_policy(PolicyKind::DtrEq)
                .with_sampling(false)
                .with_ordered_recompute(recompute);
            let mut rt = Runtime::new(c).unwrap();
            let x = rt.put(1, B).unwrap();
            let (one, two) = ([OutputSpec::fresh(B)], [OutputSpec::fresh(2 * B)]);
            let a = rt.apply(op(2), &[x], &one, 1).unwrap()[0];
            let b = rt.apply(op(3), &[a], &two, 1).unwrap()[0];
            let c = rt.apply(op(4), &[b], &two, 1).unwrap()[0];
            let e = rt.apply(op(5), &[c], &two, 1).unwrap()[0];
            let d = rt.apply(op(6), &[a, e], &one, 1).unwrap()[0];
            let ts = [a, b, c, e, d];
            let values: Vec<u64> = ts.iter().map(|&t| *rt.access(t).unwrap()).collect();
            // The budget evicted some while they were made and read.
            for &t in &ts {
                if rt.is_resident(t).unwrap() {
                    assert!(rt.evict(t).unwrap());
                }
            }
            let target = rt.storage_of(d).unwrap();
            let before = rt.stats().rematerializations;
            let ran = rt.replay_region_in_order(&[target]).unwrap();
            let replays = rt.stats().rematerializations - before;
            (rt, ts, values, ran, replays)
        };
        let (_, _, _, ran, replays) = run(false);
        assert!(!ran);
        assert_eq!(replays, 0);

        let (mut rt, ts, values, ran, replays) = run(true);
        assert!(ran);
        assert_eq!(replays, 6);
        assert_eq!(rt.stats().ordered_recomputes, 1);
        rt.frames.clear();
        rt.check_invariants().unwrap();
        assert!(rt.is_resident(ts[4]).unwrap());
        assert_eq!(*rt.access(ts[4]).unwrap(), values[4]);
        for (&t, &v) in ts.iter().zip(&values) {
            assert_eq!(*rt.access(t).unwrap(), v);
        }
    }
}
