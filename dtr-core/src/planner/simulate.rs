//! One simulation of a recorded iteration: the recording driven through a
//! value-free `Runtime<()>` under one portfolio entry's policy and one
//! placement, its allocations logged with their lifetimes, cut off at
//! [`Limits`]. The planner ([`super`]) ranks and places what these return.

use std::sync::{Arc, Mutex};

use ahash::AHashMap;
use remat_alloc::plan::Request as PlanRequest;

use super::{prefetch, Entry, Placement};
use crate::config::{BudgetMode, DtrConfig};
use crate::error::{Error, OpError, Result};
use crate::ids::TensorId;
use crate::memory::arena::{arena_size, ArenaMemory, ARENA_ALIGN};
use crate::memory::{
    AllocFailure, BlockView, LogicalBudget, MemoryModel, MemoryUsage, RequestShape, Slot,
};
use crate::op::{OpHandle, OutputSpec};
use crate::plan::PlanStep;
use crate::policy::oracle::{self, Future};
use crate::policy::{make_policy, EvictionPolicy, ScorePolicy};
use crate::record::{Event, Recording, Ref};
use crate::runtime::Runtime;

/// What one simulation produced.
pub(super) struct Simulation {
    pub(super) total_ns: f64,
    /// Peak bytes allocated in the simulation's memory model.
    pub(super) peak: u64,
    /// Where the simulation's own memory model put each allocation (0 without
    /// addresses).
    pub(super) offsets: Vec<u64>,
    pub(super) steps: Vec<PlanStep>,
    pub(super) requests: Vec<PlanRequest>,
    /// The slot key of each request, and the frees and swap-ins timed (to
    /// re-time the swap-ins once placed: [`prefetch`]).
    pub(super) keys: Vec<u64>,
    pub(super) times: prefetch::SimTimes,
}

/// Allocations of a simulation, with lifetimes in allocation/free steps.
#[derive(Default)]
struct AllocLog {
    step: usize,
    open: AHashMap<u64, usize>,
    requests: Vec<PlanRequest>,
    offsets: Vec<u64>,
    /// The slot key of each allocation (what the runtime's timing names).
    keys: Vec<u64>,
}

/// A memory model that logs every allocation's lifetime and offset.
struct LoggedMemory {
    inner: Box<dyn MemoryModel>,
    log: Arc<Mutex<AllocLog>>,
}

impl LoggedMemory {
    fn log(&self) -> std::sync::MutexGuard<'_, AllocLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MemoryModel for LoggedMemory {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn allocate(&mut self, bytes: u64) -> std::result::Result<Slot, AllocFailure> {
        let slot = self.inner.allocate(bytes)?;
        let mut log = self.log();
        let i = log.requests.len();
        let step = log.step;
        log.requests
            .push(PlanRequest::new(arena_size(bytes), step, usize::MAX));
        log.offsets.push(slot.ptr);
        log.keys.push(slot.key);
        log.open.insert(slot.key, i);
        log.step += 1;
        Ok(slot)
    }
    fn free(&mut self, slot: Slot) -> std::result::Result<(), String> {
        let key = slot.key;
        self.inner.free(slot)?;
        let mut log = self.log();
        if let Some(i) = log.open.remove(&key) {
            log.requests[i].end = log.step;
            log.step += 1;
        }
        Ok(())
    }
    fn adjacent_free(&self, slot: &Slot) -> (u64, u64) {
        self.inner.adjacent_free(slot)
    }
    fn has_addresses(&self) -> bool {
        self.inner.has_addresses()
    }
    fn blocks(&self, out: &mut Vec<BlockView>) {
        self.inner.blocks(out)
    }
    fn check_blocks(&self) -> std::result::Result<(), String> {
        self.inner.check_blocks()
    }
    fn usage(&self) -> MemoryUsage {
        self.inner.usage()
    }
    fn capacity(&self) -> Option<u64> {
        self.inner.capacity()
    }
    fn shape(&self, bytes: u64) -> RequestShape {
        self.inner.shape(bytes)
    }
    fn free_bytes(&self) -> u64 {
        self.inner.free_bytes()
    }
    // A moving simulation's arena compacts; each block keeps its key, and
    // its logged offset stays where it was placed.
    fn can_compact(&self) -> bool {
        self.inner.can_compact()
    }
    fn compact(
        &mut self,
        movable: &dyn Fn(u64) -> bool,
        need: Option<u64>,
    ) -> Option<Vec<(u64, u64)>> {
        self.inner.compact(movable, need)
    }
    fn compaction_bytes(&mut self, movable: &dyn Fn(u64) -> bool, need: u64) -> Option<u64> {
        self.inner.compaction_bytes(movable, need)
    }
}

