//! [`CachingAllocator`]: PyTorch's `DeviceCachingAllocator` over a [`Device`].
//!
//! The public type holds two mutexes, always taken in this order: the allocator
//! state, then the device. All bookkeeping lives in `State` (see `state.rs`),
//! whose methods take `&mut self` plus the device, so the rules read like the
//! spec; this file owns locking, handle validation and the malloc steps.

mod block;
mod expandable;
#[cfg(any(test, feature = "invariant-checks"))]
mod invariants;
mod pool;
mod release;
mod state;
#[cfg(test)]
mod tests;
mod views;

use crate::config::AllocatorConfig;
use crate::device::{Device, DevicePtr, StreamId};
use crate::error::{Error, OutOfMemoryError};
use crate::snapshot::{BlockState, HistoryConfig, Snapshot};
use crate::stats::DeviceStats;
use crate::sync::{lock, next_instance_id, Arc, Mutex, MutexGuard};
use crate::Result;
use block::BlockId;
use state::{Found, Request, State};
use std::cell::OnceCell;
use std::num::NonZeroU64;

/// A live allocation. The handle is enough to free in O(1); it records the
/// allocator that issued it and the allocation's serial number, so freeing it
/// twice, or through another allocator, is a typed error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Allocation {
    ptr: DevicePtr,
    size: usize,
    requested: usize,
    stream: StreamId,
    block: BlockId,
    /// Never 0 (a block's serial is 0 while it is not allocated), which also
    /// lets `Option<Allocation>` be as small as the handle.
    serial: NonZeroU64,
    owner: u32,
}

impl Allocation {
    /// Start address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// Bytes the block covers (the rounded size; ≥ [`Allocation::requested`]).
    pub fn size(&self) -> usize {
        self.size
    }
    /// Bytes the caller asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }
    /// The allocation stream.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

/// Free bytes immediately left and right of an allocated block, within its
/// segment (MegEngine's `get_adjacent_free_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdjacentFree {
    /// Bytes of the free block just below, 0 if none.
    pub left: usize,
    /// Bytes of the free block just above, 0 if none.
    pub right: usize,
}

impl AdjacentFree {
    /// `left + right`.
    pub fn total(&self) -> usize {
        self.left + self.right
    }
}

/// One block as [`CachingAllocator::blocks`] lists it (address order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// Start address.
    pub ptr: DevicePtr,
    /// Bytes.
    pub size: usize,
    /// Handed out to a caller.
    pub allocated: bool,
    /// Index of the segment in address order (blocks of one segment are contiguous).
    pub segment: usize,
    /// The caller's unrounded size of the last allocation.
    pub requested: usize,
    /// Full state (allocated, pending free, inactive, unmapped).
    pub state: BlockState,
}

/// Called after an out-of-memory error, outside the allocator's lock.
pub type OomObserver = dyn Fn(&OutOfMemoryError) + Send + Sync;

/// Called when a request misses the cache, outside the allocator's lock; returns
/// true if it freed something (the lookup is then retried once).
pub type FreeMemoryCallback = dyn Fn() -> bool + Send + Sync;

/// A caching allocator over one device. Cheap operations (`malloc` of a cached
/// block, `free`, `adjacent_free_size`) take one uncontended mutex; the device is
/// called only on misses, releases and event queries.
pub struct CachingAllocator<D: Device> {
    id: u32,
    state: Mutex<State>,
    device: Mutex<D>,
    hooks: Mutex<Hooks>,
}

#[derive(Default)]
struct Hooks {
    // Arc<Box<..>>: loom's Arc cannot hold an unsized value.
    oom_observers: Vec<Arc<Box<OomObserver>>>,
    free_memory_callbacks: Vec<Arc<Box<FreeMemoryCallback>>>,
}

impl<D: Device> std::fmt::Debug for CachingAllocator<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("CachingAllocator")
            .field("id", &self.id)
            .field("config", &st.config)
            .field("reserved", &st.stats.reserved_bytes.all_current())
            .field("allocated", &st.stats.allocated_bytes.all_current())
            .finish()
    }
}

