//! Helpers shared by the runtime's integration tests: deterministic values and
//! ops whose outputs are hashes of their inputs, so that any value read back
//! can be checked for bit-identity.

use std::sync::Arc;

use remat_dtr::{FnOp, OpError, OpHandle};

/// A 64-bit mix (SplitMix64's finalizer over `a` and `b`).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

/// Op `seed` with `outs` outputs: output `k` is `mix(h, k)`, where `h` folds
/// the inputs into `seed` with [`mix`].
pub fn op(seed: u64, outs: usize) -> Arc<dyn OpHandle<u64>> {
    Arc::new(FnOp::new(format!("op{seed}"), move |ins: &[&u64]| {
        let h = ins.iter().fold(seed, |h, v| mix(h, **v));
        Ok::<_, OpError>((0..outs as u64).map(|k| mix(h, k)).collect())
    }))
}
