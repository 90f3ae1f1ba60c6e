//! The whole parser against the model of PyTorch's (`pytorch_model.rs`): a table
//! of verdicts, and fuzzers that check remat is never laxer than PyTorch,
//! stricter only where a documented deviation says so, never panics, and that
//! what it accepts prints back to an equal config.

use super::display::fmt_bool;
use super::pytorch_model::{self, Deviation};
use super::test_util::assert_round_trip;
use super::{AllocatorConfig, ConfigError, IntegerProblem, KEYS};
use crate::size::MIB;
use proptest::prelude::*;

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
