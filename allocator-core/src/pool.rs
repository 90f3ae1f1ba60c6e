//! Best-fit pools of free blocks (PyTorch's `BlockPool`).
//!
//! `blocks` holds free, mapped blocks ordered by `(stream, size, address)`, so a
//! lower-bound lookup on `(stream, size, 0)` is best fit with ties broken by the
//! lowest address. `unmapped` holds the unmapped blocks of expandable segments in
//! address order.

use crate::block::BlockId;
use crate::device::{DevicePtr, StreamId};
use std::collections::BTreeMap;

/// Key of the size-ordered set.
pub(crate) type SizeKey = (StreamId, usize, DevicePtr);
/// Key of the address-ordered set.
pub(crate) type AddrKey = (StreamId, DevicePtr);

#[derive(Debug)]
pub(crate) struct BlockPool {
    /// Free mapped blocks, best-fit order.
    pub blocks: BTreeMap<SizeKey, BlockId>,
    /// Unmapped expandable blocks, address order.
    pub unmapped: BTreeMap<AddrKey, BlockId>,
    /// GC clock: advanced by lookups while garbage collection is enabled.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub(crate) fn new() -> Self {
        BlockPool {
            blocks: BTreeMap::new(),
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
        }
    }

    /// The first free block of `stream` with size ≥ `size` (best fit), if any.
    #[inline]
    pub(crate) fn lower_bound(&self, stream: StreamId, size: usize) -> Option<(SizeKey, BlockId)> {
        self.blocks
            .range((stream, size, 0)..)
            .next()
            .filter(|((s, _, _), _)| *s == stream)
            .map(|(k, v)| (*k, *v))
    }
}
