//! Sweeps over traces × budget modes × policies × ratios, with a table (Markdown)
//! and SVG charts (overhead vs ratio per policy; a memory timeline of one run).

use remat_trace::Trace;

use super::{replay, ReplayError, ReplayOptions, ReplayReport, ReplayStatus};
use crate::config::{BudgetMode, DtrConfig, PolicyKind};
use crate::policy::oracle::OracleKind;

/// What to sweep.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// Budget ratios (fractions of the unbounded peak).
    pub ratios: Vec<f64>,
    /// Policies.
    pub policies: Vec<PolicyKind>,
    /// Analysis only: oracles run beside the policies (see [`crate::policy::oracle`]).
    pub oracles: Vec<OracleKind>,
    /// Budget modes.
    pub modes: Vec<BudgetMode>,
    /// Settings shared by every run (sampling, filter, seed, …).
    pub base: DtrConfig,
    /// Worker threads (runs are independent).
    pub threads: usize,
    /// Training iterations per run (see [`ReplayOptions::iterations`]); oracles
    /// always run one.
    pub iterations: usize,
}

impl Default for SweepSpec {
    fn default() -> Self {
        Self {
            ratios: vec![1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2],
            policies: PolicyKind::ALL.to_vec(),
            oracles: Vec::new(),
            modes: vec![BudgetMode::Physical, BudgetMode::Logical],
            base: DtrConfig::default(),
            threads: 1,
            iterations: 1,
        }
    }
}

/// Run every combination; `progress(done, total, last)` is called after each run.
pub fn run_sweep(
    traces: &[Trace],
    spec: &SweepSpec,
    mut progress: impl FnMut(usize, usize, &ReplayReport) + Send,
) -> Result<Vec<ReplayReport>, ReplayError> {
    let mut jobs = Vec::new();
    for (ti, t) in traces.iter().enumerate() {
        let b = remat_trace::baseline(t)?;
        let contenders: Vec<(PolicyKind, Option<OracleKind>)> = spec
            .policies
            .iter()
            .map(|&p| (p, None))
            .chain(
                spec.oracles
                    .iter()
                    .map(|&o| (PolicyKind::default(), Some(o))),
            )
            .collect();
        for &mode in &spec.modes {
            for &(policy, oracle) in &contenders {
                for &ratio in &spec.ratios {
                    jobs.push((ti, b, mode, policy, oracle, ratio));
                }
            }
        }
    }
    let total = jobs.len();
    let threads = spec.threads.max(1).min(total.max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; total]);
    let progress = std::sync::Mutex::new((&mut progress, 0usize));
    let run_one = |k: usize| -> Result<(), ReplayError> {
        let (ti, b, mode, policy, oracle, ratio) = jobs[k];
        let budget = (b.peak_bytes as f64 * ratio).floor() as u64;
        let opts = ReplayOptions {
            config: spec
                .base
                .clone()
                .with_budget(budget)
                .with_budget_mode(mode)
                .with_policy(policy),
            thrash_limit: 2.0,
            timeline_every: None,
            oracle,
            iterations: if oracle.is_some() { 1 } else { spec.iterations },
        };
        let mut r = replay(&traces[ti], &opts, b.compute_ns)?;
        r.ratio = Some(ratio);
        {
            let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
            p.1 += 1;
            let done = p.1;
            (p.0)(done, total, &r);
        }
        results.lock().unwrap_or_else(|e| e.into_inner())[k] = Some(r);
        Ok(())
    };
    std::thread::scope(|s| -> Result<(), ReplayError> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), ReplayError> {
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= total {
                            return Ok(());
                        }
                        run_one(k)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        }
        Ok(())
    })?;
    Ok(results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect())
}

fn cell(r: &ReplayReport) -> String {
    match r.status {
        ReplayStatus::Ok => format!("{:.3}", r.overhead),
        s => s.name().to_string(),
    }
}

