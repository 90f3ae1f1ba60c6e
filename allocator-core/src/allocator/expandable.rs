//! Expandable segments (spec §6): one large virtual reservation per
//! (stream, pool), backed page by page with physical memory on demand, so
//! allocations tile contiguously and fully free pages can be returned anywhere.
//!
//! The reservation is represented as one block chain covering the whole range:
//! mapped parts are ordinary free or allocated blocks, unmapped parts are blocks
//! with `mapped == false` kept in the pool's `unmapped` set. Unmapped blocks
//! always start and end on page boundaries.

use super::block::{Block, BlockId, PoolKind};
use super::state::{Request, State};
use crate::device::{Device, DeviceError, DevicePtr, StreamId};
use crate::error::Error;
use crate::size::SMALL_BUFFER;
use crate::snapshot::TraceAction;
use crate::Result;

/// One virtual reservation.
#[derive(Debug, Clone)]
pub(crate) struct ExpandableSegment {
    /// Start of the reservation.
    pub base: DevicePtr,
    /// Bytes reserved (a whole number of pages).
    pub size: usize,
    /// Bytes per physical page.
    pub page: usize,
    /// Which pages are backed.
    pub mapped: Vec<bool>,
}

impl ExpandableSegment {
    fn page_index(&self, ptr: DevicePtr) -> usize {
        ((ptr - self.base) / self.page as u64) as usize
    }
    fn page_ptr(&self, index: usize) -> DevicePtr {
        self.base + (index * self.page) as u64
    }
}

fn vmm_missing() -> Error {
    Error::Internal("expandable segment on a device without virtual memory".into())
}

impl State {
    /// Maps enough pages at the lowest suitable address for `req` and returns a
    /// free mapped block of at least `req.size` bytes, out of the pool; `None`
    /// when the device has no memory (`try_allocate_expandable_block`).
    pub(crate) fn try_allocate_expandable_block<D: Device>(
        &mut self,
        dev: &mut D,
        req: &Request,
    ) -> Result<Option<BlockId>> {
        let size = req.size;
        let Some(mut c) = self.find_expandable_block(dev, req.stream, req.pool, size)? else {
            return Ok(None); // larger than a whole reservation: out of memory
        };
        // c heads a run of free/unmapped blocks with room for `size`:
        //   unmapped -> …   |   free -> unmapped -> …
        if !self.blocks[c].mapped {
            let want = self.blocks[c].size.min(size);
            match self.map_block(dev, c, want)? {
                Some(id) => c = id,
                None => return Ok(None),
            }
        }
        while self.blocks[c].size < size {
            let remaining = size - self.blocks[c].size;
            let Some(next) = self.blocks[c].next else {
                return Err(Error::Internal("expandable run ended early".into()));
            };
            let want = remaining.min(self.blocks[next].size);
            match self.map_block(dev, next, want)? {
                Some(id) => c = id,
                None => return Ok(None),
            }
        }
        self.remove_from_blocks(c);
        Ok(Some(c))
    }

