//! Where resident storages live: the [`MemoryModel`] trait the runtime places
//! storages through, and its three models.
//!
//! | module | model | accounts |
//! |---|---|---|
//! | [`logical`] | [`LogicalBudget`] | the DTR paper's sum of live bytes: no rounding, no addresses |
//! | [`physical`] | [`PhysicalBudget`] | a remat-alloc caching allocator over a simulated device of the budget's capacity: PyTorch's rounding, segments and fragmentation |
//! | [`arena`] | [`ArenaMemory`] | one flat arena of the budget: planned offsets, best fit after a divergence, compaction |
//!
//! The runtime asks a model for a [`Slot`] per fresh storage; a failure with
//! [`AllocFailure::NoRoom`] makes it evict and retry. Policies that care about
//! placement ask for the O(1) [`MemoryModel::adjacent_free`] bytes of a slot and for
//! the address-ordered [`MemoryModel::blocks`].

pub mod arena;
pub mod logical;
pub mod physical;

pub use arena::ArenaMemory;
pub use logical::LogicalBudget;
pub use physical::PhysicalBudget;

/// A placed storage: enough to free it in O(1).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Address (0 for models without addresses).
    pub ptr: u64,
    /// Bytes the block occupies after the model's rounding.
    pub size: u64,
    /// Bytes requested.
    pub requested: u64,
    /// Model-private key.
    pub key: u64,
}

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocFailure {
    /// Not enough room now (eviction may help). `free_bytes` is the free memory
    /// inside the budget at the moment of failure (cached free blocks plus device
    /// memory not reserved), Coop's fragmentation sample.
    NoRoom {
        /// Free bytes inside the budget.
        free_bytes: u64,
    },
    /// Anything else (a device error): not retried.
    Other(String),
}

/// One block of the address-ordered view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockView {
    /// Address.
    pub ptr: u64,
    /// Rounded size.
    pub size: u64,
    /// Allocated (a storage lives there) or cached free.
    pub allocated: bool,
    /// Segment index (blocks of one segment are contiguous).
    pub segment: usize,
    /// Whether the segment belongs to the small pool (requests up to 1 MiB).
    pub small: bool,
}

/// Memory figures of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// Budget, if bounded.
    pub capacity: Option<u64>,
    /// Bytes in allocated blocks now.
    pub allocated: u64,
    /// Bytes reserved from the device now (= allocated for logical models).
    pub reserved: u64,
    /// Peak of `allocated`.
    pub peak_allocated: u64,
    /// Peak of `reserved`.
    pub peak_reserved: u64,
}

/// Where the free bytes inside a budget are (models with pools).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreeByPool {
    /// Cached free bytes in small-pool segments (usable by requests up to 1 MiB).
    pub small_pool: u64,
    /// Cached free bytes in large-pool segments (usable by larger requests).
    pub large_pool: u64,
    /// Device bytes not reserved by any segment (room for new segments).
    pub unreserved: u64,
}

/// What a request of `bytes` needs from the device if no cached block fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// The rounded block size.
    pub block: u64,
    /// Size of the segment a new device allocation for it would take.
    pub segment: u64,
    /// Whether it is served from the small pool.
    pub small: bool,
}

/// The accounting behind a budget.
pub trait MemoryModel: Send {
    /// A short name for reports.
    fn name(&self) -> &'static str;

    /// Place `bytes` bytes.
    fn allocate(&mut self, bytes: u64) -> Result<Slot, AllocFailure>;

    /// Place `bytes` bytes at `offset`, where a plan put them. Models without
    /// addresses ignore the offset and allocate as usual.
    fn allocate_at(&mut self, bytes: u64, offset: u64) -> Result<Slot, AllocFailure> {
        let _ = offset;
        self.allocate(bytes)
    }

    /// Whether [`MemoryModel::compact`] moves blocks.
    fn can_compact(&self) -> bool {
        false
    }

    /// Defragment, when the model can: move the blocks `movable` accepts (by
    /// address) and return `(old, new)` addresses of those that moved. With
    /// `need`, move only what one free run of that many bytes asks, where a
    /// model can (else as without it). `None`: this model does not move
    /// blocks.
    fn compact(
        &mut self,
        movable: &dyn Fn(u64) -> bool,
        need: Option<u64>,
    ) -> Option<Vec<(u64, u64)>> {
        let _ = (movable, need);
        None
    }

    /// Bytes [`MemoryModel::compact`] with `need` would move, without moving
    /// them; `None` where it would not move only what `need` asks (a model
    /// that does not move blocks, or no window holds `need` free bytes).
    fn compaction_bytes(&mut self, movable: &dyn Fn(u64) -> bool, need: u64) -> Option<u64> {
        let _ = (movable, need);
        None
    }

    /// Give the device back what the model holds cached and unused (a caching
    /// allocator's free segments, PyTorch's `empty_cache`); returns the bytes
    /// released. Models without a cache release nothing.
    fn release_cached(&mut self) -> Result<u64, String> {
        Ok(0)
    }

    /// Give a slot back.
    fn free(&mut self, slot: Slot) -> Result<(), String>;

    /// Free bytes immediately left and right of `slot` (O(1)); `(0, 0)` for models
    /// without addresses.
    fn adjacent_free(&self, slot: &Slot) -> (u64, u64);

    /// Whether slots have meaningful addresses ([`MemoryModel::blocks`] is not empty).
    fn has_addresses(&self) -> bool;

    /// Append the address-ordered blocks to `out` (nothing for models without
    /// addresses).
    fn blocks(&self, out: &mut Vec<BlockView>);

    /// Current and peak figures.
    fn usage(&self) -> MemoryUsage;

    /// The budget, if bounded (cheap).
    fn capacity(&self) -> Option<u64>;

    /// How a request of `bytes` would be placed.
    fn shape(&self, bytes: u64) -> RequestShape {
        RequestShape {
            block: bytes,
            segment: bytes,
            small: false,
        }
    }

    /// Where the free bytes are, for models with pools (`None` otherwise).
    fn free_by_pool(&self) -> Option<FreeByPool> {
        None
    }

    /// Check the model's own invariants (live blocks never overlap, and add up
    /// to the allocated bytes), for tests; models without addresses have none.
    fn check_blocks(&self) -> Result<(), String> {
        Ok(())
    }

    /// Free bytes inside the budget (what a failed request could not use).
    fn free_bytes(&self) -> u64 {
        let u = self.usage();
        u.capacity.map_or(0, |c| c.saturating_sub(u.allocated))
    }
}
