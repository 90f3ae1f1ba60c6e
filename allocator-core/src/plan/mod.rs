//! Static planning of repeated allocation sequences (seeds 001 and 003).
//!
//! Training loops repeat the same allocation sequence every iteration. Given the
//! whole sequence as a list of [`Request`]s — a size, a lifetime, and optionally an
//! *overwrite* link (an output that reuses part of an input in place) — a planner
//! assigns every request an offset in one arena so that requests alive at the same
//! time never share a byte. Serving the sequence from the plan then costs no search
//! at run time and cannot fragment.
//!
//! ```text
//!  address ▲
//!          │      ┌────────┐
//!          │ ┌────┤   C    ├───────┐        arena_bytes = top of the highest box
//!          │ │ A  └────────┘   D   │        max_live_bytes = the most bytes alive at
//!          │ ├────────────┬────────┤                         one time (lower bound)
//!          │ │     B      │   E    │
//!          └─┴────────────┴────────┴──▶ time
//! ```
//!
//! Three algorithms ([`Algorithm`]):
//!
//! | algorithm | idea |
//! |---|---|
//! | [`Algorithm::GreedyBySize`] | largest first; each request goes into the smallest gap that fits among the already placed requests it overlaps in time (TFLite's and MegTaiChi's offline planner); overwrite chains move as one rigid group |
//! | [`Algorithm::SeedSim`] | seed 001 (MegEngine): simulate the sequence with an address-ordered block list and a size-ordered free list (best fit, merge on free, grow the largest free block when nothing fits), record which blocks are neighbours (MegTaiChi's topology map), then assign each chunk the lowest offset those neighbour relations allow |
//! | [`Algorithm::BestFit`] | the online baseline: a best-fit allocator with coalescing over a growing arena, with no knowledge of the future |
//!
//! Every [`Plan`] carries [`max_live_bytes`], the lower bound of any plan, beside
//! its arena, and [`verify`] checks a plan independently of how it was made.
//! [`compact`] improves any valid plan afterwards: it lowers each chunk as far as
//! the chunks alive beside it allow and shakes the plan (mirror, lower, mirror,
//! lower) while that lowers the arena; it never raises it.
//!
//! ```
//! use remat_alloc::plan::{plan, verify, Algorithm, Request};
//!
//! // A and B overlap in time; C starts after A ends and can reuse its bytes.
//! let requests = [
//!     Request::new(100, 0, 2), // A: alive during [0, 2)
//!     Request::new(50, 1, 4),  // B
//!     Request::new(100, 2, 4), // C
//! ];
//! let p = plan(&requests, Algorithm::GreedyBySize)?;
//! assert_eq!(p.max_live_bytes, 150);
//! assert_eq!(p.arena_bytes, 150);
//! verify(&requests, &p).unwrap();
//! # Ok::<(), remat_alloc::plan::PlanError>(())
//! ```
//!
//! ## Overwrites
//!
//! A request with `overwrite: Some(Overwrite { of, offset })` is an output that
//! writes into request `of`'s memory in place: it is placed at
//! `offsets[of] + offset`, must fit inside it (`offset + size <= size of of`), and
//! must begin while `of` is alive (`of.start <= start < of.end`). Overwrites chain
//! (an output of an in-place op on an in-place output …); a chain — in general a
//! tree — is resolved to its *root*, the one request in it without an overwrite,
//! and every member keeps a fixed offset relative to the root. A request and its
//! overwrite ancestors may share bytes; any other two requests alive at the same
//! time may not (two overwrites of one input that overlap in time and in address
//! are rejected as [`PlanError::ConflictingOverwrites`]).
//!
//! ## Time
//!
//! Lifetimes are half-open: a request is alive during `[start, end)`, so one that
//! ends at `t` and one that starts at `t` never overlap. A request with
//! `start == end` is never alive: it needs no memory and gets offset 0 (or its place
//! inside the request it overwrites).

mod arena;
mod best_fit;
mod compact;
mod greedy;
mod seed_sim;
#[cfg(test)]
mod tests;
mod workload;

pub use compact::{compact, compact_within};
pub use workload::plateau;

