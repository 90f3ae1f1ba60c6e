//! [`CachingHostAllocator`]: PyTorch's `CachingHostAllocator` (pinned host
//! memory for asynchronous copies between host and device) over a pluggable
//! [`HostProvider`].
//!
//! The rules, as in PyTorch (`aten/src/ATen/core/CachingHostAllocator.h`):
//! - a request is rounded up to a power of two, and served from the free list
//!   of that size (last freed, first reused), else by a new provider
//!   allocation of exactly that size. Blocks are never split or merged;
//! - [`CachingHostAllocator::record_event`] notes a stream that uses a block
//!   (an asynchronous copy from or to it). Freeing such a block records one
//!   event per stream; the block enters its free list only once all of them
//!   have completed. Events are polled, oldest first and up to the first that
//!   is not complete, at every allocation and by
//!   [`CachingHostAllocator::empty_cache`];
//! - [`CachingHostAllocator::empty_cache`] returns every cached free block to
//!   the provider;
//! - [`HostStats`] has PyTorch's fields and keys.
//!
//! remat adds a **host budget** ([`HostAllocatorOptions::budget`]): the
//! page-locked bytes held from the provider never exceed it. A request that
//! would pass it first returns the cached free blocks to the provider, then
//! fails with [`Error::HostBudgetExceeded`], naming the budget and the request.
//!
//! The `pinned_*` keys of [`AllocatorConfig`] take effect through
//! [`HostAllocatorOptions::from_config`]: `pinned_use_cuda_host_register`
//! ([`PinMode::HostRegister`]), `pinned_num_register_threads` (the threads that
//! pre-fault the pages before registering) and `pinned_reserve_segment_size_mb`
//! (one segment allocated at the first request; blocks that fit are carved
//! from it, rounded to 4 KiB, and are never returned to the provider). See
//! `docs/host-allocator.md` for what is not implemented.
//!
//! ```
//! use remat_alloc::host::{AlignedHostProvider, CachingHostAllocator, HostAllocatorOptions};
//! use remat_alloc::StreamId;
//!
//! # fn main() -> Result<(), remat_alloc::Error> {
//! let host = CachingHostAllocator::new(
//!     AlignedHostProvider::new(),
//!     HostAllocatorOptions::default().with_budget(64 << 20),
//! )?;
//! let block = host.allocate(3000)?; // a 4096-byte block
//! host.write_bytes(&block, 0, b"swapped out")?;
//! host.record_event(&block, StreamId(1))?; // a copy on stream 1 reads it
//! host.free(block)?; // reused once stream 1's event completes
//! assert_eq!(host.stats().allocated_bytes.current, 4096);
//! host.empty_cache()?;
//! assert_eq!(host.stats().allocated_bytes.current, 0);
//! # Ok(()) }
//! ```

mod provider;
mod stats;

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(test)]
mod tests;

pub use provider::{AlignedHostProvider, HostProvider, HostPtr, PinMode, HOST_PAGE};
pub use stats::{DurationStat, HostStats};

#[cfg(feature = "cuda")]
pub use cuda::CudaHostProvider;

use crate::config::{AllocatorConfig, MAX_PINNED_REGISTER_THREADS};
use crate::device::{DeviceError, EventId, StreamId};
use crate::error::Error;
use crate::sync::{self, Mutex};
use crate::Result;
use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU64;
use std::time::Instant;

/// Requests of this many bytes or more are refused at once (as the device
/// allocator refuses 1 EiB).
const MAX_REQUEST: usize = 1 << 60;

/// One free list per power of two up to 2^63.
const SIZE_CLASSES: usize = 64;

/// Blocks carved from the reserve segment are rounded to this (PyTorch's
/// `PinnedReserveSegment::allocate`).
const RESERVE_ROUND: usize = 4096;

