//! [`CudaDevice`]: the CUDA driver API through cudarc (`cudarc::driver::{result, sys}`),
//! loaded at run time (feature `cuda`).
//!
//! What the driver serves, call by call:
//!
//! | [`Device`] / [`VirtualMemory`] method | driver calls |
//! |---|---|
//! | [`CudaDevice::new`] | `cuInit`, `cuDeviceGet`, `cuDevicePrimaryCtxRetain`, `cuCtxSetCurrent`, `cuDeviceGetAttribute(VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)`, `cuMemGetAllocationGranularity` |
//! | `allocate` / `free` | `cuMemAlloc_v2` / `cuMemFree_v2` (one call per segment) |
//! | `mem_info` | `cuMemGetInfo_v2` |
//! | streams | [`StreamId::DEFAULT`] is the legacy default (null) stream; any other id gets a non-blocking stream (`cuStreamCreate`) on first use, kept until the device is dropped ([`CudaDevice::raw_stream`] hands it out for launching work) |
//! | `record_event` / `query_event` / `synchronize_event` / `destroy_event` | `cuEventCreate(DISABLE_TIMING)` (events are pooled and reused), `cuEventRecord`, `cuEventQuery` (`NOT_READY` → `false`), `cuEventSynchronize`, `cuEventDestroy_v2` on drop |
//! | `reserve` / `release` | `cuMemAddressReserve` / `cuMemAddressFree` |
//! | `map` | per page: `cuMemCreate` (pinned device memory on this device) + `cuMemMap`; then `cuMemSetAccess` (read-write for this device) over the range |
//! | `unmap` | `cuCtxSynchronize` (an unmap does not wait for queued work), then per page `cuMemUnmap` + `cuMemRelease` |
//!
//! The device's primary context is made current on the calling thread before
//! every group of driver calls, so the device may be used from any thread (one
//! at a time: every method takes `&mut self`).
//!
//! **No driver.** cudarc (loading dynamically, the workspace's setting) panics
//! on first use when `libcuda` cannot be loaded, and when a symbol is missing.
//! [`CudaDevice::new`] therefore first loads the driver library itself
//! (`libloading`, the names cudarc tries), checks that every driver entry point
//! this module calls is exported, and only then calls the driver; each failure
//! is a [`DeviceError::Unavailable`], never a panic. The check does not depend
//! on how cudarc links the driver: when another crate in the build (candle)
//! turns on cudarc's `dynamic-linking`, the program links `libcuda` at start
//! and the same checks still run.
//!
//! Virtual memory ([`Device::virtual_memory`]) is offered only when the device
//! reports `CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED` (the
//! attribute once called `…_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`) and the VMM
//! entry points are present.

use super::{Device, DeviceError, DevicePtr, EventId, MemInfo, StreamId, VirtualMemory};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::fmt;
use std::sync::OnceLock;

/// Driver entry points every [`CudaDevice`] calls; all must be exported by
/// `libcuda` before any is called (cudarc panics on a missing symbol).
const CORE_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// Driver entry points of the virtual-memory path; when one is missing the
/// device simply offers no [`VirtualMemory`].
const VMM_SYMBOLS: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// Most unused events kept for reuse; further destroyed events are released.
const MAX_SPARE_EVENTS: usize = 1024;

