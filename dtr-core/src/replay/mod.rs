//! The trace replayer: drives a [`Runtime<()>`](crate::Runtime) with the DTR
//! paper's logged PyTorch training traces (read by `remat-trace`), op cost = `TIME`.
//!
//! | instruction | runtime call |
//! |---|---|
//! | `CONSTANT` + `MEMORY` | [`Runtime::put`] (external: never evicted) |
//! | `CALL` + `MEMORY`/`ALIAS` per result | [`Runtime::apply`] with fresh outputs (`ALIAS -1`) and views (`ALIAS k`) |
//! | `MUTATE` | [`Runtime::mutate`] (in place: the storage keeps its slot) |
//! | `COPY` | [`Runtime::retain`] under a new name |
//! | `COPY_FROM` | retain the source, release the old tensor |
//! | `RELEASE` | [`Runtime::release`] |
//! | end of trace | [`Runtime::access`] every tensor still named (the outputs) |
//!
//! With no budget it reproduces `remat_trace::baseline` (peak live bytes, compute
//! ns). With a budget, a run whose overhead exceeds the thrash limit (2.0) stops as
//! [`ReplayStatus::Thrash`]; an impossible budget is [`ReplayStatus::Oom`].

/// Sweeps over traces, ratios, policies and budget modes: tables and SVG charts.
pub mod sweep;

pub mod oracle;

use std::sync::Arc;
use std::time::Instant;

use ahash::AHashMap;
use remat_trace::{Instruction, Trace};

use crate::config::{BudgetMode, DtrConfig, PolicyKind};
use crate::error::{Error, OpError};
use crate::ids::TensorId;
use crate::op::{OpHandle, OutputSpec};
use crate::runtime::Runtime;
use oracle::{OracleKind, Tracker};

/// An op of a trace: values are `()`, so it only reports how many it makes.
#[derive(Debug)]
struct TraceOp(usize);

impl OpHandle<()> for TraceOp {
    fn name(&self) -> &str {
        "trace-op"
    }
    fn compute(&self, _inputs: &[&()]) -> Result<Vec<()>, OpError> {
        Ok(vec![(); self.0])
    }
}

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayStatus {
    /// The whole trace ran.
    Ok,
    /// No eviction could make room.
    Oom,
    /// Overhead passed the thrash limit.
    Thrash,
}

impl ReplayStatus {
    /// `ok`, `oom` or `thrash`.
    pub fn name(self) -> &'static str {
        match self {
            ReplayStatus::Ok => "ok",
            ReplayStatus::Oom => "oom",
            ReplayStatus::Thrash => "thrash",
        }
    }
}

/// What to replay under.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// Runtime config (budget, mode, policy, sampling, filter, seed).
    pub config: DtrConfig,
    /// Stop when total compute exceeds this multiple of the baseline.
    pub thrash_limit: f64,
    /// Record a memory timeline (one point per `timeline_every` instructions).
    pub timeline_every: Option<usize>,
    /// Analysis only: replace the config's policy with an [`OracleKind`] that
    /// reads the rest of the trace (see [`oracle`]).
    pub oracle: Option<OracleKind>,
}

impl ReplayOptions {
    /// Unbounded replay with default settings.
    pub fn unbounded() -> Self {
        Self {
            config: DtrConfig::default(),
            thrash_limit: 2.0,
            timeline_every: None,
            oracle: None,
        }
    }

    /// Budget `bytes` in `mode` with `policy`, other settings default.
    pub fn budget(bytes: u64, mode: BudgetMode, policy: PolicyKind) -> Self {
        Self {
            config: DtrConfig::default()
                .with_budget(bytes)
                .with_budget_mode(mode)
                .with_policy(policy),
            thrash_limit: 2.0,
            timeline_every: None,
            oracle: None,
        }
    }
}

/// One point of the memory timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimelinePoint {
    /// Instruction index.
    pub at: usize,
    /// Compute clock (ns).
    pub clock_ns: f64,
    /// Live storage bytes.
    pub live_bytes: u64,
    /// Bytes reserved by the memory model.
    pub reserved_bytes: u64,
}

