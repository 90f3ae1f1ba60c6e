//! Allocator settings: PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax, read from
//! `REMAT_ALLOC_CONF` (spec §5).
//!
//! # Syntax
//!
//! A settings string is a comma-separated list of `key:value` pairs:
//!
//! ```text
//! max_split_size_mb:128,roundup_power2_divisions:[64:8,256:2,>:1],expandable_segments:True
//! ```
//!
//! * `,` `:` `[` `]` are single-character tokens; any other run of characters is one
//!   token (so `>` is a token too). ASCII whitespace (space, tab, newline, vertical
//!   tab, form feed, carriage return: C's `isspace`) is dropped everywhere, also
//!   inside a token (`max_split _size_mb : 6 4` reads as `max_split_size_mb:64`), as
//!   PyTorch does. Other whitespace is an ordinary character, as in PyTorch, which
//!   reads the string byte by byte: `max\u{3000}_split_size_mb` is an unknown key
//!   and `40\u{a0}` is not a number.
//! * Grammar: `key:value(,key:value)*[,]`, where a value is a token or a list
//!   `[k:v(,k:v)*[,]]` or `[]` (only `roundup_power2_divisions` takes a list). One
//!   trailing comma after the last value or list entry is allowed, as in PyTorch
//!   (`max_split_size_mb:40,`, `roundup_power2_divisions:[64:8,]`); the empty list
//!   sets no slot.
//! * The empty string (or only whitespace) means "all defaults".
//! * Every other malformed string is rejected with [`ConfigError::Syntax`] naming
//!   the position (0-based, in characters) and the expected token:
//!   `max_split_size_mb=64`, `a;b`, `max_split_size_mb:64:1`, a leading or doubled
//!   comma (`,a:1`, `a:1,,b:2`, `a:1,,`), a missing value
//!   ([`ConfigError::EmptyValue`]) and a list without `]`
//!   ([`ConfigError::MissingClosingBracket`]). See "Deviations from PyTorch" for
//!   the strings PyTorch lets through.
//! * Keys are case-sensitive; booleans are exactly `True` or `False`; integers are
//!   decimal (`+` allowed, `-` rejected); floats use Rust's `f64` syntax, and one
//!   that overflows a double or underflows to zero or a subnormal (`1e400`,
//!   `5e-324`, `1e-400`) is rejected with [`ConfigError::FloatOutOfRange`], as
//!   PyTorch's `std::stod` rejects it. A key given twice takes its last value.
//!
//! # Keys
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `max_split_size_mb` | integer MiB, `>= large_segment_size_mb` (20) | unlimited | cached blocks of this size or more are never split; requests below it never take them. Values above `usize::MAX / MiB` are clamped |
//! | `max_non_split_rounding_mb` | integer MiB, `>= large_segment_size_mb` | `large_segment_size_mb` | a request of `max_split_size` or more may take an unsplittable cached block only if the block is less than this much larger |
//! | `large_segment_size_mb` | integer MiB, `> 10` | 20 | segment size for requests in (1 MiB, 10 MiB) and page size of large-pool expandable segments; applied before every other key |
//! | `roundup_power2_divisions` | `N` (power of two) or `[K:V,…,>:V]` | all 0 (off) | round requests up to one of `N` steps between powers of two; the list form sets it per size band (`K`: a power of two in MiB, `V`: 0 or a power of two), see below |
//! | `garbage_collection_threshold` | float in (0.0, 1.0) | 0.0 (off) | with a memory fraction set, free old cached blocks once reserved memory exceeds this share of the limit |
//! | `expandable_segments` | `True` / `False` | `False` | grow segments by mapping pages into a reserved virtual range (needs a device with virtual memory) |
//! | `release_lock_on_cudamalloc` (alias `release_lock_on_hipmalloc`) | `True` / `False` | `False` | drop the allocator lock while the device allocates a new segment |
//! | `per_process_memory_fraction` | float in [0.0, 1.0] | 1.0 (no limit) | cap reserved memory at this share of the device's total memory |
//! | `pinned_use_cuda_host_register` (alias `pinned_use_hip_host_register`) | `True` / `False` | `False` | host (pinned) allocator option; accepted and validated for compatibility, no effect in remat |
//! | `pinned_num_register_threads` | power of two `<= 128` | 1 | host allocator option; accepted and validated, no effect |
//! | `pinned_use_background_threads` | `True` / `False` | `False` | host allocator option; accepted and validated, no effect |
//! | `pinned_reserve_segment_size_mb` | integer MiB, `> 0` | unset (0) | host allocator option; accepted and validated, no effect |
//! | `pinned_free_catch_all` | `True` / `False` | `False` | host allocator option; accepted and validated, no effect |
//! | `graph_capture_record_stream_reuse` | `True` / `False` | `False` | graph-capture option; accepted and validated, no effect (remat has no graph capture) |
//! | `throw_on_cudamalloc_oom` | `True` / `False` | `False` | fail at once when the device cannot allocate a new segment, instead of releasing cached blocks and retrying |
//! | `backend` | `native` | `native` | only the native caching allocator exists in remat: `cudaMallocAsync` / `hipMallocAsync` are rejected with [`ConfigError::UnsupportedBackend`], never silently ignored |
//!
//! The `roundup_power2_divisions` table has 16 slots: slot 0 covers sizes below
//! 2 MiB, slot *i* covers [2^i MiB, 2^(i+1) MiB) and slot 15 everything from 32 GiB.
//! The scalar form `N` fills every slot with `N` (0 is rejected, 1 means "no
//! rounding"). In the list form, slot = log2(K) clamped to 0..=15; the first `K`
//! also fills every slot below its own; each `K` sets its slot; `>` fills the slots
//! after the last `K` given before it (from slot 1 when none was). So
//! `[64:8,128:2,256:2,512:2,1024:1,>:1]` gives `[8,8,8,8,8,8,8,2,2,2,1,1,1,1,1,1]`.
//!
//! # Each parse resets some options
//!
//! [`AllocatorConfig::update`] follows PyTorch's runtime `_set_allocator_settings`:
//! `max_split_size_mb`, `roundup_power2_divisions` and `garbage_collection_threshold`
//! go back to their defaults unless the new string gives them, and
//! `max_non_split_rounding_mb` is re-derived from `large_segment_size_mb` unless
//! given; every other option keeps its previous value. A failed update changes
//! nothing (a deviation, see below).
//!
//! # Deviations from PyTorch
//!
//! remat reads every settings string PyTorch reads the same way, except in these
//! cases, where it is deliberately stricter (each is a test in this module, and
//! the fuzz tests compare the parser with a model of PyTorch's):
//!
//! * **Separators.** Newer PyTorch does not check the `:` after a key or the `,`
//!   after a value (`checkToken` returns a result nobody reads), so
//!   `max_split_size_mb[64` sets 64 MiB. remat rejects every wrong separator
//!   ([`ConfigError::Syntax`]): a typo should not pass for a setting.
//! * **Numbers with trailing characters, negative sizes.** PyTorch converts with
//!   `std::stoull` / `std::stod`, which read the longest numeric prefix and ignore
//!   the rest, and `stoull` wraps a minus sign: `max_split_size_mb:64MB` reads as
//!   64, `max_split_size_mb:175\u{3000}2186044416` as 175, `max_split_size_mb:-1`
//!   as 2^64 − 1 (then clamped), `garbage_collection_threshold:0.5x` as 0.5. remat
//!   requires the whole token to be the number ([`ConfigError::InvalidInteger`],
//!   [`ConfigError::InvalidFloat`]). Hexadecimal floats, which `std::stod` reads,
//!   are not Rust `f64` syntax and are rejected too.
//! * **Sizes whose bytes overflow.** PyTorch bounds `large_segment_size_mb` and
//!   `pinned_reserve_segment_size_mb` only from below (spec §5.2), so it takes a
//!   size whose byte count does not fit in 64 bits; remat rejects a value whose
//!   size in bytes does not fit in `usize` ([`IntegerProblem::TooLarge`]).
//! * **`backend:cudaMallocAsync`** is accepted by PyTorch and rejected by remat
//!   ([`ConfigError::UnsupportedBackend`]): remat implements only the native
//!   allocator and does not pretend otherwise.
//! * **A failed runtime update applies nothing.** PyTorch's
//!   `_set_allocator_settings` applies the options parsed before the error (and
//!   resets the ones it resets first), so a bad string leaves a mix of old and new
//!   settings; [`AllocatorConfig::update`] and `CachingAllocator::set_settings`
//!   check the whole string first and leave the settings unchanged on error, so
//!   what is in force is always one settings string that was accepted in full.
//!
//! # Environment
//!
//! [`AllocatorConfig::from_env`] reads `REMAT_ALLOC_CONF`, else
//! `PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_ALLOC_CONF`; the first variable that is
//! set wins, even when it is empty.
//!
//! ```
//! use remat_alloc::AllocatorConfig;
//!
//! let cfg = AllocatorConfig::parse("max_split_size_mb:64,roundup_power2_divisions:4")?;
//! assert_eq!(cfg.max_split_size, 64 << 20);
//! assert_eq!(cfg.roundup_power2_divisions, [4; 16]);
//! assert!(AllocatorConfig::parse("max_split_size_mb:2").is_err());
//! # Ok::<(), remat_alloc::ConfigError>(())
//! ```

use std::fmt;
use std::num::IntErrorKind;

use crate::size::{LARGE_BUFFER, MIB, MIN_LARGE_ALLOC, ROUNDUP_POWER2_INTERVALS};

#[cfg(test)]
mod pytorch_model;

/// Upper bound of `pinned_num_register_threads` (PyTorch's `kMaxNumberOfThreads`).
pub const MAX_PINNED_REGISTER_THREADS: usize = 128;

