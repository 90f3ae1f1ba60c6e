//! [`CudaPool`]: the stream-ordered memory pool of one GPU (the pool that
//! `cuMemAllocAsync` draws from), read and trimmed from outside the code that
//! allocates from it (feature `cuda`).
//!
//! Frameworks that allocate through cudarc (candle) or cubecl (burn-cuda) give
//! no allocator hook, so remat cannot serve their allocations from a
//! [`crate::CachingAllocator`]. What it can do is watch the pool they draw from
//! and give its unused memory back, which is what this type is for:
//!
//! | method | driver calls |
//! |---|---|
//! | [`CudaPool::open`] | `cuInit`, `cuDeviceGet`, `cuDeviceGetAttribute(MEMORY_POOLS_SUPPORTED)`, `cuDevicePrimaryCtxRetain` |
//! | [`CudaPool::usage`] | `cuDeviceGetMemPool` (the pool current *now*), `cuMemPoolGetAttribute(USED_MEM_CURRENT, RESERVED_MEM_CURRENT, USED_MEM_HIGH, RESERVED_MEM_HIGH)`, `cuMemGetInfo_v2` |
//! | [`CudaPool::trim`] | `cuCtxSynchronize` (frees queued on streams complete), `cuMemPoolTrimTo` |
//! | [`CudaPool::reset_peaks`] | `cuMemPoolSetAttribute(USED_MEM_HIGH, RESERVED_MEM_HIGH)` to 0 |
//!
//! The primary context is the one cudarc's `CudaContext::new` (and so candle)
//! uses; it is retained for the pool's lifetime and released on drop. As with
//! [`super::CudaDevice`], a missing driver or entry point is a
//! [`DeviceError::Unavailable`], never a panic.

use super::cuda::{bind, driver_error, open_driver};
use super::{DeviceError, MemInfo};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use std::ffi::c_void;

/// Every driver entry point a [`CudaPool`] calls.
const POOL_SYMBOLS: &[&str] = &[
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
    "cuDeviceGetMemPool",
    "cuMemPoolGetAttribute",
    "cuMemPoolSetAttribute",
    "cuMemPoolTrimTo",
    "cuMemGetInfo_v2",
];

/// The pool's byte counters at one moment (the driver's `CU_MEMPOOL_ATTR_*`),
/// with the device-wide free and total memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Bytes of live allocations from the pool (`USED_MEM_CURRENT`).
    pub used: u64,
    /// Bytes the pool holds from the device, used or cached
    /// (`RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// Peak of `used` since the pool was created or [`CudaPool::reset_peaks`].
    pub used_high: u64,
    /// Peak of `reserved` likewise.
    pub reserved_high: u64,
    /// Device-wide free bytes (`cuMemGetInfo`), all processes and pools.
    pub device_free: u64,
    /// Device total bytes.
    pub device_total: u64,
}

impl PoolUsage {
    /// Bytes the pool caches without a live allocation in them: what
    /// [`CudaPool::trim`] can give back.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.used)
    }
}

/// One GPU's current stream-ordered memory pool, observed from outside.
///
/// ```no_run
/// use remat_alloc::CudaPool;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = CudaPool::open(0)?; // Err(DeviceError::Unavailable) without a GPU
/// let before = pool.usage()?;
/// let released = pool.trim(0)?; // like torch.cuda.empty_cache()
/// println!("{} B used, {} B cached, {released} B returned", before.used, before.cached());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CudaPool {
    ordinal: usize,
    cu_device: sys::CUdevice,
    /// The device's primary context, retained by `open`, released on drop.
    ctx: sys::CUcontext,
}

// SAFETY: the fields are plain data and driver handles (a device and its
// primary context), which are process-wide; every method makes the context
// current on the calling thread before using it, and the driver's pool calls
// are thread-safe.
unsafe impl Send for CudaPool {}
// SAFETY: as for `Send`; no method mutates the struct, and concurrent pool
// queries and trims are serialised by the driver.
unsafe impl Sync for CudaPool {}

