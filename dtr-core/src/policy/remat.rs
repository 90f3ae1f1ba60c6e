//! remat's default policy: h_DTR with a bounded exact e*, found in O(√N) under a
//! logical budget, and turned into *placement* under a physical one.
//!
//! A physical budget fails an allocation not because too few bytes are free but
//! because no free block of the right pool is large enough and no segment can go
//! back to the device (at failures the traces show 5–10 % of the budget free but
//! unusable). Evicting the storage with the best h_DTR score frees bytes that no
//! request can use; the next failure evicts again. So:
//!
//! 1. **Screen** the √N sample plus the *elite* kept from the previous decision
//!    (its runners-up, still candidates) by the local score
//!    cost / (bytes · staleness), reading only the candidates' hot array; keep the
//!    best [`RematPolicy::SCREEN`].
//! 2. **Rank** the screened by h_DTR with exact e* (evicted ancestors and
//!    descendants, walk bounded to [`RematPolicy::MAX_REGION`] storages), in
//!    ascending local score with branch and bound (e* ≥ own cost, so h_DTR ≥ the
//!    local score: the walk stops as soon as no one left can win) — the
//!    union-find e* never splits components and over-charges long chains (h_DTR^eq
//!    thrashes on lstm, treelstm and unroll_gan at ratio 0.3 in our sweep). The
//!    best is the victim under a logical budget or the byte-threshold trigger.
//!    Under a full scan ([`RematPolicy::new`] with `full_scan`) the ranking goes
//!    on past the screen until the bound stops it, so the victim is the h_DTR
//!    argmin over every candidate: the locally cheapest few of *all*
//!    candidates are the extreme tail, cheap ops next to large evicted regions,
//!    and ranking only them thrashed (Burn's test model at 30 % of its peak,
//!    where costs are proportional to bytes and the local score is staleness;
//!    lstm, treelstm and unroll_gan under a logical budget at 0.4–0.5; see
//!    docs/burn.md). With √N sampling the screen stays as it is, but a
//!    sample is drawn only from more than [`RematPolicy::SCREEN`]² = 256
//!    candidates: below that a √N sample holds at most the screen's 16, the
//!    screen keeps all of them and stage 2 ranks them all, so sampling saves
//!    no walk and only hides the argmin. The whole pool is ranked instead, as
//!    under a full scan. (Burn's CTC gradient, 573 ops at 4 KiB, has a few
//!    dozen candidates: a sample of 5–7 replayed 199× its ops, the whole pool
//!    0.34×; see docs/burn.md.)
//! 3. **Place** (physical budget, failed allocation): over the allocator's
//!    address-ordered blocks, find the contiguous run in the request's pool —
//!    evictable blocks and the free blocks between them, pinned blocks as barriers —
//!    that holds the request at the lowest *cost per byte*, where a block costs its
//!    h_DTR numerator over staleness (e* · 1.0001^recomputes / staleness); or, when
//!    the request needs a new segment, the set of whole segments cheapest per byte
//!    whose release makes the device fit it. Evict all of it at once: one decision
//!    opens one hole that fits, instead of scattering evictions over segments.
//!
//! Stages 1–2 cost O(√N) hot-array reads plus a bounded walk for 16 candidates
//! (under a full scan: O(N) reads, a sort of the rest when the screen does not
//! settle the bound, and a bounded walk per candidate ranked); stage 3 is
//! O(blocks) and runs only when a physical allocation failed.
//!
//! **Thrash guard.** While replays have recently cost more than twice the first
//! computations ([`DecisionView::thrashing`]: decayed sums over about
//! the last thousand ops), every stage drops staleness from its scores, which
//! become MSPS-like (recompute cost per byte). The Burn thrash that motivated
//! it came from the screen, not from staleness (see stage 2 and docs/burn.md).
//! On the DTR traces the guard changes no run that
//! finishes (every status and overhead of the sweep, both modes, and of the
//! full-scan table is identical; only runs stopped as `thrash` anyway take other
//! paths before they stop); on the Burn test model at 35 % of its peak it turns
//! a run that did not finish in minutes into one that finishes.

use super::window::cheapest_window;
use super::{DecisionView, EvictionPolicy};
use crate::ids::StorageId;
use crate::memory::BlockView;

/// The default policy. See the module doc.
#[derive(Debug, Clone, Default)]
pub struct RematPolicy {
    elite: Vec<StorageId>,
    screen: Vec<(f64, StorageId)>,
    ranked: Vec<(f64, f64, StorageId)>,
    rest: Vec<(f64, StorageId)>,
    blocks: Vec<BlockView>,
    exhaustive: bool,
}

impl RematPolicy {
    /// The policy for a run that scores every candidate (`full_scan`, i.e.
    /// sampling off) or a √N sample. Under a full scan stage 2 is exhaustive:
    /// it does not stop at the screen (see the module doc).
    pub fn new(full_scan: bool) -> Self {
        Self {
            exhaustive: full_scan,
            ..Self::default()
        }
    }

    /// Candidates kept by stage 1.
    pub const SCREEN: usize = 16;
    /// Candidates carried to the next decision.
    pub const ELITE: usize = 8;
    /// Most evicted storages an e* walk visits.
    pub const MAX_REGION: usize = 64;

