//! [`ArenaMemory`]: one flat arena, the physical memory model of a planned
//! iteration.
//!
//! A plan gives every allocation of the iteration an offset
//! ([`MemoryModel::allocate_at`]); the arena checks the range is free and places
//! it there — no search, no fragmentation. When the iteration leaves its plan (a
//! divergence), allocations fall back to best fit over the arena's free ranges,
//! and a failure asks the runtime to evict, as with any physical model.
//!
//! Sizes are rounded up to [`ARENA_ALIGN`] (PyTorch's minimum block size), so a
//! plan made from rounded sizes places exactly what the arena will hold.
//!
//! **Following a plan without a search tree.** An arena made with
//! [`ArenaMemory::with_layout`] starts in *planned mode*: while its allocations
//! arrive exactly as the plan lists them (allocation `k` of the arena is the
//! plan's allocation `k`, same offset, same size), it keeps no address-ordered
//! map, only a live flag per planned allocation. A planned range is then free
//! exactly when every allocation of the plan that last covered some byte of it
//! (its *predecessors*, precomputed by [`ArenaLayout::new`]) has been freed:
//! if a live block `j` overlapped the range at byte `a`, the plan's last
//! allocation `j*` over `a` before this one is either `j` (checked) or a later
//! one that was placed while `j` was live over `a`, which its own check would
//! have refused. Anything else (an allocation off the plan, best fit,
//! compaction, a free the flags do not know) first rebuilds the map from the
//! flags and leaves planned mode for good, so every answer stays exact.
//! A range never holds two live blocks in either mode.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::memory::{AllocFailure, BlockView, MemoryModel, MemoryUsage, Slot};

/// Alignment and size granule of arena blocks (bytes).
pub const ARENA_ALIGN: u64 = 512;

/// `bytes` rounded up to [`ARENA_ALIGN`] (0 stays 0).
pub fn arena_size(bytes: u64) -> u64 {
    bytes.div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

/// The planned allocations of an arena, in order, with the predecessors of
/// each (see the module doc): what lets an arena check a planned range in O(1)
/// amortized per allocation, without an address-ordered map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaLayout {
    offsets: Vec<u64>,
    sizes: Vec<u64>,
    /// `preds[pred_start[k]..pred_start[k + 1]]`: the earlier allocations that
    /// last covered some byte of allocation `k` (distinct, none of size 0).
    pred_start: Vec<u32>,
    preds: Vec<u32>,
}

impl ArenaLayout {
    /// The layout of planned allocations at `offsets` with rounded `sizes`
    /// (the same length), in the order they will be made. O(n log n): each
    /// allocation repaints the bytes it covers in a map of owner segments,
    /// and each segment is removed at most once after it is made.
    pub fn new(offsets: &[u64], sizes: &[u64]) -> Self {
        let n = offsets.len().min(sizes.len());
        // Disjoint segments: start → (end, the last allocation over them).
        let mut owners: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        let mut pred_start = Vec::with_capacity(n + 1);
        let mut preds: Vec<u32> = Vec::new();
        let mut touched: Vec<(u64, u64, u32)> = Vec::new();
        for k in 0..n {
            pred_start.push(preds.len() as u32);
            let (start, size) = (offsets[k], sizes[k]);
            if size == 0 {
                continue;
            }
            let end = start.saturating_add(size);
            touched.clear();
            if let Some((&p, &(e, w))) = owners.range(..start).next_back() {
                if e > start {
                    touched.push((p, e, w));
                }
            }
            touched.extend(owners.range(start..end).map(|(&p, &(e, w))| (p, e, w)));
            let first = pred_start[k] as usize;
            for &(p, e, w) in &touched {
                owners.remove(&p);
                if !preds[first..].contains(&w) {
                    preds.push(w);
                }
                if p < start {
                    owners.insert(p, (start, w));
                }
                if e > end {
                    owners.insert(end, (e, w));
                }
            }
            owners.insert(start, (end, k as u32));
        }
        pred_start.push(preds.len() as u32);
        Self {
            offsets: offsets[..n].to_vec(),
            sizes: sizes[..n].to_vec(),
            pred_start,
            preds,
        }
    }

    /// Whether planned allocation `k` is at `ptr` with rounded size `size`.
    pub(crate) fn is_at(&self, k: usize, ptr: u64, size: u64) -> bool {
        self.offsets.get(k) == Some(&ptr) && self.sizes.get(k) == Some(&size)
    }

