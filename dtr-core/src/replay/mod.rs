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

/// The budget curve of one step: overheads from the peak down to the floor.
pub mod advise;
/// Sweeps over traces, ratios, policies and budget modes.
pub mod sweep;

pub use crate::policy::oracle;

use std::sync::Arc;
use std::time::Instant;

use ahash::{AHashMap, AHashSet};
use remat_trace::{Instruction, Trace};

pub use crate::config::FIRST_ITERATION_LIMIT;
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
    /// Stop when total compute exceeds this multiple of the baseline: a
    /// single-iteration replay, and each iteration of several that starts on
    /// a plan (one that starts without one runs online and is stopped at
    /// [`FIRST_ITERATION_LIMIT`]).
    pub thrash_limit: f64,
    /// Record a memory timeline (one point per `timeline_every` instructions).
    pub timeline_every: Option<usize>,
    /// Analysis only: replace the config's policy with an [`OracleKind`] that
    /// reads the rest of the trace (see [`oracle`]).
    pub oracle: Option<OracleKind>,
    /// Replay the trace as this many training iterations (at least 1; see
    /// [`replay`]).
    pub iterations: usize,
}

impl ReplayOptions {
    /// Unbounded replay with default settings.
    pub fn unbounded() -> Self {
        Self {
            config: DtrConfig::default(),
            thrash_limit: 2.0,
            timeline_every: None,
            oracle: None,
            iterations: 1,
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
            iterations: 1,
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
    /// Compute including rematerializations and stalls on host-tier copies
    /// (up to the stop for oom/thrash).
    pub total_compute_ns: u64,
    /// Compute stalled on host-tier copies (ns; 0 with swap off).
    pub stall_ns: u64,
    /// Bytes swapped out to the host tier.
    pub swapped_out_bytes: u64,
    /// Bytes swapped back in.
    pub swapped_in_bytes: u64,
    /// Peak bytes in the host tier.
    pub peak_host_bytes: u64,
    /// The swap bandwidth per direction (GB/s), `None` with swap off.
    pub swap_bandwidth_gbps: Option<f64>,
    /// Bytes moved by defragmentation, all iterations.
    pub defrag_bytes: u64,
    /// What those moves cost (ns; part of `total_compute_ns`).
    pub defrag_ns: u64,
    /// The device bandwidth (GB/s) that priced them, `None` when free.
    pub move_bandwidth_gbps: Option<f64>,
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
    /// Of those, the ones that emptied several whole segments together for
    /// one request ([`crate::RuntimeStats::segment_releases`]).
    pub segment_releases: u64,
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
    /// One row per iteration run (one row without `--iterations`).
    pub iterations: Vec<IterationRow>,
    /// The last iteration's overhead, `None` when it failed.
    pub steady_overhead: Option<f64>,
}

/// One training iteration of a replay with [`ReplayOptions::iterations`].
#[derive(Debug, Clone, PartialEq)]
pub struct IterationRow {
    /// 0 for the first.
    pub index: usize,
    /// How it ended.
    pub status: ReplayStatus,
    /// Its compute (first computations plus rematerializations plus stalls
    /// on host-tier copies) over the trace's baseline.
    pub overhead: f64,
    /// Its stalls on host-tier copies (ns).
    pub stall_ns: u64,
    /// Bytes it swapped out.
    pub swapped_out_bytes: u64,
    /// Bytes it swapped in.
    pub swapped_in_bytes: u64,
    /// Bytes it moved inside a defragmenting arena (the online rescues'
    /// layout; [`crate::RuntimeStats::defrag_bytes`]).
    pub defrag_bytes: u64,
    /// What those moves cost in the time model (ns; part of `overhead`; 0
    /// where [`crate::DtrConfig::move_bandwidth`] is unset).
    pub defrag_ns: u64,
    /// Its evictions.
    pub evictions: u64,
    /// Its rematerializations.
    pub rematerializations: u64,
    /// Its eviction decisions that emptied several whole segments together
    /// for one request ([`crate::RuntimeStats::segment_releases`]).
    pub segment_releases: u64,
    /// It started under a plan.
    pub planned: bool,
    /// Times it left its plan.
    pub divergences: u32,
    /// Bytes of its plan's arena (`None`: it ran online).
    pub arena_bytes: Option<u64>,
    /// The runtime rescued it online (see
    /// [`crate::stats::RuntimeStats::rescued_since`]).
    pub rescued: bool,
    /// The plan made at its end for the next iteration, if any.
    pub next_plan: Option<crate::stats::PlanSummary>,
    /// What planning did at its end (`None`: the last iteration of a run, or
    /// one that failed).
    pub planning: Option<crate::stats::PlanStatus>,
    /// How the state at its end differs from its start, when it does (see
    /// [`crate::stats::StartDiff`]).
    pub start_diff: Option<crate::stats::StartDiff>,
    /// Why no plan was made at its end, when none was (see
    /// [`crate::stats::NoPlan`]).
    pub no_plan: Option<crate::stats::NoPlan>,
    /// Cached free bytes the caching allocator gave back at its end
    /// ([`crate::DtrConfig::release_at_boundary`]).
    pub released_bytes: u64,
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
    /// Options that do not go together.
    #[error("options: {0}")]
    Options(String),
    /// A name the trace uses is not bound.
    #[error("instruction {at}: unknown name {name:?}")]
    UnknownName {
        /// Instruction index.
        at: usize,
        /// The name.
        name: String,
    },
}

/// An impossible budget that names the op being placed: the trace's name
/// for it (the replayer's ops are anonymous).
fn name_the_op(e: Error, op: &str) -> Error {
    match e {
        Error::ImpossibleBudget(mut r) => {
            if let Some(w) = r.op.as_mut() {
                w.name = op.to_string();
            }
            Error::ImpossibleBudget(r)
        }
        e => e,
    }
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
    if opts.iterations == 0 {
        return Err(ReplayError::Options("iterations must be at least 1".into()));
    }
    let Some(kind) = opts.oracle else {
        return replay_sequence(&vec![(trace, baseline_ns); opts.iterations], opts);
    };
    if opts.iterations > 1 {
        return Err(ReplayError::Options(format!(
            "--oracle reads one trace's future and replays one iteration; got --iterations {}",
            opts.iterations
        )));
    }
    // Analysis: first learn what the trace reads and when, without a budget.
    let mut recorder = Tracker::recorder();
    let unbounded = ReplayOptions::unbounded();
    drive(
        &[(trace, baseline_ns)],
        &unbounded,
        &mut Runtime::new(unbounded.config.clone())?,
        Some(&mut recorder),
        false,
    )?;
    let (policy, mut tracker) = oracle::policy(kind, recorder.into_future());
    let memory = crate::runtime::memory_model(&opts.config)?;
    let mut rt = Runtime::with_parts(opts.config.clone(), memory, Box::new(policy));
    drive(
        &[(trace, baseline_ns)],
        opts,
        &mut rt,
        Some(&mut tracker),
        false,
    )
}

/// Replay a training run whose iterations need not repeat: iteration `k` runs
/// `iterations[k].0`, whose Σ TIME `iterations[k].1` is that iteration's
/// overhead denominator. [`replay`] of K iterations is this with one trace K
/// times. A trace that changes from one iteration to the next (a dynamic
/// model, a different batch shape, an op dropped) is what the plan's
/// signature check exists for: the changed iteration leaves its plan at the
/// first op that differs, runs online from there, and is recorded, so the
/// iteration after it is planned from what really ran.
///
/// As in [`replay`], constants persist by name and every other name is fresh
/// in each iteration, and an iteration that starts without a plan (the first,
/// one after a boundary that planned nothing) is stopped at
/// [`FIRST_ITERATION_LIMIT`]; one that starts on a plan at
/// [`ReplayOptions::thrash_limit`], even if it changed and left its plan.
/// The report's `trace` and `baseline_compute_ns` are the first trace's;
/// each row's overhead is over its own iteration's baseline.
/// `opts.iterations` must equal `iterations.len()` (an error otherwise, rather
/// than one of them silently ignored), and an oracle, which reads one trace's
/// future, is refused.
pub fn replay_sequence(
    iterations: &[(&Trace, u64)],
    opts: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    if iterations.is_empty() {
        return Err(ReplayError::Options(
            "a sequence of iterations needs at least one trace".into(),
        ));
    }
    if opts.iterations != iterations.len() {
        return Err(ReplayError::Options(format!(
            "the options ask for {} iterations but the sequence has {} traces",
            opts.iterations,
            iterations.len()
        )));
    }
    if opts.oracle.is_some() {
        return Err(ReplayError::Options(
            "an oracle reads one trace's future and replays one iteration, not a sequence".into(),
        ));
    }
    // One iteration has nothing to plan: skip the recorder.
    let config = opts.config.clone();
    let config = if opts.iterations == 1 {
        config.with_plan_ahead(false)
    } else {
        config
    };
    let training = opts.iterations > 1;
    drive(iterations, opts, &mut Runtime::new(config)?, None, training)
}

/// The replayer's state across the instructions of one run: the runtime, the
/// trace names bound to its tensors, and the op handles by fresh-output count.
struct Driver<'t, 'k> {
    rt: &'k mut Runtime<()>,
    /// Numbers storages, records reads and follows the position for an
    /// oracle policy.
    tracker: Option<&'k mut Tracker>,
    names: AHashMap<&'t str, TensorId>,
    /// Names bound by `CONSTANT` and not rebound since: they persist across
    /// iterations.
    constants: AHashSet<&'t str>,
    ops: Vec<Arc<dyn OpHandle<()>>>,
    /// A training replay (several iterations, or the first step of one
    /// alone): rebinding a name releases its old tensor, and the outputs are
    /// read by name.
    several: bool,
}

/// The tensor a trace name is bound to (instruction `at` names it).
fn get(names: &AHashMap<&str, TensorId>, at: usize, n: &str) -> Result<TensorId, ReplayError> {
    names
        .get(n)
        .copied()
        .ok_or_else(|| ReplayError::UnknownName {
            at,
            name: n.to_string(),
        })
}

impl<'t> Driver<'t, '_> {
    /// Run instruction `i` of `ins` of iteration `iteration` (a `CALL` with the
    /// `MEMORY` and `ALIAS` lines that follow it). Returns the index of the
    /// last instruction it consumed and the runtime's answer; a malformed
    /// trace is the outer error.
    fn instruction(
        &mut self,
        ins: &'t [Instruction],
        mut i: usize,
        iteration: usize,
    ) -> Result<(usize, Result<(), Error>), ReplayError> {
        let step: Result<(), Error> = match &ins[i] {
            Instruction::Constant { name } => {
                let bytes = match ins.get(i + 1) {
                    Some(Instruction::Memory { name: n, bytes }) if n == name => *bytes,
                    _ => 0,
                };
                i += 1;
                if iteration > 0 && self.names.contains_key(name.as_str()) {
                    // A persisting constant (a parameter): already resident.
                    Ok(())
                } else {
                    self.rt.put((), bytes).map(|t| {
                        if let Some(tr) = self.tracker.as_deref_mut() {
                            tr.created(self.rt, t);
                        }
                        self.constants.insert(name.as_str());
                        self.names.insert(name.as_str(), t);
                    })
                }
            }
            Instruction::Call {
                op,
                args,
                results,
                time_ns,
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
                    .map(|a| get(&self.names, i, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let fresh = specs
                    .iter()
                    .filter(|s| matches!(s, OutputSpec::Fresh { .. }))
                    .count();
                while self.ops.len() <= fresh {
                    self.ops.push(Arc::new(TraceOp(self.ops.len())));
                }
                if let Some(tr) = self.tracker.as_deref_mut() {
                    tr.read(self.rt, &inputs);
                }
                self.rt
                    .apply(self.ops[fresh].clone(), &inputs, &specs, *time_ns)
                    .map_err(|e| name_the_op(e, op))
                    .and_then(|outs| {
                        for ((r, t), spec) in results.iter().zip(outs).zip(&specs) {
                            if let (Some(tr), OutputSpec::Fresh { .. }) =
                                (self.tracker.as_deref_mut(), spec)
                            {
                                tr.created(self.rt, t);
                            }
                            // A result that rebinds a name drops the old tensor.
                            if let Some(old) = self.names.insert(r.as_str(), t) {
                                if self.several {
                                    self.constants.remove(r.as_str());
                                    self.rt.release(old)?;
                                }
                            }
                        }
                        Ok(())
                    })
            }
            Instruction::Mutate {
                name: op,
                args,
                mutate,
                time_ns,
            } => {
                let inputs = args
                    .iter()
                    .map(|a| get(&self.names, i, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut storages: Vec<_> = Vec::new();
                for &k in mutate {
                    let s = self.rt.storage_of(inputs[k])?;
                    if !storages.contains(&s) {
                        storages.push(s);
                    }
                }
                while self.ops.len() <= storages.len() {
                    self.ops.push(Arc::new(TraceOp(self.ops.len())));
                }
                if let Some(tr) = self.tracker.as_deref_mut() {
                    tr.read(self.rt, &inputs);
                }
                self.rt
                    .mutate(self.ops[storages.len()].clone(), &inputs, mutate, *time_ns)
                    .map_err(|e| name_the_op(e, op))
                    .map(|()| {
                        // One new version per distinct mutated storage, in order.
                        if let Some(tr) = self.tracker.as_deref_mut() {
                            let mut seen = Vec::new();
                            for &k in mutate {
                                if let Ok(s) = self.rt.storage_of(inputs[k]) {
                                    if !seen.contains(&s) {
                                        seen.push(s);
                                        tr.created(self.rt, inputs[k]);
                                    }
                                }
                            }
                        }
                    })
            }
            Instruction::Copy { dst, src } => {
                let t = get(&self.names, i, src)?;
                self.rt
                    .retain(t)
                    .and_then(|()| match self.names.insert(dst.as_str(), t) {
                        Some(old) if self.several => {
                            self.constants.remove(dst.as_str());
                            self.rt.release(old)
                        }
                        _ => Ok(()),
                    })
            }
            Instruction::CopyFrom { dst, src } => {
                let t = get(&self.names, i, src)?;
                let old = get(&self.names, i, dst)?;
                self.rt.retain(t).and_then(|()| {
                    self.names.insert(dst.as_str(), t);
                    self.rt.release(old)
                })
            }
            Instruction::Release { name } => match self.names.remove(name.as_str()) {
                Some(t) => {
                    self.constants.remove(name.as_str());
                    self.rt.release(t)
                }
                None => Ok(()),
            },
            Instruction::Annotate(a) => {
                if let (Some(tr), remat_trace::Annotation::Backward) =
                    (self.tracker.as_deref_mut(), a)
                {
                    tr.backward();
                }
                Ok(())
            }
            Instruction::Memory { .. } | Instruction::Alias { .. } => Ok(()),
        };
        Ok((i, step))
    }

    /// Read every tensor still named at the end of a trace (the outputs), in
    /// a fixed order, until the compute `limit` (ns) is passed. Returns
    /// whether it was.
    fn outputs(&mut self, at: usize, limit: f64, bounded: bool) -> Result<bool, Error> {
        // Several iterations read them by name (tensor ids differ between
        // iterations, names do not); one iteration by tensor id, as the
        // published single-iteration figures were measured.
        let mut named: Vec<(&str, TensorId)> = self.names.iter().map(|(n, t)| (*n, *t)).collect();
        if self.several {
            named.sort_unstable_by_key(|(n, _)| *n);
        } else {
            named.sort_unstable_by_key(|(_, t)| *t);
        }
        let live: Vec<TensorId> = named.into_iter().map(|(_, t)| t).collect();
        if let Some(tr) = self.tracker.as_deref_mut() {
            tr.at(at, self.rt.stats().compute_ns);
            tr.read(self.rt, &live);
        }
        for t in live {
            self.rt.access(t)?;
            if self.rt.stats().wall_ns() > limit && bounded {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// End an iteration: release the names it bound (constants persist) and
    /// call [`Runtime::end_iteration`].
    fn end_iteration(&mut self) -> Result<crate::stats::IterationReport, Error> {
        let mut dead: Vec<(&str, TensorId)> = (self.names.iter())
            .filter(|(n, _)| !self.constants.contains(*n))
            .map(|(n, t)| (*n, *t))
            .collect();
        dead.sort_unstable_by_key(|(n, _)| *n);
        for (n, t) in dead {
            self.names.remove(n);
            self.rt.release(t)?;
        }
        self.rt.end_iteration()
    }
}

/// The replay loop over runtime `rt`: iteration `k` runs `seq[k]`'s trace, its
/// Σ TIME the overhead denominator (`seq` has [`ReplayOptions::iterations`]
/// entries). `tracker` numbers storages, records reads and follows the
/// position for an oracle policy. `training` (K > 1, or the first step of
/// such a replay alone, [`first_step`]) selects the rules below.
///
/// With [`ReplayOptions::iterations`] = K > 1 (`training`) the traces run one
/// after another on one runtime: constants persist (a `CONSTANT` whose name is
/// still bound is not put again), every other name is released at the end of
/// an iteration, and
/// [`Runtime::end_iteration`] separates the iterations. An iteration that starts
/// without a plan (the first, and any after a boundary that planned nothing)
/// runs online and stops as thrash only past [`FIRST_ITERATION_LIMIT`] ×
/// baseline; one that starts on a plan at [`ReplayOptions::thrash_limit`].
fn drive(
    seq: &[(&Trace, u64)],
    opts: &ReplayOptions,
    rt: &mut Runtime<()>,
    tracker: Option<&mut Tracker>,
    training: bool,
) -> Result<ReplayReport, ReplayError> {
    debug_assert_eq!(seq.len(), opts.iterations, "one trace per iteration");
    let started = Instant::now();
    let mut d = Driver {
        rt,
        tracker,
        names: AHashMap::new(),
        constants: AHashSet::new(),
        ops: Vec::new(),
        several: training,
    };
    d.rt.record_decision_times(true);
    // Replays are deterministic: a background plan is taken at the first
    // boundary after it was started, however long it takes.
    d.rt.wait_for_background_plans(true);
    // The trace format has no values: swapping moves nothing, and the time
    // model and the accounting run as they would with values.
    if opts.config.swap.enabled && !d.rt.swap_enabled() {
        d.rt.set_host_transfer(Box::new(crate::swap::NoValues))?;
    }
    let bounded = opts.config.budget.is_some();
    let mut timeline = Vec::new();
    let mut status = ReplayStatus::Ok;
    let mut error = None;
    let mut rows = Vec::new();
    for (iteration, &(trace, baseline_ns)) in seq.iter().enumerate() {
        let ins = &trace.instructions;
        // An iteration of several that starts without a plan runs online, as
        // the first does, and is judged like it; one that starts on a plan is
        // held to the thrash limit (it knows its future), or to what its plan
        // costs at most where that is more: a plan that swaps may cost more
        // than 2× and still beat the online step it replaced (it was adopted
        // only below that step's measured cost), and its prefetches are
        // estimated, bounded by its copies at their reads.
        let factor = if training && !d.rt.following_plan() {
            FIRST_ITERATION_LIMIT.max(opts.thrash_limit)
        } else {
            let promised = (d.rt.current_plan()).map_or(0.0, |p| p.bound_overhead() * (1.0 + 1e-9));
            opts.thrash_limit.max(promised)
        };
        let at_start = d.rt.stats().clone();
        let mut limit = at_start.wall_ns() + factor * baseline_ns as f64;
        if bounded || opts.config.threshold.is_some() {
            d.rt.set_compute_limit(Some(limit));
        }
        // A planned iteration that leaves its plan goes on online, and is
        // judged like one from there.
        let mut judged_online = !d.rt.following_plan();
        let mut i = 0;
        let outcome: Result<(), Error> = loop {
            if i >= ins.len() {
                break Ok(());
            }
            if let Some(tr) = d.tracker.as_deref_mut() {
                tr.at(i, d.rt.stats().compute_ns);
            }
            let (last, step) = d.instruction(ins, i, iteration)?;
            i = last;
            if let Err(e) = step {
                break Err(e);
            }
            if let Some(every) = opts.timeline_every {
                if i % every.max(1) == 0 {
                    timeline.push(TimelinePoint {
                        at: i,
                        clock_ns: d.rt.clock(),
                        live_bytes: d.rt.stats().live_bytes,
                        reserved_bytes: d.rt.memory_usage().reserved,
                    });
                }
            }
            if training && !judged_online && d.rt.stats().divergences > at_start.divergences {
                judged_online = true;
                limit = at_start.wall_ns()
                    + FIRST_ITERATION_LIMIT.max(opts.thrash_limit) * baseline_ns as f64;
                if bounded || opts.config.threshold.is_some() {
                    d.rt.set_compute_limit(Some(limit));
                }
            }
            if d.rt.stats().wall_ns() > limit && bounded {
                status = ReplayStatus::Thrash;
                break Ok(());
            }
            i += 1;
        };
        let outcome = outcome.and_then(|()| {
            // The outputs: everything still named must be materializable at the end.
            if status == ReplayStatus::Ok && d.outputs(ins.len(), limit, bounded)? {
                status = ReplayStatus::Thrash;
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
        let s = d.rt.stats();
        let spent = s.wall_ns() - at_start.wall_ns();
        let mut row = IterationRow {
            index: iteration,
            status,
            overhead: if baseline_ns == 0 {
                1.0
            } else {
                spent / baseline_ns as f64
            },
            stall_ns: (s.stall_ns - at_start.stall_ns).round() as u64,
            swapped_out_bytes: s.swapped_out_bytes - at_start.swapped_out_bytes,
            swapped_in_bytes: s.swapped_in_bytes - at_start.swapped_in_bytes,
            defrag_bytes: s.defrag_bytes - at_start.defrag_bytes,
            defrag_ns: (s.defrag_ns - at_start.defrag_ns).round() as u64,
            evictions: s.evictions - at_start.evictions,
            rematerializations: s.rematerializations - at_start.rematerializations,
            segment_releases: s.segment_releases - at_start.segment_releases,
            planned: d.rt.current_plan().is_some(),
            divergences: (s.divergences - at_start.divergences) as u32,
            arena_bytes: d.rt.current_plan().map(|p| p.arena_bytes),
            rescued: s.rescued_since(&at_start),
            next_plan: None,
            planning: None,
            start_diff: None,
            no_plan: None,
            released_bytes: 0,
        };
        if status != ReplayStatus::Ok || opts.iterations == 1 {
            rows.push(row);
            break;
        }
        // The iteration's names die with it; constants persist.
        let report = d.end_iteration()?;
        row.next_plan = report.next_plan;
        row.planning = Some(report.planning);
        row.start_diff = report.start_diff;
        row.no_plan = report.no_plan;
        row.released_bytes = report.released_bytes;
        rows.push(row);
    }
    let stats = d.rt.stats().clone();
    let usage = d.rt.memory_usage();
    let mut decisions = d.rt.decision_ns().to_vec();
    let budget = opts.config.budget;
    let (trace, baseline_ns) = seq[0];
    let last = rows.last().cloned();
    let overhead = if training {
        last.as_ref().map_or(1.0, |r| r.overhead)
    } else if baseline_ns == 0 {
        1.0
    } else {
        stats.wall_ns() / baseline_ns as f64
    };
    let steady_overhead = last
        .as_ref()
        .filter(|r| r.status == ReplayStatus::Ok)
        .map(|r| r.overhead);
    Ok(ReplayReport {
        trace: trace.name.clone(),
        policy: d.rt.policy_name().to_string(),
        ratio: None,
        budget_mode: opts.config.budget_mode,
        budget_bytes: budget,
        status,
        overhead,
        baseline_compute_ns: baseline_ns,
        total_compute_ns: stats.wall_ns().round() as u64,
        stall_ns: stats.stall_ns.round() as u64,
        swapped_out_bytes: stats.swapped_out_bytes,
        swapped_in_bytes: stats.swapped_in_bytes,
        peak_host_bytes: stats.peak_host_bytes,
        swap_bandwidth_gbps: d
            .rt
            .swap_enabled()
            .then_some(opts.config.swap.bandwidth_gbps)
            .flatten(),
        defrag_bytes: stats.defrag_bytes,
        defrag_ns: stats.defrag_ns.round() as u64,
        move_bandwidth_gbps: opts.config.move_bandwidth,
        peak_live_bytes: stats.peak_live_bytes,
        peak_reserved_bytes: usage.peak_reserved,
        evictions: stats.evictions,
        rematerializations: stats.rematerializations,
        decisions: stats.decisions,
        segment_releases: stats.segment_releases,
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
        iterations: rows,
        steady_overhead,
    })
}

/// The smallest budget (bytes, in `config`'s budget mode) under which `trace`,
/// as a training step, replays at a cost of at most `max_overhead` times its
/// compute: [`Runtime::min_feasible_budget`] of the trace recorded once
/// without a budget (the first step at the answer runs online within
/// [`FIRST_ITERATION_LIMIT`], the steps after it follow a plan within
/// `max_overhead`). `config`'s budget is ignored; its mode, policy and
/// planner settings are used. `Ok(None)`: no budget replays it (a trace whose
/// ops cannot be placed at all).
///
/// Errors: `max_overhead` not a finite number ≥ 1
/// ([`Error::InvalidArgument`] inside [`ReplayError::Runtime`]), a trace that
/// does not replay ([`ReplayError::UnknownName`]).
pub fn min_feasible_budget(
    trace: &Trace,
    config: &DtrConfig,
    max_overhead: f64,
) -> Result<Option<u64>, ReplayError> {
    let mut config = config.clone();
    config.budget = None;
    let baseline_ns = remat_trace::baseline(trace)?.compute_ns;
    let mut rt = Runtime::new(config.clone())?;
    rt.record_iterations();
    let opts = ReplayOptions {
        config,
        ..ReplayOptions::unbounded()
    };
    if !(max_overhead.is_finite() && max_overhead >= 1.0) {
        return Err(Error::InvalidArgument {
            name: "max_overhead",
            value: max_overhead.to_string(),
            expected: "a finite number ≥ 1.0",
        }
        .into());
    }
    drive(&[(trace, baseline_ns)], &opts, &mut rt, None, false)?;
    rt.end_iteration()?;
    let rec = rt
        .last_recording()
        .cloned()
        .ok_or_else(|| Error::Internal("the trace's replay was not recorded".into()))?;
    Ok(crate::planner::min_feasible_budget(
        &Arc::new(rec),
        &opts.config,
        max_overhead,
    )?)
}

/// The first step of a training replay ([`ReplayOptions::iterations`] > 1)
/// alone, under `config` (its budget, plan-ahead as configured): it runs
/// online, is stopped past [`FIRST_ITERATION_LIMIT`] × its compute, and no
/// plan is made after it. Its status says whether a training run at this
/// budget gets past its first step: cheaper than the run (no planning), for
/// searches over budgets.
pub fn first_step(
    trace: &Trace,
    config: &DtrConfig,
    baseline_ns: u64,
) -> Result<ReplayReport, ReplayError> {
    let opts = ReplayOptions {
        config: config.clone(),
        thrash_limit: FIRST_ITERATION_LIMIT.max(2.0),
        ..ReplayOptions::unbounded()
    };
    let mut rt = Runtime::new(config.clone())?;
    drive(&[(trace, baseline_ns)], &opts, &mut rt, None, true)
}

/// Replay `trace` at `ratio` × its unbounded peak (`remat_trace::baseline`).
pub fn replay_ratio(
    trace: &Trace,
    ratio: f64,
    mode: BudgetMode,
    policy: PolicyKind,
    base: &DtrConfig,
) -> Result<ReplayReport, ReplayError> {
    replay_ratio_iterations(trace, ratio, mode, policy, base, 1)
}

/// [`replay_ratio`] as `iterations` training iterations (see
/// [`ReplayOptions::iterations`]).
pub fn replay_ratio_iterations(
    trace: &Trace,
    ratio: f64,
    mode: BudgetMode,
    policy: PolicyKind,
    base: &DtrConfig,
    iterations: usize,
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
        iterations,
    };
    let mut r = replay(trace, &opts, b.compute_ns)?;
    r.ratio = Some(ratio);
    Ok(r)
}
