//! `remat advise`: how much memory a training step can save, and at what
//! cost. Replays the trace as training iterations (plan-ahead on) over a grid
//! of budgets from its unbudgeted peak down to its floor, on worker threads,
//! and prints the curve: a table, `--json`, `--svg`.
//!
//! ```text
//! remat advise resnet32
//! remat advise my-model.log --svg curve.svg --json > curve.json
//! ```

use std::io::IsTerminal;
use std::path::PathBuf;

use remat_alloc::AllocatorConfig;
use remat_dtr::replay::advise::{advise, Advice, AdviceRow, AdviseSpec};
use remat_dtr::{BudgetMode, DtrConfig, PolicyKind};

use super::charts::advice_chart;
use super::replay::load;

/// Arguments of `remat advise`.
#[derive(clap::Args, Debug, Clone)]
pub struct AdviseArgs {
    /// Trace name (`resnet32`, `lstm`, …) or path to a trace file (one a
    /// model wrote with `export_trace`).
    pub trace: String,
    /// Budgets in the grid, the peak and the floor included.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=200))]
    pub points: u64,
    /// Training iterations replayed at each budget: the first runs online,
    /// the ones after it follow a plan; "steady" is the last one's.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=100))]
    pub iterations: u64,
    /// The floor is the smallest budget whose steady step costs at most this
    /// many times the step's compute.
    #[arg(long, default_value_t = 2.0)]
    pub max_overhead: f64,
    /// physical (a caching allocator of the budget's size) or logical (sum of live bytes).
    #[arg(long, default_value = "physical")]
    pub budget_mode: String,
    /// Eviction policy of the online steps: remat, dtr, dtr-eq, dtr-local,
    /// msps, lru, largest, megengine, coop.
    #[arg(long, default_value = "remat")]
    pub policy: String,
    /// Extra runtime settings in REMAT_DTR_CONF syntax; without it they come
    /// from REMAT_DTR_CONF when set (`--conf` replaces that variable's
    /// settings, it does not add to them). advise turns the planner's random restarts
    /// off (`plan_restarts:0`) unless these set them: each budget plans
    /// several times faster (on lstm, steady overheads move by 0.01 at most).
    #[arg(long)]
    pub conf: Option<String>,
    /// Swap to host memory at this bandwidth per direction (GB/s), as
    /// `remat replay --swap-bandwidth` does: the table gains the steady
    /// step's stalls and the bytes it copies out. 0 or absent: off (unless
    /// `--conf` turns it on).
    #[arg(long)]
    pub swap_bandwidth: Option<f64>,
    /// Allocator settings of physical budgets in REMAT_ALLOC_CONF syntax;
    /// defaults come from REMAT_ALLOC_CONF (then PYTORCH_CUDA_ALLOC_CONF,
    /// PYTORCH_ALLOC_CONF) when set.
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write an SVG chart of the curve to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The `--json` object: `{trace, budget_mode, peak_bytes, constant_bytes,
/// compute_ns, floor_bytes, rows: [{ratio, budget_bytes, first_overhead,
/// steady_overhead, status, …}], wall_ms}`.
pub fn advice_json(a: &Advice) -> serde_json::Value {
    serde_json::json!({
        "trace": a.trace,
        "budget_mode": a.budget_mode.name(),
        "peak_bytes": a.peak_bytes,
        "constant_bytes": a.constant_bytes,
        "compute_ns": a.compute_ns,
        "floor_bytes": a.floor_bytes,
        "max_overhead": a.max_overhead,
        "rows": a.rows.iter().map(row_json).collect::<Vec<_>>(),
        "wall_ms": a.wall_ms,
    })
}

fn row_json(r: &AdviceRow) -> serde_json::Value {
    serde_json::json!({
        "ratio": r.ratio,
        "budget_bytes": r.budget_bytes,
        "first_overhead": r.first_overhead,
        "steady_overhead": r.steady_overhead,
        "status": r.status.name(),
        "evictions": r.evictions,
        "rematerializations": r.rematerializations,
        "planned": r.planned,
        "steady_stall": r.steady_swap.map(|(s, _)| s),
        "steady_swapped_out_bytes": r.steady_swap.map(|(_, b)| b),
    })
}

/// Run `remat advise`.
pub fn run(args: AdviseArgs) -> Result<(), Box<dyn std::error::Error>> {
    let trace = load(&args.trace)?;
    // The planner's random restarts off unless asked for: they multiply the
    // planning time of every budget (lstm: 65 s instead of 8 s a run at the
    // peak) and moved lstm's steady overheads by 0.01 at most.
    let dtr = match &args.conf {
        Some(c) => DtrConfig::parse(&format!("plan_restarts:0,{c}"))?,
        None if std::env::var("REMAT_DTR_CONF").is_ok() => DtrConfig::from_env()?,
        None => DtrConfig::parse("plan_restarts:0")?,
    };
    let allocator = match &args.alloc_conf {
        Some(c) => AllocatorConfig::parse(c)?,
        None => AllocatorConfig::from_env()?,
    };
    let mode: BudgetMode = args.budget_mode.parse()?;
    let policy: PolicyKind = args.policy.parse()?;
    if !(args.max_overhead.is_finite() && args.max_overhead >= 1.0) {
        return Err(format!(
            "--max-overhead {}: expected a finite number ≥ 1.0",
            args.max_overhead
        )
        .into());
    }
    let dtr = super::replay::with_swap_flag(dtr, args.swap_bandwidth)?;
    let spec = AdviseSpec {
        points: args.points as usize,
        iterations: args.iterations as usize,
        max_overhead: args.max_overhead,
        base: dtr
            .with_allocator(allocator)
            .with_budget_mode(mode)
            .with_policy(policy),
        threads: args.threads.unwrap_or(AdviseSpec::default().threads).max(1),
    };
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(spec.points as u64 + 1);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} budgets · {elapsed}",
            )
            .map_err(|e| e.to_string())?
            .progress_chars("#>."),
        );
        bar.set_prefix(format!("advising {}", trace.name));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let advice = advise(&trace, &spec, |done, _| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    if let Some(path) = &args.svg {
        std::fs::write(path, advice_chart(&advice)?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.json {
        println!("{}", advice_json(&advice));
    } else {
        print!("{advice}");
        eprintln!(
            "{} budgets in {:.1} s{}",
            advice.rows.len(),
            advice.wall_ms / 1e3,
            args.svg
                .as_ref()
                .map_or(String::new(), |p| format!(", chart in {}", p.display()))
        );
    }
    Ok(())
}
