//! A full scan of the allocator's invariants (talc's `scan_for_errors`): run by
//! tests after every operation, compiled under `cfg(test)` or the
//! `invariant-checks` feature.

use super::block::BlockId;
use super::state::State;
use crate::size::MIN_BLOCK_SIZE;
use crate::stats::{DeviceStats, StatArray};
use std::collections::BTreeMap;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

#[derive(Default)]
struct Recount {
    segment: [i64; 2],
    reserved: [i64; 2],
    allocation: [i64; 2],
    allocated_bytes: [i64; 2],
    active: [i64; 2],
    active_bytes: [i64; 2],
    requested: [i64; 2],
    inactive_split: [i64; 2],
    inactive_split_bytes: [i64; 2],
    oversize_allocations: i64,
    oversize_segments: i64,
}

fn check_array(name: &str, arr: &StatArray, want: [i64; 2]) -> Result<(), String> {
    ensure!(
        arr.small_pool.current == want[0] && arr.large_pool.current == want[1],
        "{name}: stats say small {} / large {}, a recount gives {} / {}",
        arr.small_pool.current,
        arr.large_pool.current,
        want[0],
        want[1]
    );
    ensure!(
        arr.all.current == want[0] + want[1],
        "{name}.all.current = {} but small + large = {}",
        arr.all.current,
        want[0] + want[1]
    );
    Ok(())
}

impl State {
    /// Checks every invariant; returns a description of the first violation.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let max_split = self.oversize_threshold;
        let mut rc = Recount::default();
        let mut seen = 0usize;
        let mut mapped_bytes_per_seg: BTreeMap<usize, usize> = BTreeMap::new();
        let mut pool_free = 0usize;
        let mut pool_unmapped = 0usize;
        let mut pending_events = 0u64;