    /// Planned allocations.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether the layout plans no allocation.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// The earlier planned allocations that last covered some byte of
    /// allocation `k`: its range is free once every one of them is freed.
    pub(crate) fn preds(&self, k: usize) -> &[u32] {
        &self.preds[self.pred_start[k] as usize..self.pred_start[k + 1] as usize]
    }
}

/// Planned mode: the layout, the next planned allocation and a live flag per
/// planned allocation (see the module doc).
#[derive(Debug, Clone)]
struct Planned {
    layout: Arc<ArenaLayout>,
    next: usize,
    live: Vec<bool>,
}

/// A flat arena of `capacity` bytes (the budget) with address-ordered blocks.
#[derive(Debug, Clone)]
pub struct ArenaMemory {
    capacity: u64,
    /// Allocated blocks: offset → rounded size. Never overlapping. Empty and
    /// unused in planned mode (the live flags of `planned` stand for it).
    blocks: BTreeMap<u64, u64>,
    /// `Some` in planned mode.
    planned: Option<Planned>,
    allocated: u64,
    peak_allocated: u64,
    /// The highest end of a block so far, or the planned arena if larger: what
    /// one device allocation for the arena must hold.
    reserved: u64,
    next_key: u64,
}

impl ArenaMemory {
    /// An empty arena of `capacity` bytes whose plan needs `planned` bytes.
    pub fn new(capacity: u64, planned: u64) -> Self {
        Self {
            capacity,
            blocks: BTreeMap::new(),
            allocated: 0,
            peak_allocated: 0,
            reserved: planned.min(capacity),
            next_key: 0,
            planned: None,
        }
    }

    /// An empty arena of `capacity` bytes that expects the allocations of
    /// `layout`, in order, and checks them without an address-ordered map
    /// while they come as planned (see the module doc).
    pub fn with_layout(capacity: u64, planned: u64, layout: Arc<ArenaLayout>) -> Self {
        let live = vec![false; layout.len()];
        Self {
            // Keys of allocations off the plan come after the plan's indices,
            // so no two live slots share a key.
            next_key: layout.len() as u64,
            planned: Some(Planned {
                layout,
                next: 0,
                live,
            }),
            ..Self::new(capacity, planned)
        }
    }

    /// Whether the arena is still in planned mode (no address-ordered map).
    pub fn is_following_layout(&self) -> bool {
        self.planned.is_some()
    }

    /// Leave planned mode: rebuild the address-ordered map from the live flags.
    fn materialize(&mut self) {
        if let Some(p) = self.planned.take() {
            let l = &p.layout;
            self.blocks = (0..p.live.len())
                .filter(|&k| p.live[k] && l.sizes[k] > 0)
                .map(|k| (l.offsets[k], l.sizes[k]))
                .collect();
        }
    }

    /// Live blocks `(ptr, size)` in address order, in either mode.
    fn live_blocks(&self) -> Vec<(u64, u64)> {
        match &self.planned {
            None => self.blocks.iter().map(|(&p, &s)| (p, s)).collect(),
            Some(p) => {
                let l = &p.layout;
                let mut v: Vec<(u64, u64)> = (0..p.live.len())
                    .filter(|&k| p.live[k] && l.sizes[k] > 0)
                    .map(|k| (l.offsets[k], l.sizes[k]))
                    .collect();
                v.sort_unstable();
                v
            }
        }
    }

    /// Check the arena's own invariants: live blocks inside the capacity,
    /// never overlapping, adding up to the allocated bytes.
    pub fn check_blocks(&self) -> Result<(), String> {
        let mut end = 0u64;
        let mut sum = 0u64;
        for (p, s) in self.live_blocks() {
            if p < end {
                return Err(format!(
                    "arena: block at {p:#x} overlaps one ending at {end:#x}"
                ));
            }
            end = p + s;
            sum += s;
        }
        if end > self.capacity {
            return Err(format!(
                "arena: a block ends at {end:#x}, past {:#x}",
                self.capacity
            ));
        }
        if sum != self.allocated {
            return Err(format!(
                "arena: blocks hold {sum} B, allocated {}",
                self.allocated
            ));
        }
        Ok(())
    }