fn unique<T: PartialEq + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// A Markdown table: one row per (trace, mode, policy), one column per ratio,
/// cells = overhead (or `oom` / `thrash`).
pub fn overhead_table(reports: &[ReplayReport]) -> String {
    let ratios = unique(reports.iter().filter_map(|r| r.ratio.map(f64::to_bits)));
    let mut out = String::from("| trace | mode | policy |");
    for r in &ratios {
        out += &format!(" {} |", f64::from_bits(*r));
    }
    out += "\n|---|---|---|";
    for _ in &ratios {
        out += "---|";
    }
    out.push('\n');
    let rows = unique(
        reports
            .iter()
            .map(|r| (r.trace.clone(), r.budget_mode, r.policy.clone())),
    );
    for (t, m, p) in rows {
        out += &format!("| {t} | {m} | {p} |");
        for ratio in &ratios {
            let c = reports
                .iter()
                .find(|r| {
                    r.trace == t
                        && r.budget_mode == m
                        && r.policy == p
                        && r.ratio.map(f64::to_bits) == Some(*ratio)
                })
                .map_or_else(|| "–".to_string(), cell);
            out += &format!(" {c} |");
        }
        out.push('\n');
    }
    out
}

/// A Markdown table of fragmentation figures for physical runs: peak reserved /
/// budget and Coop's mean free bytes at evicting allocations / budget.
pub fn fragmentation_table(reports: &[ReplayReport]) -> String {
    let mut out = String::from(
        "| trace | policy | ratio | status | overhead | reserved peak / budget | mean free at eviction / budget | of which small pool / large pool / unreserved | evictions | decision median ns |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports
        .iter()
        .filter(|r| r.budget_mode == BudgetMode::Physical)
    {
        let [small, large, unreserved] = r.mean_free_at_eviction_by_pool;
        out += &format!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {small:.3} / {large:.3} / {unreserved:.3} | {} | {} |\n",
            r.trace,
            r.policy,
            r.ratio.unwrap_or(0.0),
            r.status.name(),
            r.overhead,
            r.reserved_over_budget,
            r.mean_free_at_eviction,
            r.evictions,
            r.decision_ns_median
        );
    }
    out
}

const PALETTE: [&str; 9] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// SVG: overhead vs ratio, one line per policy, for one trace and mode. Runs that
/// ended `oom`/`thrash` are drawn at the top edge (2.0) with a cross.
pub fn overhead_chart(reports: &[ReplayReport], trace: &str, mode: BudgetMode) -> String {
    let rs: Vec<&ReplayReport> = reports
        .iter()
        .filter(|r| r.trace == trace && r.budget_mode == mode && r.ratio.is_some())
        .collect();
    let (w, h, ml, mr, mt, mb) = (720.0, 420.0, 60.0, 150.0, 30.0, 45.0);
    let (x0, x1) = (0.1f64, 1.0f64);
    let (y0, y1) = (1.0f64, 2.0f64);
    let px = |x: f64| ml + (x - x0) / (x1 - x0) * (w - ml - mr);
    let py = |y: f64| mt + (1.0 - (y.clamp(y0, y1) - y0) / (y1 - y0)) * (h - mt - mb);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">{} — overhead vs budget ratio ({} budget)</text>\n",
        (w - mr + ml) / 2.0,
        esc(trace),
        mode.name()
    );
    for k in 0..=10 {
        let y = y0 + (y1 - y0) * k as f64 / 10.0;
        s += &format!(
            "<line x1=\"{ml}\" x2=\"{xr}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#eee\"/><text x=\"{xl}\" y=\"{yt}\" text-anchor=\"end\">{y:.1}</text>\n",
            xr = w - mr,
            yy = py(y),
            xl = ml - 6.0,
            yt = py(y) + 4.0
        );
    }
    for k in 1..=10 {
        let x = k as f64 / 10.0;
        s += &format!(
            "<line x1=\"{xx}\" x2=\"{xx}\" y1=\"{mt}\" y2=\"{yb}\" stroke=\"#eee\"/><text x=\"{xx}\" y=\"{yt}\" text-anchor=\"middle\">{x:.1}</text>\n",
            xx = px(x),
            yb = h - mb,
            yt = h - mb + 16.0
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">budget / unbounded peak</text>\n<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">overhead</text>\n",
        (w - mr + ml) / 2.0,
        h - 8.0,
        h / 2.0,
        h / 2.0
    );
    let policies = unique(rs.iter().map(|r| r.policy.clone()));
    for (i, p) in policies.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mut pts: Vec<(f64, f64, bool)> = rs
            .iter()
            .filter(|r| &r.policy == p)
            .map(|r| {
                let ok = r.status == ReplayStatus::Ok;
                (
                    r.ratio.unwrap_or(0.0),
                    if ok { r.overhead } else { 2.0 },
                    ok,
                )
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .filter(|p| p.2)
            .map(|(x, y, _)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let width = if p == "remat" { 3 } else { 1 };
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" points=\"{}\"/>\n",
            path.join(" ")
        );
        for (x, y, ok) in &pts {
            if *ok {
                s += &format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n",
                    px(*x),
                    py(*y)
                );
            } else {
                s += &format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\" text-anchor=\"middle\">×</text>\n",
                    px(*x),
                    py(*y) + 4.0
                );
            }
        }
        let ly = mt + 16.0 * i as f64 + 10.0;
        s += &format!(
            "<line x1=\"{a}\" x2=\"{b}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"{width}\"/><text x=\"{c}\" y=\"{d}\">{e}</text>\n",
            a = w - mr + 10.0,
            b = w - mr + 30.0,
            c = w - mr + 36.0,
            d = ly + 4.0,
            e = esc(p)
        );
    }
    s += "</svg>\n";
    s
}

