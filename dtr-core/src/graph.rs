//! The value-free part of the runtime: storage and compute-path records, the
//! candidate set, the union-find over evicted storages, and the neighbourhood
//! queries policies ask for (e* exact, e* by union-find, upward region).
//!
//! Kept apart from the values (`Runtime<V>` holds those) so that policies are not
//! generic over the adapter's value type.

use crate::ids::{OpId, Slab, StorageId};
use crate::memory::Slot;
use crate::unionfind::UnionFind;

/// "No index" marker for `u32` links.
pub(crate) const NONE: u32 = u32::MAX;

/// Where a storage's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Resident: holds a slot and a value.
    Resident,
    /// Evicted (or fake-deleted): the record stays so it can be regenerated.
    Evicted,
    /// Swapped: its bytes are in the host tier (the runtime holds the host
    /// copy), no slot; one copy makes it resident again, needing none of its
    /// inputs (see [`crate::swap`]). Not part of any evicted region.
    Swapped,
}

/// One storage (the unit of eviction).
#[derive(Debug)]
pub(crate) struct StorageRec {
    /// Requested bytes.
    pub bytes: u64,
    pub residency: Residency,
    /// `Some` iff resident.
    pub slot: Option<Slot>,
    /// The compute path that produces it; `None` for external data.
    pub producer: Option<OpId>,
    /// Position among the producer's fresh outputs.
    pub output_index: u32,
    /// Live compute paths that read this storage (each listed once).
    pub users: Vec<OpId>,
    /// Live user handles on tensors of this storage (views included).
    pub handles: u32,
    /// Tensor slab indices of the live tensors on this storage.
    pub tensors: Vec<u32>,
    /// Pin count: user pins plus the runtime's transient holds.
    pub pins: u32,
    /// The part of `pins` taken by an in-flight regeneration (0 between calls).
    pub holds: u32,
    /// Clock (ns of compute so far) at the last use: the end of the op or
    /// access that read it; for a read by a regeneration, the clock after the
    /// replays below it ran, or, with `request_stamp`, the clock when that
    /// regeneration was asked for.
    pub last_used: f64,
    /// How many times it was rematerialized.
    pub recomputes: u32,
    /// Union-find node while evicted, else `NONE`.
    pub dsu: u32,
    /// Index in the candidate vector, else `NONE`.
    pub cand_pos: u32,
    /// All handles were released (fake-deleted while users remain).
    pub released: bool,
    /// Has a recomputable producer (so it may be evicted).
    pub recomputable: bool,
    /// The producer's cost in ns (0 for external data).
    pub cost: f64,
    /// Visit stamp for neighbourhood searches.
    pub stamp: u32,
    /// Creation order within its iteration (see [`crate::record`]).
    pub seq: u32,
    /// The iteration that created it: evicted storages of an earlier one are
    /// never regenerated (their inputs may have been updated since).
    pub epoch: u32,
    /// The host tier refused to take it (host budget full, or a failed copy):
    /// while set, a storage that cannot be recomputed is no candidate. Cleared
    /// when the host tier gives bytes back.
    pub swap_refused: bool,
    /// The host tier holds a copy of its value: it is swapped, or resident
    /// with a clean copy (see [`crate::HostTransfer::values_immutable`]).
    pub host_copy: bool,
    /// Its host copy was made ahead ([`crate::Runtime`]'s copy-ahead), not by
    /// a swap: priced as two copies all the same, so copying ahead changes
    /// when a victim's memory is free, never which victim is taken.
    pub copied_ahead: bool,
}

impl StorageRec {
    pub(crate) fn is_resident(&self) -> bool {
        self.residency == Residency::Resident
    }

    /// Its value exists: resident, or swapped to the host tier (not evicted).
    pub(crate) fn holds_value(&self) -> bool {
        self.residency != Residency::Evicted
    }

    /// Released, read by no compute path and unpinned: a real delete may
    /// free it (`Runtime::delete_cascade`).
    pub(crate) fn deletable(&self) -> bool {
        self.released && self.users.is_empty() && self.pins == 0
    }