/// Every key the parser accepts, aliases included, in the order of the docs table.
pub const KEYS: &[&str] = &[
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "large_segment_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "per_process_memory_fraction",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_free_catch_all",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
    "backend",
];

/// The allocator settings (see the [module docs](self) for the syntax and the table
/// of keys). A plain struct: build it with [`Default`], [`AllocatorConfig::parse`],
/// [`AllocatorConfig::from_env`] or the `with_*` builders.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// Bytes. Cached blocks of this size or more are never split, and requests below
    /// it never take them. `usize::MAX` = unlimited (default). Set from
    /// `max_split_size_mb` as a multiple of MiB, never below `large_segment_size`.
    pub max_split_size: usize,
    /// Bytes. A request of `max_split_size` or more only takes a cached block smaller
    /// than `request + max_non_split_rounding_size`. Default: `large_segment_size`.
    pub max_non_split_rounding_size: usize,
    /// Bytes. Segment size for requests in (1 MiB, 10 MiB) and page size of
    /// large-pool expandable segments. Default 20 MiB; always > 10 MiB.
    pub large_segment_size: usize,
    /// Divisions per size band (slot *i* covers [2^i MiB, 2^(i+1) MiB), see
    /// [`crate::size::roundup_power2_slot`]). Each entry is 0 or a power of two;
    /// 0 and 1 mean no power-of-two rounding. Default all 0.
    pub roundup_power2_divisions: [usize; ROUNDUP_POWER2_INTERVALS],
    /// Share of the memory-fraction limit above which old cached blocks are freed.
    /// 0.0 = off (default); otherwise in (0.0, 1.0).
    pub garbage_collection_threshold: f64,
    /// Grow segments by mapping pages into reserved virtual address space.
    pub expandable_segments: bool,
    /// Drop the allocator lock while the device allocates a segment
    /// (`release_lock_on_cudamalloc` / `release_lock_on_hipmalloc`).
    pub release_lock_on_device_malloc: bool,
    /// Cap on reserved memory as a share of the device's total memory, in
    /// [0.0, 1.0]; 1.0 = no cap (default). See [`AllocatorConfig::memory_fraction_limit`].
    pub per_process_memory_fraction: f64,
    /// `pinned_use_cuda_host_register` / `pinned_use_hip_host_register`: host
    /// allocator option, accepted and validated for compatibility; no effect here.
    pub pinned_use_host_register: bool,
    /// Host allocator option: a power of two ≤ [`MAX_PINNED_REGISTER_THREADS`];
    /// default 1. Accepted and validated; no effect here.
    pub pinned_num_register_threads: usize,
    /// Host allocator option; accepted and validated; no effect here.
    pub pinned_use_background_threads: bool,
    /// MiB. Host allocator option; 0 = unset (default), otherwise > 0. Accepted and
    /// validated; no effect here.
    pub pinned_reserve_segment_size_mb: usize,
    /// Graph-capture option (reuse of record_stream'ed blocks during capture).
    pub graph_capture_record_stream_reuse: bool,
    /// Host allocator option; accepted and validated; no effect here.
    pub pinned_free_catch_all: bool,
    /// Fail at once when the device cannot allocate a segment, without freeing the
    /// cache and retrying.
    pub throw_on_cudamalloc_oom: bool,
    /// The last settings string given to [`AllocatorConfig::parse`] or a successful
    /// [`AllocatorConfig::update`] (`""` by default).
    pub last_settings: String,
}

impl Default for AllocatorConfig {
    /// PyTorch's defaults: no split limit, 20 MiB large segments and non-split
    /// rounding, no power-of-two rounding, no garbage collection, no memory
    /// fraction, one register thread, every flag off.
    fn default() -> Self {
        Self {
            max_split_size: usize::MAX,
            max_non_split_rounding_size: LARGE_BUFFER,
            large_segment_size: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_device_malloc: false,
            per_process_memory_fraction: 1.0,
            pinned_use_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            pinned_free_catch_all: false,
            throw_on_cudamalloc_oom: false,
            last_settings: String::new(),
        }
    }
}

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
    /// `pinned_num_register_threads` above [`MAX_PINNED_REGISTER_THREADS`].
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

// ----------------------------------------------------------------------------------
// Tokenizer and syntax
// ----------------------------------------------------------------------------------

/// One token and the 0-based character position of its first character.
#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    pos: usize,
}

impl Token {
    fn is_separator(&self) -> bool {
        matches!(self.text.as_str(), "," | ":" | "[" | "]")
    }

    fn is(&self, s: &str) -> bool {
        self.text == s
    }
}

/// The whitespace PyTorch's tokenizer drops: C's `isspace` in the C locale, which
/// it applies to each byte (so no character outside ASCII is whitespace to it).
/// Rust's `char::is_ascii_whitespace` leaves out the vertical tab.
fn is_c_space(ch: char) -> bool {
    matches!(ch, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens; ASCII whitespace
/// ([`is_c_space`]) is dropped; other runs of characters are one token. Returns the
/// tokens and the input length in characters.
fn tokenize(s: &str) -> (Vec<Token>, usize) {
    let mut tokens = Vec::new();
    let mut buffer: Option<Token> = None;
    let mut len = 0;
    for (pos, ch) in s.chars().enumerate() {
        len = pos + 1;
        if matches!(ch, ',' | ':' | '[' | ']') {
            tokens.extend(buffer.take());
            tokens.push(Token {
                text: ch.to_string(),
                pos,
            });
        } else if !is_c_space(ch) {
            buffer
                .get_or_insert_with(|| Token {
                    text: String::new(),
                    pos,
                })
                .text
                .push(ch);
        }
    }
    tokens.extend(buffer);
    (tokens, len)
}

/// A value as written: one token, or a `[k:v,…]` list.
#[derive(Debug, Clone, PartialEq)]
enum RawValue {
    Scalar(Token),
    List(Vec<(Token, Token)>),
}

/// One `key:value` pair.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    key: Token,
    value: RawValue,
}

const EXPECTED_KEY: &str = "an option name";
const EXPECTED_COLON: &str = "':' after the option name";
const EXPECTED_COLON_NOT_EQ: &str = "':' between option name and value (not '=')";
const EXPECTED_VALUE: &str = "a value";
const EXPECTED_NEXT: &str = "',' or the end of the settings after the value";
const EXPECTED_LIST_KEY: &str = "a list interval (a power of two in MiB, or '>')";
const EXPECTED_LIST_COLON: &str = "':' after the list interval";
const EXPECTED_LIST_VALUE: &str = "a number of divisions";
const EXPECTED_LIST_NEXT: &str = "',' or ']' in the list";

/// Cursor over the tokens.
struct Parser {
    tokens: Vec<Token>,
    i: usize,
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.i)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.i).cloned();
        self.i += 1;
        t
    }

    fn syntax(
        &self,
        tok: Option<&Token>,
        expected: &'static str,
        key: Option<&Token>,
    ) -> ConfigError {
        ConfigError::Syntax {
            position: tok.map_or(self.end, |t| t.pos),
            expected,
            found: tok.map(|t| t.text.clone()),
            key: key.map(|k| k.text.clone()),
        }
    }

    /// `key:value(,key:value)*` or nothing.
    fn entries(mut self) -> Result<Vec<Entry>, ConfigError> {
        let mut entries = Vec::new();
        if self.tokens.is_empty() {
            return Ok(entries);
        }
        loop {
            let key = match self.next() {
                Some(t) if !t.is_separator() => t,
                other => return Err(self.syntax(other.as_ref(), EXPECTED_KEY, None)),
            };
            match self.next() {
                Some(t) if t.is(":") => {}
                other => {
                    let expected = if key.text.contains('=') {
                        EXPECTED_COLON_NOT_EQ
                    } else {
                        EXPECTED_COLON
                    };
                    return Err(self.syntax(other.as_ref(), expected, Some(&key)));
                }
            }
            let value = self.value(&key)?;
            entries.push(Entry { key, value });
            match self.next() {
                None => return Ok(entries),
                // One trailing comma ends the settings, as in PyTorch.
                Some(t) if t.is(",") && self.peek().is_none() => return Ok(entries),
                Some(t) if t.is(",") => {}
                Some(t) => {
                    return Err(self.syntax(
                        Some(&t),
                        EXPECTED_NEXT,
                        entries.last().map(|e| &e.key),
                    ))
                }
            }
        }
    }

    /// A token or a `[k:v(,k:v)*]` list, after `key:`.
    fn value(&mut self, key: &Token) -> Result<RawValue, ConfigError> {
        let empty = |position| ConfigError::EmptyValue {
            key: key.text.clone(),
            position,
        };
        match self.next() {
            None => Err(empty(self.end)),
            Some(t) if t.is(",") => Err(empty(t.pos)),
            Some(t) if t.is("[") => self.list(key, t.pos),
            Some(t) if t.is_separator() => Err(self.syntax(Some(&t), EXPECTED_VALUE, Some(key))),
            Some(t) => Ok(RawValue::Scalar(t)),
        }
    }

    /// The rest of a list after its `[` (at character `open`).
    fn list(&mut self, key: &Token, open: usize) -> Result<RawValue, ConfigError> {
        let unclosed = || ConfigError::MissingClosingBracket {
            key: key.text.clone(),
            position: open,
        };
        let mut items = Vec::new();
        loop {
            // `]` right after `[` or after a comma closes the list, as in PyTorch:
            // `[]` is an empty list and `[64:8,]` has one entry.
            if self.peek().is_some_and(|t| t.is("]")) {
                self.i += 1;
                return Ok(RawValue::List(items));
            }
            let k = match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is_separator() => {
                    return Err(self.syntax(Some(&t), EXPECTED_LIST_KEY, Some(key)))
                }
                Some(t) => t,
            };
            match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is(":") => {}
                Some(t) => return Err(self.syntax(Some(&t), EXPECTED_LIST_COLON, Some(key))),
            }
            let v = match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is_separator() => {
                    return Err(self.syntax(Some(&t), EXPECTED_LIST_VALUE, Some(key)))
                }
                Some(t) => t,
            };
            items.push((k, v));
            match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is("]") => return Ok(RawValue::List(items)),
                Some(t) if t.is(",") => {}
                Some(t) => return Err(self.syntax(Some(&t), EXPECTED_LIST_NEXT, Some(key))),
            }
        }
    }
}

