//! Markdown tables of replay reports (`remat replay --sweep`'s `sweep.md`).

use remat_dtr::replay::{ReplayReport, ReplayStatus};
use remat_dtr::BudgetMode;

fn cell(r: &ReplayReport) -> String {
    match r.status {
        ReplayStatus::Ok => format!("{:.3}", r.overhead),
        s => s.name().to_string(),
    }
}

pub(crate) fn unique<T: PartialEq + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
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
