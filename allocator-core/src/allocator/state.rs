//! The allocator's bookkeeping, rule for rule from PyTorch's
//! `DeviceCachingAllocator` (spec §2–§4). Every method runs with the state lock
//! held; the device is passed in where a rule needs it.

use std::collections::{BTreeMap, VecDeque};
use std::num::NonZeroU64;
use std::time::{Instant, SystemTime};

use super::block::{Block, BlockArena, BlockId, PoolKind};
use super::expandable::ExpandableSegment;
use super::pool::{bin_of, BlockPool, Slot};
use super::AdjacentFree;
use crate::config::AllocatorConfig;
use crate::device::{Device, DeviceError, DevicePtr, EventId, StreamId};
use crate::error::Error;
use crate::size::{allocation_size, round_size, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use crate::snapshot::{HistoryConfig, TraceAction, TraceEntry};
use crate::stats::Counters;
use crate::Result;

/// Blocks a fresh allocator has room for before its slab first reallocates
/// (80 bytes each, 80 KiB in all; pages not yet used are not touched): a
/// workload's first segments split into this many blocks without copying the
/// slab.
const INITIAL_BLOCK_CAPACITY: usize = 1024;

/// Bins a fresh allocator makes for its default stream in the small pool:
/// every size up to a whole 2 MiB segment (a free block merged back to its
/// segment's size; larger small-pool blocks exist only in expandable
/// segments; 48 bytes each, 12 KiB).
const SMALL_POOL_BINS: usize = bin_of(SMALL_BUFFER) + 1;
/// The least made in the large pool: the sizes below 1 GiB (26 KiB).
const LARGE_POOL_BINS: usize = bin_of(1 << 30);

/// Bins made for the large pool's default stream on a device of `total`
/// bytes: every size up to the device's memory where that is above 1 GiB
/// (80 GiB: 35 KiB), so that no block the device can back grows the bins.
fn large_pool_bins(total: usize) -> usize {
    LARGE_POOL_BINS.max(bin_of(total) + 1)
}

/// True when `config` rounds every request to a multiple of 512 B only (no
/// `roundup_power2_divisions` band above 1).
fn plain_rounding(config: &AllocatorConfig) -> bool {
    config.roundup_power2_divisions.iter().all(|&d| d <= 1)
}

/// A request after rounding: what is searched for and what a new segment costs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub stream: StreamId,
    /// The caller's size.
    pub orig: usize,
    /// Rounded size (searched for, allocated, counted).
    pub size: usize,
    pub pool: PoolKind,
    /// Size of a new (non-expandable) segment for this request: 0 until a miss
    /// needs it ([`Request::with_alloc_size`], first thing in the miss path,
    /// under the same lock as the lookup).
    pub alloc_size: usize,
}

/// A block chosen for a request, and where its pool entry still lies (`None`:
/// already out of its pool, or never in it, as a new segment). Keeping the
/// entry lets a split re-key it in place for the remainder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    pub id: BlockId,
    pub slot: Option<Slot>,
}

impl From<BlockId> for Found {
    fn from(id: BlockId) -> Found {
        Found { id, slot: None }
    }
}

impl Request {
    /// The request with its new-segment size, under `config`.
    pub(crate) fn with_alloc_size(self, config: &AllocatorConfig) -> Request {
        Request {
            alloc_size: allocation_size(self.size, config),
            ..self
        }
    }
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