/// A [`Device`] on one CUDA GPU, through the driver API (see the module doc for
/// the exact calls).
///
/// ```no_run
/// use remat_alloc::{AllocatorConfig, CachingAllocator, CudaDevice, StreamId};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let device = CudaDevice::new(0)?; // Err(DeviceError::Unavailable) without a GPU
/// let alloc = CachingAllocator::new(device, AllocatorConfig::default())?;
/// let a = alloc.malloc(1 << 20, StreamId::DEFAULT)?;
/// alloc.free(a)?;
/// # Ok(()) }
/// ```
pub struct CudaDevice {
    /// Device ordinal, as passed to [`CudaDevice::new`].
    ordinal: usize,
    /// The driver's handle for `ordinal`.
    cu_device: sys::CUdevice,
    /// The device's primary context, retained by `new` and released on drop.
    ctx: sys::CUcontext,
    /// Live segments from `cuMemAlloc_v2`: base address → size in bytes.
    segments: BTreeMap<DevicePtr, usize>,
    /// Streams created for non-default [`StreamId`]s, destroyed on drop. Never
    /// holds [`StreamId::DEFAULT`] (the null stream).
    streams: HashMap<StreamId, sys::CUstream>,
    /// Recorded, not yet destroyed events by id.
    events: HashMap<u64, sys::CUevent>,
    /// Created events no id refers to any more, reused by `record_event`; at
    /// most [`MAX_SPARE_EVENTS`].
    spare_events: Vec<sys::CUevent>,
    /// Next event id; ids are never reused.
    next_event: u64,
    /// Present iff the device supports virtual memory management.
    vmm: Option<CudaVmm>,
}

// SAFETY: every field is either plain data or a CUDA driver handle (context,
// stream, event, memory handle, device address). Driver handles are
// process-wide, not tied to the thread that created them: any thread may use
// them once the owning context is current there, and every method (and `Drop`)
// makes the primary context current first. `CudaDevice` is not `Sync`, and all
// its methods take `&mut self`, so the handles are never used by two threads
// at once through it.
unsafe impl Send for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("segments", &self.segments.len())
            .field("streams", &self.streams.len())
            .field("events", &self.events.len())
            .field("vmm_granularity", &self.vmm.as_ref().map(|v| v.granularity))
            .finish()
    }
}

/// A driver error as a [`DeviceError::Other`] naming the call.
pub(crate) fn driver_error(call: &str, e: DriverError) -> DeviceError {
    DeviceError::Other(format!("{call} failed: {e}"))
}

/// As [`driver_error`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes
/// [`DeviceError::OutOfMemory`] so the allocator frees cache and retries.
fn alloc_error(call: &str, e: DriverError, requested: usize) -> DeviceError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DeviceError::OutOfMemory { requested }
    } else {
        driver_error(call, e)
    }
}

/// Makes `ctx` current on the calling thread unless it already is.
pub(crate) fn bind(ctx: sys::CUcontext) -> Result<(), DeviceError> {
    match result::ctx::get_current() {
        Ok(Some(current)) if current == ctx => Ok(()),
        _ => {
            // SAFETY: `ctx` is a primary context retained by `CudaDevice::new`
            // and not released before the device is dropped.
            unsafe { result::ctx::set_current(ctx) }.map_err(|e| driver_error("cuCtxSetCurrent", e))
        }
    }
}

/// The CUDA driver library, or `None` when no candidate name loads.
///
/// Loaded here rather than through cudarc: cudarc's own loader (`sys::culib`)
/// exists only when cudarc is built for dynamic loading, and candle builds it
/// with `dynamic-linking`, where the driver is linked at program start. Either
/// way this finds the same library and lets every entry point be checked
/// before cudarc calls (and, when loading dynamically, panics on) a missing one.
pub(super) fn driver_library() -> Option<&'static libloading::Library> {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    static LIB: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIB.get_or_init(|| {
        let names = [
            format!("{DLL_PREFIX}cuda{DLL_SUFFIX}"),
            format!("{DLL_PREFIX}cuda{DLL_SUFFIX}.1"),
            format!("{DLL_PREFIX}nvcuda{DLL_SUFFIX}"),
        ];
        names.iter().find_map(|name| {
            // SAFETY: loading the driver library runs its initialisers, which is
            // how cudarc loads it too; nothing else is called here.
            unsafe { libloading::Library::new(name) }.ok()
        })
    })
    .as_ref()
}