pub use arena::{
    ArenaAllocation, ArenaConfig, ArenaMode, ArenaSnapshot, ArenaStats, PlannedArena, PlannedBlock,
};

use std::fmt;
use std::str::FromStr;

/// An overwrite link: this request reuses part of another request's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Overwrite {
    /// Index of the overwritten request.
    pub of: usize,
    /// Byte offset of this request inside the overwritten one.
    pub offset: u64,
}

/// One allocation of the repeated sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// Size in bytes.
    pub size: u64,
    /// First time step at which it is alive (inclusive).
    pub start: usize,
    /// First time step at which it is no longer alive (exclusive): the request is
    /// alive during `[start, end)`.
    pub end: usize,
    /// If set, the request is placed inside another one (see the module docs).
    pub overwrite: Option<Overwrite>,
}

impl Request {
    /// A request of `size` bytes alive during `[start, end)`.
    pub fn new(size: u64, start: usize, end: usize) -> Request {
        Request {
            size,
            start,
            end,
            overwrite: None,
        }
    }

    /// The same request, placed at `offset` inside request `of`.
    pub fn overwriting(self, of: usize, offset: u64) -> Request {
        Request {
            overwrite: Some(Overwrite { of, offset }),
            ..self
        }
    }

    /// Whether the request is alive at some time step and takes memory.
    pub fn occupies(&self) -> bool {
        self.size > 0 && self.start < self.end
    }

    /// Whether the two requests are alive at a common time step.
    pub fn overlaps_in_time(&self, other: &Request) -> bool {
        self.start < other.end
            && other.start < self.end
            && self.start < self.end
            && other.start < other.end
    }
}

/// The result of planning: one offset per request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    /// `offsets[i]` is the byte offset of request `i` in the arena.
    pub offsets: Vec<u64>,
    /// The arena size: the highest `offset + size` of a request that is ever alive.
    pub arena_bytes: u64,
    /// The lower bound of any plan: [`max_live_bytes`] of the requests.
    pub max_live_bytes: u64,
}

impl Plan {
    /// How far the arena is above the lower bound, in percent (0 when both are 0).
    pub fn over_lower_bound_pct(&self) -> f64 {
        if self.max_live_bytes == 0 {
            return if self.arena_bytes == 0 {
                0.0
            } else {
                f64::INFINITY
            };
        }
        (self.arena_bytes as f64 / self.max_live_bytes as f64 - 1.0) * 100.0
    }
}

/// A planning algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Largest first, smallest fitting gap among the placed requests it overlaps
    /// in time.
    GreedyBySize,
    /// Seed 001's allocation simulation with offsets assigned from the recorded
    /// neighbour relations.
    SeedSim,
    /// Online best fit with coalescing (no knowledge of the future): the baseline.
    BestFit,
}

impl Algorithm {
    /// Every algorithm, in the order the CLI prints them.
    pub const ALL: [Algorithm; 3] = [
        Algorithm::GreedyBySize,
        Algorithm::SeedSim,
        Algorithm::BestFit,
    ];