/// The two locks, held together; dropped and re-taken around a device malloc
/// when `release_lock_on_cudamalloc` is set.
struct Guards<'a, D> {
    st: MutexGuard<'a, State>,
    dev: MutexGuard<'a, D>,
}

/// Outcome of `malloc`'s hot path ([`CachingAllocator::malloc_hot`]).
enum Hot {
    /// A cached block served the request.
    Hit(Allocation),
    /// The lookup missed: the slow path follows, for this request.
    Miss(Request),
    /// A zero or too-large size, or stream events pending: the general first
    /// step ([`CachingAllocator::malloc_cached`]) decides.
    General,
}

/// Outcome of `malloc`'s first step: finished (hit or error) with the state
/// lock still held, or a miss with both locks held for the slow path.
enum Cached<'a, D> {
    Done(MutexGuard<'a, State>, Result<Allocation>),
    Miss(Guards<'a, D>, Request),
}

impl<D: Device> CachingAllocator<D> {
    /// An allocator over `device` with `config`.
    ///
    /// Fails with [`Error::Unsupported`] when `config.expandable_segments` is set
    /// but the device has no virtual memory, and with [`Error::InvalidFraction`]
    /// for a fraction outside [0, 1].
    pub fn new(mut device: D, config: AllocatorConfig) -> Result<Self> {
        config.validate()?;
        let has_vmm = device.virtual_memory().is_some();
        if config.expandable_segments && !has_vmm {
            return Err(Error::Unsupported {
                setting: "expandable_segments:True",
                kind: device.kind(),
                reason: "the device has no virtual-memory (VMM) interface",
            });
        }
        let info = device.mem_info().map_err(Error::Device)?;
        let mut state = State::new(config, info.total, device.kind(), device.index(), has_vmm);
        let fraction = state.config.per_process_memory_fraction;
        state.set_memory_fraction(fraction)?;
        Ok(CachingAllocator {
            id: next_instance_id(),
            state: Mutex::new(state),
            device: Mutex::new(device),
            hooks: Mutex::new(Hooks::default()),
        })
    }

    /// An allocator configured from `REMAT_ALLOC_CONF` (or
    /// `PYTORCH_CUDA_ALLOC_CONF`); see [`AllocatorConfig::from_env`].
    pub fn from_env(device: D) -> Result<Self> {
        Self::new(device, AllocatorConfig::from_env()?)
    }

    fn guards(&self) -> Guards<'_, D> {
        let st = lock(&self.state);
        let dev = lock(&self.device);
        Guards { st, dev }
    }

    /// Allocates `size` bytes for use on `stream` (PyTorch's `malloc`, spec §3).
    ///
    /// Steps: process completed events; best fit from the cache; free-memory
    /// callbacks and retry; garbage collection (with a memory fraction set); a new
    /// segment; release cached oversize blocks and retry; release every cached
    /// block and retry; else [`Error::OutOfMemory`].
    pub fn malloc(&self, size: usize, stream: StreamId) -> Result<Allocation> {
        let mut st = lock(&self.state);
        match self.malloc_hot(&mut st, size, stream) {
            Hot::Hit(a) => Ok(a),
            Hot::Miss(req) => {
                let dev = lock(&self.device);
                self.malloc_miss(Guards { st, dev }, &req)
            }
            Hot::General => match self.malloc_cached(st, size, stream) {
                Cached::Done(_, r) => r,
                Cached::Miss(g, req) => self.malloc_miss(g, &req),
            },
        }
    }

    /// The hot path of `malloc`, shared by [`CachingAllocator::malloc`] and
    /// [`AllocatorBatch::malloc`] under the state lock: for a valid size with no
    /// stream events pending, the rounding and the best-fit lookup, and on a hit
    /// the block taken. Anything else is left to the caller, which owns the
    /// locking: the slow path after a miss ([`Self::malloc_miss`]) or the general
    /// first step ([`Self::malloc_cached`]). Always inlined, so that each caller
    /// compiles to the hand-written hot path it replaced.
    #[inline(always)]
    fn malloc_hot(&self, st: &mut State, size: usize, stream: StreamId) -> Hot {
        if !plain_request(st, size) {
            return Hot::General;
        }
        let req = st.request(size, stream);
        match st.get_free_block(&req) {
            Some(b) => Hot::Hit(self.found_inline(st, b, &req)),
            None => Hot::Miss(req),
        }
    }

    /// Step 1 of `malloc` under the state lock: the size checks and best fit from
    /// the cache. The device is only locked when completed stream events must be
    /// processed first, or on a miss (which continues in [`Self::malloc_miss`]).
    #[inline]
    fn malloc_cached<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        size: usize,
        stream: StreamId,
    ) -> Cached<'a, D> {
        if size == 0 {
            return Cached::Done(st, Err(Error::ZeroSize));
        }
        if size >= crate::size::ONE_EXBIBYTE {
            let kind = lock(&self.device).kind();
            let err = Error::RequestTooLarge {
                kind,
                requested: size,
            };
            return Cached::Done(st, Err(err));
        }
        let req = st.request(size, stream);
        if st.events.is_empty() {
            if let Some(b) = st.get_free_block(&req) {
                let a = self.found(&mut st, b, &req);
                return Cached::Done(st, Ok(a));
            }
            let dev = lock(&self.device);
            return Cached::Miss(Guards { st, dev }, req);
        }
        let mut g = Guards {
            st,
            dev: lock(&self.device),
        };
        if let Err(e) = g.st.process_events(&mut *g.dev) {
            return Cached::Done(g.st, Err(e));
        }
        if let Some(b) = g.st.get_free_block(&req) {
            let a = self.found(&mut g.st, b, &req);
            return Cached::Done(g.st, Ok(a));
        }
        Cached::Miss(g, req)
    }

    /// Steps 2–7 of `malloc`, after a cache miss. May drop and re-take the locks
    /// (callbacks and observers run outside them; with `release_lock_on_cudamalloc`
    /// the device allocation too); returns with both released.
    #[cold]
    fn malloc_miss<'a>(&'a self, mut g: Guards<'a, D>, req: &Request) -> Result<Allocation> {
        let req = req.with_alloc_size(&g.st.config);
        // 2. free-memory callbacks (outside the lock), then one more lookup.
        // Cloned (to run them unlocked) only when there are any.
        let callbacks: Option<Vec<Arc<Box<FreeMemoryCallback>>>> = {
            let hooks = lock(&self.hooks);
            let cbs = &hooks.free_memory_callbacks;
            (!cbs.is_empty()).then(|| cbs.clone())
        };
        if let Some(callbacks) = callbacks {
            drop(g);
            let freed = callbacks.iter().fold(false, |acc, cb| cb() | acc);
            g = self.guards();
            g.st.process_events(&mut *g.dev)?;
            if freed {
                if let Some(b) = g.st.get_free_block(&req) {
                    return Ok(self.found(&mut g.st, b, &req));
                }
            }
        }
        // 3. age-based garbage collection of cached blocks (only with a fraction).
        g.st.garbage_collect_cached_blocks(&mut *g.dev)?;
        // 4. a new segment; then free oversize blocks and retry; then free all and retry.
        let (g2, mut found) = self.alloc_block(g, &req, false)?;
        g = g2;
        // throw_on_cudamalloc_oom: a failed device allocation is final (a refusal
        // by the memory fraction, where the device was not asked, still retries).
        let device_refused = found.is_none() && !g.st.over_memory_fraction(req.alloc_size);
        let retry = !(g.st.config.throw_on_cudamalloc_oom && device_refused);
        if retry && found.is_none() && g.st.release_available_cached_blocks(&mut *g.dev, &req)? {
            let (g2, f) = self.alloc_block(g, &req, false)?;
            g = g2;
            found = f;
        }
        if retry && found.is_none() {
            g.st.release_cached_blocks(&mut *g.dev)?;
            let (g2, f) = self.alloc_block(g, &req, true)?;
            g = g2;
            found = f;
        }
        match found {
            Some(b) => Ok(self.found(&mut g.st, b.into(), &req)),
            None => Err(self.out_of_memory(g, &req)),
        }
    }

    /// Books the cached block `b` for `req` and makes its handle.
    #[inline]
    fn found(&self, st: &mut State, b: Found, req: &Request) -> Allocation {
        self.found_inline(st, b, req)
    }

    /// [`Self::found`], always inlined: only the hit of the shared hot path
    /// ([`Self::malloc_hot`]) calls it. `found`, for the general and slow
    /// paths, is left to the compiler (forcing it inline on every caller made the
    /// split loops slower).
    #[inline(always)]
    fn found_inline(&self, st: &mut State, b: Found, req: &Request) -> Allocation {
        let split = st.should_split(b.id, req.size);
        let (block, serial) = st.alloc_found_block(b, req, split);
        let blk = &st.blocks[block];
        Allocation {
            ptr: blk.ptr,
            size: blk.size,
            requested: req.orig,
            stream: req.stream,
            block,
            serial,
            owner: self.id,
        }
    }

    /// Step "new memory from the device". With `release_lock_on_cudamalloc` the
    /// state lock is dropped around the device call, so other threads keep
    /// allocating from and freeing to the cache meanwhile.
    #[cold]
    fn alloc_block<'a>(
        &'a self,
        mut g: Guards<'a, D>,
        req: &Request,
        is_retry: bool,
    ) -> Result<(Guards<'a, D>, Option<BlockId>)> {
        if is_retry {
            g.st.stats.num_alloc_retries += 1;
        }
        if g.st.over_memory_fraction(req.alloc_size) {
            return Ok((g, None));
        }
        if g.st.expandable_active() {
            let b = g.st.try_allocate_expandable_block(&mut *g.dev, req)?;
            return Ok((g, b));
        }
        let result = if g.st.config.release_lock_on_device_malloc {
            drop(g);
            let r = lock(&self.device).allocate(req.alloc_size);
            g = self.guards();
            r
        } else {
            g.dev.allocate(req.alloc_size)
        };
        let b = g.st.new_segment_block(result, req)?;
        Ok((g, b))
    }

    #[cold]
    fn out_of_memory(&self, mut g: Guards<'_, D>, req: &Request) -> Error {
        let err = match g.st.out_of_memory_error(&mut *g.dev, req) {
            Ok(e) => e,
            Err(e) => return e,
        };
        drop(g);
        let observers = lock(&self.hooks).oom_observers.clone();
        for obs in observers {
            obs(&err);
        }
        Error::OutOfMemory(err)
    }

    /// Finds the live block `a` names, or says why it is not one.
    fn resolve(&self, st: &State, a: &Allocation) -> Result<BlockId> {
        resolve(st, self.id, a)
    }

    /// Frees an allocation. If other streams used it ([`CachingAllocator::record_stream`])
    /// its block returns to the cache only once their events complete.
    pub fn free(&self, a: Allocation) -> Result<()> {
        self.free_locked(&mut lock(&self.state), a)
    }

    #[inline]
    fn free_locked(&self, st: &mut State, a: Allocation) -> Result<()> {
        let b = self.resolve(st, &a)?;
        if !st.blocks[b].stream_uses.is_empty() {
            // Used on other streams: record their end-of-use events first. If the
            // device fails, nothing has changed and the handle is still live.
            let mut dev = lock(&self.device);
            let events = st.record_use_events(&mut *dev, b)?;
            st.free(b, events);
        } else {
            st.free_now(b);
        }
        Ok(())
    }

    /// Marks `a` as used on `stream` too: when freed, it is not reused until the
    /// work queued on `stream` up to the free has completed.
    pub fn record_stream(&self, a: &Allocation, stream: StreamId) -> Result<()> {
        let mut st = lock(&self.state);
        let b = self.resolve(&st, a)?;
        st.record_stream(b, stream);
        Ok(())
    }

    /// Free bytes immediately before and after `a` within its segment: two
    /// neighbour reads, O(1).
    pub fn adjacent_free_size(&self, a: &Allocation) -> Result<AdjacentFree> {
        self.inspect(|v| v.adjacent_free_size(a))
    }

    /// Runs `f` with a read-only [`AllocatorView`] under one lock acquisition, for
    /// many O(1) queries in a row (e.g. DTR scoring every eviction candidate).
    /// `f` must not call back into this allocator: the lock is held.
    pub fn inspect<R>(&self, f: impl FnOnce(&AllocatorView<'_>) -> R) -> R {
        let st = lock(&self.state);
        f(&AllocatorView {
            st: &st,
            owner: self.id,
            stats: OnceCell::new(),
        })
    }

    /// Takes the allocator lock once for many operations: the returned
    /// [`AllocatorBatch`] serves `malloc`, `free`, `record_stream` and
    /// `adjacent_free_size` with the decisions of the methods of the same names,
    /// without a lock round trip per call (DTR's eviction loop, a trace replayer,
    /// a framework's single stream). Other threads wait until it is dropped,
    /// except while a `malloc` that missed the cache runs its slow path, which
    /// releases the lock as [`CachingAllocator::malloc`] does. Do not call this
    /// allocator's own methods while the batch is alive on the same thread: the
    /// lock is held (the free-memory callbacks and OOM observers may, as they run
    /// outside it).
    pub fn batch(&self) -> AllocatorBatch<'_, D> {
        AllocatorBatch {
            alloc: self,
            st: Some(lock(&self.state)),
        }
    }

    /// Releases every cached, wholly free segment to the device (after waiting
    /// for pending stream events), like `torch.cuda.empty_cache()`. Free parts of
    /// segments that still hold allocations stay cached.
    pub fn empty_cache(&self) -> Result<()> {
        let mut g = self.guards();
        g.st.release_cached_blocks(&mut *g.dev)
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        lock(&self.state).stats.device_stats()
    }

    /// `allocated_bytes.all.current`.
    pub fn memory_allocated(&self) -> usize {
        lock(&self.state).stats.allocated_bytes.all_current() as usize
    }

    /// `reserved_bytes.all.current`.
    pub fn memory_reserved(&self) -> usize {
        lock(&self.state).stats.reserved_bytes.all_current() as usize
    }

    /// Sets every peak to its current value.
    pub fn reset_peak_stats(&self) {
        lock(&self.state).stats.reset_peak();
    }

    /// Zeroes the accumulated totals and counters.
    pub fn reset_accumulated_stats(&self) {
        lock(&self.state).stats.reset_accumulated();
    }

    /// A table like `torch.cuda.memory_summary()`.
    pub fn memory_summary(&self) -> String {
        let st = lock(&self.state);
        crate::summary::memory_summary(&st.stats.device_stats(), st.device_kind, st.device_index)
    }

    /// Segments with their blocks, the trace (if recording) and the settings.
    pub fn snapshot(&self) -> Snapshot {
        lock(&self.state).snapshot()
    }

    /// Every block in address order, unmapped expandable ranges included.
    pub fn blocks(&self) -> Vec<BlockInfo> {
        lock(&self.state).block_infos()
    }

    /// Starts (or, with `None`, stops) recording alloc/free events into a ring
    /// buffer that [`CachingAllocator::snapshot`] returns.
    pub fn record_history(&self, config: Option<HistoryConfig>) -> Result<()> {
        lock(&self.state).trace.configure(config)
    }

    /// Limits the bytes reserved from the device to `fraction` of its total
    /// (`torch.cuda.set_per_process_memory_fraction`); 1.0 removes the limit.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        lock(&self.state).set_memory_fraction(fraction)
    }

    /// The fraction in force: the limit over the total, or 1.0 with no limit.
    pub fn memory_fraction(&self) -> f64 {
        lock(&self.state).memory_fraction()
    }

    /// Applies a settings string at run time (`_set_allocator_settings`), with
    /// PyTorch's reset semantics (see [`AllocatorConfig::update`]). On error the
    /// settings are unchanged.
    pub fn set_settings(&self, settings: &str) -> Result<()> {
        let mut st = lock(&self.state);
        let mut cfg = st.config.clone();
        cfg.update(settings)?;
        cfg.validate()?;
        if cfg.expandable_segments && !st.has_vmm {
            return Err(Error::Unsupported {
                setting: "expandable_segments:True",
                kind: st.device_kind,
                reason: "the device has no virtual-memory (VMM) interface",
            });
        }
        st.set_config(cfg);
        Ok(())
    }

    /// The settings in force.
    pub fn config(&self) -> AllocatorConfig {
        lock(&self.state).config.clone()
    }

    /// True when expandable segments are configured (and the device supports them).
    pub fn expandable_segments_active(&self) -> bool {
        lock(&self.state).expandable_active()
    }

    /// Runs `f` on the device, with the allocator locked (e.g. to complete
    /// simulated stream work, or to read the host device's bytes).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        let _st = lock(&self.state);
        let mut dev = lock(&self.device);
        f(&mut dev)
    }

    /// Adds an observer called (outside the lock) after each out-of-memory error.
    pub fn add_oom_observer(&self, observer: impl Fn(&OutOfMemoryError) + Send + Sync + 'static) {
        let observer: Box<OomObserver> = Box::new(observer);
        lock(&self.hooks).oom_observers.push(Arc::new(observer));
    }

    /// Adds a callback run (outside the lock) when a request misses the cache; it
    /// may free allocations of this allocator and returns true if it freed any.
    pub fn add_free_memory_callback(&self, callback: impl Fn() -> bool + Send + Sync + 'static) {
        lock(&self.hooks)
            .free_memory_callbacks
            .push(Arc::new(Box::new(callback) as Box<FreeMemoryCallback>));
    }

    /// Checks every invariant: each byte of each segment in exactly one block,
    /// linked lists consistent, no two adjacent free blocks, pools = the free
    /// blocks, stats = a recount. Returns a description of the first violation.
    #[cfg(any(test, feature = "invariant-checks"))]
    pub fn check_invariants(&self) -> Result<()> {
        lock(&self.state)
            .check_invariants()
            .map_err(Error::Internal)
    }
}

