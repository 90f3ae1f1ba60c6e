//! With no budget the replayer reproduces the README's exact figures, through the
//! runtime (puts, applies, mutates, views, fake/real deletes) — not a side count.

use remat_dtr::replay::{replay, ReplayOptions, ReplayStatus};
use remat_trace::{find_trace, require_traces, Trace};

const EXPECTED: [(&str, u64, u64, u64); 5] = [
    ("resnet32", 10061179152, 291905487, 35584920),
    ("transformer", 9864405000, 276259118, 263197248),
    ("lstm", 5595127736, 769458833, 194424928),
    ("treelstm", 170173608, 120490892, 2000800),
    ("unroll_gan", 252677418, 125451477, 14876292),
];

#[test]
fn unbounded_replay_reproduces_the_exact_baselines() {
    if require_traces("unbounded_replay_reproduces_the_exact_baselines").is_none() {
        return;
    }
    for (name, peak, compute, constants) in EXPECTED {
        let path = find_trace(name).unwrap_or_else(|| panic!("trace {name} not found"));
        let trace = Trace::load(&path).unwrap();
        let base = remat_trace::baseline(&trace).unwrap();
        assert_eq!(base.constant_bytes, constants, "{name}: constant bytes");
        let r = replay(&trace, &ReplayOptions::unbounded(), base.compute_ns).unwrap();
        assert_eq!(r.status, ReplayStatus::Ok, "{name}");
        assert_eq!(r.peak_live_bytes, peak, "{name}: peak live bytes");
        assert_eq!(r.total_compute_ns, compute, "{name}: compute ns");
        assert_eq!(r.overhead, 1.0, "{name}");
        assert_eq!(r.evictions, 0, "{name}");
    }
}