/// The first of `names` that the driver library does not export (all of them
/// when there is no driver library).
pub(crate) fn first_missing_symbol(names: &[&'static str]) -> Option<&'static str> {
    let Some(lib) = driver_library() else {
        return names.first().copied();
    };
    names.iter().copied().find(|&name| {
        // SAFETY: the symbol is only looked up, never called or dereferenced
        // through this type, so the pointer type is irrelevant.
        unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_err()
    })
}

/// Load the driver, check that it exports every one of `symbols`, `cuInit`
/// and `cuDeviceGet(ordinal)`: the device handle and the ordinal as a C int.
/// Every failure is a [`DeviceError::Unavailable`] naming it, never a panic.
pub(super) fn open_driver(
    ordinal: usize,
    symbols: &[&'static str],
) -> Result<(sys::CUdevice, c_int), DeviceError> {
    if driver_library().is_none() {
        return Err(DeviceError::Unavailable(
            "the CUDA driver library (libcuda) could not be loaded".into(),
        ));
    }
    if let Some(name) = first_missing_symbol(symbols) {
        return Err(DeviceError::Unavailable(format!(
            "the CUDA driver library does not export {name} (driver too old?)"
        )));
    }
    let unavailable =
        |call: &str, e: DriverError| DeviceError::Unavailable(format!("{call} failed: {e}"));
    result::init().map_err(|e| unavailable("cuInit", e))?;
    let ordinal_c = c_int::try_from(ordinal)
        .map_err(|_| DeviceError::Unavailable(format!("no CUDA device {ordinal}")))?;
    let cu_device = result::device::get(ordinal_c).map_err(|e| unavailable("cuDeviceGet", e))?;
    Ok((cu_device, ordinal_c))
}

/// `CUmemLocation` as C declares it: `{ CUmemLocationType type; int id; }`.
/// cudarc's bindings name `id` differently across CUDA versions (a plain field
/// up to 13.1, a union member since 13.2), so the value is built here and
/// transmuted.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    type_: sys::CUmemLocationType,
    id: c_int,
}

const _: () =
    assert!(std::mem::align_of::<MemLocation>() == std::mem::align_of::<sys::CUmemLocation>());

/// The location "device `ordinal`".
fn device_location(ordinal: c_int) -> sys::CUmemLocation {
    let loc = MemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    };
    // SAFETY: both types are `repr(C)` with the C layout of `CUmemLocation`
    // (an enum followed by a 4-byte `int`, or a 4-byte union whose `int id`
    // member is at offset 0); `transmute` checks at compile time that the
    // sizes agree, and the assertion above checks the alignment. Every field
    // of the target is plain data, and we write a valid enum value and `id`.
    unsafe { std::mem::transmute::<MemLocation, sys::CUmemLocation>(loc) }
}

impl CudaDevice {
    /// Opens GPU `ordinal`: loads the driver, `cuInit`, retains the device's
    /// primary context and makes it current on this thread.
    ///
    /// Returns [`DeviceError::Unavailable`] (never panics) when the driver
    /// library is missing or too old, when `cuInit` fails (e.g. no GPU) or when
    /// there is no device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, DeviceError> {
        let (cu_device, ordinal_c) = open_driver(ordinal, CORE_SYMBOLS)?;
        let unavailable =
            |call: &str, e: DriverError| DeviceError::Unavailable(format!("{call} failed: {e}"));
        // SAFETY: `cu_device` was returned by `cuDeviceGet`.
        let ctx = unsafe { result::primary_ctx::retain(cu_device) }
            .map_err(|e| unavailable("cuDevicePrimaryCtxRetain", e))?;
        let mut device = CudaDevice {
            ordinal,
            cu_device,
            ctx,
            segments: BTreeMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            spare_events: Vec::new(),
            next_event: 1,
            vmm: None,
        };
        // From here on `Drop` releases the context on every error path.
        bind(ctx)?;
        device.vmm = CudaVmm::probe(ctx, cu_device, ordinal_c);
        Ok(device)
    }

    /// The driver's device handle.
    pub fn cu_device(&self) -> sys::CUdevice {
        self.cu_device
    }

    /// The device's primary context (retained for the life of this device).
    pub fn cu_context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// The granularity (bytes) virtual-memory pages must be multiples of, or
    /// `None` when the device offers no virtual memory.
    pub fn vmm_granularity(&self) -> Option<usize> {
        self.vmm.as_ref().map(|v| v.granularity)
    }

    /// The driver stream behind `stream`, for launching work on it: the null
    /// stream for [`StreamId::DEFAULT`], otherwise a non-blocking stream
    /// created on first use and owned by this device (destroyed when it is
    /// dropped, so do not destroy it yourself).
    pub fn raw_stream(&mut self, stream: StreamId) -> Result<sys::CUstream, DeviceError> {
        bind(self.ctx)?;
        self.stream_handle(stream)
    }

    /// Blocks until all work queued on this device's context has finished
    /// (`cuCtxSynchronize`).
    pub fn synchronize(&mut self) -> Result<(), DeviceError> {
        bind(self.ctx)?;
        result::ctx::synchronize().map_err(|e| driver_error("cuCtxSynchronize", e))
    }

    /// Copies `data` to device memory at `[ptr, ptr + data.len())`
    /// (`cuMemcpyHtoD_v2`), which must lie inside one live segment or inside
    /// consecutive mapped virtual-memory pages ([`DeviceError::InvalidPointer`]
    /// otherwise). The copy is ordered on the default stream only: synchronize
    /// work on other streams that uses the range first.
    pub fn write_bytes(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), DeviceError> {
        self.check_accessible(ptr, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        bind(self.ctx)?;
        // SAFETY: the destination range is live device memory of this context
        // (checked above); `data` is a live host slice read synchronously.
        unsafe { result::memcpy_htod_sync(ptr, data) }
            .map_err(|e| driver_error("cuMemcpyHtoD_v2", e))
    }

    /// Reads `len` bytes of device memory at `[ptr, ptr + len)`
    /// (`cuMemcpyDtoH_v2`), which must lie inside one live segment or inside
    /// consecutive mapped virtual-memory pages ([`DeviceError::InvalidPointer`]
    /// otherwise). Ordered on the default stream only, as
    /// [`CudaDevice::write_bytes`].
    pub fn read_bytes(&mut self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, DeviceError> {
        self.check_accessible(ptr, len)?;
        let mut out = vec![0u8; len];
        if len == 0 {
            return Ok(out);
        }
        bind(self.ctx)?;
        // SAFETY: the source range is live device memory of this context
        // (checked above); `out` is a host buffer of exactly `len` bytes,
        // written synchronously.
        unsafe { result::memcpy_dtoh_sync(&mut out, ptr) }
            .map_err(|e| driver_error("cuMemcpyDtoH_v2", e))?;
        Ok(out)
    }

    /// Checks that `[ptr, ptr + len)` lies inside one live segment or inside
    /// consecutive mapped pages; `ptr` itself must be inside even if `len == 0`.
    fn check_accessible(&self, ptr: DevicePtr, len: usize) -> Result<(), DeviceError> {
        let invalid = DeviceError::InvalidPointer { ptr };
        let end = ptr.checked_add(len as u64).ok_or(invalid.clone())?;
        if let Some((&base, &size)) = self.segments.range(..=ptr).next_back() {
            let seg_end = base + size as u64;
            if ptr < seg_end && end <= seg_end {
                return Ok(());
            }
        }
        match &self.vmm {
            Some(vmm) if vmm.is_mapped(ptr, end) => Ok(()),
            _ => Err(invalid),
        }
    }

    /// The stream for `stream`, creating it if needed. The context must be
    /// current.
    fn stream_handle(&mut self, stream: StreamId) -> Result<sys::CUstream, DeviceError> {
        if stream == StreamId::DEFAULT {
            return Ok(result::stream::null());
        }
        if let Some(&s) = self.streams.get(&stream) {
            return Ok(s);
        }
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        self.streams.insert(stream, s);
        Ok(s)
    }

    /// The event behind `event`, or [`DeviceError::InvalidEvent`].
    fn event_handle(&self, event: EventId) -> Result<sys::CUevent, DeviceError> {
        self.events
            .get(&event.0)
            .copied()
            .ok_or(DeviceError::InvalidEvent(event))
    }
}

impl Device for CudaDevice {
    fn kind(&self) -> &'static str {
        "CUDA"
    }

    fn index(&self) -> usize {
        self.ordinal
    }

    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Other(
                "cannot allocate a zero-size CUDA segment".into(),
            ));
        }
        bind(self.ctx)?;
        // SAFETY: the context is current; the returned memory is uninitialised
        // device memory, which the allocator only hands out by address.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| alloc_error("cuMemAlloc_v2", e, bytes))?;
        self.segments.insert(ptr, bytes);
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        let &size = self
            .segments
            .get(&ptr)
            .ok_or(DeviceError::InvalidPointer { ptr })?;
        if size != bytes {
            return Err(DeviceError::Other(format!(
                "CUDA segment {ptr:#x} freed with size {bytes}, but it has {size} bytes"
            )));
        }
        bind(self.ctx)?;
        // SAFETY: `ptr` came from `cuMemAlloc_v2` on this context and is still
        // live (it is in `segments`); it is removed below, so it is freed once.
        // `cuMemFree` synchronizes with work still using the memory.
        unsafe { result::free_sync(ptr) }.map_err(|e| driver_error("cuMemFree_v2", e))?;
        self.segments.remove(&ptr);
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        bind(self.ctx)?;
        let (free, total) =
            result::mem_get_info().map_err(|e| driver_error("cuMemGetInfo_v2", e))?;
        Ok(MemInfo { free, total })
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        bind(self.ctx)?;
        let s = self.stream_handle(stream)?;
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| driver_error("cuEventCreate", e))?,
        };
        // SAFETY: `event` was created by `cuEventCreate` on this context and is
        // not destroyed; `s` is the null stream or a live stream of this context.
        if let Err(e) = unsafe { result::event::record(event, s) } {
            self.spare_events.push(event);
            return Err(driver_error("cuEventRecord", e));
        }
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, event);
        Ok(EventId(id))
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        let e = self.event_handle(event)?;
        bind(self.ctx)?;
        // SAFETY: `e` is a live event of this context (it is in `events`).
        match unsafe { result::event::query(e) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(err) => Err(driver_error("cuEventQuery", err)),
        }
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        let e = self.event_handle(event)?;
        bind(self.ctx)?;
        // SAFETY: `e` is a live event of this context (it is in `events`).
        unsafe { result::event::synchronize(e) }
            .map_err(|err| driver_error("cuEventSynchronize", err))
    }

    fn destroy_event(&mut self, event: EventId) {
        let Some(e) = self.events.remove(&event.0) else {
            return;
        };
        if self.spare_events.len() < MAX_SPARE_EVENTS {
            // Re-recording an event is allowed even before it completed.
            self.spare_events.push(e);
        } else if bind(self.ctx).is_ok() {
            // SAFETY: `e` was live and no id refers to it any more. Destroying
            // an incomplete event is allowed: the driver frees it on completion.
            let _ = unsafe { result::event::destroy(e) };
        }
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        match self.vmm.as_mut() {
            Some(vmm) => Some(vmm),
            None => None,
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Errors are ignored: at process exit the driver may already be shut
        // down (CUDA_ERROR_DEINITIALIZED), and there is no one to report to.
        if bind(self.ctx).is_ok() {
            let _ = result::ctx::synchronize();
            for (_, e) in self.events.drain() {
                // SAFETY: live event of this context, destroyed once (drained).
                let _ = unsafe { result::event::destroy(e) };
            }
            for e in self.spare_events.drain(..) {
                // SAFETY: live event of this context, destroyed once (drained).
                let _ = unsafe { result::event::destroy(e) };
            }
            if let Some(vmm) = self.vmm.as_mut() {
                vmm.release_all();
            }
            for (ptr, _) in std::mem::take(&mut self.segments) {
                // SAFETY: live allocation of this context, freed once (drained);
                // the context was synchronized above.
                let _ = unsafe { result::free_sync(ptr) };
            }
            for (_, s) in self.streams.drain() {
                // SAFETY: stream created by `cuStreamCreate` on this context,
                // destroyed once (drained).
                let _ = unsafe { result::stream::destroy(s) };
            }
        }
        // SAFETY: `cu_device` came from `cuDeviceGet`, and `new` retained its
        // primary context exactly once.
        let _ = unsafe { result::primary_ctx::release(self.cu_device) };
    }
}

