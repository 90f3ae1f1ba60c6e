//! Analysis only: eviction policies that read the rest of the trace.
//!
//! No runtime can know the future; these exist to measure how much of remat's
//! overhead comes from *not* knowing it, i.e. what an online policy could still
//! gain, and where a gap is the allocator's instead (`docs/dtr-results.md`).
//!
//! The replay first runs the trace without a budget and records, for every
//! storage in creation order, the instructions that read it directly (as an
//! argument of `CALL`/`MUTATE`, or as an output at the end); then it replays under
//! the budget with an [`OracleKind`] policy that looks those reads up.
//!
//! | oracle | prices a candidate by | places (physical budget) |
//! |---|---|---|
//! | `next-use` | e* (exact) / (bytes · time to its next direct read) — Belady with recompute costs | remat's cheapest window, block cost e* / time to next read |
//! | `dead` | remat's score, but a storage the trace never reads again costs nothing | remat's cheapest window with those costs |
//! | `dead-after-backward` | as `dead`, but only once the trace's `BACKWARD` annotation has passed | the same |
//!
//! "Never read again" counts direct reads only: such a storage may still be
//! needed to regenerate others, and the replay pays for that when it happens.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use crate::ids::{StorageId, TensorId};
use crate::memory::BlockView;
use crate::policy::window::cheapest_window;
use crate::policy::{DecisionView, EvictionPolicy, RematPolicy};
use crate::runtime::Runtime;

/// Which future the analysis policy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OracleKind {
    /// Evict by recompute cost over bytes times the time to the next direct read.
    NextUse,
    /// remat's pricing, with storages never read again made free.
    Dead,
    /// As [`OracleKind::Dead`], but only after the `BACKWARD` annotation.
    DeadAfterBackward,
}

impl OracleKind {
    /// Every oracle.
    pub const ALL: [OracleKind; 3] = [
        OracleKind::NextUse,
        OracleKind::Dead,
        OracleKind::DeadAfterBackward,
    ];

    /// Name used on the command line and in reports (`oracle:` + name as the policy).
    pub fn name(self) -> &'static str {
        match self {
            OracleKind::NextUse => "next-use",
            OracleKind::Dead => "dead",
            OracleKind::DeadAfterBackward => "dead-after-backward",
        }
    }
}

impl fmt::Display for OracleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OracleKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown oracle `{s}`: expected next-use | dead | dead-after-backward")
            })
    }
}

/// What the unbudgeted pass saw: direct reads per storage (creation order) and
/// the first-computation clock before each instruction.
#[derive(Debug, Default)]
pub(crate) struct Future {
    /// `reads[seq]`: ascending instruction indices that read storage `seq`.
    reads: Vec<Vec<u32>>,
    /// `clock_at[i]`: ns of first computations before instruction `i`
    /// (`clock_at[len]`: at the end, where the outputs are read).
    clock_at: Vec<f64>,
}

impl Future {
    /// A future from reads by sequence number and the clock before each position.
    pub(crate) fn new(reads: Vec<Vec<u32>>, clock_at: Vec<f64>) -> Self {
        Self { reads, clock_at }
    }

    /// ns from instruction `pos` to the next direct read of `seq` after it;
    /// `None` when the trace never reads it again.
    pub(crate) fn time_to_next_read(&self, seq: u64, pos: usize) -> Option<f64> {
        let reads = self.reads.get(seq as usize)?;
        let k = reads.partition_point(|&r| r as usize <= pos);
        let next = *reads.get(k)? as usize;
        let at = |i: usize| self.clock_at.get(i).copied().unwrap_or(0.0);
        Some((at(next) - at(pos)).max(0.0) + 1.0)
    }
}

/// Where the budgeted replay is, shared with its oracle policy.
#[derive(Debug, Default)]
struct Progress {
    /// Instruction index being replayed.
    pos: usize,
    /// The `BACKWARD` annotation has passed.
    backward: bool,
    /// Creation sequence number by storage slab index (indices are reused).
    seq_of: Vec<u64>,
}

/// The replayer's side: numbers storages in creation order, records reads (in
/// the unbudgeted pass) and tells the oracle policy where the replay is.
#[derive(Debug)]
pub(crate) struct Tracker {
    progress: Arc<Mutex<Progress>>,
    next_seq: u64,
    /// `Some` while recording the future.
    recording: Option<Future>,
}

impl Tracker {
    /// A tracker that records what the trace reads.
    pub(crate) fn recorder() -> Self {
        Self {
            progress: Arc::default(),
            next_seq: 0,
            recording: Some(Future::default()),
        }
    }

