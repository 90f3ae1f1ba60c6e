//! Blocks and the arena that owns them.
//!
//! A block is one free or used sub-range of a segment. Blocks of one segment form
//! an address-ordered doubly linked list through `prev`/`next` ids (ids into the
//! arena, not pointers), so split, merge and the adjacent-free query are O(1).

use crate::device::{DevicePtr, StreamId};

/// Index of a block in the [`BlockArena`]. Stable while the block lives; reused
/// after the block is merged away or its segment released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockId(pub(crate) u32);

/// Which of the allocator's two default pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolKind {
    /// Requests of ≤ 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
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
    pub stream_uses: Vec<StreamId>,
    /// Value of the pool's GC clock when the block entered the free set.
    pub gc_count_base: u64,
    /// Index of the expandable segment the block lives in, if any.
    pub expandable: Option<usize>,
    /// Serial number of the current allocation (0 when never allocated); a
    /// handle must carry the same serial, so stale handles are rejected.
    pub serial: u64,
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
            stream_uses: Vec::new(),
            gc_count_base: 0,
            expandable: None,
            serial: 0,
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

/// Slab of blocks addressed by [`BlockId`].
#[derive(Debug, Default)]
pub(crate) struct BlockArena {
    slots: Vec<Option<Block>>,
    vacant: Vec<u32>,
    live: usize,
}

impl BlockArena {
    pub(crate) fn insert(&mut self, b: Block) -> BlockId {
        self.live += 1;
        if let Some(i) = self.vacant.pop() {
            self.slots[i as usize] = Some(b);
            BlockId(i)
        } else {
            self.slots.push(Some(b));
            BlockId((self.slots.len() - 1) as u32)
        }
    }

    pub(crate) fn remove(&mut self, id: BlockId) -> Block {
        let b = self.slots[id.0 as usize]
            .take()
            .unwrap_or_else(|| panic!("remove of dead block {id:?}: this is a bug"));
        self.vacant.push(id.0);
        self.live -= 1;
        b
    }

    /// The block, or `None` when the id is vacant or out of range.
    pub(crate) fn try_get(&self, id: BlockId) -> Option<&Block> {
        self.slots.get(id.0 as usize).and_then(|s| s.as_ref())
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|b| (BlockId(i as u32), b)))
    }
}

impl std::ops::Index<BlockId> for BlockArena {
    type Output = Block;
    #[inline]
    fn index(&self, id: BlockId) -> &Block {
        match &self.slots[id.0 as usize] {
            Some(b) => b,
            None => panic!("dead block {id:?}: this is a bug in remat-alloc"),
        }
    }
}

impl std::ops::IndexMut<BlockId> for BlockArena {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        match &mut self.slots[id.0 as usize] {
            Some(b) => b,
            None => panic!("dead block {id:?}: this is a bug in remat-alloc"),
        }
    }
}
