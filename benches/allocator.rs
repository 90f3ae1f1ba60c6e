//! Allocator benchmarks (criterion).
//!
//! - `hot_path`: malloc+free of a cached block (large pool, exact fit; small pool,
//!   split and merge), `adjacent_free_size`, each through the locking API and
//!   inside one `CachingAllocator::batch`, and the new-segment path.
//! - `trace_replay`: remat-alloc vs the `offset-allocator` crate (O(1) TLSF-style)
//!   replaying the same alloc/free sequence: the storage lifetimes of the DTR
//!   paper's traces, through the locking API (`remat-alloc`) and through one batch
//!   (`remat-alloc-batch`), each from an empty cache, and again from a cache
//!   warmed by one replay (`remat-alloc-warm`, `remat-alloc-batch-warm`: a
//!   training step after the first). Throughput is set in ops, so criterion reports ops/s;
//!   the table in docs/benchmarks.md gives ns/op and the ratio.
//!
//! Run: `cargo bench --bench allocator` (traces from `REMAT_TRACES_DIR`, default
//! `../shared/traces/dtr-paper`; the trace group is skipped with a message when
//! they are absent).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use remat::alloc_replay::{replay, UNBOUNDED_CAPACITY};
use remat_alloc::{Allocation, AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use remat_trace::{storage_events, trace_files, StorageEvent, Trace};
use std::hint::black_box;
use std::time::{Duration, Instant};

const S: StreamId = StreamId::DEFAULT;

fn hot_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_path");
    g.throughput(Throughput::Elements(1));
    let a =
        CachingAllocator::new(SimulatedDevice::new(1 << 30), AllocatorConfig::default()).unwrap();
    // Warm the cache: one 20 MiB block (exact fit, no split) and a small segment.
    let x = a.malloc(20 << 20, S).unwrap();
    a.free(x).unwrap();
    g.bench_function("malloc_free_cached_large_exact", |b| {
        b.iter(|| {
            let x = a.malloc(black_box(20 << 20), S).unwrap();
            a.free(black_box(x)).unwrap();
        })
    });
    let keep = a.malloc(4096, S).unwrap();
    g.bench_function("malloc_free_cached_small_split_merge", |b| {
        b.iter(|| {
            let x = a.malloc(black_box(4096), S).unwrap();
            a.free(black_box(x)).unwrap();
        })
    });
    let left = a.malloc(8 << 20, S).unwrap();
    let mid = a.malloc(4 << 20, S).unwrap();
    a.free(left).unwrap();
    g.bench_function("adjacent_free_size", |b| {
        b.iter(|| black_box(a.adjacent_free_size(black_box(&mid)).unwrap()))
    });
    // The query itself, as DTR runs it: many candidates under one lock.
    a.inspect(|v| {
        g.bench_function("adjacent_free_size_in_view", |b| {
            b.iter(|| black_box(v.adjacent_free_size(black_box(&mid)).unwrap()))
        });
    });
    // The same three through one batch: the lock taken once for all iterations.
    {
        let mut batch = a.batch();
        g.bench_function("malloc_free_cached_small_split_merge_in_batch", |b| {
            b.iter(|| {
                let x = batch.malloc(black_box(4096), S).unwrap();
                batch.free(black_box(x)).unwrap();
            })
        });
        g.bench_function("adjacent_free_size_in_batch", |b| {
            b.iter(|| black_box(batch.adjacent_free_size(black_box(&mid)).unwrap()))
        });
    }
    g.bench_function("new_segment_malloc_free_release", |b| {
        b.iter(|| {
            let x = a.malloc(black_box(64 << 20), S).unwrap();
            a.free(x).unwrap();
            a.empty_cache().unwrap();
        })
    });
    a.free(mid).unwrap();
    a.free(keep).unwrap();
    // The malloc alone of a new 64 MiB segment on an empty cache: timed in runs of
    // 64 mallocs; the frees and the `empty_cache` between runs are not timed.
    let fresh = CachingAllocator::new(
        SimulatedDevice::new(UNBOUNDED_CAPACITY),
        AllocatorConfig::default(),
    )
    .unwrap();
    let mut held = Vec::with_capacity(64);
    g.bench_function("new_segment_malloc", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(64);
                let t0 = Instant::now();
                for _ in 0..n {
                    held.push(fresh.malloc(black_box(64 << 20), S).unwrap());
                }
                total += t0.elapsed();
                for x in held.drain(..) {
                    fresh.free(x).unwrap();
                }
                fresh.empty_cache().unwrap();
                left -= n;
            }
            total
        })
    });
    g.finish();
}

