//! The host tier (issue 33): a storage may be **swapped** — its bytes copied
//! to host memory and its device memory freed — instead of evicted for
//! recomputation, when that costs less (MegTaiChi's DTE, Capuchin).
//!
//! - [`SwapConfig`]: on/off, the bandwidth per direction and the host budget
//!   (`REMAT_DTR_CONF` keys `swap`, `swap_bandwidth`, `host_budget`).
//! - [`HostTransfer`]: the adapter's copy engine — one call copies a value to
//!   the host tier, one copies it back. A copy returns only once it is
//!   complete (the adapter waits on its completion event), so the device
//!   memory of a swapped-out storage is freed only after its copy completed.
//! - [`CopyEngines`]: the time model: one copy engine per direction,
//!   concurrent with compute. An online swap-out that makes room stalls
//!   compute until its copy completes (the memory is needed now); an online
//!   swap-in stalls until its copy completes (nothing prefetched it). A
//!   planned swap-out (a plan's simulation, and an iteration following the
//!   plan) may start its copy at the storage's last use, since the plan
//!   knows then that it will swap it; a planned swap-in, in an iteration
//!   following its plan, starts its copy once its destination range in the
//!   plan's arena holds nothing needed and its host copy is complete (a
//!   prefetch), and stalls only for what is left at the read. This is the
//!   replayer's model: the adapters' transfers are synchronous today, so on
//!   a device every copy happens when its memory is needed, as online.
//!
//! # The choice, and why it bounds an online step
//!
//! Evicting storage `s` for recomputation is priced by h_DTR's e* (its own
//! cost plus its evicted neighbourhood). Swapping it is priced by the two
//! copies it costs online, `2 · bytes ÷ bandwidth`. The policies score every
//! candidate by the cheaper of the two ([`crate::DecisionView`] applies the
//! minimum), and the runtime takes the cheaper action for each victim. So a
//! storage whose evicted neighbourhood has grown past the price of its copies
//! is swapped, not evicted: its regeneration will not replay that
//! neighbourhood. A swapped storage comes back by one copy and needs none of
//! its inputs: a swap cannot cascade. The stall one online step can add is at
//! most two copies of every byte it evicts, a bound that holds for any graph,
//! where recomputation's bound grows with the evicted regions.
//!
//! Parameters, inputs and other non-recomputable storages become candidates
//! too when swap is on; their only price is the copy.
//!
//! # In a plan: the stall a prefetched swap leaves (Capuchin's test)
//!
//! The round trip is what an online step pays. A plan prefetches, so a swap
//! whose copy out and copy back both fit before the storage's next read,
//! beside the copies back already booked on the engine, stalls nothing,
//! however many bytes it moves; where the link has idle time, swapping a
//! storage that is cheap to replay then costs less than replaying it. So
//! the planner's swapping pass simulates its winner once more (the
//! recompute-only winner where no swap paid) choosing each victim's fate by
//! that expected stall, read from the recording's future
//! (`Runtime::price_swaps_by_future`); the plan competes by its re-timed,
//! placed cost and is taken only where that is lower. Capuchin (ASPLOS'20)
//! chooses between swapping and recomputing by the same test, the "free
//! time" between an eviction and the next access.
//!
//! # Copying ahead
//!
//! Online, a swap-out is chosen when memory is needed, so its copy is on the
//! critical path: gpt2 at 0.3 of its peak, 24 GB/s, stalled 2.54× its
//! compute on copies in its first step, about half of it on copies out
//! (1.45 GB of them). With
//! [`SwapConfig::copy_ahead`] (on by default) the runtime keeps the idle
//! device-to-host engine busy copying a candidate without a host copy,
//! which stays resident with a clean copy: among the least recently used,
//! the first that would be *swapped* were it the victim now, since one
//! cheaper to replay would be evicted for recomputation and its copy wasted
//! (the oldest when none of them would); at the end of each op it queues
//! such copies until the engine is busy for as long again as the op took.
//! A later swap-out of one frees its memory at once, or once the rest of
//! its copy completes. Two rules keep this from costing anything:
//!
//! - it never changes which victim is taken: a copy made ahead is priced as
//!   the two copies it would cost without it
//!   (`StorageRec::copied_ahead`), so the policy sees the prices it saw
//!   before and makes the same choices;
//! - a background copy yields to one whose memory is needed: it is issued
//!   in chunks on a low-priority stream, so an urgent copy waits at most a
//!   chunk (not modelled) and the background copies in flight complete
//!   that much later ([`CopyEngines::swap_out_now`]).
//!
//! So each swap-out waits at most what it waited without copies ahead, and
//! an online step with them costs at most what it costs without, up to the
//! thrash rescue, which sees the lower cost. It needs values that change
//! only through the runtime and copies that run beside compute
//! ([`HostTransfer::copies_in_background`]): the replayer's time model has
//! both; the adapters' copies are synchronous today, so they copy nothing
//! ahead. Planned steps do not need it: a plan starts each swap-out's copy
//! at the storage's last use.

