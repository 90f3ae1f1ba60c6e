//! The host tier in the runtime ([`crate::swap`]): swapping a storage out
//! instead of evicting it, swapping it back in when it is needed, and the
//! choice between the two levers for each victim.
//!
//! Invariants: a `Swapped` storage has a host copy (`copies[s]`), no slot and
//! no device value; a resident storage may keep a *clean* host copy when the
//! adapter's values change only through the runtime
//! ([`HostTransfer::values_immutable`]), and then its next swap-out copies
//! nothing; an evicted storage has none. `StorageRec::host_copy` says which
//! storages have one, and `stats.host_bytes` is the sum of their bytes. A
//! swap-out that cannot happen (host budget, failed copy) changes nothing.

use std::sync::Arc;

use super::Runtime;
use crate::error::{Error, Result};
use crate::graph::Residency;
use crate::ids::StorageId;
use crate::policy::oracle::Future;
use crate::swap::{CopyEngines, HostTransfer, HostValue};

/// Evicted ancestors visited to price a regeneration against a swap.
pub(super) const REGEN_PRICE_NODES: usize = 256;

/// Most candidates a copy ahead looks at, oldest first, for one that would
/// be swapped rather than evicted for recomputation, and most copies ahead
/// queued after one op (work bounds, not tuned).
const SKIP_AHEAD: usize = 64;

/// The runtime's host tier: the adapter's copies, the copy engines' time
/// model and the host copies by storage index.
pub(super) struct HostTier<V> {
    pub transfer: Box<dyn HostTransfer<V>>,
    pub engines: CopyEngines,
    /// The most bytes the tier holds (`None`: unbounded).
    pub limit: Option<u64>,
    /// Host copies by storage index: every swapped storage's, and the clean
    /// copies of resident ones (with `keep_clean`).
    pub copies: Vec<Option<HostValue>>,
    /// When each storage's host copy was complete (the wall clock, ns; 0
    /// for copies made before the clock, and where none was made): a
    /// prefetch cannot start before it.
    pub copied_at: Vec<f64>,
    /// The stalls of this iteration as `(compute clock, stalls so far)`, in
    /// order, after `base_stall_ns` at its start: what turns a compute
    /// clock reading (a storage's last read) into the wall clock
    /// ([`Runtime::dead_since`]).
    pub stall_marks: Vec<(f64, f64)>,
    /// The stalls before this iteration (ns).
    pub base_stall_ns: f64,
    /// Storages the tier refused ([`crate::graph::StorageRec::swap_refused`]),
    /// offered again when it gives bytes back.
    pub refused: Vec<StorageId>,
    /// Keep the host copy of a storage swapped back in (the adapter's values
    /// are immutable behind the runtime's back).
    pub keep_clean: bool,
    /// Storages by last use, oldest first, as `(storage, last_used)`;
    /// entries whose storage was used again since are stale.
    pub lru: std::collections::VecDeque<(StorageId, f64)>,
    /// The storages whose background copies may be in flight, in issue order.
    pub behind: Vec<StorageId>,
    /// Copy ahead in online steps ([`crate::SwapConfig::copy_ahead`], with a
    /// transfer that keeps values clean and copies in the background).
    pub copy_ahead: bool,
    /// In a plan's simulation that knows the recording's reads: each swap
    /// priced by the stall it is expected to leave once prefetched
    /// ([`Runtime::hidden_swap_price`]).
    pub hidden: Option<HiddenSwaps>,
}

/// What a plan's simulation needs to price a swap by what it would stall
/// once the plan prefetches it (Capuchin's test: a swap whose copies fit
/// before the storage's next read costs no stall).
pub(crate) struct HiddenSwaps {
    /// The recording's reads.
    pub future: Arc<Future>,
    /// `(deadline, copy ns)` of each swap-in booked so far: the wall clock
    /// of its next read, and how long its copy back takes.
    pub booked: Vec<(f64, f64)>,
}

