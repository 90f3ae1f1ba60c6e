//! [`HostProvider`]: where the host allocator gets page-locked memory, and
//! whose streams and events say when a block may be reused; and
//! [`AlignedHostProvider`], the provider of plain aligned host memory.

use crate::device::{Device, DeviceError, HostDevice};
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;

/// A host address, as an integer (like [`crate::DevicePtr`]). `0` is never a
/// valid address.
pub type HostPtr = u64;

/// Alignment of every block [`AlignedHostProvider`] hands out: one page, as
/// `cudaHostAlloc` and the `malloc` + `cudaHostRegister` path give.
pub const HOST_PAGE: usize = 4096;

/// How a provider pins a new allocation (`pinned_use_cuda_host_register`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PinMode {
    /// One call that allocates page-locked memory (`cuMemHostAlloc`), the default.
    HostAlloc,
    /// Ordinary memory, its pages touched by `threads` threads
    /// (`pinned_num_register_threads`), then page-locked (`cuMemHostRegister`).
    HostRegister {
        /// Threads that pre-fault the pages (a power of two ≤ 128).
        threads: usize,
    },
}

/// A source of page-locked host memory for
/// [`CachingHostAllocator`](super::CachingHostAllocator).
///
/// Every method is called with the allocator's mutex held, so an implementation
/// needs no locking of its own.
///
/// # Safety
///
/// The allocator reads and writes the bytes of live blocks
/// ([`CachingHostAllocator::write_bytes`](super::CachingHostAllocator::write_bytes)),
/// so an implementation must guarantee that a successful
/// [`HostProvider::allocate`] returns the address of `bytes` initialised,
/// readable and writable host bytes, aligned to [`HOST_PAGE`], owned by no one
/// else, that stay valid until the matching [`HostProvider::free`] (or the
/// provider is dropped).
pub unsafe trait HostProvider: Send {
    /// The word used in messages, e.g. `"CUDA"` or `"host"`.
    fn kind(&self) -> &'static str;
    /// Allocates `bytes > 0` page-locked bytes, pinned as `mode` says.
    /// [`DeviceError::OutOfMemory`] when the system has no memory for it.
    fn allocate(&mut self, bytes: usize, mode: PinMode) -> Result<HostPtr, DeviceError>;
    /// Frees an allocation of [`HostProvider::allocate`] (`bytes` is its size),
    /// the way it was pinned (`cuMemFreeHost`, or `cuMemHostUnregister` + `free`).
    fn free(&mut self, ptr: HostPtr, bytes: usize) -> Result<(), DeviceError>;
    /// The device whose streams use the blocks: the allocator records, queries
    /// and destroys its events through [`Device::record_event`],
    /// [`Device::query_event`] and [`Device::destroy_event`].
    fn events(&mut self) -> &mut dyn Device;
}

/// One live allocation of [`AlignedHostProvider`].
#[derive(Debug)]
struct HostAllocation {
    /// Start; valid for `layout.size()` bytes until deallocated with `layout`.
    ptr: NonNull<u8>,
    /// The layout given to `alloc_zeroed`.
    layout: Layout,
    /// How it was asked to be pinned.
    mode: PinMode,
}

// SAFETY: a `HostAllocation` is the unique owner of a plain heap allocation (no
// thread-local state, no other handle to it); `NonNull` is `!Send` only as a
// lint. Freeing it on another thread is what `Box` does too.
unsafe impl Send for HostAllocation {}

/// A [`HostProvider`] of plain host memory (zeroed, page aligned), so that the
/// CPU tests run the same allocator code as CUDA and copies through the blocks
/// are real. Nothing is page-locked; [`PinMode::HostRegister`] pre-faults the
/// pages with its threads as the CUDA provider does, and is remembered
/// ([`AlignedHostProvider::mode_of`]).
///
/// Events come from `E`: [`HostDevice`] by default, whose events complete as
/// soon as they are recorded; a [`crate::SimulatedDevice`] lets tests complete
/// them on command ([`AlignedHostProvider::with_events`]).
#[derive(Debug)]
pub struct AlignedHostProvider<E: Device = HostDevice> {
    /// The device whose events the allocator records.
    events: E,
    /// Live allocations by address.
    live: BTreeMap<HostPtr, HostAllocation>,
    /// Allocations that fail with out-of-memory once the live bytes would
    /// pass this (tests); `usize::MAX` = only the system's limit.
    capacity: usize,
    /// Sum of the live allocations' sizes.
    used: usize,
}

impl AlignedHostProvider<HostDevice> {
    /// A provider whose events complete at once.
    pub fn new() -> Self {
        Self::with_events(HostDevice::new(0))
    }
}

impl Default for AlignedHostProvider<HostDevice> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Device> AlignedHostProvider<E> {
    /// A provider whose events are `events`' events.
    pub fn with_events(events: E) -> Self {
        AlignedHostProvider {
            events,
            live: BTreeMap::new(),
            capacity: usize::MAX,
            used: 0,
        }
    }