    /// The lowest-address place on `stream` where consecutive allocatable blocks
    /// (free or unmapped) add up to `size`; a new reservation when none does;
    /// `None` when `size` exceeds a whole reservation (no device could serve it).
    fn find_expandable_block<D: Device>(
        &mut self,
        dev: &mut D,
        stream: StreamId,
        kind: PoolKind,
        size: usize,
    ) -> Result<Option<BlockId>> {
        let allocatable =
            |st: &State, b: Option<BlockId>| b.is_some_and(|b| st.blocks[b].is_free());
        let candidates: Vec<BlockId> = self
            .pool(kind)
            .unmapped
            .range((stream, 0)..)
            .take_while(|((s, _), _)| *s == stream)
            .map(|(_, id)| *id)
            .collect();
        for mut c in candidates {
            // A free mapped block just before the unmapped one can be used too.
            if let Some(p) = self.blocks[c].prev.filter(|&p| allocatable(self, Some(p))) {
                c = p;
            }
            let mut bytes = 0usize;
            let mut cur = Some(c);
            while bytes < size && allocatable(self, cur) {
                let Some(id) = cur else { break };
                bytes += self.blocks[id].size;
                cur = self.blocks[id].next;
            }
            if bytes >= size {
                return Ok(Some(c));
            }
        }
        // A new reservation: 1.125 x the device's memory, in whole pages.
        let page = if kind.is_small() {
            SMALL_BUFFER
        } else {
            self.config.large_segment_size
        };
        let total = self.device_total.max(page);
        let pages = total.saturating_add(total / 8).div_ceil(page);
        let Some(va_size) = pages.checked_mul(page).filter(|&va| va >= size) else {
            return Ok(None);
        };
        let vmm = dev.virtual_memory().ok_or_else(vmm_missing)?;
        let base = vmm.reserve(va_size).map_err(Error::Device)?;
        let segment = Some(ExpandableSegment {
            base,
            size: va_size,
            page,
            mapped: vec![false; pages],
        });
        // Reuse the slot of a released reservation, if any.
        let seg_index = match self.expandable.iter().position(Option::is_none) {
            Some(i) => {
                self.expandable[i] = segment;
                i
            }
            None => {
                self.expandable.push(segment);
                self.expandable.len() - 1
            }
        };
        let mut b = Block::new(base, va_size, stream, kind);
        b.mapped = false;
        b.expandable = Some(seg_u32(seg_index));
        let id = self.blocks.insert(b);
        self.insert_unmapped(id);
        Ok(Some(id))
    }

    /// Backs the first `size` bytes (rounded up to pages) of the unmapped block
    /// `id` with memory, merges it with free mapped neighbours and puts it in the
    /// pool. Returns the merged block, or `None` when the device is out of memory.
    fn map_block<D: Device>(
        &mut self,
        dev: &mut D,
        id: BlockId,
        size: usize,
    ) -> Result<Option<BlockId>> {
        let b = &self.blocks[id];
        debug_assert!(!b.mapped && size <= b.size && size > 0);
        let (ptr, bsize, stream, kind) = (b.ptr, b.size, b.stream, b.pool);
        let seg_index = b
            .expandable
            .map(|i| i as usize)
            .ok_or_else(|| Error::Internal("map_block of a plain block".into()))?;
        let seg = self.expandable[seg_index]
            .as_ref()
            .ok_or_else(|| Error::Internal("map_block in a released segment".into()))?;
        let (page, first) = (seg.page, seg.page_index(ptr));
        let count = size.div_ceil(page);
        let vmm = dev.virtual_memory().ok_or_else(vmm_missing)?;
        match vmm.map(ptr, count * page, page) {
            Ok(()) => {}
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(Error::Device(e)),
        }
        if let Some(seg) = self.expandable[seg_index].as_mut() {
            seg.mapped[first..first + count]
                .iter_mut()
                .for_each(|m| *m = true);
        }
        let mapped_size = count * page;
        self.remove_unmapped(id);
        self.blocks[id].mapped = true;
        if mapped_size < bsize {
            // id -> remaining (unmapped) -> id.next
            let mut rem = Block::new(ptr + mapped_size as u64, bsize - mapped_size, stream, kind);
            rem.mapped = false;
            rem.expandable = Some(seg_u32(seg_index));
            rem.prev = Some(id);
            rem.next = self.blocks[id].next;
            let rem_next = rem.next;
            let rem_id = self.blocks.insert(rem);
            if let Some(n) = rem_next {
                self.blocks[n].prev = Some(rem_id);
            }
            self.blocks[id].next = Some(rem_id);
            self.blocks[id].size = mapped_size;
            self.insert_unmapped(rem_id);
        }
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_blocks(id);
        let small = kind.is_small();
        self.total_allocated_memory += mapped_size;
        self.stats
            .reserved_bytes
            .increase(small, mapped_size as i64);
        self.stats.num_device_alloc += 1;
        self.record(TraceAction::SegmentMap, ptr, mapped_size, stream);
        Ok(Some(id))
    }

