//! Planning time: the three algorithms on the largest DTR-paper trace (lstm,
//! 5248 requests) when the traces are present, and always on a synthetic
//! training-like sequence of 5000 requests. Goal: < 50 ms for 5k requests.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use remat_alloc::plan::{plan, Algorithm, Request};

/// A forward/backward-like sequence: activations that live until their backward
/// step, short-lived temporaries, long-lived parameters; sizes from a small
/// deterministic generator.
fn synthetic(n: usize) -> Vec<Request> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = Vec::with_capacity(n);
    let params = n / 20;
    let acts = (n - params) / 2;
    let t_end = 4 * acts + 2;
    for _ in 0..params {
        out.push(Request::new(512 * (1 + rnd() % 4096), 0, t_end));
    }
    for i in 0..acts {
        let size = 512 * (1 + rnd() % 65_536);
        // Activation i: made at forward step i, consumed at backward step.
        out.push(Request::new(size, 2 * i + 1, t_end - 2 * i - 1));
        // A temporary next to it.
        out.push(Request::new(512 * (1 + rnd() % 8192), 2 * i + 1, 2 * i + 3));
    }
    while out.len() < n {
        out.push(Request::new(512, 0, 1));
    }
    out
}

fn trace_requests() -> Option<(String, Vec<Request>)> {
    let path = remat_trace::find_trace("lstm")?;
    let trace = remat_trace::Trace::load(&path).ok()?;
    let n = trace.instructions.len();
    let lives = remat_trace::storage_lifetimes(&trace).ok()?;
    let r = lives
        .iter()
        .map(|l| Request::new(l.bytes, l.alloc_at, l.end_or(n)))
        .collect();
    Some((trace.name, r))
}

fn bench_planner(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group.sample_size(20);
    let mut inputs = vec![("synthetic-5000".to_string(), synthetic(5000))];
    if let Some(t) = trace_requests() {
        inputs.push(t);
    } else {
        eprintln!("planner bench: DTR-paper traces not found (set REMAT_TRACES_DIR); synthetic input only");
    }
    for (name, requests) in &inputs {
        for algo in Algorithm::ALL {
            group.bench_with_input(
                BenchmarkId::new(algo.name(), format!("{name} ({} requests)", requests.len())),
                requests,
                |b, r| b.iter(|| plan(black_box(r), algo).unwrap()),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_planner);
criterion_main!(benches);
