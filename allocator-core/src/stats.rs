//! Allocator statistics with PyTorch's names (`torch.cuda.memory_stats()`).
//!
//! Every byte figure counts rounded block sizes except `requested_bytes`, which
//! counts what callers asked for. Arrays are split by pool: `all`, `small_pool`,
//! `large_pool`.

use std::collections::BTreeMap;
use std::fmt;

/// One statistic: current value, peak since the last reset, and the totals added
/// (`allocated`) and removed (`freed`) since the last accumulated reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Value now.
    pub current: i64,
    /// Highest value since the last [`crate::CachingAllocator::reset_peak_stats`].
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// `current += n`, raising the peak.
    #[inline]
    pub fn increase(&mut self, n: i64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }

    /// `current -= n`.
    #[inline]
    pub fn decrease(&mut self, n: i64) {
        self.current -= n;
        debug_assert!(self.current >= 0, "stat went negative: {self:?} after -{n}");
        self.freed += n;
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    pub(crate) fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A [`Stat`] per pool type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatArray {
    /// Both pools together (PyTorch's `AGGREGATE`).
    pub all: Stat,
    /// Blocks of ≤ 1 MiB requests.
    pub small_pool: Stat,
    /// Blocks of larger requests.
    pub large_pool: Stat,
}

impl StatArray {
    /// Increases `all` and the pool's stat.
    #[inline]
    pub fn increase(&mut self, small: bool, n: i64) {
        self.all.increase(n);
        self.pool_mut(small).increase(n);
    }

    /// Decreases `all` and the pool's stat.
    #[inline]
    pub fn decrease(&mut self, small: bool, n: i64) {
        self.all.decrease(n);
        self.pool_mut(small).decrease(n);
    }

    /// Applies a signed change (`increase` for n > 0, `decrease` for n < 0).
    #[inline]
    pub fn add_signed(&mut self, small: bool, n: i64) {
        if n > 0 {
            self.increase(small, n)
        } else if n < 0 {
            self.decrease(small, -n)
        }
    }

    #[inline]
    fn pool_mut(&mut self, small: bool) -> &mut Stat {
        if small {
            &mut self.small_pool
        } else {
            &mut self.large_pool
        }
    }

    fn each_mut(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }

    fn each(&self) -> [(&'static str, &Stat); 3] {
        [
            ("all", &self.all),
            ("small_pool", &self.small_pool),
            ("large_pool", &self.large_pool),
        ]
    }
}

/// The allocator's statistics, as `torch.cuda.memory_stats()` reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceStats {
    /// Number of allocations handed out.
    pub allocation: StatArray,
    /// Number of device segments (not counting expandable mappings).
    pub segment: StatArray,
    /// Blocks allocated or waiting for other streams before they can be freed.
    pub active: StatArray,
    /// Free blocks inside segments that also hold other blocks.
    pub inactive_split: StatArray,
    /// Bytes handed out (rounded block sizes).
    pub allocated_bytes: StatArray,
    /// Bytes held from the device.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Bytes callers asked for (unrounded) in active blocks.
    pub requested_bytes: StatArray,
    /// Allocations of ≥ `max_split_size` bytes. The threshold is the
    /// `max_split_size` the allocator was created with (the one reported in
    /// [`DeviceStats::max_split_size`]): unlike PyTorch, a later settings change
    /// does not move it, so increments and decrements always match.
    pub oversize_allocations: Stat,
    /// Segments of ≥ `max_split_size` bytes (same threshold as above).
    pub oversize_segments: Stat,
    /// Device allocations retried after releasing every cached block.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors returned.
    pub num_ooms: i64,
    /// Synchronizations of all pending stream events (from `empty_cache` and the
    /// last-resort OOM path).
    pub num_sync_all_streams: i64,
    /// Device allocations (segments, or expandable page mappings).
    pub num_device_alloc: i64,
    /// Device frees (segments, or expandable page unmappings).
    pub num_device_free: i64,
    /// `max_split_size` in bytes, −1 when unlimited.
    pub max_split_size: i64,
}

impl DeviceStats {
    #[cfg(test)]
    pub(crate) fn new(max_split_size: usize) -> Self {
        DeviceStats {
            max_split_size: i64::try_from(max_split_size).unwrap_or(-1),
            ..Default::default()
        }
    }

    /// `peak = current` for every stat (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&mut self) {
        for arr in self.arrays_mut() {
            for s in arr.each_mut() {
                s.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// Zeroes the accumulated totals and counters
    /// (`torch.cuda.reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for arr in self.arrays_mut() {
            for s in arr.each_mut() {
                s.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The flat, sorted dictionary `torch.cuda.memory_stats()` returns, e.g.
    /// `"allocated_bytes.all.current"`, `"num_ooms"`, `"oversize_allocations.peak"`.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let put_stat = |m: &mut BTreeMap<String, i64>, prefix: String, s: &Stat| {
            m.insert(format!("{prefix}.current"), s.current);
            m.insert(format!("{prefix}.peak"), s.peak);
            m.insert(format!("{prefix}.allocated"), s.allocated);
            m.insert(format!("{prefix}.freed"), s.freed);
        };
        for (name, arr) in self.arrays() {
            for (pool, s) in arr.each() {
                put_stat(&mut m, format!("{name}.{pool}"), s);
            }
        }
        put_stat(
            &mut m,
            "oversize_allocations".into(),
            &self.oversize_allocations,
        );
        put_stat(&mut m, "oversize_segments".into(), &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }

    /// One statistic by its PyTorch key, e.g. `"reserved_bytes.large_pool.peak"`.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.to_map().get(key).copied()
    }
}

impl fmt::Display for DeviceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in self.to_map() {
            writeln!(f, "{k}: {v}")?;
        }
        Ok(())
    }
}

