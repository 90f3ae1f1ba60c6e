//! Model-based property tests (bumpalo's quickchecks habit): random sequences of
//! malloc / free / record_stream / stream progress / empty_cache / setting
//! changes, checked after every step against a trivial model (the set of live
//! allocations, which must never overlap and must keep their sizes) and the full
//! invariant scan.

use super::{check, GB, MB};
use crate::size::{allocation_size, round_size};
use crate::{Allocation, AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

#[derive(Debug, Clone)]
enum Op {
    Malloc { size: usize, stream: u8 },
    Free { index: usize },
    RecordStream { index: usize, stream: u8 },
    EnqueueWork { stream: u8 },
    CompleteStream { stream: u8 },
    EmptyCache,
    Settings(&'static str),
    Fraction(f64),
}

const SETTINGS: [&str; 6] = [
    "",
    "max_split_size_mb:40",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
    "expandable_segments:False,garbage_collection_threshold:0.6",
    "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:[2:4,>:2]",
];

fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..4096,                      // tiny: small pool, 512 B rounding
        3 => 4096usize..(1 << 20) + 1,          // small pool up to exactly 1 MiB
        3 => (1usize << 20) + 1..10 << 20,      // large pool, 20 MiB segments
        2 => (10usize << 20)..90 << 20,         // large, own segments, oversize with max_split 40
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size_strategy(), 0u8..3).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        8 => any::<usize>().prop_map(|index| Op::Free { index }),
        2 => (any::<usize>(), 0u8..3).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        2 => (0u8..3).prop_map(|stream| Op::EnqueueWork { stream }),
        2 => (0u8..3).prop_map(|stream| Op::CompleteStream { stream }),
        1 => Just(Op::EmptyCache),
        1 => (0..SETTINGS.len()).prop_map(|i| Op::Settings(SETTINGS[i])),
        1 => prop_oneof![Just(1.0), Just(0.5), Just(0.25)].prop_map(Op::Fraction),
    ]
}

/// Runs `ops`, checking the model and the invariants after every step.
fn run(ops: &[Op], capacity: usize) {
    let a =
        CachingAllocator::new(SimulatedDevice::new(capacity), AllocatorConfig::default()).unwrap();
    let mut live: Vec<Allocation> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Malloc { size, stream } => match a.malloc(*size, StreamId(u64::from(*stream))) {
                Ok(x) => {
                    assert!(
                        x.size() >= *size && x.size() % 512 == 0,
                        "step {step}: {x:?} for {size}"
                    );
                    let (lo, hi) = (x.ptr(), x.ptr() + x.size() as u64);
                    for y in &live {
                        let (ylo, yhi) = (y.ptr(), y.ptr() + y.size() as u64);
                        assert!(
                            hi <= ylo || yhi <= lo,
                            "step {step}: {x:?} overlaps live {y:?}"
                        );
                    }
                    live.push(x);
                }
                Err(e) => {
                    assert!(e.is_out_of_memory(), "step {step}: unexpected error {e}");
                    // Before giving up the allocator released every wholly free
                    // segment, so each remaining plain segment holds an active block
                    // and a new segment would not fit under the limit.
                    let snap = a.snapshot();
                    for seg in snap.segments.iter().filter(|g| !g.is_expandable) {
                        assert!(
                            seg.active_size > 0,
                            "step {step}: OOM with a free segment cached: {seg:?}"
                        );
                    }
                    if !a.expandable_segments_active() {
                        let cfg = a.config();
                        let need = allocation_size(round_size(*size, &cfg), &cfg);
                        let limit = if a.memory_fraction() < 1.0 {
                            (a.memory_fraction() * capacity as f64) as usize
                        } else {
                            capacity
                        };
                        assert!(
                            a.memory_reserved() + need > limit,
                            "step {step}: OOM though {need} fits next to {} reserved",
                            a.memory_reserved()
                        );
                    }
                }
            },
            Op::Free { index } if !live.is_empty() => {
                let x = live.swap_remove(index % live.len());
                a.free(x).unwrap();
            }
            Op::RecordStream { index, stream } if !live.is_empty() => {
                let x = &live[index % live.len()];
                a.record_stream(x, StreamId(u64::from(*stream))).unwrap();
            }
            Op::EnqueueWork { stream } => {
                a.with_device(|d| d.enqueue_work(StreamId(u64::from(*stream))))
            }
            Op::CompleteStream { stream } => {
                a.with_device(|d| d.complete_stream(StreamId(u64::from(*stream))))
            }
            Op::EmptyCache => a.empty_cache().unwrap(),
            Op::Settings(s) => a.set_settings(s).unwrap(),
            Op::Fraction(f) => a.set_memory_fraction(*f).unwrap(),
            _ => {}
        }
        check(&a);
        let s = a.stats();
        let live_bytes: usize = live.iter().map(|x| x.size()).sum();
        assert_eq!(
            s.allocated_bytes.all.current as usize, live_bytes,
            "step {step}"
        );
        assert_eq!(s.allocation.all.current as usize, live.len(), "step {step}");
        assert_eq!(
            a.with_device(|d| d.used()),
            a.memory_reserved(),
            "step {step}: device and stats disagree"
        );
    }
    for x in live.drain(..) {
        a.free(x).unwrap();
    }
    a.with_device(|d| d.complete_all());
    a.empty_cache().unwrap();
    check(&a);
    assert_eq!(
        a.memory_reserved(),
        0,
        "everything goes back after empty_cache"
    );
    assert_eq!(a.with_device(|d| (d.used(), d.live_events())), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(ops in prop::collection::vec(op_strategy(), 1..300)) {
        run(&ops, 2 * GB);
    }

    #[test]
    fn random_sequences_under_pressure(ops in prop::collection::vec(op_strategy(), 1..300)) {
        run(&ops, 256 * MB);
    }
}

/// One long run of ≥ 10k operations.
#[test]
fn ten_thousand_ops() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let ops = prop::collection::vec(op_strategy(), 12_000)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    assert!(ops.len() >= 10_000);
    run(&ops, GB);
}