impl<V> HostTier<V> {
    /// Keep `copy` as storage `i`'s host copy, complete at `done` (wall
    /// clock, ns).
    fn keep_copy(&mut self, i: usize, copy: HostValue, done: f64) {
        if self.copies.len() <= i {
            self.copies.resize_with(i + 1, || None);
        }
        self.copies[i] = Some(copy);
        if self.copied_at.len() <= i {
            self.copied_at.resize(i + 1, 0.0);
        }
        self.copied_at[i] = done;
    }

    /// Note the stalls so far after one at compute clock `clock`.
    fn mark_stall(&mut self, clock: f64, total: f64) {
        if self.stall_marks.last().is_none_or(|&(_, t)| t < total) {
            self.stall_marks.push((clock, total));
        }
    }

    /// A new iteration: forget the last one's stalls, from `total` on.
    pub(super) fn restart_stall_marks(&mut self, total: f64) {
        self.stall_marks.clear();
        self.base_stall_ns = total;
    }

    /// The stalls before compute clock `clock` (ns): those of marks at an
    /// earlier clock (a stall at `clock` itself came after the op that
    /// ended there). Before this iteration: its start's, at most.
    pub(super) fn stalls_before(&self, clock: f64) -> f64 {
        let n = self.stall_marks.partition_point(|&(c, _)| c < clock);
        match n {
            0 => self.base_stall_ns,
            _ => self.stall_marks[n - 1].1,
        }
    }
}

impl Runtime<()> {
    /// A storage of `bytes` that starts in the host tier (a simulation of an
    /// iteration whose boundary left it swapped). Needs the host tier.
    pub(crate) fn put_swapped(&mut self, bytes: u64) -> Result<crate::TensorId> {
        if self.host.is_none() {
            return Err(Error::Internal(
                "a swapped boundary storage without a host tier".into(),
            ));
        }
        self.note(crate::record::Call::Put { bytes }, &[]);
        let s = self.new_storage(bytes, None, None, 0, false, 0.0);
        let i = s.0 as usize;
        let Some(tier) = self.host.as_mut() else {
            return Err(Error::Internal("no host tier".into()));
        };
        if tier.copies.len() <= i {
            tier.copies.resize_with(i + 1, || None);
        }
        tier.copies[i] = Some(HostValue::new(()));
        let r = self.graph.st_mut(s);
        r.residency = Residency::Swapped;
        r.host_copy = true;
        self.stats.host_bytes += bytes;
        self.stats.peak_host_bytes = self.stats.peak_host_bytes.max(self.stats.host_bytes);
        Ok(self.new_tensor(s))
    }
}

impl<V> Runtime<V> {
    /// Give the runtime the adapter's copies between the device and the host
    /// tier, turning swap on when the config asks for it (`swap:on` and a
    /// bandwidth; see [`crate::swap`]). Without a bandwidth in the config the
    /// call is an [`Error::Config`] naming `swap_bandwidth`: measure it and
    /// set [`crate::SwapConfig::bandwidth_gbps`] first. With swap off in the
    /// config, the transfer is kept unused.
    pub fn set_host_transfer(&mut self, transfer: Box<dyn HostTransfer<V>>) -> Result<()> {
        let swap = self.config.swap;
        let Some(gbps) = swap.bandwidth_gbps.filter(|_| swap.enabled) else {
            if swap.enabled {
                return Err(Error::Config(crate::config::ConfigError::BadValue {
                    key: "swap_bandwidth".into(),
                    value: "unset".into(),
                    expected: "a bandwidth in GB/s per direction with swap:on (set it, or \
                               let the adapter measure it)"
                        .into(),
                }));
            }
            return Ok(());
        };
        self.config.check()?;
        let limit = swap.host_budget.and_then(|h| h.bytes(self.config.budget));
        let keep_clean = transfer.values_immutable();
        let copy_ahead = swap.copy_ahead && keep_clean && transfer.copies_in_background();
        self.host = Some(HostTier {
            keep_clean,
            transfer,
            engines: CopyEngines::new(gbps),
            limit,
            copies: Vec::new(),
            copied_at: Vec::new(),
            stall_marks: Vec::new(),
            base_stall_ns: 0.0,
            refused: Vec::new(),
            lru: std::collections::VecDeque::new(),
            behind: Vec::new(),
            copy_ahead,
            hidden: None,
        });
        self.graph.set_swap_price(Some(1.0 / gbps));
        Ok(())
    }

