//! Fixed allocator workloads for instruction counts (issue 14): run under
//! `valgrind --tool=callgrind` (or `perf stat`) and divide by the iterations,
//! after subtracting a run of `none` (the set-up alone).
//!
//! ```sh
//! cargo build --release -p remat-alloc --example hot_loop
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/hot_loop exact 100000
//! ```
//!
//! Modes (`N` iterations; the cache first holds twenty cached large segments of
//! 22–40 MiB and one small segment with a live 4 KiB block):
//! - `none`: the set-up only;
//! - `exact`: malloc+free of 22 MiB, an exact fit (no split);
//! - `large`: malloc+free of 20 MiB, split from a cached 22 MiB block and merged back;
//! - `small`: malloc+free of 4 KiB, split from the small segment and merged back;
//! - `batch-exact`, `batch-large`, `batch-small`: the same inside one `batch()`;
//! - `adj`: `adjacent_free_size` inside one `inspect`; `batch-adj`: inside one
//!   `batch()`;
//! - `seg`: malloc of a new 64 MiB segment, free, `empty_cache`;
//! - `trace FILE N`: replay a DTR-paper trace's storage lifetimes `N` times, each
//!   in a fresh allocator;
//! - `trace-batch FILE N`: the same, each replay in one `batch()`;
//! - `trace-warm FILE N`, `trace-batch-warm FILE N`: one allocator for every
//!   replay, warmed by one replay first (a training step after the first: the
//!   cache holds the segments), each replay followed by freeing what it left
//!   live;
//! - `trace-offset FILE N`: the same replays through the `offset-allocator`
//!   crate (the benchmarks' O(1) baseline), in 512-byte units, each in a
//!   fresh allocator.
//!
//! For the replays alone, without loading the trace or building the
//! allocators, count only the per-replay functions:
//! `--toggle-collect=hot_loop::remat_once` (add
//! `--toggle-collect=hot_loop::free_left` for the warm modes' frees of what a
//! replay left live) or `--toggle-collect=hot_loop::offset_once`, and divide
//! by `N` (for the warm modes, first subtract the count of `N` = 0, whose one
//! replay warms the cache).