    /// Unmaps the pages lying wholly inside the free expandable block `id`; the
    /// partial pages at either end stay mapped as free blocks. Returns the block
    /// that now holds the unmapped range (or `id` unchanged when no page was whole).
    pub(crate) fn unmap_block<D: Device>(&mut self, dev: &mut D, id: BlockId) -> Result<BlockId> {
        let b = &self.blocks[id];
        let (ptr, size, stream, kind) = (b.ptr, b.size, b.stream, b.pool);
        let seg_index = b
            .expandable
            .map(|i| i as usize)
            .ok_or_else(|| Error::Internal("unmap_block of a plain block".into()))?;
        let seg = self.expandable[seg_index]
            .as_ref()
            .ok_or_else(|| Error::Internal("unmap_block in a released segment".into()))?;
        let page = seg.page;
        let begin = (ptr - seg.base).div_ceil(page as u64) as usize;
        let end = seg.page_index(ptr + size as u64);
        if begin >= end {
            return Ok(id);
        }
        let (uptr, usize_) = (seg.page_ptr(begin), (end - begin) * page);
        let vmm = dev.virtual_memory().ok_or_else(vmm_missing)?;
        vmm.unmap(uptr, usize_, page).map_err(Error::Device)?;
        if let Some(seg) = self.expandable[seg_index].as_mut() {
            seg.mapped[begin..end].iter_mut().for_each(|m| *m = false);
        }
        self.remove_from_blocks(id);
        let before = (uptr - ptr) as usize;
        if before > 0 {
            // prev -> before_free -> id
            let mut bf = Block::new(ptr, before, stream, kind);
            bf.expandable = Some(seg_u32(seg_index));
            bf.prev = self.blocks[id].prev;
            bf.next = Some(id);
            let bf_prev = bf.prev;
            let bf_id = self.blocks.insert(bf);
            if let Some(p) = bf_prev {
                self.blocks[p].next = Some(bf_id);
            }
            self.blocks[id].prev = Some(bf_id);
            self.insert_into_blocks(bf_id);
        }
        let after = size - before - usize_;
        if after > 0 {
            // id -> after_free -> next
            let mut af = Block::new(uptr + usize_ as u64, after, stream, kind);
            af.expandable = Some(seg_u32(seg_index));
            af.prev = Some(id);
            af.next = self.blocks[id].next;
            let af_next = af.next;
            let af_id = self.blocks.insert(af);
            if let Some(n) = af_next {
                self.blocks[n].prev = Some(af_id);
            }
            self.blocks[id].next = Some(af_id);
            self.insert_into_blocks(af_id);
        }
        let b = &mut self.blocks[id];
        b.ptr = uptr;
        b.size = usize_;
        b.mapped = false;
        let (prev, next) = (b.prev, b.next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_unmapped(id);
        let small = kind.is_small();
        self.total_allocated_memory -= usize_;
        self.stats.reserved_bytes.decrease(small, usize_ as i64);
        self.stats.num_device_free += 1;
        self.record(TraceAction::SegmentUnmap, uptr, usize_, stream);
        Ok(id)
    }

    /// Returns a reservation whose single block is wholly unmapped.
    pub(crate) fn release_expandable_segment<D: Device>(
        &mut self,
        dev: &mut D,
        id: BlockId,
    ) -> Result<()> {
        let b = &self.blocks[id];
        debug_assert!(!b.mapped && !b.is_split());
        let seg_index = b
            .expandable
            .map(|i| i as usize)
            .ok_or_else(|| Error::Internal("release of a plain block".into()))?;
        self.remove_unmapped(id);
        self.blocks.remove(id);
        let seg = self.expandable[seg_index]
            .take()
            .ok_or_else(|| Error::Internal("segment released twice".into()))?;
        let vmm = dev.virtual_memory().ok_or_else(vmm_missing)?;
        vmm.release(seg.base, seg.size).map_err(Error::Device)
    }
}

/// An expandable segment's index as a block stores it (4 bytes).
fn seg_u32(index: usize) -> u32 {
    u32::try_from(index).expect("fewer than 2^32 expandable segments")
}
