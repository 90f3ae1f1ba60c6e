//! [`LogicalBudget`]: the DTR paper's accounting, the sum of live bytes.

use super::{AllocFailure, BlockView, MemoryModel, MemoryUsage, Slot};

/// The DTR paper's accounting: an allocation fits when live bytes plus the request
/// stay within the budget. No rounding, no addresses, no fragmentation.
#[derive(Debug, Clone, Default)]
pub struct LogicalBudget {
    capacity: Option<u64>,
    /// Each request counts rounded up to a multiple of this (0 or 1: as asked).
    align: u64,
    live: u64,
    peak: u64,
    next_key: u64,
}

impl LogicalBudget {
    /// A budget of `capacity` bytes (`None`: unbounded).
    pub fn new(capacity: Option<u64>) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// A budget that counts each request rounded up to a multiple of `align`
    /// bytes: the bytes a compacting arena with that alignment needs.
    pub fn aligned(capacity: Option<u64>, align: u64) -> Self {
        Self {
            capacity,
            align,
            ..Self::default()
        }
    }
}

impl MemoryModel for LogicalBudget {
    fn name(&self) -> &'static str {
        "logical"
    }

    fn allocate(&mut self, requested: u64) -> Result<Slot, AllocFailure> {
        let bytes = if self.align > 1 {
            requested.div_ceil(self.align) * self.align
        } else {
            requested
        };
        if let Some(cap) = self.capacity {
            if self.live + bytes > cap {
                return Err(AllocFailure::NoRoom {
                    free_bytes: cap.saturating_sub(self.live),
                });
            }
        }
        self.live += bytes;
        self.peak = self.peak.max(self.live);
        self.next_key += 1;
        Ok(Slot {
            ptr: 0,
            size: bytes,
            requested,
            key: self.next_key,
        })
    }

    fn free(&mut self, slot: Slot) -> Result<(), String> {
        self.live = self.live.checked_sub(slot.size).ok_or_else(|| {
            format!(
                "logical budget: freeing {} B of {} B live",
                slot.size, self.live
            )
        })?;
        Ok(())
    }

    fn adjacent_free(&self, _slot: &Slot) -> (u64, u64) {
        (0, 0)
    }

    fn has_addresses(&self) -> bool {
        false
    }

    fn blocks(&self, _out: &mut Vec<BlockView>) {}

    fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn usage(&self) -> MemoryUsage {
        MemoryUsage {
            capacity: self.capacity,
            allocated: self.live,
            reserved: self.live,
            peak_allocated: self.peak,
            peak_reserved: self.peak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_budget_counts_live_bytes() {
        let mut m = LogicalBudget::new(Some(100));
        let a = m.allocate(60).unwrap();
        assert_eq!(m.allocate(50), Err(AllocFailure::NoRoom { free_bytes: 40 }));
        let b = m.allocate(40).unwrap();
        m.free(a).unwrap();
        assert_eq!(m.usage().allocated, 40);
        assert_eq!(m.usage().peak_allocated, 100);
        m.free(b).unwrap();
        assert_eq!(m.free_bytes(), 100);
    }
}
