//! The host tier of a DTR device (issue 33): the runtime may **swap** a
//! storage — copy its bytes to host memory and drop the inner tensor — instead
//! of evicting it for recomputation, when the two copies cost less than the
//! replay, and it swaps parameters, inputs and optimizer state (which cannot be
//! recomputed) between their uses (see [`remat_dtr::swap`]).
//!
//! [`HostCopies`] is the adapter's [`HostTransfer`]: a swap-out reads the
//! resident inner tensor into a [`TensorData`] (`B::*_into_data`, awaited:
//! on CUDA a device-to-host copy that has completed when the call returns),
//! a swap-in registers that data again under the same burn tensor id
//! (`B::*_from_data` on the inner device). Float, int and bool primitives of
//! every dtype round-trip bit for bit: `TensorData` keeps the dtype and the
//! bytes. Quantized tensors are refused with a [`TransferError`] (burn-router
//! 0.22's interpreter cannot register them from data); a refused swap-out leaves
//! the value resident.
//!
//! [`SwapFaults`] is the test hook that makes the next copies fail.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use burn_backend::{DType, TensorData};
use burn_ir::{BackendIr, TensorIr, TensorStatus};
use remat_dtr::{HostTransfer, HostValue, TransferError};

use crate::op::{Resident, Shared};

/// Makes the next copies to or from the host tier fail, for tests of the
/// failure paths: give a clone to [`DtrOptions::with_swap_faults`] and keep
/// one to arm it. Only copies of the device it was given to fail, and not the
/// bandwidth probe.
///
/// A failed swap-out leaves the value resident (the runtime evicts another
/// victim or this one for recomputation, and the run goes on bit-identically);
/// a failed swap-in is a typed [`remat_dtr::Error::Transfer`] for the op or
/// read that needed the value, the host copy is kept and a later use copies it
/// back.
///
/// [`DtrOptions::with_swap_faults`]: crate::DtrOptions::with_swap_faults
#[derive(Debug, Clone, Default)]
pub struct SwapFaults(Arc<FaultCounters>);

#[derive(Debug, Default)]
struct FaultCounters {
    fail_out: AtomicU32,
    fail_in: AtomicU32,
    failed: AtomicU64,
}

impl SwapFaults {
    /// A hook with nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Make the next `n` swap-outs (device → host) fail.
    pub fn fail_swap_outs(&self, n: u32) {
        self.0.fail_out.store(n, Ordering::SeqCst);
    }

    /// Make the next `n` swap-ins (host → device) fail.
    pub fn fail_swap_ins(&self, n: u32) {
        self.0.fail_in.store(n, Ordering::SeqCst);
    }

    /// Swap-outs still armed to fail.
    pub fn pending_swap_outs(&self) -> u32 {
        self.0.fail_out.load(Ordering::SeqCst)
    }

    /// Swap-ins still armed to fail.
    pub fn pending_swap_ins(&self) -> u32 {
        self.0.fail_in.load(Ordering::SeqCst)
    }

    /// Copies this hook made fail so far.
    pub fn injected(&self) -> u64 {
        self.0.failed.load(Ordering::SeqCst)
    }

    /// Whether to fail this copy (consumes one armed failure).
    fn take(&self, out: bool) -> bool {
        let counter = if out {
            &self.0.fail_out
        } else {
            &self.0.fail_in
        };
        let taken = counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if taken {
            self.0.failed.fetch_add(1, Ordering::SeqCst);
        }
        taken
    }
}

/// Two hooks are equal when they are clones of one another.
impl PartialEq for SwapFaults {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What a swapped storage leaves in the host tier: its tensor's description
/// (id, shape, dtype) and its bytes.
struct HostTensor {
    ir: TensorIr,
    data: TensorData,
}

/// The copies between a device's runner and the host tier (the runtime's
/// [`HostTransfer`] for [`Resident`] values).
pub(crate) struct HostCopies<B: BackendIr> {
    shared: Arc<Shared<B>>,
    faults: Option<SwapFaults>,
    /// Wall-clock ns spent in copies, shared with the client's figures.
    copy_ns: Arc<AtomicU64>,
}

impl<B: BackendIr> HostCopies<B> {
    pub(crate) fn new(
        shared: Arc<Shared<B>>,
        faults: Option<SwapFaults>,
        copy_ns: Arc<AtomicU64>,
    ) -> Self {
        Self {
            shared,
            faults,
            copy_ns,
        }
    }

