//! The README's exact baseline figures, reproduced to the byte and nanosecond.

use remat_trace::{baseline, find_trace, require_traces, storage_lifetimes, Trace};

/// (trace, peak bytes, compute ns, constant bytes, storages with bytes > 0 or None)
const ROWS: [(&str, u64, u64, u64, Option<usize>); 5] = [
    (
        "resnet32",
        10_061_179_152,
        291_905_487,
        35_584_920,
        Some(646),
    ),
    (
        "transformer",
        9_864_405_000,
        276_259_118,
        263_197_248,
        Some(1812),
    ),
    ("lstm", 5_595_127_736, 769_458_833, 194_424_928, Some(5247)),
    ("treelstm", 170_173_608, 120_490_892, 2_000_800, None),
    ("unroll_gan", 252_677_418, 125_451_477, 14_876_292, None),
];

#[test]
fn baseline_figures_match_the_paper_simulator() {
    if require_traces("baseline_figures_match_the_paper_simulator").is_none() {
        return;
    }
    for (name, peak, compute, constants, _) in ROWS {
        let path = find_trace(name).unwrap_or_else(|| panic!("trace {name} not found"));
        let trace = Trace::load(&path).unwrap();
        assert_eq!(trace.name, name);
        let b = baseline(&trace).unwrap();
        assert_eq!(b.peak_bytes, peak, "{name}: peak bytes");
        assert_eq!(b.compute_ns, compute, "{name}: compute ns");
        assert_eq!(b.constant_bytes, constants, "{name}: constant bytes");
    }
}

#[test]
fn storage_lifetimes_agree_with_the_baseline() {
    if require_traces("storage_lifetimes_agree_with_the_baseline").is_none() {
        return;
    }
    for (name, peak, _, constants, storages) in ROWS {
        let trace = Trace::load(&find_trace(name).unwrap()).unwrap();
        let lives = storage_lifetimes(&trace).unwrap();
        if let Some(n) = storages {
            // The README's storage counts leave out zero-byte storages.
            assert_eq!(lives.iter().filter(|l| l.bytes > 0).count(), n, "{name}");
        }
        // Dense ids in creation order, sorted by alloc_at, frees after allocs.
        for (i, l) in lives.iter().enumerate() {
            assert_eq!(l.storage, i);
            if i > 0 {
                assert!(lives[i - 1].alloc_at < l.alloc_at);
            }
            if let Some(f) = l.free_at {
                assert!(f > l.alloc_at);
                assert!(f < trace.instructions.len());
            }
        }
        let c: u64 = lives.iter().filter(|l| l.constant).map(|l| l.bytes).sum();
        assert_eq!(c, constants, "{name}");
        // Sweep: max live bytes over the event clock equals the baseline peak.
        let mut delta = vec![0i128; trace.instructions.len() + 1];
        for l in &lives {
            delta[l.alloc_at] += l.bytes as i128;
            delta[l.end_or(trace.instructions.len())] -= l.bytes as i128;
        }
        let (mut live, mut max) = (0i128, 0i128);
        for d in delta {
            live += d;
            max = max.max(live);
        }
        assert_eq!(max as u64, peak, "{name}");
    }
}

#[test]
fn jsonl_round_trip_of_a_real_trace() {
    if require_traces("jsonl_round_trip_of_a_real_trace").is_none() {
        return;
    }
    let trace = Trace::load(&find_trace("resnet32").unwrap()).unwrap();
    let again = Trace::parse("resnet32", &trace.to_jsonl()).unwrap();
    assert_eq!(trace, again);
    assert_eq!(trace.start_index(), Some(0));
}
