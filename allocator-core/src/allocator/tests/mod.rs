//! Tests of the caching allocator on the simulated device: the PyTorch tests
//! listed as portable in the spec (§7.5), each named after the test it ports,
//! core-behaviour tests of the rules, a model-based property test, and the
//! differential test against the pre-rewrite allocator kept in `reference/`.

mod batch;
mod differential;
#[cfg(feature = "serde")]
mod export;
mod model;
mod pytorch;
mod reference;
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