/// One reservation made by [`VirtualMemory::reserve`].
#[derive(Debug, Clone, Copy)]
struct Reservation {
    /// Bytes the caller asked for (and passes back to `release`).
    requested: usize,
    /// Bytes reserved: `requested` rounded up to the granularity.
    reserved: usize,
}

/// One mapped page.
#[derive(Debug, Clone, Copy)]
struct Page {
    /// The physical allocation from `cuMemCreate`, released on unmap.
    handle: sys::CUmemGenericAllocationHandle,
    /// Page size in bytes (the `page_size` it was mapped with).
    size: usize,
}

/// The virtual-memory half of [`CudaDevice`] (CUDA VMM).
struct CudaVmm {
    /// The device's primary context, made current before each call.
    ctx: sys::CUcontext,
    /// `cuMemGetAllocationGranularity(MINIMUM)` for `prop`; page sizes and
    /// reservations are multiples of it.
    granularity: usize,
    /// Pinned device memory on this device, no shareable handle type.
    prop: sys::CUmemAllocationProp,
    /// Read-write access for this device.
    access: sys::CUmemAccessDesc,
    /// Live reservations by base address; they never overlap.
    reservations: BTreeMap<DevicePtr, Reservation>,
    /// Mapped pages by start address; each lies inside one reservation, and
    /// they never overlap.
    pages: BTreeMap<DevicePtr, Page>,
}