    /// The name used on the command line (`greedy-by-size`, `seed-sim`, `best-fit`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::GreedyBySize => "greedy-by-size",
            Algorithm::SeedSim => "seed-sim",
            Algorithm::BestFit => "best-fit",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing an unknown algorithm name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown planning algorithm {0:?} (expected greedy-by-size, seed-sim or best-fit)")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Algorithm, UnknownAlgorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// Requests that no plan can satisfy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// `end < start`.
    #[error("request {request}: end {end} is before start {start}")]
    EndBeforeStart {
        /// The request index.
        request: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
    },
    /// The overwritten request does not exist.
    #[error("request {request} overwrites request {of}, but there are only {len} requests")]
    OverwriteOutOfRange {
        /// The request index.
        request: usize,
        /// The index it names.
        of: usize,
        /// The number of requests.
        len: usize,
    },
    /// The request does not begin while the overwritten one is alive
    /// (`of.start <= start < of.end` fails).
    #[error("request {request} (alive [{start}, {end})) overwrites request {of} (alive [{of_start}, {of_end})), which is not alive when it begins")]
    OverwriteNotOverlapping {
        /// The request index.
        request: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
        /// The overwritten request.
        of: usize,
        /// The overwritten request's start.
        of_start: usize,
        /// The overwritten request's end.
        of_end: usize,
    },
    /// `offset + size` exceeds the overwritten request's size.
    #[error("request {request} ({size} B at offset {offset}) does not fit inside request {of} ({of_size} B)")]
    OverwriteExceedsBounds {
        /// The request index.
        request: usize,
        /// The overwritten request.
        of: usize,
        /// The offset inside it.
        offset: u64,
        /// The request's size.
        size: u64,
        /// The overwritten request's size.
        of_size: u64,
    },
    /// Overwrite links form a cycle through this request.
    #[error("overwrite links form a cycle through request {request}")]
    OverwriteCycle {
        /// A request on the cycle.
        request: usize,
    },
    /// Two requests in one overwrite tree, neither an overwrite ancestor of the
    /// other, are alive at the same time and their fixed places overlap.
    #[error("requests {a} and {b} overwrite the same memory while both are alive")]
    ConflictingOverwrites {
        /// One request.
        a: usize,
        /// The other.
        b: usize,
    },
    /// The arena would exceed `u64::MAX` bytes.
    #[error("the arena would exceed u64::MAX bytes")]
    ArenaOverflow,
    /// A plan given to [`compact`] has a different number of offsets than
    /// there are requests: it is not a plan of these requests.
    #[error("the plan has {offsets} offsets for {requests} requests (one offset per request is required)")]
    PlanLengthMismatch {
        /// Number of offsets in the plan.
        offsets: usize,
        /// Number of requests.
        requests: usize,
    },
}

/// Why a plan is wrong (see [`verify`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanViolation {
    /// The requests themselves are invalid.
    #[error("invalid requests: {0}")]
    InvalidRequests(#[from] PlanError),
    /// `offsets.len() != requests.len()`.
    #[error("the plan has {offsets} offsets for {requests} requests")]
    LengthMismatch {
        /// Number of offsets.
        offsets: usize,
        /// Number of requests.
        requests: usize,
    },
    /// Two requests alive at the same time share bytes (and neither overwrites the other).
    #[error("requests {a} ([{a_offset}, +{a_size})) and {b} ([{b_offset}, +{b_size})) overlap in time and in address")]
    Overlap {
        /// One request.
        a: usize,
        /// Its offset.
        a_offset: u64,
        /// Its size.
        a_size: u64,
        /// The other request.
        b: usize,
        /// Its offset.
        b_offset: u64,
        /// Its size.
        b_size: u64,
    },
    /// A request that is alive at some time ends beyond the arena.
    #[error("request {request} ([{offset}, +{size})) ends beyond the arena of {arena} B")]
    OutsideArena {
        /// The request.
        request: usize,
        /// Its offset.
        offset: u64,
        /// Its size.
        size: u64,
        /// The arena size.
        arena: u64,
    },
    /// An overwrite is not at its parent's offset plus its own offset.
    #[error("request {request} overwrites at offset {expected} but is placed at {found}")]
    OverwriteMisplaced {
        /// The request.
        request: usize,
        /// Where it must be.
        expected: u64,
        /// Where it is.
        found: u64,
    },
    /// The plan's `max_live_bytes` is not the requests' lower bound.
    #[error("the plan reports max_live_bytes = {reported}, the requests need {actual}")]
    WrongLowerBound {
        /// What the plan says.
        reported: u64,
        /// What [`max_live_bytes`] says.
        actual: u64,
    },
}

/// Overwrite trees of valid requests.
pub(crate) struct Forest {
    /// The root of each request's tree.
    pub root: Vec<usize>,
    /// Each request's offset relative to its root.
    pub rel: Vec<u64>,
    /// For each root, its members (root first, then by index); empty for non-roots.
    pub members: Vec<Vec<usize>>,
}

impl Forest {
    fn parent(requests: &[Request], i: usize) -> Option<usize> {
        requests[i].overwrite.map(|o| o.of)
    }

    /// Whether `a` is a strict overwrite ancestor of `b`.
    pub fn is_ancestor(requests: &[Request], a: usize, b: usize) -> bool {
        let mut x = b;
        while let Some(p) = Forest::parent(requests, x) {
            if p == a {
                return true;
            }
            x = p;
        }
        false
    }
}