    /// In a planner simulation that knows the recording's reads (`future`):
    /// choose between swapping and evicting each victim by the stall its
    /// swap is expected to leave once the plan prefetches it
    /// ([`Runtime::hidden_swap_price`]), not by its round trip. No-op
    /// without a host tier.
    pub(crate) fn price_swaps_by_future(&mut self, future: Arc<Future>) {
        if let Some(tier) = self.host.as_mut() {
            tier.hidden = Some(HiddenSwaps {
                future,
                booked: Vec::new(),
            });
        }
    }

    /// The stall (ns) a swap of `s` now is expected to cost in the plan made
    /// from this simulation: what is left of its copy out (a plan starts it
    /// at the storage's last use, on the engine as simulated so far), plus
    /// how late its copy back completes when it starts one copy time before
    /// the next read (or once the host copy is complete, if later), plus the
    /// overlap of that window with the copies back already booked. `None`
    /// outside such a simulation or for a storage not read again.
    fn hidden_swap_price(&self, s: StorageId) -> Option<f64> {
        let (deadline, copy) = self.hidden_copy_back(s)?;
        let tier = self.host.as_ref()?;
        let booked = &tier.hidden.as_ref()?.booked;
        let wall = self.copy_clock_ns();
        let out_done = if self.graph.st(s).host_copy {
            tier.copied_at.get(s.0 as usize).copied().unwrap_or(0.0)
        } else {
            tier.engines.d2h_free_at.max(self.dead_since(s).min(wall)) + copy
        };
        let out = (out_done - wall).max(0.0);
        // The copy back starts one copy time before the read at the
        // earliest (its destination must be free by then), after the host
        // copy is complete; the copies back booked over that window delay
        // it by their overlap with it.
        let start = (deadline - copy).max(out_done).max(wall);
        let late = (start + copy - deadline).max(0.0);
        let overlap: f64 = (booked.iter())
            .map(|&(d, c)| (d.min(deadline) - (d - c).max(start)).max(0.0))
            .sum();
        Some(out + late + overlap)
    }

    /// Where swaps are priced by [`Runtime::hidden_swap_price`]: the wall
    /// clock of `s`'s next read and the time its copy back takes (ns);
    /// `None` elsewhere or for a storage not read again.
    fn hidden_copy_back(&self, s: StorageId) -> Option<(f64, f64)> {
        let tier = self.host.as_ref()?;
        let hidden = tier.hidden.as_ref()?;
        let r = self.graph.st(s);
        let next = (hidden.future).time_to_next_read(u64::from(r.seq), self.graph.pos as usize)?;
        Some((
            self.copy_clock_ns() + next,
            r.bytes as f64 * tier.engines.ns_per_byte,
        ))
    }

    /// Book the swap-in of `s`, just swapped out, where swaps are priced by
    /// [`Runtime::hidden_swap_price`] (a no-op elsewhere).
    fn book_hidden_swap(&mut self, s: StorageId) {
        let Some(booking) = self.hidden_copy_back(s) else {
            return;
        };
        let wall = self.copy_clock_ns();
        if let Some(hidden) = self.host.as_mut().and_then(|t| t.hidden.as_mut()) {
            hidden.booked.retain(|&(d, _)| d > wall);
            hidden.booked.push(booking);
        }
    }