/// The host allocator's settings. Built from the `pinned_*` keys with
/// [`HostAllocatorOptions::from_config`], or by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAllocatorOptions {
    /// `pinned_use_cuda_host_register`: pin new memory by `malloc` +
    /// `cuMemHostRegister` instead of `cuMemHostAlloc`.
    pub use_host_register: bool,
    /// `pinned_num_register_threads`: threads that pre-fault the pages of a
    /// registered allocation; a power of two ≤ 128.
    pub num_register_threads: usize,
    /// `pinned_reserve_segment_size_mb` in bytes; 0 = no reserve segment.
    pub reserve_segment_size: usize,
    /// Most page-locked bytes held from the provider at once (the reserve
    /// segment included); `None` = no limit.
    pub budget: Option<usize>,
}

impl Default for HostAllocatorOptions {
    /// PyTorch's defaults (`cuMemHostAlloc`, one thread, no reserve), no budget.
    fn default() -> Self {
        HostAllocatorOptions {
            use_host_register: false,
            num_register_threads: 1,
            reserve_segment_size: 0,
            budget: None,
        }
    }
}

impl HostAllocatorOptions {
    /// The `pinned_*` settings of `config`, no budget.
    pub fn from_config(config: &AllocatorConfig) -> Self {
        HostAllocatorOptions {
            use_host_register: config.pinned_use_host_register,
            num_register_threads: config.pinned_num_register_threads,
            reserve_segment_size: config
                .pinned_reserve_segment_size_mb
                .saturating_mul(1 << 20),
            budget: None,
        }
    }

    /// Sets the host budget, in bytes.
    pub fn with_budget(mut self, bytes: usize) -> Self {
        self.budget = Some(bytes);
        self
    }

    /// Checks the thread count (a power of two ≤ 128).
    fn validate(&self) -> Result<()> {
        let t = self.num_register_threads;
        if !t.is_power_of_two() || t > MAX_PINNED_REGISTER_THREADS {
            return Err(Error::InvalidArgument {
                what: "num_register_threads",
                value: t.to_string(),
                allowed: "a power of two <= 128",
            });
        }
        Ok(())
    }

    fn pin_mode(&self) -> PinMode {
        if self.use_host_register {
            PinMode::HostRegister {
                threads: self.num_register_threads,
            }
        } else {
            PinMode::HostAlloc
        }
    }
}

/// A live host block. The handle records the allocator that issued it and the
/// allocation's serial number, so freeing it twice, or through another
/// allocator, is a typed error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostBlock {
    ptr: HostPtr,
    size: usize,
    requested: usize,
    serial: NonZeroU64,
    owner: u32,
}

impl HostBlock {
    /// Start address (page aligned, unless carved from the reserve segment:
    /// then 4 KiB aligned relative to it).
    pub fn ptr(&self) -> HostPtr {
        self.ptr
    }
    /// Bytes the block covers: the request rounded up to a power of two.
    pub fn size(&self) -> usize {
        self.size
    }
    /// Bytes the caller asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }
}

/// What the allocator knows of one block.
#[derive(Debug)]
struct BlockState {
    /// Power of two.
    size: usize,
    /// The serial of the live allocation; 0 while not allocated.
    serial: u64,
    /// Streams recorded on the live allocation, each once.
    streams: Vec<StreamId>,
    /// Events recorded at its free that have not completed yet.
    event_count: usize,
    /// Carved from the reserve segment: never returned to the provider.
    reserved_segment: bool,
}

/// The reserve segment (`pinned_reserve_segment_size_mb`): a bump allocator
/// over one provider allocation that is never freed.
#[derive(Debug)]
struct Reserve {
    base: HostPtr,
    size: usize,
    /// Bytes carved so far.
    used: usize,
}

/// Everything behind the mutex.
struct State<P: HostProvider> {
    provider: P,
    options: HostAllocatorOptions,
    blocks: HashMap<HostPtr, BlockState>,
    /// `free_lists[log2(size)]`: cached free blocks, reused last in first out.
    free_lists: Vec<Vec<HostPtr>>,
    /// Events of freed blocks: new ones at the front, polled from the back.
    events: VecDeque<(EventId, HostPtr)>,
    /// `None` until the first request when a reserve size is set.
    reserve: Option<Reserve>,
    /// Page-locked bytes held from the provider (reserve included).
    pinned: usize,
    stats: HostStats,
    next_serial: u64,
}

