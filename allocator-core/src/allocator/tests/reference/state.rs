//! The allocator's bookkeeping, rule for rule from PyTorch's
//! `DeviceCachingAllocator` (spec §2–§4). Every method runs with the state lock
//! held; the device is passed in where a rule needs it.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Instant, SystemTime};

use super::block::{Block, BlockArena, BlockId, PoolKind};
use super::expandable::ExpandableSegment;
use super::pool::BlockPool;
use crate::allocator::{AdjacentFree, BlockInfo};
use crate::config::AllocatorConfig;
use crate::device::{Device, DeviceError, DevicePtr, EventId, StreamId};
use crate::error::{Error, OutOfMemoryError};
use crate::size::{allocation_size, round_size, MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::snapshot::{
    BlockSnapshot, BlockState, HistoryConfig, SegmentSnapshot, Snapshot, TraceAction, TraceEntry,
};
use crate::stats::DeviceStats;
use crate::Result;

/// A request after rounding: what is searched for and what a new segment costs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub stream: StreamId,
    /// The caller's size.
    pub orig: usize,
    /// Rounded size (searched for, allocated, counted).
    pub size: usize,
    pub pool: PoolKind,
    /// Size of a new (non-expandable) segment for this request.
    pub alloc_size: usize,
}

/// The trace ring buffer (`_record_memory_history`).
#[derive(Debug)]
pub(crate) struct TraceRecorder {
    config: Option<HistoryConfig>,
    entries: VecDeque<TraceEntry>,
    /// The monotonic clock at creation…
    start: Instant,
    /// …and the wall clock then, in microseconds since the Unix epoch.
    start_unix_us: u64,
}

impl TraceRecorder {
    pub(crate) fn configure(&mut self, config: Option<HistoryConfig>) -> Result<()> {
        if let Some(c) = &config {
            if c.max_entries == 0 {
                return Err(Error::InvalidArgument {
                    what: "HistoryConfig::max_entries",
                    value: "0".into(),
                    allowed: "an entry count >= 1",
                });
            }
        }
        if config.is_none() {
            self.entries.clear();
        }
        self.config = config;
        Ok(())
    }

    #[inline]
    fn record(&mut self, action: TraceAction, addr: u64, size: usize, stream: StreamId) {
        let Some(c) = &self.config else { return };
        if c.skip_actions.contains(&action) {
            return;
        }
        if self.entries.len() >= c.max_entries {
            self.entries.pop_front();
        }
        let elapsed = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        let time_us = self.start_unix_us.saturating_add(elapsed);
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
        });
    }
}

/// Per-device state guarded by the allocator's state mutex.
pub(crate) struct State {
    pub config: AllocatorConfig,
    pub blocks: BlockArena,
    pub small: BlockPool,
    pub large: BlockPool,
    pub stats: DeviceStats,
    /// Bytes reserved from the device over all pools (= `reserved_bytes.all.current`).
    pub total_allocated_memory: usize,
    /// The memory-fraction limit on reserved bytes.
    pub allowed_memory_maximum: Option<usize>,
    /// The fraction last set (1.0 = no limit), returned exactly by `memory_fraction`.
    pub memory_fraction: f64,
    /// Pending end-of-use events per stream, FIFO.
    pub events: BTreeMap<StreamId, VecDeque<(EventId, BlockId)>>,
    /// Expandable segments; `None` slots were released.
    pub expandable: Vec<Option<ExpandableSegment>>,
    pub trace: TraceRecorder,
    next_serial: u64,
    pub device_total: usize,
    pub device_kind: &'static str,
    pub device_index: usize,
    pub has_vmm: bool,
    /// `max_split_size` at construction: the threshold of the `oversize_*` stats
    /// (fixed like `stats.max_split_size`, so runtime setting changes keep the
    /// oversize counts consistent).
    pub oversize_threshold: usize,
}