    /// In planned mode, place `size` bytes at `ptr` when they are the next
    /// planned allocation: `Some(true)` placed, `Some(false)` the range is not
    /// free (exact), `None` not the next planned allocation (the caller leaves
    /// planned mode and checks the map).
    fn place_planned(&mut self, ptr: u64, size: u64, requested: u64) -> Option<Result<Slot, ()>> {
        let capacity = self.capacity;
        let p = self.planned.as_mut()?;
        let k = p.next;
        let l = &p.layout;
        if l.offsets.get(k) != Some(&ptr) || l.sizes.get(k) != Some(&size) {
            return None;
        }
        if size > 0 {
            if ptr.checked_add(size).is_none_or(|end| end > capacity)
                || l.preds(k).iter().any(|&j| p.live[j as usize])
            {
                return Some(Err(()));
            }
            p.live[k] = true;
        }
        p.next += 1;
        let mut slot = self.place_untracked(ptr, size, requested);
        slot.key = k as u64;
        Some(Ok(slot))
    }

    fn range_is_free(&self, ptr: u64, size: u64) -> bool {
        if ptr.checked_add(size).is_none_or(|end| end > self.capacity) {
            return false;
        }
        // Blocks never overlap, so of those starting before the range's end
        // only the last can reach into it: one walk of the tree.
        let end = ptr + size;
        let last = self.blocks.range(..end).next_back();
        last.is_none_or(|(&p, &s)| p + s <= ptr)
    }

    fn place(&mut self, ptr: u64, size: u64, requested: u64) -> Slot {
        debug_assert!(self.planned.is_none());
        if size > 0 {
            self.blocks.insert(ptr, size);
        }
        self.place_untracked(ptr, size, requested)
    }

    /// The accounting of a placement, without the map.
    fn place_untracked(&mut self, ptr: u64, size: u64, requested: u64) -> Slot {
        self.allocated += size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.reserved = self.reserved.max(ptr + size);
        self.next_key += 1;
        Slot {
            ptr,
            size,
            requested,
            key: self.next_key,
        }
    }

    /// Defragment: slide every block that `movable` accepts (by address) down to
    /// the lowest address it can take, in address order, around the blocks that
    /// stay. Returns `(old, new)` for each block that moved.
    pub fn compact(&mut self, movable: &dyn Fn(u64) -> bool) -> Vec<(u64, u64)> {
        self.materialize();
        let blocks: Vec<(u64, u64)> = self.blocks.iter().map(|(&p, &s)| (p, s)).collect();
        let fixed: Vec<(u64, u64)> = blocks
            .iter()
            .copied()
            .filter(|&(p, _)| !movable(p))
            .collect();
        let mut moves = Vec::new();
        let mut placed = BTreeMap::new();
        for &(p, s) in &fixed {
            placed.insert(p, s);
        }
        let mut cursor = 0u64;
        let mut next_fixed = 0usize;
        for &(p, s) in blocks.iter().filter(|&&(p, _)| movable(p)) {
            // The lowest start at or above the cursor clear of the fixed blocks;
            // never above the block's own address (that one is clear).
            let mut at = cursor;
            let mut k = next_fixed;
            while let Some(&(fp, fs)) = fixed.get(k) {
                if fp + fs <= at {
                    k += 1;
                    next_fixed = k;
                } else if fp < at + s {
                    at = fp + fs;
                    k += 1;
                } else {
                    break;
                }
            }
            let at = at.min(p);
            placed.insert(at, s);
            if at != p {
                moves.push((p, at));
            }
            cursor = at + s;
        }
        self.blocks = placed;
        moves
    }

    /// Defragment only as much as one free run of `need` bytes asks: over
    /// the address-ordered blocks and gaps, find the contiguous window that
    /// holds `need` free bytes with the fewest bytes of movable blocks in it
    /// (blocks `movable` refuses are barriers), and slide its blocks down to
    /// the window's start, so that its free bytes join at its top. Returns
    /// `(old, new)` for each block that moved; `None`, with nothing moved,
    /// when no window between barriers holds `need` free bytes.
    ///
    /// Sliding everything down ([`ArenaMemory::compact`]) at each failed
    /// allocation moved about all resident bytes every time: up to 2 TB in
    /// one step of the torch traces, whose compute is 50–90 ms (t5_small at
    /// 0.25: 2 080 GB). The window moves what one request needs.
    pub fn compact_for(
        &mut self,
        need: u64,
        movable: &dyn Fn(u64) -> bool,
    ) -> Option<Vec<(u64, u64)>> {
        let moves = self.moves_for(need, movable)?;
        for &(old, new) in &moves {
            // Down, in address order: `new` is never a block still to move.
            let size = self.blocks.remove(&old).unwrap_or(0);
            self.blocks.insert(new, size);
        }
        Some(moves)
    }

