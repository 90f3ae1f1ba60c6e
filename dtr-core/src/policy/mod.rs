//! Eviction policies: the [`EvictionPolicy`] trait, the [`DecisionView`] a policy
//! reads (candidates, costs, staleness, e*, the allocator's adjacent free bytes and
//! address-ordered blocks), and the shipped policies.
//!
//! With swap on ([`crate::swap`]), every price a policy reads here — own cost,
//! e* of each kind, MSPS's recompute cost — is the cheaper of recomputation
//! and the storage's swap (the swap alone for a storage that cannot be
//! recomputed), so every policy weighs both levers without knowing of them.
//!
//! | policy | module | chooses |
//! |---|---|---|
//! | h_DTR, h_DTR^eq, h_DTR^local, MSPS, LRU, largest-first, MegEngine | [`score`] | the sampled candidate with the smallest score |
//! | Coop | [`window`] | the cheapest contiguous run of blocks that frees the request |
//! | remat (default) | [`remat`] | h_DTR^eq over the sample, re-ranked by the hole an eviction opens |

pub mod oracle;
pub mod remat;
pub mod score;
pub mod window;

use ahash::AHashMap;

use crate::config::{DtrConfig, PolicyKind};
use crate::graph::{Graph, Hot, NONE};
use crate::ids::StorageId;
use crate::memory::{BlockView, MemoryModel, MemoryUsage, RequestShape};

pub use remat::RematPolicy;
pub use score::{ScoreKind, ScorePolicy};
pub use window::CoopWindow;

/// What the runtime is trying to place when it asks for victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Bytes requested (0 when the byte-threshold trigger asks).
    pub bytes: u64,
    /// How the memory model would place it (`None` for the threshold trigger).
    pub shape: Option<RequestShape>,
    /// Free bytes inside the budget at the failure.
    pub free_bytes: u64,
}

/// A policy: given the view, push one or more victims (candidates) into `victims`.
///
/// The runtime evicts the victims, retries the allocation, and asks again while it
/// still fails; it ignores victims that are not candidates. A policy that pushes
/// nothing lets the runtime fall back to the least recently used sampled candidate.
pub trait EvictionPolicy: Send {
    /// Name for reports.
    fn name(&self) -> &'static str;
    /// Choose victims.
    fn choose(&mut self, view: &mut DecisionView<'_>, victims: &mut Vec<StorageId>);
    /// Under √N sampling, the most candidates that are still all offered in
    /// [`DecisionView::pool`] (not sampled). The default, 16, is the DTR
    /// paper's setting: a sample only saves work once it is a small part of
    /// the pool.
    fn whole_pool_up_to(&self) -> usize {
        16
    }
}

/// The policy for a [`PolicyKind`] with the config's parameters.
pub fn make_policy(kind: PolicyKind, config: &DtrConfig) -> Box<dyn EvictionPolicy> {
    match (kind, score_kind(kind, config)) {
        (_, Some(score)) => Box::new(ScorePolicy::new(score)),
        (PolicyKind::Coop, None) => Box::new(CoopWindow),
        _ => Box::new(RematPolicy::new(!config.sampling)),
    }
}

/// The score a [`PolicyKind`] evicts by, for the [`ScorePolicy`] kinds
/// (`None`: remat and Coop, which are not a score over candidates).
pub(crate) fn score_kind(kind: PolicyKind, config: &DtrConfig) -> Option<ScoreKind> {
    Some(match kind {
        PolicyKind::Dtr => ScoreKind::DtrExact,
        PolicyKind::DtrEq => ScoreKind::DtrEq,
        PolicyKind::DtrLocal => ScoreKind::DtrLocal,
        PolicyKind::Msps => ScoreKind::Msps,
        PolicyKind::Lru => ScoreKind::Lru,
        PolicyKind::LargestFirst => ScoreKind::LargestFirst,
        PolicyKind::MegEngine => ScoreKind::MegEngine(config.megengine),
        PolicyKind::Remat | PolicyKind::Coop => return None,
    })
}

/// Everything a policy may read during one decision. Methods that walk the graph
/// take `&mut self` (union-find path compression, visit stamps).
pub struct DecisionView<'a> {
    pub(crate) graph: &'a mut Graph,
    pub(crate) memory: &'a dyn MemoryModel,
    pub(crate) pool: &'a [StorageId],
    pub(crate) pool_hot: &'a [Hot],
    pub(crate) by_ptr: &'a AHashMap<u64, StorageId>,
    pub(crate) request: Request,
    /// The runtime defragments this memory when free bytes are in pieces, so
    /// where a block sits does not constrain placement: price logically.
    pub(crate) defragmenting: bool,
    /// [`DecisionView::pool`] is a sample, not every candidate.
    pub(crate) sampled: bool,
    /// Set by the decision: how many whole segments its window empties
    /// together to make room for a new one (0: a run inside one segment, or
    /// one segment). See [`crate::RuntimeStats::segment_releases`].
    pub(crate) segments_emptied: usize,
}

impl<'a> DecisionView<'a> {
    /// The candidates to score this time: all of them, or a seeded √N sample, after
    /// the small-candidate filter (as configured).
    pub fn pool(&self) -> &[StorageId] {
        self.pool
    }

