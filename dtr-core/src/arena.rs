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

use std::collections::BTreeMap;

use crate::memory::{AllocFailure, BlockView, MemoryModel, MemoryUsage, Slot};

/// Alignment and size granule of arena blocks (bytes).
pub const ARENA_ALIGN: u64 = 512;

/// `bytes` rounded up to [`ARENA_ALIGN`] (0 stays 0).
pub fn arena_size(bytes: u64) -> u64 {
    bytes.div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

/// A flat arena of `capacity` bytes (the budget) with address-ordered blocks.
#[derive(Debug, Clone)]
pub struct ArenaMemory {
    capacity: u64,
    /// Allocated blocks: offset → rounded size. Never overlapping.
    blocks: BTreeMap<u64, u64>,
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
        }
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
        if size > 0 {
            self.blocks.insert(ptr, size);
        }
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
        for (&p, &s) in &self.blocks {
            push_gap(out, cursor, p);
            out.push(BlockView {
                ptr: p,
                size: s,
                allocated: true,
                segment: 0,
                small: false,
            });
            cursor = p + s;
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

    fn compact(&mut self, movable: &dyn Fn(u64) -> bool) -> Option<Vec<(u64, u64)>> {
        Some(ArenaMemory::compact(self, movable))
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
    fn offsets_past_the_capacity_are_refused() {
        let mut a = ArenaMemory::new(1024, 1024);
        assert!(a.allocate_at(512, 768).is_err());
        assert!(a.allocate_at(512, u64::MAX - 10).is_err());
        assert!(a.allocate_at(512, 512).is_ok());
    }

    proptest::proptest! {
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
    }
}
