//! Tests of the caching allocator on the simulated device: the PyTorch tests
//! listed as portable in the spec (§7.5), each named after the test it ports,
//! core-behaviour tests of the rules, and a model-based property test.

mod batch;
mod differential;
#[cfg(feature = "serde")]
mod export;
mod model;
mod pytorch;
mod rules;

use crate::{AllocatorConfig, CachingAllocator, SimulatedDevice};

pub(super) const MB: usize = 1 << 20;
pub(super) const GB: usize = 1 << 30;

/// An allocator over a simulated device of `capacity` bytes with `settings`.
pub(super) fn sim(capacity: usize, settings: &str) -> CachingAllocator<SimulatedDevice> {
    let config = AllocatorConfig::parse(settings).expect("valid settings");
    CachingAllocator::new(SimulatedDevice::new(capacity), config).expect("allocator")
}

/// Asserts the full invariant scan passes.
#[track_caller]
pub(super) fn check(a: &CachingAllocator<SimulatedDevice>) {
    if let Err(e) = a.check_invariants() {
        panic!("invariant violated: {e}\n{:#?}", a.blocks());
    }
}
