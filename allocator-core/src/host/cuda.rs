//! [`CudaHostProvider`]: page-locked host memory from the CUDA driver
//! (feature `cuda`).
//!
//! | [`PinMode`] | allocate | free |
//! |---|---|---|
//! | [`PinMode::HostAlloc`] (default) | `cuMemHostAlloc(flags 0)`, then zeroed | `cuMemFreeHost` |
//! | [`PinMode::HostRegister`] (`pinned_use_cuda_host_register`) | page-aligned `std::alloc` (zeroed), pages touched by `threads` threads, `cuMemHostRegister_v2(flags 0)` | `cuMemHostUnregister`, then `std::alloc::dealloc` |
//!
//! Streams and events are those of the [`CudaDevice`] the provider owns
//! ([`CudaHostProvider::device`] hands it out, e.g. for
//! [`CudaDevice::raw_stream`] to queue a copy on).

use super::provider::{prefault, HostProvider, HostPtr, PinMode, HOST_PAGE};
use crate::device::cuda::{bind, driver_error, first_missing_symbol};
use crate::device::{CudaDevice, Device, DeviceError};
use cudarc::driver::{result, sys};
use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::c_void;

/// Driver entry points this provider calls beyond [`CudaDevice`]'s.
const HOST_SYMBOLS: &[&str] = &[
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
];

/// How a live allocation was made, so it is freed the same way even after the
/// setting changed (as PyTorch's `use_host_register` map does).
#[derive(Debug, Clone, Copy)]
enum Pinned {
    /// `cuMemHostAlloc`.
    HostAlloc { bytes: usize },
    /// `std::alloc` with this layout, then `cuMemHostRegister`.
    Registered { layout: Layout },
}

/// A [`HostProvider`] of CUDA page-locked memory (see the module doc).
///
/// ```no_run
/// use remat_alloc::host::{CachingHostAllocator, CudaHostProvider, HostAllocatorOptions};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let host = CachingHostAllocator::new(CudaHostProvider::new(0)?, HostAllocatorOptions::default())?;
/// let block = host.allocate(1 << 20)?; // cuMemHostAlloc(1 MiB)
/// host.free(block)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CudaHostProvider {
    /// The device whose context pins the memory and whose streams use it.
    device: CudaDevice,
    /// Live allocations by address.
    live: HashMap<HostPtr, Pinned>,
}

impl CudaHostProvider {
    /// Opens GPU `ordinal` ([`CudaDevice::new`]) and checks that the driver
    /// exports the pinned-memory calls ([`DeviceError::Unavailable`] otherwise).
    pub fn new(ordinal: usize) -> Result<Self, DeviceError> {
        let device = CudaDevice::new(ordinal)?;
        if let Some(name) = first_missing_symbol(HOST_SYMBOLS) {
            return Err(DeviceError::Unavailable(format!(
                "the CUDA driver library does not export {name} (driver too old?)"
            )));
        }
        Ok(CudaHostProvider {
            device,
            live: HashMap::new(),
        })
    }

    /// The device whose streams and events the allocator uses.
    pub fn device(&mut self) -> &mut CudaDevice {
        &mut self.device
    }