/// PyTorch's pinned host caching allocator. See the [module doc](self).
///
/// `Send + Sync` when `P: Send` (every provider is): all state, the provider
/// included, lives behind one mutex (the crate's `sync` facade, so loom models
/// see it), and every method locks it; provider calls are made with it held,
/// as [`HostProvider`] documents. The handles are plain data.
pub struct CachingHostAllocator<P: HostProvider> {
    state: Mutex<State<P>>,
    id: u32,
}

impl<P: HostProvider> std::fmt::Debug for CachingHostAllocator<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = sync::lock(&self.state);
        f.debug_struct("CachingHostAllocator")
            .field("id", &self.id)
            .field("kind", &st.provider.kind())
            .field("blocks", &st.blocks.len())
            .field("pending_events", &st.events.len())
            .field("pinned", &st.pinned)
            .field("options", &st.options)
            .finish()
    }
}

impl<P: HostProvider> CachingHostAllocator<P> {
    /// A host allocator over `provider`. [`Error::InvalidArgument`] for a
    /// thread count that is not a power of two ≤ 128.
    pub fn new(provider: P, options: HostAllocatorOptions) -> Result<Self> {
        options.validate()?;
        Ok(CachingHostAllocator {
            state: Mutex::new(State {
                provider,
                options,
                blocks: HashMap::new(),
                free_lists: vec![Vec::new(); SIZE_CLASSES],
                events: VecDeque::new(),
                reserve: None,
                pinned: 0,
                stats: HostStats::default(),
                next_serial: 1,
            }),
            id: sync::next_instance_id(),
        })
    }

    /// A host allocator with the `pinned_*` settings of `config` and no budget.
    pub fn from_config(provider: P, config: &AllocatorConfig) -> Result<Self> {
        Self::new(provider, HostAllocatorOptions::from_config(config))
    }

    /// Applies the `pinned_*` settings of `config` from the next request on
    /// (PyTorch reads them at every allocation; a block is always freed the
    /// way it was pinned). The reserve segment size only takes effect before
    /// the segment exists. The budget is kept.
    pub fn set_config(&self, config: &AllocatorConfig) -> Result<()> {
        let mut options = HostAllocatorOptions::from_config(config);
        options.validate()?;
        let mut st = sync::lock(&self.state);
        options.budget = st.options.budget;
        st.options = options;
        Ok(())
    }

    /// Sets (or, with `None`, lifts) the host budget. Lowering it below what
    /// is held frees nothing by itself: later requests fail until blocks are
    /// freed and the cache emptied.
    pub fn set_budget(&self, bytes: Option<usize>) {
        sync::lock(&self.state).options.budget = bytes;
    }

    /// The settings in force.
    pub fn options(&self) -> HostAllocatorOptions {
        sync::lock(&self.state).options.clone()
    }

    /// Page-locked bytes held from the provider (cached and live blocks, and
    /// the whole reserve segment once it exists).
    pub fn pinned_bytes(&self) -> usize {
        sync::lock(&self.state).pinned
    }

