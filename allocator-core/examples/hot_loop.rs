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
//! - `adj`: `adjacent_free_size` inside one `inspect`;
//! - `seg`: malloc of a new 64 MiB segment, free, `empty_cache`;
//! - `trace FILE N`: replay a DTR-paper trace's storage lifetimes `N` times, each
//!   in a fresh allocator (subtract `trace FILE 0`, which only loads the trace;
//!   or count only `--toggle-collect=hot_loop::replay_events`);
//! - `trace-batch FILE N`: the same, each replay in one `batch()`
//!   (`hot_loop::replay_events_batch`).

use remat_alloc::{Allocation, AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use remat_trace::{storage_events, StorageEvent, Trace};
use std::hint::black_box;
use std::process::ExitCode;

const S: StreamId = StreamId::DEFAULT;
const MB: usize = 1 << 20;

fn replay(path: &str, reps: usize, batch: bool) -> Result<(), String> {
    let trace = Trace::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let events = storage_events(&trace).map_err(|e| e.to_string())?;
    if batch {
        replay_events_batch(&events, reps)
    } else {
        replay_events(&events, reps)
    }
}

/// The replays alone, apart from loading the trace, for
/// `valgrind --tool=callgrind --toggle-collect=hot_loop::replay_events`.
#[inline(never)]
fn replay_events(events: &[StorageEvent], reps: usize) -> Result<(), String> {
    let storages = events
        .iter()
        .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
        .count();
    for _ in 0..reps {
        let a = CachingAllocator::new(SimulatedDevice::new(1 << 50), AllocatorConfig::default())
            .map_err(|e| e.to_string())?;
        let mut live: Vec<Option<Allocation>> = vec![None; storages];
        for e in events {
            match *e {
                StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                    live[storage] = Some(a.malloc(bytes as usize, S).map_err(|e| e.to_string())?);
                }
                StorageEvent::Free { storage, .. } => {
                    if let Some(x) = live[storage].take() {
                        a.free(x).map_err(|e| e.to_string())?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// [`replay_events`] with each replay in one `batch()`.
#[inline(never)]
fn replay_events_batch(events: &[StorageEvent], reps: usize) -> Result<(), String> {
    let storages = events
        .iter()
        .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
        .count();
    for _ in 0..reps {
        let a = CachingAllocator::new(SimulatedDevice::new(1 << 50), AllocatorConfig::default())
            .map_err(|e| e.to_string())?;
        let mut live: Vec<Option<Allocation>> = vec![None; storages];
        let mut g = a.batch();
        for e in events {
            match *e {
                StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                    live[storage] = Some(g.malloc(bytes as usize, S).map_err(|e| e.to_string())?);
                }
                StorageEvent::Free { storage, .. } => {
                    if let Some(x) = live[storage].take() {
                        g.free(x).map_err(|e| e.to_string())?;
                    }
                }
                _ => {}
            }
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
        ("trace", _, Some(reps)) => replay(arg(2), reps, false),
        ("trace-batch", _, Some(reps)) => replay(arg(2), reps, true),
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