use std::any::Any;
use std::fmt;

/// Settings of the host tier. Off by default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwapConfig {
    /// Swap storages to the host tier when that is cheaper than recomputing
    /// them (and the only way out for non-recomputable ones).
    pub enabled: bool,
    /// Copy bandwidth per direction in GB/s (10⁹ bytes per second, so bytes
    /// per ns numerically). `None`: the adapter measures it at start-up; a
    /// runtime without either refuses to start with swap on.
    pub bandwidth_gbps: Option<f64>,
    /// The most bytes the host tier may hold; `None` is unbounded.
    pub host_budget: Option<HostBudget>,
    /// In an online step, keep the idle device-to-host engine copying an old
    /// candidate that would be swapped if taken to the host tier, so that a later
    /// swap-out of it frees its memory without waiting for its copy
    /// (`copy_ahead`, on by default). It needs a transfer whose copies run
    /// beside compute and whose values change only through the runtime
    /// ([`HostTransfer::copies_in_background`]); it never changes which
    /// victim is taken (see [`crate::swap`], *Copying ahead*).
    pub copy_ahead: bool,
}

impl Default for SwapConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            bandwidth_gbps: None,
            host_budget: None,
            copy_ahead: true,
        }
    }
}

/// The host tier's size: bytes, or a percentage of the device budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HostBudget {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this percentage of the device budget (may exceed 100).
    PercentOfBudget(f64),
}

impl HostBudget {
    /// The budget in bytes for a device budget of `device` bytes (`None`:
    /// unbounded device budget and a percentage: unbounded).
    pub fn bytes(self, device: Option<u64>) -> Option<u64> {
        match self {
            HostBudget::Bytes(b) => Some(b),
            HostBudget::PercentOfBudget(p) => device.map(|d| (d as f64 * p / 100.0) as u64),
        }
    }
}

impl fmt::Display for HostBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostBudget::Bytes(b) => write!(f, "{b}"),
            HostBudget::PercentOfBudget(p) => write!(f, "{p}%"),
        }
    }
}

/// A value's bytes in the host tier, as the adapter's [`HostTransfer`] made
/// them (a pinned host block, a CPU tensor, nothing for trace replay).
pub struct HostValue(Box<dyn Any + Send>);

impl HostValue {
    /// Wrap an adapter's host copy.
    pub fn new<T: Any + Send>(value: T) -> Self {
        Self(Box::new(value))
    }

    /// The host copy, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for HostValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HostValue(..)")
    }
}

/// Why a copy between the device and the host tier failed. The runtime loses
/// nothing when one does: a failed swap-out leaves the value resident; a
/// failed swap-in leaves the host copy in place and the device usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{direction} copy of {bytes} B failed: {message}")]
pub struct TransferError {
    /// `"device-to-host"` or `"host-to-device"`.
    pub direction: &'static str,
    /// Bytes of the storage.
    pub bytes: u64,
    /// The adapter's message (driver error, host budget, injected failure).
    pub message: String,
}

impl TransferError {
    /// A failed swap-out.
    pub fn to_host(bytes: u64, message: impl Into<String>) -> Self {
        Self {
            direction: "device-to-host",
            bytes,
            message: message.into(),
        }
    }

    /// A failed swap-in.
    pub fn to_device(bytes: u64, message: impl Into<String>) -> Self {
        Self {
            direction: "host-to-device",
            bytes,
            message: message.into(),
        }
    }
}

/// The adapter's copies between device values `V` and the host tier. Each
/// call returns once its copy is complete (an asynchronous engine waits on
/// its event before returning), and leaves its argument untouched.
pub trait HostTransfer<V>: Send {
    /// Copy `value` (a storage of `bytes` bytes) to the host tier.
    fn to_host(&mut self, value: &V, bytes: u64) -> Result<HostValue, TransferError>;
    /// Copy `host` back to the device, bit for bit.
    fn to_device(&mut self, host: &HostValue, bytes: u64) -> Result<V, TransferError>;