    /// `op` no longer reads this storage.
    pub(crate) fn forget_user(&mut self, op: OpId) {
        if let Some(p) = self.users.iter().position(|u| *u == op) {
            self.users.swap_remove(p);
        }
    }
}

/// One compute path.
pub(crate) struct OpRec {
    /// Input storages in argument order (repeats allowed).
    pub inputs: Vec<StorageId>,
    /// Input storages, each once.
    pub unique_inputs: Vec<StorageId>,
    /// Fresh outputs; `None` once really deleted.
    pub outputs: Vec<Option<StorageId>>,
    /// Outputs not yet deleted.
    pub live_outputs: u32,
    /// Cost in ns.
    pub cost: f64,
}

/// A candidate's fields that scoring reads first (copied when it becomes one; a
/// candidate's record does not change while it is a candidate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hot {
    /// Requested bytes.
    pub bytes: u64,
    /// Own recompute cost (ns); with swap on, at most the swap's price
    /// (the swap's price alone for a storage that cannot be recomputed).
    pub cost: f64,
    /// Clock at last use.
    pub last_used: f64,
}

/// Records, candidates and the union-find.
#[derive(Default)]
pub(crate) struct Graph {
    pub storages: Slab<StorageRec>,
    pub ops: Slab<OpRec>,
    pub dsu: UnionFind,
    /// Resident, recomputable, unpinned storages of at least `min_evictee_bytes`.
    pub candidates: Vec<StorageId>,
    /// Hot fields of `candidates[i]`, kept alongside so a sampled decision reads one
    /// contiguous array instead of scattered records.
    pub hot: Vec<Hot>,
    /// Sum of candidate bytes (for the mean-size filter).
    pub candidate_bytes: u64,
    /// Smallest storage that may become a candidate.
    pub min_evictee_bytes: u64,
    /// With swap on: ns per byte of one copy to or from the host tier. Then
    /// non-recomputable storages are candidates too, and every candidate is
    /// priced by the cheaper of recomputation and its round trip
    /// ([`Graph::price`]).
    pub swap_ns_per_byte: Option<f64>,
    /// Compute clock in ns (first computations and rematerializations).
    pub clock: f64,
    /// Recent first-computation cost: op costs with a decay of
    /// [`Graph::RECENT_DECAY`] per op run or replayed (about the last thousand).
    pub recent_compute: f64,
    /// Recent rematerialization cost, decayed alike.
    pub recent_remat: f64,
    /// Index of the public call being run in the current iteration (policies
    /// that learned the iteration look their future up by it).
    pub pos: u32,
    pub(crate) stamp: u32,
    pub(crate) stack: Vec<StorageId>,
    pub(crate) roots: Vec<u32>,
    pub(crate) buf: Vec<StorageId>,
    /// Neighbour links the neighbourhood walks examined (e*, regions, the
    /// union-find's merges): with the candidates offered, the work of the
    /// policy decisions, which the planner bounds its search by.
    pub(crate) walk_steps: u64,
}

impl Graph {
    /// Decay of the recent cost sums per op event.
    pub const RECENT_DECAY: f64 = 0.999;
    /// Recent replay cost over recent first-computation cost above which the
    /// run counts as thrashing.
    pub const THRASH_FACTOR: f64 = 2.0;

    /// Count an op run for the first time (`remat = false`) or replayed.
    #[inline]
    pub fn note_op_cost(&mut self, cost: f64, remat: bool) {
        self.recent_compute *= Self::RECENT_DECAY;
        self.recent_remat *= Self::RECENT_DECAY;
        if remat {
            self.recent_remat += cost;
        } else {
            self.recent_compute += cost;
        }
    }

    /// Recently, replays cost more than [`Graph::THRASH_FACTOR`] times the first
    /// computations: the run is thrashing.
    #[inline]
    pub fn thrashing(&self) -> bool {
        self.recent_remat > Self::THRASH_FACTOR * self.recent_compute
    }

    /// Most evicted storages the threshold trigger lets one evicted region
    /// hold: a read of a storage it evicted replays at most this many ops
    /// (its evicted ancestors lie in its region).
    pub const THRESHOLD_REGION: u32 = 8;

