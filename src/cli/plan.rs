//! `remat plan <trace>…`: static memory plans for the DTR-paper traces.
//!
//! Every storage of a trace becomes one planning request (its bytes, alive from
//! the instruction that allocates it to the one that frees it, or to the end),
//! with no eviction. Each algorithm's arena is printed beside the lower bound
//! (max live bytes) and beside the reserved peak of the caching allocator
//! replaying the same sequence.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use remat_alloc::plan::{self, Algorithm, Request};
use remat_trace::{StorageLifetime, Trace};

/// Arguments of `remat plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Traces: short names (`resnet32`), paths to `.log` files, or `all` (the
    /// default) for every trace in the traces directory (`REMAT_TRACES_DIR`, else
    /// `../shared/traces/dtr-paper`).
    pub traces: Vec<String>,
    /// Planning algorithm: greedy-by-size, seed-sim, best-fit or all.
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Print JSON (one array of row objects) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip the caching-allocator column (replaying it takes a moment).
    #[arg(long)]
    pub no_caching: bool,
    /// Also compact each algorithm's plan (`remat_alloc::plan::compact`) and
    /// print it as a row of its own, `<algo>+compact` (its `plan_ms` includes
    /// the algorithm's).
    #[arg(long)]
    pub compact: bool,
}

/// One row of the output.
#[derive(Debug, Clone)]
struct Row {
    trace: String,
    algo: String,
    requests: usize,
    max_live_bytes: u64,
    arena_bytes: u64,
    over_lower_bound_pct: f64,
    plan_ms: f64,
    verified: bool,
    caching_reserved_peak_bytes: Option<u64>,
}

/// Runs `remat plan`.
pub fn run(args: PlanArgs) -> Result<(), Box<dyn Error>> {
    let algos: Vec<Algorithm> = match args.algo.as_str() {
        "all" => Algorithm::ALL.to_vec(),
        name => vec![name.parse::<Algorithm>()?],
    };
    let paths = resolve_traces(&args.traces)?;
    let mut rows = Vec::new();
    for path in paths {
        let trace = Trace::load(&path)?;
        let lifetimes = remat_trace::storage_lifetimes(&trace)?;
        let requests = requests_from_lifetimes(&lifetimes, trace.instructions.len());
        let caching = if args.no_caching {
            None
        } else {
            caching_allocator_reserved_peak(&trace)?
        };
        for &algo in &algos {
            let t0 = Instant::now();
            let p = plan::plan(&requests, algo)?;
            let mut planned = vec![(algo.name().to_string(), p, t0.elapsed())];
            if args.compact {
                let c = plan::compact(&requests, &planned[0].1)?;
                planned.push((format!("{}+compact", algo.name()), c, t0.elapsed()));
            }
            for (name, p, took) in planned {
                if let Err(v) = plan::verify(&requests, &p) {
                    return Err(
                        format!("{}: {name} produced an invalid plan: {v}", trace.name).into(),
                    );
                }
                rows.push(Row {
                    trace: trace.name.clone(),
                    algo: name,
                    requests: requests.len(),
                    max_live_bytes: p.max_live_bytes,
                    arena_bytes: p.arena_bytes,
                    over_lower_bound_pct: p.over_lower_bound_pct(),
                    plan_ms: took.as_secs_f64() * 1e3,
                    verified: true,
                    caching_reserved_peak_bytes: caching,
                });
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&rows))?);
    } else {
        print_table(&rows);
    }
    Ok(())
}

/// One request per storage, alive over `[alloc_at, free_at)` (to `trace_len` when
/// it is never freed), no overwrites.
pub fn requests_from_lifetimes(lifetimes: &[StorageLifetime], trace_len: usize) -> Vec<Request> {
    lifetimes
        .iter()
        .map(|l| Request::new(l.bytes, l.alloc_at, l.end_or(trace_len)))
        .collect()
}

fn resolve_traces(names: &[String]) -> Result<Vec<PathBuf>, Box<dyn Error>> {
    if names.is_empty() || names.iter().any(|n| n == "all") {
        let files = remat_trace::trace_files();
        if files.is_empty() {
            return Err(format!(
                "no traces found: set {} to the directory holding the DTR-paper traces",
                remat_trace::TRACES_DIR_ENV
            )
            .into());
        }
        return Ok(files);
    }
    names
        .iter()
        .map(|n| {
            remat_trace::find_trace(n).ok_or_else(|| {
                format!(
                    "trace {n:?} not found (a short name like resnet32, a path, or all; traces directory: {})",
                    remat_trace::traces_dir()
                        .map_or("none found, set REMAT_TRACES_DIR".into(), |d| d.display().to_string())
                )
                .into()
            })
        })
        .collect()
}

/// The caching allocator's reserved peak on the same sequence (one malloc per
/// storage with bytes > 0, one free when it dies), on an unbounded simulated device.
fn caching_allocator_reserved_peak(trace: &Trace) -> Result<Option<u64>, Box<dyn Error>> {
    let events = remat_trace::storage_events(trace)?;
    let replay = remat::alloc_replay::replay(&events, remat_alloc::AllocatorConfig::default())?;
    Ok(Some(replay.peak_reserved_bytes))
}

fn to_json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "trace": r.trace,
                    "algo": r.algo,
                    "requests": r.requests,
                    "max_live_bytes": r.max_live_bytes,
                    "arena_bytes": r.arena_bytes,
                    "over_lower_bound_pct": r.over_lower_bound_pct,
                    "plan_ms": r.plan_ms,
                    "verified": r.verified,
                    "caching_reserved_peak_bytes": r.caching_reserved_peak_bytes,
                    "caching_over_lower_bound_pct": r.caching_reserved_peak_bytes.map(|c| pct(c, r.max_live_bytes)),
                })
            })
            .collect(),
    )
}

fn pct(x: u64, base: u64) -> f64 {
    if base == 0 {
        0.0
    } else {
        (x as f64 / base as f64 - 1.0) * 100.0
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<12} {:<22} {:>8} {:>15} {:>15} {:>20} {:>9} {:>8} {:>15} {:>11}",
        "trace",
        "algo",
        "requests",
        "max_live_bytes",
        "arena_bytes",
        "over_lower_bound_pct",
        "plan_ms",
        "verified",
        "caching_peak",
        "caching_pct"
    );
    for r in rows {
        let (c, cp) = match r.caching_reserved_peak_bytes {
            Some(c) => (c.to_string(), format!("{:.3}", pct(c, r.max_live_bytes))),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<12} {:<22} {:>8} {:>15} {:>15} {:>20.4} {:>9.2} {:>8} {:>15} {:>11}",
            r.trace,
            r.algo,
            r.requests,
            r.max_live_bytes,
            r.arena_bytes,
            r.over_lower_bound_pct,
            r.plan_ms,
            r.verified,
            c,
            cp
        );
    }
}
