//! A tiny seeded generator (SplitMix64) for candidate sampling: deterministic for a
//! seed, no dependency, good enough for picking √N indices.

/// SplitMix64's increment (2^64 / φ, odd).
pub(crate) const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function: 64 well-mixed bits of `z`, as a stateless
/// hash (e.g. of a seed and an index).
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// σ of [`price_factor`]: prices are scaled by `e^(σ·u)`, `u` uniform in
/// `[-1, 1]`, so by −22 % to +28 % (ties and near-ties reorder).
pub(crate) const PERTURBATION: f64 = 0.25;

/// The fixed factor by which the planner's random restart `seed` scales the
/// price of storage `seq` (its sequence number in the iteration):
/// log-uniform in `[e^-σ, e^σ]` ([`PERTURBATION`]), from SplitMix64's mix of
/// both. The same at every decision, so a perturbed policy is another
/// consistent greedy schedule: two candidates can swap only when their prices
/// are within a factor `e^(2σ)` (1.65) of each other.
pub(crate) fn price_factor(seed: u64, seq: u64) -> f64 {
    let z = mix(seq ^ seed.wrapping_mul(GOLDEN_GAMMA));
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    (PERTURBATION * (2.0 * u - 1.0)).exp()
}

/// `price` under restart `seed` for storage `seq`: times its
/// [`price_factor`], or unchanged when `seed` is 0 (no perturbation).
#[inline]
pub(crate) fn perturb(price: f64, seed: u64, seq: u64) -> f64 {
    if seed == 0 {
        price
    } else {
        price * price_factor(seed, seq)
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix(self.0)
    }

    /// A uniform index below `n` (`n > 0`), by multiply-shift.
    #[inline]
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn price_factors_are_bounded_and_centred() {
        let (lo, hi) = ((-PERTURBATION).exp(), PERTURBATION.exp());
        let mut log_sum = 0.0;
        let n = 20_000u64;
        for seq in 0..n {
            let f = price_factor(3, seq);
            assert!((lo..=hi).contains(&f), "{f}");
            log_sum += f.ln();
        }
        // log-uniform on [-σ, σ]: the mean log is 0 (within 3 standard errors).
        let se = PERTURBATION / (3.0 * n as f64).sqrt();
        assert!(
            (log_sum / n as f64).abs() < 3.0 * se,
            "{}",
            log_sum / n as f64
        );
        // Another seed is another draw.
        let differ = (0..100)
            .filter(|&q| price_factor(3, q) != price_factor(4, q))
            .count();
        assert!(differ > 95, "{differ}");
    }
}