/// A value-free op with `fresh` outputs.
struct SimOp {
    fresh: usize,
    recomputable: bool,
}

impl OpHandle<()> for SimOp {
    fn name(&self) -> &str {
        "planned-op"
    }
    fn compute(&self, _inputs: &[&()]) -> std::result::Result<Vec<()>, OpError> {
        Ok(vec![(); self.fresh])
    }
    fn recomputable(&self) -> bool {
        self.recomputable
    }
}

/// Why a simulation did not run to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Infeasible {
    /// An allocation no eviction could place.
    Impossible,
    /// Cut off: it could no longer cost less than its limits.
    TooCostly,
    /// Another error of the runtime (traced).
    Failed,
}

/// Replay `rec` under a logical budget of `budget` with the entry's policy,
/// with the work it took (see `Planner::work`). `Err`: infeasible, and why (an
/// impossible budget, or past `limit_ns`).
/// `swap_outs`: with swap on, victims may be swapped (else recomputed
/// only); `hidden`: each swap then chosen by the stall it leaves once
/// prefetched (`Runtime::price_swaps_by_future`), not by its round trip.
#[allow(clippy::too_many_arguments)] // one simulation's inputs, each read once
pub(super) fn simulate(
    rec: &Recording,
    config: &DtrConfig,
    entry: Entry,
    how: Placement,
    capacity: u64,
    limits: Limits,
    future: &Arc<Future>,
    swap_outs: bool,
    hidden: bool,
) -> Result<(std::result::Result<Simulation, Infeasible>, u64)> {
    let (budget, mode) = match how {
        Placement::Arena(b) | Placement::Moving(b) => (b.min(capacity), BudgetMode::Physical),
        Placement::Logical(b) | Placement::Compacting(b) => (b, BudgetMode::Logical),
    };
    let (kind, sampling) = match entry {
        Entry::Online(kind, sampling) => (kind, sampling),
        Entry::PerturbedScore(kind, _, _) => (kind, false),
        Entry::Configured => (config.policy, config.sampling),
        Entry::Learned(..) | Entry::Perturbed(..) => (config.policy, false),
    };
    let sim_config = config
        .clone()
        .with_budget(budget)
        .with_budget_mode(mode)
        .with_policy(kind)
        .with_sampling(sampling)
        .with_threshold(None)
        .with_plan_ahead(false);
    let policy: Box<dyn EvictionPolicy> = match entry {
        Entry::Learned(k, e) => Box::new(oracle::learned(k, future.clone(), e)),
        Entry::Perturbed(k, e, seed) => {
            Box::new(oracle::learned_perturbed(k, future.clone(), e, seed))
        }
        Entry::Online(k, _) => make_policy(k, &sim_config),
        Entry::PerturbedScore(_, score, seed) => Box::new(ScorePolicy::perturbed(score, seed)),
        Entry::Configured => make_policy(config.policy, &sim_config),
    };
    let log = Arc::new(Mutex::new(AllocLog::default()));
    let inner: Box<dyn MemoryModel> = match how {
        Placement::Arena(_) | Placement::Moving(_) => Box::new(ArenaMemory::new(budget, 0)),
        Placement::Logical(b) => Box::new(LogicalBudget::new(Some(b))),
        Placement::Compacting(b) => Box::new(LogicalBudget::aligned(Some(b), ARENA_ALIGN)),
    };
    let memory = LoggedMemory {
        inner,
        log: log.clone(),
    };
    let swap = sim_config.swap.enabled;
    let mut rt: Runtime<()> = Runtime::with_parts(sim_config, Box::new(memory), policy);
    if matches!(how, Placement::Moving(_)) {
        rt.allow_moves();
    }
    if swap {
        // The plan may swap as the runtime would (a plan's copies are priced
        // and timed by the same model).
        rt.set_host_transfer(Box::new(crate::swap::NoValues))?;
        if !swap_outs {
            rt.forbid_swap_outs();
        } else if hidden {
            rt.price_swaps_by_future(future.clone());
        }
    }
    let mut events = 0;
    let ran = run(&mut rt, rec, limits, &mut events);
    let work = rt.decision_work() + events;
    match ran {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Ok((Err(why), work)),
        Err(Error::ImpossibleBudget(_)) => return Ok((Err(Infeasible::Impossible), work)),
        Err(Error::ComputeLimit { .. }) => return Ok((Err(Infeasible::TooCostly), work)),
        Err(e) => {
            tracing::debug!(target: "remat_dtr::plan", error = %e, "a simulation failed");
            return Ok((Err(Infeasible::Failed), work));
        }
    }
    let total_ns = rt.stats().wall_ns();
    let peak = rt.memory_usage().peak_allocated;
    let steps = rt.take_plan_log();
    let times = rt.take_sim_times();
    drop(rt);
    let mut log = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
    let end = log.step + 1;
    for r in &mut log.requests {
        if r.end == usize::MAX {
            r.end = end;
        }
    }
    let sim = Simulation {
        total_ns,
        steps,
        requests: log.requests,
        offsets: log.offsets,
        keys: log.keys,
        times,
        peak,
    };
    Ok((Ok(sim), work))
}