/// Checks that the requests can be planned; returns their overwrite forest.
pub(crate) fn forest(requests: &[Request]) -> Result<Forest, PlanError> {
    let n = requests.len();
    for (i, r) in requests.iter().enumerate() {
        if r.end < r.start {
            return Err(PlanError::EndBeforeStart {
                request: i,
                start: r.start,
                end: r.end,
            });
        }
        let Some(o) = r.overwrite else { continue };
        if o.of >= n {
            return Err(PlanError::OverwriteOutOfRange {
                request: i,
                of: o.of,
                len: n,
            });
        }
        if o.of == i {
            return Err(PlanError::OverwriteCycle { request: i });
        }
        let p = &requests[o.of];
        if o.offset.checked_add(r.size).is_none_or(|e| e > p.size) {
            return Err(PlanError::OverwriteExceedsBounds {
                request: i,
                of: o.of,
                offset: o.offset,
                size: r.size,
                of_size: p.size,
            });
        }
        if !(p.start <= r.start && r.start < p.end) {
            return Err(PlanError::OverwriteNotOverlapping {
                request: i,
                start: r.start,
                end: r.end,
                of: o.of,
                of_start: p.start,
                of_end: p.end,
            });
        }
    }
    // Resolve roots iteratively (no recursion: chains may be long), detecting cycles.
    const UNKNOWN: usize = usize::MAX;
    let mut root = vec![UNKNOWN; n];
    let mut rel = vec![0u64; n];
    let mut on_path = vec![false; n];
    let mut path = Vec::new();
    for i in 0..n {
        if root[i] != UNKNOWN {
            continue;
        }
        let mut x = i;
        while root[x] == UNKNOWN {
            if on_path[x] {
                return Err(PlanError::OverwriteCycle { request: x });
            }
            on_path[x] = true;
            path.push(x);
            match requests[x].overwrite {
                None => {
                    root[x] = x;
                    rel[x] = 0;
                }
                Some(o) => x = o.of,
            }
        }
        // Unwind: every node on the path hangs below x, whose root is known.
        while let Some(y) = path.pop() {
            on_path[y] = false;
            if let Some(o) = requests[y].overwrite {
                root[y] = root[o.of];
                // Cannot overflow: rel[o.of] + offset + size <= size of the root.
                rel[y] = rel[o.of] + o.offset;
            }
        }
    }
    let mut members = vec![Vec::new(); n];
    for i in 0..n {
        members[root[i]].push(i);
    }
    let f = Forest { root, rel, members };
    check_conflicts(requests, &f)?;
    Ok(f)
}