/// The hot-path form of one pool's [`Stat`]: `freed` is not stored but derived
/// (`base + allocated - current`, where `base` is `current` at the last
/// accumulated reset), so a decrease is a single subtraction.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counter {
    current: i64,
    allocated: i64,
    peak: i64,
    base: i64,
}

impl Counter {
    #[inline]
    pub(crate) fn increase(&mut self, n: i64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, n: i64) {
        self.current -= n;
        debug_assert!(self.current >= 0, "stat went negative: {self:?} after -{n}");
    }

    fn stat(&self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: self.allocated,
            freed: self.base + self.allocated - self.current,
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.base = self.current;
    }
}

/// The hot-path form of a [`StatArray`]: the two pools' counters and the peak
/// of their sum; `all`'s current, allocated and freed are the pools' sums, so
/// they are added up when read instead of on every update.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CounterArray {
    /// `[small, large]`.
    pools: [Counter; 2],
    all_peak: i64,
}

impl CounterArray {
    /// Increases the pool's counter (and so `all`).
    #[inline]
    pub(crate) fn increase(&mut self, small: bool, n: i64) {
        self.pools[usize::from(!small)].increase(n);
        let all = self.pools[0].current + self.pools[1].current;
        self.all_peak = self.all_peak.max(all);
    }

    /// Decreases the pool's counter (and so `all`).
    #[inline]
    pub(crate) fn decrease(&mut self, small: bool, n: i64) {
        self.pools[usize::from(!small)].decrease(n);
    }

    /// Applies a signed change (`increase` for n > 0, `decrease` for n < 0).
    #[inline]
    pub(crate) fn add_signed(&mut self, small: bool, n: i64) {
        if n > 0 {
            self.increase(small, n)
        } else if n < 0 {
            self.decrease(small, -n)
        }
    }

    /// `all.current`.
    #[inline]
    pub(crate) fn all_current(&self) -> i64 {
        self.pools[0].current + self.pools[1].current
    }

