//! Compaction: lower a finished plan's chunks as far as the others allow.
//!
//! A constructive planner fixes each chunk once, so a chunk placed high early
//! stays high after the chunks below it turn out to leave room. Compaction
//! improves any plan afterwards, in two moves:
//!
//! * **gravity**: in order of offset, move each chunk to the lowest offset where
//!   it overlaps no chunk alive at the same time (first fit among its
//!   neighbours in time, the others held where they are). A chunk only moves
//!   down, so the arena never grows;
//! * **shake**: mirror the plan (offset `o` of a chunk of `s` bytes becomes
//!   `arena - o - s`, which is just as valid), apply gravity, mirror back and
//!   apply gravity again. What was packed against the top is now packed
//!   against the bottom and the chunks above it settle into the holes it left,
//!   as in a shaken box. Shakes repeat while they lower the arena, at most
//!   `MAX_SHAKES` (2) times.
//!
//! Chunks are overwrite trees, as in the seed-001 planner: a tree's root with
//! its size, alive from the root's start to its last member's end, members at
//! fixed offsets inside it. A plan whose members interleave more tightly than
//! their trees' chunks (possible after greedy-by-size) gets gravity only, and a
//! chunk moves only to a place free of every chunk it meets in time, so the
//! result stays valid; mirroring needs chunk-level validity and is skipped.
//!
//! Why it helps: eviction schedules keep live bytes near the budget for long
//! stretches, and rematerialized copies with short lifetimes cut across the long
//! ones. A constructive order (largest first, or the order of a best-fit
//! simulation) leaves holes under chunks placed before their neighbours were
//! known; shaking settles them. Cost per gravity pass: for each chunk, a sort of
//! its neighbours in time (`O(Σ k log k)`, `k` the chunks alive beside it). Past
//! 2²⁵ neighbour entries (128 MiB; e.g. ~5 800 requests all alive at once) a
//! plan comes back unchanged rather than costing more memory and time.

use super::{arena_of, forest, offsets_from_roots, units, Plan, PlanError, Request};

/// Most shakes (mirror, gravity, mirror, gravity) per compaction.
const MAX_SHAKES: usize = 2;

/// Most neighbour entries (two per pair of chunks alive together, 4 B each:
/// 128 MiB). Compaction's memory and time grow with them; past this many a
/// plan comes back unchanged (all of 20 000 requests alive at once would need 1.6 GB).
const MAX_NEIGHBOUR_ENTRIES: usize = 1 << 25;

/// Lower `plan`'s chunks as far as the chunks they meet in time allow (see the
/// module docs). The result is valid whenever `plan` is, and its arena is never
/// larger: when compaction gains nothing, or the requests have more pairs alive
/// together than compaction takes on (2²⁴), `plan` comes back unchanged.
///
/// # Errors
///
/// The requests' own errors (as [`plan`](super::plan) reports them), and
/// [`PlanError::PlanLengthMismatch`] when `plan` does not have one offset per
/// request.
pub fn compact(requests: &[Request], plan: &Plan) -> Result<Plan, PlanError> {
    compact_within(requests, plan, 0)
}

/// [`compact`] for a caller that only needs the plan to fit `target` bytes: it
/// stops as soon as the arena is at most `target`, or when a shake gained less
/// than is still missing (each shake gains less than the one before, so the
/// next would not reach `target` either). `target` 0 compacts fully.
///
/// # Errors
///
/// As [`compact`].
pub fn compact_within(requests: &[Request], plan: &Plan, target: u64) -> Result<Plan, PlanError> {
    if plan.offsets.len() != requests.len() {
        return Err(PlanError::PlanLengthMismatch {
            offsets: plan.offsets.len(),
            requests: requests.len(),
        });
    }
    let f = forest(requests)?;
    let chunks: Vec<_> = units(requests, &f)
        .into_iter()
        .filter(|u| u.size > 0)
        .collect();
    if chunks.len() < 2 {
        return Ok(plan.clone());
    }
    let size: Vec<u64> = chunks.iter().map(|u| u.size).collect();
    let mut pos: Vec<u64> = chunks.iter().map(|u| plan.offsets[u.root]).collect();
    let Some(neighbours) = neighbours_in_time(&chunks) else {
        return Ok(plan.clone());
    };
    let chunk_valid = !any_overlap(&neighbours, &pos, &size);

    let mut scratch = Scratch::default();
    let mut best_top = gravity(&neighbours, &size, &mut pos, chunk_valid, &mut scratch);
    let mut best = pos.clone();
    if chunk_valid && best_top > target {
        for _ in 0..MAX_SHAKES {
            mirror(&size, &mut pos);
            gravity(&neighbours, &size, &mut pos, chunk_valid, &mut scratch);
            mirror(&size, &mut pos);
            let top = gravity(&neighbours, &size, &mut pos, chunk_valid, &mut scratch);
            if top >= best_top {
                break;
            }
            let gained = best_top - top;
            best_top = top;
            best.clone_from(&pos);
            // Shakes gain less each time: when this one gained less than is
            // still missing, the next cannot reach the target either.
            if best_top <= target || (target > 0 && best_top - target > gained) {
                break;
            }
        }
    }
    if best_top >= plan.arena_bytes {
        return Ok(plan.clone());
    }
    let mut root_offset: Vec<u64> = plan.offsets.clone();
    for (u, &p) in chunks.iter().zip(&best) {
        root_offset[u.root] = p;
    }
    // Roots of chunks that never take memory keep their offsets; members
    // follow their roots.
    let offsets = offsets_from_roots(&f, &root_offset)?;
    let arena_bytes = arena_of(requests, &offsets)?;
    Ok(Plan {
        offsets,
        arena_bytes,
        max_live_bytes: plan.max_live_bytes,
    })
}