    /// Fails allocations that would take the live bytes above `bytes` with
    /// [`DeviceError::OutOfMemory`], as a full system would.
    pub fn with_capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    /// The event device, e.g. to complete simulated events.
    pub fn event_device(&mut self) -> &mut E {
        &mut self.events
    }

    /// Number of live allocations.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Sum of the live allocations' sizes, in bytes.
    pub fn live_bytes(&self) -> usize {
        self.used
    }

    /// How the live allocation at `ptr` was pinned, or `None`.
    pub fn mode_of(&self, ptr: HostPtr) -> Option<PinMode> {
        self.live.get(&ptr).map(|a| a.mode)
    }
}

// SAFETY: `allocate` returns `alloc_zeroed` memory (initialised), aligned to
// `HOST_PAGE`, of exactly `bytes` bytes, owned by `live` alone until `free` or
// `Drop` deallocates it.
unsafe impl<E: Device> HostProvider for AlignedHostProvider<E> {
    fn kind(&self) -> &'static str {
        "host"
    }

    fn allocate(&mut self, bytes: usize, mode: PinMode) -> Result<HostPtr, DeviceError> {
        let oom = DeviceError::OutOfMemory { requested: bytes };
        if bytes == 0 {
            return Err(DeviceError::Other("cannot allocate 0 host bytes".into()));
        }
        if self
            .used
            .checked_add(bytes)
            .is_none_or(|n| n > self.capacity)
        {
            return Err(oom);
        }
        let layout = Layout::from_size_align(bytes, HOST_PAGE).map_err(|_| oom.clone())?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(oom)?;
        if let PinMode::HostRegister { threads } = mode {
            // SAFETY: `ptr` is a fresh, initialised allocation of `bytes`
            // bytes that nothing else references yet.
            unsafe { prefault(ptr.as_ptr(), bytes, threads) };
        }
        let addr = ptr.as_ptr() as HostPtr;
        self.live.insert(addr, HostAllocation { ptr, layout, mode });
        self.used += bytes;
        Ok(addr)
    }

    fn free(&mut self, ptr: HostPtr, bytes: usize) -> Result<(), DeviceError> {
        match self.live.get(&ptr) {
            Some(a) if a.layout.size() == bytes => {}
            Some(a) => {
                return Err(DeviceError::Other(format!(
                    "host allocation {ptr:#x} freed with size {bytes}, but it has {} bytes",
                    a.layout.size()
                )))
            }
            None => return Err(DeviceError::InvalidPointer { ptr }),
        }
        if let Some(a) = self.live.remove(&ptr) {
            self.used -= bytes;
            // SAFETY: `a.ptr` was allocated with `a.layout` and is removed from
            // `live` here, so it is deallocated exactly once.
            unsafe { std::alloc::dealloc(a.ptr.as_ptr(), a.layout) };
        }
        Ok(())
    }

    fn events(&mut self) -> &mut dyn Device {
        &mut self.events
    }
}

impl<E: Device> Drop for AlignedHostProvider<E> {
    fn drop(&mut self) {
        for (_, a) in std::mem::take(&mut self.live) {
            // SAFETY: each live allocation was allocated with its layout and is
            // drained from `live`, so it is deallocated exactly once.
            unsafe { std::alloc::dealloc(a.ptr.as_ptr(), a.layout) };
        }
    }
}

/// Touches one byte of every page of `[ptr, ptr + len)` (writing the zero
/// that is there), split into `threads` contiguous parts done in parallel,
/// as PyTorch's `allocWithCudaHostRegister` does before `cudaHostRegister`
/// so that registering finds the pages mapped.
///
/// # Safety
///
/// `[ptr, ptr + len)` must be one live, writable, initialised allocation that
/// no other thread accesses during the call, whose bytes may be set to zero
/// (the callers pass fresh, zeroed memory).
pub(crate) unsafe fn prefault(ptr: *mut u8, len: usize, threads: usize) {
    let threads = threads.clamp(1, 128);
    let base = ptr as usize;
    let touch = |start: usize, end: usize| {
        let mut p = start.next_multiple_of(HOST_PAGE);
        while p < end {
            // SAFETY: `base <= start <= p < end <= base + len`, inside the
            // allocation; the parts given to threads are disjoint, and the
            // caller guarantees no one else accesses the range.
            unsafe { (p as *mut u8).write_volatile(0) };
            p += HOST_PAGE;
        }
    };
    if threads == 1 || len < threads * HOST_PAGE {
        touch(base, base + len);
        return;
    }
    std::thread::scope(|s| {
        for i in 0..threads {
            let start = base + len / threads * i;
            let end = if i + 1 == threads {
                base + len
            } else {
                base + len / threads * (i + 1)
            };
            s.spawn(move || touch(start, end));
        }
    });
}
