//! [`HostStats`]: the host allocator's statistics with PyTorch's names
//! (`torch.cuda.host_memory_stats()`).

use crate::stats::Stat;
use std::collections::BTreeMap;
use std::fmt;

/// Time spent in the provider's allocate or free calls, in microseconds
/// (PyTorch's `DurationStat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DurationStat {
    /// Sum of the durations since the last accumulated reset.
    pub total: i64,
    /// Number of durations since the last accumulated reset.
    pub count: i64,
    /// Longest duration since the last peak reset (0 when none).
    pub max: i64,
    /// Shortest duration since the last peak reset (0 when none).
    pub min: i64,
}

impl DurationStat {
    /// Adds one duration of `us` microseconds.
    pub fn increase(&mut self, us: i64) {
        self.total += us;
        self.count += 1;
        self.max = self.max.max(us);
        if self.min == 0 || us < self.min {
            self.min = us;
        }
    }

    /// `total / count`, 0 when there is none.
    pub fn avg(&self) -> i64 {
        if self.count == 0 {
            0
        } else {
            self.total / self.count
        }
    }

    fn reset_accumulated(&mut self) {
        self.total = 0;
        self.count = 0;
    }

    fn reset_peak(&mut self) {
        self.max = 0;
        self.min = 0;
    }
}

/// The host allocator's statistics, with the fields and keys of PyTorch's
/// `HostStats` / `torch.cuda.host_memory_stats()`. Byte figures count block
/// sizes (requests rounded up to a power of two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostStats {
    /// Blocks handed out and not yet back in a free list (a block freed with
    /// events pending stays active until they complete).
    pub active_requests: Stat,
    /// Bytes of the [`HostStats::active_requests`] blocks.
    pub active_bytes: Stat,
    /// Blocks the allocator holds, active or cached free.
    pub allocations: Stat,
    /// Bytes of the [`HostStats::allocations`] blocks (PyTorch's older
    /// `reserved_bytes`).
    pub allocated_bytes: Stat,
    /// Time in the provider's allocate (`cudaHostAlloc` / `cudaHostRegister`).
    pub host_alloc_time: DurationStat,
    /// Time in the provider's free (`cudaFreeHost` / `cudaHostUnregister`).
    pub host_free_time: DurationStat,
    /// Provider allocations made because no cached block fitted.
    pub num_host_alloc: i64,
    /// Provider frees.
    pub num_host_free: i64,
}

impl HostStats {
    /// `peak = current`, and the durations' `min`/`max` cleared
    /// (`torch.cuda.reset_peak_host_memory_stats`).
    pub fn reset_peak(&mut self) {
        for s in self.stats_mut() {
            s.reset_peak();
        }
        self.host_alloc_time.reset_peak();
        self.host_free_time.reset_peak();
    }

    /// Zeroes the accumulated totals and counts
    /// (`torch.cuda.reset_accumulated_host_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for s in self.stats_mut() {
            s.reset_accumulated();
        }
        self.host_alloc_time.reset_accumulated();
        self.host_free_time.reset_accumulated();
        self.num_host_alloc = 0;
        self.num_host_free = 0;
    }

    fn stats_mut(&mut self) -> [&mut Stat; 4] {
        [
            &mut self.active_requests,
            &mut self.active_bytes,
            &mut self.allocations,
            &mut self.allocated_bytes,
        ]
    }

    /// The flat, sorted dictionary `torch.cuda.host_memory_stats()` returns,
    /// e.g. `"active_bytes.current"`, `"host_alloc_time.count"`, `"num_host_free"`.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, s) in [
            ("active_requests", &self.active_requests),
            ("active_bytes", &self.active_bytes),
            ("allocations", &self.allocations),
            ("allocated_bytes", &self.allocated_bytes),
        ] {
            m.insert(format!("{name}.current"), s.current);
            m.insert(format!("{name}.peak"), s.peak);
            m.insert(format!("{name}.allocated"), s.allocated);
            m.insert(format!("{name}.freed"), s.freed);
        }
        for (name, d) in [
            ("host_alloc_time", &self.host_alloc_time),
            ("host_free_time", &self.host_free_time),
        ] {
            m.insert(format!("{name}.total"), d.total);
            m.insert(format!("{name}.count"), d.count);
            m.insert(format!("{name}.max"), d.max);
            m.insert(format!("{name}.min"), d.min);
            m.insert(format!("{name}.avg"), d.avg());
        }
        m.insert("num_host_alloc".into(), self.num_host_alloc);
        m.insert("num_host_free".into(), self.num_host_free);
        m
    }

    /// One statistic by its PyTorch key, e.g. `"allocated_bytes.peak"`.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.to_map().get(key).copied()
    }
}

impl fmt::Display for HostStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in self.to_map() {
            writeln!(f, "{k}: {v}")?;
        }
        Ok(())
    }
}
