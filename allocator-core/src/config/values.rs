//! One value of a settings string, read and range-checked: integers, floats
//! (with `std::stod`'s range), booleans, MiB sizes, and the range checks the
//! builders and [`AllocatorConfig::validate`](super::AllocatorConfig::validate)
//! share with the parser.

use std::num::IntErrorKind;

use super::parse::RawValue;
use super::{ConfigError, IntegerProblem};
use crate::size::MIB;

pub(super) fn scalar<'a>(key: &'static str, value: &'a RawValue) -> Result<&'a str, ConfigError> {
    match value {
        RawValue::Scalar(t) => Ok(&t.text),
        RawValue::List(_) => Err(ConfigError::UnexpectedList { key }),
    }
}

pub(super) fn parse_usize(key: &'static str, text: &str) -> Result<usize, ConfigError> {
    let invalid = |problem| ConfigError::InvalidInteger {
        key,
        value: text.to_owned(),
        problem,
    };
    match text.parse::<usize>() {
        Ok(n) => Ok(n),
        Err(e) => Err(match e.kind() {
            IntErrorKind::PosOverflow => invalid(IntegerProblem::TooLarge),
            _ if text.starts_with('-')
                && text.len() > 1
                && text.bytes().skip(1).all(|b| b.is_ascii_digit()) =>
            {
                invalid(IntegerProblem::Negative)
            }
            _ => invalid(IntegerProblem::NotANumber),
        }),
    }
}

/// A float in Rust's `f64` syntax, rejected where PyTorch's `std::stod` throws
/// `out_of_range` (glibc's `strtod` sets `ERANGE`): a nonzero number that rounds
/// to zero or to a subnormal (`5e-324`, `1e-400`), or a finite number too large
/// for a double (`1e400`). `inf` and `nan` parse, and the option's range check
/// rejects them.
pub(super) fn parse_f64(key: &'static str, text: &str) -> Result<f64, ConfigError> {
    let value = text.parse::<f64>().map_err(|_| ConfigError::InvalidFloat {
        key,
        value: text.to_owned(),
    })?;
    let mantissa = text.split(['e', 'E']).next().unwrap_or_default();
    let written_nonzero = mantissa.bytes().any(|b| matches!(b, b'1'..=b'9'));
    let written_infinite = text
        .trim_start_matches(['+', '-'])
        .get(..3)
        .is_some_and(|t| t.eq_ignore_ascii_case("inf"));
    let out_of_range = if value.is_infinite() {
        !written_infinite
    } else {
        value.is_subnormal() || (value == 0.0 && written_nonzero)
    };
    if out_of_range {
        return Err(ConfigError::FloatOutOfRange {
            key,
            value: text.to_owned(),
        });
    }
    Ok(value)
}

pub(super) fn parse_bool(key: &'static str, text: &str) -> Result<bool, ConfigError> {
    match text {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(ConfigError::InvalidBool {
            key,
            value: text.to_owned(),
        }),
    }
}

pub(super) fn check_split_size_mb(
    key: &'static str,
    mb: usize,
    large_segment_size: usize,
) -> Result<usize, ConfigError> {
    let min = large_segment_size / MIB;
    if mb < min {
        return Err(ConfigError::SplitSizeTooSmall {
            key,
            value: mb,
            min,
        });
    }
    // PyTorch: min(N, SIZE_MAX / MiB) * MiB; cannot overflow.
    Ok(mb.min(usize::MAX / MIB) * MIB)
}

pub(super) fn check_gc_threshold(value: f64) -> Result<f64, ConfigError> {
    // Written so that NaN is rejected.
    if value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(ConfigError::GarbageCollectionThreshold { value })
    }
}

pub(super) fn check_memory_fraction(value: f64) -> Result<f64, ConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::MemoryFraction { value })
    }
}

pub(super) fn check_divisions(value: usize) -> Result<usize, ConfigError> {
    if value.is_power_of_two() {
        Ok(value)
    } else {
        Err(ConfigError::RoundupDivisions { value })
    }
}