    fn injected(&self, out: bool) -> bool {
        self.faults.as_ref().is_some_and(|f| f.take(out))
    }

    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let ns = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.copy_ns.fetch_add(ns, Ordering::Relaxed);
        out
    }
}

/// Read `ir`'s inner tensor (registered in the runner) into host memory.
fn read_to_host<B: BackendIr>(
    shared: &Shared<B>,
    ir: &TensorIr,
    bytes: u64,
) -> Result<TensorData, TransferError> {
    if matches!(ir.dtype, DType::QFloat(_)) {
        return Err(TransferError::to_host(
            bytes,
            "quantized tensors are not swapped (burn-router 0.22 cannot register them from data)",
        ));
    }
    if !shared.is_owned(ir.id) {
        return Err(TransferError::to_host(
            bytes,
            format!("tensor {} is not registered in the runner", ir.id.value()),
        ));
    }
    let mut ro = ir.clone();
    ro.status = TensorStatus::ReadOnly;
    let read = shared.runner().read_tensor_async(ro);
    match burn_std::reader::try_read_sync(read) {
        Some(Ok(data)) => Ok(data),
        Some(Err(e)) => Err(TransferError::to_host(bytes, format!("{e:?}"))),
        None => Err(TransferError::to_host(
            bytes,
            "the inner backend cannot read synchronously",
        )),
    }
}

impl<B: BackendIr> HostTransfer<Resident<B>> for HostCopies<B> {
    fn to_host(&mut self, value: &Resident<B>, bytes: u64) -> Result<HostValue, TransferError> {
        if self.injected(true) {
            return Err(TransferError::to_host(
                bytes,
                "injected failure (SwapFaults)",
            ));
        }
        let ir = value.ir().clone();
        let data = self.timed(|| read_to_host(&self.shared, &ir, bytes))?;
        Ok(HostValue::new(HostTensor { ir, data }))
    }

    fn to_device(&mut self, host: &HostValue, bytes: u64) -> Result<Resident<B>, TransferError> {
        if self.injected(false) {
            return Err(TransferError::to_device(
                bytes,
                "injected failure (SwapFaults)",
            ));
        }
        let copy = host
            .downcast_ref::<HostTensor>()
            .ok_or_else(|| TransferError::to_device(bytes, "not a remat-burn host copy"))?;
        if self.shared.is_owned(copy.ir.id) {
            return Err(TransferError::to_device(
                bytes,
                format!("tensor {} is already resident", copy.ir.id.value()),
            ));
        }
        // The host copy stays whole (the runtime drops it once this returns):
        // the device gets a copy of its bytes.
        Ok(self.timed(|| self.shared.restore(&copy.ir, copy.data.clone())))
    }
}

/// Bytes of the tensor timed by [`measure_bandwidth`] (4 MiB).
pub(crate) const PROBE_BYTES: usize = 4 << 20;

/// Measure the copy bandwidth per direction (GB/s) by timing round trips of a
/// [`PROBE_BYTES`] float tensor through the same copies the runtime will use;
/// the fastest of three (the first warms the allocator).
pub(crate) fn measure_bandwidth<B: BackendIr>(
    shared: &Arc<Shared<B>>,
) -> Result<f64, TransferError> {
    let n = PROBE_BYTES / 4;
    let bytes = PROBE_BYTES as u64;
    let data = TensorData::new(vec![0.5f32; n], [n]);
    let ir = shared.upload(data);
    let mut value = shared.adopt(&ir);
    let mut copies = HostCopies::new(shared.clone(), None, Arc::default());
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let host = copies.to_host(&value, bytes)?;
        // As the runtime does: the device value goes before it comes back.
        drop(value);
        value = copies.to_device(&host, bytes)?;
        let device = shared.runner().device();
        B::sync(&device).map_err(|e| TransferError::to_device(bytes, format!("{e:?}")))?;
        best = best.min(start.elapsed().as_nanos() as f64);
    }
    drop(value);
    // Two copies of `bytes` in `best` ns; GB/s is bytes per ns.
    Ok(2.0 * bytes as f64 / best.max(1.0))
}
