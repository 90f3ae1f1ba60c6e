//! [`ConfigError`]: every way a settings string (or a hand-built config) can be
//! wrong, with PyTorch's wording where it has one.

use std::fmt;

use super::KEYS;

/// What is wrong with an integer value ([`ConfigError::InvalidInteger`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegerProblem {
    /// Not a decimal integer.
    NotANumber,
    /// A negative number.
    Negative,
    /// Does not fit in `usize` (or, for a MiB option, its size in bytes does not).
    TooLarge,
}

impl fmt::Display for IntegerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotANumber => f.write_str("expected a non-negative decimal integer"),
            Self::Negative => f.write_str("negative values are not allowed"),
            Self::TooLarge => f.write_str("the number is too large"),
        }
    }
}

/// A bad settings string. Each message names the key (when known), the value
/// received and what is allowed; most follow PyTorch's wording.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A token other than the one the grammar expects (a wrong or doubled separator,
    /// `=` instead of `:`, a trailing comma, …).
    #[error(
        "Error parsing allocator settings at position {position}{}: expected {expected}, \
         but got {}",
        after_key(.key),
        found_text(.found)
    )]
    Syntax {
        /// 0-based character position of the offending token (the string's length
        /// for the end of input).
        position: usize,
        /// What the grammar allows here.
        expected: &'static str,
        /// The token found; `None` at the end of input.
        found: Option<String>,
        /// The option being parsed, when there is one.
        key: Option<String>,
    },
    /// A list value opened with `[` and not closed.
    #[error(
        "Expected closing bracket ']' for the list of option '{key}' opened at position \
         {position}, but reached the end of the settings"
    )]
    MissingClosingBracket {
        /// The option whose list is open.
        key: String,
        /// 0-based character position of the `[`.
        position: usize,
    },
    /// `key:` followed by nothing or a comma.
    #[error(
        "Missing value for allocator option '{key}' at position {position}: write {key}:<value>"
    )]
    EmptyValue {
        /// The option without a value.
        key: String,
        /// 0-based character position where the value should be.
        position: usize,
    },
    /// A key that is not in [`KEYS`].
    #[error("Unrecognized key '{key}' in allocator config; allowed keys: {}", KEYS.join(", "))]
    UnknownKey {
        /// The key received.
        key: String,
    },
    /// A list given to an option that takes a single value.
    #[error("Allocator option {key} takes a single value, not a list")]
    UnexpectedList {
        /// The option.
        key: &'static str,
    },
    /// A boolean other than `True` / `False` (case-sensitive).
    #[error("Expected 'True' or 'False' for allocator option {key} but got '{value}'")]
    InvalidBool {
        /// The option.
        key: &'static str,
        /// The value received.
        value: String,
    },
    /// An integer value that is not a number, negative, or too large.
    #[error("Invalid value '{value}' for allocator option {key}: {problem}")]
    InvalidInteger {
        /// The option.
        key: &'static str,
        /// The value received.
        value: String,
        /// What is wrong with it.
        problem: IntegerProblem,
    },
    /// A float value that does not parse.
    #[error("Invalid value '{value}' for allocator option {key}: expected a decimal number")]
    InvalidFloat {
        /// The option.
        key: &'static str,
        /// The value received.
        value: String,
    },
    /// A float that overflows a double, or a nonzero float that underflows to
    /// zero or to a subnormal (PyTorch's `std::stod` throws `out_of_range` for
    /// both).
    #[error(
        "Invalid value '{value}' for allocator option {key}: out of the range of a double \
         (write 0, or a magnitude from 2.2250738585072014e-308 to 1.7976931348623157e308)"
    )]
    FloatOutOfRange {
        /// The option.
        key: &'static str,
        /// The value received.
        value: String,
    },
    /// `max_split_size_mb` or `max_non_split_rounding_mb` below
    /// `large_segment_size_mb`.
    #[error("CachingAllocator option {key} too small, must be >= {min}, got {value}")]
    SplitSizeTooSmall {
        /// `max_split_size_mb` or `max_non_split_rounding_mb`.
        key: &'static str,
        /// The value received (MiB).
        value: usize,
        /// The smallest value allowed (MiB): the large segment size in effect.
        min: usize,
    },
    /// `large_segment_size_mb` of 10 or less.
    #[error("CachingAllocator option large_segment_size_mb must be > 10 MB, got {value}")]
    LargeSegmentSizeTooSmall {
        /// The value received (MiB).
        value: usize,
    },
    /// `garbage_collection_threshold` outside (0.0, 1.0).
    #[error(
        "garbage_collect_threshold is invalid, set it in (0.0, 1.0); option \
         garbage_collection_threshold got {value}"
    )]
    GarbageCollectionThreshold {
        /// The value received.
        value: f64,
    },
    /// `per_process_memory_fraction` outside [0.0, 1.0].
    #[error("per_process_memory_fraction is invalid, set it in [0.0, 1.0], got {value}")]
    MemoryFraction {
        /// The value received.
        value: f64,
    },
    /// Scalar `roundup_power2_divisions` that is not a power of two (0 included).
    #[error(
        "For roundups, the divisions has to be power of 2, got {value} \
         (option roundup_power2_divisions)"
    )]
    RoundupDivisions {
        /// The value received.
        value: usize,
    },
    /// A list entry of `roundup_power2_divisions` whose divisions are neither 0 nor
    /// a power of two.
    #[error(
        "For roundups, the divisions has to be power of 2 or 0 to disable roundup, got \
         {value} for interval '{interval}' (option roundup_power2_divisions)"
    )]
    RoundupListDivisions {
        /// The interval (`K` or `>`) of the entry.
        interval: String,
        /// The divisions received.
        value: usize,
    },
    /// A list interval of `roundup_power2_divisions` that is neither a power of two
    /// (MiB) nor `>`.
    #[error(
        "For roundups, the intervals have to be power of 2 (in MiB) or '>', got \
         '{interval}' (option roundup_power2_divisions)"
    )]
    RoundupInterval {
        /// The interval received.
        interval: String,
    },
    /// `pinned_num_register_threads` that is not a power of two.
    #[error("Number of register threads has to be power of 2, got {value}")]
    RegisterThreadsNotPowerOf2 {
        /// The value received.
        value: usize,
    },
    /// `pinned_num_register_threads` above
    /// [`MAX_PINNED_REGISTER_THREADS`](super::MAX_PINNED_REGISTER_THREADS).
    #[error("Number of register threads should be less than or equal to 128, got {value}")]
    TooManyRegisterThreads {
        /// The value received.
        value: usize,
    },
    /// `pinned_reserve_segment_size_mb` of 0.
    #[error(
        "Pinned reserve segment size has to be greater than 0, got {value} \
         (option pinned_reserve_segment_size_mb)"
    )]
    PinnedReserveSegmentSize {
        /// The value received (MiB).
        value: usize,
    },
    /// `backend:cudaMallocAsync` / `backend:hipMallocAsync`.
    #[error(
        "Allocator backend '{backend}' is not supported: remat implements only the \
         native caching allocator (backend:native)"
    )]
    UnsupportedBackend {
        /// The backend received.
        backend: String,
    },
    /// A backend name that PyTorch does not know either.
    #[error(
        "Unknown allocator backend, options are native and cudaMallocAsync, got \
         '{backend}' (remat supports only native)"
    )]
    UnknownBackend {
        /// The backend received.
        backend: String,
    },
    /// A value rejected by a check outside the settings string (an API argument such
    /// as a history `max_entries`): names the key, the value and what is allowed.
    #[error("Invalid value '{value}' for allocator option {key}: expected {allowed}")]
    InvalidValue {
        /// The option or argument.
        key: String,
        /// The value received.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// A bad settings string read from an environment variable.
    #[error("invalid {var}='{value}': {error}")]
    InEnvVar {
        /// The variable read.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        error: Box<ConfigError>,
    },
}