use remat_alloc::{Allocation, AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use remat_trace::{storage_events, StorageEvent, Trace};
use std::hint::black_box;
use std::process::ExitCode;

const S: StreamId = StreamId::DEFAULT;
const MB: usize = 1 << 20;

/// How a trace is replayed.
#[derive(Clone, Copy, PartialEq)]
enum Replay {
    /// remat-alloc through the locking API.
    Locked,
    /// remat-alloc through one `batch()` per replay.
    Batch,
    /// The `offset-allocator` crate.
    Offset,
}

fn replay(path: &str, reps: usize, how: Replay, warm: bool) -> Result<(), String> {
    let trace = Trace::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let events = storage_events(&trace).map_err(|e| e.to_string())?;
    let storages = events
        .iter()
        .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
        .count();
    let fresh = || {
        CachingAllocator::new(SimulatedDevice::new(1 << 50), AllocatorConfig::default())
            .map_err(|e| e.to_string())
    };
    match (how, warm) {
        (Replay::Offset, _) => {
            let units: u64 = events
                .iter()
                .map(|e| match e {
                    StorageEvent::Alloc { bytes, .. } => bytes.div_ceil(512),
                    _ => 0,
                })
                .sum();
            let arena = units.min(u64::from(u32::MAX) - 1) as u32;
            let mut live = vec![None; storages];
            for _ in 0..reps {
                let mut a = offset_allocator::Allocator::new(arena);
                offset_once(&mut a, &events, &mut live)?;
                live.iter_mut().for_each(|x| *x = None);
                black_box(&a);
            }
        }
        (_, false) => {
            let mut live: Vec<Option<Allocation>> = vec![None; storages];
            for _ in 0..reps {
                let a = fresh()?;
                remat_once(&a, &events, &mut live, how == Replay::Batch)?;
                live.iter_mut().for_each(|x| *x = None);
            }
        }
        (_, true) => {
            let a = fresh()?;
            let mut live: Vec<Option<Allocation>> = vec![None; storages];
            for _ in 0..=reps {
                remat_once(&a, &events, &mut live, how == Replay::Batch)?;
                free_left(&a, &mut live)?;
            }
        }
    }
    Ok(())
}

/// One replay of `events` on `a` (for
/// `--toggle-collect=hot_loop::remat_once`): through the locking API, or in
/// one `batch()`.
#[inline(never)]
fn remat_once(
    a: &CachingAllocator<SimulatedDevice>,
    events: &[StorageEvent],
    live: &mut [Option<Allocation>],
    batch: bool,
) -> Result<(), String> {
    let err = |e: remat_alloc::Error| e.to_string();
    if batch {
        let mut g = a.batch();
        for e in events {
            match *e {
                StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                    live[storage] = Some(g.malloc(bytes as usize, S).map_err(err)?);
                }
                StorageEvent::Free { storage, .. } => {
                    if let Some(x) = live[storage].take() {
                        g.free(x).map_err(err)?;
                    }
                }
                _ => {}
            }
        }
    } else {
        for e in events {
            match *e {
                StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                    live[storage] = Some(a.malloc(bytes as usize, S).map_err(err)?);
                }
                StorageEvent::Free { storage, .. } => {
                    if let Some(x) = live[storage].take() {
                        a.free(x).map_err(err)?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Frees what a replay left live (the warm modes: each replay then starts
/// from the same cache).
#[inline(never)]
fn free_left(
    a: &CachingAllocator<SimulatedDevice>,
    live: &mut [Option<Allocation>],
) -> Result<(), String> {
    for x in live.iter_mut().filter_map(Option::take) {
        a.free(x).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One replay through `offset-allocator`, in 512-byte units (its sizes are
/// `u32`), without building it (`--toggle-collect=hot_loop::offset_once`).
#[inline(never)]
fn offset_once(
    a: &mut offset_allocator::Allocator,
    events: &[StorageEvent],
    live: &mut [Option<offset_allocator::Allocation>],
) -> Result<(), String> {
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                let x = a
                    .allocate(bytes.div_ceil(512) as u32)
                    .ok_or("offset-allocator: arena full")?;
                live[storage] = Some(x);
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(x) = live[storage].take() {
                    a.free(x);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn run(mode: &str, n: usize) -> Result<(), remat_alloc::Error> {
    let a = CachingAllocator::new(SimulatedDevice::new(64 << 30), AllocatorConfig::default())?;
    let others: Vec<_> = (0..20)
        .map(|i| a.malloc((21 + i) * MB, S))
        .collect::<Result<_, _>>()?;
    for x in others {
        a.free(x)?;
    }
    let keep = a.malloc(4096, S)?;
    let pair = |size: usize| -> Result<(), remat_alloc::Error> {
        for _ in 0..n {
            let x = a.malloc(black_box(size), S)?;
            a.free(black_box(x))?;
        }
        Ok(())
    };
    let batch_pair = |size: usize| -> Result<(), remat_alloc::Error> {
        let mut g = a.batch();
        for _ in 0..n {
            let x = g.malloc(black_box(size), S)?;
            g.free(black_box(x))?;
        }
        Ok(())
    };
    match mode {
        "none" => {}
        "exact" => pair(22 * MB)?,
        "large" => pair(20 * MB)?,
        "small" => pair(4096)?,
        "batch-exact" => batch_pair(22 * MB)?,
        "batch-large" => batch_pair(20 * MB)?,
        "batch-small" => batch_pair(4096)?,
        "adj" => {
            let m = a.malloc(4 * MB, S)?;
            a.inspect(|v| {
                for _ in 0..n {
                    black_box(v.adjacent_free_size(black_box(&m)))?;
                }
                Ok::<_, remat_alloc::Error>(())
            })?;
            a.free(m)?;
        }
        "batch-adj" => {
            let m = a.malloc(4 * MB, S)?;
            {
                let mut g = a.batch();
                for _ in 0..n {
                    black_box(g.adjacent_free_size(black_box(&m)))?;
                }
            }
            a.free(m)?;
        }
        "seg" => {
            for _ in 0..n {
                let x = a.malloc(black_box(64 * MB), S)?;
                a.free(x)?;
                a.empty_cache()?;
            }
        }
        other => {
            eprintln!("unknown mode {other:?}");
            std::process::exit(2);
        }
    }
    a.free(keep)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let count = |i: usize| arg(i).parse::<usize>().ok();
    let result = match (arg(1), count(2), count(3)) {
        ("trace", _, Some(reps)) => replay(arg(2), reps, Replay::Locked, false),
        ("trace-batch", _, Some(reps)) => replay(arg(2), reps, Replay::Batch, false),
        ("trace-warm", _, Some(reps)) => replay(arg(2), reps, Replay::Locked, true),
        ("trace-batch-warm", _, Some(reps)) => replay(arg(2), reps, Replay::Batch, true),
        ("trace-offset", _, Some(reps)) => replay(arg(2), reps, Replay::Offset, false),
        (mode, Some(n), _) if !mode.starts_with("trace") => run(mode, n).map_err(|e| e.to_string()),
        _ => Err("usage: hot_loop MODE N | hot_loop trace FILE N (see the source)".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