    /// Whether the threshold trigger may evict `s`: the evicted region it would
    /// join (itself plus the evicted components next to it) holds at most
    /// [`Graph::THRESHOLD_REGION`] storages. Without this bound, a threshold of
    /// 0 evicts every chain whole, and each read of a value evicted between
    /// two uses replays the entire chain behind it (n²/2 replays for LU).
    pub(crate) fn threshold_evictable(&mut self, s: StorageId) -> bool {
        self.adjacent_region(s).1 <= Self::THRESHOLD_REGION
    }

    #[inline]
    pub(crate) fn st(&self, s: StorageId) -> &StorageRec {
        &self.storages[s.0]
    }

    #[inline]
    pub(crate) fn st_mut(&mut self, s: StorageId) -> &mut StorageRec {
        &mut self.storages[s.0]
    }

    /// Whether `s` may be a candidate right now: resident, unpinned, large
    /// enough, and recomputable or swappable.
    pub(crate) fn eligible(&self, s: StorageId) -> bool {
        let r = self.st(s);
        r.is_resident()
            && (r.recomputable || (self.swap_ns_per_byte.is_some() && !r.swap_refused))
            && r.pins == 0
            && r.bytes >= self.min_evictee_bytes
    }

    /// Turn swap pricing on (ns per byte of one copy) or off, and offer
    /// every storage again: one that was no candidate only for lack of
    /// recomputation may be one now (or no longer), and every candidate's
    /// price changes.
    pub(crate) fn set_swap_price(&mut self, ns_per_byte: Option<f64>) {
        self.swap_ns_per_byte = ns_per_byte;
        let ids: Vec<u32> = self.storages.iter().map(|(i, _)| i).collect();
        for i in ids {
            self.withdraw(StorageId(i));
            self.offer(StorageId(i));
        }
    }

    /// The online price (ns) of swapping `s`: a copy out (none when the
    /// host tier holds a clean copy) and a copy back, each waited for; `None`
    /// with swap off.
    #[inline]
    pub(crate) fn swap_price(&self, s: StorageId) -> Option<f64> {
        let r = self.st(s);
        let copies = if r.host_copy && !r.copied_ahead {
            1.0
        } else {
            2.0
        };
        self.swap_ns_per_byte.map(|k| copies * r.bytes as f64 * k)
    }

    /// What evicting `s` costs when recomputing it is priced `recompute`: the
    /// cheaper of that and its swap with swap on, the swap alone for a
    /// storage that cannot be recomputed.
    #[inline]
    pub(crate) fn price(&self, s: StorageId, recompute: f64) -> f64 {
        match self.swap_price(s) {
            None => recompute,
            Some(swap) if self.st(s).recomputable => recompute.min(swap),
            Some(swap) => swap,
        }
    }

    /// Whether the runtime should swap `s` rather than evict it for
    /// recomputation, which would cost `recompute` (ns) at its next use.
    pub(crate) fn prefers_swap(&self, s: StorageId, recompute: f64) -> bool {
        match self.swap_price(s) {
            None => false,
            Some(swap) => !self.st(s).recomputable || swap < recompute,
        }
    }

    /// What regenerating `s` alone would replay: its own cost plus its
    /// evicted ancestors', visiting at most `max_nodes` of them (ns).
    pub(crate) fn regeneration_cost(&mut self, s: StorageId, max_nodes: usize) -> f64 {
        self.st(s).cost + self.bounded_region(s, &[true], max_nodes, |r| r.cost)
    }

    /// Add `s` to the candidates if eligible and absent.
    pub(crate) fn offer(&mut self, s: StorageId) {
        if self.st(s).cand_pos == NONE && self.eligible(s) {
            let pos = self.candidates.len() as u32;
            self.candidates.push(s);
            let r = self.st(s);
            let (bytes, last_used) = (r.bytes, r.last_used);
            let cost = self.price(s, r.cost);
            self.hot.push(Hot {
                bytes,
                cost,
                last_used,
            });
            let r = self.st_mut(s);
            r.cand_pos = pos;
            let b = r.bytes;
            self.candidate_bytes += b;
        }
    }