    /// Keep the host tier for what it holds (a boundary's swapped storages
    /// come back by a copy) but swap nothing more out: the planner's
    /// recompute-only simulations.
    pub(crate) fn forbid_swap_outs(&mut self) {
        self.graph.set_swap_price(None);
    }

    /// Whether swap is on (a transfer was given and the config asks for it).
    pub fn swap_enabled(&self) -> bool {
        self.host.is_some()
    }

    /// Whether `t`'s storage is in the host tier now.
    pub fn is_swapped(&self, t: crate::TensorId) -> Result<bool> {
        let s = self.tensor(t)?.storage;
        Ok(self.graph.st(s).residency == Residency::Swapped)
    }

    /// Compute, recomputation and stalls so far: the clock the host tier's
    /// copies are timed on ([`crate::RuntimeStats::copy_clock_ns`]; charged
    /// moves stand outside it).
    pub(super) fn copy_clock_ns(&self) -> f64 {
        self.stats.copy_clock_ns()
    }

    /// Free `s` (a victim of the policy, resident) the cheaper way: swap it
    /// out when swap is on and its copies cost less than regenerating it
    /// would (its own cost and its evicted ancestors', the replay its next
    /// use pays; always, for a storage that cannot be recomputed), else evict
    /// it for recomputation. `false` when neither could be done (a
    /// non-recomputable storage the host tier refused; it leaves the
    /// candidates until it is next used).
    ///
    /// Not h_DTR's e*, which the policies rank by: e* adds the evicted
    /// descendants, a heuristic for what eviction does to the neighbourhood,
    /// and taken as the price of the replay it chose copies that cost more
    /// than the replays they replaced (vit_b_16 at 0.2, 24 GB/s, first step:
    /// 1.84 of stalls for 0.55 of replays saved).
    ///
    /// In the last retry of a regeneration ([`Runtime::hold`]), a `parked`
    /// victim (its last resort, [`Runtime::evict_parked`]) is swapped
    /// whenever the tier takes it, whatever the prices: recomputing it would
    /// need its inputs placed beside what the regeneration holds, the memory
    /// it just failed to find, while its copy comes back alone (resnet50 at
    /// 0.1, 24 GB/s: two 308 MB inputs of an in-place op, each regenerated
    /// from an evicted 308 MB input, evicted each other in turn until the
    /// budget was called impossible). Only there: swapping every parked
    /// victim took gpt2's first step at 0.2, 12 GB/s, from 11.4 to past 20×
    /// in copies.
    pub(super) fn evict_victim(&mut self, s: StorageId, parked: bool) -> Result<bool> {
        if self.host.is_some() {
            let swap = self.swap_rather_than_evict(s, parked);
            if swap && self.swap_out(s)? {
                self.book_hidden_swap(s);
                self.log_swap(s, parked);
                return Ok(true);
            }
            if !self.graph.st(s).recomputable {
                self.graph.withdraw(s);
                self.graph.st_mut(s).swap_refused = true;
                if let Some(tier) = self.host.as_mut() {
                    tier.refused.push(s);
                }
                return Ok(false);
            }
        }
        self.log_eviction(s, parked);
        self.evict_storage(s, false)?;
        Ok(true)
    }

    /// Whether victim `s` would be swapped rather than evicted for
    /// recomputation ([`Runtime::evict_victim`]'s choice; swap on).
    fn swap_rather_than_evict(&mut self, s: StorageId, parked: bool) -> bool {
        if parked && self.swap_parked {
            return self.graph.swap_price(s).is_some();
        }
        let replay = self.graph.regeneration_cost(s, REGEN_PRICE_NODES);
        match (self.graph.swap_price(s)).and_then(|_| self.hidden_swap_price(s)) {
            Some(stall) => !self.graph.st(s).recomputable || stall < replay,
            None => self.graph.prefers_swap(s, replay),
        }
    }