    /// Rank candidate `s` by h_DTR (bounded exact e* with the recompute
    /// penalty, over bytes and staleness) into `ranked`; returns its score.
    fn rank(
        &mut self,
        view: &mut DecisionView<'_>,
        s: StorageId,
        stale_of: &impl Fn(&DecisionView<'_>, &crate::graph::Hot) -> f64,
    ) -> f64 {
        let Some(h) = view.hot(s) else {
            return f64::INFINITY;
        };
        let stale = stale_of(view, &h);
        let e =
            view.e_star_bounded(s, Self::MAX_REGION) * 1.0001f64.powi(view.recomputes(s) as i32);
        let score = e / (h.bytes.max(1) as f64 * stale);
        self.ranked.push((score, e / stale, s));
        score
    }

    /// What stage 3 charges for evicting candidate `s`: its h_DTR numerator
    /// (bounded exact e* · 1.0001^recomputes) over its staleness, or over 1 while
    /// the run is thrashing (`use_stale` false).
    pub(crate) fn block_cost(v: &mut DecisionView<'_>, s: StorageId, use_stale: bool) -> f64 {
        let stale = if use_stale { v.staleness(s) } else { 1.0 };
        v.e_star_bounded(s, Self::MAX_REGION) * 1.0001f64.powi(v.recomputes(s) as i32) / stale
    }
}

impl EvictionPolicy for RematPolicy {
    fn name(&self) -> &'static str {
        "remat"
    }

    /// [`RematPolicy::SCREEN`]²: up to there a √N sample holds at most
    /// `SCREEN` candidates, the screen keeps them all and stage 2 ranks the
    /// sample whole, so sampling saves no walk and only hides the argmin; the
    /// whole pool is ranked instead, exhaustively (see the module doc).
    fn whole_pool_up_to(&self) -> usize {
        Self::SCREEN * Self::SCREEN
    }

    fn choose(&mut self, view: &mut DecisionView<'_>, victims: &mut Vec<StorageId>) {
        // While thrashing, staleness is ignored (see the module doc).
        let use_stale = !view.thrashing();
        let stale_of = |v: &DecisionView<'_>, h: &crate::graph::Hot| {
            if use_stale {
                v.staleness_of(h)
            } else {
                1.0
            }
        };
        // Stage 1: screen sample ∪ elite by the local score.
        self.screen.clear();
        for (s, h) in view.pool().iter().zip(view.pool_hot()) {
            let stale = stale_of(view, h);
            self.screen
                .push((h.cost / (h.bytes.max(1) as f64 * stale), *s));
        }
        for k in 0..self.elite.len() {
            let s = self.elite[k];
            if let Some(h) = view.hot(s) {
                let local = h.cost / (h.bytes.max(1) as f64 * stale_of(view, &h));
                self.screen.push((local, s));
            }
        }
        if self.screen.len() > Self::SCREEN {
            self.screen
                .select_nth_unstable_by(Self::SCREEN, |a, b| a.0.total_cmp(&b.0));
            // The rest stays, unsorted, behind the first SCREEN (stage 2 may
            // need it).
            self.rest.clear();
            self.rest.extend_from_slice(&self.screen[Self::SCREEN..]);
            self.screen.truncate(Self::SCREEN);
        } else {
            self.rest.clear();
        }
        self.screen
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        self.screen.dedup_by_key(|x| x.1);
        // Stage 2: rank by bounded exact e*, in ascending local score. Since
        // e* ≥ own cost, h_DTR ≥ the local score: once the next local score is no
        // better than the best h_DTR found, nobody further down can win.
        self.ranked.clear();
        let mut best_h = f64::INFINITY;
        let mut stopped = false;
        for k in 0..self.screen.len() {
            let (local, s) = self.screen[k];
            if local >= best_h {
                stopped = true;
                break;
            }
            best_h = best_h.min(self.rank(view, s, &stale_of));
        }
        // The bound did not stop the walk within the screen: somebody behind it
        // may still beat the best found (a screened candidate can be locally
        // cheap yet sit next to a large evicted region). Go on, in ascending
        // local score, until the bound stops it: the victim is then the h_DTR
        // argmin over the whole pool, not over its locally cheapest part.
        let mut extra = 0;
        if (self.exhaustive || !view.sampled()) && !stopped && !self.rest.is_empty() {
            self.rest
                .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let screened = self.ranked.len();
            for k in 0..self.rest.len() {
                let (local, s) = self.rest[k];
                if local >= best_h {
                    break;
                }
                // The elite may repeat a pool member.
                if self.ranked.iter().any(|r| r.2 == s) {
                    continue;
                }
                best_h = best_h.min(self.rank(view, s, &stale_of));
            }
            extra = self.ranked.len() - screened;
        }
        self.ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.elite.clear();
        let unranked = self
            .screen
            .iter()
            .skip(self.ranked.len() - extra)
            .map(|x| x.1);
        self.elite.extend(
            self.ranked
                .iter()
                .skip(1)
                .map(|r| r.2)
                .chain(unranked)
                .take(Self::ELITE),
        );
        let Some(&(_, _, first)) = self.ranked.first() else {
            return;
        };
        let req = view.request();
        if req.shape.is_none() || !view.has_addresses() || req.bytes == 0 {
            victims.push(first);
            return;
        }
        // Stage 3: the cheapest contiguous run of blocks, per byte, that places
        // the request (or whole segments that make room for a new one).
        let mut blocks = std::mem::take(&mut self.blocks);
        let w = cheapest_window(view, &mut blocks, true, |v, s| {
            Self::block_cost(v, s, use_stale)
        });
        self.blocks = blocks;
        match w {
            Some(w) => victims.extend(w.victims),
            None => victims.push(first),
        }
    }
}
