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
//! | `pinned_use_cuda_host_register` (alias `pinned_use_hip_host_register`) | `True` / `False` | `False` | host allocator ([`crate::host`]): pin new blocks by `malloc` + `cuMemHostRegister` instead of `cuMemHostAlloc` |
//! | `pinned_num_register_threads` | power of two `<= 128` | 1 | host allocator: threads that pre-fault a block's pages before it is registered |
//! | `pinned_use_background_threads` | `True` / `False` | `False` | host allocator option; accepted and validated, no effect (events are polled at every host allocation, PyTorch's behaviour without the thread) |
//! | `pinned_reserve_segment_size_mb` | integer MiB, `> 0` | unset (0) | host allocator: one segment of this size pinned at the first request; blocks that fit are carved from it and never returned |
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
//! # Source layout
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`AllocatorConfig`], its defaults, [`AllocatorConfig::parse`], `from_env`, the `with_*` builders and [`AllocatorConfig::validate`] |
//! | `error.rs` | [`ConfigError`] and [`IntegerProblem`] |
//! | `parse.rs` | the tokenizer and grammar: a string to `key:value` entries, nothing interpreted |
//! | `values.rs` | one value read and range-checked (integers, floats, booleans, MiB sizes) |
//! | `apply.rs` | [`AllocatorConfig::update`]: the two passes, the reset semantics, each key's rules |
//! | `display.rs` | [`AllocatorConfig::effective_settings`] and the canonical settings string (`Display`) |
//! | `pytorch_model.rs`, `fuzz.rs`, `test_util.rs` (tests only) | a model of PyTorch's parser and the fuzz tests against it |
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

use crate::size::{LARGE_BUFFER, MIB, MIN_LARGE_ALLOC, ROUNDUP_POWER2_INTERVALS};

mod apply;
mod display;
mod error;
#[cfg(test)]
mod fuzz;
mod parse;
#[cfg(test)]
mod pytorch_model;
#[cfg(test)]
mod test_util;
mod values;

pub use error::{ConfigError, IntegerProblem};

use values::{check_divisions, check_gc_threshold, check_memory_fraction, check_split_size_mb};

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
    /// `pinned_use_cuda_host_register` / `pinned_use_hip_host_register`: the
    /// host allocator ([`crate::host`]) pins by `malloc` + `cuMemHostRegister`.
    pub pinned_use_host_register: bool,
    /// Host allocator: threads that pre-fault a registered block's pages; a
    /// power of two ≤ [`MAX_PINNED_REGISTER_THREADS`], default 1.
    pub pinned_num_register_threads: usize,
    /// Host allocator option; accepted and validated; no effect here.
    pub pinned_use_background_threads: bool,
    /// MiB. Host allocator: the reserve segment carved for blocks and never
    /// freed; 0 = unset (default), otherwise > 0.
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
}

#[cfg(test)]
mod tests {
    use super::test_util::cfg;
    use super::*;

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
}
