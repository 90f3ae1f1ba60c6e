//! Eviction: placing allocations under the budget (evicting while the memory
//! model has no room), the decision pool, the policy's choice and the
//! evictions it makes, and the figures of an impossible budget; also the
//! calls that evict on request (`free_up`, `recover_from_device_oom`,
//! `decide`) and the threshold trigger (`set_threshold`).

use std::time::Instant;

use super::Runtime;
use crate::error::{Error, ImpossibleBudget, ImpossibleCause, Result};
use crate::graph::{Residency, NONE};
use crate::ids::StorageId;
use crate::memory::{AllocFailure, Slot};
use crate::plan::StepKind;
use crate::policy::window::cheapest_window;
use crate::policy::{DecisionView, Request};

impl<V> Runtime<V> {
    pub(super) fn evict_storage(&mut self, s: StorageId, fake_delete: bool) -> Result<()> {
        // An evicted storage keeps no host copy.
        self.drop_clean_copy(s);
        self.graph.withdraw(s);
        let dead_at = if self.times_frees() {
            self.dead_since(s)
        } else {
            0.0
        };
        let r = self.graph.st_mut(s);
        let slot = r.slot.take();
        r.residency = Residency::Evicted;
        let bytes = r.bytes;
        self.values[s.0 as usize] = None;
        self.stats.live_bytes -= bytes;
        if fake_delete {
            self.stats.fake_deletes += 1;
        } else {
            self.stats.evictions += 1;
        }
        if let Some(slot) = slot {
            if self.memory.has_addresses() {
                self.unmap_ptr(&slot);
            }
            self.release_slot(slot, dead_at)?;
        }
        self.graph.dsu_on_evict(s);
        tracing::trace!(target: "remat_dtr::evict", storage = s.0, bytes, "evict");
        Ok(())
    }

    /// Evict policy-chosen storages until at least `bytes` of resident storage
    /// are freed or nothing evictable is left; returns the bytes freed.
    ///
    /// For adapters whose real allocations happen outside the runtime (an op
    /// that ran out of device memory before its outputs were recorded): free
    /// memory, then run the op again. Pinned and non-recomputable storages are
    /// never evicted.
    pub fn free_up(&mut self, bytes: u64) -> Result<u64> {
        let start = self.stats.live_bytes;
        while start.saturating_sub(self.stats.live_bytes) < bytes {
            let req = Request {
                bytes,
                shape: Some(self.memory.shape(bytes)),
                free_bytes: self.memory.free_bytes(),
            };
            if !self.evict_some(req)? && !self.evict_parked()? {
                break;
            }
        }
        Ok(start.saturating_sub(self.stats.live_bytes))
    }

    /// An op failed because the real device ran out of memory: count it, and
    /// evict at least `hint` bytes (one storage when `hint` is 0) with
    /// [`Runtime::free_up`]. Returns the bytes freed; 0 means nothing is left to
    /// evict and retrying is pointless (report [`Error::DeviceOutOfMemory`] with
    /// [`Runtime::memory_report`]).
    pub fn recover_from_device_oom(&mut self, hint: u64) -> Result<u64> {
        self.stats.device_oom_retries += 1;
        self.free_up(hint.max(1))
    }

