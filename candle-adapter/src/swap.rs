//! The host tier under candle (issue 33): remat-dtr's [`HostTransfer`] for the
//! adapter's [`Cell`]s, so that the runtime can **swap** a storage to host
//! memory instead of evicting it for recomputation, and move parameters and
//! inputs (which cannot be recomputed) off the device between their uses.
//!
//! - A swap-out copies the storage's bytes into a host-side `CpuStorage`
//!   (candle's `to_cpu_storage` on CUDA, a clone on the CPU) and returns once
//!   the copy is complete; the runtime then drops the cell, which empties the
//!   storage every view shares (an external cell — an input, a parameter — is
//!   armed for this by the completed copy). On the CPU, "device" and host are
//!   the same memory: the copy is real and the budget counts only resident
//!   storages, so the round trip runs through the path CUDA would use.
//! - A swap-in uploads a copy of the host bytes (candle's
//!   `storage_from_cpu_storage` on CUDA) and moves it into the same storage
//!   cell, so every view and graph node sees the data again, bit for bit.
//! - A host copy of external data dropped while still swapped (its storage
//!   released by the runtime, or the context dropped) is put back into the
//!   user's tensor: a `Var` never stays empty once remat lets go of it.
//!
//! Code outside remat that reads such a storage directly must have it
//! resident: candle-nn's optimizers (the adapter's `nn::Optimizer` pins the
//! parameters it updates: [`crate::Remat::pin_params_for`]), `VarMap::save`
//! ([`crate::Remat::pin_params`]). candle's own backward of a lookup by
//! external ids (`index_select`, `gather`: `apply_native` in the graph) reads
//! the ids right after the adapter's identity node above it pinned them back:
//! candle's graph walk visits the two nodes one after the other, so no runtime
//! op runs in between (`tests/swap.rs` swaps the ids between forward and
//! backward).
//!
//! A storage that other data shares (an input brought in as a view of a larger
//! tensor, a storage with two runtime records) is never swapped: its copy is
//! refused with a [`TransferError`] and the runtime keeps it resident.
//!
//! [`TransferFaults`] injects copy failures for tests
//! ([`crate::Remat::inject_transfer_failures`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use remat_dtr::{HostTransfer, HostValue, TransferError};

use crate::cell::{put_storage, storage_addr, Cell};

/// State the context shares with its transfer: storages never to swap, and
/// injected failures.
#[derive(Debug, Default)]
pub(crate) struct SwapShared {
    /// Storage cells (by address) that more than one runtime record covers.
    pub(crate) shared_cells: Mutex<HashSet<usize>>,
    /// Injected failures (tests).
    pub(crate) faults: TransferFaults,
}

/// Copy failures to inject, for tests of the failure paths: the next `out`
/// swap-outs and the next `ins` swap-ins fail with a [`TransferError`] before
/// copying anything.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct TransferFaults {
    out: AtomicU32,
    ins: AtomicU32,
}

impl TransferFaults {
    /// Fail the next `out` swap-outs and the next `ins` swap-ins.
    pub fn set(&self, out: u32, ins: u32) {
        self.out.store(out, Ordering::SeqCst);
        self.ins.store(ins, Ordering::SeqCst);
    }

    /// Failures still to inject: `(swap-outs, swap-ins)`.
    pub fn pending(&self) -> (u32, u32) {
        (
            self.out.load(Ordering::SeqCst),
            self.ins.load(Ordering::SeqCst),
        )
    }

    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// The bytes of one swapped storage in host memory, and the cell to put them
/// back into.
struct HostCopy {
    /// A tensor sharing the storage cell (every view sees what is put back).
    tensor: Tensor,
    /// The storage's bytes.
    data: CpuStorage,
    /// External data: put back into the user's tensor if the copy is dropped
    /// while the storage is still swapped.
    external: bool,
    /// Set once a swap-in put the bytes back.
    restored: AtomicBool,
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        if self.external && !self.restored.load(Ordering::Acquire) {
            // The runtime let go of a swapped input or parameter (released,
            // or the context dropped): the user's tensor gets its data back.
            // A failed upload (CUDA out of memory here) leaves it empty; a
            // drop cannot report it.
            let data = std::mem::replace(&mut self.data, CpuStorage::U8(Vec::new()));
            let storage = match self.tensor.device() {
                Device::Cpu => Ok(Storage::Cpu(data)),
                device => upload(device, &data),
            };
            if let Ok(storage) = storage {
                let _ = put_storage(&self.tensor, storage);
            }
        }
    }
}

/// The elements a host storage holds.
fn cpu_len(s: &CpuStorage) -> usize {
    match s {
        CpuStorage::U8(v) => v.len(),
        CpuStorage::U32(v) => v.len(),
        CpuStorage::I16(v) => v.len(),
        CpuStorage::I32(v) => v.len(),
        CpuStorage::I64(v) => v.len(),
        CpuStorage::BF16(v) => v.len(),
        CpuStorage::F16(v) => v.len(),
        CpuStorage::F32(v) => v.len(),
        CpuStorage::F64(v) => v.len(),
        CpuStorage::F8E4M3(v) => v.len(),
        CpuStorage::F6E2M3(v) => v.len(),
        CpuStorage::F6E3M2(v) => v.len(),
        CpuStorage::F4(v) => v.len(),
        CpuStorage::F8E8M0(v) => v.len(),
    }
}