    fn stats(&self) -> StatArray {
        let (small, large) = (self.pools[0].stat(), self.pools[1].stat());
        StatArray {
            all: Stat {
                current: small.current + large.current,
                peak: self.all_peak,
                allocated: small.allocated + large.allocated,
                freed: small.freed + large.freed,
            },
            small_pool: small,
            large_pool: large,
        }
    }

    fn reset_peak(&mut self) {
        self.pools.iter_mut().for_each(Counter::reset_peak);
        self.all_peak = self.all_current();
    }

    fn reset_accumulated(&mut self) {
        self.pools.iter_mut().for_each(Counter::reset_accumulated);
    }
}

/// The statistics as the allocator keeps them: plain adds on the hot path,
/// [`DeviceStats`] built when they are read ([`Counters::device_stats`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub allocation: CounterArray,
    pub allocated_bytes: CounterArray,
    pub active: CounterArray,
    pub active_bytes: CounterArray,
    pub requested_bytes: CounterArray,
    pub inactive_split: CounterArray,
    pub inactive_split_bytes: CounterArray,
    pub segment: CounterArray,
    pub reserved_bytes: CounterArray,
    pub oversize_allocations: Counter,
    pub oversize_segments: Counter,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    pub max_split_size: i64,
    /// `active` and `active_bytes` are `allocation` and `allocated_bytes`, field
    /// for field, and are not kept apart: true from [`Counters::mirror_active`]
    /// until [`Counters::unmirror_active`]. They differ only once a freed block
    /// waits on stream events (it stays active, no longer allocated), so until
    /// the first such free the two pairs move together and updating `active`
    /// would repeat every add and maximum of `allocation`.
    active_mirrored: bool,
}

impl Counters {
    pub(crate) fn new(max_split_size: usize) -> Self {
        Counters {
            max_split_size: i64::try_from(max_split_size).unwrap_or(-1),
            ..Default::default()
        }
    }

    /// Starts reading `active` and `active_bytes` from `allocation` and
    /// `allocated_bytes` (see `active_mirrored`). Only valid while they are
    /// equal: on fresh counters.
    pub(crate) fn mirror_active(&mut self) {
        debug_assert!(
            self.allocation.stats() == self.active.stats()
                && self.allocated_bytes.stats() == self.active_bytes.stats(),
            "mirror_active on diverged counters"
        );
        self.active_mirrored = true;
    }

    /// Keeps `active` and `active_bytes` apart from here on (before the first
    /// update that moves them differently from `allocation`).
    #[cold]
    pub(crate) fn unmirror_active(&mut self) {
        if self.active_mirrored {
            self.active = self.allocation;
            self.active_bytes = self.allocated_bytes;
            self.active_mirrored = false;
        }
    }

    /// `active` and `active_bytes` for a block of `bytes` becoming active
    /// (nothing to do while they are mirrored).
    #[inline(always)]
    pub(crate) fn increase_active(&mut self, small: bool, bytes: i64) {
        if !self.active_mirrored {
            self.active.increase(small, 1);
            self.active_bytes.increase(small, bytes);
        }
    }

    /// `active` and `active_bytes` for a block of `bytes` becoming inactive.
    #[inline(always)]
    pub(crate) fn decrease_active(&mut self, small: bool, bytes: i64) {
        if !self.active_mirrored {
            self.active.decrease(small, 1);
            self.active_bytes.decrease(small, bytes);
        }
    }

    fn arrays_mut(&mut self) -> [&mut CounterArray; 9] {
        [
            &mut self.allocation,
            &mut self.allocated_bytes,
            &mut self.active,
            &mut self.active_bytes,
            &mut self.requested_bytes,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.segment,
            &mut self.reserved_bytes,
        ]
    }