/// True for a request of a valid size with no stream events pending: the case
/// where `malloc`'s first step is just the lookup.
#[inline]
fn plain_request(st: &State, size: usize) -> bool {
    size != 0 && size < crate::size::ONE_EXBIBYTE && st.events.is_empty()
}

/// The live block `a` names in `st` (owned by allocator `owner`), or why not.
#[inline]
fn resolve(st: &State, owner: u32, a: &Allocation) -> Result<BlockId> {
    if a.owner != owner {
        return Err(Error::ForeignHandle {
            ptr: a.ptr,
            owner: a.owner,
            this: owner,
        });
    }
    // Serials are unique and a block carries one only while allocated (0
    // otherwise), so one compare proves the slot holds this very allocation.
    if st.blocks.holds_allocation(a.block, a.serial.get()) {
        debug_assert!(
            st.blocks[a.block].allocated && st.blocks[a.block].ptr == a.ptr,
            "serial {} reused",
            a.serial
        );
        Ok(a.block)
    } else {
        Err(Error::InvalidHandle {
            ptr: a.ptr,
            reason: "not a live allocation (already freed?)",
        })
    }
}

/// Read-only access to an allocator's blocks under one lock acquisition
/// ([`CachingAllocator::inspect`]).
pub struct AllocatorView<'a> {
    st: &'a State,
    owner: u32,
    /// The statistics in PyTorch's form, built on the first [`AllocatorView::stats`].
    stats: OnceCell<DeviceStats>,
}