    /// Threshold mode: evict while the resident bytes exceed the threshold (the
    /// storages held by the op being placed are not candidates).
    pub(super) fn evict_to_threshold(&mut self) -> Result<()> {
        let Some(threshold) = self.config.threshold else {
            return Ok(());
        };
        self.thresholding = true;
        let mut result = Ok(());
        while self.stats.live_bytes > threshold {
            let req = Request {
                bytes: 0,
                shape: None,
                free_bytes: self.memory.free_bytes(),
            };
            match self.evict_some(req) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.thresholding = false;
        result
    }

    /// Set (or clear) the byte threshold: before each op, evict while resident
    /// bytes exceed it. Adapters lower it when the real device holds memory the
    /// model does not see (see the candle adapter's calibration).
    pub fn set_threshold(&mut self, bytes: Option<u64>) {
        self.config.threshold = bytes;
    }

    /// Place allocations of `sizes` bytes together (the outputs of one op),
    /// evicting as needed. When no eviction can place them under a physical
    /// budget that the working set fits, the runtime moves into a compacting
    /// arena ([`Runtime::fall_back_to_arena`]) and places them again. On error
    /// nothing stays allocated.
    pub(super) fn place_all(&mut self, sizes: &[u64]) -> Result<Vec<Slot>> {
        let (mut fell_back, mut compacted) = (false, false);
        loop {
            let mut slots = Vec::with_capacity(sizes.len());
            let mut failed = None;
            for &bytes in sizes {
                match self.make_room(bytes) {
                    Ok(slot) => slots.push(slot),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let Some(e) = failed else {
                return Ok(slots);
            };
            let in_flight = !slots.is_empty();
            self.free_slots(slots);
            if !matches!(e, Error::ImpossibleBudget(_)) {
                return Err(e);
            }
            if !fell_back && self.fall_back_to_arena(sizes)? {
                fell_back = true;
                continue;
            }
            // The group's own first allocations may split the free space a
            // compaction cannot join (blocks in flight do not move): freed now,
            // compact once and place the group again.
            if in_flight && !compacted && self.defragment(None)? {
                compacted = true;
                continue;
            }
            return Err(e);
        }
    }

    /// Place `bytes`, evicting while the memory model says there is no room.
    pub(super) fn make_room(&mut self, bytes: u64) -> Result<Slot> {
        if self.iter.follower.following {
            if let Some(slot) = self.planned_alloc(bytes)? {
                self.iter.allocs += 1;
                return Ok(slot);
            }
        }
        let mut first = true;
        let mut defragged = false;
        loop {
            match self.memory.allocate(bytes) {
                Ok(slot) => {
                    self.iter.allocs += 1;
                    self.log_alloc(&slot);
                    return Ok(slot);
                }
                Err(AllocFailure::Other(m)) => return Err(Error::Memory(m)),
                Err(AllocFailure::NoRoom { free_bytes }) => {
                    // Enough free bytes, in pieces: open a hole by moving
                    // blocks where that costs less than evicting, and retry
                    // (once per eviction round).
                    if !defragged && free_bytes >= self.memory.shape(bytes).block {
                        defragged = true;
                        if self.open_hole(bytes, free_bytes)? {
                            continue;
                        }
                    }
                    defragged = false;
                    if first {
                        self.note_fragmentation(bytes, free_bytes);
                        first = false;
                        self.stats.evicting_allocations += 1;
                        self.stats.free_at_failure_bytes += free_bytes as f64;
                        if let Some(f) = self.memory.free_by_pool() {
                            let by_pool = &mut self.stats.free_at_failure_by_pool;
                            by_pool[0] += f.small_pool as f64;
                            by_pool[1] += f.large_pool as f64;
                            by_pool[2] += f.unreserved as f64;
                        }
                    }
                    self.stats.oom_retries += 1;
                    tracing::trace!(target: "remat_dtr::oom", bytes, free_bytes, "allocation failed; evicting");
                    let req = Request {
                        bytes,
                        shape: Some(self.memory.shape(bytes)),
                        free_bytes,
                    };
                    if !self.evict_some(req)? && !self.evict_parked()? {
                        self.log_step(StepKind::Fail);
                        return Err(self.impossible(bytes));
                    }
                }
            }
        }
    }

    /// Enough bytes are free for `bytes`, in pieces: open one hole the
    /// cheaper way, and say whether anything changed. Both ways open it:
    /// moving the blocks of the targeted compaction's window
    /// ([`crate::memory::MemoryModel::compaction_bytes`]; each byte read and
    /// written at [`crate::DtrConfig::move_bandwidth`]), or evicting the
    /// contiguous run of blocks that holds it at the least cost of
    /// regenerating (or swapping) them ([`cheapest_window`] over the
    /// addresses, in ns). Where moves are free (`move_bandwidth` unset) the
    /// window is moved. (Comparing a move with the policy's next victim
    /// instead, which opens no hole by itself, cost lstm's first step at 0.2
    /// 11.5× its compute against 5.1.)
    fn open_hole(&mut self, bytes: u64, free_bytes: u64) -> Result<bool> {
        let Some(gbps) = self.config.move_bandwidth else {
            return self.defragment_for(bytes);
        };
        if !self.defragmenting() {
            return Ok(false);
        }
        self.refresh_by_ptr();
        let by_ptr = &self.by_ptr;
        let move_ns = self
            .memory
            .compaction_bytes(&|p| by_ptr.contains_key(&p), bytes)
            .map_or(f64::INFINITY, |m| 2.0 * m as f64 / gbps);
        let request = Request {
            bytes,
            shape: Some(self.memory.shape(bytes)),
            free_bytes,
        };
        let mut blocks = Vec::new();
        let w = {
            let mut view = DecisionView {
                graph: &mut self.graph,
                memory: &*self.memory,
                pool: &[],
                pool_hot: &[],
                by_ptr: &self.by_ptr,
                request,
                defragmenting: false,
                sampled: false,
                segments_emptied: 0,
            };
            cheapest_window(&mut view, &mut blocks, false, |v, s| {
                let regen = v.graph.regeneration_cost(s, super::swap::REGEN_PRICE_NODES);
                v.graph.price(s, regen)
            })
        };
        match w {
            Some(w) if w.cost < move_ns => {
                let mut any = false;
                for s in w.victims {
                    if self.graph.st(s).cand_pos != NONE && self.evict_victim(s, false)? {
                        any = true;
                    }
                }
                Ok(any)
            }
            _ if move_ns.is_finite() => self.defragment_for(bytes),
            _ => Ok(false),
        }
    }

    /// Open one free run of `bytes` by moving blocks
    /// ([`Runtime::defragment`]); in a simulation that may become a plan that
    /// moves blocks, the compaction is a step of that plan.
    fn defragment_for(&mut self, bytes: u64) -> Result<bool> {
        let moved = self.defragment(Some(bytes))?;
        if moved && self.iter.follower.moving {
            self.log_step(StepKind::Compact { need: bytes });
        }
        Ok(moved)
    }

    #[cold]
    pub(super) fn impossible(&self, needed: u64) -> Error {
        let report = self.memory_report(needed);
        tracing::debug!(target: "remat_dtr::oom", %report, "impossible budget");
        Error::ImpossibleBudget(Box::new(report))
    }

    /// Where the resident bytes are now (resident, evictable, pinned, not
    /// recomputable, below the minimum evictee, free but fragmented), for a
    /// request of `needed` bytes: the figures of an impossible budget.
    pub fn memory_report(&self, needed: u64) -> ImpossibleBudget {
        let usage = self.memory.usage();
        let resident = self.stats.live_bytes;
        let evictable = self.graph.candidate_bytes;
        let (mut pinned, mut not_recomputable, mut below_min) = (0u64, 0u64, 0u64);
        for (_, r) in self.graph.storages.iter() {
            if !r.is_resident() {
                continue;
            }
            if !r.recomputable {
                not_recomputable += r.bytes;
            } else if r.pins > 0 {
                pinned += r.bytes;
            } else if r.cand_pos == NONE {
                below_min += r.bytes;
            }
        }
        let budget = usage.capacity.unwrap_or(u64::MAX);
        let block = self.memory.shape(needed).block;
        let cause = if block > budget {
            ImpossibleCause::RequestExceedsBudget
        } else if usage.allocated.saturating_add(block) > budget {
            if resident.saturating_add(needed) <= budget && usage.allocated > resident {
                ImpossibleCause::Rounding
            } else {
                ImpossibleCause::WorkingSetExceedsBudget
            }
        } else {
            ImpossibleCause::Fragmentation
        };
        ImpossibleBudget {
            cause,
            needed,
            budget,
            resident,
            evictable,
            pinned,
            not_recomputable,
            below_min_evictee: below_min,
            free_but_fragmented: self.memory.free_bytes(),
            op: None,
        }
    }

    /// Fill the decision pool: all candidates or a seeded ⌈√N⌉ sample, without
    /// those under 1 % of the mean candidate size when filtering.
    pub(super) fn fill_pool(&mut self) {
        self.pool.clear();
        self.pool_hot.clear();
        let cands = &self.graph.candidates;
        let n = cands.len();
        if n == 0 {
            return;
        }
        let threshold = if self.config.filter {
            self.graph.candidate_bytes / n as u64 / 100
        } else {
            0
        };
        let hot = &self.graph.hot;
        self.pool_sampled = self.config.sampling && n > self.policy.whole_pool_up_to();
        if self.pool_sampled {
            let k = (n as f64).sqrt().ceil() as usize;
            for _ in 0..k {
                let i = self.rng.below(n);
                if hot[i].bytes >= threshold {
                    self.pool.push(cands[i]);
                    self.pool_hot.push(hot[i]);
                }
            }
        } else {
            for (i, &s) in cands.iter().enumerate() {
                if hot[i].bytes >= threshold {
                    self.pool.push(s);
                    self.pool_hot.push(hot[i]);
                }
            }
        }
        if self.pool.is_empty() {
            self.pool.extend(cands.iter().take(64));
            self.pool_hot.extend(hot.iter().take(64));
        }
        if self.thresholding {
            self.keep_threshold_evictable();
        }
    }

    /// Threshold trigger: keep the pool's storages whose eviction keeps their
    /// evicted region small; when the sample holds none, scan every candidate.
    pub(super) fn keep_threshold_evictable(&mut self) {
        let mut k = 0;
        for i in 0..self.pool.len() {
            if self.graph.threshold_evictable(self.pool[i]) {
                self.pool.swap(k, i);
                self.pool_hot.swap(k, i);
                k += 1;
            }
        }
        self.pool.truncate(k);
        self.pool_hot.truncate(k);
        if k == 0 {
            for i in 0..self.graph.candidates.len() {
                let s = self.graph.candidates[i];
                if self.graph.threshold_evictable(s) {
                    self.pool.push(s);
                    self.pool_hot.push(self.graph.hot[i]);
                }
            }
        }
    }

    /// Ask the policy which storages it would evict to place `bytes` now, without
    /// evicting (a dry run: benches, debugging). Advances the sampler. The slice
    /// lives until the next call that decides or evicts.
    pub fn decide(&mut self, bytes: u64) -> &[StorageId] {
        let request = Request {
            bytes,
            shape: Some(self.memory.shape(bytes)),
            free_bytes: self.memory.free_bytes(),
        };
        self.choose_victims(request);
        &self.victims
    }

    /// Fill the pool and let the policy put its victims for `request` in
    /// `self.victims` (nothing is evicted). Returns how many whole segments
    /// the choice empties together (see [`DecisionView`]).
    pub(super) fn choose_victims(&mut self, request: Request) -> usize {
        self.refresh_by_ptr();
        let defragmenting = self.defragmenting();
        self.fill_pool();
        self.victims.clear();
        if self.pool.is_empty() {
            return 0;
        }
        let mut view = DecisionView {
            graph: &mut self.graph,
            memory: &*self.memory,
            pool: &self.pool,
            pool_hot: &self.pool_hot,
            by_ptr: &self.by_ptr,
            request,
            defragmenting,
            sampled: self.pool_sampled,
            segments_emptied: 0,
        };
        self.policy.choose(&mut view, &mut self.victims);
        view.segments_emptied
    }

    /// One policy decision and its evictions. `false` when nothing is evictable.
    #[cold]
    pub(super) fn evict_some(&mut self, request: Request) -> Result<bool> {
        if self.graph.candidates.is_empty() {
            return Ok(false);
        }
        let start = Instant::now();
        let segments_emptied = self.choose_victims(request);
        let elapsed = start.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        self.stats.decisions += 1;
        if segments_emptied > 1 {
            self.stats.segment_releases += 1;
        }
        self.stats.candidates_offered += self.pool.len() as u64;
        if self.record_decisions {
            self.decision_ns.push(elapsed);
        }
        let mut victims = std::mem::take(&mut self.victims);
        victims.retain(|s| {
            self.graph
                .storages
                .get(s.0)
                .is_some_and(|r| r.cand_pos != NONE)
        });
        victims.dedup();
        if victims.is_empty() {
            // The policy gave nothing usable: least recently used of the pool.
            let g = &self.graph;
            if let Some(&s) = self
                .pool
                .iter()
                .min_by(|a, b| g.st(**a).last_used.total_cmp(&g.st(**b).last_used))
            {
                victims.push(s);
            }
        }
        let mut evicted = false;
        for &s in &victims {
            // Under the threshold trigger, an earlier victim may have grown this
            // one's region: checked at each eviction.
            if self.graph.st(s).cand_pos != NONE
                && (!self.thresholding || self.graph.threshold_evictable(s))
                && self.evict_victim(s, false)?
            {
                evicted = true;
            }
        }
        self.victims = victims;
        Ok(evicted || !self.thresholding)
    }
}