    /// The statistics in PyTorch's form.
    pub(crate) fn device_stats(&self) -> DeviceStats {
        let (active, active_bytes) = if self.active_mirrored {
            (&self.allocation, &self.allocated_bytes)
        } else {
            (&self.active, &self.active_bytes)
        };
        DeviceStats {
            allocation: self.allocation.stats(),
            segment: self.segment.stats(),
            active: active.stats(),
            inactive_split: self.inactive_split.stats(),
            allocated_bytes: self.allocated_bytes.stats(),
            reserved_bytes: self.reserved_bytes.stats(),
            active_bytes: active_bytes.stats(),
            inactive_split_bytes: self.inactive_split_bytes.stats(),
            requested_bytes: self.requested_bytes.stats(),
            oversize_allocations: self.oversize_allocations.stat(),
            oversize_segments: self.oversize_segments.stat(),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            max_split_size: self.max_split_size,
        }
    }

    /// As [`DeviceStats::reset_peak`].
    pub(crate) fn reset_peak(&mut self) {
        self.arrays_mut()
            .into_iter()
            .for_each(CounterArray::reset_peak);
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// As [`DeviceStats::reset_accumulated`].
    pub(crate) fn reset_accumulated(&mut self) {
        self.arrays_mut()
            .into_iter()
            .for_each(CounterArray::reset_accumulated);
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_pytorch_names() {
        let mut s = DeviceStats::new(usize::MAX);
        s.allocated_bytes.increase(true, 1024);
        let m = s.to_map();
        assert_eq!(m["allocated_bytes.all.current"], 1024);
        assert_eq!(m["allocated_bytes.small_pool.peak"], 1024);
        assert_eq!(m["allocated_bytes.large_pool.current"], 0);
        assert_eq!(m["max_split_size"], -1);
        assert!(m.contains_key("reserved_bytes.large_pool.peak"));
        assert!(m.contains_key("num_alloc_retries"));
        assert!(m.contains_key("num_device_alloc"));
        assert!(m.contains_key("oversize_segments.freed"));
        // 9 arrays x 3 pools x 4 + 2 x 4 + 6 counters
        assert_eq!(m.len(), 9 * 3 * 4 + 8 + 6);
        assert_eq!(s.get("allocated_bytes.all.allocated"), Some(1024));
    }

    #[test]
    fn resets() {
        let mut s = DeviceStats::new(64 << 20);
        s.reserved_bytes.increase(false, 100);
        s.reserved_bytes.decrease(false, 60);
        s.num_ooms = 3;
        s.reset_peak();
        assert_eq!(s.reserved_bytes.all.peak, 40);
        s.reset_accumulated();
        assert_eq!(s.reserved_bytes.all.allocated, 0);
        assert_eq!(s.reserved_bytes.all.freed, 0);
        assert_eq!(s.reserved_bytes.all.current, 40);
        assert_eq!(s.num_ooms, 0);
        assert_eq!(s.max_split_size, 64 << 20);
    }

    /// The counters against [`DeviceStats`] updated the plain way, on random
    /// increases, decreases and resets: every materialized stat agrees.
    #[test]
    fn counters_match_plain_stats() {
        let mut state = 0x9e37_79b9_u64;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut plain = DeviceStats::new(1 << 30);
        let mut c = Counters::new(1 << 30);
        for _ in 0..100_000 {
            let small = rand() % 2 == 0;
            let n = (rand() % 1000) as i64;
            match rand() % 20 {
                0 => {
                    plain.reset_peak();
                    c.reset_peak();
                }
                1 => {
                    plain.reset_accumulated();
                    c.reset_accumulated();
                }
                2..=10 => {
                    plain.active_bytes.increase(small, n);
                    c.active_bytes.increase(small, n);
                    plain.oversize_segments.increase(n);
                    c.oversize_segments.increase(n);
                }
                _ => {
                    let pool = if small {
                        plain.active_bytes.small_pool
                    } else {
                        plain.active_bytes.large_pool
                    };
                    let n = n.min(pool.current);
                    plain.active_bytes.add_signed(small, -n);
                    c.active_bytes.add_signed(small, -n);
                    let n = n.min(plain.oversize_segments.current);
                    plain.oversize_segments.decrease(n);
                    c.oversize_segments.decrease(n);
                }
            }
            assert_eq!(c.device_stats(), plain);
        }
    }
}
