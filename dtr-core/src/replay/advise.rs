//! The budget curve of one training step: "how much memory can I save, and at
//! what cost?" in one call. [`advise`] replays a trace (a DTR-paper trace, or
//! a user's own step exported with [`Recording::to_trace`](crate::Recording::to_trace))
//! as a few training iterations with plan-ahead, over a grid of budgets from
//! its unbudgeted peak down to its floor (the smallest budget at which those
//! runs train, searched with the same runs), on worker threads, and reports
//! each budget's first-step and steady overhead.
//! `remat advise` prints it as a table, JSON and a chart; the adapters'
//! `advise` call it on a recorded step. The table is `Advice`'s `Display`
//! (one format for the command line and the adapters' examples).

use remat_trace::Trace;

use super::{first_step, replay, ReplayError, ReplayOptions, ReplayStatus};
use crate::config::{BudgetMode, DtrConfig};

/// What to advise over.
#[derive(Debug, Clone)]
pub struct AdviseSpec {
    /// Budgets in the grid, the peak and the floor included (at least 2).
    pub points: usize,
    /// Training iterations replayed at each budget (at least 2: plan-ahead
    /// plans from the second boundary on; the steady overhead is the last
    /// iteration's).
    pub iterations: usize,
    /// The floor's bound on the steady step's overhead (the replayer's thrash
    /// limit, 2.0, by default).
    pub max_overhead: f64,
    /// Settings of every run: budget mode, policy, planner (the budget is set
    /// per run).
    pub base: DtrConfig,
    /// Worker threads (the runs are independent).
    pub threads: usize,
}

impl Default for AdviseSpec {
    fn default() -> Self {
        Self {
            points: 10,
            iterations: 3,
            max_overhead: 2.0,
            base: DtrConfig::default(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// One budget of the curve.
#[derive(Debug, Clone, PartialEq)]
pub struct AdviceRow {
    /// The budget over the unbudgeted peak.
    pub ratio: f64,
    /// The budget.
    pub budget_bytes: u64,
    /// The first step's compute over the step's own (it runs online, with
    /// the configured policy); `None` when it did not finish.
    pub first_overhead: Option<f64>,
    /// The last step's (planned from the second on); `None` when it did not
    /// finish.
    pub steady_overhead: Option<f64>,
    /// How the run ended: `ok`, `oom` (nothing left to evict) or `thrash`
    /// (past the overhead limit).
    pub status: ReplayStatus,
    /// Evictions over the whole run.
    pub evictions: u64,
    /// Rematerializations over the whole run.
    pub rematerializations: u64,
    /// The last step followed a plan.
    pub planned: bool,
    /// With swap on: the last step's stalls on host-tier copies over its
    /// compute (part of `steady_overhead`), and the bytes it copied to the
    /// host; `None` with swap off or when it did not finish.
    pub steady_swap: Option<(f64, u64)>,
}

/// The budget curve of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// The trace's name.
    pub trace: String,
    /// The budget mode of every run.
    pub budget_mode: BudgetMode,
    /// Peak of live bytes without a budget (ratio 1).
    pub peak_bytes: u64,
    /// Bytes of constants (parameters, inputs): never evicted.
    pub constant_bytes: u64,
    /// Σ of the step's op costs (ns).
    pub compute_ns: u64,
    /// The smallest budget at which the step trains (it finishes, and the
    /// steady step costs at most [`AdviseSpec::max_overhead`]), to 2 % of the
    /// peak (see [`advise`]); `None` when not even the peak does.
    pub floor_bytes: Option<u64>,
    /// The floor's bound on the steady overhead ([`AdviseSpec::max_overhead`]).
    pub max_overhead: f64,
    /// Training iterations replayed at each budget ([`AdviseSpec::iterations`]).
    pub iterations: usize,
    /// One row per budget, the largest first.
    pub rows: Vec<AdviceRow>,
    /// Wall-clock time of the whole advice (floor and runs), ms.
    pub wall_ms: f64,
}

/// Bytes for people, in binary units: `812 B`, `123.4 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn overhead(o: Option<f64>) -> String {
    o.map_or("–".to_string(), |x| format!("{x:.3}×"))
}

/// The budget curve as `remat advise` prints it: a header (the trace, its
/// peak, constants and floor) and a Markdown table, one row per budget, with
/// the stall and swap columns when swap was on.
impl std::fmt::Display for Advice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self;
        writeln!(
            f,
            "{} · {} budget · {} iterations per budget (plan-ahead from the 2nd)",
            a.trace,
            a.budget_mode.name(),
            a.iterations
        )?;
        let floor = match a.floor_bytes {
            Some(b) => format!(
                "{} ({b} B, {:.2} of peak)",
                human_bytes(b),
                b as f64 / a.peak_bytes.max(1) as f64
            ),
            None => "none: no budget trains this step within the limit".to_string(),
        };
        writeln!(
            f,
            "peak {} ({} B) · constants {} · floor {floor}\n",
            human_bytes(a.peak_bytes),
            a.peak_bytes,
            human_bytes(a.constant_bytes),
        )?;
        let swap = a.rows.iter().any(|r| r.steady_swap.is_some());
        if swap {
            writeln!(f, "| budget | bytes | of peak | first step | steady | of it, stalls | swapped out | status |")?;
            writeln!(f, "|---:|---:|---:|---:|---:|---:|---:|---|")?;
        } else {
            writeln!(
                f,
                "| budget | bytes | of peak | first step | steady | status |"
            )?;
            writeln!(f, "|---:|---:|---:|---:|---:|---|")?;
        }
        for r in &a.rows {
            let swap_cells = match (swap, r.steady_swap) {
                (false, _) => String::new(),
                (true, Some((stall, bytes))) => format!(" {stall:.3}× | {} |", human_bytes(bytes)),
                (true, None) => " – | – |".to_string(),
            };
            writeln!(
                f,
                "| {} | {} | {:.2} | {} | {} |{swap_cells} {} |",
                human_bytes(r.budget_bytes),
                r.budget_bytes,
                r.ratio,
                overhead(r.first_overhead),
                overhead(r.steady_overhead),
                r.status.name()
            )?;
        }
        writeln!(
            f,
            "\noverhead: (compute + recompute + stalls on host copies) / compute of one step; \
             first step online, steady = the last, planned"
        )
    }
}