/// Malloc+free of a cached 20 MiB block (exact fit) inside one batch, in an
/// allocator of its own whose cache holds just that block, as
/// `malloc_free_cached_large_exact` has it.
fn large_exact_in_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_path");
    g.throughput(Throughput::Elements(1));
    let a =
        CachingAllocator::new(SimulatedDevice::new(1 << 30), AllocatorConfig::default()).unwrap();
    let x = a.malloc(20 << 20, S).unwrap();
    a.free(x).unwrap();
    let mut batch = a.batch();
    g.bench_function("malloc_free_cached_large_exact_in_batch", |b| {
        b.iter(|| {
            let x = batch.malloc(black_box(20 << 20), S).unwrap();
            batch.free(black_box(x)).unwrap();
        })
    });
    g.finish();
}

/// Replays `events` through remat-alloc; returns the number of ops.
fn replay_remat(
    a: &CachingAllocator<SimulatedDevice>,
    events: &[StorageEvent],
    live: &mut [Option<Allocation>],
) -> usize {
    let mut ops = 0;
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                live[storage] = Some(a.malloc(bytes as usize, S).unwrap());
                ops += 1;
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(x) = live[storage].take() {
                    a.free(x).unwrap();
                    ops += 1;
                }
            }
            _ => {}
        }
    }
    ops
}

/// Replays `events` through one batch of remat-alloc; returns the number of ops.
fn replay_remat_batch(
    a: &CachingAllocator<SimulatedDevice>,
    events: &[StorageEvent],
    live: &mut [Option<Allocation>],
) -> usize {
    let mut g = a.batch();
    let mut ops = 0;
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                live[storage] = Some(g.malloc(bytes as usize, S).unwrap());
                ops += 1;
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(x) = live[storage].take() {
                    g.free(x).unwrap();
                    ops += 1;
                }
            }
            _ => {}
        }
    }
    ops
}

/// Frees what a replay left live (the warm replays end with it, so that each
/// starts from the same cache), through the locking API or one batch; returns
/// the number of frees.
fn free_left(
    a: &CachingAllocator<SimulatedDevice>,
    live: &mut [Option<Allocation>],
    batch: bool,
) -> usize {
    let left = live.iter_mut().filter_map(Option::take);
    let mut ops = 0;
    if batch {
        let mut g = a.batch();
        for x in left {
            g.free(x).unwrap();
            ops += 1;
        }
    } else {
        for x in left {
            a.free(x).unwrap();
            ops += 1;
        }
    }
    ops
}

/// An allocator whose cache holds what one replay of `events` left in it
/// (every storage freed again): a training step after the first.
fn warmed(events: &[StorageEvent], storages: usize) -> CachingAllocator<SimulatedDevice> {
    let a = CachingAllocator::new(
        SimulatedDevice::new(UNBOUNDED_CAPACITY),
        AllocatorConfig::default(),
    )
    .unwrap();
    let mut live = vec![None; storages];
    replay_remat_batch(&a, events, &mut live);
    free_left(&a, &mut live, true);
    a
}

/// Replays `events` through offset-allocator in 512-byte units (the same
/// granularity as remat-alloc's rounding; its sizes are `u32`).
fn replay_offset(
    a: &mut offset_allocator::Allocator,
    events: &[StorageEvent],
    live: &mut [Option<offset_allocator::Allocation>],
) -> usize {
    let mut ops = 0;
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                let units = bytes.div_ceil(512) as u32;
                live[storage] = Some(
                    a.allocate(units)
                        .expect("offset-allocator arena large enough"),
                );
                ops += 1;
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(x) = live[storage].take() {
                    a.free(x);
                    ops += 1;
                }
            }
            _ => {}
        }
    }
    ops
}