    /// Ask the policy which storages it would evict to place `bytes` now,
    /// and for each whether the runtime would swap it (`true`) or evict it
    /// for recomputation (`false`), without doing either: a dry run, as
    /// [`Runtime::decide`] (benches, debugging). With swap off every victim
    /// is `false`.
    pub fn decide_levers(&mut self, bytes: u64) -> Vec<(StorageId, bool)> {
        let victims = self.decide(bytes).to_vec();
        let swap_on = self.host.is_some();
        victims
            .into_iter()
            .map(|s| (s, swap_on && self.swap_rather_than_evict(s, false)))
            .collect()
    }

    /// Copy `s` (resident) to the host tier and free its device memory once
    /// the copy completed; with a clean host copy, free it at once. `false`,
    /// with nothing changed, when the host budget has no room (after dropping
    /// other storages' clean copies) or the copy failed.
    pub(super) fn swap_out(&mut self, s: StorageId) -> Result<bool> {
        let bytes = self.graph.st(s).bytes;
        let i = s.0 as usize;
        let clean = self.graph.st(s).host_copy;
        let limit = self.host.as_ref().and_then(|t| t.limit);
        if !clean && limit.is_some_and(|l| self.stats.host_bytes.saturating_add(bytes) > l) {
            self.drop_clean_copies(bytes);
            if limit.is_some_and(|l| self.stats.host_bytes.saturating_add(bytes) > l) {
                self.stats.swap_refusals += 1;
                return Ok(false);
            }
        }
        let wall = self.copy_clock_ns();
        // Its range holds nothing needed since its last read, or, when it is
        // copied, since the copy completed.
        let mut dead_at = self.dead_since(s);
        let Some(tier) = self.host.as_mut() else {
            return Ok(false);
        };
        if clean {
            self.stats.clean_swap_outs += 1;
            // A copy made ahead may still be in flight.
            let ready = tier.copied_at.get(i).copied().unwrap_or(0.0);
            let stall = (ready - wall).max(0.0);
            if stall > 0.0 {
                self.stats.stall_ns += stall;
                tier.mark_stall(self.graph.clock, self.stats.stall_ns);
            }
            dead_at = dead_at.max(ready);
        } else {
            let value = self.values[i]
                .as_ref()
                .ok_or_else(|| Error::Internal("swapping out a storage with no value".into()))?;
            let copy = match tier.transfer.to_host(value, bytes) {
                Ok(copy) => copy,
                Err(e) => {
                    tracing::warn!(target: "remat_dtr::swap", storage = s.0, error = %e, "swap-out failed; the value stays resident");
                    self.stats.swap_failures += 1;
                    return Ok(false);
                }
            };
            // A plan (and its simulation) knows at the storage's last use that
            // it will swap it: the copy could start then. Online, only now.
            let planned = self.iter.follower.following || self.iter.follower.plan_log.is_some();
            let before = tier.engines.behind;
            let stall = if planned {
                tier.engines.swap_out_ahead(dead_at, wall, bytes)
            } else {
                tier.engines.swap_out_now(wall, bytes)
            };
            tier.keep_copy(i, copy, tier.engines.last_out_done);
            // The background copies it delayed complete that much later.
            if let (Some(b0), Some(b1)) = (before, tier.engines.behind) {
                let delay = b1 - b0;
                // Not this storage: a clean copy of it in flight was dropped
                // (host budget), and this copy is its own.
                for b in tier.behind.iter().filter(|&&b| b != s) {
                    if let Some(at) = tier.copied_at.get_mut(b.0 as usize) {
                        if *at > wall {
                            *at += delay;
                        }
                    }
                }
            }
            dead_at = dead_at.max(tier.copied_at[i]);
            self.stats.stall_ns += stall;
            tier.mark_stall(self.graph.clock, self.stats.stall_ns);
            self.stats.swapped_out_bytes += bytes;
            self.stats.host_bytes += bytes;
            self.stats.peak_host_bytes = self.stats.peak_host_bytes.max(self.stats.host_bytes);
        }
        self.graph.withdraw(s);
        let r = self.graph.st_mut(s);
        let slot = r.slot.take();
        r.residency = Residency::Swapped;
        r.host_copy = true;
        r.copied_ahead = false;
        self.values[i] = None;
        self.stats.live_bytes -= bytes;
        self.stats.swap_outs += 1;
        if let Some(slot) = slot {
            if self.memory.has_addresses() {
                self.unmap_ptr(&slot);
            }
            self.release_slot(slot, dead_at)?;
        }
        tracing::trace!(target: "remat_dtr::swap", storage = s.0, bytes, clean, "swap out");
        Ok(true)
    }

