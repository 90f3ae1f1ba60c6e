//! Moving a tensor's storage out of and back into candle's shared storage cell.
//!
//! Every candle tensor and all its views share one `Arc<RwLock<Storage>>`. candle's
//! public API hands that storage out mutably only to in-place ops
//! ([`candle_core::InplaceOp1`]), so eviction and restoration are two tiny in-place
//! ops: `take_storage` swaps an empty storage in and returns the old one (its
//! memory goes with it), `put_storage` swaps a recomputed storage back in. All
//! views and graph nodes that share the cell see the restored data.
//!
//! [`Cell`] is the value type of the DTR runtime (`Runtime<Cell>`): the runtime
//! drops a resident storage's value when it evicts or deletes it, and an *armed*
//! cell empties the candle storage on drop, so the runtime's bookkeeping and the
//! real memory move together.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp1, Layout, MetalStorage, Shape};
use candle_core::{Storage, Tensor};

/// An empty storage of `dtype` on the device of `like`.
fn empty_like_cpu(like: &CpuStorage) -> candle_core::Result<CpuStorage> {
    like.device().zeros_impl(&Shape::from(0usize), like.dtype())
}

fn empty_like_cuda(like: &CudaStorage) -> candle_core::Result<CudaStorage> {
    like.device().zeros_impl(&Shape::from(0usize), like.dtype())
}

/// In-place op that moves the storage out into `slot`, leaving an empty storage.
struct Take<'a> {
    slot: &'a Mutex<Option<Storage>>,
}

impl Take<'_> {
    fn stash(&self, s: Storage) -> candle_core::Result<()> {
        let mut slot = self
            .slot
            .lock()
            .map_err(|_| candle_core::Error::Msg("remat: storage slot poisoned".into()))?;
        *slot = Some(s);
        Ok(())
    }
}

impl InplaceOp1 for Take<'_> {
    fn name(&self) -> &'static str {
        "remat-take-storage"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        let empty = empty_like_cpu(storage)?;
        self.stash(Storage::Cpu(std::mem::replace(storage, empty)))
    }
    fn cuda_fwd(&self, storage: &mut CudaStorage, _: &Layout) -> candle_core::Result<()> {
        let empty = empty_like_cuda(storage)?;
        self.stash(Storage::Cuda(std::mem::replace(storage, empty)))
    }
    fn metal_fwd(&self, _: &mut MetalStorage, _: &Layout) -> candle_core::Result<()> {
        Err(candle_core::Error::Msg(
            "remat-candle does not support metal".into(),
        ))
    }
}

/// In-place op that replaces the storage with the one in `slot`.
struct Put<'a> {
    slot: &'a Mutex<Option<Storage>>,
}

impl Put<'_> {
    fn take(&self) -> candle_core::Result<Storage> {
        self.slot
            .lock()
            .map_err(|_| candle_core::Error::Msg("remat: storage slot poisoned".into()))?
            .take()
            .ok_or_else(|| candle_core::Error::Msg("remat: no storage to restore".into()))
    }
}

impl InplaceOp1 for Put<'_> {
    fn name(&self) -> &'static str {
        "remat-put-storage"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        match self.take()? {
            Storage::Cpu(s) => {
                *storage = s;
                Ok(())
            }
            _ => Err(candle_core::Error::Msg(
                "remat: device mismatch on restore".into(),
            )),
        }
    }
    fn cuda_fwd(&self, storage: &mut CudaStorage, _: &Layout) -> candle_core::Result<()> {
        match self.take()? {
            Storage::Cuda(s) => {
                *storage = s;
                Ok(())
            }
            _ => Err(candle_core::Error::Msg(
                "remat: device mismatch on restore".into(),
            )),
        }
    }
    fn metal_fwd(&self, _: &mut MetalStorage, _: &Layout) -> candle_core::Result<()> {
        Err(candle_core::Error::Msg(
            "remat-candle does not support metal".into(),
        ))
    }
}

/// Move the storage of `t` out (every tensor sharing it now sees an empty storage)
/// and return it.
pub(crate) fn take_storage(t: &Tensor) -> candle_core::Result<Storage> {
    let slot = Mutex::new(None);
    t.inplace_op1(&Take { slot: &slot })?;
    slot.into_inner()
        .map_err(|_| candle_core::Error::Msg("remat: storage slot poisoned".into()))?
        .ok_or_else(|| candle_core::Error::Msg("remat: storage was not taken".into()))
}

/// Move `storage` into `t`'s storage cell (every tensor sharing it sees the data).
pub(crate) fn put_storage(t: &Tensor, storage: Storage) -> candle_core::Result<()> {
    let slot = Mutex::new(Some(storage));
    t.inplace_op1(&Put { slot: &slot })
}

/// Address of `t`'s storage cell: equal addresses mean shared storage.
pub(crate) fn storage_addr(t: &Tensor) -> usize {
    let (guard, _) = t.storage_and_layout();
    &*guard as *const Storage as usize
}

/// Bytes of a tensor's elements.
pub(crate) fn tensor_bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

/// Bytes of `n` elements of `dtype`.
#[allow(dead_code)]
pub(crate) fn bytes_of(n: usize, dtype: DType) -> u64 {
    (n * dtype.size_in_bytes()) as u64
}

/// The DTR runtime's value for one storage: a tensor sharing the storage cell.
///
/// Invariant: an armed cell's storage is non-empty exactly while the runtime holds
/// the cell (the storage is resident). Dropping an armed cell empties the storage,
/// freeing its memory; external data (inputs, parameters) is held unarmed and is
/// never emptied, except when the host tier holds a copy of it (swap: see
/// [`crate::swap`]), which puts it back.
pub struct Cell {
    tensor: Tensor,
    /// Emptied on drop. An external cell is armed by a completed swap-out, just
    /// before the runtime drops it (its bytes are then in the host tier).
    armed: AtomicBool,
    /// External data (an input or a parameter): the user's tensor shares it.
    external: bool,
}

impl Cell {
    /// A cell for produced data: dropping it evicts the storage.
    pub(crate) fn armed(tensor: Tensor) -> Self {
        Self {
            tensor,
            armed: AtomicBool::new(true),
            external: false,
        }
    }

    /// A cell for external data: never emptied (unless swapped out).
    pub(crate) fn external(tensor: Tensor) -> Self {
        Self {
            tensor,
            armed: AtomicBool::new(false),
            external: true,
        }
    }

    /// The tensor sharing the storage.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Whether the cell holds external data ([`crate::Remat::input`],
    /// [`crate::Remat::param`]) rather than an op's output.
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// Empty the storage when this cell is dropped: a swap-out whose copy
    /// completed arms an external cell, so that the runtime dropping it frees
    /// the device memory as it does an output's.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cell")
            .field("shape", self.tensor.shape())
            .field("armed", &self.armed.load(Ordering::Acquire))
            .field("external", &self.external)
            .finish()
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        if self.armed.load(Ordering::Acquire) {
            // Dropping the taken storage frees its memory. A failure here (metal,
            // poisoned slot) leaves the data in place: memory is then over-counted
            // as free, never corrupted.
            let _ = take_storage(&self.tensor);
        }
    }
}