fn trace_replay(c: &mut Criterion) {
    let files = trace_files();
    if files.is_empty() {
        eprintln!("skipping trace_replay: traces not found (set REMAT_TRACES_DIR)");
        return;
    }
    let mut g = c.benchmark_group("trace_replay");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for path in files {
        let trace = Trace::load(&path).unwrap();
        let events = storage_events(&trace).unwrap();
        let storages = events
            .iter()
            .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
            .count();
        let total_units: u64 = events
            .iter()
            .map(|e| match e {
                StorageEvent::Alloc { bytes, .. } => bytes.div_ceil(512),
                _ => 0,
            })
            .sum();
        let stats = replay(&events, AllocatorConfig::default()).unwrap();
        let warm_ops = {
            let a = warmed(&events, storages);
            let mut live = vec![None; storages];
            replay_remat(&a, &events, &mut live) + free_left(&a, &mut live, false)
        };
        println!(
            "{}: {} ops ({} warm: the frees of what a replay leaves live added), max live {} B, remat-alloc reserved peak {} B ({:.4}x max live)",
            trace.name,
            stats.ops,
            warm_ops,
            stats.max_live_bytes,
            stats.peak_reserved_bytes,
            stats.reserved_over_live()
        );
        g.throughput(Throughput::Elements(stats.ops as u64));
        g.bench_function(format!("{}/remat-alloc", trace.name), |b| {
            b.iter_batched(
                || {
                    (
                        CachingAllocator::new(
                            SimulatedDevice::new(UNBOUNDED_CAPACITY),
                            AllocatorConfig::default(),
                        )
                        .unwrap(),
                        vec![None; storages],
                    )
                },
                |(a, mut live)| black_box(replay_remat(&a, &events, &mut live)),
                BatchSize::LargeInput,
            )
        });
        g.bench_function(format!("{}/remat-alloc-batch", trace.name), |b| {
            b.iter_batched(
                || {
                    (
                        CachingAllocator::new(
                            SimulatedDevice::new(UNBOUNDED_CAPACITY),
                            AllocatorConfig::default(),
                        )
                        .unwrap(),
                        vec![None; storages],
                    )
                },
                |(a, mut live)| black_box(replay_remat_batch(&a, &events, &mut live)),
                BatchSize::LargeInput,
            )
        });
        // Warm: the cache already holds the segments of a previous replay, as
        // in every training step after the first (no device allocation; the
        // cached blocks are split and merged instead). Each replay also frees
        // what it left live, counted in its ops.
        g.throughput(Throughput::Elements(warm_ops as u64));
        for (name, batch) in [
            ("remat-alloc-warm", false),
            ("remat-alloc-batch-warm", true),
        ] {
            let replay_once = if batch {
                replay_remat_batch
            } else {
                replay_remat
            };
            g.bench_function(format!("{}/{name}", trace.name), |b| {
                b.iter_batched(
                    || (warmed(&events, storages), vec![None; storages]),
                    |(a, mut live)| {
                        black_box(
                            replay_once(&a, &events, &mut live) + free_left(&a, &mut live, batch),
                        )
                    },
                    BatchSize::LargeInput,
                )
            });
        }
        g.throughput(Throughput::Elements(stats.ops as u64));
        let arena = total_units.min(u64::from(u32::MAX) - 1) as u32;
        g.bench_function(format!("{}/offset-allocator", trace.name), |b| {
            b.iter_batched(
                || {
                    (
                        offset_allocator::Allocator::new(arena),
                        vec![None; storages],
                    )
                },
                |(mut a, mut live)| black_box(replay_offset(&mut a, &events, &mut live)),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, hot_path, large_exact_in_batch, trace_replay);
criterion_main!(benches);