    /// Remove `s` from the candidates if present (O(1) swap-remove).
    pub(crate) fn withdraw(&mut self, s: StorageId) {
        let pos = self.st(s).cand_pos;
        if pos == NONE {
            return;
        }
        let last = self.candidates.len() - 1;
        self.candidates.swap(pos as usize, last);
        self.candidates.pop();
        self.hot.swap(pos as usize, last);
        self.hot.pop();
        if (pos as usize) < self.candidates.len() {
            let moved = self.candidates[pos as usize];
            self.st_mut(moved).cand_pos = pos;
        }
        let r = self.st_mut(s);
        r.cand_pos = NONE;
        let b = r.bytes;
        self.candidate_bytes -= b;
    }

    pub(crate) fn pin(&mut self, s: StorageId) {
        self.withdraw(s);
        self.st_mut(s).pins += 1;
    }

    /// Evicted storages adjacent to `s`: inputs of its producer and fresh outputs of
    /// its users, appended to `out`.
    fn evicted_neighbours(
        &mut self,
        s: StorageId,
        out: &mut Vec<StorageId>,
        parents: bool,
        children: bool,
    ) {
        let mut steps = 0;
        let r = self.st(s);
        if parents {
            if let Some(op) = r.producer {
                steps += self.ops[op.0].unique_inputs.len();
                for &i in &self.ops[op.0].unique_inputs {
                    if self.st(i).residency == Residency::Evicted {
                        out.push(i);
                    }
                }
            }
        }
        if children {
            for &u in &r.users {
                steps += self.ops[u.0].outputs.len();
                for o in self.ops[u.0].outputs.iter().flatten() {
                    if self.st(*o).residency == Residency::Evicted {
                        out.push(*o);
                    }
                }
            }
        }
        self.walk_steps += steps as u64;
    }

    /// Merge a freshly evicted `s` into the components of its evicted neighbours.
    pub(crate) fn dsu_on_evict(&mut self, s: StorageId) {
        let node = self.dsu.make(self.st(s).cost);
        self.st_mut(s).dsu = node;
        let mut ns = std::mem::take(&mut self.stack);
        ns.clear();
        self.evicted_neighbours(s, &mut ns, true, true);
        for &n in &ns {
            let nn = self.st(n).dsu;
            if nn != NONE && n != s {
                self.dsu.union(node, nn);
            }
        }
        self.stack = ns;
    }

    /// Take a rematerialized `s` out of its component.
    pub(crate) fn dsu_on_remat(&mut self, s: StorageId) {
        let r = self.st(s);
        let (node, cost) = (r.dsu, r.cost);
        if node != NONE {
            self.dsu.subtract(node, cost);
            self.st_mut(s).dsu = NONE;
        }
    }

    /// h_DTR^eq's e*: own cost plus the summed cost of each distinct evicted
    /// component adjacent to `s` (each clamped to at least the neighbour's own cost).
    pub(crate) fn e_star_eq(&mut self, s: StorageId) -> f64 {
        self.adjacent_region(s).0
    }

    /// The evicted region `s` would join if evicted, by the union-find: its
    /// cost (`s`'s own plus each distinct adjacent component's, clamped to at
    /// least the neighbour's own cost) and its storages (`s` included).
    fn adjacent_region(&mut self, s: StorageId) -> (f64, u32) {
        let mut ns = std::mem::take(&mut self.stack);
        let mut roots = std::mem::take(&mut self.roots);
        ns.clear();
        roots.clear();
        self.evicted_neighbours(s, &mut ns, true, true);
        let (mut cost, mut members) = (self.st(s).cost, 1u32);
        for &n in &ns {
            let (node, ncost) = (self.st(n).dsu, self.st(n).cost);
            if node == NONE {
                cost += ncost;
                members += 1;
                continue;
            }
            let root = self.dsu.find(node);
            if !roots.contains(&root) {
                roots.push(root);
                let (c, m) = self.dsu.component(root);
                cost += c.max(ncost);
                members += m.max(1);
            }
        }
        self.stack = ns;
        self.roots = roots;
        (cost, members)
    }

