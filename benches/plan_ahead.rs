//! Cost per op of the planned path against the online one (criterion).
//!
//! One training-like step on a value-free `Runtime<()>`: a forward chain of
//! `LAYERS` activations (each reads the one before and a weight), a backward pass
//! that reads them in reverse, an in-place update of each weight; then
//! `end_iteration`. Three runtimes, measured side by side per op:
//!
//! - `unbudgeted`: no budget (no recording, no eviction): the bookkeeping floor;
//! - `online`: a physical budget of 40 % of the peak, plan-ahead off: every
//!   eviction is a policy decision over the caching allocator;
//! - `planned`: the same budget with plan-ahead on, measured after the plan is in
//!   force (evictions and offsets come from the plan; `end_iteration` keeps it).
//!
//! `cargo bench --bench plan_ahead`; the figures are in docs/dtr-results.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use remat_dtr::DtrConfig;

#[path = "../dtr-core/examples/shared/training_step.rs"]
mod training_step;
use training_step::{runtime, step};

fn plan_ahead(c: &mut Criterion) {
    // The unbudgeted peak, then 40 % of it.
    let (mut rt, ws, ops) = runtime(DtrConfig::default());
    let calls = step(&mut rt, &ws, &ops);
    let budget = rt.stats().peak_live_bytes * 4 / 10;
    let mut g = c.benchmark_group("plan_ahead_per_call");
    g.throughput(Throughput::Elements(calls));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    let cases = [
        ("unbudgeted", DtrConfig::default()),
        (
            "online",
            DtrConfig::default()
                .with_budget(budget)
                .with_plan_ahead(false),
        ),
        ("planned", DtrConfig::default().with_budget(budget)),
    ];
    for (name, config) in cases {
        let (mut rt, ws, ops) = runtime(config);
        // Three steps: record, record from a repeating start, plan.
        for _ in 0..3 {
            step(&mut rt, &ws, &ops);
        }
        if name == "planned" {
            assert!(rt.current_plan().is_some(), "no plan in force");
        }
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(step(&mut rt, &ws, &ops));
                }
                t.elapsed()
            })
        });
        if name == "planned" {
            assert_eq!(rt.stats().divergences, 0, "the planned steps diverged");
        }
    }
    g.finish();
}

criterion_group!(benches, plan_ahead);
criterion_main!(benches);
