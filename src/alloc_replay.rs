//! Trace storages as an allocation sequence: one storage = one allocation of its
//! bytes at its first appearance, freed when its last name is released. Used by
//! `remat plan` (the caching allocator's reserved peak beside each plan) and by
//! the allocator benchmarks.

use remat_alloc::{Allocation, AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use remat_trace::StorageEvent;

/// Capacity of the simulated device used for unbounded replays (1 TiB: no trace
/// comes near it, so nothing is ever released for lack of room).
pub const UNBOUNDED_CAPACITY: usize = 1 << 40;

/// What a replay through the caching allocator measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocReplay {
    /// Allocations plus frees performed (zero-byte storages are skipped).
    pub ops: usize,
    /// Maximum over time of the live requested bytes (the lower bound of any arena).
    pub max_live_bytes: u64,
    /// `reserved_bytes.all.peak`: device memory the caching allocator held at most.
    pub peak_reserved_bytes: u64,
    /// `allocated_bytes.all.peak`: rounded block bytes handed out at most.
    pub peak_allocated_bytes: u64,
    /// Segments requested from the device.
    pub device_allocs: u64,
}

impl AllocReplay {
    /// `peak_reserved_bytes / max_live_bytes`.
    pub fn reserved_over_live(&self) -> f64 {
        self.peak_reserved_bytes as f64 / self.max_live_bytes.max(1) as f64
    }
}

/// Replays `events` through a caching allocator with `config` on an unbounded
/// simulated device. Storages still alive at the end are freed afterwards.
pub fn replay(
    events: &[StorageEvent],
    config: AllocatorConfig,
) -> Result<AllocReplay, remat_alloc::Error> {
    let alloc = CachingAllocator::new(SimulatedDevice::new(UNBOUNDED_CAPACITY), config)?;
    let mut live: Vec<Option<Allocation>> = Vec::new();
    let (mut ops, mut live_bytes, mut max_live) = (0usize, 0u64, 0u64);
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                if live.len() <= storage {
                    live.resize_with(storage + 1, || None);
                }
                live[storage] = Some(alloc.malloc(bytes as usize, StreamId::DEFAULT)?);
                live_bytes += bytes;
                max_live = max_live.max(live_bytes);
                ops += 1;
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(a) = live.get_mut(storage).and_then(Option::take) {
                    live_bytes -= a.requested() as u64;
                    alloc.free(a)?;
                    ops += 1;
                }
            }
            StorageEvent::Alloc { .. } => {}
        }
    }
    let stats = alloc.stats();
    for a in live.into_iter().flatten() {
        alloc.free(a)?;
    }
    Ok(AllocReplay {
        ops,
        max_live_bytes: max_live,
        peak_reserved_bytes: stats.reserved_bytes.all.peak as u64,
        peak_allocated_bytes: stats.allocated_bytes.all.peak as u64,
        device_allocs: stats.num_device_alloc as u64,
    })
}