    /// The recorded entries, oldest first.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter()
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
    pub stats: Counters,
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
    next_serial: NonZeroU64,
    pub device_total: usize,
    pub device_kind: &'static str,
    pub device_index: usize,
    pub has_vmm: bool,
    /// `config` has no power-of-two rounding: requests round to 512 B steps
    /// without the table lookup. Kept by [`State::set_config`].
    plain_rounding: bool,
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
        let mut stats = Counters::new(config.max_split_size);
        stats.mirror_active();
        State {
            stats,
            plain_rounding: plain_rounding(&config),
            config,
            blocks: BlockArena::with_capacity(INITIAL_BLOCK_CAPACITY),
            small: BlockPool::with_stream(StreamId::DEFAULT, SMALL_POOL_BINS),
            large: BlockPool::with_stream(StreamId::DEFAULT, large_pool_bins(device_total)),
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
            next_serial: NonZeroU64::MIN,
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

    /// Replaces the settings (`set_settings`), keeping what is derived from them.
    pub(crate) fn set_config(&mut self, config: AllocatorConfig) {
        self.plain_rounding = plain_rounding(&config);
        self.config = config;
    }

    #[inline(always)]
    pub(crate) fn request(&self, orig: usize, stream: StreamId) -> Request {
        debug_assert_eq!(self.plain_rounding, plain_rounding(&self.config));
        let size = if self.plain_rounding {
            // `round_size` with no power-of-two divisions (PyTorch's default).
            orig.max(1).div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
        } else {
            round_size(orig, &self.config)
        };
        Request {
            stream,
            orig,
            size,
            pool: PoolKind::for_size(size),
            alloc_size: 0,
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
        for &s in self.blocks[id].stream_uses.iter() {
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
    /// rules (`get_free_block`, §3.1). The block leaves the pool in
    /// [`State::alloc_found_block`] (the common case: its entry is where `slot`
    /// says) or has already left it (`slot` is `None`).
    #[inline(always)]
    pub(crate) fn get_free_block(&mut self, req: &Request) -> Option<Found> {
        if self.gc_enabled() {
            self.pool_mut(req.pool).get_free_blocks_call_count += 1;
        }
        let (first, slot) = self.pool(req.pool).best_fit(req.stream, req.size)?;
        if self.blocks[first.id].expandable.is_some() {
            return self.get_free_expandable_block(req).map(Found::from);
        }
        // The common case: the best fit itself, removed (or re-keyed) where it
        // was found.
        if !self.acceptable(req, first.size) {
            return None;
        }
        Some(Found {
            id: first.id,
            slot: Some(slot),
        })
    }

    /// The `max_split_size` rule: may a block of `size` serve `req`?
    #[inline(always)]
    fn acceptable(&self, req: &Request, size: usize) -> bool {
        let max_split = self.config.max_split_size;
        if req.size < max_split {
            size < max_split // normal requests never take oversize blocks
        } else {
            // oversize requests take only blocks < size + 20 MiB (by default)
            size < req
                .size
                .saturating_add(self.config.max_non_split_rounding_size)
        }
    }

    /// [`State::get_free_block`] when the best fit is a block of an expandable
    /// segment: the choice among expandable blocks, removed from the pool.
    #[cold]
    fn get_free_expandable_block(&mut self, req: &Request) -> Option<BlockId> {
        let expandable_active = self.expandable_active();
        let pool = self.pool(req.pool);
        let mut it = pool.at_least(req.stream, req.size).map(|e| e.id).peekable();
        let mut id = it.next()?;
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
        drop(it);
        if !self.acceptable(req, self.blocks[id].size) {
            return None;
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

    /// Hands out the found block, taking it out of its pool, splitting off the
    /// tail when `split`. Returns the allocated block and its serial
    /// (`alloc_found_block`, §3.8).
    #[inline(always)]
    pub(crate) fn alloc_found_block(
        &mut self,
        found: Found,
        req: &Request,
        split: bool,
    ) -> (BlockId, NonZeroU64) {
        let Found { id, slot } = found;
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
            let (rem_kind, rem_ptr, rem_size) = (rem.pool, rem.ptr, rem.size);
            // The remainder's pool entry is the found block's, re-keyed in
            // place when it keeps its bin and order (else removed, reinserted).
            match slot {
                Some(slot) if self.pool_mut(rem_kind).rekey(slot, rem_size, rem_ptr, id) => {
                    self.blocks[id].gc_count_base = self.pool(rem_kind).get_free_blocks_call_count;
                }
                Some(slot) => {
                    self.pool_mut(rem_kind).remove_slot(slot);
                    self.insert_into_blocks(id);
                }
                None => self.insert_into_blocks(id),
            }
            let rem_size = rem_size as i64;
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
            if let Some(slot) = slot {
                let kind = self.blocks[id].pool;
                self.pool_mut(kind).remove_slot(slot);
            }
            if already_split && not_expandable {
                let s = self.blocks[id].size as i64;
                self.stats.inactive_split_bytes.decrease(small, s);
                self.stats.inactive_split.decrease(small, 1);
            }
            id
        };
        let serial = self.next_serial;
        // Unique until 2^64 − 1 allocations (then it saturates).
        self.next_serial = serial.saturating_add(1);
        let b = &mut self.blocks[block];
        b.allocated = true;
        b.requested = req.orig;
        b.serial = serial.get();
        let (bsize, ptr) = (b.size, b.ptr);
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, bsize as i64);
        st.increase_active(small, bsize as i64);
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
        if events.is_empty() {
            return self.free_now(id);
        }
        // The block stays active, no longer allocated: the two part here.
        self.stats.unmirror_active();
        self.release_for_caller(id, events.len() as u32);
        for (s, e) in events {
            self.events.entry(s).or_default().push_back((e, id));
        }
    }

    /// [`State::free`] of a block no other stream used: back to its pool now.
    #[inline(always)]
    pub(crate) fn free_now(&mut self, id: BlockId) {
        self.release_for_caller(id, 0);
        self.free_block(id);
    }

    /// The caller's part of a free: not allocated any more, `event_count`
    /// events to wait for.
    #[inline(always)]
    fn release_for_caller(&mut self, id: BlockId, event_count: u32) {
        let b = &mut self.blocks[id];
        b.allocated = false;
        b.serial = 0;
        b.stream_uses.clear();
        b.event_count = event_count;
        let (size, small, requested, ptr, stream) =
            (b.size, b.pool.is_small(), b.requested, b.ptr, b.stream);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size as i64);
        if size >= self.oversize_threshold {
            self.stats.oversize_allocations.decrease(1);
        }
        self.record(TraceAction::FreeRequested, ptr, requested, stream);
    }

    /// Returns a free block to its pool, merging it with free neighbours.
    #[inline]
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        debug_assert!(b.is_free(), "free_block of a busy block {b:?}");
        let (orig_size, requested, small) = (b.size, b.requested, b.pool.is_small());
        let (prev, next, ptr, stream) = (b.prev, b.next, b.ptr, b.stream);
        self.record(TraceAction::FreeCompleted, ptr, requested, stream);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        // The pool entry of the last mapped neighbour merged in, kept to be
        // re-keyed in place for the merged block.
        let mut held: Option<Slot> = None;
        for cand in [prev, next] {
            let merged = self.merge_keeping_entry(id, cand, &mut held);
            if merged > 0 {
                net_blocks -= 1;
                net_bytes -= merged as i64;
            }
        }
        let b = &self.blocks[id];
        let (kind, size, ptr) = (b.pool, b.size, b.ptr);
        match held {
            Some(slot) if self.pool_mut(kind).rekey(slot, size, ptr, id) => {
                self.blocks[id].gc_count_base = self.pool(kind).get_free_blocks_call_count;
            }
            Some(slot) => {
                self.pool_mut(kind).remove_slot(slot);
                self.insert_into_blocks(id);
            }
            None => self.insert_into_blocks(id),
        }
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
        st.decrease_active(small, orig_size as i64);
        st.requested_bytes.decrease(small, requested as i64);
    }

    /// [`State::try_merge_blocks`] for [`State::free_block`]: a mapped `src`'s
    /// pool entry is not removed but kept in `held` (the one held before, if
    /// any, is removed first), for the caller to re-key or remove.
    #[inline]
    fn merge_keeping_entry(
        &mut self,
        dst: BlockId,
        src: Option<BlockId>,
        held: &mut Option<Slot>,
    ) -> usize {
        let Some(src) = src else { return 0 };
        let s = &self.blocks[src];
        if !s.is_free() || s.mapped != self.blocks[dst].mapped {
            return 0;
        }
        if !s.mapped {
            return self.try_merge_blocks(dst, Some(src));
        }
        let (kind, stream, s_ptr, s_size, s_prev, s_next) =
            (s.pool, s.stream, s.ptr, s.size, s.prev, s.next);
        let pool = self.pool_mut(kind);
        if let Some(h) = held.take() {
            pool.remove_slot(h);
        }
        *held = pool.find(stream, s_size, s_ptr);
        debug_assert!(held.is_some(), "block {src:?} was not in its pool");
        self.blocks.remove(src);
        self.splice_absorbed(dst, src, s_ptr, s_size, s_prev, s_next);
        s_size
    }

    /// Absorbs `src` into `dst` when `src` is free with the same mapping; `dst` must
    /// be out of every pool set. Returns the bytes absorbed (0 = no merge).
    pub(crate) fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> usize {
        let Some(src) = src else { return 0 };
        let s = &self.blocks[src];
        if !s.is_free() || s.mapped != self.blocks[dst].mapped {
            return 0;
        }
        let (s_ptr, s_size, s_prev, s_next) = (s.ptr, s.size, s.prev, s.next);
        if s.mapped {
            self.remove_from_blocks(src);
        } else {
            self.remove_unmapped(src);
        }
        self.blocks.remove(src);
        self.splice_absorbed(dst, src, s_ptr, s_size, s_prev, s_next);
        s_size
    }

    /// Relinks `dst` over the removed neighbour `src` (its former `ptr`, `size`,
    /// `prev` and `next`): `dst` grows by `s_size` and takes `src`'s place in
    /// the segment's address-ordered list.
    #[inline]
    fn splice_absorbed(
        &mut self,
        dst: BlockId,
        src: BlockId,
        s_ptr: DevicePtr,
        s_size: usize,
        s_prev: Option<BlockId>,
        s_next: Option<BlockId>,
    ) {
        let d = &mut self.blocks[dst];
        d.size += s_size;
        if d.prev == Some(src) {
            d.ptr = s_ptr;
            d.prev = s_prev;
            if let Some(p) = s_prev {
                self.blocks[p].next = Some(dst);
            }
        } else {
            d.next = s_next;
            if let Some(n) = s_next {
                self.blocks[n].prev = Some(dst);
            }
        }
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
}