    fn alloc_pinned(&mut self, bytes: usize) -> Result<HostPtr, DeviceError> {
        // SAFETY: the context is current (bound by the caller); the returned
        // memory is uninitialised and is zeroed below before anyone reads it.
        let ptr = unsafe { result::malloc_host(bytes, 0) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                DeviceError::OutOfMemory { requested: bytes }
            } else {
                driver_error("cuMemHostAlloc", e)
            }
        })?;
        if ptr.is_null() {
            return Err(DeviceError::OutOfMemory { requested: bytes });
        }
        // SAFETY: `ptr` is a fresh page-locked allocation of `bytes` bytes that
        // nothing else references; zeroing makes every byte initialised, as
        // the `HostProvider` contract requires.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        self.live
            .insert(ptr as HostPtr, Pinned::HostAlloc { bytes });
        Ok(ptr as HostPtr)
    }

    fn alloc_registered(&mut self, bytes: usize, threads: usize) -> Result<HostPtr, DeviceError> {
        let oom = DeviceError::OutOfMemory { requested: bytes };
        let layout = Layout::from_size_align(bytes, HOST_PAGE).map_err(|_| oom.clone())?;
        // SAFETY: `bytes > 0` (checked by `allocate`).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        if raw.is_null() {
            return Err(oom);
        }
        // SAFETY: `raw` is a fresh, zeroed allocation of `bytes` bytes that
        // nothing else references.
        unsafe { prefault(raw, bytes, threads) };
        // SAFETY: `raw` is a live host allocation of `bytes` bytes, not yet
        // registered; the context is current.
        let r = unsafe { sys::cuMemHostRegister_v2(raw.cast::<c_void>(), bytes, 0) };
        if let Err(e) = r.result() {
            // SAFETY: allocated above with `layout`, not handed out.
            unsafe { std::alloc::dealloc(raw, layout) };
            return Err(if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                oom
            } else {
                driver_error("cuMemHostRegister_v2", e)
            });
        }
        self.live
            .insert(raw as HostPtr, Pinned::Registered { layout });
        Ok(raw as HostPtr)
    }
}

// SAFETY: both paths return `bytes` zeroed (initialised) bytes of host memory,
// page aligned (`cuMemHostAlloc` returns page-aligned memory; the register
// path allocates with `HOST_PAGE` alignment), owned by `live` alone until
// `free` or `Drop` releases them.
unsafe impl HostProvider for CudaHostProvider {
    fn kind(&self) -> &'static str {
        "CUDA"
    }

    fn allocate(&mut self, bytes: usize, mode: PinMode) -> Result<HostPtr, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Other("cannot pin 0 host bytes".into()));
        }
        bind(self.device.cu_context())?;
        match mode {
            PinMode::HostAlloc => self.alloc_pinned(bytes),
            PinMode::HostRegister { threads } => self.alloc_registered(bytes, threads),
        }
    }

    fn free(&mut self, ptr: HostPtr, bytes: usize) -> Result<(), DeviceError> {
        let pinned = *self
            .live
            .get(&ptr)
            .ok_or(DeviceError::InvalidPointer { ptr })?;
        let size = match pinned {
            Pinned::HostAlloc { bytes } => bytes,
            Pinned::Registered { layout } => layout.size(),
        };
        if size != bytes {
            return Err(DeviceError::Other(format!(
                "pinned host allocation {ptr:#x} freed with size {bytes}, but it has {size} bytes"
            )));
        }
        bind(self.device.cu_context())?;
        release(ptr, pinned)?;
        self.live.remove(&ptr);
        Ok(())
    }

    fn events(&mut self) -> &mut dyn Device {
        &mut self.device
    }
}

/// Unpins and frees one live allocation. The context must be current.
fn release(ptr: HostPtr, pinned: Pinned) -> Result<(), DeviceError> {
    let raw = ptr as usize as *mut c_void;
    match pinned {
        Pinned::HostAlloc { .. } => {
            // SAFETY: `raw` came from `cuMemHostAlloc` and is still live; the
            // caller forgets it afterwards, so it is freed once.
            unsafe { result::free_host(raw) }.map_err(|e| driver_error("cuMemFreeHost", e))
        }
        Pinned::Registered { layout } => {
            // SAFETY: `raw` was registered by `cuMemHostRegister_v2` and is
            // still live.
            unsafe { sys::cuMemHostUnregister(raw) }
                .result()
                .map_err(|e| driver_error("cuMemHostUnregister", e))?;
            // SAFETY: `raw` was allocated with `layout` and is no longer
            // registered; the caller forgets it, so it is freed once.
            unsafe { std::alloc::dealloc(raw.cast::<u8>(), layout) };
            Ok(())
        }
    }
}

impl Drop for CudaHostProvider {
    fn drop(&mut self) {
        // Copies may still read or write the memory: wait for them. Errors
        // are ignored (the driver may be shut down at exit).
        if bind(self.device.cu_context()).is_ok() && self.device.synchronize().is_ok() {
            for (ptr, pinned) in self.live.drain() {
                let _ = release(ptr, pinned);
            }
        }
        // Otherwise the memory is leaked rather than freed under a running copy.
    }
}
