//! The config written back out: [`AllocatorConfig::effective_settings`] (every
//! option with its value) and `Display` (the canonical settings string, which
//! parses back to an equal config).

use std::fmt;

use super::AllocatorConfig;
use crate::size::MIB;

impl AllocatorConfig {
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

/// `bytes` in MiB: an integer when exact, else two decimals.
fn fmt_mib(bytes: usize) -> String {
    if bytes % MIB == 0 {
        (bytes / MIB).to_string()
    } else {
        format!("{:.2}", bytes as f64 / MIB as f64)
    }
}

pub(super) fn fmt_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_round_trip, cfg};
    use super::*;
    use crate::config::KEYS;

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
}