impl CudaVmm {
    /// The VMM interface of `cu_device`, or `None` when the device or driver
    /// does not support it. The context must be current.
    fn probe(ctx: sys::CUcontext, cu_device: sys::CUdevice, ordinal: c_int) -> Option<CudaVmm> {
        if first_missing_symbol(VMM_SYMBOLS).is_some() {
            return None;
        }
        let attr =
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
        // SAFETY: `cu_device` came from `cuDeviceGet`.
        let supported = unsafe { result::device::get_attribute(cu_device, attr) }.ok()?;
        if supported == 0 {
            return None;
        }
        let location = device_location(ordinal);
        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location,
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        };
        let access = sys::CUmemAccessDesc {
            location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut granularity = 0usize;
        // SAFETY: both pointers are to live locals; `prop` is fully initialised.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || granularity == 0 {
            return None;
        }
        Some(CudaVmm {
            ctx,
            granularity,
            prop,
            access,
            reservations: BTreeMap::new(),
            pages: BTreeMap::new(),
        })
    }

    /// Checks that `[va, va + bytes)` is a whole number of `page_size` pages,
    /// page aligned relative to its reservation and inside it; returns the
    /// number of pages.
    fn check_range(
        &self,
        va: DevicePtr,
        bytes: usize,
        page_size: usize,
    ) -> Result<usize, DeviceError> {
        let bad = |why: String| {
            DeviceError::Other(format!("virtual memory range {va:#x}+{bytes}: {why}"))
        };
        if page_size == 0 || page_size % self.granularity != 0 {
            return Err(bad(format!(
                "page size {page_size} is not a multiple of the granularity {}",
                self.granularity
            )));
        }
        if bytes % page_size != 0 {
            return Err(bad(format!("not a whole number of {page_size}-byte pages")));
        }
        let (&base, res) = self
            .reservations
            .range(..=va)
            .next_back()
            .ok_or_else(|| bad("not in a reservation".into()))?;
        let offset = va - base;
        let end = offset.checked_add(bytes as u64);
        if end.is_none_or(|end| end > res.reserved as u64) {
            return Err(bad("not inside one reservation".into()));
        }
        if offset % page_size as u64 != 0 {
            return Err(bad(format!(
                "not {page_size}-aligned relative to its reservation at {base:#x}"
            )));
        }
        Ok(bytes / page_size)
    }

    /// True if every byte of `[start, end)` (and `start` itself, even when the
    /// range is empty) lies in a mapped page.
    fn is_mapped(&self, start: DevicePtr, end: DevicePtr) -> bool {
        let mut cur = start;
        loop {
            match self.pages.range(..=cur).next_back() {
                Some((&p, page)) if cur < p + page.size as u64 => cur = p + page.size as u64,
                _ => return false,
            }
            if cur >= end {
                return true;
            }
        }
    }

    /// Maps `n` pages of `page_size` at `va`, pushing each mapped page to
    /// `done`; stops at the first failure. The context must be current.
    fn map_pages(
        &self,
        va: DevicePtr,
        n: usize,
        page_size: usize,
        done: &mut Vec<(DevicePtr, Page)>,
    ) -> Result<(), DeviceError> {
        for i in 0..n {
            let page_va = va + (i * page_size) as u64;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `handle` and `self.prop` are live; `prop` is fully
            // initialised and `page_size` is a multiple of its granularity.
            unsafe { sys::cuMemCreate(&mut handle, page_size, &self.prop, 0) }
                .result()
                .map_err(|e| alloc_error("cuMemCreate", e, n * page_size))?;
            // SAFETY: `[page_va, page_va + page_size)` lies in a live
            // reservation (checked by `check_range`) and nothing is mapped
            // there (checked by `map`); `handle` is a fresh allocation of
            // exactly `page_size` bytes.
            if let Err(e) = unsafe { sys::cuMemMap(page_va, page_size, 0, handle, 0) }.result() {
                // SAFETY: `handle` is unmapped and released once, here.
                let _ = unsafe { sys::cuMemRelease(handle) };
                return Err(alloc_error("cuMemMap", e, n * page_size));
            }
            done.push((
                page_va,
                Page {
                    handle,
                    size: page_size,
                },
            ));
        }
        // SAFETY: the whole range was just mapped; `self.access` is live and
        // describes one device.
        unsafe { sys::cuMemSetAccess(va, n * page_size, &self.access, 1) }
            .result()
            .map_err(|e| driver_error("cuMemSetAccess", e))
    }

    /// Unmaps one page and releases its memory. The context must be current.
    fn unmap_page(va: DevicePtr, page: Page) -> Result<(), DeviceError> {
        // SAFETY: `page` is mapped at `va` (it comes from `pages` or from a
        // `map_pages` in progress) and no queued work uses it any more (the
        // callers synchronize or never exposed the range).
        unsafe { sys::cuMemUnmap(va, page.size) }
            .result()
            .map_err(|e| driver_error("cuMemUnmap", e))?;
        // SAFETY: the handle's only mapping was just removed; released once.
        unsafe { sys::cuMemRelease(page.handle) }
            .result()
            .map_err(|e| driver_error("cuMemRelease", e))
    }

    /// Unmaps every page and frees every reservation (device drop). The
    /// context must be current and synchronized.
    fn release_all(&mut self) {
        for (va, page) in std::mem::take(&mut self.pages) {
            let _ = Self::unmap_page(va, page);
        }
        for (va, res) in std::mem::take(&mut self.reservations) {
            // SAFETY: a live reservation of `res.reserved` bytes, nothing mapped.
            let _ = unsafe { sys::cuMemAddressFree(va, res.reserved) };
        }
    }
}