/// SVG: live and reserved bytes over the compute clock for one run (needs a report
/// made with `timeline_every`).
pub fn timeline_chart(r: &ReplayReport) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 320.0, 70.0, 20.0, 30.0, 40.0);
    let tmax = r.timeline.last().map_or(1.0, |p| p.clock_ns.max(1.0));
    let ymax = r
        .timeline
        .iter()
        .map(|p| p.reserved_bytes.max(p.live_bytes))
        .max()
        .unwrap_or(1)
        .max(r.budget_bytes.unwrap_or(0))
        .max(1) as f64;
    let px = |x: f64| ml + x / tmax * (w - ml - mr);
    let py = |y: f64| mt + (1.0 - y / ymax) * (h - mt - mb);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">{} — {} at ratio {} ({}): memory over compute time</text>\n",
        w / 2.0,
        esc(&r.trace),
        esc(&r.policy),
        r.ratio.unwrap_or(0.0),
        r.budget_mode.name()
    );
    for (field, color, label) in [(0, "#1f77b4", "live"), (1, "#ff7f0e", "reserved")] {
        let pts: Vec<String> = r
            .timeline
            .iter()
            .map(|p| {
                let y = if field == 0 {
                    p.live_bytes
                } else {
                    p.reserved_bytes
                };
                format!("{:.1},{:.1}", px(p.clock_ns), py(y as f64))
            })
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1\" points=\"{}\"/>\n<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>\n",
            pts.join(" "),
            ml + 10.0 + 80.0 * field as f64,
            mt + 14.0
        );
    }
    if let Some(b) = r.budget_bytes {
        s += &format!(
            "<line x1=\"{ml}\" x2=\"{xr}\" y1=\"{yb}\" y2=\"{yb}\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\"{xr}\" y=\"{yt}\" fill=\"#d62728\" text-anchor=\"end\">budget</text>\n",
            xr = w - mr,
            yb = py(b as f64),
            yt = py(b as f64) - 4.0
        );
    }
    for k in 0..=4 {
        let y = ymax * k as f64 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0} MB</text>\n",
            ml - 6.0,
            py(y) + 4.0,
            y / 1e6
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">compute clock (ms), 0 – {:.1}</text>\n</svg>\n",
        w / 2.0,
        h - 10.0,
        tmax / 1e6
    );
    s
}