/// Tokenizes and checks the grammar of `s`; no key or value is interpreted yet.
fn parse_entries(s: &str) -> Result<Vec<Entry>, ConfigError> {
    let (tokens, end) = tokenize(s);
    Parser { tokens, i: 0, end }.entries()
}

// ----------------------------------------------------------------------------------
// Values
// ----------------------------------------------------------------------------------

fn scalar<'a>(key: &'static str, value: &'a RawValue) -> Result<&'a str, ConfigError> {
    match value {
        RawValue::Scalar(t) => Ok(&t.text),
        RawValue::List(_) => Err(ConfigError::UnexpectedList { key }),
    }
}

fn parse_usize(key: &'static str, text: &str) -> Result<usize, ConfigError> {
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
fn parse_f64(key: &'static str, text: &str) -> Result<f64, ConfigError> {
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

fn parse_bool(key: &'static str, text: &str) -> Result<bool, ConfigError> {
    match text {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(ConfigError::InvalidBool {
            key,
            value: text.to_owned(),
        }),
    }
}

fn check_split_size_mb(
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

fn check_gc_threshold(value: f64) -> Result<f64, ConfigError> {
    // Written so that NaN is rejected.
    if value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(ConfigError::GarbageCollectionThreshold { value })
    }
}

fn check_memory_fraction(value: f64) -> Result<f64, ConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::MemoryFraction { value })
    }
}

fn check_divisions(value: usize) -> Result<usize, ConfigError> {
    if value.is_power_of_two() {
        Ok(value)
    } else {
        Err(ConfigError::RoundupDivisions { value })
    }
}

/// Fills `table` from the list form (spec §1.3, newest semantics).
fn apply_roundup_list(
    table: &mut [usize; ROUNDUP_POWER2_INTERVALS],
    items: &[(Token, Token)],
) -> Result<(), ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    let mut first = true;
    let mut last_index = 0usize;
    for (k, v) in items {
        let value = parse_usize(KEY, &v.text)?;
        if value != 0 && !value.is_power_of_two() {
            return Err(ConfigError::RoundupListDivisions {
                interval: k.text.clone(),
                value,
            });
        }
        if k.is(">") {
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = value;
            }
            continue;
        }
        let interval_error = || ConfigError::RoundupInterval {
            interval: k.text.clone(),
        };
        let boundary = k.text.parse::<usize>().map_err(|_| interval_error())?;
        if !boundary.is_power_of_two() {
            return Err(interval_error());
        }
        let index = (boundary.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
        if first {
            for slot in table.iter_mut().take(index) {
                *slot = value;
            }
            first = false;
        }
        if let Some(slot) = table.get_mut(index) {
            *slot = value;
        }
        last_index = index;
    }
    Ok(())
}

/// `mb` MiB in bytes, or `TooLarge` naming `key`.
fn mib_to_bytes(key: &'static str, text: &str, mb: usize) -> Result<usize, ConfigError> {
    mb.checked_mul(MIB)
        .ok_or_else(|| ConfigError::InvalidInteger {
            key,
            value: text.to_owned(),
            problem: IntegerProblem::TooLarge,
        })
}

/// `bytes` in MiB: an integer when exact, else two decimals.
fn fmt_mib(bytes: usize) -> String {
    if bytes % MIB == 0 {
        (bytes / MIB).to_string()
    } else {
        format!("{:.2}", bytes as f64 / MIB as f64)
    }
}

fn fmt_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

// ----------------------------------------------------------------------------------
// AllocatorConfig
// ----------------------------------------------------------------------------------

