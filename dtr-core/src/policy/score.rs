//! Score policies: evict the sampled candidate with the smallest score.
//!
//! | kind | score (smaller is evicted) |
//! |---|---|
//! | h_DTR | e*(exact) / (bytes · staleness) |
//! | h_DTR^eq | e*(union-find) / (bytes · staleness) |
//! | h_DTR^local | cost / (bytes · staleness) |
//! | MSPS | (cost + evicted ancestors' cost) / bytes |
//! | LRU | −staleness |
//! | largest-first | −bytes |
//! | MegEngine | (e*_eq + 1e-3)^a · r^recomputes / (((bytes + free_left + free_right)/MiB)^b · (staleness/1e8 + 1e-3)^c) |

use super::{DecisionView, EvictionPolicy};
use crate::config::MegEngineParams;
use crate::ids::StorageId;

/// Which score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreKind {
    /// h_DTR with exact e*.
    DtrExact,
    /// h_DTR^eq.
    DtrEq,
    /// h_DTR^local.
    DtrLocal,
    /// Memory saved per second of recomputation.
    Msps,
    /// Least recently used.
    Lru,
    /// Largest first.
    LargestFirst,
    /// MegEngine's fragmentation-aware score.
    MegEngine(MegEngineParams),
}

/// A policy that evicts the argmin of a [`ScoreKind`] over the sampled pool.
#[derive(Debug, Clone)]
pub struct ScorePolicy {
    kind: ScoreKind,
    /// Seed of the planner's price perturbation (0: none; see
    /// [`ScorePolicy::perturbed`]).
    perturbation: u64,
}

impl ScorePolicy {
    /// A policy for `kind`.
    pub fn new(kind: ScoreKind) -> Self {
        Self {
            kind,
            perturbation: 0,
        }
    }

    /// The planner's random restart `seed` of `kind` (never 0): every
    /// candidate's score is multiplied by its storage's fixed factor
    /// ([`crate::rng::price_factor`]), so near-ties reorder the same way at
    /// every decision. Meant for the positive scores (h_DTR, MSPS).
    pub(crate) fn perturbed(kind: ScoreKind, seed: u64) -> Self {
        Self {
            kind,
            perturbation: seed,
        }
    }

    /// The score of candidate `s` (smaller is evicted first).
    pub fn score(&self, view: &mut DecisionView<'_>, s: StorageId) -> f64 {
        let bytes = view.bytes(s).max(1) as f64;
        match self.kind {
            ScoreKind::DtrExact => view.e_star_exact(s) / (bytes * view.staleness(s)),
            ScoreKind::DtrEq => view.e_star_eq(s) / (bytes * view.staleness(s)),
            ScoreKind::DtrLocal => view.cost(s) / (bytes * view.staleness(s)),
            ScoreKind::Msps => view.recompute_cost(s) / bytes,
            ScoreKind::Lru => -view.staleness(s),
            ScoreKind::LargestFirst => -bytes,
            ScoreKind::MegEngine(p) => {
                let (l, r) = view.adjacent_free(s);
                let mem = (bytes + (l + r) as f64) / (1024.0 * 1024.0);
                let stale = view.staleness(s) / 1e8;
                (view.e_star_eq(s) + 1e-3).powf(p.cost)
                    * p.recompute_base.powi(view.recomputes(s) as i32)
                    / (mem.powf(p.memory) * (stale + 1e-3).powf(p.staleness))
            }
        }
    }
}

impl EvictionPolicy for ScorePolicy {
    fn name(&self) -> &'static str {
        match self.kind {
            ScoreKind::DtrExact => "dtr",
            ScoreKind::DtrEq => "dtr-eq",
            ScoreKind::DtrLocal => "dtr-local",
            ScoreKind::Msps => "msps",
            ScoreKind::Lru => "lru",
            ScoreKind::LargestFirst => "largest",
            ScoreKind::MegEngine(_) => "megengine",
        }
    }

    fn choose(&mut self, view: &mut DecisionView<'_>, victims: &mut Vec<StorageId>) {
        let mut best: Option<(f64, StorageId)> = None;
        for i in 0..view.pool().len() {
            let s = view.pool()[i];
            let sc = self.score(view, s);
            let sc = crate::rng::perturb(sc, self.perturbation, u64::from(view.seq(s)));
            // Ties go to the earlier candidate: deterministic for a seed.
            if best.is_none_or(|(b, _)| sc < b) {
                best = Some((sc, s));
            }
        }
        if let Some((_, s)) = best {
            victims.push(s);
        }
    }
}
