//! Applying parsed entries to an [`AllocatorConfig`]: the two passes
//! (`large_segment_size_mb` first), PyTorch's reset semantics, each key's rules,
//! and the list form of `roundup_power2_divisions`.

use super::parse::{parse_entries, Entry, RawValue, Token};
use super::values::{
    check_divisions, check_gc_threshold, check_memory_fraction, check_split_size_mb, mib_to_bytes,
    parse_bool, parse_f64, parse_usize, scalar,
};
use super::{AllocatorConfig, ConfigError, MAX_PINNED_REGISTER_THREADS};
use crate::size::{MIB, MIN_LARGE_ALLOC, ROUNDUP_POWER2_INTERVALS};

impl AllocatorConfig {
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

#[cfg(test)]
mod tests {
    use super::super::test_util::{cfg, err, table};
    use super::*;
    use crate::config::IntegerProblem;

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
}
