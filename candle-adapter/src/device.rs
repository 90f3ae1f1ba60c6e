//! The real device behind the placement model: recognising a device
//! out-of-memory error, evicting and retrying, and (CUDA) reading and trimming
//! the driver pool candle allocates from.
//!
//! ## What remat-alloc serves, and what it does not
//!
//! Candle allocates every storage through cudarc (`cuMemAllocAsync` on the
//! device's stream-ordered pool), with no allocator hook. So on CUDA:
//!
//! - **Not served by remat-alloc:** every real allocation. Candle's storages,
//!   its temporaries, gradients and cuBLAS workspaces come from the driver pool.
//! - **Served by remat-alloc:** the *placement model*, a caching allocator over a
//!   simulated device of the budget's size that places every adapter tensor as
//!   PyTorch's allocator would. Evictions are decided against that model, so
//!   fragmentation counts as it would under remat-alloc.
//! - **Kept honest by three mechanisms:**
//!   1. *Evict and retry:* an op that fails with `CUDA_ERROR_OUT_OF_MEMORY`
//!      (forward, rematerialization or backward) evicts policy-chosen storages
//!      and runs again, until it succeeds or nothing is evictable; then the
//!      error is [`remat_dtr::Error::DeviceOutOfMemory`] with the runtime's
//!      figures. This works on any backend ([`is_device_oom`] decides).
//!   2. *Calibration* ([`Remat::calibrate`], feature `cuda-pool`): reads the
//!      pool's used bytes, takes what the model does not see (gradients,
//!      escaped copies, other code), and lowers the runtime's eviction threshold
//!      to `budget − outside` so that the model plus the rest fit the budget.
//!   3. *Trimming* ([`Remat::empty_cache`], feature `cuda-pool`): waits for the
//!      device and returns the pool's cached bytes to the driver, the
//!      `torch.cuda.empty_cache()` of candle.
//!
//! Feature `cuda-pool` needs only cudarc's driver API (loaded at run time), not
//! candle's CUDA kernels, so it builds (and CI checks it) without nvcc; feature
//! `cuda` turns it on together with candle's CUDA backend.

use candle_core::DeviceLocation;
use remat_dtr::{DeviceOutOfMemory, ImpossibleBudget, Runtime};

use crate::cell::Cell;
use crate::context::Remat;
use crate::error::{Error, Result, Typed};

/// True when `e` is a device out-of-memory error: candle's CUDA error wrapping
/// the driver's `CUDA_ERROR_OUT_OF_MEMORY`, possibly inside context or
/// backtrace layers. Other errors (shape mismatches, kernels that fail to
/// launch) are not retried.
pub fn is_device_oom(e: &candle_core::Error) -> bool {
    match e {
        candle_core::Error::Cuda(inner) => {
            format!("{inner:?}").contains("CUDA_ERROR_OUT_OF_MEMORY")
        }
        candle_core::Error::WithBacktrace { inner, .. }
        | candle_core::Error::Context { inner, .. }
        | candle_core::Error::WithPath { inner, .. } => is_device_oom(inner),
        _ => false,
    }
}

/// Bytes the first eviction after a device OOM frees: the op's input bytes, at
/// least 1 MiB; each further retry doubles it.
const MIN_OOM_EVICTION: u64 = 1 << 20;

