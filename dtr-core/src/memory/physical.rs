//! [`PhysicalBudget`]: the budget as a device. A remat-alloc [`CachingAllocator`]
//! over a [`SimulatedDevice`] whose capacity is the budget, so PyTorch's rounding
//! (512 B), pools (small ≤ 1 MiB from 2 MiB segments, large from 20 MiB or
//! 2-MiB-rounded segments), splitting, caching and fragmentation all count. An
//! allocation that fails after the allocator has released its cached segments
//! reports [`AllocFailure::NoRoom`] and the runtime evicts and retries.

use remat_alloc::size::{allocation_size, is_small, round_size, SMALL_BUFFER};
use remat_alloc::{Allocation, AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};

use crate::error::{Error, Result};
use crate::memory::{
    AllocFailure, BlockView, FreeByPool, MemoryModel, MemoryUsage, RequestShape, Slot,
};

/// Key of a zero-byte slot (no allocation behind it).
const EMPTY_KEY: u64 = u64::MAX;

/// A caching allocator over a simulated device of `budget` bytes.
pub struct PhysicalBudget {
    alloc: CachingAllocator<SimulatedDevice>,
    config: AllocatorConfig,
    capacity: u64,
    /// Live allocations by slot key.
    live: Vec<Option<Allocation>>,
    free_keys: Vec<u64>,
}

impl std::fmt::Debug for PhysicalBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysicalBudget")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl PhysicalBudget {
    /// A budget of `budget` bytes with the allocator's default config.
    pub fn new(budget: u64) -> Result<Self> {
        Self::with_config(budget, AllocatorConfig::default())
    }

    /// A budget of `budget` bytes whose allocator grows expandable segments (one
    /// virtual range per pool, pages mapped on demand: PyTorch's
    /// `expandable_segments:True`), over a device with virtual memory.
    pub fn expandable(budget: u64) -> Result<Self> {
        let config = AllocatorConfig::parse("expandable_segments:True")
            .map_err(|e| Error::Memory(e.to_string()))?;
        Self::with_config(budget, config)
    }

    /// A budget of `budget` bytes with an explicit allocator config.
    pub fn with_config(budget: u64, config: AllocatorConfig) -> Result<Self> {
        let device = SimulatedDevice::new(budget as usize);
        let alloc = CachingAllocator::new(device, config.clone())
            .map_err(|e| Error::Memory(e.to_string()))?;
        Ok(Self {
            alloc,
            config,
            capacity: budget,
            live: Vec::new(),
            free_keys: Vec::new(),
        })
    }

    /// The allocator (stats, snapshots, invariant checks).
    pub fn allocator(&self) -> &CachingAllocator<SimulatedDevice> {
        &self.alloc
    }
}