impl State {
    pub(crate) fn new(
        config: AllocatorConfig,
        device_total: usize,
        device_kind: &'static str,
        device_index: usize,
        has_vmm: bool,
    ) -> State {
        let config_max_split = config.max_split_size;
        State {
            stats: DeviceStats::new(config.max_split_size),
            config,
            blocks: BlockArena::default(),
            small: BlockPool::new(),
            large: BlockPool::new(),
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            memory_fraction: 1.0,
            events: BTreeMap::new(),
            expandable: Vec::new(),
            trace: TraceRecorder {
                config: None,
                entries: VecDeque::new(),
                start: Instant::now(),
                // A clock set before 1970 reads as the epoch itself.
                start_unix_us: SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            },
            next_serial: 1,
            device_total,
            device_kind,
            device_index,
            has_vmm,
            oversize_threshold: config_max_split,
        }
    }

    // ----- small helpers ---------------------------------------------------------

    #[inline]
    pub(crate) fn pool_mut(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    #[inline]
    pub(crate) fn pool(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    pub(crate) fn expandable_active(&self) -> bool {
        self.config.expandable_segments && self.has_vmm
    }

    fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Puts a free mapped block into its pool's best-fit set, stamping its GC age.
    #[inline]
    pub(crate) fn insert_into_blocks(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (kind, stream, size, ptr) = (b.pool, b.stream, b.size, b.ptr);
        let pool = self.pool_mut(kind);
        let clock = pool.get_free_blocks_call_count;
        pool.insert(stream, size, ptr, id);
        self.blocks[id].gc_count_base = clock;
    }

    #[inline]
    pub(crate) fn remove_from_blocks(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (kind, stream, size, ptr) = (b.pool, b.stream, b.size, b.ptr);
        let removed = self.pool_mut(kind).remove(stream, size, ptr);
        debug_assert_eq!(removed, Some(id), "block {id:?} was not in its pool");
    }

    pub(crate) fn insert_unmapped(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (kind, key) = (b.pool, (b.stream, b.ptr));
        self.pool_mut(kind).unmapped.insert(key, id);
    }

    pub(crate) fn remove_unmapped(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (kind, key) = (b.pool, (b.stream, b.ptr));
        let removed = self.pool_mut(kind).unmapped.remove(&key);
        debug_assert_eq!(
            removed,
            Some(id),
            "block {id:?} was not in its unmapped set"
        );
    }

    #[inline]
    pub(crate) fn record(&mut self, action: TraceAction, addr: u64, size: usize, stream: StreamId) {
        self.trace.record(action, addr, size, stream);
    }

    pub(crate) fn request(&self, orig: usize, stream: StreamId) -> Request {
        let size = round_size(orig, &self.config);
        Request {
            stream,
            orig,
            size,
            pool: PoolKind::for_size(size),
            alloc_size: allocation_size(size, &self.config),
        }
    }

    // ----- events (spec §2.5) ----------------------------------------------------

    /// Returns blocks whose end-of-use events have all completed to their pools.
    #[inline]
    pub(crate) fn process_events<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        if self.events.is_empty() {
            return Ok(());
        }
        self.process_events_slow(dev)
    }

    #[cold]
    fn process_events_slow<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        let streams: Vec<StreamId> = self.events.keys().copied().collect();
        for s in streams {
            while let Some(&(event, block)) = self.events.get(&s).and_then(|q| q.front()) {
                if !dev.query_event(event).map_err(Error::Device)? {
                    break;
                }
                if let Some(q) = self.events.get_mut(&s) {
                    q.pop_front();
                }
                dev.destroy_event(event);
                self.event_done(block);
            }
            if self.events.get(&s).is_some_and(|q| q.is_empty()) {
                self.events.remove(&s);
            }
        }
        Ok(())
    }