impl AllocatorConfig {
    /// The environment variable [`AllocatorConfig::from_env`] reads first.
    pub const ENV_VAR: &'static str = "REMAT_ALLOC_CONF";
    /// The variables read, in this order, when [`AllocatorConfig::ENV_VAR`] is not set.
    pub const FALLBACK_ENV_VARS: &'static [&'static str] =
        &["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

    /// Parses a settings string on top of the defaults (`""` gives
    /// [`AllocatorConfig::default`]).
    ///
    /// ```
    /// # use remat_alloc::AllocatorConfig;
    /// let c = AllocatorConfig::parse("roundup_power2_divisions:[256:4,>:1]")?;
    /// assert_eq!(c.roundup_power2_divisions, [4, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1]);
    /// # Ok::<(), remat_alloc::ConfigError>(())
    /// ```
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        config.update(s)?;
        Ok(config)
    }

    /// Applies a settings string the way PyTorch's runtime `_set_allocator_settings`
    /// does: `large_segment_size_mb` first; then `max_split_size`, the roundup table
    /// and the GC threshold reset to their defaults and `max_non_split_rounding_size`
    /// to `large_segment_size` unless the string gives them; every other option keeps
    /// its value. On error `self` is left unchanged.
    pub fn update(&mut self, s: &str) -> Result<(), ConfigError> {
        let entries = parse_entries(s)?;
        let mut next = self.clone();

        // First pass: the large segment size, which bounds the split options.
        for entry in entries.iter().filter(|e| e.key.is("large_segment_size_mb")) {
            let key = "large_segment_size_mb";
            let text = scalar(key, &entry.value)?;
            let mb = parse_usize(key, text)?;
            if mb <= MIN_LARGE_ALLOC / MIB {
                return Err(ConfigError::LargeSegmentSizeTooSmall { value: mb });
            }
            next.large_segment_size = mib_to_bytes(key, text, mb)?;
        }

        // Reset semantics.
        next.max_split_size = usize::MAX;
        next.max_non_split_rounding_size = next.large_segment_size;
        next.roundup_power2_divisions = [0; ROUNDUP_POWER2_INTERVALS];
        next.garbage_collection_threshold = 0.0;

        for entry in &entries {
            next.apply(entry)?;
        }
        next.last_settings = s.to_owned();
        *self = next;
        Ok(())
    }

    /// Applies one entry (second pass).
    fn apply(&mut self, entry: &Entry) -> Result<(), ConfigError> {
        let v = &entry.value;
        match entry.key.text.as_str() {
            "large_segment_size_mb" => {} // applied in the first pass
            "max_split_size_mb" => {
                let key = "max_split_size_mb";
                let mb = parse_usize(key, scalar(key, v)?)?;
                self.max_split_size = check_split_size_mb(key, mb, self.large_segment_size)?;
            }
            "max_non_split_rounding_mb" => {
                let key = "max_non_split_rounding_mb";
                let mb = parse_usize(key, scalar(key, v)?)?;
                self.max_non_split_rounding_size =
                    check_split_size_mb(key, mb, self.large_segment_size)?;
            }
            "roundup_power2_divisions" => {
                let key = "roundup_power2_divisions";
                let mut table = [0; ROUNDUP_POWER2_INTERVALS];
                match v {
                    RawValue::Scalar(t) => {
                        table = [check_divisions(parse_usize(key, &t.text)?)?;
                            ROUNDUP_POWER2_INTERVALS];
                    }
                    RawValue::List(items) => apply_roundup_list(&mut table, items)?,
                }
                self.roundup_power2_divisions = table;
            }
            "garbage_collection_threshold" => {
                let key = "garbage_collection_threshold";
                self.garbage_collection_threshold =
                    check_gc_threshold(parse_f64(key, scalar(key, v)?)?)?;
            }
            "per_process_memory_fraction" => {
                let key = "per_process_memory_fraction";
                self.per_process_memory_fraction =
                    check_memory_fraction(parse_f64(key, scalar(key, v)?)?)?;
            }
            "expandable_segments" => {
                let key = "expandable_segments";
                self.expandable_segments = parse_bool(key, scalar(key, v)?)?;
            }
            "release_lock_on_cudamalloc" => {
                let key = "release_lock_on_cudamalloc";
                self.release_lock_on_device_malloc = parse_bool(key, scalar(key, v)?)?;
            }
            "release_lock_on_hipmalloc" => {
                let key = "release_lock_on_hipmalloc";
                self.release_lock_on_device_malloc = parse_bool(key, scalar(key, v)?)?;
            }
            "pinned_use_cuda_host_register" => {
                let key = "pinned_use_cuda_host_register";
                self.pinned_use_host_register = parse_bool(key, scalar(key, v)?)?;
            }
            "pinned_use_hip_host_register" => {
                let key = "pinned_use_hip_host_register";
                self.pinned_use_host_register = parse_bool(key, scalar(key, v)?)?;
            }
            "pinned_num_register_threads" => {
                let key = "pinned_num_register_threads";
                let n = parse_usize(key, scalar(key, v)?)?;
                if !n.is_power_of_two() {
                    return Err(ConfigError::RegisterThreadsNotPowerOf2 { value: n });
                }
                if n > MAX_PINNED_REGISTER_THREADS {
                    return Err(ConfigError::TooManyRegisterThreads { value: n });
                }
                self.pinned_num_register_threads = n;
            }
            "pinned_use_background_threads" => {
                let key = "pinned_use_background_threads";
                self.pinned_use_background_threads = parse_bool(key, scalar(key, v)?)?;
            }
            "pinned_reserve_segment_size_mb" => {
                let key = "pinned_reserve_segment_size_mb";
                let text = scalar(key, v)?;
                let mb = parse_usize(key, text)?;
                if mb == 0 {
                    return Err(ConfigError::PinnedReserveSegmentSize { value: mb });
                }
                mib_to_bytes(key, text, mb)?;
                self.pinned_reserve_segment_size_mb = mb;
            }
            "graph_capture_record_stream_reuse" => {
                let key = "graph_capture_record_stream_reuse";
                self.graph_capture_record_stream_reuse = parse_bool(key, scalar(key, v)?)?;
            }
            "pinned_free_catch_all" => {
                let key = "pinned_free_catch_all";
                self.pinned_free_catch_all = parse_bool(key, scalar(key, v)?)?;
            }
            "throw_on_cudamalloc_oom" => {
                let key = "throw_on_cudamalloc_oom";
                self.throw_on_cudamalloc_oom = parse_bool(key, scalar(key, v)?)?;
            }
            "backend" => match scalar("backend", v)? {
                "native" => {}
                b @ ("cudaMallocAsync" | "hipMallocAsync") => {
                    return Err(ConfigError::UnsupportedBackend {
                        backend: b.to_owned(),
                    })
                }
                b => {
                    return Err(ConfigError::UnknownBackend {
                        backend: b.to_owned(),
                    })
                }
            },
            other => {
                return Err(ConfigError::UnknownKey {
                    key: other.to_owned(),
                })
            }
        }
        Ok(())
    }

    /// Reads the settings from the environment: [`AllocatorConfig::ENV_VAR`], else
    /// the [`AllocatorConfig::FALLBACK_ENV_VARS`] in order; none set gives the
    /// defaults. Call it once, at start-up.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_with_source().map(|(config, _)| config)
    }

    /// [`AllocatorConfig::from_env`], also returning the variable that was used
    /// (`None`: none was set).
    pub fn from_env_with_source() -> Result<(Self, Option<&'static str>), ConfigError> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// The core of [`AllocatorConfig::from_env_with_source`] over any lookup
    /// function: the first of `REMAT_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF`,
    /// `PYTORCH_ALLOC_CONF` for which `lookup` returns `Some` is parsed (even when
    /// empty) and named. Errors are wrapped in [`ConfigError::InEnvVar`].
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(Self, Option<&'static str>), ConfigError> {
        let vars = std::iter::once(Self::ENV_VAR).chain(Self::FALLBACK_ENV_VARS.iter().copied());
        for var in vars {
            if let Some(value) = lookup(var) {
                return match Self::parse(&value) {
                    Ok(config) => Ok((config, Some(var))),
                    Err(error) => Err(ConfigError::InEnvVar {
                        var,
                        value,
                        error: Box::new(error),
                    }),
                };
            }
        }
        Ok((Self::default(), None))
    }

    /// Every option (one entry per option, aliases under their CUDA name, plus
    /// `backend`) with its effective value, in the order of the docs table. Sizes are
    /// in MiB; `max_split_size_mb` is `unlimited` by default; the roundup table is
    /// written out as 16 slots.
    pub fn effective_settings(&self) -> Vec<(&'static str, String)> {
        let max_split = if self.max_split_size == usize::MAX {
            "unlimited".to_owned()
        } else {
            fmt_mib(self.max_split_size)
        };
        let table = self
            .roundup_power2_divisions
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",");
        vec![
            ("max_split_size_mb", max_split),
            (
                "max_non_split_rounding_mb",
                fmt_mib(self.max_non_split_rounding_size),
            ),
            ("large_segment_size_mb", fmt_mib(self.large_segment_size)),
            ("roundup_power2_divisions", format!("[{table}]")),
            (
                "garbage_collection_threshold",
                self.garbage_collection_threshold.to_string(),
            ),
            (
                "expandable_segments",
                fmt_bool(self.expandable_segments).to_owned(),
            ),
            (
                "release_lock_on_cudamalloc",
                fmt_bool(self.release_lock_on_device_malloc).to_owned(),
            ),
            (
                "per_process_memory_fraction",
                self.per_process_memory_fraction.to_string(),
            ),
            (
                "pinned_use_cuda_host_register",
                fmt_bool(self.pinned_use_host_register).to_owned(),
            ),
            (
                "pinned_num_register_threads",
                self.pinned_num_register_threads.to_string(),
            ),
            (
                "pinned_use_background_threads",
                fmt_bool(self.pinned_use_background_threads).to_owned(),
            ),
            (
                "pinned_reserve_segment_size_mb",
                self.pinned_reserve_segment_size_mb.to_string(),
            ),
            (
                "pinned_free_catch_all",
                fmt_bool(self.pinned_free_catch_all).to_owned(),
            ),
            (
                "graph_capture_record_stream_reuse",
                fmt_bool(self.graph_capture_record_stream_reuse).to_owned(),
            ),
            (
                "throw_on_cudamalloc_oom",
                fmt_bool(self.throw_on_cudamalloc_oom).to_owned(),
            ),
            ("backend", "native".to_owned()),
        ]
    }

    /// Sets `max_split_size_mb` (MiB, at least `large_segment_size` in MiB; clamped
    /// like the parser).
    pub fn with_max_split_size_mb(mut self, mb: usize) -> Result<Self, ConfigError> {
        self.max_split_size =
            check_split_size_mb("max_split_size_mb", mb, self.large_segment_size)?;
        Ok(self)
    }

    /// Sets `expandable_segments`.
    pub fn with_expandable_segments(mut self, enabled: bool) -> Self {
        self.expandable_segments = enabled;
        self
    }

    /// Sets every slot of the roundup table to `divisions` (a power of two).
    pub fn with_roundup_power2_divisions(mut self, divisions: usize) -> Result<Self, ConfigError> {
        self.roundup_power2_divisions = [check_divisions(divisions)?; ROUNDUP_POWER2_INTERVALS];
        Ok(self)
    }

    /// Sets `garbage_collection_threshold` (in (0.0, 1.0)).
    pub fn with_garbage_collection_threshold(
        mut self,
        threshold: f64,
    ) -> Result<Self, ConfigError> {
        self.garbage_collection_threshold = check_gc_threshold(threshold)?;
        Ok(self)
    }

    /// Sets `per_process_memory_fraction` (in [0.0, 1.0]).
    pub fn with_memory_fraction(mut self, fraction: f64) -> Result<Self, ConfigError> {
        self.per_process_memory_fraction = check_memory_fraction(fraction)?;
        Ok(self)
    }

    /// Checks the fields directly, for a config built or edited by hand (the
    /// fields are public): every rule the parser enforces on the string form,
    /// in bytes. [`crate::CachingAllocator::new`] and `set_settings` call it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.large_segment_size <= MIN_LARGE_ALLOC || self.large_segment_size % MIB != 0 {
            return Err(ConfigError::LargeSegmentSizeTooSmall {
                value: self.large_segment_size / MIB,
            });
        }
        let min = self.large_segment_size / MIB;
        if self.max_split_size != usize::MAX && self.max_split_size < self.large_segment_size {
            let value = self.max_split_size / MIB;
            return Err(ConfigError::SplitSizeTooSmall {
                key: "max_split_size_mb",
                value,
                min,
            });
        }
        if self.max_non_split_rounding_size < self.large_segment_size {
            let value = self.max_non_split_rounding_size / MIB;
            return Err(ConfigError::SplitSizeTooSmall {
                key: "max_non_split_rounding_mb",
                value,
                min,
            });
        }
        for (slot, &value) in self.roundup_power2_divisions.iter().enumerate() {
            if value != 0 && !value.is_power_of_two() {
                let interval = (1usize << slot).to_string();
                return Err(ConfigError::RoundupListDivisions { interval, value });
            }
        }
        if self.garbage_collection_threshold != 0.0 {
            check_gc_threshold(self.garbage_collection_threshold)?;
        }
        check_memory_fraction(self.per_process_memory_fraction)?;
        Ok(())
    }

    /// The cap on reserved bytes for a device of `total` bytes: `None` when the
    /// fraction is 1.0 (no cap), else `Some((fraction * total) as usize)`.
    pub fn memory_fraction_limit(&self, total: usize) -> Option<usize> {
        if self.per_process_memory_fraction >= 1.0 {
            None
        } else {
            // `as` saturates; a negative zero or NaN cannot pass validation anyway.
            Some((self.per_process_memory_fraction * total as f64) as usize)
        }
    }

    /// The roundup table in the shortest list syntax, or `None` when it is all 0.
    fn roundup_setting(&self) -> Option<String> {
        let table = &self.roundup_power2_divisions;
        // Runs of equal values: (first slot, last slot, value).
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for (i, &d) in table.iter().enumerate() {
            match runs.last_mut() {
                Some(run) if run.2 == d => run.1 = i,
                _ => runs.push((i, i, d)),
            }
        }
        match runs.as_slice() {
            [] | [(_, _, 0)] => None,
            [(_, _, d)] => Some(d.to_string()),
            [(_, first_end, first), middle @ .., (_, _, last)] => {
                // The first entry fills every slot below its own; middle slots are
                // set one by one; `>` fills the rest.
                let mut items = vec![format!("{}:{first}", 1usize << first_end)];
                for &(start, end, d) in middle {
                    items.extend((start..=end).map(|i| format!("{}:{d}", 1usize << i)));
                }
                items.push(format!(">:{last}"));
                Some(format!("[{}]", items.join(",")))
            }
        }
    }
}