/// The figures of one replay (the `--json` object of `remat replay`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// Trace name.
    pub trace: String,
    /// Policy name.
    pub policy: String,
    /// Budget over the unbounded peak, when the budget was given as a ratio.
    pub ratio: Option<f64>,
    /// `physical` or `logical`.
    pub budget_mode: BudgetMode,
    /// Budget in bytes (`None`: unbounded).
    pub budget_bytes: Option<u64>,
    /// How it ended.
    pub status: ReplayStatus,
    /// Total compute over baseline compute.
    pub overhead: f64,
    /// Σ TIME over CALL and MUTATE.
    pub baseline_compute_ns: u64,
    /// Compute including rematerializations (up to the stop for oom/thrash).
    pub total_compute_ns: u64,
    /// Peak of live storage bytes.
    pub peak_live_bytes: u64,
    /// Peak bytes reserved by the memory model (device segments when physical).
    pub peak_reserved_bytes: u64,
    /// Evictions.
    pub evictions: u64,
    /// Rematerializations (ops replayed).
    pub rematerializations: u64,
    /// Eviction decisions taken.
    pub decisions: u64,
    /// Median decision time in ns (0 with no decision).
    pub decision_ns_median: u64,
    /// Coop's metric: mean free bytes at allocations that needed eviction / budget.
    pub mean_free_at_eviction: f64,
    /// The same mean split by where the free bytes were: small pool, large pool,
    /// not reserved (physical budgets; zeros otherwise).
    pub mean_free_at_eviction_by_pool: [f64; 3],
    /// Peak reserved over budget.
    pub reserved_over_budget: f64,
    /// The allocator settings of a physical budget (`REMAT_ALLOC_CONF` syntax,
    /// only what differs from PyTorch's defaults; empty for the defaults); `None`
    /// for logical budgets.
    pub allocator_conf: Option<String>,
    /// Wall-clock time of the replay in ms.
    pub wall_ms: f64,
    /// The error that stopped an `oom` run.
    pub error: Option<String>,
    /// Memory timeline, when asked for.
    pub timeline: Vec<TimelinePoint>,
}