    fn next_stamp(&mut self) -> u32 {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            let idx: Vec<u32> = self.storages.iter().map(|(i, _)| i).collect();
            for i in idx {
                self.storages[i].stamp = 0;
            }
            self.stamp = 1;
        }
        self.stamp
    }

    /// Summed cost of the evicted storages reachable from `s` through evicted
    /// ancestors (`up`) and/or evicted descendants (`down`), `s` excluded. O(region).
    pub(crate) fn region_cost(&mut self, s: StorageId, up: bool, down: bool) -> f64 {
        let stamp = self.next_stamp();
        self.st_mut(s).stamp = stamp;
        let mut total = 0.0;
        let mut work = std::mem::take(&mut self.stack);
        let mut buf = Vec::new();
        for (dir_up, enabled) in [(true, up), (false, down)] {
            if !enabled {
                continue;
            }
            work.clear();
            work.push(s);
            while let Some(x) = work.pop() {
                buf.clear();
                self.evicted_neighbours(x, &mut buf, dir_up, !dir_up);
                for &n in &buf {
                    let r = self.st_mut(n);
                    if r.stamp != stamp {
                        r.stamp = stamp;
                        total += r.cost;
                        work.push(n);
                    }
                }
            }
        }
        self.stack = work;
        total
    }

    /// Like [`Graph::region_cost`] in both directions, but visits at most
    /// `max_nodes` evicted storages (an under-estimate of exact e* beyond that).
    pub(crate) fn e_star_bounded(&mut self, s: StorageId, max_nodes: usize) -> f64 {
        self.st(s).cost + self.bounded_region(s, &[true, false], max_nodes, |r| r.cost)
    }

    /// Bytes of `s` plus its evicted ancestors (what regenerating `s` must place),
    /// visiting at most `max_nodes` of them: the order key of a regeneration.
    pub(crate) fn evicted_ancestor_bytes(&mut self, s: StorageId, max_nodes: usize) -> u64 {
        self.st(s).bytes + self.bounded_region(s, &[true], max_nodes, |r| r.bytes as f64) as u64
    }

    /// Sum of `weight` over the evicted storages reachable from `s` through
    /// evicted ancestors (`true` in `dirs`) and/or descendants (`false`), `s`
    /// excluded, stopping after `max_nodes` of them.
    fn bounded_region(
        &mut self,
        s: StorageId,
        dirs: &[bool],
        max_nodes: usize,
        weight: impl Fn(&StorageRec) -> f64,
    ) -> f64 {
        let stamp = self.next_stamp();
        self.st_mut(s).stamp = stamp;
        let mut total = 0.0;
        let mut seen = 0usize;
        let mut work = std::mem::take(&mut self.stack);
        let mut buf = std::mem::take(&mut self.buf);
        'dirs: for &dir_up in dirs {
            work.clear();
            work.push(s);
            while let Some(x) = work.pop() {
                buf.clear();
                self.evicted_neighbours(x, &mut buf, dir_up, !dir_up);
                for &n in &buf {
                    let r = self.st_mut(n);
                    if r.stamp != stamp {
                        r.stamp = stamp;
                        total += weight(r);
                        seen += 1;
                        if seen >= max_nodes {
                            break 'dirs;
                        }
                        work.push(n);
                    }
                }
            }
        }
        self.stack = work;
        self.buf = buf;
        total
    }

    /// h_DTR's exact e*: own cost plus the evicted ancestor and descendant regions.
    pub(crate) fn e_star_exact(&mut self, s: StorageId) -> f64 {
        self.st(s).cost + self.region_cost(s, true, true)
    }
}

#[cfg(test)]
mod tests {
    use super::Graph;

    #[test]
    fn thrashing_follows_recent_replay_cost_not_the_whole_run() {
        let mut g = Graph::default();
        assert!(!g.thrashing());
        for _ in 0..1000 {
            g.note_op_cost(10.0, false);
        }
        g.note_op_cost(15.0, true);
        assert!(!g.thrashing(), "a replay cheaper than the recent compute");
        for _ in 0..50 {
            g.note_op_cost(1000.0, true);
        }
        assert!(g.thrashing(), "{} vs {}", g.recent_remat, g.recent_compute);
        // Enough first computations later, the early thrash is forgotten.
        for _ in 0..20_000 {
            g.note_op_cost(10.0, false);
        }
        assert!(!g.thrashing(), "{} vs {}", g.recent_remat, g.recent_compute);
    }
}