    /// Whether [`DecisionView::pool`] is a √N sample rather than every
    /// candidate (sampling is on and there are more candidates than
    /// [`EvictionPolicy::whole_pool_up_to`]).
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// The bytes, own cost and last use of candidate `s` (one read of a contiguous
    /// array; `None` if `s` is not a candidate).
    #[inline]
    pub fn hot(&self, s: StorageId) -> Option<Hot> {
        let pos = self.graph.storages.get(s.0)?.cand_pos;
        (pos != NONE).then(|| self.graph.hot[pos as usize])
    }

    /// Sequence number of `s` within the current iteration (see [`crate::record`]).
    pub fn seq(&self, s: StorageId) -> u32 {
        self.graph.st(s).seq
    }

    /// Index of the public call being run in the current iteration.
    pub fn position(&self) -> u32 {
        self.graph.pos
    }

    /// Whether replays have recently cost more than first computations (decayed
    /// sums over about the last thousand ops).
    pub fn thrashing(&self) -> bool {
        self.graph.thrashing()
    }

    /// Staleness (ns since last use, plus 1) from a [`Hot`] entry.
    #[inline]
    pub fn staleness_of(&self, h: &Hot) -> f64 {
        (self.graph.clock - h.last_used).max(0.0) + 1.0
    }

    /// Exact e* walking at most `max_nodes` evicted storages.
    pub fn e_star_bounded(&mut self, s: StorageId, max_nodes: usize) -> f64 {
        let e = self.graph.e_star_bounded(s, max_nodes);
        self.graph.price(s, e)
    }

    /// The hot fields of [`DecisionView::pool`], index for index (a copy made while
    /// sampling, so screening reads one small contiguous array).
    pub fn pool_hot(&self) -> &[Hot] {
        self.pool_hot
    }

    /// Every current candidate (resident, recomputable, unpinned).
    pub fn all_candidates(&self) -> &[StorageId] {
        &self.graph.candidates
    }

    /// Whether `s` is a candidate now.
    pub fn is_candidate(&self, s: StorageId) -> bool {
        self.graph
            .storages
            .get(s.0)
            .is_some_and(|r| r.cand_pos != NONE)
    }

    /// The request being served.
    pub fn request(&self) -> Request {
        self.request
    }

    /// The compute clock in ns.
    pub fn clock(&self) -> f64 {
        self.graph.clock
    }

    /// Requested bytes of `s`.
    #[inline]
    pub fn bytes(&self, s: StorageId) -> u64 {
        self.graph.st(s).bytes
    }

    /// Own recompute cost of `s` in ns (with swap on, at most its swap's
    /// price; see [`DecisionView::e_star_eq`]).
    #[inline]
    pub fn cost(&self, s: StorageId) -> f64 {
        self.graph.price(s, self.graph.st(s).cost)
    }

    /// ns of compute since `s` was last used, plus 1 (never 0).
    #[inline]
    pub fn staleness(&self, s: StorageId) -> f64 {
        (self.graph.clock - self.graph.st(s).last_used).max(0.0) + 1.0
    }

    /// Times `s` was rematerialized.
    #[inline]
    pub fn recomputes(&self, s: StorageId) -> u32 {
        self.graph.st(s).recomputes
    }

    /// e* by union-find (h_DTR^eq): own cost plus adjacent evicted components.
    #[inline]
    pub fn e_star_eq(&mut self, s: StorageId) -> f64 {
        let e = self.graph.e_star_eq(s);
        self.graph.price(s, e)
    }

    /// Exact e* (h_DTR): own cost plus the evicted ancestor and descendant regions.
    pub fn e_star_exact(&mut self, s: StorageId) -> f64 {
        let e = self.graph.e_star_exact(s);
        self.graph.price(s, e)
    }

    /// Own cost plus the evicted ancestors that recomputing `s` would need (MSPS).
    pub fn recompute_cost(&mut self, s: StorageId) -> f64 {
        let e = self.graph.st(s).cost + self.graph.region_cost(s, true, false);
        self.graph.price(s, e)
    }

    /// Address of `s`'s block (0 without addresses).
    pub fn ptr(&self, s: StorageId) -> u64 {
        self.graph.st(s).slot.as_ref().map_or(0, |sl| sl.ptr)
    }

    /// Rounded block size of `s` (its bytes when not resident).
    pub fn block_size(&self, s: StorageId) -> u64 {
        let r = self.graph.st(s);
        r.slot.as_ref().map_or(r.bytes, |sl| sl.size)
    }

    /// Free bytes left and right of `s`'s block, from the allocator in O(1).
    #[inline]
    pub fn adjacent_free(&self, s: StorageId) -> (u64, u64) {
        match &self.graph.st(s).slot {
            Some(slot) => self.memory.adjacent_free(slot),
            None => (0, 0),
        }
    }

    /// Whether placement depends on addresses: the memory model has them and
    /// the runtime does not defragment it.
    pub fn has_addresses(&self) -> bool {
        self.memory.has_addresses() && !self.defragmenting
    }

    /// Append the address-ordered blocks (O(blocks)).
    pub fn blocks(&self, out: &mut Vec<BlockView>) {
        self.memory.blocks(out)
    }

    /// The storage living at `ptr`.
    pub fn storage_at(&self, ptr: u64) -> Option<StorageId> {
        self.by_ptr.get(&ptr).copied()
    }

    /// The memory model's figures.
    pub fn usage(&self) -> MemoryUsage {
        self.memory.usage()
    }

    /// The request's shape as the memory model sees it.
    pub fn shape(&self, bytes: u64) -> RequestShape {
        self.memory.shape(bytes)
    }
}
