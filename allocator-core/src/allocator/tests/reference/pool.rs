//! Best-fit pools of free blocks (PyTorch's `BlockPool`).
//!
//! PyTorch keeps one set ordered by `(stream, size, address)`. Here each stream
//! has its own map keyed by `size << 64 | address` (one `u128` compare instead of
//! three), and the streams are kept sorted, so iterating all streams in order is
//! the same `(stream, size, address)` order. A lower-bound lookup on `(size, 0)`
//! within the stream is best fit with ties broken by the lowest address.
//! `unmapped` holds the unmapped blocks of expandable segments in address order.

use super::block::BlockId;
use crate::device::{DevicePtr, StreamId};
use std::collections::BTreeMap;

/// Key of the address-ordered set.
pub(crate) type AddrKey = (StreamId, DevicePtr);

/// `size << 64 | ptr`: orders by size, then address.
#[inline]
fn key(size: usize, ptr: DevicePtr) -> u128 {
    ((size as u128) << 64) | u128::from(ptr)
}

#[inline]
fn unkey(k: u128) -> (usize, DevicePtr) {
    ((k >> 64) as usize, k as u64)
}

/// A free block as the pool stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub size: usize,
    pub ptr: DevicePtr,
    pub id: BlockId,
}

#[derive(Debug)]
pub(crate) struct BlockPool {
    /// Free mapped blocks per stream, streams in ascending order. A stream's map
    /// stays (possibly empty) once created, so its node is reused.
    streams: Vec<(StreamId, BTreeMap<u128, BlockId>)>,
    /// Number of blocks over all streams.
    len: usize,
    /// Unmapped expandable blocks, address order.
    pub unmapped: BTreeMap<AddrKey, BlockId>,
    /// GC clock: advanced by lookups while garbage collection is enabled.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub(crate) fn new() -> Self {
        BlockPool {
            streams: Vec::new(),
            len: 0,
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
        }
    }

    #[inline]
    fn map(&self, stream: StreamId) -> Option<&BTreeMap<u128, BlockId>> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    #[inline]
    fn map_mut(&mut self, stream: StreamId) -> &mut BTreeMap<u128, BlockId> {
        let i = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                let at = self.streams.partition_point(|(s, _)| *s < stream);
                self.streams.insert(at, (stream, BTreeMap::new()));
                at
            }
        };
        &mut self.streams[i].1
    }

    /// Adds a free block.
    #[inline]
    pub(crate) fn insert(&mut self, stream: StreamId, size: usize, ptr: DevicePtr, id: BlockId) {
        if self.map_mut(stream).insert(key(size, ptr), id).is_none() {
            self.len += 1;
        }
    }

    /// Removes a free block; returns its id if it was there.
    #[inline]
    pub(crate) fn remove(
        &mut self,
        stream: StreamId,
        size: usize,
        ptr: DevicePtr,
    ) -> Option<BlockId> {
        let removed = self.map_mut(stream).remove(&key(size, ptr));
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Every free block in `(stream, size, address)` order.
    pub(crate) fn ids(&self) -> Vec<BlockId> {
        self.streams
            .iter()
            .flat_map(|(_, m)| m.values().copied())
            .collect()
    }

    /// Free blocks of `stream` with size ≥ `size`, best fit first.
    #[inline]
    pub(crate) fn at_least(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = Entry> + '_ {
        self.map(stream).into_iter().flat_map(move |m| {
            m.range(key(size, 0)..).map(|(k, id)| {
                let (size, ptr) = unkey(*k);
                Entry { size, ptr, id: *id }
            })
        })
    }

    /// Free blocks of `stream` with size < `size`, largest first.
    pub(crate) fn below_descending(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = Entry> + '_ {
        self.map(stream).into_iter().flat_map(move |m| {
            m.range(..key(size, 0)).rev().map(|(k, id)| {
                let (size, ptr) = unkey(*k);
                Entry { size, ptr, id: *id }
            })
        })
    }
}
