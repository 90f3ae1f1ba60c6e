//! The raw-memory provider the caching allocator sits on.
//!
//! A [`Device`] hands out whole *segments* (one `cudaMalloc` each), reports its
//! memory info, and models streams with events so that blocks used on several
//! streams are only reused once those streams are done with them. Devices that
//! support virtual memory additionally implement [`VirtualMemory`] (reserve a
//! range, map and unmap physical pages), which the allocator uses for
//! expandable segments.
//!
//! Implementations:
//! - [`SimulatedDevice`]: fixed capacity, deterministic fake addresses,
//!   controllable event completion, injectable failures. The workhorse of tests,
//!   benches and DTR's physical budget.
//! - [`HostDevice`]: real host memory, so tests can write and read bytes.
//! - `CudaDevice` (feature `cuda`): cudarc's driver API, loaded at run time.
//!
//! Not a device: `CudaPool` (feature `cuda`) reads and trims the driver's
//! stream-ordered pool that frameworks without an allocator hook allocate from.

mod host;
mod simulated;

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cuda")]
mod cuda_pool;

pub use host::HostDevice;
pub use simulated::{SimOp, SimulatedDevice, SimulatedDeviceBuilder};

#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
#[cfg(feature = "cuda")]
pub use cuda_pool::{CudaPool, PoolUsage};

use std::fmt;

/// A device address. On the simulated device a fake, deterministic number; on
/// the host and CUDA devices the real address. `0` is never a valid address.
pub type DevicePtr = u64;

/// A stream: an ordered queue of work on the device. The allocator only compares
/// and stores stream ids; the device gives them meaning. Stream `0` is the
/// default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The device's default stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// An event recorded on a stream; complete once all work queued on that stream
/// before the record has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// Free and total bytes of the device, as `cudaMemGetInfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// Bytes the device could still hand out.
    pub free: usize,
    /// Total bytes of the device.
    pub total: usize,
}

/// Errors a device reports. Only [`DeviceError::OutOfMemory`] enters the
/// allocator's free-and-retry path; every other error propagates at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device has no memory for this request right now.
    #[error("device out of memory allocating {requested} bytes")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
    },
    /// The address is not one this device handed out (or was already freed).
    #[error("invalid device pointer: {ptr:#x}")]
    InvalidPointer {
        /// The offending address.
        ptr: DevicePtr,
    },
    /// The event id is unknown to the device.
    #[error("unknown event {0:?}")]
    InvalidEvent(EventId),
    /// The device does not support this operation.
    #[error("operation not supported by this device: {0}")]
    Unsupported(&'static str),
    /// The device (driver) is not available, e.g. no CUDA driver is installed.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// Any other driver error.
    #[error("device error: {0}")]
    Other(String),
}

/// A raw-memory provider: the only thing the caching allocator knows about the
/// hardware. All methods are called with the allocator's mutex held, so an
/// implementation needs no locking of its own.
pub trait Device: Send {
    /// The word used in messages for this kind of device, e.g. `"CUDA"`.
    fn kind(&self) -> &'static str;
    /// Device index, as printed in messages ("GPU 0").
    fn index(&self) -> usize {
        0
    }
    /// Allocates one segment of exactly `bytes` bytes (`bytes > 0`).
    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError>;
    /// Frees a segment returned by [`Device::allocate`]; `bytes` is its size.
    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError>;
    /// Free and total device memory.
    fn mem_info(&mut self) -> Result<MemInfo, DeviceError>;
    /// Records an event on `stream`.
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError>;
    /// True once the event has completed. Does not block.
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError>;
    /// Blocks until the event has completed.
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError>;
    /// Releases the event's resources; it is not used again.
    fn destroy_event(&mut self, event: EventId);
    /// The device's virtual-memory interface, for expandable segments; `None`
    /// when unsupported (asking for `expandable_segments:True` on such a device
    /// is then an [`crate::Error::Unsupported`], never silently ignored).
    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        None
    }
}

/// Virtual-memory operations (CUDA VMM: `cuMemAddressReserve`, `cuMemCreate`,
/// `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`).
///
/// Pages are whole multiples of the page size the allocator asks for (2 MiB in
/// the small pool, `large_segment_size` in the large pool); every `map`/`unmap`
/// range is page aligned relative to the reservation's base.
pub trait VirtualMemory {
    /// Reserves `bytes` of address space with no physical memory behind it.
    fn reserve(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError>;
    /// Backs `[va, va + bytes)` with physical memory (one handle per page of
    /// `page_size`). On failure nothing stays mapped.
    fn map(&mut self, va: DevicePtr, bytes: usize, page_size: usize) -> Result<(), DeviceError>;
    /// Unmaps `[va, va + bytes)` and releases its physical memory.
    fn unmap(&mut self, va: DevicePtr, bytes: usize, page_size: usize) -> Result<(), DeviceError>;
    /// Returns a reservation made by [`VirtualMemory::reserve`]; nothing in it is mapped.
    fn release(&mut self, va: DevicePtr, bytes: usize) -> Result<(), DeviceError>;
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn index(&self) -> usize {
        (**self).index()
    }
    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        (**self).allocate(bytes)
    }
    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        (**self).free(ptr, bytes)
    }
    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        (**self).mem_info()
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        (**self).record_event(stream)
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        (**self).query_event(event)
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        (**self).synchronize_event(event)
    }
    fn destroy_event(&mut self, event: EventId) {
        (**self).destroy_event(event)
    }
    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        (**self).virtual_memory()
    }
}