impl CudaPool {
    /// Opens GPU `ordinal`'s pool. [`DeviceError::Unavailable`] when the driver
    /// library or an entry point is missing, when there is no device `ordinal`,
    /// or when the device does not support memory pools (then allocations are
    /// synchronous `cuMemAlloc`s, which no pool counts: use
    /// [`super::Device::mem_info`]-style device figures instead).
    pub fn open(ordinal: usize) -> Result<Self, DeviceError> {
        let (cu_device, _) = open_driver(ordinal, POOL_SYMBOLS)?;
        let unavailable =
            |call: &str, e: DriverError| DeviceError::Unavailable(format!("{call} failed: {e}"));
        // SAFETY: `cu_device` was returned by `cuDeviceGet`.
        let pools = unsafe {
            result::device::get_attribute(
                cu_device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            )
        }
        .map_err(|e| unavailable("cuDeviceGetAttribute", e))?;
        if pools == 0 {
            return Err(DeviceError::Unavailable(format!(
                "CUDA device {ordinal} does not support memory pools (cuMemAllocAsync)"
            )));
        }
        // SAFETY: `cu_device` was returned by `cuDeviceGet`.
        let ctx = unsafe { result::primary_ctx::retain(cu_device) }
            .map_err(|e| unavailable("cuDevicePrimaryCtxRetain", e))?;
        Ok(CudaPool {
            ordinal,
            cu_device,
            ctx,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The pool the device allocates from now (`cuDeviceGetMemPool`: the
    /// default pool unless the application set another).
    fn pool(&self) -> Result<sys::CUmemoryPool, DeviceError> {
        bind(self.ctx)?;
        // SAFETY: `cu_device` was returned by `cuDeviceGet` in `open`.
        unsafe { result::device::get_mem_pool(self.cu_device) }
            .map_err(|e| driver_error("cuDeviceGetMemPool", e))
    }

    fn attribute(
        pool: sys::CUmemoryPool,
        attr: sys::CUmemPool_attribute,
    ) -> Result<u64, DeviceError> {
        let mut value: u64 = 0;
        // SAFETY: `pool` came from `cuDeviceGetMemPool`; the four byte-count
        // attributes read here are `cuuint64_t`, which `value` is.
        unsafe {
            result::mem_pool::get_attribute(pool, attr, &mut value as *mut u64 as *mut c_void)
        }
        .map_err(|e| driver_error("cuMemPoolGetAttribute", e))?;
        Ok(value)
    }

    /// The pool's counters and the device's free/total memory.
    pub fn usage(&self) -> Result<PoolUsage, DeviceError> {
        use sys::CUmemPool_attribute::*;
        let pool = self.pool()?;
        let (free, total) =
            result::mem_get_info().map_err(|e| driver_error("cuMemGetInfo_v2", e))?;
        Ok(PoolUsage {
            used: Self::attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            reserved: Self::attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used_high: Self::attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved_high: Self::attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            device_free: free as u64,
            device_total: total as u64,
        })
    }

    /// Wait for the device, then give the pool's cached memory back to the
    /// device until it holds at most `keep` bytes beyond its live allocations
    /// (`keep = 0`: the `torch.cuda.empty_cache()` of this pool). Returns the
    /// bytes released.
    pub fn trim(&self, keep: u64) -> Result<u64, DeviceError> {
        use sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
        let pool = self.pool()?;
        // Frees enqueued on streams return to the pool only when those streams
        // reach them.
        result::ctx::synchronize().map_err(|e| driver_error("cuCtxSynchronize", e))?;
        let before = Self::attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // SAFETY: `pool` came from `cuDeviceGetMemPool`.
        unsafe { result::mem_pool::trim_to(pool, keep) }
            .map_err(|e| driver_error("cuMemPoolTrimTo", e))?;
        let after = Self::attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        Ok(before.saturating_sub(after))
    }

    /// Reset the pool's high-water marks to the current values.
    pub fn reset_peaks(&self) -> Result<(), DeviceError> {
        use sys::CUmemPool_attribute::*;
        let pool = self.pool()?;
        for attr in [
            CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: `pool` came from `cuDeviceGetMemPool`; the high-water
            // attributes take a `cuuint64_t` that must be 0 (reset).
            unsafe {
                result::mem_pool::set_attribute(pool, attr, &mut zero as *mut u64 as *mut c_void)
            }
            .map_err(|e| driver_error("cuMemPoolSetAttribute", e))?;
        }
        Ok(())
    }

    /// The device's free and total memory as a [`MemInfo`].
    pub fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let u = self.usage()?;
        Ok(MemInfo {
            free: u.device_free as usize,
            total: u.device_total as usize,
        })
    }
}

impl Drop for CudaPool {
    fn drop(&mut self) {
        // SAFETY: the context was retained by `open` on this device; this is
        // its one matching release.
        let _ = unsafe { result::primary_ctx::release(self.cu_device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_driver_is_an_error_not_a_panic() {
        let driver_present = super::super::cuda::driver_library().is_some();
        let result = CudaPool::open(0);
        if driver_present {
            eprintln!("CUDA driver present: CudaPool::open(0) = {result:?}");
        } else {
            assert!(
                matches!(result, Err(DeviceError::Unavailable(_))),
                "expected Unavailable without libcuda, got {result:?}"
            );
        }
    }

    #[test]
    fn out_of_range_ordinals_are_errors() {
        assert!(CudaPool::open(usize::MAX).is_err());
        assert!(CudaPool::open(1 << 20).is_err());
    }

    #[test]
    fn cached_is_reserved_minus_used() {
        let u = PoolUsage {
            used: 3,
            reserved: 10,
            ..PoolUsage::default()
        };
        assert_eq!(u.cached(), 7);
        assert_eq!(PoolUsage::default().cached(), 0);
    }
}