impl VirtualMemory for CudaVmm {
    fn reserve(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Other(
                "cannot reserve zero bytes of address space".into(),
            ));
        }
        let reserved = bytes
            .div_ceil(self.granularity)
            .checked_mul(self.granularity)
            .ok_or(DeviceError::OutOfMemory { requested: bytes })?;
        bind(self.ctx)?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: `va` is a live local; a size that is a multiple of the
        // granularity, default alignment, no fixed address, no flags.
        unsafe { sys::cuMemAddressReserve(&mut va, reserved, 0, 0, 0) }
            .result()
            .map_err(|e| alloc_error("cuMemAddressReserve", e, bytes))?;
        self.reservations.insert(
            va,
            Reservation {
                requested: bytes,
                reserved,
            },
        );
        Ok(va)
    }

    fn map(&mut self, va: DevicePtr, bytes: usize, page_size: usize) -> Result<(), DeviceError> {
        let n = self.check_range(va, bytes, page_size)?;
        if n == 0 {
            return Ok(());
        }
        let end = va + bytes as u64;
        let overlaps_before = self
            .pages
            .range(..va)
            .next_back()
            .is_some_and(|(&p, page)| p + page.size as u64 > va);
        if overlaps_before || self.pages.range(va..end).next().is_some() {
            return Err(DeviceError::Other(format!(
                "virtual memory range {va:#x}+{bytes}: already (partly) mapped"
            )));
        }
        bind(self.ctx)?;
        let mut done = Vec::with_capacity(n);
        match self.map_pages(va, n, page_size, &mut done) {
            Ok(()) => {
                self.pages.extend(done);
                Ok(())
            }
            Err(e) => {
                // Undo in reverse order: on failure nothing stays mapped.
                for (page_va, page) in done.into_iter().rev() {
                    let _ = Self::unmap_page(page_va, page);
                }
                Err(e)
            }
        }
    }

    fn unmap(&mut self, va: DevicePtr, bytes: usize, page_size: usize) -> Result<(), DeviceError> {
        let n = self.check_range(va, bytes, page_size)?;
        for i in 0..n {
            let page_va = va + (i * page_size) as u64;
            if self.pages.get(&page_va).is_none_or(|p| p.size != page_size) {
                return Err(DeviceError::Other(format!(
                    "virtual memory page {page_va:#x} (size {page_size}) is not mapped"
                )));
            }
        }
        if n == 0 {
            return Ok(());
        }
        bind(self.ctx)?;
        // cuMemUnmap does not wait for queued work that may still use the
        // pages (PyTorch synchronizes the stream here too).
        result::ctx::synchronize().map_err(|e| driver_error("cuCtxSynchronize", e))?;
        let mut first_error = None;
        for i in 0..n {
            let page_va = va + (i * page_size) as u64;
            let Some(page) = self.pages.remove(&page_va) else {
                continue;
            };
            if let Err(e) = Self::unmap_page(page_va, page) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn release(&mut self, va: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        let res = match self.reservations.get(&va) {
            Some(res) if res.requested == bytes => *res,
            _ => {
                return Err(DeviceError::InvalidPointer { ptr: va });
            }
        };
        let end = va + res.reserved as u64;
        if self.pages.range(va..end).next().is_some() {
            return Err(DeviceError::Other(format!(
                "virtual memory reservation {va:#x} released while pages are still mapped"
            )));
        }
        bind(self.ctx)?;
        // SAFETY: a live reservation of `res.reserved` bytes with nothing mapped.
        unsafe { sys::cuMemAddressFree(va, res.reserved) }
            .result()
            .map_err(|e| driver_error("cuMemAddressFree", e))?;
        self.reservations.remove(&va);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_without_a_driver_is_an_error_not_a_panic() {
        let driver_present = driver_library().is_some();
        let result = CudaDevice::new(0);
        if driver_present {
            eprintln!(
                "CUDA driver present: CudaDevice::new(0) = {:?}",
                result.as_ref().map(|_| ())
            );
        } else {
            assert!(
                matches!(result, Err(DeviceError::Unavailable(_))),
                "expected Unavailable without libcuda, got {result:?}"
            );
        }
    }

    #[test]
    fn out_of_range_ordinals_are_errors() {
        assert!(CudaDevice::new(usize::MAX).is_err());
        assert!(CudaDevice::new(1 << 20).is_err());
    }

    #[test]
    fn device_location_has_the_c_layout() {
        let loc = device_location(3);
        // SAFETY: the inverse of the transmute in `device_location` (same size
        // and alignment, checked at compile time).
        let back = unsafe { std::mem::transmute::<sys::CUmemLocation, MemLocation>(loc) };
        assert_eq!(
            back.type_,
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        assert_eq!(back.id, 3);
        assert_eq!(std::mem::size_of::<sys::CUmemLocation>(), 8);
    }

    #[test]
    fn cuda_device_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<CudaDevice>();
    }
}