/// Run `f`; while it fails with a device OOM ([`is_device_oom`]), evict with
/// `recover(bytes)` and run it again. `recover` returns the bytes it freed, or
/// the runtime's figures when it could free nothing; then this gives up with
/// [`remat_dtr::Error::DeviceOutOfMemory`].
pub(crate) fn retry_on_device_oom<T>(
    op: &'static str,
    first_hint: u64,
    mut f: impl FnMut() -> candle_core::Result<T>,
    mut recover: impl FnMut(u64) -> Typed<std::result::Result<u64, ImpossibleBudget>>,
) -> Typed<T> {
    let mut hint = first_hint.max(MIN_OOM_EVICTION);
    let mut retries = 0u32;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if is_device_oom(&e) => {
                if let Err(figures) = recover(hint)? {
                    return Err(Error::Dtr(remat_dtr::Error::DeviceOutOfMemory(Box::new(
                        DeviceOutOfMemory {
                            op: op.to_string(),
                            message: e.to_string(),
                            retries,
                            figures,
                        },
                    ))));
                }
                retries += 1;
                hint = hint.saturating_mul(2);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The `recover` of [`retry_on_device_oom`] on a locked runtime.
pub(crate) fn evict_after_oom(
    rt: &mut Runtime<Cell>,
    hint: u64,
) -> Typed<std::result::Result<u64, ImpossibleBudget>> {
    let freed = rt.recover_from_device_oom(hint)?;
    Ok(if freed > 0 {
        Ok(freed)
    } else {
        Err(rt.memory_report(hint))
    })
}

/// The placement model next to the real device's pool, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceMemory {
    /// Bytes of resident adapter tensors (the model's live bytes).
    pub model_live: u64,
    /// Bytes the placement model has reserved (live plus cached blocks).
    pub model_reserved: u64,
    /// The budget, when there is one.
    pub budget: Option<u64>,
    /// The driver pool's live bytes (CUDA with feature `cuda-pool`; `None` on
    /// other devices).
    pub pool_used: Option<u64>,
    /// The driver pool's reserved bytes, live or cached.
    pub pool_reserved: Option<u64>,
    /// Live device bytes the model does not count: `pool_used − model_live`
    /// (gradients, escaped copies, memory of other code on the device).
    pub outside_model: Option<u64>,
    /// The eviction threshold in force after [`Remat::calibrate`] (`None`: none).
    pub threshold: Option<u64>,
}

impl Remat {
    /// The placement model's figures and, on a CUDA device with feature
    /// `cuda-pool`, the driver pool's.
    pub fn device_memory(&self, device: &candle_core::Device) -> Result<DeviceMemory> {
        let (live, reserved, threshold) = {
            let rt = self.inner.lock()?;
            let threshold = rt.config().threshold;
            (rt.stats().live_bytes, rt.memory_usage().reserved, threshold)
        };
        let mut m = DeviceMemory {
            model_live: live,
            model_reserved: reserved,
            budget: self.budget(),
            threshold,
            ..DeviceMemory::default()
        };
        if let Some((used, pool_reserved)) = pool_usage(device)? {
            m.pool_used = Some(used);
            m.pool_reserved = Some(pool_reserved);
            m.outside_model = Some(used.saturating_sub(live));
        }
        Ok(m)
    }

    /// Calibrate the placement model to the real device: on CUDA (feature
    /// `cuda-pool`), lower the eviction threshold to `budget − outside_model`
    /// (never above a threshold set in the configuration), so that before each
    /// op the runtime evicts until the model plus what it cannot see fit the
    /// budget. Call it between steps, when gradients and optimizer state are
    /// live. On the CPU, or without a budget, it changes nothing and reports
    /// the model's figures.
    pub fn calibrate(&self, device: &candle_core::Device) -> Result<DeviceMemory> {
        let mut m = self.device_memory(device)?;
        if let (Some(budget), Some(outside)) = (m.budget, m.outside_model) {
            let calibrated = budget.saturating_sub(outside);
            let threshold = match self.inner.configured_threshold {
                Some(t) => t.min(calibrated),
                None => calibrated,
            };
            self.inner.lock()?.set_threshold(Some(threshold));
            m.threshold = Some(threshold);
        }
        Ok(m)
    }

    /// Return the device pool's cached memory to the driver (CUDA with feature
    /// `cuda-pool`: synchronize, then `cuMemPoolTrimTo(0)`); the bytes released.
    /// On other devices there is no pool to trim: `Ok(0)`.
    pub fn empty_cache(&self, device: &candle_core::Device) -> Result<u64> {
        Ok(trim_pool(device)?)
    }
}

#[cfg(feature = "cuda-pool")]
fn open_pool(device: &candle_core::Device) -> Typed<Option<remat_alloc::CudaPool>> {
    match device.location() {
        DeviceLocation::Cuda { gpu_id } => {
            remat_alloc::CudaPool::open(gpu_id)
                .map(Some)
                .map_err(|e| Error::Unsupported {
                    op: "cuda pool",
                    message: e.to_string(),
                })
        }
        _ => Ok(None),
    }
}

#[cfg(feature = "cuda-pool")]
fn pool_usage(device: &candle_core::Device) -> Typed<Option<(u64, u64)>> {
    let Some(pool) = open_pool(device)? else {
        return Ok(None);
    };
    let u = pool.usage().map_err(|e| Error::Unsupported {
        op: "cuda pool",
        message: e.to_string(),
    })?;
    Ok(Some((u.used, u.reserved)))
}

#[cfg(feature = "cuda-pool")]
fn trim_pool(device: &candle_core::Device) -> Typed<u64> {
    let Some(pool) = open_pool(device)? else {
        return Ok(0);
    };
    pool.trim(0).map_err(|e| Error::Unsupported {
        op: "cuda pool",
        message: e.to_string(),
    })
}

#[cfg(not(feature = "cuda-pool"))]
fn pool_usage(device: &candle_core::Device) -> Typed<Option<(u64, u64)>> {
    match device.location() {
        DeviceLocation::Cuda { .. } => Err(Error::Unsupported {
            op: "cuda pool",
            message: "reading the CUDA pool needs remat-candle's `cuda-pool` feature".into(),
        }),
        _ => Ok(None),
    }
}

#[cfg(not(feature = "cuda-pool"))]
fn trim_pool(device: &candle_core::Device) -> Typed<u64> {
    pool_usage(device).map(|_| 0)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::sync::Arc;

    use candle_core::{Device, Tensor};

    use super::*;
    use crate::graph::apply;
    use crate::RTensor;

    /// What candle's CUDA backend returns for `CUDA_ERROR_OUT_OF_MEMORY`: a
    /// `candle_core::Error::Cuda` whose Debug is cudarc's `DriverError`.
    struct DriverError(&'static str, &'static str);
    impl std::fmt::Debug for DriverError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "DriverError({}, {:?})", self.0, self.1)
        }
    }
    impl std::fmt::Display for DriverError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }
    impl std::error::Error for DriverError {}

    fn cuda_oom() -> candle_core::Error {
        candle_core::Error::Cuda(Box::new(DriverError(
            "CUDA_ERROR_OUT_OF_MEMORY",
            "out of memory",
        )))
    }

    #[test]
    fn device_oom_is_recognised_through_wrappers_and_nothing_else_is() {
        assert!(is_device_oom(&cuda_oom()));
        assert!(is_device_oom(&cuda_oom().bt()));
        assert!(is_device_oom(&cuda_oom().context("in matmul")));
        let other = candle_core::Error::Cuda(Box::new(DriverError(
            "CUDA_ERROR_LAUNCH_FAILED",
            "unspecified launch failure",
        )));
        assert!(!is_device_oom(&other));
        assert!(!is_device_oom(&candle_core::Error::Msg(
            "CUDA_ERROR_OUT_OF_MEMORY".into()
        )));
    }

    /// `x.exp()` through the adapter, failing with a device OOM while `fail`
    /// is positive (forward, replay and backward alike).
    fn flaky_exp(x: &RTensor, fail: &Arc<AtomicU32>) -> crate::Result<RTensor> {
        let (f1, f2) = (fail.clone(), fail.clone());
        let fails =
            move |f: &AtomicU32| f.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok();
        apply(
            "flaky_exp",
            &[x],
            Arc::new(move |i: &[Tensor]| {
                if fails(&f1) {
                    return Err(cuda_oom());
                }
                i[0].exp()
            }),
            Arc::new(move |_: &[Tensor], o: Option<&Tensor>, g: &Tensor| {
                if fails(&f2) {
                    return Err(cuda_oom());
                }
                Ok(vec![Some(g.mul(o.expect("output pinned"))?)])
            }),
            true,
        )
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    #[test]
    fn forward_replay_and_backward_evict_and_retry_after_a_device_oom() {
        let remat = Remat::unbounded().unwrap();
        let x0 = Tensor::arange(0f32, 64., &Device::Cpu)
            .unwrap()
            .affine(0.01, 0.0)
            .unwrap();
        let var = candle_core::Var::from_tensor(&x0).unwrap();
        let x = remat.param(&var).unwrap();
        let a = x.tanh().unwrap();
        let b = a.sqr().unwrap();
        let fail = Arc::new(AtomicU32::new(1));
        let y = flaky_exp(&b, &fail).unwrap();
        let s = remat.stats().unwrap();
        assert_eq!(s.device_oom_retries, 1);
        assert!(s.evictions >= 1, "the retry should have evicted: {s}");
        let expect = bits(&x0.tanh().unwrap().sqr().unwrap().exp().unwrap());
        assert_eq!(bits(&y.to_candle().unwrap()), expect);

        // Replay: the runtime gets an out-of-memory OpError and retries, evicting
        // a bystander.
        let _z1 = x.sqr().unwrap();
        assert!(y.evict().unwrap());
        fail.store(1, SeqCst);
        assert_eq!(bits(&y.to_candle().unwrap()), expect);
        assert_eq!(remat.stats().unwrap().device_oom_retries, 2);

        // Backward: the vjp fails once, evicts, and gives candle's gradient.
        let _z2 = x.sqr().unwrap();
        fail.store(1, SeqCst);
        let grads = y.sum_all().unwrap().backward().unwrap();
        let g = grads.get(var.as_tensor()).unwrap();
        assert_eq!(remat.stats().unwrap().device_oom_retries, 3);
        let var2 = candle_core::Var::from_tensor(&x0).unwrap();
        let plain = var2
            .as_tensor()
            .tanh()
            .unwrap()
            .sqr()
            .unwrap()
            .exp()
            .unwrap();
        let g2 = plain.sum_all().unwrap().backward().unwrap();
        assert_eq!(bits(g), bits(g2.get(var2.as_tensor()).unwrap()));
        remat.check_invariants().unwrap();
    }

    #[test]
    fn a_device_oom_nothing_can_cure_is_a_typed_error() {
        let remat = Remat::unbounded().unwrap();
        let x = remat
            .input(&Tensor::ones(16, candle_core::DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        // Nothing recomputable is resident: the first eviction frees nothing.
        let fail = Arc::new(AtomicU32::new(u32::MAX));
        let err = flaky_exp(&x, &fail).unwrap_err();
        // Carried typed inside candle's error.
        match Error::downcast_ref(&err) {
            Some(Error::Dtr(remat_dtr::Error::DeviceOutOfMemory(e))) => {
                assert_eq!(e.op, "flaky_exp");
                assert_eq!(e.retries, 0);
                assert!(e.message.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{e}");
                assert_eq!(e.figures.not_recomputable, 64, "{e}");
            }
            _ => panic!("expected DeviceOutOfMemory, got {err}"),
        }
        assert_eq!(remat.stats().unwrap().device_oom_retries, 1);
        remat.check_invariants().unwrap();
    }

    #[test]
    fn cpu_devices_have_no_pool_and_calibration_changes_nothing() {
        let remat = Remat::new(crate::RematConfig::new().with_budget_bytes(1 << 20)).unwrap();
        let m = remat.calibrate(&Device::Cpu).unwrap();
        assert_eq!(m.pool_used, None);
        assert_eq!(m.outside_model, None);
        assert_eq!(m.threshold, None);
        assert_eq!(m.budget, Some(1 << 20));
        assert_eq!(remat.empty_cache(&Device::Cpu).unwrap(), 0);
    }
}