impl AllocatorView<'_> {
    /// Free bytes immediately before and after `a` within its segment: two
    /// neighbour reads, O(1), under the view's lock.
    #[inline]
    pub fn adjacent_free_size(&self, a: &Allocation) -> Result<AdjacentFree> {
        let b = resolve(self.st, self.owner, a)?;
        Ok(self.st.adjacent_free(b))
    }

    /// Every block in address order (as [`CachingAllocator::blocks`]).
    pub fn blocks(&self) -> Vec<BlockInfo> {
        self.st.block_infos()
    }

    /// The statistics.
    pub fn stats(&self) -> &DeviceStats {
        self.stats.get_or_init(|| self.st.stats.device_stats())
    }
}

/// The allocator locked once for many operations ([`CachingAllocator::batch`]).
///
/// Each method makes exactly the decision of the [`CachingAllocator`] method of
/// the same name; only the locking differs. A `malloc` that misses the cache
/// releases the lock for its slow path (free-memory callbacks, OOM observers,
/// `release_lock_on_cudamalloc`) and takes it again before returning.
pub struct AllocatorBatch<'a, D: Device> {
    alloc: &'a CachingAllocator<D>,
    /// The state lock; `None` only inside a slow path, never between calls.
    st: Option<MutexGuard<'a, State>>,
}

