//! Iterations: the runtime's side of plan-ahead DTR.
//!
//! - **Record.** Every public call is noted ([`Runtime::note`]) as an
//!   [`Event`] of the current [`Recording`], with the sequence numbers of the
//!   storages it reads.
//! - **Boundary.** [`Runtime::end_iteration`] freezes what the iteration left
//!   resident (never evicted again), makes what it left evicted stale (reading it
//!   is [`Error::StaleValue`]), and hands the recording to the planner
//!   ([`crate::planner`]) when the next iteration starts from the same state.
//! - **Execute.** A plan that beats the recorded iteration (or, after an
//!   iteration the runtime rescued, costs at most 2× its first computations:
//!   [`Runtime::plan_bound`]) is followed: at each
//!   allocation [`Runtime::planned_alloc`] evicts what the plan evicted there and
//!   places the allocation at its planned offset in one [`ArenaMemory`]. The
//!   first call that differs from the recorded program, or a plan step that cannot
//!   be taken, is a divergence: the rest of the iteration runs online.
//!
//! - **Rescue.** An online iteration under a physical budget whose allocator
//!   fragments (a failed allocation with a fifth of the budget free) or that is
//!   losing (replays past its computations) moves into a defragmenting arena at
//!   its next op ([`Runtime::rescue_from_fragmentation`], [`Runtime::defragment`]).
//!   A losing online iteration, in either budget mode, also finishes under the
//!   lineage-priced policy (MSPS) instead of the configured one
//!   ([`Runtime::rescue_from_thrashing`]); the boundary restores the configured
//!   policy. A regeneration that alone makes it lose keeps what it
//!   regenerates until it ends (`Runtime::keep_regenerated`, in `regen.rs`).
//! - **Fallback.** Under a physical budget, an allocation that no eviction can
//!   place while the working set fits the budget moves the runtime into the same
//!   arena, plan-ahead or not ([`Runtime::fall_back_to_arena`]): the budget, not
//!   PyTorch's segment sizes, is the floor.
//!
//! The online and planned paths share the same records: the recorder runs in
//! both, so an iteration that diverged is recorded as it really ran and planned
//! again at the next boundary.

use std::sync::Arc;

use ahash::AHashMap;

use super::Runtime;
use crate::config::PolicyKind;
use crate::error::{Error, Result};
use crate::graph::NONE;
use crate::ids::{StorageId, TensorId};
use crate::memory::arena::{arena_size, ArenaLayout, ArenaMemory};
use crate::memory::{MemoryModel, Slot};
use crate::plan::{Cursor, IterationPlan, PlanStep, StepKind};
use crate::policy::make_policy;
use crate::record::{Boundary, Call, Recording, Ref};
use crate::stats::{IterationReport, PlanStatus, RuntimeStats};

/// Events one recording may hold; a longer iteration is not recorded (and not
/// planned) rather than grow without bound when `end_iteration` is never called.
const MAX_EVENTS: usize = 1 << 23;

/// Share of the budget that, free but unusable at a failed allocation, marks the
/// layout as the problem. Failed allocations of a working set that simply does
/// not fit find little free (a few percent of the budget on the DTR traces);
/// a layout that fragmented under eviction leaves far more (over a third on
/// treelstm's small-pool requests).
const FRAGMENTED_SHARE: f64 = 0.2;

/// The most a plan made after a rescued iteration may cost, over its first
/// computations: the DTR paper's line between an overhead and a failure
/// (see [`Runtime::plan_bound`]).
const RESCUED_PLAN_LIMIT: f64 = 2.0;

/// Whether `report`, an iteration that ran online from start to end, did not
/// repeat the cost of the one before it, which ran online too (`last`: its
/// first computations and replays, ns): the same computations (the same
/// program), other replays.
fn unrepeated(last: Option<(f64, f64)>, report: &IterationReport) -> bool {
    !report.planned
        && last.is_some_and(|(compute, remat)| {
            compute == report.compute_ns && remat != report.remat_ns
        })
}

/// A plan being made on a background thread from `recording`.
pub(crate) struct PendingPlan {
    recording: Arc<Recording>,
    /// What the plan may cost (ns, [`Runtime::plan_bound`]).
    bound: f64,
    job: std::thread::JoinHandle<Result<Option<IterationPlan>>>,
}

