//! Giving memory back to the device, rule for rule from PyTorch: releasing
//! cached segments (spec §3.5, §3.6, §4.3), garbage collection, the memory
//! fraction (§5.3) and the out-of-memory error (§3.9). Cold paths of `State`.

use super::block::{Block, BlockId, PoolKind};
use super::state::{Request, State};
use crate::device::Device;
use crate::error::{Error, OutOfMemoryError};
use crate::snapshot::TraceAction;
use crate::Result;

impl State {
    // ----- release (spec §3.5, §3.6, §4.3) -------------------------------------

    /// Returns a whole, unsplit, free, non-expandable segment to the device.
    fn release_block<D: Device>(&mut self, dev: &mut D, id: BlockId) -> Result<()> {
        let b = &self.blocks[id];
        debug_assert!(!b.is_split() && b.expandable.is_none() && b.is_free());
        let (ptr, size, small, stream) = (b.ptr, b.size, b.pool.is_small(), b.stream);
        // The device first: if it refuses, the segment stays cached and counted.
        dev.free(ptr, size).map_err(Error::Device)?;
        self.remove_from_blocks(id);
        self.blocks.remove(id);
        self.stats.num_device_free += 1;
        self.record(TraceAction::SegmentFree, ptr, size, stream);
        self.total_allocated_memory -= size;
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, size as i64);
        if size >= self.oversize_threshold {
            self.stats.oversize_segments.decrease(1);
        }
        Ok(())
    }

    /// Frees only enough cached oversize blocks for `req` (§3.5). Blocks released
    /// before a failure stay released, as in PyTorch.
    pub(crate) fn release_available_cached_blocks<D: Device>(
        &mut self,
        dev: &mut D,
        req: &Request,
    ) -> Result<bool> {
        let max_split = self.config.max_split_size;
        if max_split == usize::MAX {
            return Ok(false);
        }
        let key = req.size.max(max_split);
        let pool = self.pool(req.pool);
        let single = pool.at_least(req.stream, key).next().map(|e| e.id);
        // Only whole segments may go back to the device; with expandable segments
        // on, ordinary large segments can be split, so split blocks are skipped.
        let releasable = |st: &State, id: BlockId| {
            let b = &st.blocks[id];
            b.expandable.is_none() && !b.is_split()
        };
        if let Some(id) = single.filter(|&id| releasable(self, id)) {
            self.release_block(dev, id)?;
            return Ok(true);
        }
        let candidates: Vec<BlockId> = pool
            .below_descending(req.stream, key)
            .take_while(|e| e.size >= max_split)
            .map(|e| e.id)
            .collect();
        let mut released = 0usize;
        for id in candidates {
            if released >= key {
                break;
            }
            if releasable(self, id) {
                released += self.blocks[id].size;
                self.release_block(dev, id)?;
            }
        }
        Ok(released >= key)
    }

    /// Waits for pending events, then returns every wholly free segment
    /// (`release_cached_blocks`, also `empty_cache`).
    pub(crate) fn release_cached_blocks<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        self.synchronize_and_free_events(dev)?;
        self.release_blocks(dev, PoolKind::Large)?;
        self.release_blocks(dev, PoolKind::Small)
    }

    fn release_blocks<D: Device>(&mut self, dev: &mut D, kind: PoolKind) -> Result<()> {
        let free: Vec<BlockId> = self.pool(kind).ids();
        let mut expandable = Vec::new();
        for id in free {
            let b = &self.blocks[id];
            if b.expandable.is_some() {
                expandable.push(id);
            } else if !b.is_split() {
                self.release_block(dev, id)?;
            }
        }
        for id in expandable {
            let id = self.unmap_block(dev, id)?;
            let b = &self.blocks[id];
            if !b.mapped && !b.is_split() {
                self.release_expandable_segment(dev, id)?;
            }
        }
        Ok(())
    }

    /// Age-based release of cached large blocks while reserved memory is above
    /// `garbage_collection_threshold` of the fraction limit (§3.3).
    pub(crate) fn garbage_collect_cached_blocks<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        let Some(allowed) = self.allowed_memory_maximum else {
            return Ok(());
        };
        if self.config.garbage_collection_threshold <= 0.0 {
            return Ok(());
        }
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let clock = self.large.get_free_blocks_call_count;
        let age = |b: &Block| (clock - b.gc_count_base) as f64;
        let eligible = |b: &Block| !b.is_split() && b.expandable.is_none();
        let mut total_age = 0.0;
        let mut count = 0usize;
        for id in self.large.ids() {
            let b = &self.blocks[id];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let mut reclaimed = 0usize;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let age_threshold = total_age / count as f64;
            freed_any = false;
            let ids: Vec<BlockId> = self.large.ids();
            for id in ids {
                let b = &self.blocks[id];
                if eligible(b) && age(b) >= age_threshold {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    count -= 1;
                    self.release_block(dev, id)?;
                }
            }
        }
        Ok(())
    }

    // ----- memory fraction (spec §5.3) -------------------------------------------

    pub(crate) fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(Error::InvalidFraction { value: fraction });
        }
        self.allowed_memory_maximum = if fraction < 1.0 {
            Some((fraction * self.device_total as f64) as usize)
        } else {
            None
        };
        self.memory_fraction = fraction;
        Ok(())
    }

    pub(crate) fn memory_fraction(&self) -> f64 {
        self.memory_fraction
    }

    // ----- OOM (spec §3.9) -------------------------------------------------------

    #[cold]
    pub(crate) fn out_of_memory_error<D: Device>(
        &mut self,
        dev: &mut D,
        req: &Request,
    ) -> Result<OutOfMemoryError> {
        self.stats.num_ooms += 1;
        let info = dev.mem_info().map_err(Error::Device)?;
        self.record(TraceAction::Oom, info.free as u64, req.size, req.stream);
        Ok(OutOfMemoryError {
            device_kind: self.device_kind,
            device_index: self.device_index,
            requested: req.orig,
            rounded: req.size,
            alloc_size: req.alloc_size,
            total_capacity: info.total,
            device_free: info.free,
            allowed: self.allowed_memory_maximum,
            allocated: self.stats.allocated_bytes.all_current() as usize,
            reserved: self.stats.reserved_bytes.all_current() as usize,
            max_split_size: self.config.max_split_size,
            expandable_segments: self.expandable_active(),
        })
    }
}