/// A replay failure that is not a budget outcome (a malformed trace, a bug).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace does not replay.
    #[error("trace: {0}")]
    Trace(#[from] remat_trace::TraceError),
    /// The runtime failed for a reason other than the budget.
    #[error("runtime: {0}")]
    Runtime(#[from] Error),
    /// A name the trace uses is not bound.
    #[error("instruction {at}: unknown name {name:?}")]
    UnknownName {
        /// Instruction index.
        at: usize,
        /// The name.
        name: String,
    },
}

fn median(v: &mut [u32]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable(mid);
    *m as u64
}

/// Replay `trace` under `opts`. `baseline_ns` is the trace's Σ TIME (from
/// `remat_trace::baseline`), the overhead denominator.
pub fn replay(
    trace: &Trace,
    opts: &ReplayOptions,
    baseline_ns: u64,
) -> Result<ReplayReport, ReplayError> {
    let Some(kind) = opts.oracle else {
        let rt = Runtime::new(opts.config.clone())?;
        return drive(trace, opts, baseline_ns, rt, None);
    };
    // Analysis: first learn what the trace reads and when, without a budget.
    let mut recorder = Tracker::recorder();
    let unbounded = ReplayOptions::unbounded();
    drive(
        trace,
        &unbounded,
        baseline_ns,
        Runtime::new(unbounded.config.clone())?,
        Some(&mut recorder),
    )?;
    let (policy, mut tracker) = oracle::policy(kind, recorder.into_future());
    let memory = crate::runtime::memory_model(&opts.config)?;
    let rt = Runtime::with_parts(opts.config.clone(), memory, Box::new(policy));
    drive(trace, opts, baseline_ns, rt, Some(&mut tracker))
}

/// The replay loop over runtime `rt`; `tracker` numbers storages, records reads
/// and follows the position for an oracle policy.
fn drive(
    trace: &Trace,
    opts: &ReplayOptions,
    baseline_ns: u64,
    mut rt: Runtime<()>,
    mut tracker: Option<&mut Tracker>,
) -> Result<ReplayReport, ReplayError> {
    let started = Instant::now();
    rt.record_decision_times(true);
    let limit = opts.thrash_limit * baseline_ns as f64;
    if opts.config.budget.is_some() || opts.config.threshold.is_some() {
        rt.set_compute_limit(Some(limit));
    }
    let mut names: AHashMap<&str, TensorId> = AHashMap::new();
    let mut ops: Vec<Arc<dyn OpHandle<()>>> = Vec::new();
    let mut timeline = Vec::new();
    let mut status = ReplayStatus::Ok;
    let mut error = None;
    let ins = &trace.instructions;
    let get = |names: &AHashMap<&str, TensorId>, at: usize, n: &str| {
        names
            .get(n)
            .copied()
            .ok_or_else(|| ReplayError::UnknownName {
                at,
                name: n.to_string(),
            })
    };
    let mut i = 0;
    let outcome: Result<(), Error> = loop {
        if i >= ins.len() {
            break Ok(());
        }
        if let Some(tr) = tracker.as_deref_mut() {
            tr.at(i, rt.stats().compute_ns);
        }
        let step: Result<(), Error> = match &ins[i] {
            Instruction::Constant { name } => {
                let bytes = match ins.get(i + 1) {
                    Some(Instruction::Memory { name: n, bytes }) if n == name => *bytes,
                    _ => 0,
                };
                i += 1;
                rt.put((), bytes).map(|t| {
                    if let Some(tr) = tracker.as_deref_mut() {
                        tr.created(&rt, t);
                    }
                    names.insert(name.as_str(), t);
                })
            }
            Instruction::Call {
                args,
                results,
                time_ns,
                ..
            } => {
                let mut specs = vec![OutputSpec::fresh(0); results.len()];
                let mut sizes = vec![0u64; results.len()];
                let mut j = i + 1;
                while j < ins.len() {
                    match &ins[j] {
                        Instruction::Memory { name, bytes } => {
                            if let Some(k) = results.iter().position(|r| r == name) {
                                sizes[k] = *bytes;
                            }
                        }
                        Instruction::Alias { name, alias } => {
                            if let Some(k) = results.iter().position(|r| r == name) {
                                specs[k] = if *alias < 0 {
                                    OutputSpec::fresh(sizes[k])
                                } else {
                                    OutputSpec::view(*alias as usize)
                                };
                            }
                        }
                        _ => break,
                    }
                    j += 1;
                }
                i = j - 1;
                let inputs = args
                    .iter()
                    .map(|a| get(&names, i, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let fresh = specs
                    .iter()
                    .filter(|s| matches!(s, OutputSpec::Fresh { .. }))
                    .count();
                while ops.len() <= fresh {
                    ops.push(Arc::new(TraceOp(ops.len())));
                }
                if let Some(tr) = tracker.as_deref_mut() {
                    tr.read(&rt, &inputs);
                }
                rt.apply(ops[fresh].clone(), &inputs, &specs, *time_ns)
                    .map(|outs| {
                        for ((r, t), spec) in results.iter().zip(outs).zip(&specs) {
                            if let (Some(tr), OutputSpec::Fresh { .. }) =
                                (tracker.as_deref_mut(), spec)
                            {
                                tr.created(&rt, t);
                            }
                            names.insert(r.as_str(), t);
                        }
                    })
            }
            Instruction::Mutate {
                args,
                mutate,
                time_ns,
                ..
            } => {
                let inputs = args
                    .iter()
                    .map(|a| get(&names, i, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut storages: Vec<_> = Vec::new();
                for &k in mutate {
                    let s = rt.storage_of(inputs[k])?;
                    if !storages.contains(&s) {
                        storages.push(s);
                    }
                }
                while ops.len() <= storages.len() {
                    ops.push(Arc::new(TraceOp(ops.len())));
                }
                if let Some(tr) = tracker.as_deref_mut() {
                    tr.read(&rt, &inputs);
                }
                rt.mutate(ops[storages.len()].clone(), &inputs, mutate, *time_ns)
                    .map(|()| {
                        // One new version per distinct mutated storage, in order.
                        if let Some(tr) = tracker.as_deref_mut() {
                            let mut seen = Vec::new();
                            for &k in mutate {
                                if let Ok(s) = rt.storage_of(inputs[k]) {
                                    if !seen.contains(&s) {
                                        seen.push(s);
                                        tr.created(&rt, inputs[k]);
                                    }
                                }
                            }
                        }
                    })
            }
            Instruction::Copy { dst, src } => {
                let t = get(&names, i, src)?;
                rt.retain(t).map(|()| {
                    names.insert(dst.as_str(), t);
                })
            }
            Instruction::CopyFrom { dst, src } => {
                let t = get(&names, i, src)?;
                let old = get(&names, i, dst)?;
                rt.retain(t).and_then(|()| {
                    names.insert(dst.as_str(), t);
                    rt.release(old)
                })
            }
            Instruction::Release { name } => match names.remove(name.as_str()) {
                Some(t) => rt.release(t),
                None => Ok(()),
            },
            Instruction::Annotate(a) => {
                if let (Some(tr), remat_trace::Annotation::Backward) = (tracker.as_deref_mut(), a) {
                    tr.backward();
                }
                Ok(())
            }
            Instruction::Memory { .. } | Instruction::Alias { .. } => Ok(()),
        };
        if let Err(e) = step {
            break Err(e);
        }
        if let Some(every) = opts.timeline_every {
            if i % every.max(1) == 0 {
                timeline.push(TimelinePoint {
                    at: i,
                    clock_ns: rt.clock(),
                    live_bytes: rt.stats().live_bytes,
                    reserved_bytes: rt.memory_usage().reserved,
                });
            }
        }
        if rt.stats().total_compute_ns() > limit && opts.config.budget.is_some() {
            status = ReplayStatus::Thrash;
            break Ok(());
        }
        i += 1;
    };
    let outcome = outcome.and_then(|()| {
        if status != ReplayStatus::Ok {
            return Ok(());
        }
        // The outputs: everything still named must be materializable at the end.
        let mut live: Vec<TensorId> = names.values().copied().collect();
        live.sort_unstable();
        if let Some(tr) = tracker {
            tr.at(ins.len(), rt.stats().compute_ns);
            tr.read(&rt, &live);
        }
        for t in live {
            rt.access(t)?;
            if rt.stats().total_compute_ns() > limit && opts.config.budget.is_some() {
                status = ReplayStatus::Thrash;
                break;
            }
        }
        Ok(())
    });
    match outcome {
        Ok(()) => {}
        Err(e @ Error::ImpossibleBudget(_)) => {
            status = ReplayStatus::Oom;
            error = Some(e.to_string());
        }
        Err(Error::ComputeLimit { .. }) => status = ReplayStatus::Thrash,
        Err(e) => return Err(e.into()),
    }
    let stats = rt.stats().clone();
    let usage = rt.memory_usage();
    let mut decisions = rt.decision_ns().to_vec();
    let budget = opts.config.budget;
    let total = stats.total_compute_ns();
    Ok(ReplayReport {
        trace: trace.name.clone(),
        policy: rt.policy_name().to_string(),
        ratio: None,
        budget_mode: opts.config.budget_mode,
        budget_bytes: budget,
        status,
        overhead: if baseline_ns == 0 {
            1.0
        } else {
            total / baseline_ns as f64
        },
        baseline_compute_ns: baseline_ns,
        total_compute_ns: total.round() as u64,
        peak_live_bytes: stats.peak_live_bytes,
        peak_reserved_bytes: usage.peak_reserved,
        evictions: stats.evictions,
        rematerializations: stats.rematerializations,
        decisions: stats.decisions,
        decision_ns_median: median(&mut decisions),
        mean_free_at_eviction: budget.map_or(0.0, |b| stats.mean_free_at_failure(b)),
        mean_free_at_eviction_by_pool: budget
            .map_or([0.0; 3], |b| stats.mean_free_at_failure_by_pool(b)),
        reserved_over_budget: budget.map_or(0.0, |b| usage.peak_reserved as f64 / b as f64),
        allocator_conf: (opts.config.budget_mode == BudgetMode::Physical && budget.is_some())
            .then(|| opts.config.physical_allocator().to_string()),
        wall_ms: started.elapsed().as_secs_f64() * 1e3,
        error,
        timeline,
    })
}

/// Replay `trace` at `ratio` × its unbounded peak (`remat_trace::baseline`).
pub fn replay_ratio(
    trace: &Trace,
    ratio: f64,
    mode: BudgetMode,
    policy: PolicyKind,
    base: &DtrConfig,
) -> Result<ReplayReport, ReplayError> {
    let b = remat_trace::baseline(trace)?;
    let budget = (b.peak_bytes as f64 * ratio).floor() as u64;
    let opts = ReplayOptions {
        config: base
            .clone()
            .with_budget(budget)
            .with_budget_mode(mode)
            .with_policy(policy),
        thrash_limit: 2.0,
        timeline_every: None,
        oracle: None,
    };
    let mut r = replay(trace, &opts, b.compute_ns)?;
    r.ratio = Some(ratio);
    Ok(r)
}