    /// The recorded future (after a recording pass).
    pub(crate) fn into_future(self) -> Future {
        self.recording.unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Instruction `pos` starts; `clock` is the first-computation clock.
    pub(crate) fn at(&mut self, pos: usize, clock: f64) {
        self.lock().pos = pos;
        if let Some(f) = &mut self.recording {
            if f.clock_at.len() <= pos {
                f.clock_at.resize(pos + 1, clock);
            }
            f.clock_at[pos] = clock;
        }
    }

    /// The `BACKWARD` annotation.
    pub(crate) fn backward(&mut self) {
        self.lock().backward = true;
    }

    /// `t`'s storage was just created.
    pub(crate) fn created<V>(&mut self, rt: &Runtime<V>, t: TensorId) {
        let Ok(s) = rt.storage_of(t) else { return };
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut p = self.lock();
        let i = s.index() as usize;
        if p.seq_of.len() <= i {
            p.seq_of.resize(i + 1, u64::MAX);
        }
        p.seq_of[i] = seq;
        drop(p);
        if let Some(f) = &mut self.recording {
            f.reads.push(Vec::new());
        }
    }

    /// The current instruction reads `tensors` directly.
    pub(crate) fn read<V>(&mut self, rt: &Runtime<V>, tensors: &[TensorId]) {
        if self.recording.is_none() {
            return;
        }
        let p = self.lock();
        let pos = p.pos as u32;
        let seqs: Vec<u64> = tensors
            .iter()
            .filter_map(|&t| rt.storage_of(t).ok())
            .filter_map(|s| p.seq_of.get(s.index() as usize).copied())
            .collect();
        drop(p);
        let Some(f) = &mut self.recording else { return };
        for seq in seqs {
            if let Some(r) = f.reads.get_mut(seq as usize) {
                if r.last() != Some(&pos) {
                    r.push(pos);
                }
            }
        }
    }
}

/// An [`OracleKind`] policy and the tracker the replayer must feed.
pub(crate) fn policy(kind: OracleKind, future: Future) -> (OraclePolicy, Tracker) {
    let tracker = Tracker {
        progress: Arc::default(),
        next_seq: 0,
        recording: None,
    };
    let policy = OraclePolicy {
        kind,
        future: Arc::new(future),
        progress: Some(tracker.progress.clone()),
        blocks: Vec::new(),
        e_star: EStar::Exact,
        perturbation: 0,
    };
    (policy, tracker)
}

/// The same pricing over a *recorded* iteration, for the planner: the position is
/// the runtime's call index and storages are named by their sequence number in
/// the iteration, so the runtime itself says where it is (see [`crate::planner`]).
pub(crate) fn learned(kind: OracleKind, future: Arc<Future>, e_star: EStar) -> OraclePolicy {
    learned_perturbed(kind, future, e_star, 0)
}

/// [`learned`], with every storage's price scaled by its fixed pseudo-random
/// factor under `seed` ([`crate::rng::price_factor`]; `seed` 0: none), so a
/// perturbed entry is another consistent greedy schedule.
pub(crate) fn learned_perturbed(
    kind: OracleKind,
    future: Arc<Future>,
    e_star: EStar,
    seed: u64,
) -> OraclePolicy {
    OraclePolicy {
        kind,
        future,
        progress: None,
        blocks: Vec::new(),
        e_star,
        perturbation: seed,
    }
}

/// How a next-use price computes e* (the recompute cost of a candidate with its
/// evicted neighbourhood).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EStar {
    /// The exact walk (the analysis oracle).
    Exact,
    /// The union-find sums of h_DTR^eq (O(α) per candidate).
    UnionFind,
    /// A walk over at most this many evicted nodes.
    Walk(usize),
}

/// The analysis policy (see the module doc).
pub(crate) struct OraclePolicy {
    kind: OracleKind,
    future: Arc<Future>,
    /// The replayer's position; `None`: the runtime's own (learned policies).
    progress: Option<Arc<Mutex<Progress>>>,
    blocks: Vec<BlockView>,
    e_star: EStar,
    /// Seed of the price perturbation (0: none; see [`learned_perturbed`]).
    perturbation: u64,
}

impl OraclePolicy {
    /// ns until `s` is read directly again (`None`: never).
    fn time_to_next_read(&self, p: &Progress, s: StorageId) -> Option<f64> {
        let seq = *p.seq_of.get(s.index() as usize)?;
        self.future.time_to_next_read(seq, p.pos)
    }