/// Copy `storage` to host memory (complete when this returns: candle's CUDA
/// download synchronizes its stream).
fn download(storage: &Storage) -> candle_core::Result<CpuStorage> {
    match storage {
        Storage::Cpu(s) => Ok(s.clone()),
        Storage::Cuda(s) => s.to_cpu_storage(),
        Storage::Metal(_) => Err(candle_core::Error::Msg(
            "remat-candle does not support metal".into(),
        )),
    }
}

/// A device storage on `device` holding a copy of `data`.
fn upload(device: &Device, data: &CpuStorage) -> candle_core::Result<Storage> {
    match device {
        Device::Cpu => Ok(Storage::Cpu(data.clone())),
        Device::Cuda(d) => Ok(Storage::Cuda(d.storage_from_cpu_storage(data)?)),
        Device::Metal(_) => Err(candle_core::Error::Msg(
            "remat-candle does not support metal".into(),
        )),
    }
}

/// The adapter's copies between the device and the host tier (see the module
/// doc).
pub(crate) struct CandleTransfer {
    shared: Arc<SwapShared>,
}

impl CandleTransfer {
    pub(crate) fn new(shared: Arc<SwapShared>) -> Self {
        Self { shared }
    }
}

impl HostTransfer<Cell> for CandleTransfer {
    fn to_host(&mut self, value: &Cell, bytes: u64) -> Result<HostValue, TransferError> {
        if TransferFaults::take(&self.shared.faults.out) {
            return Err(TransferError::to_host(bytes, "injected failure"));
        }
        let t = value.tensor();
        let shared = self
            .shared
            .shared_cells
            .lock()
            .map_err(|_| TransferError::to_host(bytes, "remat: swap state poisoned"))?
            .contains(&storage_addr(t));
        if shared {
            return Err(TransferError::to_host(
                bytes,
                "the storage has two runtime records (views brought in separately): kept resident",
            ));
        }
        let data = {
            let (storage, layout) = t.storage_and_layout();
            if let Storage::Cpu(s) = &*storage {
                // Check before copying: a view of a larger storage stays.
                if layout.start_offset() != 0 || cpu_len(s) != layout.shape().elem_count() {
                    return Err(TransferError::to_host(
                        bytes,
                        "the storage holds data outside this tensor: kept resident",
                    ));
                }
            }
            download(&storage).map_err(|e| TransferError::to_host(bytes, e.to_string()))?
        };
        if t.layout().start_offset() != 0 || cpu_len(&data) != t.elem_count() {
            return Err(TransferError::to_host(
                bytes,
                "the storage holds data outside this tensor: kept resident",
            ));
        }
        // The copy is complete: the runtime drops the cell next, which must
        // free the device memory, an input's or a parameter's too.
        value.arm();
        Ok(HostValue::new(HostCopy {
            tensor: t.clone(),
            data,
            external: value.is_external(),
            restored: AtomicBool::new(false),
        }))
    }

    fn to_device(&mut self, host: &HostValue, bytes: u64) -> Result<Cell, TransferError> {
        if TransferFaults::take(&self.shared.faults.ins) {
            return Err(TransferError::to_device(bytes, "injected failure"));
        }
        let copy = host
            .downcast_ref::<HostCopy>()
            .ok_or_else(|| TransferError::to_device(bytes, "not a remat-candle host copy"))?;
        let err = |e: candle_core::Error| TransferError::to_device(bytes, e.to_string());
        let storage = upload(copy.tensor.device(), &copy.data).map_err(err)?;
        put_storage(&copy.tensor, storage).map_err(err)?;
        copy.restored.store(true, Ordering::Release);
        let t = copy.tensor.clone();
        Ok(if copy.external {
            Cell::external(t)
        } else {
            Cell::armed(t)
        })
    }
}

/// Measure the copy bandwidth of `device` in GB/s per direction: copies of
/// an 8 MiB tensor to host memory and back, as the transfer makes them, the
/// fastest of three round trips.
pub(crate) fn measure_bandwidth(device: &Device) -> candle_core::Result<f64> {
    const ELEMS: usize = 2 << 20;
    let t = Tensor::ones(ELEMS, DType::F32, device)?;
    let bytes = (ELEMS * 4) as f64;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let data = {
            let (storage, _) = t.storage_and_layout();
            download(&storage)?
        };
        let back = upload(device, &data)?;
        let ns = start.elapsed().as_nanos() as f64;
        drop(back);
        best = best.min(ns);
    }
    // Two copies of `bytes`; bytes per ns is GB/s.
    Ok(2.0 * bytes / best.max(1.0))
}