    /// A block of at least `size` bytes (rounded up to a power of two).
    ///
    /// Polls the pending events first, then reuses a cached block of the
    /// rounded size, else allocates one from the reserve segment or the
    /// provider. Errors: [`Error::ZeroSize`], [`Error::RequestTooLarge`] (1 EiB
    /// or more), [`Error::HostBudgetExceeded`], [`Error::Device`] (the provider
    /// failed, out of memory after the cache was emptied, or an event query
    /// failed). A failed request changes nothing but the cache.
    pub fn allocate(&self, size: usize) -> Result<HostBlock> {
        let mut st = sync::lock(&self.state);
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        if size >= MAX_REQUEST {
            return Err(Error::RequestTooLarge {
                kind: st.provider.kind(),
                requested: size,
            });
        }
        st.process_events()?;
        let rounded = size.next_power_of_two();
        let index = size_index(rounded);
        let ptr = match st.free_lists[index].pop() {
            Some(ptr) => ptr,
            None => st.new_block(size, rounded)?,
        };
        let serial = st.next_serial;
        st.next_serial += 1;
        let Some(b) = st.blocks.get_mut(&ptr) else {
            return Err(Error::Internal(format!(
                "host block {ptr:#x} in a free list but not in the block table"
            )));
        };
        b.serial = serial;
        st.stats.active_requests.increase(1);
        st.stats.active_bytes.increase(rounded as i64);
        Ok(HostBlock {
            ptr,
            size: rounded,
            requested: size,
            serial: NonZeroU64::new(serial).unwrap_or(NonZeroU64::MIN),
            owner: self.id,
        })
    }

    /// Notes that `stream` uses `block` (PyTorch's `record_event`, e.g. after
    /// queueing an asynchronous copy from or to it): when the block is freed,
    /// an event is recorded on `stream`, and the block is reused only after it
    /// completes. Recording a stream twice is the same as once.
    pub fn record_event(&self, block: &HostBlock, stream: StreamId) -> Result<()> {
        let mut st = sync::lock(&self.state);
        let b = st.live_block(block, self.id)?;
        if !b.streams.contains(&stream) {
            b.streams.push(stream);
        }
        Ok(())
    }

    /// Frees `block`. Without recorded streams it goes back to its free list at
    /// once; otherwise an event is recorded on each of its streams and the
    /// block is cached only once they have all completed.
    ///
    /// [`Error::ForeignHandle`] for another allocator's block,
    /// [`Error::InvalidHandle`] for one already freed. When recording an event
    /// fails ([`Error::Device`]), the block stays allocated, its streams kept
    /// (keep a clone of the handle to retry).
    pub fn free(&self, block: HostBlock) -> Result<()> {
        let mut st = sync::lock(&self.state);
        let streams = std::mem::take(&mut st.live_block(&block, self.id)?.streams);
        let mut events = Vec::with_capacity(streams.len());
        for &s in &streams {
            match st.provider.events().record_event(s) {
                Ok(e) => events.push(e),
                Err(err) => {
                    for e in events {
                        st.provider.events().destroy_event(e);
                    }
                    if let Some(b) = st.blocks.get_mut(&block.ptr) {
                        b.streams = streams;
                    }
                    return Err(Error::Device(err));
                }
            }
        }
        let Some(b) = st.blocks.get_mut(&block.ptr) else {
            return Err(Error::Internal("a live host block vanished".into()));
        };
        b.serial = 0;
        if events.is_empty() {
            st.cache_block(block.ptr, block.size);
        } else {
            b.event_count += events.len();
            for e in events {
                st.events.push_front((e, block.ptr));
            }
        }
        Ok(())
    }

    /// Polls the pending events, then returns every cached free block to the
    /// provider (blocks of the reserve segment stay cached: their memory is
    /// never returned). Blocks whose events are still pending stay pending.
    pub fn empty_cache(&self) -> Result<()> {
        let mut st = sync::lock(&self.state);
        st.process_events()?;
        st.release_cached()
    }

    /// Polls the pending events (oldest first, up to the first one that is not
    /// complete) and caches the blocks whose events have all completed, as
    /// every allocation does first. Returns how many pending events are left.
    pub fn process_events(&self) -> Result<usize> {
        let mut st = sync::lock(&self.state);
        st.process_events()?;
        Ok(st.events.len())
    }