    /// The learned variant's position: the runtime's call index and sequence
    /// numbers, packed into a [`Progress`] with one entry.
    fn locate(v: &DecisionView<'_>, s: StorageId) -> (u64, usize) {
        (v.seq(s) as u64, v.position() as usize)
    }

    /// The block cost the window search uses: what evicting `s` is expected to
    /// cost, per ns of staleness (remat's, thrash guard included) or per ns until
    /// its next read (next-use).
    fn cost(&self, p: Option<&Progress>, v: &mut DecisionView<'_>, s: StorageId) -> f64 {
        let c = self.cost_plain(p, v, s);
        crate::rng::perturb(c, self.perturbation, u64::from(v.seq(s)))
    }

    /// [`OraclePolicy::cost`] before the perturbation.
    fn cost_plain(&self, p: Option<&Progress>, v: &mut DecisionView<'_>, s: StorageId) -> f64 {
        let next = match p {
            Some(p) => self.time_to_next_read(p, s),
            None => {
                let (seq, pos) = Self::locate(v, s);
                self.future.time_to_next_read(seq, pos)
            }
        };
        match self.kind {
            OracleKind::NextUse => match next {
                // The analysis oracle walks the exact e*; the planner's learned
                // variants, run in many simulations, take a cheaper one.
                Some(t) => {
                    let e = match self.e_star {
                        EStar::Exact => v.e_star_exact(s),
                        EStar::UnionFind => v.e_star_eq(s),
                        EStar::Walk(n) => v.e_star_bounded(s, n),
                    };
                    e / t
                }
                None => 0.0,
            },
            OracleKind::Dead | OracleKind::DeadAfterBackward => {
                let knows = self.kind == OracleKind::Dead || p.is_some_and(|p| p.backward);
                if knows && next.is_none() {
                    0.0
                } else {
                    let use_stale = !v.thrashing();
                    RematPolicy::block_cost(v, s, use_stale)
                }
            }
        }
    }
}

impl EvictionPolicy for OraclePolicy {
    fn name(&self) -> &'static str {
        match (self.kind, self.progress.is_some()) {
            (OracleKind::NextUse, true) => "oracle:next-use",
            (OracleKind::Dead, true) => "oracle:dead",
            (OracleKind::DeadAfterBackward, true) => "oracle:dead-after-backward",
            (OracleKind::NextUse, false) => match self.e_star {
                EStar::Exact => "learned:next-use-exact",
                EStar::UnionFind => "learned:next-use",
                EStar::Walk(_) => "learned:next-use-walk",
            },
            (OracleKind::Dead, false) => "learned:dead",
            (OracleKind::DeadAfterBackward, false) => "learned:dead-after-backward",
        }
    }

    fn choose(&mut self, view: &mut DecisionView<'_>, victims: &mut Vec<StorageId>) {
        let progress = self.progress.clone();
        let guard = progress
            .as_ref()
            .map(|p| p.lock().unwrap_or_else(|e| e.into_inner()));
        let p = guard.as_deref();
        let mut blocks = std::mem::take(&mut self.blocks);
        let window = cheapest_window(view, &mut blocks, true, |v, s| self.cost(p, v, s));
        self.blocks = blocks;
        if let Some(w) = window {
            victims.extend(w.victims);
            return;
        }
        // No addresses, the threshold trigger, or no window: the cheapest
        // candidate per byte over all of them.
        let mut best: Option<(f64, StorageId)> = None;
        for i in 0..view.all_candidates().len() {
            let s = view.all_candidates()[i];
            let score = self.cost(p, view, s) / view.bytes(s).max(1) as f64;
            if best.is_none_or(|(b, _)| score < b) {
                best = Some((score, s));
            }
        }
        victims.extend(best.map(|b| b.1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_read_is_looked_up_after_the_current_instruction() {
        let f = Future {
            reads: vec![vec![2, 5], vec![]],
            clock_at: vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0],
        };
        assert_eq!(f.time_to_next_read(0, 0), Some(21.0));
        assert_eq!(f.time_to_next_read(0, 2), Some(31.0));
        assert_eq!(f.time_to_next_read(0, 5), None);
        assert_eq!(f.time_to_next_read(1, 0), None);
        assert_eq!(f.time_to_next_read(7, 0), None);
    }

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_allowed() {
        for k in OracleKind::ALL {
            assert_eq!(k.name().parse::<OracleKind>(), Ok(k));
        }
        let e = "belady".parse::<OracleKind>().unwrap_err();
        assert!(e.contains("next-use | dead | dead-after-backward"), "{e}");
    }
}
