//! Blocks and the arena that owns them.
//!
//! A block is one free or used sub-range of a segment. Blocks of one segment form
//! an address-ordered doubly linked list through `prev`/`next` ids (ids into the
//! arena, not pointers), so split, merge and the adjacent-free query are O(1).

use std::num::NonZeroU32;

use crate::device::{DevicePtr, StreamId};

/// Index of a block in the [`BlockArena`]. Stable while the block lives; reused
/// after the block is merged away or its segment released. Never 0 (the
/// arena's slot 0 is a dead placeholder), so `Option<BlockId>` — a block's
/// `prev` and `next` — takes 4 bytes, not 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockId(NonZeroU32);

impl BlockId {
    /// The slot of this block in the arena's `slots`.
    #[inline(always)]
    fn slot(self) -> usize {
        self.0.get() as usize
    }

    /// An id that no arena mints (a sentinel in the pools' empty entries).
    pub(crate) const SENTINEL: BlockId = BlockId(NonZeroU32::MAX);

    /// The `n`-th id, for tests of the pools (which only compare ids).
    #[cfg(test)]
    pub(crate) fn test(n: u32) -> BlockId {
        BlockId(NonZeroU32::new(n + 1).expect("below u32::MAX"))
    }

    /// Inverse of [`BlockId::test`].
    #[cfg(test)]
    pub(crate) fn test_index(self) -> u32 {
        self.0.get() - 1
    }
}

/// Which of the allocator's two default pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolKind {
    /// Requests of ≤ 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    #[inline]
    pub(crate) fn for_size(rounded: usize) -> PoolKind {
        if crate::size::is_small(rounded) {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    pub(crate) fn is_small(self) -> bool {
        self == PoolKind::Small
    }
}

/// The streams other than its own that used a block: boxed, as most blocks
/// have none, so the block record stays small.
// A `Vec` inline would take 24 bytes of every block for what few blocks use.
#[allow(clippy::box_collection)]
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamUses(Option<Box<Vec<StreamId>>>);

impl StreamUses {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|v| v.is_empty())
    }

    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |v| v.len())
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &StreamId> {
        self.0.iter().flat_map(|v| v.iter())
    }

    pub(crate) fn contains(&self, s: &StreamId) -> bool {
        self.iter().any(|x| x == s)
    }

    pub(crate) fn push(&mut self, s: StreamId) {
        self.0.get_or_insert_with(Box::default).push(s);
    }

    /// Empties the list, keeping its allocation for the block's next use.
    #[inline]
    pub(crate) fn clear(&mut self) {
        if let Some(v) = &mut self.0 {
            v.clear();
        }
    }
}

/// One block. Invariants (checked by `check_invariants`):
/// - `size` is a multiple of 512 and > 0; `ptr + size == next.ptr` when `next` is set;
/// - a free (`!allocated && event_count == 0 && stream_uses.is_empty()`), mapped
///   block is in its pool's `blocks` set; an unmapped block is in `unmapped`;
/// - never two adjacent blocks that are both free with the same `mapped`.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// Start address.
    pub ptr: DevicePtr,
    /// Bytes covered (multiple of 512).
    pub size: usize,
    /// The caller's unrounded size at the last allocation (kept after free).
    pub requested: usize,
    /// The allocation stream: the block is only reused on this stream.
    pub stream: StreamId,
    /// Owning pool.
    pub pool: PoolKind,
    /// Handed out to a caller now.
    pub allocated: bool,
    /// Expandable segments only: false = address range with no memory behind it.
    pub mapped: bool,
    /// Address-ordered neighbours within the segment.
    pub prev: Option<BlockId>,
    /// See `prev`.
    pub next: Option<BlockId>,
    /// Outstanding end-of-use events on other streams.
    pub event_count: u32,
    /// Streams other than `stream` that used the block (`record_stream`).
    pub stream_uses: StreamUses,
    /// Value of the pool's GC clock when the block entered the free set.
    pub gc_count_base: u64,
    /// Index of the expandable segment the block lives in, if any.
    pub expandable: Option<u32>,
    /// Serial number of the current allocation, unique over the allocator's
    /// life; 0 while the block is not allocated. A handle must carry the same
    /// serial, so validating it is one compare and stale handles are rejected.
    pub serial: u64,
    /// In the arena (false: a dead slot waiting for reuse).
    pub live: bool,
}

impl Block {
    pub(crate) fn new(ptr: DevicePtr, size: usize, stream: StreamId, pool: PoolKind) -> Block {
        Block {
            ptr,
            size,
            requested: 0,
            stream,
            pool,
            allocated: false,
            mapped: true,
            prev: None,
            next: None,
            event_count: 0,
            stream_uses: StreamUses::default(),
            gc_count_base: 0,
            expandable: None,
            serial: 0,
            live: false,
        }
    }

    /// PyTorch's `is_split`: part of a segment that holds other blocks too.
    pub(crate) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Neither allocated nor waiting on events or other streams.
    pub(crate) fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty()
    }
}