/// The grid: `points` budgets from `peak` down to `floor`, evenly spaced,
/// both ends included, none repeated.
fn grid(peak: u64, floor: u64, points: usize) -> Vec<u64> {
    if floor >= peak || points < 2 {
        return vec![peak];
    }
    let span = (peak - floor) as f64;
    let mut out: Vec<u64> = (0..points)
        .map(|i| peak - (span * i as f64 / (points - 1) as f64).round() as u64)
        .collect();
    out.dedup();
    out
}

/// Whether a run counts as training at its budget: it finished, and its
/// steady step cost at most `max_overhead`.
fn trains(row: &AdviceRow, max_overhead: f64) -> bool {
    row.status == ReplayStatus::Ok
        && row
            .steady_overhead
            .is_some_and(|o| o <= max_overhead * (1.0 + 1e-9))
}

/// The floor search stops when its bracket is this share of the peak.
const FLOOR_PRECISION: f64 = 0.02;

/// The budget curve of `trace` under `spec`. `progress(done, total)` is
/// called after each run (from worker threads, one call at a time; `total`
/// is an estimate until the floor is known).
///
/// The floor is the replayer's own: the smallest budget at which the same
/// runs train (they finish, and the steady step costs at most
/// [`AdviseSpec::max_overhead`]), to 2 % of the peak. It is searched in two
/// steps, several budgets of each round on the worker threads: the smallest
/// budget whose first step finishes ([`first_step`], no planning: cheap),
/// between the constants' bytes and the peak; then, if whole runs do not
/// train there, the smallest above it at which they do. Feasibility is not monotone in the budget (a plan made
/// for a smaller budget can be cheaper), so a smaller budget may train too;
/// the search does not look for those. (The planner's
/// [`super::min_feasible_budget`] answers from a simulation of the recorded
/// step in a compacting arena: slower, and on the DTR paper's traces below
/// what the replayer's first, online step survives.)
///
/// Errors: `points` < 2 or `iterations` < 2 ([`ReplayError::Options`]); a
/// trace that does not replay or a runtime failure other than the budget
/// ([`ReplayError`]).
pub fn advise(
    trace: &Trace,
    spec: &AdviseSpec,
    progress: impl FnMut(usize, usize) + Send,
) -> Result<Advice, ReplayError> {
    if spec.points < 2 {
        return Err(ReplayError::Options(format!(
            "the grid needs at least 2 budgets (the peak and the floor); got {}",
            spec.points
        )));
    }
    if spec.iterations < 2 {
        return Err(ReplayError::Options(format!(
            "advice replays at least 2 iterations (the first online, the next planned); got {}",
            spec.iterations
        )));
    }
    if !(spec.max_overhead.is_finite() && spec.max_overhead >= 1.0) {
        return Err(ReplayError::Options(format!(
            "max_overhead {}: expected a finite number ≥ 1.0",
            spec.max_overhead
        )));
    }
    let started = std::time::Instant::now();
    let base = remat_trace::baseline(trace)?;
    let peak = base.peak_bytes;
    let threads = spec.threads.max(1);
    // Rounds the floor search takes: each narrows the bracket (threads + 1)
    // times.
    let rounds = ((1.0 / FLOOR_PRECISION).ln() / ((threads + 1) as f64).ln()).ceil() as usize;
    let estimate = std::sync::atomic::AtomicUsize::new(1 + rounds * threads + spec.points);
    let progress = std::sync::Mutex::new((progress, 0usize));
    let tick = || {
        let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
        p.1 += 1;
        let done = p.1;
        let total = estimate
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(done);
        (p.0)(done, total);
    };
    let runs = std::sync::Mutex::new(std::collections::BTreeMap::<u64, AdviceRow>::new());
    let run_one = |budget: u64| -> Result<(), ReplayError> {
        let opts = ReplayOptions {
            config: spec.base.clone().with_budget(budget),
            iterations: spec.iterations,
            ..ReplayOptions::unbounded()
        };
        let r = replay(trace, &opts, base.compute_ns)?;
        let first = r.iterations.first();
        let row = AdviceRow {
            ratio: budget as f64 / peak.max(1) as f64,
            budget_bytes: budget,
            first_overhead: first
                .filter(|f| f.status == ReplayStatus::Ok)
                .map(|f| f.overhead),
            steady_overhead: r.steady_overhead.filter(|_| r.iterations.len() > 1),
            status: r.status,
            evictions: r.evictions,
            rematerializations: r.rematerializations,
            planned: r.iterations.last().is_some_and(|l| l.planned),
            steady_swap: (r.swap_bandwidth_gbps.is_some())
                .then(|| r.iterations.last())
                .flatten()
                .filter(|l| l.status == ReplayStatus::Ok && r.iterations.len() > 1)
                .map(|l| {
                    let compute = base.compute_ns.max(1) as f64;
                    (l.stall_ns as f64 / compute, l.swapped_out_bytes)
                }),
        };
        runs.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(budget, row);
        tick();
        Ok(())
    };
    // The budgets not run yet, on the worker threads.
    let run_all = |budgets: &[u64]| -> Result<(), ReplayError> {
        let todo: Vec<u64> = {
            let done = runs.lock().unwrap_or_else(|e| e.into_inner());
            let mut v: Vec<u64> = budgets
                .iter()
                .copied()
                .filter(|b| !done.contains_key(b))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| -> Result<(), ReplayError> {
            let workers: Vec<_> = (0..threads.min(todo.len()))
                .map(|_| {
                    s.spawn(|| -> Result<(), ReplayError> {
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            match todo.get(k) {
                                Some(&b) => run_one(b)?,
                                None => return Ok(()),
                            }
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            }
            Ok(())
        })
    };
    let row_at = |b: u64| {
        runs.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&b)
            .cloned()
    };
    // The floor, in two searches of brackets (lo fails, hi passes) narrowed
    // by rounds of `threads` budgets run side by side. First the smallest
    // budget whose first step finishes (no run trains below it), from
    // first steps alone (no planning); then, from there up, the smallest at
    // which the whole run trains.
    run_all(&[peak])?;
    let mut floor = None;
    if row_at(peak).is_some_and(|r| trains(&r, spec.max_overhead)) {
        let precision = ((peak as f64 * FLOOR_PRECISION) as u64).max(512);
        let first_ok = std::sync::Mutex::new(std::collections::BTreeMap::<u64, bool>::new());
        let first_all = |budgets: &[u64]| -> Result<(), ReplayError> {
            let next = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| -> Result<(), ReplayError> {
                let workers: Vec<_> = (0..threads.min(budgets.len()))
                    .map(|_| {
                        s.spawn(|| -> Result<(), ReplayError> {
                            loop {
                                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let Some(&b) = budgets.get(k) else {
                                    return Ok(());
                                };
                                let config = spec.base.clone().with_budget(b);
                                let r = first_step(trace, &config, base.compute_ns)?;
                                first_ok
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .insert(b, r.status == ReplayStatus::Ok);
                                tick();
                            }
                        })
                    })
                    .collect();
                for w in workers {
                    w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                }
                Ok(())
            })
        };
        let passes_first = |b: u64| {
            *first_ok
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&b)
                .unwrap_or(&false)
        };
        let passes_run = |b: u64| row_at(b).is_some_and(|r| trains(&r, spec.max_overhead));
        let search = |mut lo: u64,
                      mut hi: u64,
                      run: &dyn Fn(&[u64]) -> Result<(), ReplayError>,
                      passes: &dyn Fn(u64) -> bool|
         -> Result<u64, ReplayError> {
            while hi - lo > precision {
                let step = (hi - lo) as f64 / (threads + 1) as f64;
                let probes: Vec<u64> = (1..=threads)
                    .map(|k| lo + (step * k as f64).round() as u64)
                    .filter(|&b| b > lo && b < hi)
                    .collect();
                if probes.is_empty() {
                    break;
                }
                run(&probes)?;
                if let Some(&b) = probes.iter().find(|&&b| passes(b)) {
                    hi = b;
                }
                lo = (probes.iter().copied())
                    .filter(|&b| b < hi && !passes(b))
                    .max()
                    .unwrap_or(lo);
            }
            Ok(hi)
        };
        let lowest = search(
            base.constant_bytes.min(peak),
            peak,
            &first_all,
            &passes_first,
        )?;
        run_all(&[lowest])?;
        floor = Some(if passes_run(lowest) {
            lowest
        } else {
            search(lowest, peak, &run_all, &passes_run)?
        });
    }
    let budgets = grid(peak, floor.unwrap_or(base.constant_bytes), spec.points);
    let done = runs.lock().unwrap_or_else(|e| e.into_inner()).len();
    let left = budgets.iter().filter(|&&b| row_at(b).is_none()).count();
    estimate.store(done + left, std::sync::atomic::Ordering::Relaxed);
    run_all(&budgets)?;
    let rows = budgets.iter().filter_map(|&b| row_at(b)).collect();
    Ok(Advice {
        trace: trace.name.clone(),
        budget_mode: spec.base.budget_mode,
        peak_bytes: peak,
        constant_bytes: base.constant_bytes,
        compute_ns: base.compute_ns,
        floor_bytes: floor,
        max_overhead: spec.max_overhead,
        iterations: spec.iterations,
        rows,
        wall_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::{grid, human_bytes, Advice, AdviceRow};
    use crate::config::BudgetMode;
    use crate::replay::ReplayStatus;

    #[test]
    fn bytes_are_printed_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(3 << 20 | 1 << 19), "3.5 MiB");
        assert_eq!(human_bytes(u64::MAX), "16777216.0 TiB");
    }

    fn row(budget_bytes: u64, steady_swap: Option<(f64, u64)>) -> AdviceRow {
        AdviceRow {
            ratio: budget_bytes as f64 / 4096.0,
            budget_bytes,
            first_overhead: Some(1.25),
            steady_overhead: (budget_bytes > 1024).then_some(1.125),
            status: ReplayStatus::Ok,
            evictions: 3,
            rematerializations: 2,
            planned: true,
            steady_swap,
        }
    }

    #[test]
    fn the_table_has_one_row_per_budget_and_swap_columns_only_with_swap() {
        let mut a = Advice {
            trace: "step".into(),
            budget_mode: BudgetMode::Physical,
            peak_bytes: 4096,
            constant_bytes: 512,
            compute_ns: 10,
            floor_bytes: Some(1024),
            max_overhead: 2.0,
            iterations: 3,
            rows: vec![row(4096, None), row(1024, None)],
            wall_ms: 1.0,
        };
        let t = a.to_string();
        assert!(
            t.starts_with("step · physical budget · 3 iterations"),
            "{t}"
        );
        assert!(
            t.contains(
                "peak 4.0 KiB (4096 B) · constants 512 B · floor 1.0 KiB (1024 B, 0.25 of peak)"
            ),
            "{t}"
        );
        assert!(
            t.contains("| 4.0 KiB | 4096 | 1.00 | 1.250× | 1.125× | ok |"),
            "{t}"
        );
        assert!(
            t.contains("| 1.0 KiB | 1024 | 0.25 | 1.250× | – | ok |"),
            "{t}"
        );
        assert!(!t.contains("swapped out"), "{t}");
        a.rows[0].steady_swap = Some((0.5, 2048));
        a.floor_bytes = None;
        let t = a.to_string();
        assert!(t.contains("| of it, stalls | swapped out |"), "{t}");
        assert!(t.contains("| 1.125× | 0.500× | 2.0 KiB | ok |"), "{t}");
        assert!(t.contains("| – | – | – | ok |"), "{t}");
        assert!(t.contains("floor none: no budget trains"), "{t}");
    }

    #[test]
    fn the_grid_runs_from_the_peak_to_the_floor() {
        assert_eq!(grid(1000, 100, 4), vec![1000, 700, 400, 100]);
        assert_eq!(grid(1000, 1000, 10), vec![1000]);
        assert_eq!(grid(10, 8, 10), vec![10, 9, 8]);
    }
}