    /// The moves [`ArenaMemory::compact_for`] would make, `(old, new)` in
    /// address order, without making them.
    fn moves_for(&mut self, need: u64, movable: &dyn Fn(u64) -> bool) -> Option<Vec<(u64, u64)>> {
        self.materialize();
        // Elements in address order: (ptr, size, is_block); barriers split
        // them into runs searched separately.
        let mut elems: Vec<(u64, u64, bool)> = Vec::with_capacity(2 * self.blocks.len() + 1);
        let mut cursor = 0u64;
        for (&p, &sz) in &self.blocks {
            if p > cursor {
                elems.push((cursor, p - cursor, false));
            }
            elems.push((p, sz, true));
            cursor = cursor.max(p + sz);
        }
        if self.capacity > cursor {
            elems.push((cursor, self.capacity - cursor, false));
        }
        // Best window: (moved bytes, [lo, hi) in elems).
        let mut best: Option<(u64, usize, usize)> = None;
        let (mut lo, mut free, mut moved) = (0usize, 0u64, 0u64);
        for hi in 0..elems.len() {
            let (p, sz, block) = elems[hi];
            if block && !movable(p) {
                (lo, free, moved) = (hi + 1, 0, 0);
                continue;
            }
            if block {
                moved += sz;
            } else {
                free += sz;
            }
            // Drop from the left while the rest still holds `need` (dropping
            // never adds moved bytes).
            while lo < hi {
                let (_, lsz, lblock) = elems[lo];
                if lblock {
                    moved -= lsz;
                } else if free - lsz >= need {
                    free -= lsz;
                } else {
                    break;
                }
                lo += 1;
            }
            if free >= need && best.is_none_or(|b| moved < b.0) {
                best = Some((moved, lo, hi + 1));
            }
        }
        let (_, lo, hi) = best?;
        let mut at = elems[lo].0;
        let mut moves = Vec::new();
        for &(p, sz, block) in &elems[lo..hi] {
            if !block {
                continue;
            }
            if p != at {
                moves.push((p, at));
            }
            at += sz;
        }
        Some(moves)
    }

    /// Bytes [`ArenaMemory::compact_for`] would move for `need`, `None` when
    /// it would not answer.
    pub fn compaction_bytes(&mut self, need: u64, movable: &dyn Fn(u64) -> bool) -> Option<u64> {
        let moves = self.moves_for(need, movable)?;
        Some(moves.iter().map(|(old, _)| self.blocks[old]).sum())
    }

    /// Free ranges `(ptr, size)` in address order.
    fn gaps(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut cursor = 0u64;
        let cap = self.capacity;
        self.blocks
            .iter()
            .map(|(&p, &s)| (p, s))
            .chain(std::iter::once((cap, 0)))
            .filter_map(move |(p, s)| {
                let gap = (cursor, p.saturating_sub(cursor));
                cursor = cursor.max(p + s);
                (gap.1 > 0).then_some(gap)
            })
    }
}