impl MemoryModel for PhysicalBudget {
    fn name(&self) -> &'static str {
        "physical"
    }

    fn allocate(&mut self, bytes: u64) -> Result<Slot, AllocFailure> {
        if bytes == 0 {
            return Ok(Slot {
                ptr: 0,
                size: 0,
                requested: 0,
                key: EMPTY_KEY,
            });
        }
        match self.alloc.malloc(bytes as usize, StreamId::DEFAULT) {
            Ok(a) => {
                let slot = Slot {
                    ptr: a.ptr(),
                    size: a.size() as u64,
                    requested: bytes,
                    key: 0,
                };
                let key = match self.free_keys.pop() {
                    Some(k) => {
                        self.live[k as usize] = Some(a);
                        k
                    }
                    None => {
                        self.live.push(Some(a));
                        (self.live.len() - 1) as u64
                    }
                };
                Ok(Slot { key, ..slot })
            }
            Err(e) if e.is_out_of_memory() => Err(AllocFailure::NoRoom {
                free_bytes: self.free_bytes(),
            }),
            Err(e) => Err(AllocFailure::Other(e.to_string())),
        }
    }

    fn release_cached(&mut self) -> Result<u64, String> {
        let reserved = |a: &CachingAllocator<SimulatedDevice>| a.stats().reserved_bytes.all.current;
        let before = reserved(&self.alloc);
        self.alloc.empty_cache().map_err(|e| e.to_string())?;
        Ok(before.saturating_sub(reserved(&self.alloc)) as u64)
    }

    fn free(&mut self, slot: Slot) -> Result<(), String> {
        if slot.key == EMPTY_KEY {
            return Ok(());
        }
        let a = self
            .live
            .get_mut(slot.key as usize)
            .and_then(Option::take)
            .ok_or_else(|| format!("physical budget: slot {} is not live", slot.key))?;
        self.free_keys.push(slot.key);
        self.alloc.free(a).map_err(|e| e.to_string())
    }

    fn adjacent_free(&self, slot: &Slot) -> (u64, u64) {
        match self.live.get(slot.key as usize).and_then(Option::as_ref) {
            Some(a) => match self.alloc.adjacent_free_size(a) {
                Ok(f) => (f.left as u64, f.right as u64),
                Err(_) => (0, 0),
            },
            None => (0, 0),
        }
    }

    fn has_addresses(&self) -> bool {
        true
    }

    fn blocks(&self, out: &mut Vec<BlockView>) {
        let blocks = self.alloc.blocks();
        let start = out.len();
        let mut seg_bytes: Vec<u64> = Vec::new();
        for b in &blocks {
            if seg_bytes.len() <= b.segment {
                seg_bytes.resize(b.segment + 1, 0);
            }
            seg_bytes[b.segment] += b.size as u64;
        }
        out.extend(blocks.iter().map(|b| BlockView {
            ptr: b.ptr,
            size: b.size as u64,
            allocated: b.allocated,
            segment: b.segment,
            small: seg_bytes[b.segment] == SMALL_BUFFER as u64,
        }));
        debug_assert!(out[start..].windows(2).all(|w| w[0].ptr < w[1].ptr));
    }

    fn usage(&self) -> MemoryUsage {
        let s = self.alloc.stats();
        MemoryUsage {
            capacity: Some(self.capacity),
            allocated: s.allocated_bytes.all.current.max(0) as u64,
            reserved: s.reserved_bytes.all.current.max(0) as u64,
            peak_allocated: s.allocated_bytes.all.peak.max(0) as u64,
            peak_reserved: s.reserved_bytes.all.peak.max(0) as u64,
        }
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.capacity)
    }

    fn shape(&self, bytes: u64) -> RequestShape {
        let block = round_size(bytes.max(1) as usize, &self.config);
        RequestShape {
            block: block as u64,
            segment: allocation_size(block, &self.config) as u64,
            small: is_small(block),
        }
    }

    fn free_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.alloc.memory_allocated() as u64)
    }

    fn free_by_pool(&self) -> Option<FreeByPool> {
        let s = self.alloc.stats();
        let cached = |reserved: i64, allocated: i64| (reserved - allocated).max(0) as u64;
        Some(FreeByPool {
            small_pool: cached(
                s.reserved_bytes.small_pool.current,
                s.allocated_bytes.small_pool.current,
            ),
            large_pool: cached(
                s.reserved_bytes.large_pool.current,
                s.allocated_bytes.large_pool.current,
            ),
            unreserved: self
                .capacity
                .saturating_sub(s.reserved_bytes.all.current.max(0) as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_by_pool_splits_cached_bytes_by_pool_and_counts_unreserved_device_bytes() {
        let mut m = PhysicalBudget::new(64 << 20).unwrap();
        let small = m.allocate(300 << 10).unwrap(); // 2 MiB small segment
        let large = m.allocate(3 << 20).unwrap(); // 20 MiB large segment
        let f = m.free_by_pool().unwrap();
        assert_eq!(f.small_pool, (2 << 20) - (300 << 10));
        assert_eq!(f.large_pool, (20 << 20) - (3 << 20));
        assert_eq!(f.unreserved, (64 << 20) - (22 << 20));
        m.free(small).unwrap();
        m.free(large).unwrap();
        let f = m.free_by_pool().unwrap();
        assert_eq!((f.small_pool, f.large_pool), (2 << 20, 20 << 20));
        assert_eq!(
            f.small_pool + f.large_pool + f.unreserved,
            m.free_bytes(),
            "cached plus unreserved is all the free memory"
        );
    }
}