        let heads: Vec<BlockId> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none())
            .map(|(id, _)| id)
            .collect();
        for head in heads {
            let h = &self.blocks[head];
            let p = usize::from(!h.pool.is_small());
            let expandable = h.expandable;
            let mut seg_size = 0usize;
            let mut count = 0usize;
            let mut prev: Option<BlockId> = None;
            let mut cur = Some(head);
            let mut prev_state: Option<(bool, bool)> = None; // (free, mapped) of prev
            let mut blocks_in_seg = Vec::new();
            while let Some(id) = cur {
                let b = self
                    .blocks
                    .try_get(id)
                    .ok_or_else(|| format!("segment at {:#x} links to dead block {id:?}", h.ptr))?;
                seen += 1;
                count += 1;
                ensure!(
                    count <= self.blocks.live(),
                    "cycle in the block list of segment {:#x}",
                    h.ptr
                );
                ensure!(
                    b.prev == prev,
                    "block {:#x}: prev link does not point back",
                    b.ptr
                );
                ensure!(
                    b.size > 0 && b.size % MIN_BLOCK_SIZE == 0,
                    "block {:#x}: size {} is not a positive multiple of 512",
                    b.ptr,
                    b.size
                );
                ensure!(
                    b.stream == h.stream && b.pool == h.pool && b.expandable == expandable,
                    "block {:#x}: stream/pool/segment differ from its segment head",
                    b.ptr
                );
                if let Some(pv) = prev {
                    let pb = &self.blocks[pv];
                    ensure!(
                        pb.ptr + pb.size as u64 == b.ptr,
                        "blocks {:#x}+{} and {:#x} are not contiguous",
                        pb.ptr,
                        pb.size,
                        b.ptr
                    );
                }
                let free = b.is_free();
                if let Some((prev_free, prev_mapped)) = prev_state {
                    ensure!(
                        !(free && prev_free && prev_mapped == b.mapped),
                        "two adjacent free blocks at {:#x}",
                        b.ptr
                    );
                }
                prev_state = Some((free, b.mapped));
                ensure!(
                    !b.allocated || b.mapped,
                    "block {:#x} is allocated but unmapped",
                    b.ptr
                );
                ensure!(
                    b.allocated == (b.serial != 0),
                    "block {:#x}: allocated {} with serial {}",
                    b.ptr,
                    b.allocated,
                    b.serial
                );
                // Pool membership.
                let pool = self.pool(b.pool);
                if free && b.mapped {
                    ensure!(
                        pool.get(b.stream, b.size, b.ptr) == Some(id),
                        "free block {:#x} is missing from its pool",
                        b.ptr
                    );
                    pool_free += 1;
                } else {
                    ensure!(
                        pool.get(b.stream, b.size, b.ptr) != Some(id),
                        "busy block {:#x} is in the free pool",
                        b.ptr
                    );
                }
                if !b.mapped {
                    ensure!(free, "unmapped block {:#x} is busy", b.ptr);
                    ensure!(
                        pool.unmapped.get(&(b.stream, b.ptr)) == Some(&id),
                        "unmapped block {:#x} is missing from the unmapped set",
                        b.ptr
                    );
                    pool_unmapped += 1;
                }
                pending_events += u64::from(b.event_count);
                // Stats recount.
                let active = !free;
                if b.mapped {
                    if let Some(s) = expandable {
                        *mapped_bytes_per_seg.entry(s as usize).or_default() += b.size;
                    }
                }
                if b.allocated {
                    rc.allocation[p] += 1;
                    rc.allocated_bytes[p] += b.size as i64;
                    if b.size >= max_split {
                        rc.oversize_allocations += 1;
                    }
                }
                if active {
                    rc.active[p] += 1;
                    rc.active_bytes[p] += b.size as i64;
                    rc.requested[p] += b.requested as i64;
                }
                blocks_in_seg.push((free, b.size));
                seg_size += b.size;
                prev = Some(id);
                cur = b.next;
            }
            if expandable.is_none() {
                rc.segment[p] += 1;
                rc.reserved[p] += seg_size as i64;
                if seg_size >= max_split {
                    rc.oversize_segments += 1;
                }
                if blocks_in_seg.len() > 1 {
                    for (free, size) in blocks_in_seg {
                        if free {
                            rc.inactive_split[p] += 1;
                            rc.inactive_split_bytes[p] += size as i64;
                        }
                    }
                }
            } else {
                let seg = expandable
                    .and_then(|s| self.expandable.get(s as usize))
                    .and_then(|s| s.as_ref())
                    .ok_or_else(|| {
                        format!("block {:#x} names a released expandable segment", h.ptr)
                    })?;
                ensure!(
                    h.ptr == seg.base && seg_size == seg.size,
                    "expandable segment {:#x}: blocks cover {seg_size} of {} bytes",
                    seg.base,
                    seg.size
                );
                rc.reserved[p] += (seg.mapped.iter().filter(|m| **m).count() * seg.page) as i64;
            }
        }
        ensure!(
            seen == self.blocks.live(),
            "{} live blocks but {seen} reachable from segment heads",
            self.blocks.live()
        );
        let in_pools = self.small.len() + self.large.len();
        ensure!(
            in_pools == pool_free,
            "pools hold {in_pools} blocks but {pool_free} blocks are free"
        );
        let unmapped = self.small.unmapped.len() + self.large.unmapped.len();
        ensure!(
            unmapped == pool_unmapped,
            "unmapped sets hold {unmapped} blocks, {pool_unmapped} are unmapped"
        );
        let queued: usize = self.events.values().map(|q| q.len()).sum();
        ensure!(
            queued as u64 == pending_events,
            "{queued} queued events but blocks count {pending_events}"
        );
        // Expandable pages: mapped pages cover exactly the mapped blocks (up to
        // partial pages at the edges of mapped runs).
        for (i, seg) in self.expandable.iter().enumerate() {
            let Some(seg) = seg else { continue };
            let pages = seg.mapped.iter().filter(|m| **m).count() * seg.page;
            let blocks = mapped_bytes_per_seg.get(&i).copied().unwrap_or(0);
            ensure!(pages == blocks, "expandable segment {:#x}: {pages} bytes of mapped pages but {blocks} bytes of mapped blocks", seg.base);
        }

        let s: &DeviceStats = &self.stats.device_stats();
        check_array("segment", &s.segment, rc.segment)?;
        check_array("reserved_bytes", &s.reserved_bytes, rc.reserved)?;
        check_array("allocation", &s.allocation, rc.allocation)?;
        check_array("allocated_bytes", &s.allocated_bytes, rc.allocated_bytes)?;
        check_array("active", &s.active, rc.active)?;
        check_array("active_bytes", &s.active_bytes, rc.active_bytes)?;
        check_array("requested_bytes", &s.requested_bytes, rc.requested)?;
        check_array("inactive_split", &s.inactive_split, rc.inactive_split)?;
        check_array(
            "inactive_split_bytes",
            &s.inactive_split_bytes,
            rc.inactive_split_bytes,
        )?;
        ensure!(
            s.oversize_allocations.current == rc.oversize_allocations,
            "oversize_allocations {} != recount {}",
            s.oversize_allocations.current,
            rc.oversize_allocations
        );
        ensure!(
            s.oversize_segments.current == rc.oversize_segments,
            "oversize_segments {} != recount {}",
            s.oversize_segments.current,
            rc.oversize_segments
        );
        ensure!(
            self.total_allocated_memory as i64 == s.reserved_bytes.all.current,
            "total_allocated_memory {} != reserved_bytes {}",
            self.total_allocated_memory,
            s.reserved_bytes.all.current
        );
        Ok(())
    }
}