impl<'a, D: Device> AllocatorBatch<'a, D> {
    #[inline]
    fn state(&mut self) -> &mut State {
        let alloc = self.alloc;
        self.st.get_or_insert_with(|| lock(&alloc.state))
    }

    /// [`CachingAllocator::malloc`] under the batch's lock.
    #[inline]
    pub fn malloc(&mut self, size: usize, stream: StreamId) -> Result<Allocation> {
        let alloc = self.alloc;
        match alloc.malloc_hot(self.state(), size, stream) {
            Hot::Hit(a) => Ok(a),
            Hot::Miss(req) => self.miss(&req),
            Hot::General => self.malloc_general(size, stream),
        }
    }

    /// A miss after the lookup: the slow path with the lock released where
    /// `malloc` releases it, then the lock taken again.
    #[cold]
    fn miss(&mut self, req: &Request) -> Result<Allocation> {
        let st = match self.st.take() {
            Some(st) => st,
            None => lock(&self.alloc.state),
        };
        let dev = lock(&self.alloc.device);
        let r = self.alloc.malloc_miss(Guards { st, dev }, req);
        self.st = Some(lock(&self.alloc.state));
        r
    }

    /// Size errors and pending stream events: `malloc`'s general first step.
    #[cold]
    fn malloc_general(&mut self, size: usize, stream: StreamId) -> Result<Allocation> {
        let st = match self.st.take() {
            Some(st) => st,
            None => lock(&self.alloc.state),
        };
        match self.alloc.malloc_cached(st, size, stream) {
            Cached::Done(st, r) => {
                self.st = Some(st);
                r
            }
            Cached::Miss(g, req) => {
                let r = self.alloc.malloc_miss(g, &req);
                self.st = Some(lock(&self.alloc.state));
                r
            }
        }
    }