    /// Whether a resident value can change only through the runtime (a new
    /// version by [`crate::Runtime::mutate`]), never in place behind its
    /// back. Then the host copy of a storage swapped back in stays valid
    /// (*clean*) while the storage is resident, and its next swap-out copies
    /// nothing (as an OS drops a clean page). Default `false`: every swap-out
    /// copies. Even when `true`, [`crate::Runtime::pin`] (handing a value to
    /// code outside the runtime) drops the clean copy.
    fn values_immutable(&self) -> bool {
        false
    }

    /// Whether a copy to the host can run on its own engine while compute
    /// goes on (an asynchronous copy on a transfer stream), so that the
    /// runtime may copy a value ahead of any need for its memory
    /// ([`SwapConfig::copy_ahead`]) without stalling compute. Default
    /// `false`: each copy returns once complete, on the caller's time.
    fn copies_in_background(&self) -> bool {
        false
    }
}

/// The transfer of value-free runtimes (trace replay, `V = ()`): nothing to
/// copy; only the time model and the accounting run.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoValues;

impl HostTransfer<()> for NoValues {
    fn to_host(&mut self, _: &(), _: u64) -> Result<HostValue, TransferError> {
        Ok(HostValue::new(()))
    }

    fn to_device(&mut self, _: &HostValue, _: u64) -> Result<(), TransferError> {
        Ok(())
    }

    /// Trace values change only by `MUTATE`, which makes a new version.
    fn values_immutable(&self) -> bool {
        true
    }

    /// The replayer's copies are the time model's, one engine per
    /// direction beside compute.
    fn copies_in_background(&self) -> bool {
        true
    }
}

/// One copy engine per direction, concurrent with compute. Times are ns of
/// the runtime's wall clock: compute, recomputation and stalls so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyEngines {
    /// ns per byte per direction (1 ÷ GB/s).
    pub ns_per_byte: f64,
    /// When the device-to-host engine is next free.
    pub d2h_free_at: f64,
    /// When the host-to-device engine is next free.
    pub h2d_free_at: f64,
    /// When the last of the copies made ahead in the background
    /// ([`Self::copy_behind`]) completes, while one is in flight.
    pub behind: Option<f64>,
    /// When the device-to-host copies whose memory was needed complete.
    pub urgent_free_at: f64,
    /// When the last device-to-host copy issued completes.
    pub last_out_done: f64,
}

impl CopyEngines {
    /// Engines of `gbps` GB/s per direction, both idle.
    pub fn new(gbps: f64) -> Self {
        Self {
            ns_per_byte: 1.0 / gbps,
            d2h_free_at: 0.0,
            h2d_free_at: 0.0,
            behind: None,
            urgent_free_at: 0.0,
            last_out_done: 0.0,
        }
    }

    /// A copy of `bytes` to the host issued at `now` whose memory is needed
    /// at once: the stall (ns) until it completes.
    /// A background copy in flight yields: it is issued in chunks on a
    /// low-priority stream, so this copy waits for at most one chunk (not
    /// modelled) and the background copy completes this copy's time later.
    pub fn swap_out_now(&mut self, now: f64, bytes: u64) -> f64 {
        let t = bytes as f64 * self.ns_per_byte;
        let done = match self.behind.filter(|&bd| bd > now) {
            Some(bd) => {
                let done = self.urgent_free_at.max(now) + t;
                self.behind = Some(bd + t);
                self.d2h_free_at = self.d2h_free_at.max(bd + t).max(done);
                done
            }
            None => {
                self.behind = None;
                let done = self.d2h_free_at.max(now) + t;
                self.d2h_free_at = done;
                done
            }
        };
        self.urgent_free_at = done;
        self.last_out_done = done;
        done - now
    }

    /// A copy of `bytes` to the host made ahead, in the background, issued
    /// at `now` with the engine idle (nothing needs its memory yet): when it
    /// completes, unless copies whose memory is needed delay it.
    pub fn copy_behind(&mut self, now: f64, bytes: u64) -> f64 {
        let done = self.d2h_free_at.max(now) + bytes as f64 * self.ns_per_byte;
        self.d2h_free_at = done;
        self.behind = Some(done);
        self.last_out_done = done;
        done
    }

    /// A copy of `bytes` to the host that could start at `issue` (≤ `now`:
    /// a plan knows at a storage's last use that it will swap it, and its
    /// value no longer changes) and whose memory is needed at `now`: the
    /// stall (ns) until it completes, 0 when it completed already.
    pub fn swap_out_ahead(&mut self, issue: f64, now: f64, bytes: u64) -> f64 {
        let done = self.d2h_free_at.max(issue.min(now)) + bytes as f64 * self.ns_per_byte;
        self.d2h_free_at = done;
        self.urgent_free_at = done;
        self.last_out_done = done;
        (done - now).max(0.0)
    }

