//! `remat replay`: replay a DTR-paper trace through remat-dtr under a budget, or
//! sweep traces × ratios × policies × budget modes.
//!
//! ```text
//! remat replay lstm --ratio 0.4 --policy remat --budget-mode physical --json
//! remat replay --sweep --traces resnet32,lstm --ratios 0.5,0.4,0.3 --out target/dtr-sweep
//! ```

use std::io::Write;
use std::path::PathBuf;

use remat_alloc::AllocatorConfig;
use remat_dtr::replay::oracle::OracleKind;
use remat_dtr::replay::sweep::{run_sweep, SweepSpec};
use remat_dtr::replay::{replay, ReplayOptions, ReplayReport};
use remat_dtr::{BudgetMode, DtrConfig, PolicyKind};
use remat_trace::{find_trace, trace_files, Trace};

use super::charts::{overhead_chart, timeline_chart};
use super::tables::{fragmentation_table, overhead_table};

/// Arguments of `remat replay`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Trace name (`resnet32`, `lstm`, …) or path to a `.log` file.
    #[arg(required_unless_present = "sweep")]
    pub trace: Option<String>,
    /// Budget as a fraction of the trace's unbounded peak.
    #[arg(long, default_value_t = 0.5)]
    pub ratio: f64,
    /// Budget in bytes (overrides --ratio).
    #[arg(long)]
    pub budget: Option<u64>,
    /// Eviction policy: remat, dtr, dtr-eq, dtr-local, msps, lru, largest, megengine, coop.
    #[arg(long, default_value = "remat")]
    pub policy: String,
    /// Analysis only: replay with a policy that reads the rest of the trace
    /// (next-use, dead, dead-after-backward) instead of --policy; in a sweep,
    /// comma-separated oracles run beside the policies.
    #[arg(long, value_delimiter = ',')]
    pub oracle: Vec<String>,
    /// physical (a caching allocator of the budget's size) or logical (sum of live bytes).
    #[arg(long, default_value = "physical")]
    pub budget_mode: String,
    /// Extra runtime settings in REMAT_DTR_CONF syntax (e.g. `sampling:off,seed:7`);
    /// without it they come from REMAT_DTR_CONF when set (`--conf` replaces
    /// that variable's settings, it does not add to them).
    #[arg(long)]
    pub conf: Option<String>,
    /// Allocator settings of physical budgets in REMAT_ALLOC_CONF syntax (e.g.
    /// `max_split_size_mb:80`); defaults come from REMAT_ALLOC_CONF (then
    /// PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF) when set, else PyTorch's.
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Replay the trace as this many training iterations: constants persist,
    /// every other name is fresh in each; from the second boundary on, remat
    /// plans each iteration from the one before (plan-ahead DTR). Status and
    /// overhead are then the last iteration's.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub iterations: u64,
    /// Swap to host memory at this bandwidth per direction (GB/s; 24 is PCIe
    /// 4.0 ×16): each eviction takes the cheaper of recomputing and a copy
    /// out and back, one copy engine per direction runs beside compute, and
    /// a use before its copy-in completes stalls. 0 or absent: swap off
    /// (unless `--conf` / REMAT_DTR_CONF turn it on). The sweep takes it too.
    #[arg(long)]
    pub swap_bandwidth: Option<f64>,
    /// What a defragmenting arena's moves cost: device memory bandwidth in
    /// GB/s (a move of B bytes reads and writes them, 2·B / bandwidth). 0
    /// leaves moves free. Absent: `move_bandwidth` from `--conf` /
    /// REMAT_DTR_CONF, else 1500 (the torch traces' roofline, A100-class
    /// HBM; the DTR traces were timed on an older GPU, so for them it
    /// under-charges). The sweep takes it too.
    #[arg(long)]
    pub move_bandwidth: Option<f64>,
    /// Stop an iteration as thrash once its compute (first computations,
    /// replays, stalls) passes this multiple of the trace's: a single-
    /// iteration replay and each planned iteration at this, an online one
    /// of several at this or 20, whichever is more. Absent: 2. The stop is
    /// the replayer's; training has none, so a larger limit shows what a
    /// step past it would cost and what the plans after it reach. At least
    /// 1; single runs only.
    #[arg(long)]
    pub thrash_limit: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG memory timeline of this run to the given file.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Sweep traces × ratios × policies × modes instead of one run.
    #[arg(long)]
    pub sweep: bool,
    /// Sweep: comma-separated trace names (default: every trace found).
    #[arg(long, value_delimiter = ',')]
    pub traces: Vec<String>,
    /// Sweep: comma-separated ratios.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2])]
    pub ratios: Vec<f64>,
    /// Sweep: comma-separated policies (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Sweep: comma-separated budget modes (default: physical,logical).
    #[arg(long, value_delimiter = ',')]
    pub modes: Vec<String>,
    /// Sweep: worker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Sweep: output directory for the table (`sweep.md`), JSON lines (`sweep.jsonl`),
    /// charts (`<trace>-<mode>.svg`) and one timeline (`timeline.svg`).
    #[arg(long, default_value = "target/dtr-sweep")]
    pub out: PathBuf,
}