    /// Whether this step copies ahead: online (a plan, and its simulation,
    /// start each swap-out's copy at the storage's last use) with a tier
    /// that may ([`HostTier::copy_ahead`]).
    fn copying_ahead(&self) -> bool {
        let f = &self.iter.follower;
        !f.following && f.plan_log.is_none() && self.host.as_ref().is_some_and(|t| t.copy_ahead)
    }

    /// After an op that ended at compute clock `at`, took `horizon` ns,
    /// wrote `fresh` and read `read`: note those uses, then copy resident
    /// candidates without a host copy to the host tier, keeping them
    /// resident (clean copies), until the device-to-host engine is busy for
    /// `horizon` more ns (the guess at the next op's length; at most
    /// [`SKIP_AHEAD`] copies). Each is, of the [`SKIP_AHEAD`] least recently
    /// used, the first that would be swapped were it the victim now
    /// ([`crate::graph::Graph::prefers_swap`] at its regeneration cost), or
    /// the oldest when none would. A later swap-out of one then frees its
    /// memory at once instead of stalling for the copy ([`crate::swap`],
    /// *Copying ahead*). A copy that fails is dropped: the value stays
    /// resident, as it was. Online steps only.
    pub(super) fn copy_ahead(
        &mut self,
        fresh: &[StorageId],
        read: &[StorageId],
        at: f64,
        horizon: f64,
    ) {
        if !self.copying_ahead() {
            return;
        }
        let live = self.graph.storages.len();
        let Some(tier) = self.host.as_mut() else {
            return;
        };
        tier.lru.extend(fresh.iter().chain(read).map(|&s| (s, at)));
        // Stale entries (used again since, freed) are dropped at the front;
        // compact when they pile up behind a long-lived one.
        if tier.lru.len() > 4 * live + 1024 {
            let storages = &self.graph.storages;
            tier.lru
                .retain(|&(s, at)| storages.get(s.0).is_some_and(|r| r.last_used == at));
        }
        let wall = self.copy_clock_ns();
        if let Some(tier) = self.host.as_mut() {
            let copied_at = &tier.copied_at;
            tier.behind
                .retain(|b| copied_at.get(b.0 as usize).is_some_and(|&at| at > wall));
        }
        // Keep the engine busy for as long again as this op took, the guess
        // at the next op's length. One pass over the oldest candidates: the
        // ones passed over stay passed over (copying ahead changes no price).
        let mut skipped = Vec::new();
        for _ in 0..SKIP_AHEAD {
            let busy = self
                .host
                .as_ref()
                .map_or(f64::INFINITY, |t| t.engines.d2h_free_at);
            if busy > wall + horizon.max(0.0) {
                break;
            }
            let Some(next) = self.next_to_copy_ahead(&mut skipped) else {
                break;
            };
            match self.copy_one_ahead(next, wall) {
                Some(true) => {}
                Some(false) => break,
                None => {
                    // The host budget is full: it stays first in line.
                    skipped.insert(0, next);
                    break;
                }
            }
        }
        if let Some(tier) = self.host.as_mut() {
            for &e in skipped.iter().rev() {
                tier.lru.push_front(e);
            }
        }
    }