    /// A copy of `bytes` back to the device issued at `now` and read at once:
    /// the stall (ns) until it completes.
    pub fn swap_in_now(&mut self, now: f64, bytes: u64) -> f64 {
        let done = self.h2d_free_at.max(now) + bytes as f64 * self.ns_per_byte;
        self.h2d_free_at = done;
        done - now
    }

    /// A copy of `bytes` back to the device that could start at `issue` (a
    /// plan knows the storage's next use, and the copy may start once its
    /// destination range in the plan's arena is free and its host copy is
    /// complete) and is read at `now`: the stall (ns) until it completes, 0
    /// when it completed already. Copies are taken in the order they are
    /// read (one stream per direction), so a copy never overtakes an
    /// earlier-read one.
    pub fn swap_in_ahead(&mut self, issue: f64, now: f64, bytes: u64) -> f64 {
        let done = self.h2d_free_at.max(issue.min(now)) + bytes as f64 * self.ns_per_byte;
        self.h2d_free_at = done;
        (done - now).max(0.0)
    }

    /// The price of swapping `bytes` online: one copy out and one back, each
    /// waited for (ns).
    pub fn round_trip(&self, bytes: u64) -> f64 {
        2.0 * bytes as f64 * self.ns_per_byte
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_queue_per_direction_and_overlap_across() {
        // 1 GB/s: 1 ns per byte.
        let mut e = CopyEngines::new(1.0);
        assert_eq!(e.swap_out_now(0.0, 100), 100.0);
        // The engine is busy until 100: a second copy issued at 50 waits.
        assert_eq!(e.swap_out_now(50.0, 100), 150.0);
        // The other direction is free.
        assert_eq!(e.swap_in_now(50.0, 10), 10.0);
        // Issued after the engine went idle: only its own time.
        assert_eq!(e.swap_out_now(1000.0, 1), 1.0);
        // Issued ahead, at a last use: done before it is needed, no stall;
        // the engine is busy until then.
        assert_eq!(e.swap_out_ahead(1100.0, 1500.0, 100), 0.0);
        assert_eq!(e.d2h_free_at, 1200.0);
        // Ahead, but queued behind that copy: stalls for the rest.
        assert_eq!(e.swap_out_ahead(1150.0, 1250.0, 100), 50.0);
        assert_eq!(e.round_trip(7), 14.0);
        // A prefetch issued ahead of its read: hidden behind compute.
        assert_eq!(e.swap_in_ahead(2000.0, 2500.0, 100), 0.0);
        assert_eq!(e.h2d_free_at, 2100.0);
        // One issued too late for its read stalls for the rest; one queued
        // behind it waits for it.
        assert_eq!(e.swap_in_ahead(2450.0, 2500.0, 100), 50.0);
        assert_eq!(e.swap_in_ahead(0.0, 2700.0, 100), 0.0);
        assert_eq!(e.swap_in_ahead(0.0, 2700.0, 100), 50.0);
    }

    #[test]
    fn a_background_copy_yields_to_one_whose_memory_is_needed() {
        let mut e = CopyEngines::new(1.0);
        // Copied ahead from 0: done at 100 if nothing else comes.
        assert_eq!(e.copy_behind(0.0, 100), 100.0);
        // A swap-out needed at 30 goes first: done at 80, not at 180; the
        // background copy pauses for it and completes at 150.
        assert_eq!(e.swap_out_now(30.0, 50), 50.0);
        assert_eq!(
            (e.last_out_done, e.behind, e.d2h_free_at),
            (80.0, Some(150.0), 150.0)
        );
        // A second one queues behind the first, not behind the background.
        assert_eq!(e.swap_out_now(40.0, 10), 50.0);
        assert_eq!(e.behind, Some(160.0));
        // With the background copy done, copies queue as before.
        assert_eq!(e.swap_out_now(200.0, 10), 10.0);
        assert_eq!(e.behind, None);
    }

    #[test]
    fn host_budget_in_bytes_and_percent() {
        assert_eq!(HostBudget::Bytes(5).bytes(None), Some(5));
        assert_eq!(
            HostBudget::PercentOfBudget(250.0).bytes(Some(100)),
            Some(250)
        );
        assert_eq!(HostBudget::PercentOfBudget(50.0).bytes(None), None);
        assert_eq!(HostBudget::PercentOfBudget(50.0).to_string(), "50%");
    }

    #[test]
    fn no_values_round_trips() {
        let mut t = NoValues;
        let h = t.to_host(&(), 8).unwrap();
        assert!(h.downcast_ref::<()>().is_some());
        t.to_device(&h, 8).unwrap();
    }
}