/// The trace named `name` (a short name or a path).
pub(crate) fn load(name: &str) -> Result<Trace, Box<dyn std::error::Error>> {
    let path = find_trace(name).ok_or_else(|| {
        format!("trace {name:?} not found (set REMAT_TRACES_DIR to the DTR-paper traces)")
    })?;
    Ok(Trace::load(&path)?)
}

/// The replayer's stop for `--thrash-limit` (2 when absent).
fn thrash_limit(flag: Option<f64>) -> Result<f64, String> {
    match flag {
        None => Ok(2.0),
        Some(x) if x.is_finite() && x >= 1.0 => Ok(x),
        Some(x) => Err(format!(
            "--thrash-limit {x}: expected a multiple of the trace's compute, at least 1 \
             (2 when absent)"
        )),
    }
}

fn oracles(args: &ReplayArgs) -> Result<Vec<OracleKind>, String> {
    args.oracle.iter().map(|o| o.parse()).collect()
}

fn base_config(args: &ReplayArgs) -> Result<DtrConfig, Box<dyn std::error::Error>> {
    let dtr = match &args.conf {
        Some(c) => DtrConfig::parse(c)?,
        None => DtrConfig::from_env()?,
    };
    let allocator = match &args.alloc_conf {
        Some(c) => AllocatorConfig::parse(c)?,
        None => AllocatorConfig::from_env()?,
    };
    let config = with_swap_flag(dtr.with_allocator(allocator), args.swap_bandwidth)?;
    with_move_flag(config, args.move_bandwidth)
}

/// What the replayer charges a defragmenting move when nothing says
/// otherwise (GB/s of device memory): the torch traces' roofline figure.
pub(crate) const DEFAULT_MOVE_BANDWIDTH: f64 = 1500.0;

/// `config` with `--move-bandwidth` applied (absent: as configured, else
/// [`DEFAULT_MOVE_BANDWIDTH`]; 0: moves free; a bandwidth: charged at it),
/// checked.
pub(crate) fn with_move_flag(
    config: DtrConfig,
    move_bandwidth: Option<f64>,
) -> Result<DtrConfig, Box<dyn std::error::Error>> {
    let config = match move_bandwidth {
        None if config.move_bandwidth.is_none() => {
            config.with_move_bandwidth(Some(DEFAULT_MOVE_BANDWIDTH))
        }
        None => config,
        Some(0.0) => config.with_move_bandwidth(None),
        Some(bw) if bw.is_finite() && bw > 0.0 => config.with_move_bandwidth(Some(bw)),
        Some(bw) => {
            return Err(format!(
                "--move-bandwidth {bw}: expected a device memory bandwidth in GB/s, a finite \
                 number above 0 (0 leaves moves free)"
            )
            .into())
        }
    };
    config.check()?;
    Ok(config)
}

/// `config` with `--swap-bandwidth` applied (absent: as configured; 0: off;
/// a bandwidth: on at it), checked.
pub(crate) fn with_swap_flag(
    config: DtrConfig,
    swap_bandwidth: Option<f64>,
) -> Result<DtrConfig, Box<dyn std::error::Error>> {
    let config = match swap_bandwidth {
        None => config,
        Some(0.0) => config.with_swap(None),
        Some(bw) if bw.is_finite() && bw > 0.0 => config.with_swap(Some(bw)),
        Some(bw) => {
            return Err(format!(
                "--swap-bandwidth {bw}: expected a bandwidth in GB/s per direction, a finite \
                 number above 0 (0 turns swap off)"
            )
            .into())
        }
    };
    config.check()?;
    Ok(config)
}