/// Slab of blocks addressed by [`BlockId`]. A removed block's slot stays in
/// place (marked dead, its allocation serial 0) until an insert reuses it, so
/// neither insert nor remove moves a whole block through an `Option`, and
/// `slots` never shrinks: every id the arena ever minted stays in range, which
/// lets indexing skip the bounds check (see `Index`). Slot 0 is a dead
/// placeholder that is never handed out, so ids are never 0.
// No `Default`: an arena needs its placeholder in slot 0 (`with_capacity`).
#[derive(Debug)]
pub(crate) struct BlockArena {
    slots: Vec<Block>,
    vacant: Vec<BlockId>,
    live: usize,
}

impl BlockArena {
    /// An empty arena with room for `capacity` blocks before it reallocates.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let mut slots = Vec::with_capacity(capacity + 1);
        slots.push(Block::new(0, 0, StreamId(0), PoolKind::Small));
        BlockArena {
            slots,
            vacant: Vec::with_capacity(capacity),
            live: 0,
        }
    }

    #[inline]
    pub(crate) fn insert(&mut self, mut b: Block) -> BlockId {
        self.live += 1;
        b.live = true;
        if let Some(id) = self.vacant.pop() {
            self.slots[id.slot()] = b;
            id
        } else {
            self.slots.push(b);
            // The placeholder holds slot 0, so a pushed slot is never 0; and
            // u32::MAX is `BlockId::SENTINEL`, never minted.
            let n = u32::try_from(self.slots.len() - 1)
                .ok()
                .filter(|&n| n != u32::MAX)
                .expect("fewer than 2^32 - 1 blocks");
            BlockId(NonZeroU32::new(n).expect("slot 0 is the placeholder"))
        }
    }

    /// Removes a free block; the slot keeps its last contents (dead) until reused.
    #[inline]
    pub(crate) fn remove(&mut self, id: BlockId) {
        let b = &mut self.slots[id.slot()];
        assert!(b.live, "remove of dead block {id:?}: this is a bug");
        debug_assert_eq!(b.serial, 0, "remove of an allocated block {id:?}");
        b.live = false;
        b.serial = 0;
        self.vacant.push(id);
        self.live -= 1;
    }

    /// The block, or `None` when the id is vacant or out of range.
    #[cfg(any(test, feature = "invariant-checks"))]
    pub(crate) fn try_get(&self, id: BlockId) -> Option<&Block> {
        self.slots.get(id.slot()).filter(|b| b.live)
    }

    /// True when `id` is a live block allocated under `serial` (≠ 0): one bounds
    /// check and one compare, as dead and free slots carry serial 0.
    #[inline]
    pub(crate) fn holds_allocation(&self, id: BlockId, serial: u64) -> bool {
        self.slots
            .get(id.slot())
            .is_some_and(|b| b.serial == serial)
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live)
            .map(|(i, b)| {
                // Live slots are never the placeholder at 0.
                let n = NonZeroU32::new(i as u32).expect("slot 0 is dead");
                (BlockId(n), b)
            })
    }
}

impl std::ops::Index<BlockId> for BlockArena {
    type Output = Block;
    #[inline(always)]
    fn index(&self, id: BlockId) -> &Block {
        debug_assert!(id.slot() < self.slots.len(), "block {id:?} out of range");
        // SAFETY: `id.slot() < self.slots.len()`. Outside the pools' unit
        // tests (whose `BlockId::test` ids never index an arena), every `BlockId`
        // is minted by `BlockArena::insert` as an index into `slots`, which
        // never shrinks (a removed block's slot stays, dead), and the ids the
        // allocator stores (pool entries, segment links, events) come from its
        // own arena; a caller's handle is bounds-checked by `holds_allocation`
        // before its id is used. The one id not minted here,
        // `BlockId::SENTINEL`, only marks an empty bin's `min` (size 0) in a
        // pool, and the pools never return an entry of size 0 (their lookups
        // ask for sizes > 0, and `Bin::find` asserts it in debug builds).
        let b = unsafe { self.slots.get_unchecked(id.slot()) };
        debug_assert!(b.live, "dead block {id:?}: this is a bug in remat-alloc");
        b
    }
}

impl std::ops::IndexMut<BlockId> for BlockArena {
    #[inline(always)]
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        debug_assert!(id.slot() < self.slots.len(), "block {id:?} out of range");
        // SAFETY: as in `index`: every id is below `slots.len()`, which never
        // shrinks.
        let b = unsafe { self.slots.get_unchecked_mut(id.slot()) };
        debug_assert!(b.live, "dead block {id:?}: this is a bug in remat-alloc");
        b
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn block_record_size() {
        let n = std::mem::size_of::<super::Block>();
        eprintln!("Block: {n} bytes");
        assert!(n <= 80, "Block grew to {n} bytes");
        assert_eq!(std::mem::size_of::<Option<super::BlockId>>(), 4);
    }
}