impl fmt::Display for AllocatorConfig {
    /// The canonical settings string: every option that differs from its default (as
    /// re-derived by a parse), `key:value` joined by `,`. It parses back to an equal
    /// config, `last_settings` aside, for any config built by the parser or the
    /// builders. The default config prints as the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Self::default();
        let mut items: Vec<String> = Vec::new();
        let mut flag = |key: &str, on: bool| {
            if on {
                items.push(format!("{key}:True"));
            }
        };
        flag("expandable_segments", self.expandable_segments);
        flag(
            "release_lock_on_cudamalloc",
            self.release_lock_on_device_malloc,
        );
        flag(
            "pinned_use_cuda_host_register",
            self.pinned_use_host_register,
        );
        flag(
            "pinned_use_background_threads",
            self.pinned_use_background_threads,
        );
        flag("pinned_free_catch_all", self.pinned_free_catch_all);
        flag(
            "graph_capture_record_stream_reuse",
            self.graph_capture_record_stream_reuse,
        );
        flag("throw_on_cudamalloc_oom", self.throw_on_cudamalloc_oom);
        let mut sized = Vec::new();
        if self.large_segment_size != d.large_segment_size {
            sized.push(format!(
                "large_segment_size_mb:{}",
                fmt_mib(self.large_segment_size)
            ));
        }
        if self.max_split_size != usize::MAX {
            sized.push(format!(
                "max_split_size_mb:{}",
                fmt_mib(self.max_split_size)
            ));
        }
        if self.max_non_split_rounding_size != self.large_segment_size {
            sized.push(format!(
                "max_non_split_rounding_mb:{}",
                fmt_mib(self.max_non_split_rounding_size)
            ));
        }
        if let Some(r) = self.roundup_setting() {
            sized.push(format!("roundup_power2_divisions:{r}"));
        }
        if self.garbage_collection_threshold != d.garbage_collection_threshold {
            sized.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.per_process_memory_fraction != d.per_process_memory_fraction {
            sized.push(format!(
                "per_process_memory_fraction:{}",
                self.per_process_memory_fraction
            ));
        }
        if self.pinned_num_register_threads != d.pinned_num_register_threads {
            sized.push(format!(
                "pinned_num_register_threads:{}",
                self.pinned_num_register_threads
            ));
        }
        if self.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb {
            sized.push(format!(
                "pinned_reserve_segment_size_mb:{}",
                self.pinned_reserve_segment_size_mb
            ));
        }
        sized.append(&mut items);
        f.write_str(&sized.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::pytorch_model::{self, Deviation};
    use super::*;
    use proptest::prelude::*;

    fn cfg(s: &str) -> AllocatorConfig {
        match AllocatorConfig::parse(s) {
            Ok(c) => c,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn err(s: &str) -> ConfigError {
        match AllocatorConfig::parse(s) {
            Ok(c) => panic!("{s:?} should be rejected, got {c:?}"),
            Err(e) => e,
        }
    }

    fn table(s: &str) -> [usize; 16] {
        cfg(s).roundup_power2_divisions
    }

    #[test]
    fn defaults() {
        let d = AllocatorConfig::default();
        assert_eq!(d.max_split_size, usize::MAX);
        assert_eq!(d.max_non_split_rounding_size, 20 << 20);
        assert_eq!(d.large_segment_size, 20 << 20);
        assert_eq!(d.roundup_power2_divisions, [0; 16]);
        assert_eq!(d.garbage_collection_threshold, 0.0);
        assert!(!d.expandable_segments);
        assert_eq!(d.per_process_memory_fraction, 1.0);
        assert_eq!(d.pinned_num_register_threads, 1);
        assert_eq!(d.pinned_reserve_segment_size_mb, 0);
        assert_eq!(d.last_settings, "");
        assert_eq!(cfg(""), d);
        let mut blank = cfg("  \t\n ");
        blank.last_settings.clear();
        assert_eq!(blank, d);
    }

    #[test]
    fn tokenizer_drops_whitespace_inside_tokens() {
        let (tokens, len) = tokenize(" max_split _size_mb : 6 4 ,a");
        let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["max_split_size_mb", ":", "64", ",", "a"]);
        assert_eq!(
            tokens.iter().map(|t| t.pos).collect::<Vec<_>>(),
            [1, 20, 22, 26, 27]
        );
        assert_eq!(len, 28);
        assert_eq!(cfg(" max_split_size_mb : 6 4 ").max_split_size, 64 << 20);
        // Only ASCII whitespace, vertical tab included, is dropped (C's isspace).
        let (tokens, len) = tokenize("a\u{b}b\u{c}\r:\u{3000}1\u{a0}");
        let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["ab", ":", "\u{3000}1\u{a0}"]);
        assert_eq!(len, 9);
        assert_eq!(
            err("max\u{3000}_split_size_mb:40"),
            ConfigError::UnknownKey {
                key: "max\u{3000}_split_size_mb".into()
            }
        );
        assert_eq!(
            err("max_split_size_mb:175\u{3000}2186044416"),
            ConfigError::InvalidInteger {
                key: "max_split_size_mb",
                value: "175\u{3000}2186044416".into(),
                problem: IntegerProblem::NotANumber
            }
        );
    }

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

    /// Spec §1.3 examples (the list forms `test_allocator_settings` relies on).
    #[test]
    fn test_allocator_settings_roundup_power2_divisions() {
        assert_eq!(
            table("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"),
            [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1]
        );
        assert_eq!(
            table("roundup_power2_divisions:[256:4,>:1]"),
            [4, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1]
        );
        assert_eq!(
            table("roundup_power2_divisions:[1:2,2:4]"),
            [2, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(table("roundup_power2_divisions:4"), [4; 16]);
        assert_eq!(table("roundup_power2_divisions:1"), [1; 16]);
    }

    #[test]
    fn roundup_list_edge_cases() {
        // `>` first fills from slot 1 (PyTorch's last_index starts at 0).
        let mut want = [1; 16];
        want[0] = 0;
        assert_eq!(table("roundup_power2_divisions:[>:1]"), want);
        // Intervals beyond 32 GiB clamp to slot 15; `>` after slot 15 fills nothing.
        let mut want = [2; 16];
        want[15] = 8;
        assert_eq!(
            table("roundup_power2_divisions:[1:2,2:2,65536:8,>:4]")[15],
            8
        );
        assert_eq!(table("roundup_power2_divisions:[32768:2,1048576:8]"), want);
        // V = 0 disables a slot.
        assert_eq!(
            table("roundup_power2_divisions:[4:0,>:2]")[..4],
            [0, 0, 0, 2]
        );
        // A later entry overrides an earlier one.
        assert_eq!(
            table("roundup_power2_divisions:[>:1,64:8]")[..8],
            [8, 8, 8, 8, 8, 8, 8, 1]
        );

        assert!(matches!(
            err("roundup_power2_divisions:0"),
            ConfigError::RoundupDivisions { value: 0 }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:3"),
            ConfigError::RoundupDivisions { value: 3 }
        ));
        assert_eq!(
            err("roundup_power2_divisions:[64:3]"),
            ConfigError::RoundupListDivisions {
                interval: "64".into(),
                value: 3
            }
        );
        for bad in ["0", "3", "abc", "-4"] {
            assert_eq!(
                err(&format!("roundup_power2_divisions:[{bad}:2]")),
                ConfigError::RoundupInterval {
                    interval: bad.into()
                }
            );
        }
        assert!(matches!(
            err("roundup_power2_divisions:[64:x]"),
            ConfigError::InvalidInteger {
                key: "roundup_power2_divisions",
                ..
            }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:four"),
            ConfigError::InvalidInteger {
                problem: IntegerProblem::NotANumber,
                ..
            }
        ));
        // `[]` and a trailing comma in the list are accepted, as in PyTorch.
        assert_eq!(
            cfg("roundup_power2_divisions:4,roundup_power2_divisions:[]").roundup_power2_divisions,
            [0; 16]
        );
        assert_eq!(
            table("roundup_power2_divisions:[64:8,]"),
            table("roundup_power2_divisions:[64:8]")
        );
        assert_eq!(
            table("roundup_power2_divisions:[64:8,>:1,]"),
            table("roundup_power2_divisions:[64:8,>:1]")
        );
        assert_eq!(
            err("roundup_power2_divisions:[64:8,>:1"),
            ConfigError::MissingClosingBracket {
                key: "roundup_power2_divisions".into(),
                position: 25
            }
        );
        assert!(matches!(
            err("roundup_power2_divisions:[64:8,,]"),
            ConfigError::Syntax { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[,]"),
            ConfigError::Syntax { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[64:8:2]"),
            ConfigError::Syntax { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[64,8]"),
            ConfigError::Syntax { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[[64:8]]"),
            ConfigError::Syntax { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[64:8]]"),
            ConfigError::Syntax { .. }
        ));
        assert_eq!(
            err("max_split_size_mb:[64:8]"),
            ConfigError::UnexpectedList {
                key: "max_split_size_mb"
            }
        );
    }

    /// The invalid strings of PyTorch's `test_allocator_settings`.
    #[test]
    fn test_allocator_settings_invalid_strings() {
        assert_eq!(
            err("foo:1,bar:2"),
            ConfigError::UnknownKey { key: "foo".into() }
        );
        assert_eq!(
            err("garbage_collection_threshold:1.2"),
            ConfigError::GarbageCollectionThreshold { value: 1.2 }
        );
        assert_eq!(
            err("max_split_size_mb:2"),
            ConfigError::SplitSizeTooSmall {
                key: "max_split_size_mb",
                value: 2,
                min: 20
            }
        );
        assert_eq!(
            err("release_lock_on_cudamalloc:none"),
            ConfigError::InvalidBool {
                key: "release_lock_on_cudamalloc",
                value: "none".into()
            }
        );
        assert_eq!(
            err("pinned_use_cuda_host_register:none"),
            ConfigError::InvalidBool {
                key: "pinned_use_cuda_host_register",
                value: "none".into()
            }
        );
        assert_eq!(
            err("pinned_num_register_threads:none"),
            ConfigError::InvalidInteger {
                key: "pinned_num_register_threads",
                value: "none".into(),
                problem: IntegerProblem::NotANumber
            }
        );
        assert_eq!(
            err("pinned_num_register_threads:1024"),
            ConfigError::TooManyRegisterThreads { value: 1024 }
        );
    }

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

    /// PyTorch's `test_set_per_process_memory_fraction` / `test_get_…` on the config side.
    #[test]
    fn test_set_per_process_memory_fraction() {
        let d = AllocatorConfig::default();
        assert_eq!(d.memory_fraction_limit(1000), None);
        let half = d.clone().with_memory_fraction(0.5).expect("valid");
        assert_eq!(half.memory_fraction_limit(1000), Some(500));
        assert_eq!(
            d.clone()
                .with_memory_fraction(0.0)
                .expect("valid")
                .memory_fraction_limit(7),
            Some(0)
        );
        assert_eq!(
            half.memory_fraction_limit(usize::MAX),
            Some((0.5 * usize::MAX as f64) as usize)
        );
        assert!(d.clone().with_memory_fraction(-0.1).is_err());
        assert!(d.clone().with_memory_fraction(2.0).is_err());
        assert!(d.with_memory_fraction(f64::NAN).is_err());
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

    /// "should have reset the power2 divisions now" (`test_allocator_settings`) and the
    /// rest of the reset semantics of spec §5.1.
    #[test]
    fn test_allocator_settings_reset_semantics() {
        let mut c = cfg("roundup_power2_divisions:4,expandable_segments:True,\
                         garbage_collection_threshold:0.6,pinned_num_register_threads:8");
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        c.update("max_split_size_mb:40").expect("valid");
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert_eq!(c.max_split_size, 40 << 20);
        assert_eq!(c.garbage_collection_threshold, 0.0);
        assert!(c.expandable_segments);
        assert_eq!(c.pinned_num_register_threads, 8);
        assert_eq!(c.last_settings, "max_split_size_mb:40");

        c.update("release_lock_on_cudamalloc:True").expect("valid");
        assert_eq!(c.max_split_size, usize::MAX);
        assert!(c.release_lock_on_device_malloc);

        // large_segment_size is kept; max_non_split_rounding is re-derived from it.
        c.update("large_segment_size_mb:64,max_non_split_rounding_mb:100")
            .expect("valid");
        assert_eq!(c.max_non_split_rounding_size, 100 << 20);
        c.update("expandable_segments:False").expect("valid");
        assert_eq!(c.large_segment_size, 64 << 20);
        assert_eq!(c.max_non_split_rounding_size, 64 << 20);
        assert!(!c.expandable_segments);
    }

    /// A documented deviation: PyTorch's `_set_allocator_settings` keeps the
    /// options parsed before an error; remat applies nothing.
    #[test]
    fn failed_update_changes_nothing() {
        let mut c = cfg("max_split_size_mb:64,roundup_power2_divisions:2");
        let before = c.clone();
        for bad in [
            "max_split_size_mb:128,foo:1",
            "large_segment_size_mb:100,max_split_size_mb:64",
            "roundup_power2_divisions:8,expandable_segments:yes",
            "expandable_segments:True,,",
            "garbage_collection_threshold:0.5,per_process_memory_fraction:1e-400",
        ] {
            assert!(c.update(bad).is_err(), "{bad}");
            assert_eq!(c, before, "{bad}");
        }
    }

    #[test]
    fn large_segment_size_first_pass() {
        let c = cfg("large_segment_size_mb:11");
        assert_eq!(c.large_segment_size, 11 << 20);
        assert_eq!(c.max_non_split_rounding_size, 11 << 20);
        assert_eq!(
            cfg("max_split_size_mb:11,large_segment_size_mb:11").max_split_size,
            11 << 20
        );
        // The bound is the large segment size given later in the same string.
        assert_eq!(
            err("max_split_size_mb:30,large_segment_size_mb:40"),
            ConfigError::SplitSizeTooSmall {
                key: "max_split_size_mb",
                value: 30,
                min: 40
            }
        );
        assert_eq!(
            err("max_non_split_rounding_mb:19"),
            ConfigError::SplitSizeTooSmall {
                key: "max_non_split_rounding_mb",
                value: 19,
                min: 20
            }
        );
        assert_eq!(
            cfg("max_non_split_rounding_mb:20").max_non_split_rounding_size,
            20 << 20
        );
        assert_eq!(
            err("large_segment_size_mb:10"),
            ConfigError::LargeSegmentSizeTooSmall { value: 10 }
        );
        assert!(matches!(
            err(&format!("large_segment_size_mb:{}", usize::MAX / 2)),
            ConfigError::InvalidInteger {
                problem: IntegerProblem::TooLarge,
                ..
            }
        ));
        assert_eq!(
            err("large_segment_size_mb:[1:2]"),
            ConfigError::UnexpectedList {
                key: "large_segment_size_mb"
            }
        );
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

    #[test]
    fn pinned_options() {
        let c = cfg(
            "pinned_use_hip_host_register:True,pinned_num_register_threads:128,\
                     pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64,\
                     pinned_free_catch_all:True",
        );
        assert!(c.pinned_use_host_register);
        assert_eq!(c.pinned_num_register_threads, 128);
        assert!(c.pinned_use_background_threads);
        assert_eq!(c.pinned_reserve_segment_size_mb, 64);
        assert!(c.pinned_free_catch_all);
        assert_eq!(
            cfg("pinned_num_register_threads:1").pinned_num_register_threads,
            1
        );
        assert_eq!(
            err("pinned_num_register_threads:0"),
            ConfigError::RegisterThreadsNotPowerOf2 { value: 0 }
        );
        assert_eq!(
            err("pinned_num_register_threads:256"),
            ConfigError::TooManyRegisterThreads { value: 256 }
        );
        assert_eq!(
            err("pinned_reserve_segment_size_mb:0"),
            ConfigError::PinnedReserveSegmentSize { value: 0 }
        );
    }

    #[test]
    fn booleans_and_aliases() {
        let c = cfg("expandable_segments:True,release_lock_on_hipmalloc:True,\
                     graph_capture_record_stream_reuse:True,throw_on_cudamalloc_oom:True");
        assert!(c.expandable_segments);
        assert!(c.release_lock_on_device_malloc);
        assert!(c.graph_capture_record_stream_reuse);
        assert!(c.throw_on_cudamalloc_oom);
        assert!(!cfg("expandable_segments:True,expandable_segments:False").expandable_segments);
        for bad in ["true", "TRUE", "1", "False!"] {
            assert_eq!(
                err(&format!("expandable_segments:{bad}")),
                ConfigError::InvalidBool {
                    key: "expandable_segments",
                    value: bad.into()
                }
            );
        }
        assert_eq!(
            err("Expandable_segments:True"),
            ConfigError::UnknownKey {
                key: "Expandable_segments".into()
            }
        );
    }

    /// PyTorch's `test_allocator_backend`: remat has only the native backend, so the
    /// async backends are a typed error instead of being ignored.
    #[test]
    fn test_allocator_backend() {
        assert_eq!(
            cfg("backend:native,max_split_size_mb:20").max_split_size,
            20 << 20
        );
        for b in ["cudaMallocAsync", "hipMallocAsync"] {
            assert_eq!(
                err(&format!(
                    "max_split_size_mb:20,backend:{b},release_lock_on_cudamalloc:True"
                )),
                ConfigError::UnsupportedBackend { backend: b.into() }
            );
        }
        assert_eq!(
            err("backend:Native"),
            ConfigError::UnknownBackend {
                backend: "Native".into()
            }
        );
    }

    #[test]
    fn syntax_errors() {
        let syntax = |s: &str| match err(s) {
            ConfigError::Syntax {
                position,
                expected,
                found,
                key,
            } => (position, expected, found, key),
            other => panic!("{s}: expected a syntax error, got {other:?}"),
        };
        assert_eq!(
            syntax("max_split_size_mb=64"),
            (
                20,
                EXPECTED_COLON_NOT_EQ,
                None,
                Some("max_split_size_mb=64".into())
            )
        );
        assert_eq!(syntax("a;b"), (3, EXPECTED_COLON, None, Some("a;b".into())));
        assert_eq!(
            syntax("max_split_size_mb:64:1"),
            (
                20,
                EXPECTED_NEXT,
                Some(":".into()),
                Some("max_split_size_mb".into())
            )
        );
        // One trailing comma is allowed (as in PyTorch), two are not.
        assert_eq!(
            syntax("expandable_segments:True,,"),
            (25, EXPECTED_KEY, Some(",".into()), None)
        );
        assert_eq!(syntax(","), (0, EXPECTED_KEY, Some(",".into()), None));
        assert_eq!(
            syntax("expandable_segments:True,,max_split_size_mb:64"),
            (25, EXPECTED_KEY, Some(",".into()), None)
        );
        assert_eq!(
            syntax(",expandable_segments:True"),
            (0, EXPECTED_KEY, Some(",".into()), None)
        );
        assert_eq!(syntax(":64"), (0, EXPECTED_KEY, Some(":".into()), None));
        assert_eq!(
            syntax("max_split_size_mb::64"),
            (
                18,
                EXPECTED_VALUE,
                Some(":".into()),
                Some("max_split_size_mb".into())
            )
        );
        assert_eq!(syntax("a:1 b:2").0, 5);
        assert_eq!(
            syntax("max_split_size_mb 64"),
            (20, EXPECTED_COLON, None, Some("max_split_size_mb64".into()))
        );
        assert_eq!(
            err("max_split_size_mb:"),
            ConfigError::EmptyValue {
                key: "max_split_size_mb".into(),
                position: 18
            }
        );
        assert_eq!(
            err("max_split_size_mb:,expandable_segments:True"),
            ConfigError::EmptyValue {
                key: "max_split_size_mb".into(),
                position: 18
            }
        );
        // Syntax is checked before keys: an unknown key later does not hide it.
        assert!(matches!(
            err("foo:1,max_split_size_mb=64"),
            ConfigError::Syntax { .. }
        ));
        // Positions count characters, not bytes.
        assert_eq!(syntax("é:1:").0, 3);
    }

    #[test]
    fn test_env_fallback_order() {
        let lookup = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let (c, src) = AllocatorConfig::from_lookup(lookup(&[])).expect("valid");
        assert_eq!((c, src), (AllocatorConfig::default(), None));

        let (c, src) = AllocatorConfig::from_lookup(lookup(&[
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:30"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40"),
            ("REMAT_ALLOC_CONF", "max_split_size_mb:50"),
        ]))
        .expect("valid");
        assert_eq!(
            (c.max_split_size, src),
            (50 << 20, Some("REMAT_ALLOC_CONF"))
        );
        assert_eq!(c.last_settings, "max_split_size_mb:50");

        let (c, src) = AllocatorConfig::from_lookup(lookup(&[
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:30"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40"),
        ]))
        .expect("valid");
        assert_eq!(
            (c.max_split_size, src),
            (40 << 20, Some("PYTORCH_CUDA_ALLOC_CONF"))
        );

        let (c, src) =
            AllocatorConfig::from_lookup(lookup(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:30")]))
                .expect("valid");
        assert_eq!(
            (c.max_split_size, src),
            (30 << 20, Some("PYTORCH_ALLOC_CONF"))
        );

        // Set but empty still wins.
        let (c, src) = AllocatorConfig::from_lookup(lookup(&[
            ("REMAT_ALLOC_CONF", ""),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40"),
        ]))
        .expect("valid");
        assert_eq!(
            (c.max_split_size, src),
            (usize::MAX, Some("REMAT_ALLOC_CONF"))
        );

        let e = AllocatorConfig::from_lookup(lookup(&[("PYTORCH_CUDA_ALLOC_CONF", "foo:1")]))
            .expect_err("invalid");
        assert_eq!(
            e,
            ConfigError::InEnvVar {
                var: "PYTORCH_CUDA_ALLOC_CONF",
                value: "foo:1".into(),
                error: Box::new(ConfigError::UnknownKey { key: "foo".into() }),
            }
        );
        assert!(e
            .to_string()
            .starts_with("invalid PYTORCH_CUDA_ALLOC_CONF='foo:1': Unrecognized key"));
    }

    #[test]
    fn builders() {
        let c = AllocatorConfig::default()
            .with_max_split_size_mb(64)
            .and_then(|c| c.with_roundup_power2_divisions(4))
            .and_then(|c| c.with_garbage_collection_threshold(0.8))
            .and_then(|c| c.with_memory_fraction(0.5))
            .map(|c| c.with_expandable_segments(true))
            .expect("valid");
        let parsed = cfg("max_split_size_mb:64,roundup_power2_divisions:4,\
                          garbage_collection_threshold:0.8,per_process_memory_fraction:0.5,\
                          expandable_segments:True");
        assert_eq!(
            c,
            AllocatorConfig {
                last_settings: String::new(),
                ..parsed
            }
        );
        let d = AllocatorConfig::default();
        assert!(d.clone().with_max_split_size_mb(19).is_err());
        assert!(d.clone().with_roundup_power2_divisions(0).is_err());
        assert!(d.clone().with_garbage_collection_threshold(1.0).is_err());
        assert_eq!(
            d.with_max_split_size_mb(usize::MAX)
                .map(|c| c.max_split_size),
            Ok((usize::MAX / MIB) * MIB)
        );
    }

    #[test]
    fn effective_settings_lists_every_option() {
        let d = AllocatorConfig::default().effective_settings();
        let keys: Vec<&str> = d.iter().map(|(k, _)| *k).collect();
        for key in KEYS {
            let canonical = match *key {
                "release_lock_on_hipmalloc" => "release_lock_on_cudamalloc",
                "pinned_use_hip_host_register" => "pinned_use_cuda_host_register",
                k => k,
            };
            assert!(keys.contains(&canonical), "{key}");
        }
        assert_eq!(keys.len(), KEYS.len() - 2);
        let get = |s: &[(&str, String)], k: &str| {
            s.iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get(&d, "max_split_size_mb"), "unlimited");
        assert_eq!(get(&d, "per_process_memory_fraction"), "1");
        let c = cfg(
            "max_split_size_mb:64,roundup_power2_divisions:[64:8,>:1],expandable_segments:True",
        )
        .effective_settings();
        assert_eq!(get(&c, "max_split_size_mb"), "64");
        assert_eq!(
            get(&c, "roundup_power2_divisions"),
            "[8,8,8,8,8,8,8,1,1,1,1,1,1,1,1,1]"
        );
        assert_eq!(get(&c, "expandable_segments"), "True");
        assert_eq!(get(&c, "backend"), "native");
    }

    fn assert_round_trip(c: &AllocatorConfig) {
        let s = c.to_string();
        match AllocatorConfig::parse(&s) {
            Ok(back) => {
                assert_eq!(
                    AllocatorConfig {
                        last_settings: c.last_settings.clone(),
                        ..back
                    },
                    *c,
                    "{s}"
                )
            }
            Err(e) => panic!("{c:?} displays as {s:?}, which fails: {e}"),
        }
    }

    #[test]
    fn display_round_trip() {
        assert_eq!(AllocatorConfig::default().to_string(), "");
        let c = cfg("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]");
        assert_eq!(
            c.to_string(),
            "roundup_power2_divisions:[64:8,128:2,256:2,512:2,>:1]"
        );
        assert_eq!(
            cfg("max_split_size_mb:64,expandable_segments:True").to_string(),
            "max_split_size_mb:64,expandable_segments:True"
        );
        assert_eq!(
            cfg("roundup_power2_divisions:[2:4,>:4]").to_string(),
            "roundup_power2_divisions:4"
        );
        for s in [
            "",
            "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
            "roundup_power2_divisions:[256:4,>:1]",
            "roundup_power2_divisions:[1:2,2:4]",
            "roundup_power2_divisions:[>:1]",
            "roundup_power2_divisions:[4:0,8:2,16:0,>:8]",
            "roundup_power2_divisions:1",
            "large_segment_size_mb:64,max_split_size_mb:64,max_non_split_rounding_mb:128",
            "max_split_size_mb:18446744073709551615",
            "garbage_collection_threshold:0.1,per_process_memory_fraction:0.3",
            "per_process_memory_fraction:0",
            "release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True",
            "pinned_num_register_threads:64,pinned_reserve_segment_size_mb:7,\
             pinned_use_background_threads:True,pinned_free_catch_all:True,\
             graph_capture_record_stream_reuse:True,throw_on_cudamalloc_oom:True",
        ] {
            assert_round_trip(&cfg(s));
        }
    }

    /// Real keys, near-miss keys and junk, for the fuzzers.
    fn key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => proptest::sample::select(KEYS).prop_map(str::to_owned),
            1 => "[a-z_]{0,12}",
            1 => proptest::sample::select(&[
                "", ">", "=", "foo", "max_split_size_mb=64", "max\u{3000}_split_size_mb",
                "max_split_size_mb\u{a0}", " max_split_size_mb\u{b}",
            ][..])
            .prop_map(str::to_owned),
        ]
    }

    /// Values worth trying for any key: valid and near-miss ones, separators, lists.
    #[rustfmt::skip]
    const FUZZ_VALUES: &[&str] = &[
        "True", "False", "true", "none", "0", "1", "2", "4", "11", "20", "64", "128", "1024",
        "-1", "0.5", "1.2", "-0.1", "nan", "inf", "native", "cudaMallocAsync", ">", "[", "]",
        ":", ",", "", "18446744073709551615", "99999999999999999999999", "[64:8,>:1]",
        "[1:2,2:4]", "[>:1", "[]", "[0:1]", "[64:8,]", "[64:8,>:1,]", "[,]", "[64:8,,>:1]",
        "5e-324", "1e-310", "1e-400", "0e-400", "1e400", "2.2250738585072014e-308", "64MB",
        "175\u{3000}2186044416", "0.5x", "-0", "\u{b}40", "40\u{a0}", "0.5 ", "1e-5",
    ];

    fn value_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(FUZZ_VALUES).prop_map(str::to_owned),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
            proptest::collection::vec(
                (
                    prop_oneof![
                        Just(">".to_owned()),
                        any::<u16>().prop_map(|n| n.to_string())
                    ],
                    any::<u8>()
                ),
                0..6
            )
            .prop_map(|items| {
                let items: Vec<String> = items.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("[{}]", items.join(","))
            }),
        ]
    }

    fn sep_strategy() -> impl Strategy<Value = &'static str> {
        proptest::sample::select(&[":", ":", ":", "=", "", "::", " : ", "[", "]"][..])
    }

    fn check_no_panic(s: &str) {
        check_against_pytorch(s);
        match AllocatorConfig::parse(s) {
            Ok(c) => {
                assert_eq!(c.last_settings, s);
                assert_round_trip(&c);
            }
            Err(e) => assert!(!e.to_string().is_empty(), "{s:?}: {e:?}"),
        }
        let mut c = AllocatorConfig::default().with_expandable_segments(true);
        let before = c.clone();
        if c.update(s).is_err() {
            assert_eq!(c, before);
        }
    }

    /// remat's verdict on a string next to PyTorch's.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Remat {
        /// The same verdict as PyTorch.
        Same,
        /// Rejects what PyTorch accepts, for this documented deviation.
        Rejects(Deviation),
    }

    /// PyTorch's verdict.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Torch {
        Accepts,
        Rejects,
    }

    /// PyTorch's verdicts, read off its parser (c10/core/AllocatorConfig.h and .cpp,
    /// c10/cuda/CUDAAllocatorConfig.cpp, spec §5) and glibc's `strtod` (whose
    /// ERANGE decides what `std::stod` throws), and what remat does with each
    /// string. The model of PyTorch's parser the fuzz tests use must agree with
    /// every row.
    #[rustfmt::skip]
    const PYTORCH_VERDICTS: &[(&str, Torch, Remat)] = &[
        // PyTorch's loop ends cleanly after one trailing comma.
        ("max_split_size_mb:40,", Torch::Accepts, Remat::Same),
        ("max_split_size_mb:40, \t", Torch::Accepts, Remat::Same),
        ("roundup_power2_divisions:[64:8],", Torch::Accepts, Remat::Same),
        ("max_split_size_mb:40,,", Torch::Rejects, Remat::Same),
        ("max_split_size_mb:40,,expandable_segments:True", Torch::Rejects, Remat::Same),
        (",max_split_size_mb:40", Torch::Rejects, Remat::Same),
        (",", Torch::Rejects, Remat::Same),
        // Lists: `]` may follow `[` or a comma.
        ("roundup_power2_divisions:[]", Torch::Accepts, Remat::Same),
        ("roundup_power2_divisions:[64:8,]", Torch::Accepts, Remat::Same),
        ("roundup_power2_divisions:[64:8,>:1,]", Torch::Accepts, Remat::Same),
        ("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", Torch::Accepts, Remat::Same),
        ("roundup_power2_divisions:[64:8,,>:1]", Torch::Rejects, Remat::Same),
        ("roundup_power2_divisions:[,]", Torch::Rejects, Remat::Same),
        ("roundup_power2_divisions:[64:8", Torch::Rejects, Remat::Same),
        // std::stod throws out_of_range where strtod sets ERANGE.
        ("garbage_collection_threshold:5e-324", Torch::Rejects, Remat::Same),
        ("garbage_collection_threshold:1e-310", Torch::Rejects, Remat::Same),
        ("per_process_memory_fraction:1e-400", Torch::Rejects, Remat::Same),
        ("per_process_memory_fraction:1e400", Torch::Rejects, Remat::Same),
        ("per_process_memory_fraction:0e-400", Torch::Accepts, Remat::Same),
        ("per_process_memory_fraction:2.2250738585072014e-308", Torch::Accepts, Remat::Same),
        // Only ASCII whitespace is dropped (C's isspace, byte by byte).
        ("max\u{3000}_split_size_mb:40", Torch::Rejects, Remat::Same),
        ("max_split_size_mb:\u{b}40\u{c}", Torch::Accepts, Remat::Same),
        // stoull reads 175 and ignores the rest; remat does not guess.
        ("max_split_size_mb:175\u{3000}2186044416", Torch::Accepts, Remat::Rejects(Deviation::Number)),
        ("max_split_size_mb:40\u{a0}", Torch::Accepts, Remat::Rejects(Deviation::Number)),
        ("max_split_size_mb:64MB", Torch::Accepts, Remat::Rejects(Deviation::Number)),
        ("max_split_size_mb:-1", Torch::Accepts, Remat::Rejects(Deviation::Number)),
        ("garbage_collection_threshold:0.5x", Torch::Accepts, Remat::Rejects(Deviation::Number)),
        // checkToken's result is ignored.
        ("max_split_size_mb[64", Torch::Accepts, Remat::Rejects(Deviation::Separator)),
        ("expandable_segments:True;max_split_size_mb:64", Torch::Rejects, Remat::Same),
        ("max_split_size_mb=64", Torch::Rejects, Remat::Same),
        ("large_segment_size_mb:18446744073709551615", Torch::Accepts, Remat::Rejects(Deviation::SizeOverflow)),
        ("backend:cudaMallocAsync", Torch::Accepts, Remat::Rejects(Deviation::Backend)),
        ("backend:hipMallocAsync", Torch::Rejects, Remat::Same),
        ("", Torch::Accepts, Remat::Same),
        (" \t\n", Torch::Accepts, Remat::Same),
        ("foo:1", Torch::Rejects, Remat::Same),
        ("max_split_size_mb", Torch::Rejects, Remat::Same),
        ("max_split_size_mb:", Torch::Rejects, Remat::Same),
        ("max_split_size_mb:2", Torch::Rejects, Remat::Same),
        ("max_split_size_mb:30,large_segment_size_mb:40", Torch::Rejects, Remat::Same),
        ("expandable_segments:true", Torch::Rejects, Remat::Same),
    ];

    #[test]
    fn pytorch_verdicts() {
        for &(s, torch, remat) in PYTORCH_VERDICTS {
            let model = pytorch_model::parse(s);
            assert_eq!(
                model.is_ok(),
                torch == Torch::Accepts,
                "the model of PyTorch's parser disagrees with the table on {s:?}: {model:?}"
            );
            let ours = AllocatorConfig::parse(s);
            match remat {
                Remat::Same => {
                    assert_eq!(ours.is_ok(), torch == Torch::Accepts, "{s:?}: {ours:?}");
                    if let Ok(m) = &model {
                        assert!(m.deviations.is_empty(), "{s:?}: {m:?}");
                    }
                }
                Remat::Rejects(deviation) => {
                    assert_eq!(torch, Torch::Accepts, "{s:?}");
                    let found = model.map(|m| m.deviations).unwrap_or_default();
                    assert!(found.contains(&deviation), "{s:?}: {found:?}");
                    let e = match ours {
                        Ok(c) => panic!("{s:?} should be rejected ({deviation:?}), got {c:?}"),
                        Err(e) => e,
                    };
                    // The error that documents each deviation.
                    let expected = match (deviation, &e) {
                        (Deviation::Separator, ConfigError::Syntax { .. }) => true,
                        (Deviation::Number, ConfigError::InvalidInteger { problem, .. }) => {
                            matches!(
                                problem,
                                IntegerProblem::NotANumber | IntegerProblem::Negative
                            )
                        }
                        (Deviation::Number, ConfigError::InvalidFloat { .. }) => true,
                        (
                            Deviation::SizeOverflow,
                            ConfigError::InvalidInteger {
                                problem: IntegerProblem::TooLarge,
                                ..
                            },
                        ) => true,
                        (Deviation::Backend, ConfigError::UnsupportedBackend { .. }) => true,
                        _ => false,
                    };
                    assert!(expected, "{s:?} ({deviation:?}): {e:?}");
                }
            }
        }
    }

    /// remat against the model of PyTorch's parser: never laxer; stricter only
    /// where a documented deviation says so; the same settings where both accept.
    fn check_against_pytorch(s: &str) {
        match (pytorch_model::parse(s), AllocatorConfig::parse(s)) {
            (Err(why), Ok(c)) => panic!("remat accepts {s:?} ({c:?}), PyTorch rejects it: {why}"),
            (Err(_), Err(_)) => {}
            (Ok(p), Err(e)) => assert!(
                !p.deviations.is_empty(),
                "remat rejects {s:?} ({e}), PyTorch accepts it ({p:?}) and no documented \
                 deviation covers it"
            ),
            (Ok(p), Ok(c)) => {
                assert!(
                    p.deviations.is_empty(),
                    "remat accepts {s:?} but PyTorch reads it only through {:?}",
                    p.deviations
                );
                let ours = (
                    c.max_split_size as u64,
                    c.roundup_power2_divisions.map(|d| d as u64),
                    c.garbage_collection_threshold,
                    c.per_process_memory_fraction,
                    c.expandable_segments,
                );
                let theirs = (
                    p.max_split_size,
                    p.roundup,
                    p.gc_threshold,
                    p.memory_fraction,
                    p.expandable_segments,
                );
                assert_eq!(ours, theirs, "{s:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn fuzz_arbitrary_strings(s in any::<String>()) {
            check_no_panic(&s);
        }

        #[test]
        fn fuzz_config_alphabet(s in "[a-z_:,\\[\\]>0-9. =-]{0,40}") {
            check_no_panic(&s);
        }

        #[test]
        fn fuzz_key_value_combos(
            items in proptest::collection::vec(
                (key_strategy(), sep_strategy(), value_strategy()), 0..6),
            joiner in proptest::sample::select(&[",", ",", ",", ",,", ";", ""][..]),
            trailing in proptest::bool::weighted(0.1),
        ) {
            let mut s = items
                .iter()
                .map(|(k, sep, v)| format!("{k}{sep}{v}"))
                .collect::<Vec<_>>()
                .join(joiner);
            if trailing {
                s.push(',');
            }
            check_no_panic(&s);
        }

        #[test]
        fn valid_configs_round_trip(
            large in proptest::option::of(11usize..200),
            split in proptest::option::of(0usize..400),
            divisions in proptest::collection::vec(
                (0u32..17, prop_oneof![Just(0usize), (0u32..6).prop_map(|p| 1usize << p)]),
                0..6),
            over in proptest::option::of((0u32..6).prop_map(|p| 1usize << p)),
            gc in proptest::option::of(0.001f64..0.999),
            fraction in proptest::option::of(0.0f64..=1.0),
            expandable in any::<bool>(),
        ) {
            let mut items = Vec::new();
            let large_mb = large.unwrap_or(20);
            if let Some(l) = large {
                items.push(format!("large_segment_size_mb:{l}"));
            }
            if let Some(s) = split {
                items.push(format!("max_split_size_mb:{}", s + large_mb));
            }
            let mut list: Vec<String> =
                divisions.iter().map(|(p, v)| format!("{}:{v}", 1usize << p)).collect();
            if let Some(o) = over {
                list.push(format!(">:{o}"));
            }
            if !list.is_empty() {
                items.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
            if let Some(g) = gc {
                items.push(format!("garbage_collection_threshold:{g}"));
            }
            if let Some(f) = fraction {
                items.push(format!("per_process_memory_fraction:{f}"));
            }
            items.push(format!("expandable_segments:{}", fmt_bool(expandable)));
            let s = items.join(",");
            let c = AllocatorConfig::parse(&s);
            prop_assert!(c.is_ok(), "{s}: {c:?}");
            if let Ok(c) = c {
                prop_assert_eq!(c.large_segment_size, large_mb * MIB);
                assert_round_trip(&c);
            }
        }
    }
}