/// Where a simulation is cut off: once what it has cost plus the first
/// computations still ahead passes `total_ns`, or passes `stall_free_ns`
/// without its stalls on host-tier copies (which prefetching may remove).
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) total_ns: f64,
    pub(super) stall_free_ns: f64,
}

impl Limits {
    /// Cut off by the total alone.
    pub(super) fn total(total_ns: f64) -> Self {
        Self {
            total_ns,
            stall_free_ns: f64::INFINITY,
        }
    }
}

/// Drive `rt` through the boundary state and the recorded events.
/// `events` counts the recorded events driven (for the planning work).
/// `Ok(Err(Impossible))`: the boundary's resident storages do not all fit
/// the simulated budget at once.
fn run(
    rt: &mut Runtime<()>,
    rec: &Recording,
    limits: Limits,
    events: &mut u64,
) -> Result<std::result::Result<(), Infeasible>> {
    let limit_ns = limits.total_ns;
    let view: Arc<dyn OpHandle<()>> = Arc::new(SimOp {
        fresh: 0,
        recomputable: true,
    });
    // One put per resident storage; its first tensor takes the put's handle,
    // further tensors on it are views.
    let mut on_storage = Vec::with_capacity(rec.start.storages.len());
    let resident = rec.start.resident().len();
    for (k, &bytes) in rec.start.storages.iter().enumerate() {
        let t = if k < resident {
            rt.put((), bytes)?
        } else {
            // In the host tier at the boundary: no place until it is read.
            rt.put_swapped(bytes)?
        };
        on_storage.push((t, false));
    }
    // The runtime adopts a plan by placing every resident storage of its
    // start at once: a simulation whose budget made one put evict or swap
    // out an earlier one starts from a state the runtime never holds (its
    // offsets would overlap), so it cannot be a plan.
    let displaced = rt.stats().evictions + rt.stats().swap_outs;
    if displaced > 0 {
        return Ok(Err(Infeasible::Impossible));
    }
    let mut prefix: Vec<Option<TensorId>> = Vec::with_capacity(rec.start.tensors.len());
    for &(pos, refs) in &rec.start.tensors {
        let Some((base, taken)) = pos.and_then(|k| on_storage.get_mut(k as usize)) else {
            prefix.push(None);
            continue;
        };
        let t = if *taken {
            let base = *base;
            rt.apply(view.clone(), &[base], &[OutputSpec::view(0)], 0)?[0]
        } else {
            *taken = true;
            *base
        };
        for _ in 1..refs {
            rt.retain(t)?;
        }
        prefix.push(Some(t));
    }
    let boundary: Vec<TensorId> = on_storage.iter().map(|&(t, _)| t).collect();
    rt.set_prefix_tensors(&boundary)?;
    rt.restart_numbering(true);
    rt.set_compute_limit(Some(limit_ns * (1.0 + 1e-9)));
    let mut news: Vec<TensorId> = Vec::new();
    let mut ops: AHashMap<(usize, bool), Arc<dyn OpHandle<()>>> = AHashMap::new();
    let mut op = |fresh: usize, recomputable: bool| {
        ops.entry((fresh, recomputable))
            .or_insert_with(|| {
                Arc::new(SimOp {
                    fresh,
                    recomputable,
                })
            })
            .clone()
    };
    let missing = || Error::Internal("the recording names a tensor it never made".into());
    // First computations still ahead: a run whose cost so far plus these passes
    // the limit cannot win, so it stops at once instead of at the limit.
    let mut ahead = rec.compute_ns() as f64;
    for ev in &rec.events {
        *events += 1;
        ahead -= ev.cost_ns() as f64;
        let spent = rt.stats().wall_ns();
        let stall_free = spent - rt.stats().stall_ns;
        if spent + ahead.max(0.0) > limit_ns * (1.0 + 1e-9)
            || stall_free + ahead.max(0.0) > limits.stall_free_ns * (1.0 + 1e-9)
        {
            return Err(Error::ComputeLimit {
                limit_ns,
                spent_ns: spent,
            });
        }
        let get = |r: &Ref| -> Result<TensorId> {
            match *r {
                Ref::Prefix(k) => prefix.get(k as usize).copied().flatten(),
                Ref::New(n) => news.get(n as usize).copied(),
            }
            .ok_or_else(missing)
        };
        // A handle on a boundary tensor whose storage was evicted at the
        // boundary: the simulation holds no tensor for it (it owns no memory),
        // so dropping, taking or evicting it changes nothing. Reading it would
        // have failed the recorded step (a stale value).
        let absent =
            |r: &Ref| matches!(*r, Ref::Prefix(k) if matches!(prefix.get(k as usize), Some(None)));
        match ev {
            Event::Release(r) | Event::Retain(r) | Event::Evict(r) if absent(r) => {}
            Event::Put { bytes } => news.push(rt.put((), *bytes)?),
            Event::Apply {
                inputs,
                outputs,
                recomputable,
                cost_ns,
                ..
            } => {
                let ins = inputs.iter().map(get).collect::<Result<Vec<_>>>()?;
                let fresh = outputs
                    .iter()
                    .filter(|o| matches!(o, OutputSpec::Fresh { .. }))
                    .count();
                let outs = rt.apply(op(fresh, *recomputable), &ins, outputs, *cost_ns)?;
                news.extend(outs);
            }
            Event::Mutate {
                inputs,
                mutated,
                recomputable,
                cost_ns,
                ..
            } => {
                let ins = inputs.iter().map(get).collect::<Result<Vec<_>>>()?;
                let mut targets = Vec::new();
                for &k in mutated {
                    let s = rt.storage_of(*ins.get(k).ok_or_else(missing)?)?;
                    if !targets.contains(&s) {
                        targets.push(s);
                    }
                }
                rt.mutate(op(targets.len(), *recomputable), &ins, mutated, *cost_ns)?;
            }
            Event::Access(r) => {
                rt.access(get(r)?)?;
            }
            Event::Pin(r) => rt.pin(get(r)?)?,
            Event::Unpin(r) => rt.unpin(get(r)?)?,
            Event::Retain(r) => rt.retain(get(r)?)?,
            Event::Release(r) => rt.release(get(r)?)?,
            Event::Evict(r) => {
                rt.evict(get(r)?)?;
            }
            Event::MakeRoot(r) => {
                rt.make_root(get(r)?)?;
            }
            Event::MakeRoots(rs) => {
                let ts = rs.iter().map(get).collect::<Result<Vec<_>>>()?;
                rt.make_roots(&ts)?;
            }
        }
    }
    Ok(Ok(()))
}
