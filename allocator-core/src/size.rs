//! Constants and size arithmetic of PyTorch's caching allocator (spec §1).
//!
//! All sizes are bytes. `round_size` is what a request costs; `allocation_size`
//! is how big a new segment for it is.

use crate::config::AllocatorConfig;

/// Every size is rounded up to a multiple of this (bytes).
pub const MIN_BLOCK_SIZE: usize = 512;
/// Largest request served from the small pool (1 MiB, inclusive).
pub const SMALL_SIZE: usize = 1 << 20;
/// Segment size of the small pool, and its expandable page size (2 MiB).
pub const SMALL_BUFFER: usize = 2 << 20;
/// Default segment size for requests in (1 MiB, 10 MiB) (20 MiB); the default of
/// `large_segment_size` and `max_non_split_rounding_size`.
pub const LARGE_BUFFER: usize = 20 << 20;
/// Requests whose rounded size is below this (but above 1 MiB) get a
/// `large_segment_size` segment (10 MiB).
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Requests of ≥ 10 MiB get a segment rounded up to a multiple of this (2 MiB).
pub const ROUND_LARGE: usize = 2 << 20;
/// Slots of the `roundup_power2_divisions` table: slot *i* covers
/// [2^i MiB, 2^(i+1) MiB), slot 0 also everything below, slot 15 everything above.
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// Requests of this size or more fail at once ("more than 1EB memory", 2^60 B).
pub const ONE_EXBIBYTE: usize = 1 << 60;
/// One mebibyte, for the `_mb` options.
pub const MIB: usize = 1 << 20;

/// The `roundup_power2_divisions` table slot for `size`:
/// `clamp(floor(log2(size)) - 20, 0, 15)`.
#[inline]
pub fn roundup_power2_slot(size: usize) -> usize {
    if size == 0 {
        return 0;
    }
    let log2 = (usize::BITS - 1 - size.leading_zeros()) as usize;
    log2.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1)
}

/// Rounds `size` up to the next of `divisions` equal steps between the
/// surrounding powers of two (`divisions` is a power of two ≥ 2).
pub fn roundup_power2_next_division(size: usize, divisions: usize) -> usize {
    debug_assert!(
        divisions >= 2 && divisions.is_power_of_two(),
        "divisions = {divisions}"
    );
    if size.is_power_of_two() {
        return size;
    }
    let floor_pow2 = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let step = floor_pow2 >> divisions.trailing_zeros();
    if step == 0 {
        return floor_pow2 << 1;
    }
    let floor = size & !(step - 1);
    if floor == size {
        size
    } else {
        floor + step
    }
}

/// What a request of `size` bytes costs: at least 512 B, a multiple of 512 B, or
/// the next power-of-two division when `roundup_power2_divisions` asks for it.
/// `size` must be below [`ONE_EXBIBYTE`] (the allocator checks before calling).
#[inline]
pub fn round_size(size: usize, config: &AllocatorConfig) -> usize {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.roundup_power2_divisions[roundup_power2_slot(size)];
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        return roundup_power2_next_division(size, divisions);
    }
    size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// Size of a new (non-expandable) segment for a request of rounded size `size`.
pub fn allocation_size(size: usize, config: &AllocatorConfig) -> usize {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// True when a request of rounded size `size` is served from the small pool.
#[inline]
pub fn is_small(size: usize) -> bool {
    size <= SMALL_SIZE
}

/// PyTorch's `format_size`: `"1024 bytes"`, `"1.50 KiB"`, `"96.00 MiB"`, `"2.00 GiB"`
/// (fixed point, two decimals; a unit applies up to and including its limit).
pub fn format_size(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if n <= KIB {
        format!("{n} bytes")
    } else if n <= MIB {
        format!("{:.2} KiB", n as f64 / KIB as f64)
    } else if n <= GIB {
        format!("{:.2} MiB", n as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", n as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(s: &str) -> AllocatorConfig {
        AllocatorConfig::parse(s).expect("valid config")
    }

    #[test]
    fn round_size_default_vectors() {
        let c = AllocatorConfig::default();
        for (req, rounded, seg) in [
            (0usize, 512usize, SMALL_BUFFER),
            (1, 512, SMALL_BUFFER),
            (511, 512, SMALL_BUFFER),
            (512, 512, SMALL_BUFFER),
            (513, 1024, SMALL_BUFFER),
            (1200, 1536, SMALL_BUFFER),
            (1 << 20, 1 << 20, SMALL_BUFFER),
            ((1 << 20) + 1, 1_049_088, LARGE_BUFFER),
            (5 << 20, 5 << 20, LARGE_BUFFER),
            ((10 << 20) - 1, 10 << 20, 10 << 20),
            ((10 << 20) + 1, (10 << 20) + 512, 12 << 20),
            (84 << 20, 84 << 20, 84 << 20),
        ] {
            let r = round_size(req, &c);
            assert_eq!(r, rounded, "round_size({req})");
            assert_eq!(allocation_size(r, &c), seg, "allocation_size({r})");
        }
    }

    #[test]
    fn round_size_divisions_4() {
        let c = cfg("roundup_power2_divisions:4");
        assert_eq!(round_size(1200, &c), 1536);
        assert_eq!(round_size(2049, &c), 2560);
        assert_eq!(round_size(3000, &c), 3072);
        assert_eq!(round_size((1 << 20) + 1, &c), 1_310_720);
        assert_eq!(round_size(84 << 20, &c), 96 << 20);
        assert_eq!(round_size(400 << 20, &c), 448 << 20);
    }

    #[test]
    fn round_size_division_list() {
        let c = cfg("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]");
        assert_eq!(
            c.roundup_power2_divisions,
            [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1]
        );
        assert_eq!(round_size(84 << 20, &c), 88 << 20);
        assert_eq!(round_size(400 << 20, &c), 512 << 20);
    }

    #[test]
    fn slots() {
        assert_eq!(roundup_power2_slot(1), 0);
        assert_eq!(roundup_power2_slot((2 << 20) - 1), 0);
        assert_eq!(roundup_power2_slot(2 << 20), 1);
        assert_eq!(roundup_power2_slot(84 << 20), 6);
        assert_eq!(roundup_power2_slot(400 << 20), 8);
        assert_eq!(roundup_power2_slot(usize::MAX), 15);
    }

    #[test]
    fn format_size_vectors() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size(96 << 20), "96.00 MiB");
        assert_eq!(format_size(800_000_000u64 << 30), "800000000.00 GiB");
    }
}
