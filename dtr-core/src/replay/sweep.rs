//! Sweeps over traces × budget modes × policies × ratios, on worker threads.
//! The reports are data: the `remat` command line turns them into tables and
//! charts.

use remat_trace::Trace;

use super::{replay, ReplayError, ReplayOptions, ReplayReport};
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