/// The iteration counters and the recorder/executor state of a runtime.
#[derive(Default)]
pub(crate) struct IterationState {
    /// Iterations ended so far (the current iteration's number).
    pub epoch: u32,
    /// Storages created this iteration, by sequence number.
    pub seq_storages: Vec<StorageId>,
    /// Allocations placed this iteration.
    pub allocs: u32,
    /// Public calls made this iteration.
    pub pos: u32,
    /// Plan ahead at boundaries (budget set, no threshold, `plan_ahead` on).
    pub enabled: bool,
    /// The current iteration's recording (`None`: not recording).
    pub recording: Option<Recording>,
    /// Record every iteration, also without a budget
    /// ([`Runtime::record_iterations`]).
    pub record_always: bool,
    /// The last iteration recorded whole (no failed call), for
    /// [`Runtime::min_feasible_budget`].
    pub last_recording: Option<Arc<Recording>>,
    /// Names of the live tensors, while recording or following a plan.
    pub refs: RefTable,
    /// Tensors created this iteration.
    pub new_tensors: u32,
    /// A call failed this iteration: its recording is not a program to repeat.
    pub broken: bool,
    /// The plan of this iteration.
    pub plan: Option<Arc<IterationPlan>>,
    /// The arena layout of a plan (its allocations and their predecessors),
    /// made once per plan and shared by the arenas of the iterations that
    /// follow it.
    pub layout: Option<(Arc<IterationPlan>, Arc<ArenaLayout>)>,
    /// Still following `plan` (no divergence yet).
    pub following: bool,
    /// Calls of this iteration that matched the plan's recording and were
    /// therefore not recorded one by one: the plan's recording stands for them
    /// (copied into the recording at a divergence, see [`Runtime::diverge`]).
    pub matched: usize,
    pub cursor: Cursor,
    /// Simulations log their policy evictions and failed allocations here to
    /// become a plan.
    pub plan_log: Option<Vec<PlanStep>>,
    /// Counters at the iteration's start.
    pub start_stats: RuntimeStats,
    /// Divergences this iteration.
    pub divergences: u32,
    /// Peak allocated and reserved bytes of memory models replaced so far.
    pub retired_peaks: (u64, u64),
    /// A recording being planned on a background thread
    /// ([`crate::DtrConfig::plan_background`]).
    pub pending: Option<PendingPlan>,
    /// Boundaries wait for a pending plan of the same program
    /// ([`Runtime::wait_for_background_plans`]).
    pub wait_for_plans: bool,
    /// An allocation failed with a large share of the budget free but in
    /// pieces (see [`Runtime::note_fragmentation`]).
    pub fragmented: bool,
    /// The configured policy, set aside while a losing online iteration runs
    /// under the lineage-priced one ([`Runtime::rescue_from_thrashing`]);
    /// restored at the boundary.
    pub set_aside_policy: Option<Box<dyn crate::policy::EvictionPolicy>>,
    /// Order regeneration inputs by creation, not slab index (while following
    /// a plan, and in simulations that make one).
    pub stable_order: bool,
    /// First computations and replays (ns) of the last iteration, when it ran
    /// online from start to end (see [`Runtime::plan_bound`]).
    pub last_online: Option<(f64, f64)>,
}

/// Names of tensors by handle: a table indexed by the tensor's slab index
/// (a hash map's behaviour for the runtime's use: at most one generation of
/// an index is named at a time, since a tensor's name goes when the tensor
/// does), without hashing on the planned path.
#[derive(Debug, Default)]
pub(crate) struct RefTable {
    slots: Vec<Option<(u32, Ref)>>,
    len: usize,
}

impl RefTable {
    /// Name `t` (replacing the name of the same handle).
    pub fn insert(&mut self, t: TensorId, r: Ref) {
        let i = t.index as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        if self.slots[i].is_none() {
            self.len += 1;
        }
        self.slots[i] = Some((t.generation, r));
    }

    /// The name of `t`, if named (an older handle at the same index is not).
    pub fn get(&self, t: TensorId) -> Option<Ref> {
        match self.slots.get(t.index as usize) {
            Some(&Some((g, r))) if g == t.generation => Some(r),
            _ => None,
        }
    }

    /// Forget the name of `t` (and of nothing else).
    pub fn remove(&mut self, t: TensorId) {
        if let Some(slot) = self.slots.get_mut(t.index as usize) {
            if slot.is_some_and(|(g, _)| g == t.generation) {
                *slot = None;
                self.len -= 1;
            }
        }
    }

    /// Whether no tensor is named.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget every name.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
    }
}

impl IterationState {
    /// The sequence number of the next storage; [`NONE`] past [`MAX_EVENTS`]
    /// storages in one iteration (a run that never calls `end_iteration` must not
    /// grow this table without bound; such storages are never named by a plan).
    pub(super) fn next_seq(&self) -> u32 {
        let n = self.seq_storages.len();
        if n < MAX_EVENTS {
            n as u32
        } else {
            NONE
        }
    }
}

impl<V> Runtime<V> {
    pub(super) fn with_recording(mut self) -> Self {
        self.iter.enabled = self.config.plan_ahead
            && self.config.budget.is_some()
            && self.config.threshold.is_none();
        if self.iter.enabled {
            self.iter.recording = Some(Recording::default());
        }
        self
    }

    /// Record every iteration from the next boundary on (from now if nothing
    /// has run yet), also without a budget, so that
    /// [`Runtime::min_feasible_budget`] can answer for a run that measures a
    /// model unbudgeted. With a budget and plan-ahead on, iterations are
    /// recorded anyway.
    pub fn record_iterations(&mut self) {
        self.iter.record_always = true;
        if self.iter.recording.is_none() && self.iter.epoch == 0 && self.iter.pos == 0 {
            self.iter.recording = Some(Recording::default());
        }
    }

    /// The smallest budget (in this runtime's budget mode) under which the last
    /// recorded iteration replays at a cost of at most `max_overhead` times its
    /// first computations (1.0: no replay at all; the replayer's thrash limit is
    /// 2.0). Answered offline, by bisection over simulations of the recording
    /// with plan-ahead's portfolio of policies: a budget a plan can be made for,
    /// at which the first, online step with the configured policy also
    /// finishes (it may cost more: up to the replayer's first-iteration limit,
    /// [`crate::config::FIRST_ITERATION_LIMIT`] times).
    ///
    /// The answer is the lower edge of a range of feasible budgets: one step
    /// below it (1 B logical, 512 B physical) is not. Feasibility is not
    /// monotone in the budget, so smaller feasible budgets may exist (the
    /// bisection does not look for them). Storages resident at the recorded
    /// iteration's start are never evicted again, so values a program holds
    /// across a boundary raise the answer by their size.
    ///
    /// Errors: `max_overhead` not a number ≥ 1 ([`Error::InvalidArgument`]); no iteration
    /// recorded whole yet ([`Error::NotRecorded`]: call
    /// [`Runtime::record_iterations`] without a budget, then
    /// [`Runtime::end_iteration`] after a step).
    pub fn min_feasible_budget(&self, max_overhead: f64) -> Result<u64> {
        if !(max_overhead.is_finite() && max_overhead >= 1.0) {
            return Err(Error::InvalidArgument {
                name: "max_overhead",
                value: max_overhead.to_string(),
                expected: "a finite number ≥ 1.0",
            });
        }
        let rec = self.iter.last_recording.as_ref().ok_or_else(|| Error::NotRecorded {
            why: if self.iter.recording.is_some() {
                "no iteration has ended since recording started (call end_iteration after a step)"
            } else {
                "iterations are not recorded (set a budget with plan_ahead on, or call record_iterations)"
            },
        })?;
        crate::planner::min_feasible_budget(rec, &self.config, max_overhead)?.ok_or_else(|| {
            Error::Internal("the recorded iteration does not replay under any budget".into())
        })
    }