impl MemoryModel for ArenaMemory {
    fn name(&self) -> &'static str {
        "arena"
    }

    fn allocate(&mut self, bytes: u64) -> Result<Slot, AllocFailure> {
        self.materialize();
        let size = arena_size(bytes);
        if size == 0 {
            return Ok(self.place(0, 0, bytes));
        }
        // Best fit, lowest address among equals.
        let best = self
            .gaps()
            .filter(|&(_, s)| s >= size)
            .min_by_key(|&(p, s)| (s, p));
        match best {
            Some((ptr, _)) => Ok(self.place(ptr, size, bytes)),
            None => Err(AllocFailure::NoRoom {
                free_bytes: self.capacity - self.allocated,
            }),
        }
    }

    fn allocate_at(&mut self, bytes: u64, offset: u64) -> Result<Slot, AllocFailure> {
        let size = arena_size(bytes);
        match self.place_planned(offset, size, bytes) {
            Some(Ok(slot)) => return Ok(slot),
            Some(Err(())) => {
                return Err(AllocFailure::NoRoom {
                    free_bytes: self.capacity - self.allocated,
                })
            }
            None => self.materialize(),
        }
        if size == 0 {
            return Ok(self.place(0, 0, bytes));
        }
        if !self.range_is_free(offset, size) {
            return Err(AllocFailure::NoRoom {
                free_bytes: self.capacity - self.allocated,
            });
        }
        Ok(self.place(offset, size, bytes))
    }

    fn free(&mut self, slot: Slot) -> Result<(), String> {
        if slot.size == 0 {
            return Ok(());
        }
        if let Some(p) = self.planned.as_mut() {
            let k = slot.key as usize;
            let l = &p.layout;
            if p.live.get(k) == Some(&true) && l.offsets[k] == slot.ptr && l.sizes[k] == slot.size {
                p.live[k] = false;
                self.allocated -= slot.size;
                return Ok(());
            }
            self.materialize();
        }
        match self.blocks.remove(&slot.ptr) {
            Some(size) if size == slot.size => {
                self.allocated -= size;
                Ok(())
            }
            Some(size) => {
                self.blocks.insert(slot.ptr, size);
                Err(format!(
                    "arena: freeing {} B at {:#x}, but the block there holds {} B",
                    slot.size, slot.ptr, size
                ))
            }
            None => Err(format!("arena: no block at {:#x}", slot.ptr)),
        }
    }

    fn adjacent_free(&self, slot: &Slot) -> (u64, u64) {
        if slot.size == 0 {
            return (0, 0);
        }
        if self.planned.is_some() {
            // Rare in planned mode (online decisions come after a divergence,
            // which leaves it): a scan of the live blocks.
            let blocks = self.live_blocks();
            let left_end = blocks
                .iter()
                .filter(|&&(p, _)| p < slot.ptr)
                .map(|&(p, s)| p + s)
                .max()
                .unwrap_or(0);
            let right = blocks
                .iter()
                .map(|&(p, _)| p)
                .filter(|&p| p > slot.ptr)
                .min()
                .unwrap_or(self.capacity);
            return (
                slot.ptr.saturating_sub(left_end),
                right.saturating_sub(slot.ptr + slot.size),
            );
        }
        let left_end = self
            .blocks
            .range(..slot.ptr)
            .next_back()
            .map_or(0, |(&p, &s)| p + s);
        let right = self
            .blocks
            .range(slot.ptr + 1..)
            .next()
            .map_or(self.capacity, |(&p, _)| p);
        (
            slot.ptr.saturating_sub(left_end),
            right.saturating_sub(slot.ptr + slot.size),
        )
    }

    fn has_addresses(&self) -> bool {
        true
    }

    fn blocks(&self, out: &mut Vec<BlockView>) {
        let mut cursor = 0u64;
        let push_gap = |out: &mut Vec<BlockView>, from: u64, to: u64| {
            if to > from {
                out.push(BlockView {
                    ptr: from,
                    size: to - from,
                    allocated: false,
                    segment: 0,
                    small: false,
                });
            }
        };
        let mut push_block = |out: &mut Vec<BlockView>, p: u64, s: u64| {
            push_gap(out, cursor, p);
            out.push(BlockView {
                ptr: p,
                size: s,
                allocated: true,
                segment: 0,
                small: false,
            });
            cursor = p + s;
        };
        if self.planned.is_some() {
            for (p, s) in self.live_blocks() {
                push_block(out, p, s);
            }
        } else {
            for (&p, &s) in &self.blocks {
                push_block(out, p, s);
            }
        }
        push_gap(out, cursor, self.capacity);
    }

    fn usage(&self) -> MemoryUsage {
        MemoryUsage {
            capacity: Some(self.capacity),
            allocated: self.allocated,
            reserved: self.reserved,
            peak_allocated: self.peak_allocated,
            peak_reserved: self.reserved,
        }
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.capacity)
    }

    fn can_compact(&self) -> bool {
        true
    }

    fn compact(
        &mut self,
        movable: &dyn Fn(u64) -> bool,
        need: Option<u64>,
    ) -> Option<Vec<(u64, u64)>> {
        need.and_then(|n| self.compact_for(arena_size(n), movable))
            .or_else(|| Some(ArenaMemory::compact(self, movable)))
    }

    fn compaction_bytes(&mut self, movable: &dyn Fn(u64) -> bool, need: u64) -> Option<u64> {
        ArenaMemory::compaction_bytes(self, arena_size(need), movable)
    }

    fn check_blocks(&self) -> Result<(), String> {
        ArenaMemory::check_blocks(self)
    }

    fn shape(&self, bytes: u64) -> crate::memory::RequestShape {
        let size = arena_size(bytes);
        crate::memory::RequestShape {
            block: size,
            segment: size,
            small: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_offsets_are_checked_and_best_fit_fills_gaps() {
        let mut a = ArenaMemory::new(4096, 2048);
        let x = a.allocate_at(100, 0).unwrap();
        assert_eq!((x.ptr, x.size), (0, 512));
        // Overlaps x.
        assert!(a.allocate_at(10, 256).is_err());
        let y = a.allocate_at(600, 1536).unwrap();
        assert_eq!((y.ptr, y.size), (1536, 1024));
        assert_eq!(a.adjacent_free(&x), (0, 1024));
        assert_eq!(a.adjacent_free(&y), (1024, 1536));
        // Best fit: the 1024 B gap at 512, not the 1536 B one at the end.
        let z = a.allocate(1000).unwrap();
        assert_eq!(z.ptr, 512);
        assert!(a.allocate(2000).is_err());
        let mut v = Vec::new();
        a.blocks(&mut v);
        assert_eq!(v.iter().map(|b| b.size).sum::<u64>(), 4096);
        assert_eq!(v.last().map(|b| (b.ptr, b.allocated)), Some((2560, false)));
        a.free(z).unwrap();
        a.free(x.clone()).unwrap();
        assert!(a.free(x).is_err());
        assert_eq!(a.usage().allocated, 1024);
        assert_eq!(a.usage().reserved, 2560);
    }

    #[test]
    fn compaction_slides_movable_blocks_down_around_fixed_ones() {
        let mut a = ArenaMemory::new(8192, 0);
        let x = a.allocate_at(512, 1024).unwrap();
        let pinned = a.allocate_at(512, 2560).unwrap();
        let y = a.allocate_at(1024, 4096).unwrap();
        let z = a.allocate_at(1536, 6144).unwrap();
        let moves = a.compact(&|p| p != pinned.ptr);
        // x to 0, y right after it (below the fixed block), z after the fixed one.
        assert_eq!(moves, vec![(1024, 0), (4096, 512), (6144, 3072)]);
        let mut v = Vec::new();
        a.blocks(&mut v);
        let allocated: Vec<(u64, u64)> = v
            .iter()
            .filter(|b| b.allocated)
            .map(|b| (b.ptr, b.size))
            .collect();
        assert_eq!(
            allocated,
            vec![(0, 512), (512, 1024), (2560, 512), (3072, 1536)]
        );
        assert_eq!(a.usage().allocated, 3584);
        // The biggest hole is now at the top.
        assert!(a.allocate(3584).is_ok());
        let _ = (x, y, z);
    }

    #[test]
    fn a_targeted_compaction_moves_only_the_cheapest_window() {
        // 0: x (512) | 512: gap 512 | 1024: y (1024) | 2048: gap 512 |
        // 2560: pinned (512) | 3072: gap 1024 | 4096: z (512) | 4608: gap 512
        // | 5120: w (2560) | 7680: gap 512. Free runs: 512, 512, 1024, 512, 512.
        let mut a = ArenaMemory::new(8192, 0);
        let _x = a.allocate_at(512, 0).unwrap();
        let _y = a.allocate_at(1024, 1024).unwrap();
        let pinned = a.allocate_at(512, 2560).unwrap();
        let _z = a.allocate_at(512, 4096).unwrap();
        let _w = a.allocate_at(2560, 5120).unwrap();
        assert!(a.allocate(1536).is_err());
        // 1 536 B: [3072, 4608) moves only z's 512 B (y's window moves 1 024,
        // the pinned block bars joining across it).
        let moves = a.compact_for(1536, &|p| p != pinned.ptr).unwrap();
        assert_eq!(moves, vec![(4096, 3072)]);
        assert_eq!(a.allocate(1536).unwrap().ptr, 3584);
        a.check_blocks().unwrap();
        // No window between barriers holds 4 KiB free: nothing moves.
        let mut b = ArenaMemory::new(4096, 0);
        let fixed = b.allocate_at(512, 1024).unwrap();
        assert_eq!(b.compact_for(4096, &|p| p != fixed.ptr), None);
        assert_eq!(b.usage().allocated, 512);
    }

    #[test]
    fn offsets_past_the_capacity_are_refused() {
        let mut a = ArenaMemory::new(1024, 1024);
        assert!(a.allocate_at(512, 768).is_err());
        assert!(a.allocate_at(512, u64::MAX - 10).is_err());
        assert!(a.allocate_at(512, 512).is_ok());
    }

    #[test]
    fn layout_predecessors_are_the_last_owners_of_each_byte() {
        // 0: [0, 1024); 1: [1024, 2048); 2: [512, 1536) over both;
        // 3: [0, 512) last covered by 0; 4: [0, 2048) over 3, 2 and 1.
        let offsets = [0, 1024, 512, 0, 0, 4096];
        let sizes = [1024, 1024, 1024, 512, 2048, 0];
        let l = ArenaLayout::new(&offsets, &sizes);
        assert_eq!(l.preds(0), &[] as &[u32]);
        assert_eq!(l.preds(1), &[] as &[u32]);
        assert_eq!(l.preds(2), &[0, 1]);
        assert_eq!(l.preds(3), &[0]);
        let mut p4 = l.preds(4).to_vec();
        p4.sort_unstable();
        assert_eq!(p4, vec![1, 2, 3]);
        assert_eq!(l.preds(5), &[] as &[u32]);
    }

    #[test]
    fn planned_mode_checks_predecessors_and_leaves_on_anything_else() {
        let offsets = [0, 1024, 512, 0];
        let sizes = [1024, 1024, 1024, 512];
        let layout = Arc::new(ArenaLayout::new(&offsets, &sizes));
        let mut a = ArenaMemory::with_layout(4096, 2048, layout.clone());
        let x = a.allocate_at(1000, 0).unwrap();
        let y = a.allocate_at(1024, 1024).unwrap();
        assert!(a.is_following_layout());
        // 2 overlaps x and y, both live: refused, still planned.
        assert!(a.allocate_at(1024, 512).is_err());
        a.free(x).unwrap();
        assert!(a.allocate_at(1024, 512).is_err());
        a.free(y).unwrap();
        let z = a.allocate_at(1024, 512).unwrap();
        assert!(a.is_following_layout());
        assert_eq!(a.usage().allocated, 1024);
        a.check_blocks().unwrap();
        let mut v = Vec::new();
        a.blocks(&mut v);
        assert_eq!(
            v.iter()
                .filter(|b| b.allocated)
                .map(|b| (b.ptr, b.size))
                .collect::<Vec<_>>(),
            vec![(512, 1024)]
        );
        assert_eq!(a.adjacent_free(&z), (512, 4096 - 1536));
        // 3 is [0, 512): its predecessor 0 is free, so it is placed.
        let w = a.allocate_at(512, 0).unwrap();
        assert!(a.is_following_layout());
        // Past the layout: the map is rebuilt from the flags, the check is exact.
        assert!(a.allocate_at(512, 1024).is_err());
        assert!(!a.is_following_layout());
        assert!(a.allocate_at(512, 1536).is_ok());
        a.check_blocks().unwrap();
        a.free(w).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.usage().allocated, 512);
        // An allocation off the plan leaves planned mode at once.
        let mut b = ArenaMemory::with_layout(4096, 2048, layout);
        b.allocate_at(1024, 0).unwrap();
        let off = b.allocate_at(512, 2048).unwrap();
        assert!(!b.is_following_layout());
        assert!(b.allocate_at(512, 512).is_err());
        b.free(off).unwrap();
        b.check_blocks().unwrap();
    }

    proptest::proptest! {
        /// In planned mode, `allocate_at` and `free` agree with a list of live
        /// blocks exactly as the map does: a planned range is taken exactly when
        /// it is inside the arena and overlaps no live block, whether the
        /// allocations follow the layout or leave it part way (`detour`).
        #[test]
        fn planned_ranges_never_overlap_a_live_block(
            plan in proptest::collection::vec((0u64..48, 0u64..6), 1..120),
            frees in proptest::collection::vec(proptest::bool::ANY, 120),
            pick in proptest::collection::vec(0usize..1000, 120),
            detour in proptest::option::of(0usize..120),
        ) {
            let cap = 40 * ARENA_ALIGN;
            let offsets: Vec<u64> = plan.iter().map(|&(at, _)| at * ARENA_ALIGN).collect();
            let sizes: Vec<u64> = plan.iter().map(|&(_, len)| len * ARENA_ALIGN).collect();
            let layout = Arc::new(ArenaLayout::new(&offsets, &sizes));
            let mut a = ArenaMemory::with_layout(cap, 0, layout);
            let mut live: Vec<Slot> = Vec::new();
            for k in 0..plan.len() {
                if frees[k] && !live.is_empty() {
                    let slot = live.remove(pick[k] % live.len());
                    a.free(slot).unwrap();
                }
                let (ptr, size) = if detour == Some(k) {
                    (offsets[k] ^ ARENA_ALIGN, sizes[k])
                } else {
                    (offsets[k], sizes[k])
                };
                let fits = size == 0
                    || (ptr + size <= cap
                        && live.iter().all(|b| b.ptr + b.size <= ptr || ptr + size <= b.ptr));
                match a.allocate_at(size, ptr) {
                    Ok(slot) => {
                        proptest::prop_assert!(fits, "{ptr}+{size} overlaps {live:?}");
                        if slot.size > 0 {
                            live.push(slot);
                        }
                    }
                    Err(_) => {
                        proptest::prop_assert!(!fits, "{ptr}+{size} refused, free");
                        // The runtime leaves the plan at a refusal; the arena
                        // goes on with the next allocation, checked exactly.
                    }
                }
                proptest::prop_assert!(a.check_blocks().is_ok());
                proptest::prop_assert_eq!(
                    a.usage().allocated,
                    live.iter().map(|b| b.size).sum::<u64>()
                );
            }
        }

        /// `allocate_at` takes a range exactly when it is inside the arena and
        /// overlaps no live block (checked against a list of blocks).
        #[test]
        fn allocate_at_agrees_with_a_list_of_blocks(
            ops in proptest::collection::vec((0u64..64, 1u64..6, proptest::bool::ANY), 1..200)
        ) {
            let cap = 40 * ARENA_ALIGN;
            let mut a = ArenaMemory::new(cap, 0);
            let mut live: Vec<Slot> = Vec::new();
            for (at, len, free) in ops {
                if free && !live.is_empty() {
                    let slot = live.remove(at as usize % live.len());
                    a.free(slot).unwrap();
                    continue;
                }
                let (ptr, size) = (at * ARENA_ALIGN, len * ARENA_ALIGN);
                let fits = ptr + size <= cap
                    && live.iter().all(|b| b.ptr + b.size <= ptr || ptr + size <= b.ptr);
                match a.allocate_at(size, ptr) {
                    Ok(slot) => {
                        proptest::prop_assert!(fits, "{ptr}+{size} overlaps {live:?}");
                        live.push(slot);
                    }
                    Err(_) => proptest::prop_assert!(!fits, "{ptr}+{size} refused, free"),
                }
            }
        }

        /// A targeted compaction keeps every block (sizes, count, the fixed
        /// ones in place), moves blocks only down, and when it answers, leaves
        /// one free run of `need` bytes and moves no more than sliding
        /// everything down would. When it does not, no window between fixed
        /// blocks holds `need` free bytes, and nothing moved.
        #[test]
        fn a_targeted_compaction_opens_the_run_it_was_asked_for(
            placed in proptest::collection::vec((0u64..64, 1u64..6, proptest::bool::ANY), 1..60),
            need in 1u64..24,
        ) {
            let cap = 64 * ARENA_ALIGN;
            let mut a = ArenaMemory::new(cap, 0);
            let mut fixed = Vec::new();
            for (at, len, pin) in placed {
                if let Ok(slot) = a.allocate_at(len * ARENA_ALIGN, at * ARENA_ALIGN) {
                    if pin {
                        fixed.push(slot.ptr);
                    }
                }
            }
            let need = need * ARENA_ALIGN;
            let before = a.live_blocks();
            let mut full = a.clone();
            let full_moved: u64 = full
                .compact(&|p| !fixed.contains(&p))
                .iter()
                .map(|&(old, _)| before.iter().find(|b| b.0 == old).unwrap().1)
                .sum();
            let got = a.compact_for(need, &|p| !fixed.contains(&p));
            proptest::prop_assert!(a.check_blocks().is_ok());
            let after = a.live_blocks();
            let mut sizes_before: Vec<u64> = before.iter().map(|b| b.1).collect();
            let mut sizes_after: Vec<u64> = after.iter().map(|b| b.1).collect();
            sizes_before.sort_unstable();
            sizes_after.sort_unstable();
            proptest::prop_assert_eq!(sizes_before, sizes_after);
            for p in &fixed {
                proptest::prop_assert!(after.iter().any(|b| b.0 == *p));
            }
            match got {
                Some(moves) => {
                    let moved: u64 = moves
                        .iter()
                        .map(|&(old, new)| {
                            assert!(new < old);
                            before.iter().find(|b| b.0 == old).unwrap().1
                        })
                        .sum();
                    proptest::prop_assert!(a.gaps().any(|g| g.1 >= need));
                    // Each block it moves has a gap below it, so sliding
                    // everything down moves it too.
                    proptest::prop_assert!(moved <= full_moved, "{moved} > {full_moved}");
                }
                None => proptest::prop_assert_eq!(before, after),
            }
        }
    }
}