    fn event_done(&mut self, block: BlockId) {
        let b = &mut self.blocks[block];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(block);
        }
    }

    /// Waits for every pending event and frees the blocks (`synchronize_and_free_events`).
    pub(crate) fn synchronize_and_free_events<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        self.stats.num_sync_all_streams += 1;
        let events = std::mem::take(&mut self.events);
        let mut first_err = None;
        for (_, q) in events {
            for (event, block) in q {
                if let Err(e) = dev.synchronize_event(event) {
                    first_err.get_or_insert(e);
                }
                dev.destroy_event(event);
                self.event_done(block);
            }
        }
        match first_err {
            Some(e) => Err(Error::Device(e)),
            None => Ok(()),
        }
    }

    /// Records an end-of-use event on every stream that used `id`. All or
    /// nothing: if the device fails, the events recorded so far are destroyed and
    /// the block is unchanged.
    pub(crate) fn record_use_events<D: Device>(
        &mut self,
        dev: &mut D,
        id: BlockId,
    ) -> Result<Vec<(StreamId, EventId)>> {
        let mut events = Vec::with_capacity(self.blocks[id].stream_uses.len());
        for &s in &self.blocks[id].stream_uses {
            match dev.record_event(s) {
                Ok(e) => events.push((s, e)),
                Err(err) => {
                    for (_, e) in events {
                        dev.destroy_event(e);
                    }
                    return Err(Error::Device(err));
                }
            }
        }
        Ok(events)
    }

    pub(crate) fn record_stream(&mut self, id: BlockId, stream: StreamId) {
        let b = &mut self.blocks[id];
        if stream != b.stream && !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
    }

    // ----- malloc (spec §3) ------------------------------------------------------

    /// Best fit from the request's pool, with the expandable and `max_split_size`
    /// rules (`get_free_block`, §3.1). Removes the block from the pool.
    pub(crate) fn get_free_block(&mut self, req: &Request) -> Option<BlockId> {
        let gc = self.gc_enabled();
        let expandable_active = self.expandable_active();
        let max_split = self.config.max_split_size;
        let max_non_split = self.config.max_non_split_rounding_size;
        let pool = self.pool_mut(req.pool);
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let pool = self.pool(req.pool);
        let mut it = pool.at_least(req.stream, req.size).map(|e| e.id).peekable();
        let mut id = it.next()?;
        if self.blocks[id].expandable.is_some() {
            if expandable_active {
                // Best fit counts the room an expandable block could grow into.
                let grow = |b: BlockId| {
                    let blk = &self.blocks[b];
                    blk.size
                        + blk.next.map_or(0, |n| {
                            if self.blocks[n].mapped {
                                0
                            } else {
                                self.blocks[n].size
                            }
                        })
                };
                while self.blocks[id].expandable.is_some() {
                    match it.peek() {
                        Some(&n) if grow(n) < grow(id) => {
                            id = n;
                            it.next();
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off at run time: skip their blocks.
                while self.blocks[id].expandable.is_some() {
                    id = it.next()?;
                }
            }
        }
        drop(it);
        let size = self.blocks[id].size;
        if req.size < max_split && size >= max_split {
            return None; // normal requests never take oversize blocks
        }
        if req.size >= max_split && size >= req.size.saturating_add(max_non_split) {
            return None; // oversize requests take only blocks < size + 20 MiB
        }
        self.remove_from_blocks(id);
        Some(id)
    }

    pub(crate) fn should_split(&self, id: BlockId, size: usize) -> bool {
        let b = &self.blocks[id];
        let remaining = b.size - size;
        if b.pool.is_small() || self.expandable_active() {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Hands out `id` (already out of its pool), splitting off the tail when
    /// `split`. Returns the allocated block and its serial (`alloc_found_block`, §3.8).
    pub(crate) fn alloc_found_block(
        &mut self,
        id: BlockId,
        req: &Request,
        split: bool,
    ) -> (BlockId, u64) {
        let size = req.size;
        let small = req.pool.is_small();
        let already_split = self.blocks[id].is_split();
        let not_expandable = self.blocks[id].expandable.is_none();
        let block = if split {
            // The original block becomes the tail; the allocation takes the low addresses.
            let rem = &self.blocks[id];
            let mut new = Block::new(rem.ptr, size, rem.stream, rem.pool);
            new.expandable = rem.expandable;
            new.prev = rem.prev;
            new.next = Some(id);
            let prev = rem.prev;
            let new_id = self.blocks.insert(new);
            if let Some(p) = prev {
                self.blocks[p].next = Some(new_id);
            }
            let rem = &mut self.blocks[id];
            rem.prev = Some(new_id);
            rem.ptr += size as u64;
            rem.size -= size;
            let rem_size = rem.size as i64;
            self.insert_into_blocks(id);
            if not_expandable {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(small, size as i64);
                } else {
                    self.stats.inactive_split_bytes.increase(small, rem_size);
                    self.stats.inactive_split.increase(small, 1);
                }
            }
            new_id
        } else {
            if already_split && not_expandable {
                let s = self.blocks[id].size as i64;
                self.stats.inactive_split_bytes.decrease(small, s);
                self.stats.inactive_split.decrease(small, 1);
            }
            id
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        let b = &mut self.blocks[block];
        b.allocated = true;
        b.requested = req.orig;
        b.serial = serial;
        let (bsize, ptr) = (b.size, b.ptr);
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, bsize as i64);
        st.active.increase(small, 1);
        st.active_bytes.increase(small, bsize as i64);
        st.requested_bytes.increase(small, req.orig as i64);
        if bsize >= self.oversize_threshold {
            st.oversize_allocations.increase(1);
        }
        self.record(TraceAction::Alloc, ptr, req.orig, req.stream);
        (block, serial)
    }

    /// True when a new segment of `alloc_size` would exceed the memory fraction.
    pub(crate) fn over_memory_fraction(&self, alloc_size: usize) -> bool {
        self.allowed_memory_maximum
            .is_some_and(|allowed| self.total_allocated_memory.saturating_add(alloc_size) > allowed)
    }

    /// Books the result of a device allocation of `req.alloc_size` as a fresh,
    /// unsplit segment (not put into the pool: it goes straight to the caller).
    /// Out of memory gives `Ok(None)`; any other device error propagates.
    #[cold]
    pub(crate) fn new_segment_block(
        &mut self,
        result: std::result::Result<DevicePtr, DeviceError>,
        req: &Request,
    ) -> Result<Option<BlockId>> {
        let ptr = match result {
            Ok(p) => p,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(Error::Device(e)),
        };
        let size = req.alloc_size;
        let small = req.pool.is_small();
        self.total_allocated_memory += size;
        let id = self
            .blocks
            .insert(Block::new(ptr, size, req.stream, req.pool));
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, size as i64);
        if size >= self.oversize_threshold {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.record(TraceAction::SegmentAlloc, ptr, size, req.stream);
        Ok(Some(id))
    }

    // ----- free and merge (spec §4.1–4.2) ----------------------------------------

    /// Marks `id` free for its caller (`free`, §4.1). With `events` (one per
    /// stream that used the block, from [`State::record_use_events`]) the block
    /// stays active until they complete; without, it returns to its pool now.
    pub(crate) fn free(&mut self, id: BlockId, events: Vec<(StreamId, EventId)>) {
        let b = &mut self.blocks[id];
        b.allocated = false;
        b.stream_uses.clear();
        b.event_count = events.len() as u32;
        let (size, small, requested, ptr, stream) =
            (b.size, b.pool.is_small(), b.requested, b.ptr, b.stream);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size as i64);
        if size >= self.oversize_threshold {
            self.stats.oversize_allocations.decrease(1);
        }
        self.record(TraceAction::FreeRequested, ptr, requested, stream);
        if events.is_empty() {
            self.free_block(id);
        }
        for (s, e) in events {
            self.events.entry(s).or_default().push_back((e, id));
        }
    }

    /// Returns a free block to its pool, merging it with free neighbours.
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        debug_assert!(b.is_free(), "free_block of a busy block {b:?}");
        let (orig_size, requested, small) = (b.size, b.requested, b.pool.is_small());
        let (prev, next, ptr, stream) = (b.prev, b.next, b.ptr, b.stream);
        self.record(TraceAction::FreeCompleted, ptr, requested, stream);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for cand in [prev, next] {
            let merged = self.try_merge_blocks(id, cand);
            if merged > 0 {
                net_blocks -= 1;
                net_bytes -= merged as i64;
            }
        }
        self.insert_into_blocks(id);
        let b = &self.blocks[id];
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        let not_expandable = b.expandable.is_none();
        let st = &mut self.stats;
        if not_expandable {
            st.inactive_split.add_signed(small, net_blocks);
            st.inactive_split_bytes.add_signed(small, net_bytes);
        }
        st.active.decrease(small, 1);
        st.active_bytes.decrease(small, orig_size as i64);
        st.requested_bytes.decrease(small, requested as i64);
    }

    /// Absorbs `src` into `dst` when `src` is free with the same mapping; `dst` must
    /// be out of every pool set. Returns the bytes absorbed (0 = no merge).
    pub(crate) fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> usize {
        let Some(src) = src else { return 0 };
        let s = &self.blocks[src];
        if !s.is_free() || s.mapped != self.blocks[dst].mapped {
            return 0;
        }
        if s.mapped {
            self.remove_from_blocks(src);
        } else {
            self.remove_unmapped(src);
        }
        let s = self.blocks.remove(src);
        let d_prev = self.blocks[dst].prev;
        if d_prev == Some(src) {
            let d = &mut self.blocks[dst];
            d.ptr = s.ptr;
            d.prev = s.prev;
            d.size += s.size;
            if let Some(p) = s.prev {
                self.blocks[p].next = Some(dst);
            }
        } else {
            let d = &mut self.blocks[dst];
            d.next = s.next;
            d.size += s.size;
            if let Some(n) = s.next {
                self.blocks[n].prev = Some(dst);
            }
        }
        s.size
    }

    /// Free bytes just below and above an allocated block: two neighbour reads.
    #[inline]
    pub(crate) fn adjacent_free(&self, id: BlockId) -> AdjacentFree {
        let b = &self.blocks[id];
        let side = |n: Option<BlockId>| {
            n.map_or(0, |n| {
                let nb = &self.blocks[n];
                if nb.mapped && nb.is_free() {
                    nb.size
                } else {
                    0
                }
            })
        };
        AdjacentFree {
            left: side(b.prev),
            right: side(b.next),
        }
    }

    // ----- release (spec §3.5, §3.6, §4.3) -------------------------------------

    /// Returns a whole, unsplit, free, non-expandable segment to the device.
    fn release_block<D: Device>(&mut self, dev: &mut D, id: BlockId) -> Result<()> {
        let b = &self.blocks[id];
        debug_assert!(!b.is_split() && b.expandable.is_none() && b.is_free());
        let (ptr, size, small, stream) = (b.ptr, b.size, b.pool.is_small(), b.stream);
        // The device first: if it refuses, the segment stays cached and counted.
        dev.free(ptr, size).map_err(Error::Device)?;
        self.remove_from_blocks(id);
        self.blocks.remove(id);
        self.stats.num_device_free += 1;
        self.record(TraceAction::SegmentFree, ptr, size, stream);
        self.total_allocated_memory -= size;
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, size as i64);
        if size >= self.oversize_threshold {
            self.stats.oversize_segments.decrease(1);
        }
        Ok(())
    }

    /// Frees only enough cached oversize blocks for `req` (§3.5). Blocks released
    /// before a failure stay released, as in PyTorch.
    pub(crate) fn release_available_cached_blocks<D: Device>(
        &mut self,
        dev: &mut D,
        req: &Request,
    ) -> Result<bool> {
        let max_split = self.config.max_split_size;
        if max_split == usize::MAX {
            return Ok(false);
        }
        let key = req.size.max(max_split);
        let pool = self.pool(req.pool);
        let single = pool.at_least(req.stream, key).next().map(|e| e.id);
        // Only whole segments may go back to the device; with expandable segments
        // on, ordinary large segments can be split, so split blocks are skipped.
        let releasable = |st: &State, id: BlockId| {
            let b = &st.blocks[id];
            b.expandable.is_none() && !b.is_split()
        };
        if let Some(id) = single.filter(|&id| releasable(self, id)) {
            self.release_block(dev, id)?;
            return Ok(true);
        }
        let candidates: Vec<BlockId> = pool
            .below_descending(req.stream, key)
            .take_while(|e| e.size >= max_split)
            .map(|e| e.id)
            .collect();
        let mut released = 0usize;
        for id in candidates {
            if released >= key {
                break;
            }
            if releasable(self, id) {
                released += self.blocks[id].size;
                self.release_block(dev, id)?;
            }
        }
        Ok(released >= key)
    }

    /// Waits for pending events, then returns every wholly free segment
    /// (`release_cached_blocks`, also `empty_cache`).
    pub(crate) fn release_cached_blocks<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        self.synchronize_and_free_events(dev)?;
        self.release_blocks(dev, PoolKind::Large)?;
        self.release_blocks(dev, PoolKind::Small)
    }

    fn release_blocks<D: Device>(&mut self, dev: &mut D, kind: PoolKind) -> Result<()> {
        let free: Vec<BlockId> = self.pool(kind).ids();
        let mut expandable = Vec::new();
        for id in free {
            let b = &self.blocks[id];
            if b.expandable.is_some() {
                expandable.push(id);
            } else if !b.is_split() {
                self.release_block(dev, id)?;
            }
        }
        for id in expandable {
            let id = self.unmap_block(dev, id)?;
            let b = &self.blocks[id];
            if !b.mapped && !b.is_split() {
                self.release_expandable_segment(dev, id)?;
            }
        }
        Ok(())
    }

    /// Age-based release of cached large blocks while reserved memory is above
    /// `garbage_collection_threshold` of the fraction limit (§3.3).
    pub(crate) fn garbage_collect_cached_blocks<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        let Some(allowed) = self.allowed_memory_maximum else {
            return Ok(());
        };
        if self.config.garbage_collection_threshold <= 0.0 {
            return Ok(());
        }
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let clock = self.large.get_free_blocks_call_count;
        let age = |b: &Block| (clock - b.gc_count_base) as f64;
        let eligible = |b: &Block| !b.is_split() && b.expandable.is_none();
        let mut total_age = 0.0;
        let mut count = 0usize;
        for id in self.large.ids() {
            let b = &self.blocks[id];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let mut reclaimed = 0usize;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let age_threshold = total_age / count as f64;
            freed_any = false;
            let ids: Vec<BlockId> = self.large.ids();
            for id in ids {
                let b = &self.blocks[id];
                if eligible(b) && age(b) >= age_threshold {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    count -= 1;
                    self.release_block(dev, id)?;
                }
            }
        }
        Ok(())
    }

    // ----- memory fraction (spec §5.3) -------------------------------------------

    pub(crate) fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(Error::InvalidFraction { value: fraction });
        }
        self.allowed_memory_maximum = if fraction < 1.0 {
            Some((fraction * self.device_total as f64) as usize)
        } else {
            None
        };
        self.memory_fraction = fraction;
        Ok(())
    }

    pub(crate) fn memory_fraction(&self) -> f64 {
        self.memory_fraction
    }

    // ----- OOM (spec §3.9) -------------------------------------------------------

    #[cold]
    pub(crate) fn out_of_memory_error<D: Device>(
        &mut self,
        dev: &mut D,
        req: &Request,
    ) -> Result<OutOfMemoryError> {
        self.stats.num_ooms += 1;
        let info = dev.mem_info().map_err(Error::Device)?;
        self.record(TraceAction::Oom, info.free as u64, req.size, req.stream);
        Ok(OutOfMemoryError {
            device_kind: self.device_kind,
            device_index: self.device_index,
            requested: req.orig,
            rounded: req.size,
            alloc_size: req.alloc_size,
            total_capacity: info.total,
            device_free: info.free,
            allowed: self.allowed_memory_maximum,
            allocated: self.stats.allocated_bytes.all.current as usize,
            reserved: self.stats.reserved_bytes.all.current as usize,
            max_split_size: self.config.max_split_size,
            expandable_segments: self.expandable_active(),
        })
    }

    // ----- views: snapshot, block list -------------------------------------------

    fn block_state(b: &Block) -> BlockState {
        if !b.mapped {
            BlockState::Unmapped
        } else if b.allocated {
            BlockState::ActiveAllocated
        } else if !b.is_free() {
            BlockState::ActivePendingFree
        } else {
            BlockState::Inactive
        }
    }

    /// Heads of every segment in address order: a block with no (mapped) `prev`.
    /// For expandable segments each maximal mapped run is one segment.
    pub(crate) fn segment_heads(&self, include_unmapped: bool) -> Vec<BlockId> {
        let mut heads: Vec<(DevicePtr, BlockId)> = self
            .blocks
            .iter()
            .filter(|(_, b)| {
                (include_unmapped || b.mapped)
                    && match b.prev {
                        None => true,
                        Some(p) => !include_unmapped && !self.blocks[p].mapped,
                    }
            })
            .map(|(id, b)| (b.ptr, id))
            .collect();
        heads.sort_unstable();
        heads.into_iter().map(|(_, id)| id).collect()
    }

    pub(crate) fn snapshot(&mut self) -> Snapshot {
        self.record(TraceAction::Snapshot, 0, 0, StreamId::DEFAULT);
        let mut segments = Vec::new();
        for head in self.segment_heads(false) {
            let h = &self.blocks[head];
            let mut seg = SegmentSnapshot {
                device: self.device_index,
                address: h.ptr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: h.stream,
                segment_type: if h.pool.is_small() { "small" } else { "large" },
                is_expandable: h.expandable.is_some(),
                blocks: Vec::new(),
            };
            let mut cur = Some(head);
            while let Some(id) = cur {
                let b = &self.blocks[id];
                if !b.mapped {
                    break;
                }
                let state = Self::block_state(b);
                seg.total_size += b.size;
                if b.allocated {
                    seg.allocated_size += b.size;
                }
                if state != BlockState::Inactive {
                    seg.active_size += b.size;
                    seg.requested_size += b.requested;
                }
                seg.blocks.push(BlockSnapshot {
                    address: b.ptr,
                    size: b.size,
                    requested_size: b.requested,
                    state,
                });
                cur = b.next;
            }
            segments.push(seg);
        }
        Snapshot {
            segments,
            device_traces: self.trace.entries.iter().cloned().collect(),
            allocator_settings: self.config.effective_settings(),
        }
    }

    pub(crate) fn block_infos(&self) -> Vec<BlockInfo> {
        let mut out = Vec::with_capacity(self.blocks.live());
        for (seg, head) in self.segment_heads(true).into_iter().enumerate() {
            let mut cur = Some(head);
            while let Some(id) = cur {
                let b = &self.blocks[id];
                out.push(BlockInfo {
                    ptr: b.ptr,
                    size: b.size,
                    allocated: b.allocated,
                    segment: seg,
                    requested: b.requested,
                    state: Self::block_state(b),
                });
                cur = b.next;
            }
        }
        out
    }
}
