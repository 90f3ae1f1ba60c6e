//! The static planner on the DTR-paper traces: one request per storage, no
//! eviction. Every plan is checked by the independent verifier, and the best
//! algorithm must land within 0.1 % of the lower bound (max live bytes), and
//! within 0.05 % once compacted.

use remat_alloc::plan::{compact, max_live_bytes, plan, verify, Algorithm, Plan, Request};
use remat_trace::{baseline, require_traces, storage_lifetimes, trace_files, Trace};

fn requests(trace: &Trace) -> Vec<Request> {
    let n = trace.instructions.len();
    storage_lifetimes(trace)
        .unwrap()
        .iter()
        .map(|l| Request::new(l.bytes, l.alloc_at, l.end_or(n)))
        .collect()
}

#[test]
fn plans_of_every_trace_are_valid_and_near_the_lower_bound() {
    if require_traces("plans_of_every_trace_are_valid_and_near_the_lower_bound").is_none() {
        return;
    }
    let files = trace_files();
    assert_eq!(files.len(), 5, "expected the five DTR-paper traces");
    for path in files {
        let trace = Trace::load(&path).unwrap();
        let r = requests(&trace);
        // Without eviction the lower bound is the unbounded replay's peak.
        let lb = max_live_bytes(&r);
        assert_eq!(lb, baseline(&trace).unwrap().peak_bytes, "{}", trace.name);
        let mut best: Option<(Algorithm, Plan)> = None;
        for algo in Algorithm::ALL {
            let p = plan(&r, algo).unwrap();
            verify(&r, &p).unwrap_or_else(|v| panic!("{} {algo}: {v}", trace.name));
            assert_eq!(p.max_live_bytes, lb);
            assert!(
                p.arena_bytes >= lb,
                "{} {algo}: below the lower bound",
                trace.name
            );
            eprintln!(
                "{:12} {:15} arena {:>12} over lower bound {:.4} %",
                trace.name,
                algo.name(),
                p.arena_bytes,
                p.over_lower_bound_pct()
            );
            if algo == Algorithm::GreedyBySize {
                // The known range of greedy by size on these traces: 0.00-0.15 %.
                assert!(
                    p.over_lower_bound_pct() <= 0.15,
                    "{}: greedy {:.4} %",
                    trace.name,
                    p.over_lower_bound_pct()
                );
            }
            if best
                .as_ref()
                .is_none_or(|(_, b)| p.arena_bytes < b.arena_bytes)
            {
                best = Some((algo, p));
            }
        }
        let (algo, p) = best.unwrap();
        assert!(
            p.arena_bytes as f64 <= lb as f64 * 1.001,
            "{}: best plan ({algo}) is {:.4} % over the lower bound",
            trace.name,
            p.over_lower_bound_pct()
        );
    }
}

#[test]
fn the_offline_planners_beat_online_best_fit_on_every_trace() {
    if require_traces("the_offline_planners_beat_online_best_fit_on_every_trace").is_none() {
        return;
    }
    for path in trace_files() {
        let trace = Trace::load(&path).unwrap();
        let r = requests(&trace);
        let bf = plan(&r, Algorithm::BestFit).unwrap().arena_bytes;
        let g = plan(&r, Algorithm::GreedyBySize).unwrap().arena_bytes;
        let s = plan(&r, Algorithm::SeedSim).unwrap().arena_bytes;
        assert!(g.min(s) <= bf, "{}", trace.name);
    }
}

#[test]
fn compacted_plans_of_every_trace_are_valid_and_within_half_a_permille() {
    if require_traces("compacted_plans_of_every_trace_are_valid_and_within_half_a_permille")
        .is_none()
    {
        return;
    }
    for path in trace_files() {
        let trace = Trace::load(&path).unwrap();
        let r = requests(&trace);
        let lb = max_live_bytes(&r);
        let mut best = u64::MAX;
        for algo in Algorithm::ALL {
            let p = plan(&r, algo).unwrap();
            let c = compact(&r, &p).unwrap();
            verify(&r, &c).unwrap_or_else(|v| panic!("{} {algo}+compact: {v}", trace.name));
            assert!(c.arena_bytes <= p.arena_bytes, "{} {algo}", trace.name);
            eprintln!(
                "{:12} {:15} arena {:>12} over lower bound {:.4} %, compacted {:.4} %",
                trace.name,
                algo.name(),
                p.arena_bytes,
                p.over_lower_bound_pct(),
                c.over_lower_bound_pct()
            );
            best = best.min(c.arena_bytes);
        }
        assert!(
            best as f64 <= lb as f64 * 1.0005,
            "{}: best compacted plan {best} B, lower bound {lb} B",
            trace.name
        );
    }
}