/// Rejects two members of one tree that are not ancestor and descendant, alive
/// at the same time, whose fixed places overlap.
fn check_conflicts(requests: &[Request], f: &Forest) -> Result<(), PlanError> {
    for m in f.members.iter().filter(|m| m.len() > 1) {
        let mut by_start: Vec<usize> = m
            .iter()
            .copied()
            .filter(|&i| requests[i].occupies())
            .collect();
        by_start.sort_by_key(|&i| (requests[i].start, i));
        for (k, &a) in by_start.iter().enumerate() {
            for &b in &by_start[k + 1..] {
                if requests[b].start >= requests[a].end {
                    break;
                }
                let (ra, rb) = (&requests[a], &requests[b]);
                let overlap = f.rel[a] < f.rel[b] + rb.size && f.rel[b] < f.rel[a] + ra.size;
                if overlap
                    && !Forest::is_ancestor(requests, a, b)
                    && !Forest::is_ancestor(requests, b, a)
                {
                    return Err(PlanError::ConflictingOverwrites {
                        a: a.min(b),
                        b: a.max(b),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Checks that `requests` can be planned (lifetimes, overwrite links).
pub fn validate(requests: &[Request]) -> Result<(), PlanError> {
    forest(requests).map(|_| ())
}

/// The lower bound of any plan: the most bytes alive at one time step.
///
/// A request shares the bytes of its live overwrite ancestors, so each overwrite
/// tree counts the union of its live members' places. For requests that
/// [`validate`] rejects, overwrite links are ignored (every request counts in full).
pub fn max_live_bytes(requests: &[Request]) -> u64 {
    match forest(requests) {
        Ok(f) => max_live_with(requests, &f),
        Err(_) => {
            let plain: Vec<Request> = requests
                .iter()
                .map(|r| Request {
                    overwrite: None,
                    end: r.end.max(r.start),
                    ..*r
                })
                .collect();
            let f = forest(&plain).expect("requests without overwrites are always valid");
            max_live_with(&plain, &f)
        }
    }
}

/// The union measure of `[rel, rel + size)` over `live`.
fn union_measure(requests: &[Request], f: &Forest, live: &[usize]) -> u128 {
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|&i| (f.rel[i], f.rel[i] + requests[i].size))
        .collect();
    spans.sort_unstable();
    let (mut total, mut cur_s, mut cur_e) = (0u128, 0u64, 0u64);
    for (s, e) in spans {
        if s > cur_e {
            total += u128::from(cur_e - cur_s);
            (cur_s, cur_e) = (s, e);
        } else {
            cur_e = cur_e.max(e);
        }
    }
    total + u128::from(cur_e - cur_s)
}

pub(crate) fn max_live_with(requests: &[Request], f: &Forest) -> u64 {
    // (time, request, is_start)
    let mut events: Vec<(usize, usize, bool)> = Vec::with_capacity(2 * requests.len());
    for (i, r) in requests.iter().enumerate() {
        if r.occupies() {
            events.push((r.start, i, true));
            events.push((r.end, i, false));
        }
    }
    events.sort_unstable();
    let mut live: u128 = 0;
    let mut best: u128 = 0;
    let mut tree_live: Vec<Vec<usize>> = vec![Vec::new(); requests.len()];
    let mut tree_measure: Vec<u128> = vec![0; requests.len()];
    let mut k = 0;
    while k < events.len() {
        let t = events[k].0;
        while k < events.len() && events[k].0 == t {
            let (_, i, is_start) = events[k];
            k += 1;
            let root = f.root[i];
            if f.members[root].len() == 1 {
                let s = u128::from(requests[i].size);
                if is_start {
                    live += s;
                } else {
                    live -= s;
                }
                continue;
            }
            let set = &mut tree_live[root];
            if is_start {
                set.push(i);
            } else if let Some(pos) = set.iter().position(|&x| x == i) {
                set.swap_remove(pos);
            }
            let m = union_measure(requests, f, set);
            live = live - tree_measure[root] + m;
            tree_measure[root] = m;
        }
        best = best.max(live);
    }
    u64::try_from(best).unwrap_or(u64::MAX)
}

/// Plans `requests` with `algo`.
///
/// Invalid requests (see [`PlanError`]) are an error; a valid list always gets a
/// plan that [`verify`] accepts, with `max_live_bytes` filled in.
pub fn plan(requests: &[Request], algo: Algorithm) -> Result<Plan, PlanError> {
    let f = forest(requests)?;
    let offsets = match algo {
        Algorithm::GreedyBySize => greedy::plan(requests, &f)?,
        Algorithm::SeedSim => seed_sim::plan(requests, &f)?,
        Algorithm::BestFit => best_fit::plan(requests, &f)?,
    };
    let arena_bytes = arena_of(requests, &offsets)?;
    Ok(Plan {
        offsets,
        arena_bytes,
        max_live_bytes: max_live_with(requests, &f),
    })
}

/// The highest `offset + size` over requests that are ever alive.
fn arena_of(requests: &[Request], offsets: &[u64]) -> Result<u64, PlanError> {
    let mut top = 0u64;
    for (r, &o) in requests.iter().zip(offsets) {
        if r.start < r.end {
            top = top.max(o.checked_add(r.size).ok_or(PlanError::ArenaOverflow)?);
        }
    }
    Ok(top)
}

/// Overwrite trees as single chunks: the root's size, alive from the root's start
/// to the last member's end. Used by the simulation-based planners.
pub(crate) struct Unit {
    /// The root request.
    pub root: usize,
    /// The root's size.
    pub size: u64,
    /// The root's start.
    pub start: usize,
    /// The last end over the tree.
    pub end: usize,
}

pub(crate) fn units(requests: &[Request], f: &Forest) -> Vec<Unit> {
    f.members
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(root, m)| Unit {
            root,
            size: requests[root].size,
            start: requests[root].start,
            end: m.iter().map(|&i| requests[i].end).max().unwrap_or(0),
        })
        .filter(|u| u.start < u.end)
        .collect()
}

/// The non-empty units in request order, with their alloc/free events sorted by
/// time, frees before allocs at one time step: `(time, 0 = free / 1 = alloc,
/// unit index)`. What the simulation-based planners replay.
pub(crate) fn unit_events(
    requests: &[Request],
    f: &Forest,
) -> (Vec<Unit>, Vec<(usize, u8, usize)>) {
    let chunks: Vec<Unit> = units(requests, f)
        .into_iter()
        .filter(|u| u.size > 0)
        .collect();
    let mut events = Vec::with_capacity(2 * chunks.len());
    for (c, u) in chunks.iter().enumerate() {
        events.push((u.start, 1, c));
        events.push((u.end, 0, c));
    }
    events.sort_unstable();
    (chunks, events)
}

/// Offsets of every request from the offsets of the roots.
pub(crate) fn offsets_from_roots(f: &Forest, root_offset: &[u64]) -> Result<Vec<u64>, PlanError> {
    f.root
        .iter()
        .zip(&f.rel)
        .map(|(&r, &rel)| {
            root_offset[r]
                .checked_add(rel)
                .ok_or(PlanError::ArenaOverflow)
        })
        .collect()
}

/// Checks a plan independently of how it was made: every request that is ever
/// alive lies inside the arena, every overwrite sits at its parent's offset plus
/// its own, two requests alive at the same time share no byte unless one is an
/// overwrite ancestor of the other, and `max_live_bytes` is the lower bound.
pub fn verify(requests: &[Request], plan: &Plan) -> Result<(), PlanViolation> {
    validate(requests)?;
    let off = &plan.offsets;
    if off.len() != requests.len() {
        return Err(PlanViolation::LengthMismatch {
            offsets: off.len(),
            requests: requests.len(),
        });
    }
    for (i, r) in requests.iter().enumerate() {
        if r.start < r.end
            && off[i]
                .checked_add(r.size)
                .is_none_or(|e| e > plan.arena_bytes)
        {
            return Err(PlanViolation::OutsideArena {
                request: i,
                offset: off[i],
                size: r.size,
                arena: plan.arena_bytes,
            });
        }
        if let Some(o) = r.overwrite {
            let expected = off[o.of].checked_add(o.offset);
            if expected != Some(off[i]) {
                return Err(PlanViolation::OverwriteMisplaced {
                    request: i,
                    expected: expected.unwrap_or(u64::MAX),
                    found: off[i],
                });
            }
        }
    }
    // Pairs that overlap in time: sort by start, scan forward while the next
    // request starts before this one ends.
    let mut order: Vec<usize> = (0..requests.len())
        .filter(|&i| requests[i].occupies())
        .collect();
    order.sort_by_key(|&i| requests[i].start);
    for (k, &a) in order.iter().enumerate() {
        let ra = &requests[a];
        for &b in &order[k + 1..] {
            let rb = &requests[b];
            if rb.start >= ra.end {
                break;
            }
            // Both fit in u64: checked above against the arena.
            let overlap = off[a] < off[b] + rb.size && off[b] < off[a] + ra.size;
            if overlap
                && !Forest::is_ancestor(requests, a, b)
                && !Forest::is_ancestor(requests, b, a)
            {
                let (a, b) = (a.min(b), a.max(b));
                return Err(PlanViolation::Overlap {
                    a,
                    a_offset: off[a],
                    a_size: requests[a].size,
                    b,
                    b_offset: off[b],
                    b_size: requests[b].size,
                });
            }
        }
    }
    let actual = max_live_bytes(requests);
    if plan.max_live_bytes != actual {
        return Err(PlanViolation::WrongLowerBound {
            reported: plan.max_live_bytes,
            actual,
        });
    }
    Ok(())
}