/// The `--json` object of one run.
pub fn report_json(r: &ReplayReport) -> serde_json::Value {
    serde_json::json!({
        "trace": r.trace,
        "policy": r.policy,
        "ratio": r.ratio,
        "budget_mode": r.budget_mode.name(),
        "budget_bytes": r.budget_bytes,
        "status": r.status.name(),
        "overhead": r.overhead,
        "baseline_compute_ns": r.baseline_compute_ns,
        "total_compute_ns": r.total_compute_ns,
        "swap_bandwidth_gbps": r.swap_bandwidth_gbps,
        "defrag_bytes": r.defrag_bytes,
        "defrag_ns": r.defrag_ns,
        "move_bandwidth_gbps": r.move_bandwidth_gbps,
        "stall_ns": r.stall_ns,
        "swapped_out_bytes": r.swapped_out_bytes,
        "swapped_in_bytes": r.swapped_in_bytes,
        "peak_host_bytes": r.peak_host_bytes,
        "peak_live_bytes": r.peak_live_bytes,
        "peak_reserved_bytes": r.peak_reserved_bytes,
        "evictions": r.evictions,
        "rematerializations": r.rematerializations,
        "decisions": r.decisions,
        "segment_releases": r.segment_releases,
        "decision_ns_median": r.decision_ns_median,
        "reserved_over_budget": r.reserved_over_budget,
        "mean_free_at_eviction": r.mean_free_at_eviction,
        "mean_free_at_eviction_by_pool": {
            "small_pool": r.mean_free_at_eviction_by_pool[0],
            "large_pool": r.mean_free_at_eviction_by_pool[1],
            "unreserved": r.mean_free_at_eviction_by_pool[2],
        },
        "allocator_conf": r.allocator_conf,
        "wall_ms": r.wall_ms,
        "error": r.error,
        "iterations": r.iterations.iter().map(iteration_json).collect::<Vec<_>>(),
        "steady_overhead": r.steady_overhead,
    })
}

/// One entry of the JSON report's `iterations`.
fn iteration_json(it: &remat_dtr::replay::IterationRow) -> serde_json::Value {
    serde_json::json!({
        "index": it.index,
        "status": it.status.name(),
        "overhead": it.overhead,
        "stall_ns": it.stall_ns,
        "swapped_out_bytes": it.swapped_out_bytes,
        "swapped_in_bytes": it.swapped_in_bytes,
        "defrag_bytes": it.defrag_bytes,
        "defrag_ns": it.defrag_ns,
        "released_bytes": it.released_bytes,
        "evictions": it.evictions,
        "rematerializations": it.rematerializations,
        "segment_releases": it.segment_releases,
        "planned": it.planned,
        "divergences": it.divergences,
        "arena_bytes": it.arena_bytes,
        "rescued": it.rescued,
        "planning": it.planning.map(|p| p.name()),
        "start_diff": it.start_diff.as_ref().map(|d| serde_json::json!({
            "recorded_storages": d.recorded_storages,
            "recorded_bytes": d.recorded_bytes,
            "recorded_tensors": d.recorded_tensors,
            "boundary_storages": d.boundary_storages,
            "boundary_bytes": d.boundary_bytes,
            "boundary_tensors": d.boundary_tensors,
            "made_storages": d.made_storages,
            "made_bytes": d.made_bytes,
            "carried": d.not_carried.is_none(),
            "not_carried": d.not_carried.map(|w| w.reason()),
        })),
        "no_plan": it.no_plan.as_ref().map(|n| serde_json::json!({
            "bound_overhead": n.bound_ns / n.compute_ns.max(1.0),
            "budget": n.budget,
            "simulations": n.simulations,
            "impossible": n.impossible,
            "too_costly": n.too_costly,
            "over_budget": n.over_budget,
            "cheapest_unplaced_overhead": n.cheapest_unplaced.map(|(ns, _)| ns / n.compute_ns.max(1.0)),
            "cheapest_unplaced_arena_bytes": n.cheapest_unplaced.map(|(_, a)| a),
            "cheapest_over_bound_overhead": n.cheapest_over_bound_ns.map(|ns| ns / n.compute_ns.max(1.0)),
            "message": n.to_string(),
        })),
        "next_plan": it.next_plan.as_ref().map(|p| serde_json::json!({
            "policy": p.policy,
            "overhead": p.overhead,
            "arena_bytes": p.arena_bytes,
            "simulated_budget": p.simulated_budget,
            "plan_ms": p.plan_ms,
            "simulations": p.simulations,
            "restart_rounds": p.restart_rounds,
            "ops": p.ops,
        })),
    })
}