    /// The next storage to copy ahead, taken from the least recently used
    /// (see [`Runtime::copy_ahead`]): the first that would be swapped were
    /// it the victim now, looking at most [`SKIP_AHEAD`] past (`skipped`,
    /// oldest first, for the caller to put back), else the oldest of those.
    fn next_to_copy_ahead(
        &mut self,
        skipped: &mut Vec<(StorageId, f64)>,
    ) -> Option<(StorageId, f64)> {
        let tier = self.host.as_mut()?;
        while skipped.len() < SKIP_AHEAD {
            let Some((s, at)) = tier.lru.pop_front() else {
                break;
            };
            let Some(r) = self.graph.storages.get(s.0) else {
                continue;
            };
            if r.last_used != at
                || r.host_copy
                || !r.is_resident()
                || r.cand_pos == crate::graph::NONE
            {
                continue;
            }
            // Copy what would be swapped if it were the victim now: a
            // storage cheaper to replay is evicted, and its copy wasted.
            let replay = self.graph.regeneration_cost(s, REGEN_PRICE_NODES);
            if self.graph.prefers_swap(s, replay) {
                return Some((s, at));
            }
            skipped.push((s, at));
        }
        // None of them would be swapped now: the oldest, as it may be later
        // (its evicted neighbourhood grows).
        (!skipped.is_empty()).then(|| skipped.remove(0))
    }

    /// Copy `(s, at)` ahead, issued at wall clock `wall`: `Some(true)` when
    /// copied, `Some(false)` when it could not be (no value, a failed copy:
    /// it is dropped from the line), `None` when the host budget has no room.
    fn copy_one_ahead(&mut self, (s, _): (StorageId, f64), wall: f64) -> Option<bool> {
        let tier = self.host.as_mut()?;
        let bytes = self.graph.st(s).bytes;
        if tier
            .limit
            .is_some_and(|l| self.stats.host_bytes.saturating_add(bytes) > l)
        {
            return None;
        }
        let i = s.0 as usize;
        let Some(value) = self.values[i].as_ref() else {
            return Some(false);
        };
        let Ok(copy) = tier.transfer.to_host(value, bytes) else {
            self.stats.swap_failures += 1;
            return Some(false);
        };
        let done = tier.engines.copy_behind(wall, bytes);
        tier.keep_copy(i, copy, done);
        tier.behind.push(s);
        self.stats.swapped_out_bytes += bytes;
        self.stats.host_bytes += bytes;
        self.stats.peak_host_bytes = self.stats.peak_host_bytes.max(self.stats.host_bytes);
        self.stats.copies_ahead += 1;
        // Priced as before (two copies): see `StorageRec::copied_ahead`.
        let r = self.graph.st_mut(s);
        r.host_copy = true;
        r.copied_ahead = true;
        Some(true)
    }

    /// Drop the clean host copies of resident storages until `bytes` more
    /// fit the host budget (or none is left).
    fn drop_clean_copies(&mut self, bytes: u64) {
        let Some(limit) = self.host.as_ref().and_then(|t| t.limit) else {
            return;
        };
        let clean: Vec<StorageId> = (self.graph.storages.iter())
            .filter(|(_, r)| r.host_copy && r.is_resident())
            .map(|(i, _)| StorageId(i))
            .collect();
        for s in clean {
            if self.stats.host_bytes.saturating_add(bytes) <= limit {
                break;
            }
            self.drop_clean_copy(s);
        }
    }

    /// Drop the clean host copy of resident `s`, if it has one (its value is
    /// about to change, or leave the runtime's sight, or the host needs the
    /// room); its price as a candidate goes back to two copies.
    pub(super) fn drop_clean_copy(&mut self, s: StorageId) {
        let r = self.graph.st(s);
        if !r.host_copy || r.residency == Residency::Swapped {
            return;
        }
        let bytes = r.bytes;
        self.drop_host_copy(s, bytes);
        if let Some(r) = self.graph.storages.get_mut(s.0) {
            r.host_copy = false;
            r.copied_ahead = false;
        }
        if self.graph.st(s).cand_pos != crate::graph::NONE {
            self.graph.withdraw(s);
            self.graph.offer(s);
        }
    }