fn after_key(key: &Option<String>) -> String {
    match key {
        Some(k) => format!(" (option '{k}')"),
        None => String::new(),
    }
}

fn found_text(found: &Option<String>) -> String {
    match found {
        Some(t) => format!("'{t}'"),
        None => "end of input".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::err;
    use super::*;

    #[test]
    fn test_allocator_settings_messages() {
        let msg = |s: &str| err(s).to_string();
        assert_eq!(
            msg("max_split_size_mb:2"),
            "CachingAllocator option max_split_size_mb too small, must be >= 20, got 2"
        );
        assert!(msg("garbage_collection_threshold:1.2")
            .starts_with("garbage_collect_threshold is invalid, set it in (0.0, 1.0)"));
        assert!(msg("garbage_collection_threshold:1.2").contains("1.2"));
        let unknown = msg("foo:1,bar:2");
        assert!(
            unknown.starts_with("Unrecognized key 'foo' in allocator config"),
            "{unknown}"
        );
        for key in KEYS {
            assert!(unknown.contains(key), "{unknown} lists {key}");
        }
        assert_eq!(
            msg("release_lock_on_cudamalloc:none"),
            "Expected 'True' or 'False' for allocator option release_lock_on_cudamalloc but got \
             'none'"
        );
        assert_eq!(
            msg("pinned_num_register_threads:3"),
            "Number of register threads has to be power of 2, got 3"
        );
        assert_eq!(
            msg("pinned_num_register_threads:1024"),
            "Number of register threads should be less than or equal to 128, got 1024"
        );
        assert!(msg("per_process_memory_fraction:1.1")
            .starts_with("per_process_memory_fraction is invalid, set it in [0.0, 1.0]"));
        assert_eq!(
            msg("large_segment_size_mb:10"),
            "CachingAllocator option large_segment_size_mb must be > 10 MB, got 10"
        );
        assert!(msg("roundup_power2_divisions:3")
            .starts_with("For roundups, the divisions has to be power of 2"));
        assert!(msg("backend:foo")
            .starts_with("Unknown allocator backend, options are native and cudaMallocAsync"));
        assert!(msg("backend:cudaMallocAsync").contains("only the native"));
        assert!(msg("max_split_size_mb:x").contains("max_split_size_mb"));
        assert!(msg("max_split_size_mb:x").contains("'x'"));
        assert_eq!(
            msg("max_split_size_mb=64"),
            "Error parsing allocator settings at position 20 (option 'max_split_size_mb=64'): \
             expected ':' between option name and value (not '='), but got end of input"
        );
    }
}