    /// With [`DtrConfig::plan_background`](crate::DtrConfig::plan_background):
    /// whether a boundary waits for a background plan of the program that just
    /// ran again (`true`: the plan is taken at the first boundary after it was
    /// started, deterministically, as the replayer does) or takes it only once
    /// its thread has finished (`false`, the default: no boundary waits, and
    /// iterations run online until the plan is ready).
    pub fn wait_for_background_plans(&mut self, on: bool) {
        self.iter.wait_for_plans = on;
    }

    /// Background planning at a boundary where the iteration that ended
    /// (recorded as `rec`, costing `measured_ns`) starts the next one from its
    /// own starting state. A plan pending from an earlier iteration of the same
    /// program is taken once its thread has finished (or waited for, see
    /// [`Runtime::wait_for_background_plans`]); until then the next iteration
    /// runs online ([`PlanStatus::Planning`]). Without one, `rec` is sent to a
    /// new planning thread; so it is when the pending thread found no plan
    /// under a bound lower than `measured_ns` (an unrepeated online iteration
    /// raised it). A pending plan of another program is dropped (its thread
    /// ends on its own).
    fn plan_in_background(
        &mut self,
        rec: Arc<Recording>,
        measured_ns: f64,
    ) -> Result<(Option<IterationPlan>, PlanStatus)> {
        if let Some(p) = self.iter.pending.take() {
            if p.recording.same_program(&rec) {
                if !p.job.is_finished() && !self.iter.wait_for_plans {
                    self.iter.pending = Some(p);
                    return Ok((None, PlanStatus::Planning));
                }
                let plan = p.job.join().map_err(|_| {
                    Error::Internal("the background planning thread panicked".into())
                })??;
                if plan.is_some() || measured_ns <= p.bound {
                    let status = if plan.is_some() {
                        PlanStatus::Planned
                    } else {
                        PlanStatus::NoPlan
                    };
                    return Ok((plan, status));
                }
            }
        }
        let config = self.config.clone();
        let job_rec = rec.clone();
        let job = std::thread::Builder::new()
            .name("remat-plan".into())
            .spawn(move || crate::planner::plan_iteration(&job_rec, &config, measured_ns))
            .map_err(|e| Error::Internal(format!("cannot start a planning thread: {e}")))?;
        self.iter.pending = Some(PendingPlan {
            recording: rec,
            bound: measured_ns,
            job,
        });
        Ok((None, PlanStatus::Planning))
    }

    fn tracking(&self) -> bool {
        self.iter.recording.is_some() || self.iter.following
    }

    /// The recording's name for `t`.
    pub(super) fn ref_of(&self, t: TensorId) -> Ref {
        // Every live tensor is named while tracking; `Prefix(MAX)` never matches.
        self.iter.refs.get(t).unwrap_or(Ref::Prefix(u32::MAX))
    }

    /// A public call starts: record it and check it against the plan. `reads`
    /// are the storages it reads directly.
    pub(super) fn note(&mut self, call: Call<'_>, reads: &[StorageId]) {
        self.graph.pos = self.iter.pos;
        self.iter.pos += 1;
        if !self.tracking() {
            return;
        }
        if self.iter.following {
            let pos = self.graph.pos as usize;
            let same = (self.iter.plan.as_ref())
                .and_then(|p| p.recording.events.get(pos))
                .is_some_and(|e| call.same_program(e, |t| self.ref_of(t)));
            if same {
                // Nothing to record or allocate: the plan's recording holds it.
                self.iter.matched += 1;
                return;
            }
            self.diverge("the call differs from the recorded iteration");
        }
        let ev = call.to_event(|t| self.ref_of(t));
        let epoch = self.iter.epoch;
        let seqs: Vec<u32> = reads
            .iter()
            .filter_map(|&s| self.graph.storages.get(s.0))
            .filter(|r| r.epoch == epoch && r.seq != NONE)
            .map(|r| r.seq)
            .collect();
        if let Some(rec) = &mut self.iter.recording {
            if rec.events.len() >= MAX_EVENTS {
                self.iter.recording = None;
            } else {
                rec.events.push(ev);
                rec.reads.push(seqs);
            }
        }
    }