    /// Copies `data` into `block` at `offset` (within the block's rounded
    /// size, [`Error::InvalidArgument`] otherwise).
    ///
    /// The bytes are host memory: wait for (synchronize with) any
    /// asynchronous copy still using the range before writing it.
    pub fn write_bytes(&self, block: &HostBlock, offset: usize, data: &[u8]) -> Result<()> {
        let mut st = sync::lock(&self.state);
        let size = st.live_block(block, self.id)?.size;
        check_range(offset, data.len(), size)?;
        // SAFETY: the block is live (checked above), so by the `HostProvider`
        // contract `[ptr, ptr + size)` is initialised, writable host memory
        // that only this allocator hands out; the range is inside it (checked
        // above) and `data` is a distinct Rust slice. The allocator's lock is
        // held, so no other thread accesses the block through it meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (block.ptr as usize + offset) as *mut u8,
                data.len(),
            );
        }
        Ok(())
    }

    /// Reads `len` bytes of `block` at `offset` (within the block's rounded
    /// size, [`Error::InvalidArgument`] otherwise). Synchronize with any
    /// asynchronous copy into the range first.
    pub fn read_bytes(&self, block: &HostBlock, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut st = sync::lock(&self.state);
        let size = st.live_block(block, self.id)?.size;
        check_range(offset, len, size)?;
        let mut out = vec![0u8; len];
        // SAFETY: as in `write_bytes`: the range lies inside a live block's
        // initialised host memory, and `out` is a distinct allocation of `len`
        // bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (block.ptr as usize + offset) as *const u8,
                out.as_mut_ptr(),
                len,
            );
        }
        Ok(out)
    }

    /// The statistics (PyTorch's `getStats`; events are not polled first).
    pub fn stats(&self) -> HostStats {
        sync::lock(&self.state).stats
    }

    /// `torch.cuda.reset_peak_host_memory_stats`.
    pub fn reset_peak_stats(&self) {
        sync::lock(&self.state).stats.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_host_memory_stats`.
    pub fn reset_accumulated_stats(&self) {
        sync::lock(&self.state).stats.reset_accumulated();
    }

    /// Runs `f` on the provider (e.g. to complete simulated events, or to get
    /// the CUDA stream to queue a copy on), with the allocator locked: `f`
    /// must not call this allocator (it would deadlock).
    pub fn with_provider<R>(&self, f: impl FnOnce(&mut P) -> R) -> R {
        f(&mut sync::lock(&self.state).provider)
    }

    /// Checks the bookkeeping: every block is exactly one of live, pending
    /// (events > 0) or cached in the free list of its size; the stats and the
    /// pinned bytes equal a recount. [`Error::Internal`] names the first
    /// broken rule.
    #[cfg(any(test, feature = "invariant-checks"))]
    pub fn check_invariants(&self) -> Result<()> {
        sync::lock(&self.state).check_invariants()
    }
}

impl<P: HostProvider> State<P> {
    /// The live block `h` names, or the error for a foreign, unknown or freed
    /// handle.
    fn live_block(&mut self, h: &HostBlock, this: u32) -> Result<&mut BlockState> {
        if h.owner != this {
            return Err(Error::ForeignHandle {
                ptr: h.ptr,
                owner: h.owner,
                this,
            });
        }
        match self.blocks.get_mut(&h.ptr) {
            Some(b) if b.serial == h.serial.get() => Ok(b),
            Some(_) => Err(Error::InvalidHandle {
                ptr: h.ptr,
                reason: "the host block was already freed",
            }),
            None => Err(Error::InvalidHandle {
                ptr: h.ptr,
                reason: "not a block of this host allocator (already freed?)",
            }),
        }
    }

    /// Puts a block whose events have all completed in its free list.
    fn cache_block(&mut self, ptr: HostPtr, size: usize) {
        self.free_lists[size_index(size)].push(ptr);
        self.stats.active_requests.decrease(1);
        self.stats.active_bytes.decrease(size as i64);
    }

    /// PyTorch's `process_events`: poll the oldest pending event; if complete,
    /// destroy it and cache its block once the block has no events left; stop
    /// at the first event that is not complete.
    fn process_events(&mut self) -> Result<()> {
        while let Some(&(event, ptr)) = self.events.back() {
            match self.provider.events().query_event(event) {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e) => return Err(Error::Device(e)),
            }
            self.events.pop_back();
            self.provider.events().destroy_event(event);
            let Some(b) = self.blocks.get_mut(&ptr) else {
                return Err(Error::Internal(format!(
                    "event of host block {ptr:#x}, which is not in the block table"
                )));
            };
            b.event_count = b.event_count.saturating_sub(1);
            if b.event_count == 0 {
                let size = b.size;
                self.cache_block(ptr, size);
            }
        }
        Ok(())
    }

    /// A new block of `rounded` bytes (for a request of `size`): from the
    /// reserve segment if it fits, else from the provider within the budget.
    fn new_block(&mut self, size: usize, rounded: usize) -> Result<HostPtr> {
        let mode = self.options.pin_mode();
        if self.reserve.is_none() && self.options.reserve_segment_size > 0 {
            let bytes = self.options.reserve_segment_size;
            // A reserve that does not fit the budget or the system is skipped:
            // requests are then served by the provider, as without one.
            if self.fits_budget(bytes) {
                if let Ok(base) = self.provider_allocate(bytes, mode) {
                    self.pinned += bytes;
                    self.reserve = Some(Reserve {
                        base,
                        size: bytes,
                        used: 0,
                    });
                }
            }
        }
        if let Some(r) = self.reserve.as_mut() {
            let take = rounded.next_multiple_of(RESERVE_ROUND);
            if r.size - r.used >= take {
                let ptr = r.base + r.used as u64;
                r.used += take;
                self.insert_block(ptr, rounded, true);
                return Ok(ptr);
            }
        }
        if !self.fits_budget(rounded) {
            self.release_cached()?;
            if !self.fits_budget(rounded) {
                return Err(Error::HostBudgetExceeded {
                    requested: size,
                    rounded,
                    budget: self.options.budget.unwrap_or(usize::MAX),
                    pinned: self.pinned,
                });
            }
        }
        let ptr = match self.provider_allocate(rounded, mode) {
            Ok(ptr) => ptr,
            Err(DeviceError::OutOfMemory { .. }) => {
                // As PyTorch's device allocator does: free the cache, retry once.
                self.release_cached()?;
                self.provider_allocate(rounded, mode)
                    .map_err(Error::Device)?
            }
            Err(e) => return Err(Error::Device(e)),
        };
        self.pinned += rounded;
        self.insert_block(ptr, rounded, false);
        Ok(ptr)
    }

    fn fits_budget(&self, bytes: usize) -> bool {
        match self.options.budget {
            None => true,
            Some(b) => self.pinned.checked_add(bytes).is_some_and(|n| n <= b),
        }
    }

    fn insert_block(&mut self, ptr: HostPtr, size: usize, reserved_segment: bool) {
        self.blocks.insert(
            ptr,
            BlockState {
                size,
                serial: 0,
                streams: Vec::new(),
                event_count: 0,
                reserved_segment,
            },
        );
        self.stats.allocations.increase(1);
        self.stats.allocated_bytes.increase(size as i64);
    }

    /// The provider's allocate, timed and counted.
    fn provider_allocate(&mut self, bytes: usize, mode: PinMode) -> Result<HostPtr, DeviceError> {
        let start = Instant::now();
        let ptr = self.provider.allocate(bytes, mode)?;
        self.stats
            .host_alloc_time
            .increase(start.elapsed().as_micros() as i64);
        self.stats.num_host_alloc += 1;
        Ok(ptr)
    }

    /// Returns every cached free block outside the reserve segment to the
    /// provider. On a provider error the block stays cached and the error is
    /// returned.
    fn release_cached(&mut self) -> Result<()> {
        for index in 0..SIZE_CLASSES {
            let mut kept = Vec::new();
            let list = std::mem::take(&mut self.free_lists[index]);
            let mut result = Ok(());
            for (i, &ptr) in list.iter().enumerate() {
                let Some(b) = self.blocks.get(&ptr) else {
                    continue;
                };
                if b.reserved_segment {
                    kept.push(ptr);
                    continue;
                }
                let size = b.size;
                let start = Instant::now();
                if let Err(e) = self.provider.free(ptr, size) {
                    kept.extend_from_slice(&list[i..]);
                    result = Err(Error::Device(e));
                    break;
                }
                self.stats
                    .host_free_time
                    .increase(start.elapsed().as_micros() as i64);
                self.stats.num_host_free += 1;
                self.blocks.remove(&ptr);
                self.pinned -= size;
                self.stats.allocations.decrease(1);
                self.stats.allocated_bytes.decrease(size as i64);
            }
            self.free_lists[index] = kept;
            result?;
        }
        Ok(())
    }

    #[cfg(any(test, feature = "invariant-checks"))]
    fn check_invariants(&self) -> Result<()> {
        let bug = |m: String| Err(Error::Internal(m));
        let mut cached = HashMap::new();
        for (index, list) in self.free_lists.iter().enumerate() {
            for &ptr in list {
                if cached.insert(ptr, index).is_some() {
                    return bug(format!("host block {ptr:#x} twice in the free lists"));
                }
            }
        }
        let mut pending: HashMap<HostPtr, usize> = HashMap::new();
        for &(_, ptr) in &self.events {
            *pending.entry(ptr).or_default() += 1;
        }
        let (mut active, mut active_bytes, mut total_bytes, mut pinned) = (0i64, 0i64, 0i64, 0);
        for (&ptr, b) in &self.blocks {
            if !b.size.is_power_of_two() {
                return bug(format!("host block {ptr:#x} has size {}", b.size));
            }
            let live = b.serial != 0;
            let in_list = cached.get(&ptr).copied();
            let events = pending.get(&ptr).copied().unwrap_or(0);
            if events != b.event_count {
                return bug(format!(
                    "host block {ptr:#x}: {} events counted, {events} queued",
                    b.event_count
                ));
            }
            let states =
                usize::from(live) + usize::from(in_list.is_some()) + usize::from(events > 0);
            if states != 1 {
                return bug(format!(
                    "host block {ptr:#x} is live={live}, cached={}, pending={events}",
                    in_list.is_some()
                ));
            }
            if let Some(i) = in_list {
                if i != size_index(b.size) {
                    return bug(format!("host block {ptr:#x} in free list {i}"));
                }
            } else {
                active += 1;
                active_bytes += b.size as i64;
            }
            if !live && !b.streams.is_empty() {
                return bug(format!("free host block {ptr:#x} keeps streams"));
            }
            total_bytes += b.size as i64;
            if !b.reserved_segment {
                pinned += b.size;
            }
        }
        if cached.len() + pending.len() > self.blocks.len() {
            return bug("a free list or event names an unknown host block".into());
        }
        pinned += self.reserve.as_ref().map_or(0, |r| r.size);
        let s = &self.stats;
        let checks = [
            ("active_requests", s.active_requests.current, active),
            ("active_bytes", s.active_bytes.current, active_bytes),
            (
                "allocations",
                s.allocations.current,
                self.blocks.len() as i64,
            ),
            ("allocated_bytes", s.allocated_bytes.current, total_bytes),
            ("pinned", self.pinned as i64, pinned as i64),
        ];
        for (name, have, want) in checks {
            if have != want {
                return bug(format!("{name} is {have}, a recount gives {want}"));
            }
        }
        Ok(())
    }
}

impl<P: HostProvider> Drop for State<P> {
    fn drop(&mut self) {
        for (e, _) in self.events.drain(..) {
            self.provider.events().destroy_event(e);
        }
        // The memory itself goes with the provider, which frees what it holds.
    }
}

/// `log2(size)` of a power of two.
fn size_index(size: usize) -> usize {
    size.trailing_zeros() as usize
}

/// `[offset, offset + len)` inside `size` bytes, or [`Error::InvalidArgument`].
fn check_range(offset: usize, len: usize, size: usize) -> Result<()> {
    if offset.checked_add(len).is_some_and(|end| end <= size) {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            what: "host block range",
            value: format!("{len} bytes at offset {offset}"),
            allowed: "a range inside the block's size",
        })
    }
}