    /// [`CachingAllocator::free`] under the batch's lock.
    #[inline]
    pub fn free(&mut self, a: Allocation) -> Result<()> {
        let alloc = self.alloc;
        alloc.free_locked(self.state(), a)
    }

    /// [`CachingAllocator::record_stream`] under the batch's lock.
    pub fn record_stream(&mut self, a: &Allocation, stream: StreamId) -> Result<()> {
        let owner = self.alloc.id;
        let st = self.state();
        let b = resolve(st, owner, a)?;
        st.record_stream(b, stream);
        Ok(())
    }

    /// [`CachingAllocator::adjacent_free_size`] under the batch's lock: two
    /// neighbour reads.
    #[inline]
    pub fn adjacent_free_size(&mut self, a: &Allocation) -> Result<AdjacentFree> {
        let owner = self.alloc.id;
        let st = self.state();
        let b = resolve(st, owner, a)?;
        Ok(st.adjacent_free(b))
    }

    /// A read-only view for the queries of [`CachingAllocator::inspect`].
    pub fn view(&mut self) -> AllocatorView<'_> {
        let owner = self.alloc.id;
        AllocatorView {
            st: self.state(),
            owner,
            stats: OnceCell::new(),
        }
    }
}

impl<D: Device> std::fmt::Debug for AllocatorBatch<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocatorBatch")
            .field("allocator", &self.alloc.id)
            .finish()
    }
}