    /// Mark the iteration's recording unusable when a public call failed.
    pub(super) fn track<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.iter.broken = true;
        }
        r
    }

    pub(super) fn on_new_tensor(&mut self, t: TensorId) {
        if self.tracking() {
            self.iter.refs.insert(t, Ref::New(self.iter.new_tensors));
            self.iter.new_tensors += 1;
        }
    }

    pub(super) fn on_tensor_gone(&mut self, t: TensorId) {
        if !self.iter.refs.is_empty() {
            self.iter.refs.remove(t);
        }
    }

    /// Log a policy eviction of `s` (simulations that become plans).
    pub(super) fn log_eviction(&mut self, s: StorageId, parked: bool) {
        if self.iter.plan_log.is_some() {
            let seq = self.graph.st(s).seq;
            let kind = if parked {
                StepKind::EvictParked(seq)
            } else {
                StepKind::Evict(seq)
            };
            self.log_step(kind);
        }
    }

    /// Log an allocation that failed as impossible (simulations).
    pub(super) fn log_step(&mut self, kind: StepKind) {
        let at = self.iter.allocs;
        if let Some(log) = &mut self.iter.plan_log {
            log.push(PlanStep { at, kind });
        }
    }

    fn diverge(&mut self, why: &str) {
        if self.iter.following {
            // The calls that matched were not recorded: the plan's recording
            // of them is this iteration's up to here.
            let n = self.iter.matched;
            if let (Some(rec), Some(plan)) = (self.iter.recording.as_mut(), self.iter.plan.as_ref())
            {
                rec.events.extend_from_slice(&plan.recording.events[..n]);
                rec.reads.extend_from_slice(&plan.recording.reads[..n]);
            }
            self.iter.matched = 0;
            self.iter.following = false;
            self.iter.stable_order = false;
            self.iter.divergences += 1;
            self.stats.divergences += 1;
            tracing::debug!(target: "remat_dtr::plan", call = self.graph.pos, allocation = self.iter.allocs, why, "left the plan");
        }
    }

    /// Following a plan: take its evictions for the next allocation and place
    /// `bytes` at its planned offset. `None` after a divergence (the caller
    /// allocates online).
    pub(super) fn planned_alloc(&mut self, bytes: u64) -> Result<Option<Slot>> {
        let Some(plan) = self.iter.plan.clone() else {
            return Ok(None);
        };
        let n = self.iter.allocs;
        while let Some(&step) = plan.steps.get(self.iter.cursor.next_step) {
            if step.at > n {
                break;
            }
            self.iter.cursor.next_step += 1;
            if step.at < n {
                self.diverge("a planned step was skipped");
                return Ok(None);
            }
            let (seq, parked) = match step.kind {
                StepKind::Evict(seq) => (seq, false),
                StepKind::EvictParked(seq) => (seq, true),
                // The simulation found this allocation impossible here and its
                // regeneration retried: fail it the same way.
                StepKind::Fail => return Err(self.impossible(bytes)),
            };
            let s = self.iter.seq_storages.get(seq as usize).copied();
            let ok = s.is_some_and(|s| {
                self.graph.storages.get(s.0).is_some_and(|r| {
                    if parked {
                        r.is_resident() && r.recomputable && r.holds > 0 && r.pins == r.holds
                    } else {
                        r.cand_pos != NONE
                    }
                })
            });
            let Some(s) = s.filter(|_| ok) else {
                self.diverge("a planned victim is not evictable");
                return Ok(None);
            };
            if parked {
                self.parked_evicted.push(s);
                self.stats.parked_evictions += 1;
            }
            self.evict_storage(s, false)?;
            self.stats.planned_evictions += 1;
        }
        let idx = plan.prefix_len() + n as usize;
        if plan.sizes.get(idx) != Some(&arena_size(bytes)) {
            self.diverge("an allocation differs from the plan");
            return Ok(None);
        }
        match self.memory.allocate_at(bytes, plan.offsets[idx]) {
            Ok(slot) => Ok(Some(slot)),
            Err(_) => {
                self.diverge("the planned range is not free");
                Ok(None)
            }
        }
    }

    /// The live state as sizes, with the resident storages and the live
    /// tensors in the same order.
    ///
    /// Canonical order, the same in every iteration of a repeated program
    /// whichever slab slots its tensors took: resident storages by when their
    /// oldest live tensor was made ([`super::TensorRec::born`]; those without
    /// one after, by creation: iteration, then sequence number within it);
    /// live tensors by their storage in that order (evicted ones after), then
    /// by when each was made. Not by a storage's creation alone: an update
    /// through [`Runtime::mutate`] renews a storage's version, so an iteration
    /// that skips one such update (a layer left out) would renumber the next
    /// start, and a plan recorded under one numbering would diverge from a
    /// start that only looks the same (same sizes, other tensors). (An
    /// optimizer that makes new parameter tensors each step, as Burn's do,
    /// still renumbers when it skips one: the skipped parameter keeps its
    /// older tensor.) Frameworks whose optimizers make new parameter tensors
    /// each step (Burn) and those that keep them (Candle) both repeat it.
    fn boundary(&self) -> (Boundary, Vec<StorageId>, Vec<TensorId>) {
        let key = |s: StorageId| {
            let r = self.graph.st(s);
            let born = (r.tensors.iter())
                .filter_map(|&i| self.tensors.get(i))
                .map(|t| t.born)
                .min()
                .unwrap_or(u64::MAX);
            (!r.is_resident(), born, r.epoch, r.seq, s.0)
        };
        // Each key is computed once (it reads the storage's tensors).
        let mut order: Vec<(_, StorageId)> = self
            .graph
            .storages
            .iter()
            .filter(|(_, r)| r.is_resident())
            .map(|(i, _)| (key(StorageId(i)), StorageId(i)))
            .collect();
        order.sort_unstable_by_key(|&(k, _)| k);
        let order: Vec<StorageId> = order.into_iter().map(|(_, s)| s).collect();
        let position: AHashMap<u32, u32> = order
            .iter()
            .enumerate()
            .map(|(k, s)| (s.0, k as u32))
            .collect();
        // A resident storage's key is its position; an evicted one's is
        // computed once.
        let mut evicted: AHashMap<u32, _> = AHashMap::new();
        let mut live: Vec<(_, u32, &super::TensorRec)> = (self.tensors.iter())
            .map(|(i, t)| {
                let s = t.storage;
                let k = match position.get(&s.0) {
                    Some(&p) => (false, p as u64, 0, 0, 0),
                    None => *evicted.entry(s.0).or_insert_with(|| key(s)),
                };
                ((k, t.born), i, t)
            })
            .collect();
        live.sort_unstable_by_key(|&(k, _, _)| k);
        let tensors = live
            .iter()
            .map(|(_, _, t)| (position.get(&t.storage.0).copied(), t.refs))
            .collect();
        let ids = live
            .iter()
            .map(|&(_, i, _)| TensorId {
                index: i,
                generation: self.generations[i as usize],
            })
            .collect();
        let storages = order.iter().map(|&s| self.graph.st(s).bytes).collect();
        (Boundary { storages, tensors }, order, ids)
    }

    /// End the current training iteration (call it after the optimizer step).
    ///
    /// - Storages the iteration left **resident** stay readable: they are never
    ///   evicted again.
    /// - Storages it left **evicted** are stale: their inputs (the weights) may
    ///   have changed, so reading one is [`Error::StaleValue`], never a silent
    ///   recompute from updated inputs.
    /// - With a budget (and `plan_ahead` on, the default), the recorded iteration
    ///   is planned: when the next iteration starts from the same state, remat
    ///   simulates the recording under the budget with a portfolio of policies
    ///   that know its future, places every allocation of the best schedule in
    ///   one arena no larger than the budget, and follows that plan while the
    ///   next iteration repeats the recorded one.
    ///
    /// Returns the figures of the iteration that ended.
    pub fn end_iteration(&mut self) -> Result<IterationReport> {
        let delta = |now: f64, then: f64| (now - then).max(0.0);
        let s0 = &self.iter.start_stats;
        let mut report = IterationReport {
            index: self.iter.epoch,
            planned: self.iter.plan.is_some(),
            divergences: self.iter.divergences,
            compute_ns: delta(self.stats.compute_ns, s0.compute_ns),
            remat_ns: delta(self.stats.remat_ns, s0.remat_ns),
            evictions: self.stats.evictions - s0.evictions,
            rematerializations: self.stats.rematerializations - s0.rematerializations,
            arena_bytes: self.iter.plan.as_ref().map(|p| p.arena_bytes),
            rescued: self.stats.rescued_since(&self.iter.start_stats),
            next_plan: None,
            planning: PlanStatus::Off,
        };
        // Freeze what stays resident; what is evicted becomes stale (epoch).
        let ids: Vec<u32> = self.graph.storages.iter().map(|(i, _)| i).collect();
        for i in ids {
            let s = StorageId(i);
            if self.graph.st(s).is_resident() && self.graph.st(s).recomputable {
                self.graph.withdraw(s);
                self.graph.st_mut(s).recomputable = false;
            }
        }
        // An iteration that followed its plan to the end repeated the plan's
        // recording; one that stopped short of it diverged.
        let followed_whole = self.iter.following
            && (self.iter.plan.as_ref())
                .is_some_and(|p| self.iter.matched == p.recording.events.len());
        if self.iter.following && !followed_whole {
            self.diverge("the iteration ended before its plan did");
        }
        self.iter.epoch += 1;
        let (boundary, residents, live) = self.boundary();
        let own = self.iter.recording.take();
        let recorded = match (followed_whole, own, self.iter.plan.as_ref()) {
            (true, Some(_), Some(p)) => Some(p.recording.clone()),
            (_, own, _) => own.map(Arc::new),
        };
        if let Some(rec) = recorded.as_ref() {
            if !self.iter.broken && !rec.events.is_empty() {
                self.iter.last_recording = Some(rec.clone());
            }
        }
        let previous = self.iter.plan.take();
        let mut next = None;
        let unrepeated = unrepeated(self.iter.last_online, &report);
        self.iter.last_online =
            (!report.planned && !self.iter.broken).then_some((report.compute_ns, report.remat_ns));
        let bound = Self::plan_bound(&report, unrepeated);
        report.planning = match recorded {
            _ if !self.iter.enabled => PlanStatus::Off,
            None => PlanStatus::NotRecorded,
            Some(_) if self.iter.broken => PlanStatus::CallFailed,
            Some(r) if r.events.is_empty() => PlanStatus::NotRecorded,
            Some(r) if r.start != boundary => PlanStatus::StartDiffers,
            Some(rec) => match previous {
                // The iteration repeated its plan exactly: the plan stands.
                Some(p) if followed_whole && p.recording.start == boundary => {
                    next = Some(p);
                    PlanStatus::Kept
                }
                _ if self.config.plan_background => {
                    let (plan, status) = self.plan_in_background(rec, bound)?;
                    next = plan.map(Arc::new);
                    status
                }
                _ => {
                    next = crate::planner::plan_iteration(&rec, &self.config, bound)?.map(Arc::new);
                    if next.is_some() {
                        PlanStatus::Planned
                    } else {
                        PlanStatus::NoPlan
                    }
                }
            },
        };
        report.next_plan = next.as_deref().map(Into::into);
        if let Some(plan) = next.clone() {
            self.adopt(&plan, &residents)?;
        }
        self.iter.following = next.is_some();
        self.iter.stable_order = next.is_some();
        self.iter.plan = next;
        self.iter.cursor = Cursor::default();
        self.iter.matched = 0;
        self.iter.seq_storages.clear();
        self.iter.allocs = 0;
        self.iter.pos = 0;
        self.iter.new_tensors = 0;
        self.iter.broken = false;
        self.iter.divergences = 0;
        if let Some(policy) = self.iter.set_aside_policy.take() {
            self.policy = policy;
        }
        self.iter.start_stats = self.stats.clone();
        self.stats.iterations += 1;
        if self.iter.enabled || self.iter.record_always {
            self.iter.recording = Some(Recording {
                start: boundary,
                ..Recording::default()
            });
        }
        self.iter.refs.clear();
        if self.tracking() {
            for (k, t) in live.into_iter().enumerate() {
                self.iter.refs.insert(t, Ref::Prefix(k as u32));
            }
        }
        Ok(report)
    }

    /// Lay the resident storages out where `plan` puts them: in one arena of the
    /// budget's size for physical budgets (logical budgets have no addresses).
    ///
    /// The arena follows the plan's layout without an address-ordered map while
    /// the iteration follows the plan (see [`crate::memory::arena`]).
    fn adopt(&mut self, plan: &Arc<IterationPlan>, residents: &[StorageId]) -> Result<()> {
        if !self.memory.has_addresses() {
            return Ok(());
        }
        let layout = match &self.iter.layout {
            Some((p, l)) if Arc::ptr_eq(p, plan) => l.clone(),
            _ => {
                let l = Arc::new(ArenaLayout::new(&plan.offsets, &plan.sizes));
                self.iter.layout = Some((plan.clone(), l.clone()));
                l
            }
        };
        let capacity = self.memory.capacity().unwrap_or(plan.arena_bytes);
        let placed = residents.iter().copied().zip(plan.offsets.iter().copied());
        let arena = ArenaMemory::with_layout(capacity, plan.arena_bytes, layout);
        // Following the plan never reads the address map: keep it lazily.
        self.by_ptr_stale = true;
        self.move_into_arena(arena, placed)
    }

    /// Move resident storages into `arena` at the given offsets (their slots in
    /// the old memory model are freed) and make it the memory model.
    fn move_into_arena(
        &mut self,
        mut arena: ArenaMemory,
        placed: impl Iterator<Item = (StorageId, u64)>,
    ) -> Result<()> {
        self.by_ptr.clear();
        for (s, offset) in placed {
            let old = self.graph.st_mut(s).slot.take();
            let bytes = self.graph.st(s).bytes;
            if let Some(old) = old {
                self.memory.free(old).map_err(Error::Memory)?;
            }
            let slot = arena
                .allocate_at(bytes, offset)
                .map_err(|e| Error::Internal(format!("arena layout does not fit: {e:?}")))?;
            if slot.size > 0 && !self.by_ptr_stale {
                self.by_ptr.insert(slot.ptr, s);
            }
            self.graph.st_mut(s).slot = Some(slot);
        }
        self.replace_memory(Box::new(arena));
        Ok(())
    }

    /// Whether this runtime may move blocks: plan-ahead on, not a planner
    /// simulation (its offsets become a plan), not following a plan.
    fn may_defragment(&self) -> bool {
        self.iter.enabled && self.can_move()
    }

    /// Whether this runtime may move resident blocks at all: not a planner
    /// simulation (its offsets become a plan), not following a plan.
    fn can_move(&self) -> bool {
        self.iter.plan_log.is_none() && !self.iter.following
    }

    /// Whether [`Runtime::defragment`] would move blocks of this memory.
    pub(super) fn defragmenting(&self) -> bool {
        self.can_move() && self.memory.can_compact()
    }

    /// Called where no allocation is in flight (before an op places its
    /// outputs): an online iteration under a physical budget whose replays have
    /// cost more than its first computations is losing to fragmentation; lay
    /// its resident storages out compactly in an [`ArenaMemory`] of the budget,
    /// which can then be defragmented ([`Runtime::defragment`]).
    pub(super) fn rescue_from_fragmentation(&mut self) -> Result<()> {
        if !self.may_defragment() || !self.memory.has_addresses() || self.memory.can_compact() {
            return Ok(());
        }
        let losing = self.losing();
        if !losing && !self.graph.thrashing() && !self.iter.fragmented {
            return Ok(());
        }
        self.iter.fragmented = false;
        if self.pack_into_arena()? {
            tracing::debug!(target: "remat_dtr::plan", "thrashing online: switched to a defragmented arena");
        }
        Ok(())
    }

    /// What a plan for the next iteration may cost (ns): at most what the
    /// iteration that just ended did, unless that iteration was rescued (moved
    /// storages to defragment, or switched policy because it was losing). A
    /// rescued iteration's cost is no figure the next one can count on: the
    /// copies that defragmented it are not charged, and its layout came from
    /// them (treelstm at 0.25: two online iterations at 1.263 and 1.262, then
    /// one from the same state that thrashes). Its plan, whose cost is exact,
    /// is then taken up to [`RESCUED_PLAN_LIMIT`] times the first
    /// computations. So is the plan after an online iteration that did not
    /// repeat the cost of the online one before it (`unrepeated`: the same
    /// computations, other replays), for the same reason: the next online
    /// iteration may cost anything (unroll_gan with perturbed costs at 0.3:
    /// 1.125 and 1.134 online, no plan cheaper than either, then a third
    /// online iteration that thrashes). "The same computations" compares the
    /// summed op costs exactly: with fixed costs (the replayer, analytic cost
    /// models) a repeated program sums to the same figure; with measured
    /// wall-clock costs it never does, and the rule never fires.
    fn plan_bound(report: &IterationReport, unrepeated: bool) -> f64 {
        let measured = report.compute_ns + report.remat_ns;
        if report.rescued || unrepeated {
            measured.max(RESCUED_PLAN_LIMIT * report.compute_ns)
        } else {
            measured
        }
    }

    /// Whether this iteration's replays have cost more than its first
    /// computations so far: past 2×, failing by the replayer's measure.
    fn losing(&self) -> bool {
        self.losing_since(self.iter.start_stats.remat_ns)
    }

    /// Whether the replays since the replay cost was `remat_ns` alone cost more
    /// than this iteration's first computations so far.
    pub(super) fn losing_since(&self, remat_ns: f64) -> bool {
        self.stats.remat_ns - remat_ns > self.stats.compute_ns - self.iter.start_stats.compute_ns
    }

    /// Whether the thrash rescues may act: plan-ahead on, `thrash_rescue` on,
    /// online (not a planner simulation, not following a plan).
    pub(super) fn may_rescue(&self) -> bool {
        self.iter.enabled && self.config.thrash_rescue && self.can_move()
    }

    /// An online iteration (plan-ahead on, either budget mode) that is losing
    /// ([`Runtime::losing`]) goes on, until its boundary, under MSPS: each
    /// candidate priced by the recompute cost of the whole evicted lineage its
    /// eviction would create, per byte, with no staleness term. Staleness-based
    /// scores (h_DTR, remat's) can cascade under extreme pressure: they evict
    /// the links next to an evicted chain, whose replays then evict the next
    /// links. A lineage price rises with every eviction nearby, so it spreads
    /// the evictions out instead. Only the first iteration of a training run
    /// should need this: the iterations after it follow a plan. Called before
    /// each hold (an op's inputs, a read, a pin), where no allocation is in
    /// flight.
    pub(super) fn rescue_from_thrashing(&mut self) {
        if !self.may_rescue()
            || self.iter.set_aside_policy.is_some()
            || self.config.policy == PolicyKind::Msps
            || !self.losing()
        {
            return;
        }
        let rescue = make_policy(PolicyKind::Msps, &self.config);
        self.iter.set_aside_policy = Some(std::mem::replace(&mut self.policy, rescue));
        self.stats.policy_rescues += 1;
        tracing::debug!(target: "remat_dtr::plan", "thrashing online: switched to the lineage-priced policy until the boundary");
    }

    /// The last resort of an allocation under a physical budget: no eviction
    /// can make room for `request` (the bytes of the allocations being placed
    /// together), yet the storages that must stay resident and the request fit
    /// the budget. The allocator's layout is then what fails (PyTorch's 2 MiB
    /// and 20 MiB segments larger than the budget, or the few blocks that must
    /// stay scattered over several segments), not the budget: the runtime lays
    /// its storages out itself, in a compacting [`ArenaMemory`] of the budget,
    /// for the rest of its life. `false` (nothing changed) when the working set
    /// does not fit either, or in a model that cannot move.
    ///
    /// With this, every budget at or above the working set (each storage
    /// rounded to [`crate::memory::arena::ARENA_ALIGN`]) is feasible in the physical
    /// mode too, whatever the size of the model.
    pub(super) fn fall_back_to_arena(&mut self, request: &[u64]) -> Result<bool> {
        if !self.can_move() || !self.memory.has_addresses() || self.memory.can_compact() {
            return Ok(false);
        }
        let Some(capacity) = self.memory.capacity() else {
            return Ok(false);
        };
        let resident: u64 = self
            .graph
            .storages
            .iter()
            .filter(|(_, r)| r.slot.is_some())
            .map(|(_, r)| arena_size(r.bytes))
            .sum();
        let needed: u64 = request.iter().map(|&b| arena_size(b)).sum();
        if resident.saturating_add(needed) > capacity {
            return Ok(false);
        }
        if !self.pack_into_arena()? {
            return Ok(false);
        }
        self.stats.arena_fallbacks += 1;
        tracing::debug!(
            target: "remat_dtr::oom",
            resident, needed, capacity,
            "the allocator's layout cannot hold a working set that fits: switched to a compacting arena"
        );
        Ok(true)
    }

    /// Move every resident storage into a fresh [`ArenaMemory`] of the budget,
    /// packed in address order. `false` for a model without a capacity.
    fn pack_into_arena(&mut self) -> Result<bool> {
        let Some(capacity) = self.memory.capacity() else {
            return Ok(false);
        };
        let mut residents: Vec<(u64, StorageId)> = self
            .graph
            .storages
            .iter()
            .filter_map(|(i, r)| r.slot.as_ref().map(|sl| (sl.ptr, StorageId(i))))
            .collect();
        residents.sort_unstable();
        let mut at = 0u64;
        let placed: Vec<(StorageId, u64)> = residents
            .into_iter()
            .map(|(_, s)| {
                let offset = at;
                at += arena_size(self.graph.st(s).bytes);
                (s, offset)
            })
            .collect();
        self.move_into_arena(ArenaMemory::new(capacity, 0), placed.into_iter())?;
        self.stats.defragmentations += 1;
        Ok(true)
    }

    /// An allocation of `bytes` found no room with `free_bytes` free: when at
    /// least [`FRAGMENTED_SHARE`] of the budget is free but unusable, the
    /// allocator's layout, not the working set, is what fails; the next op
    /// switches to a defragmenting arena ([`Runtime::rescue_from_fragmentation`]).
    pub(super) fn note_fragmentation(&mut self, bytes: u64, free_bytes: u64) {
        if let Some(capacity) = self.memory.capacity() {
            if free_bytes >= bytes && free_bytes as f64 >= FRAGMENTED_SHARE * capacity as f64 {
                self.iter.fragmented = true;
            }
        }
    }

    /// Defragment the arena: slide resident storages down (blocks of
    /// allocations in flight stay). `false` when the model cannot.
    pub(super) fn defragment(&mut self) -> Result<bool> {
        if !self.can_move() {
            return Ok(false);
        }
        self.refresh_by_ptr();
        let by_ptr = &self.by_ptr;
        let Some(moves) = self.memory.compact(&|p| by_ptr.contains_key(&p)) else {
            return Ok(false);
        };
        let moved: Vec<(StorageId, u64)> = moves
            .iter()
            .filter_map(|&(old, new)| self.by_ptr.get(&old).map(|&s| (s, new)))
            .collect();
        for &(old, _) in &moves {
            self.by_ptr.remove(&old);
        }
        for (s, new) in moved {
            self.by_ptr.insert(new, s);
            if let Some(slot) = self.graph.st_mut(s).slot.as_mut() {
                slot.ptr = new;
                self.stats.defrag_bytes += slot.size;
            }
        }
        self.stats.defragmentations += 1;
        Ok(true)
    }

    /// Swap the memory model, keeping the old one's peaks for
    /// [`Runtime::memory_usage`].
    fn replace_memory(&mut self, memory: Box<dyn MemoryModel>) {
        let u = self.memory.usage();
        let (a, r) = self.iter.retired_peaks;
        self.iter.retired_peaks = (a.max(u.peak_allocated), r.max(u.peak_reserved));
        self.memory = memory;
    }

    /// Start numbering calls, storages and allocations afresh without ending an
    /// iteration (the planner's simulations, after placing the boundary state).
    pub(crate) fn restart_numbering(&mut self, log_steps: bool) {
        // What exists now predates the iteration, as at a real boundary.
        self.iter.epoch += 1;
        self.iter.stable_order = true;
        self.iter.seq_storages.clear();
        self.iter.allocs = 0;
        self.iter.pos = 0;
        self.iter.plan_log = log_steps.then(Vec::new);
    }

    /// The simulation's evictions and failures (see [`Runtime::restart_numbering`]).
    pub(crate) fn take_plan_log(&mut self) -> Vec<PlanStep> {
        self.iter.plan_log.take().unwrap_or_default()
    }

    /// The plan being followed this iteration, if any.
    pub fn current_plan(&self) -> Option<&IterationPlan> {
        self.iter.plan.as_deref()
    }

    /// Whether the current iteration still follows its plan.
    pub fn following_plan(&self) -> bool {
        self.iter.following
    }

    /// Iterations ended so far.
    pub fn iteration(&self) -> u32 {
        self.iter.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(planned: bool, compute_ns: f64, remat_ns: f64, rescued: bool) -> IterationReport {
        IterationReport {
            index: 1,
            planned,
            divergences: 0,
            compute_ns,
            remat_ns,
            evictions: 0,
            rematerializations: 0,
            arena_bytes: None,
            rescued,
            next_plan: None,
            planning: PlanStatus::NotRecorded,
        }
    }

    #[test]
    fn a_plan_may_cost_up_to_2x_after_a_rescued_or_unrepeated_online_iteration() {
        let online = report(false, 100.0, 10.0, false);
        // The same program online twice at two costs: not repeating.
        assert!(unrepeated(Some((100.0, 12.0)), &online));
        // The same cost, another program, no online iteration before, or an
        // iteration that started on a plan: nothing to say.
        assert!(!unrepeated(Some((100.0, 10.0)), &online));
        assert!(!unrepeated(Some((90.0, 12.0)), &online));
        assert!(!unrepeated(None, &online));
        assert!(!unrepeated(
            Some((100.0, 12.0)),
            &report(true, 100.0, 10.0, false)
        ));
        // The bound: what the iteration cost, or up to 2× its computations.
        type R = Runtime<()>;
        assert_eq!(R::plan_bound(&online, false), 110.0);
        assert_eq!(R::plan_bound(&online, true), 200.0);
        assert_eq!(
            R::plan_bound(&report(false, 100.0, 10.0, true), false),
            200.0
        );
        // An iteration that cost more than 2× is its own bound.
        assert_eq!(
            R::plan_bound(&report(false, 100.0, 150.0, false), true),
            250.0
        );
    }

    #[test]
    fn ref_table_names_handles_like_a_map() {
        let t = |index, generation| TensorId { index, generation };
        let mut refs = RefTable::default();
        assert!(refs.is_empty());
        refs.insert(t(3, 0), Ref::New(0));
        refs.insert(t(0, 1), Ref::Prefix(2));
        assert_eq!(refs.get(t(3, 0)), Some(Ref::New(0)));
        assert_eq!(refs.get(t(0, 1)), Some(Ref::Prefix(2)));
        // Another generation at a named index is not named, and removing it
        // leaves the name of the handle that is.
        assert_eq!(refs.get(t(3, 1)), None);
        refs.remove(t(3, 1));
        assert_eq!(refs.get(t(3, 0)), Some(Ref::New(0)));
        assert_eq!(refs.get(t(9, 0)), None);
        refs.insert(t(3, 0), Ref::New(5));
        assert_eq!(refs.get(t(3, 0)), Some(Ref::New(5)));
        refs.remove(t(3, 0));
        refs.remove(t(3, 0));
        assert_eq!(refs.get(t(3, 0)), None);
        assert!(!refs.is_empty());
        refs.remove(t(0, 1));
        assert!(refs.is_empty());
        refs.insert(t(1, 0), Ref::New(1));
        refs.clear();
        assert!(refs.is_empty());
        assert_eq!(refs.get(t(1, 0)), None);
    }
}
