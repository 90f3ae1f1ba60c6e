//! The allocator as it was before the hot-path rewrite (issue 14), kept verbatim
//! as a test-only reference: `differential.rs` drives it and the real
//! [`crate::CachingAllocator`] with the same generated operations and requires
//! every result, statistic, block list and snapshot to be identical. Only what
//! the differential test exercises is kept (no invariant scan, no getters it
//! does not compare); the
//! decision code (`state.rs`, `expandable.rs`, `pool.rs`, `block.rs`) is the
//! pre-rewrite code with only its `use` lines changed.

mod block;
mod expandable;
mod pool;
mod state;

use crate::allocator::{AdjacentFree, BlockInfo};
use crate::config::AllocatorConfig;
use crate::device::{Device, DevicePtr, StreamId};
use crate::error::{Error, OutOfMemoryError};
use crate::snapshot::{HistoryConfig, Snapshot};
use crate::stats::DeviceStats;
use crate::sync::{lock, next_instance_id, Arc, Mutex, MutexGuard};
use crate::Result;
use block::BlockId;
use state::{Request, State};

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
    serial: u64,
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
            .field("reserved", &st.stats.reserved_bytes.all.current)
            .field("allocated", &st.stats.allocated_bytes.all.current)
            .finish()
    }
}

/// The two locks, held together; dropped and re-taken around a device malloc
/// when `release_lock_on_cudamalloc` is set.
struct Guards<'a, D> {
    st: MutexGuard<'a, State>,
    dev: MutexGuard<'a, D>,
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
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        if size >= crate::size::ONE_EXBIBYTE {
            let kind = lock(&self.device).kind();
            return Err(Error::RequestTooLarge {
                kind,
                requested: size,
            });
        }
        let mut st = lock(&self.state);
        let req = st.request(size, stream);
        // 1. best fit from the cache. The device is only locked when completed
        //    stream events must be processed first, or on a miss.
        let mut g = if st.events.is_empty() {
            if let Some(b) = st.get_free_block(&req) {
                return Ok(self.found(&mut st, b, &req));
            }
            Guards {
                st,
                dev: lock(&self.device),
            }
        } else {
            let mut g = Guards {
                st,
                dev: lock(&self.device),
            };
            g.st.process_events(&mut *g.dev)?;
            if let Some(b) = g.st.get_free_block(&req) {
                return Ok(self.found(&mut g.st, b, &req));
            }
            g
        };
        // 2. free-memory callbacks (outside the lock), then one more lookup.
        let callbacks: Vec<Arc<Box<FreeMemoryCallback>>> =
            lock(&self.hooks).free_memory_callbacks.clone();
        if !callbacks.is_empty() {
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
            Some(b) => Ok(self.found(&mut g.st, b, &req)),
            None => Err(self.out_of_memory(g, &req)),
        }
    }

    fn found(&self, st: &mut State, b: BlockId, req: &Request) -> Allocation {
        let split = st.should_split(b, req.size);
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
        let mut st = lock(&self.state);
        let b = self.resolve(&st, &a)?;
        if !st.blocks[b].stream_uses.is_empty() {
            // Used on other streams: record their end-of-use events first. If the
            // device fails, nothing has changed and the handle is still live.
            let mut dev = lock(&self.device);
            let events = st.record_use_events(&mut *dev, b)?;
            st.free(b, events);
        } else {
            st.free(b, Vec::new());
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
        })
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
        lock(&self.state).stats.clone()
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
        crate::summary::memory_summary(&st.stats, st.device_kind, st.device_index)
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

    /// The settings in force.
    pub fn config(&self) -> AllocatorConfig {
        lock(&self.state).config.clone()
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
        st.config = cfg;
        Ok(())
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
    match st.blocks.try_get(a.block) {
        Some(b) if b.serial == a.serial && b.allocated && b.ptr == a.ptr => Ok(a.block),
        _ => Err(Error::InvalidHandle {
            ptr: a.ptr,
            reason: "not a live allocation (already freed?)",
        }),
    }
}

/// Read-only access to an allocator's blocks under one lock acquisition
/// ([`CachingAllocator::inspect`]).
pub struct AllocatorView<'a> {
    st: &'a State,
    owner: u32,
}

impl AllocatorView<'_> {
    /// Free bytes immediately before and after `a` within its segment: two
    /// neighbour reads, O(1), under the view's lock.
    #[inline]
    pub fn adjacent_free_size(&self, a: &Allocation) -> Result<AdjacentFree> {
        let b = resolve(self.st, self.owner, a)?;
        Ok(self.st.adjacent_free(b))
    }
}
