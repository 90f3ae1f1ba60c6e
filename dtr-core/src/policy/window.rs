//! Coop-style eviction (Zhang et al., "Coop: Memory is not a Commodity", 2023): look
//! at the allocator's address-ordered blocks and evict the cheapest *contiguous*
//! run whose bytes (evictable blocks plus the free blocks between them) hold the
//! request, so one decision opens one hole that fits. A segment whose blocks can
//! all go also counts when a fresh segment for the request would then fit in the
//! device. Pinned and non-recomputable blocks are barriers.
//!
//! Cost of a block: e*_eq / staleness (the h_DTR^eq numerator over its staleness);
//! free blocks cost nothing. Without addresses (logical budget) or for the
//! byte-threshold trigger it falls back to h_DTR^eq.

use super::score::{ScoreKind, ScorePolicy};
use super::{DecisionView, EvictionPolicy};
use crate::ids::StorageId;
use crate::memory::BlockView;

/// The Coop window policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoopWindow;

/// A choice of block ranges: (rank, bytes, `[lo, hi)` ranges of the block list).
type Choice = (f64, u64, Vec<(usize, usize)>);

/// The cheapest window found by [`cheapest_window`].
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Summed block cost (or cost per byte when searched by density).
    pub cost: f64,
    /// Bytes the window frees (evictable plus free blocks).
    pub bytes: u64,
    /// The storages to evict.
    pub victims: Vec<StorageId>,
}

/// Search the address-ordered blocks for the cheapest contiguous run that places
/// the current request, with `cost_of` pricing an evictable block. `None` when no
/// run can (barriers everywhere, or no request).
pub fn cheapest_window(
    view: &mut DecisionView<'_>,
    blocks: &mut Vec<BlockView>,
    density: bool,
    mut cost_of: impl FnMut(&mut DecisionView<'_>, StorageId) -> f64,
) -> Option<Window> {
    let rank = |cost: f64, bytes: u64| {
        if density {
            cost / bytes.max(1) as f64
        } else {
            cost
        }
    };
    let req = view.request();
    let shape = req.shape?;
    if req.bytes == 0 || !view.has_addresses() {
        return None;
    }
    blocks.clear();
    view.blocks(blocks);
    let usage = view.usage();
    let device_free = usage
        .capacity
        .map_or(u64::MAX, |c| c.saturating_sub(usage.reserved));
    // (cost or None for a barrier, storage) per block, filled per segment.
    let mut elems: Vec<(u64, Option<f64>, Option<StorageId>)> = Vec::new();
    let mut best: Option<(f64, u64, usize, usize)> = None; // cost, bytes, [lo, hi) in blocks
                                                           // Whole segments that could be emptied: (cost, bytes, [lo, hi)).
    let mut whole: Vec<(f64, u64, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let seg = blocks[i].segment;
        let mut j = i;
        while j < blocks.len() && blocks[j].segment == seg {
            j += 1;
        }
        elems.clear();
        let mut seg_bytes = 0u64;
        let mut barrier = false;
        for b in &blocks[i..j] {
            seg_bytes += b.size;
            if !b.allocated {
                elems.push((b.size, Some(0.0), None));
                continue;
            }
            match view.storage_at(b.ptr).filter(|s| view.is_candidate(*s)) {
                Some(s) => {
                    let c = cost_of(view, s);
                    elems.push((b.size, Some(c), Some(s)));
                }
                None => {
                    barrier = true;
                    elems.push((b.size, None, None));
                }
            }
        }
        let same_pool = blocks[i].small == shape.small;
        if same_pool {
            // Two pointers between barriers: for each right end the shortest
            // window holding the request (costs are non-negative).
            let (mut lo, mut bytes, mut cost) = (0usize, 0u64, 0.0f64);
            for hi in 0..elems.len() {
                let (sz, c, _) = elems[hi];
                match c {
                    None => {
                        lo = hi + 1;
                        bytes = 0;
                        cost = 0.0;
                        continue;
                    }
                    Some(c) => {
                        bytes += sz;
                        cost += c;
                    }
                }
                while lo < hi && bytes - elems[lo].0 >= shape.block {
                    bytes -= elems[lo].0;
                    cost -= elems[lo].1.unwrap_or(0.0);
                    lo += 1;
                }
                let r = rank(cost.max(0.0), bytes);
                if bytes >= shape.block && best.as_ref().is_none_or(|b| r < b.0) {
                    best = Some((r, bytes, i + lo, i + hi + 1));
                }
            }
        }
        if !barrier {
            let cost: f64 = elems.iter().map(|e| e.1.unwrap_or(0.0)).sum();
            whole.push((cost, seg_bytes, i, j));
        }
        if !barrier && device_free.saturating_add(seg_bytes) >= shape.segment {
            let cost: f64 = elems.iter().map(|e| e.1.unwrap_or(0.0)).sum();
            let r = rank(cost, seg_bytes);
            if best.as_ref().is_none_or(|b| r < b.0) {
                best = Some((r, seg_bytes, i, j));
            }
        }
        i = j;
    }
    // Several whole segments together, cheapest per byte first, until a new
    // segment for the request fits in the device.
    let mut multi: Option<Choice> = None;
    if device_free < shape.segment && whole.len() > 1 {
        whole.sort_by(|a, b| (a.0 / a.1.max(1) as f64).total_cmp(&(b.0 / b.1.max(1) as f64)));
        let (mut cost, mut bytes, mut ranges) = (0.0, 0u64, Vec::new());
        for &(c, b, lo, hi) in &whole {
            cost += c;
            bytes += b;
            ranges.push((lo, hi));
            if device_free.saturating_add(bytes) >= shape.segment {
                let r = rank(cost, bytes);
                if ranges.len() > 1 && best.as_ref().is_none_or(|x| r < x.0) {
                    multi = Some((r, bytes, ranges));
                }
                break;
            }
        }
    }
    let (cost, bytes, ranges) = match (multi, best) {
        (Some(m), _) => {
            view.segments_emptied = m.2.len();
            m
        }
        (None, Some((c, b, lo, hi))) => (c, b, vec![(lo, hi)]),
        (None, None) => return None,
    };
    let victims: Vec<StorageId> = ranges
        .iter()
        .flat_map(|&(lo, hi)| blocks[lo..hi].iter())
        .filter(|b| b.allocated)
        .filter_map(|b| view.storage_at(b.ptr))
        .collect();
    if victims.is_empty() {
        return None;
    }
    Some(Window {
        cost,
        bytes,
        victims,
    })
}

impl EvictionPolicy for CoopWindow {
    fn name(&self) -> &'static str {
        "coop"
    }

    fn choose(&mut self, view: &mut DecisionView<'_>, victims: &mut Vec<StorageId>) {
        let mut blocks = Vec::new();
        let w = cheapest_window(view, &mut blocks, false, |v, s| {
            v.e_star_eq(s) / v.staleness(s)
        });
        match w {
            Some(w) => victims.extend(w.victims),
            None => ScorePolicy::new(ScoreKind::DtrEq).choose(view, victims),
        }
    }
}