/// For each chunk, the chunks alive at a common time step (CSR: `start[c]..start[c + 1]`
/// indexes `list`).
struct Neighbours {
    start: Vec<usize>,
    list: Vec<u32>,
}

impl Neighbours {
    fn of(&self, c: usize) -> &[u32] {
        &self.list[self.start[c]..self.start[c + 1]]
    }
}

/// `None` past [`MAX_NEIGHBOUR_ENTRIES`] (or more chunks than `u32` counts).
fn neighbours_in_time(chunks: &[super::Unit]) -> Option<Neighbours> {
    if u32::try_from(chunks.len()).is_err() {
        return None;
    }
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    order.sort_by_key(|&c| chunks[c].start);
    // Pairs alive together: by start, each chunk with those that start before
    // it ends. Counted first (stopping past the limit), then filled in place
    // (CSR). `f` returns false to stop.
    let each_pair = |f: &mut dyn FnMut(usize, usize) -> bool| {
        for (k, &a) in order.iter().enumerate() {
            for &b in &order[k + 1..] {
                if chunks[b].start >= chunks[a].end {
                    break;
                }
                if !f(a, b) {
                    return;
                }
            }
        }
    };
    let mut degree = vec![0usize; chunks.len() + 1];
    let mut entries = 0usize;
    each_pair(&mut |a, b| {
        degree[a] += 1;
        degree[b] += 1;
        entries += 2;
        entries <= MAX_NEIGHBOUR_ENTRIES
    });
    if entries > MAX_NEIGHBOUR_ENTRIES {
        return None;
    }
    let mut start = Vec::with_capacity(chunks.len() + 1);
    let mut total = 0;
    for d in &degree[..chunks.len()] {
        start.push(total);
        total += d;
    }
    start.push(total);
    let mut fill = start.clone();
    let mut list = vec![0u32; total];
    each_pair(&mut |a, b| {
        list[fill[a]] = b as u32;
        fill[a] += 1;
        list[fill[b]] = a as u32;
        fill[b] += 1;
        true
    });
    Some(Neighbours { start, list })
}

/// Whether two chunks alive together overlap in address.
fn any_overlap(n: &Neighbours, pos: &[u64], size: &[u64]) -> bool {
    (0..pos.len()).any(|a| {
        n.of(a).iter().any(|&b| {
            let b = b as usize;
            pos[a] < pos[b] + size[b] && pos[b] < pos[a] + size[a]
        })
    })
}

/// Buffers reused across gravity passes.
#[derive(Default)]
struct Scratch {
    order: Vec<usize>,
    spans: Vec<(u64, u64)>,
}

/// One gravity pass; returns the arena (highest chunk top). With
/// `chunk_valid` (no two chunks alive together overlap), only the neighbours
/// that start below a chunk can bound its new place: the others start at or
/// above its top, which only falls.
fn gravity(
    n: &Neighbours,
    size: &[u64],
    pos: &mut [u64],
    chunk_valid: bool,
    s: &mut Scratch,
) -> u64 {
    s.order.clear();
    s.order.extend(0..pos.len());
    s.order.sort_by_key(|&c| (pos[c], c));
    for &c in &s.order {
        let here = pos[c];
        s.spans.clear();
        s.spans.extend(n.of(c).iter().filter_map(|&b| {
            let b = b as usize;
            (!chunk_valid || pos[b] < here).then(|| (pos[b], pos[b] + size[b]))
        }));
        s.spans.sort_unstable_by_key(|&(lo, _)| lo);
        // First fit: the lowest offset free of every neighbour.
        let mut cur = 0u64;
        for &(lo, hi) in &s.spans {
            if lo >= cur + size[c] {
                break;
            }
            cur = cur.max(hi);
        }
        if cur < here {
            pos[c] = cur;
        }
    }
    pos.iter().zip(size).map(|(p, s)| p + s).max().unwrap_or(0)
}

/// Flip the plan upside down inside its own arena.
fn mirror(size: &[u64], pos: &mut [u64]) {
    let top = pos.iter().zip(size).map(|(p, s)| p + s).max().unwrap_or(0);
    for (p, s) in pos.iter_mut().zip(size) {
        *p = top - *p - s;
    }
}
