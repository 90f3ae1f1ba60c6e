//! Synthetic request sets for tests and benchmarks of the planners.

use super::Request;

/// `count` requests shaped like an eviction schedule's plateau: over 1 000
/// time steps, a quarter live 200–799 steps (the long lifetimes that keep
/// memory near its peak), the rest 1–20 steps (rematerialized copies cutting
/// across them); sizes are 512 B to 32 KiB in 512-byte steps. Deterministic
/// for a `seed` (xorshift64; the low bit is forced to 1, as 0 is xorshift's
/// fixed point). Constructive placements leave slack here that
/// [`super::compact`] removes.
pub fn plateau(count: usize, seed: u64) -> Vec<Request> {
    let mut x = seed | 1;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    (0..count)
        .map(|_| {
            let start = next(1000) as usize;
            let len = if next(4) == 0 {
                200 + next(600)
            } else {
                1 + next(20)
            } as usize;
            Request::new(512 * (1 + next(64)), start, start + len)
        })
        .collect()
}