    /// Copy swapped `s` back into a slot placed under the budget (which may
    /// evict or swap others). A failed copy is [`Error::Transfer`]: the slot
    /// is freed, the host copy stays, nothing is lost.
    pub(super) fn swap_in(&mut self, s: StorageId) -> Result<()> {
        let bytes = self.graph.st(s).bytes;
        let mut slots = self.place_all(&[bytes])?;
        let slot = slots
            .pop()
            .ok_or_else(|| Error::Internal("no slot".into()))?;
        let wall = self.copy_clock_ns();
        let i = s.0 as usize;
        let prefetch = self.prefetch_issue(&slot);
        let tier = self
            .host
            .as_mut()
            .ok_or_else(|| Error::Internal("a swapped storage without a host tier".into()))?;
        let copy = tier.copies.get(i).and_then(Option::as_ref);
        let result = match copy {
            Some(copy) => tier.transfer.to_device(copy, bytes),
            None => {
                self.free_slots(vec![slot]);
                return Err(Error::Internal(
                    "a swapped storage without a host copy".into(),
                ));
            }
        };
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                self.stats.swap_failures += 1;
                self.free_slots(vec![slot]);
                return Err(Error::Transfer(e));
            }
        };
        // Keep the copy while it stays valid (clean), else give its bytes back.
        let keep = tier.keep_clean;
        let refused = if keep {
            Vec::new()
        } else {
            tier.copies[i] = None;
            self.stats.host_bytes -= bytes;
            std::mem::take(&mut tier.refused)
        };
        // Following a plan, the copy started once its destination was free
        // and its host copy complete (a prefetch); online, at the read.
        let ready = tier.copied_at.get(i).copied().unwrap_or(0.0);
        let stall = match prefetch {
            Some(issue) => {
                self.stats.prefetches += 1;
                tier.engines.swap_in_ahead(issue.max(ready), wall, bytes)
            }
            None => tier.engines.swap_in_now(wall, bytes),
        };
        self.stats.stall_ns += stall;
        tier.mark_stall(self.graph.clock, self.stats.stall_ns);
        self.stats.swap_ins += 1;
        self.stats.swapped_in_bytes += bytes;
        self.values[i] = Some(value);
        self.log_swap_in(&slot, wall, stall, ready, bytes);
        let ptr = slot.ptr;
        let has_block = slot.size > 0;
        let now = self.graph.clock;
        let r = self.graph.st_mut(s);
        r.residency = Residency::Resident;
        r.slot = Some(slot);
        r.last_used = now;
        r.host_copy = keep;
        if has_block {
            self.map_ptr(ptr, s);
        }
        self.stats.live_bytes += bytes;
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
        self.graph.offer(s);
        self.reoffer_refused(refused);
        tracing::trace!(target: "remat_dtr::swap", storage = s.0, bytes, stall, "swap in");
        Ok(())
    }

    /// The host tier gave bytes back: what it refused may be taken now.
    fn reoffer_refused(&mut self, refused: Vec<StorageId>) {
        for s in refused {
            if let Some(r) = self.graph.storages.get_mut(s.0) {
                r.swap_refused = false;
                self.graph.offer(s);
            }
        }
    }

    /// Drop the host copy of a storage being deleted (a no-op for one that is
    /// not swapped).
    pub(super) fn drop_host_copy(&mut self, s: StorageId, bytes: u64) {
        if let Some(copy) = (self.host.as_mut())
            .and_then(|t| t.copies.get_mut(s.0 as usize))
            .and_then(Option::take)
        {
            drop(copy);
            self.stats.host_bytes -= bytes;
            let refused = (self.host.as_mut())
                .map(|t| std::mem::take(&mut t.refused))
                .unwrap_or_default();
            self.reoffer_refused(refused);
        }
    }
}