/// `mb` MiB in bytes, or `TooLarge` naming `key`.
pub(super) fn mib_to_bytes(key: &'static str, text: &str, mb: usize) -> Result<usize, ConfigError> {
    mb.checked_mul(MIB)
        .ok_or_else(|| ConfigError::InvalidInteger {
            key,
            value: text.to_owned(),
            problem: IntegerProblem::TooLarge,
        })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{cfg, err};
    use super::*;

    /// Floats that `std::stod` throws `out_of_range` for (glibc's strtod sets
    /// ERANGE) are rejected; the smallest normal double and an exact zero are not.
    #[test]
    fn floats_out_of_range() {
        for (key, value) in [
            ("garbage_collection_threshold", "5e-324"),
            ("garbage_collection_threshold", "2.225073858507201e-308"),
            ("per_process_memory_fraction", "1e-400"),
            ("per_process_memory_fraction", "-1e-400"),
            ("per_process_memory_fraction", "1e400"),
        ] {
            let e = err(&format!("{key}:{value}"));
            assert_eq!(
                e,
                ConfigError::FloatOutOfRange {
                    key: match key {
                        "garbage_collection_threshold" => "garbage_collection_threshold",
                        _ => "per_process_memory_fraction",
                    },
                    value: value.into()
                }
            );
            let msg = e.to_string();
            assert!(msg.contains(value) && msg.contains(key), "{msg}");
            assert!(msg.contains("2.2250738585072014e-308"), "{msg}");
        }
        assert_eq!(
            cfg("garbage_collection_threshold:2.2250738585072014e-308")
                .garbage_collection_threshold,
            f64::MIN_POSITIVE
        );
        for zero in ["0e-400", "0.000e-999", "-0"] {
            assert_eq!(
                cfg(&format!("per_process_memory_fraction:{zero}")).per_process_memory_fraction,
                0.0
            );
        }
        // Infinities and NaN are in range for a double; the option's check rejects them.
        assert!(matches!(
            err("per_process_memory_fraction:inf"),
            ConfigError::MemoryFraction { .. }
        ));
        assert!(matches!(
            err("garbage_collection_threshold:-Infinity"),
            ConfigError::GarbageCollectionThreshold { .. }
        ));
    }

    /// PyTorch's `test_allocator_memory_fraction_setting`.
    #[test]
    fn test_allocator_memory_fraction_setting() {
        for f in [0.0, 0.5, 1.0] {
            assert_eq!(
                cfg(&format!("per_process_memory_fraction:{f}")).per_process_memory_fraction,
                f
            );
        }
        for f in ["-0.1", "1.1", "NaN", "inf"] {
            let e = err(&format!("per_process_memory_fraction:{f}"));
            assert!(
                matches!(e, ConfigError::MemoryFraction { .. }),
                "{f}: {e:?}"
            );
            assert!(e
                .to_string()
                .contains("per_process_memory_fraction is invalid"));
        }
        assert!(matches!(
            err("per_process_memory_fraction:half"),
            ConfigError::InvalidFloat {
                key: "per_process_memory_fraction",
                ..
            }
        ));
    }

    #[test]
    fn garbage_collection_threshold_range() {
        assert_eq!(
            cfg("garbage_collection_threshold:0.5").garbage_collection_threshold,
            0.5
        );
        for bad in ["0", "0.0", "1", "1.0", "-0.5", "nan", "inf"] {
            assert!(
                matches!(
                    err(&format!("garbage_collection_threshold:{bad}")),
                    ConfigError::GarbageCollectionThreshold { .. }
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn integers() {
        assert_eq!(cfg("max_split_size_mb:20").max_split_size, 20 << 20);
        assert_eq!(cfg("max_split_size_mb:+64").max_split_size, 64 << 20);
        let clamped = (usize::MAX / MIB) * MIB;
        assert_eq!(
            cfg(&format!("max_split_size_mb:{}", usize::MAX)).max_split_size,
            clamped
        );
        assert_eq!(
            cfg(&format!("max_split_size_mb:{}", usize::MAX / 2)).max_split_size,
            clamped
        );
        let invalid = |s: &str| match err(s) {
            ConfigError::InvalidInteger { key, problem, .. } => (key, problem),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(
            invalid("max_split_size_mb:-64"),
            ("max_split_size_mb", IntegerProblem::Negative)
        );
        assert_eq!(
            invalid("max_split_size_mb:1e3"),
            ("max_split_size_mb", IntegerProblem::NotANumber)
        );
        assert_eq!(
            invalid("max_split_size_mb:-"),
            ("max_split_size_mb", IntegerProblem::NotANumber)
        );
        assert_eq!(
            invalid("max_split_size_mb:99999999999999999999999"),
            ("max_split_size_mb", IntegerProblem::TooLarge)
        );
        assert_eq!(
            invalid("pinned_reserve_segment_size_mb:-1"),
            ("pinned_reserve_segment_size_mb", IntegerProblem::Negative)
        );
    }
}