/// Run `remat replay`.
pub fn run(args: ReplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.sweep {
        return run_sweep_cmd(&args);
    }
    let name = args.trace.clone().ok_or("a trace name is required")?;
    let trace = load(&name)?;
    let base = remat_trace::baseline(&trace)?;
    let policy: PolicyKind = args.policy.parse()?;
    let mode: BudgetMode = args.budget_mode.parse()?;
    let oracle = match oracles(&args)?.as_slice() {
        [] => None,
        [one] => Some(*one),
        _ => {
            return Err("--oracle takes one oracle for a single run (several with --sweep)".into())
        }
    };
    let budget = args
        .budget
        .unwrap_or_else(|| (base.peak_bytes as f64 * args.ratio).floor() as u64);
    let opts = ReplayOptions {
        config: base_config(&args)?
            .with_budget(budget)
            .with_budget_mode(mode)
            .with_policy(policy),
        thrash_limit: thrash_limit(args.thrash_limit)?,
        timeline_every: args
            .timeline
            .as_ref()
            .map(|_| (trace.instructions.len() / 2000).max(1)),
        oracle,
        iterations: args.iterations as usize,
    };
    let mut r = replay(&trace, &opts, base.compute_ns)?;
    if args.budget.is_none() {
        r.ratio = Some(args.ratio);
    }
    if let Some(path) = &args.timeline {
        std::fs::write(path, timeline_chart(&r)?)?;
    }
    if args.json {
        println!("{}", report_json(&r));
    } else {
        println!(
            "{} · {} · {} budget {} B ({}): {} — overhead {:.4}, {} evictions, {} rematerializations, \
             peak live {} B, peak reserved {} B ({:.3} of budget), decision median {} ns",
            r.trace,
            r.policy,
            r.budget_mode.name(),
            budget,
            r.ratio.map_or("bytes".to_string(), |x| format!("ratio {x}")),
            r.status.name(),
            r.overhead,
            r.evictions,
            r.rematerializations,
            r.peak_live_bytes,
            r.peak_reserved_bytes,
            r.reserved_over_budget,
            r.decision_ns_median
        );
        if let Some(conf) = r.allocator_conf.as_deref().filter(|c| !c.is_empty()) {
            println!("  allocator: {conf}");
        }
        if let Some(bw) = r.swap_bandwidth_gbps {
            println!(
                "  swap at {bw} GB/s: {} B out, {} B in, peak host {} B, stalls {:.4} of the baseline",
                r.swapped_out_bytes,
                r.swapped_in_bytes,
                r.peak_host_bytes,
                r.stall_ns as f64 / r.baseline_compute_ns.max(1) as f64
            );
        }
        if r.defrag_bytes > 0 {
            let priced = match r.move_bandwidth_gbps {
                Some(bw) => format!(
                    "at {bw} GB/s: {:.4} of the baseline",
                    r.defrag_ns as f64 / r.baseline_compute_ns.max(1) as f64
                ),
                None => "not charged".to_string(),
            };
            println!("  defragmentation moved {} B ({priced})", r.defrag_bytes);
        }
        if r.segment_releases > 0 {
            println!(
                "  {} eviction decisions emptied several whole segments for one request: the \
                 caching allocator's layout chose those victims (docs/dtr-results.md, \
                 *The caching allocator's segments*)",
                r.segment_releases
            );
        }
        if let Some(e) = &r.error {
            println!("  {e}");
        }
        if r.iterations.len() > 1 {
            for it in &r.iterations {
                println!(
                    "  iteration {}: {} — overhead {:.4}, {} evictions, {} rematerializations{}{}",
                    it.index,
                    it.status.name(),
                    it.overhead,
                    it.evictions,
                    it.rematerializations,
                    if it.planned {
                        format!(
                            ", planned (arena {} B, {} divergences)",
                            it.arena_bytes.unwrap_or(0),
                            it.divergences
                        )
                    } else if it.rescued {
                        ", online (rescued)".to_string()
                    } else {
                        ", online".to_string()
                    },
                    match (&it.next_plan, it.planning) {
                        (Some(p), _) => format!(
                            "; next: plan {} (simulated {:.4}, {:.0} ms, {} simulations, {} restart rounds)",
                            p.policy, p.overhead, p.plan_ms, p.simulations, p.restart_rounds
                        ),
                        (None, Some(remat_dtr::PlanStatus::Planning)) => {
                            "; next: online, planning this one in the background".to_string()
                        }
                        (None, Some(remat_dtr::PlanStatus::NoPlan)) => match &it.no_plan {
                            Some(why) => format!("; next: online, {why}"),
                            None => "; next: online, no plan".to_string(),
                        },
                        (None, _) => String::new(),
                    },
                );
            }
        }
    }
    Ok(())
}

fn run_sweep_cmd(args: &ReplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.thrash_limit.is_some() {
        return Err("--thrash-limit applies to a single run; the sweep stops at 2".into());
    }
    let names: Vec<String> = if args.traces.is_empty() {
        trace_files().iter().map(|p| Trace::name_of(p)).collect()
    } else {
        args.traces.clone()
    };
    if names.is_empty() {
        return Err("no traces found (set REMAT_TRACES_DIR)".into());
    }
    let traces = names
        .iter()
        .map(|n| load(n))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = SweepSpec {
        ratios: args.ratios.clone(),
        policies: if args.policies.is_empty() {
            PolicyKind::ALL.to_vec()
        } else {
            args.policies
                .iter()
                .map(|p| p.parse())
                .collect::<Result<_, _>>()?
        },
        modes: if args.modes.is_empty() {
            vec![BudgetMode::Physical, BudgetMode::Logical]
        } else {
            args.modes
                .iter()
                .map(|m| m.parse())
                .collect::<Result<_, _>>()?
        },
        oracles: oracles(args)?,
        base: base_config(args)?,
        threads: args.threads,
        iterations: args.iterations as usize,
    };
    let started = std::time::Instant::now();
    let reports = run_sweep(&traces, &spec, |done, total, r| {
        let width = 30;
        let filled = done * width / total.max(1);
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r[{}{}] {done}/{total} {:.0}s  {} {} {} {:<5} {:<8}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            started.elapsed().as_secs_f64(),
            r.trace,
            r.budget_mode.name(),
            r.policy,
            r.ratio.unwrap_or(0.0),
            r.status.name()
        );
        let _ = err.flush();
    })?;
    eprintln!();
    std::fs::create_dir_all(&args.out)?;
    let table = overhead_table(&reports);
    let frag = fragmentation_table(&reports);
    println!("{table}");
    std::fs::write(
        args.out.join("sweep.md"),
        format!("## Overhead\n\n{table}\n## Fragmentation (physical)\n\n{frag}"),
    )?;
    let mut jsonl = String::new();
    for r in &reports {
        jsonl += &report_json(r).to_string();
        jsonl.push('\n');
    }
    std::fs::write(args.out.join("sweep.jsonl"), jsonl)?;
    for t in &traces {
        for m in &spec.modes {
            let svg = overhead_chart(&reports, &t.name, *m)?;
            std::fs::write(args.out.join(format!("{}-{}.svg", t.name, m.name())), svg)?;
        }
    }
    // One memory timeline: the first trace, remat's default, ratio 0.4 if swept.
    let t = &traces[0];
    let b = remat_trace::baseline(t)?;
    let ratio = if spec.ratios.contains(&0.4) {
        0.4
    } else {
        spec.ratios[0]
    };
    let opts = ReplayOptions {
        config: spec
            .base
            .clone()
            .with_budget((b.peak_bytes as f64 * ratio).floor() as u64)
            .with_budget_mode(spec.modes[0])
            .with_policy(spec.policies[0]),
        thrash_limit: 2.0,
        timeline_every: Some((t.instructions.len() / 2000).max(1)),
        oracle: None,
        iterations: 1,
    };
    let mut r = replay(t, &opts, b.compute_ns)?;
    r.ratio = Some(ratio);
    std::fs::write(args.out.join("timeline.svg"), timeline_chart(&r)?)?;
    eprintln!(
        "wrote {}/sweep.md, sweep.jsonl, <trace>-<mode>.svg, timeline.svg in {:.1}s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
