//! The boundary between two iterations ([`Runtime::end_iteration`]): freeze
//! what the ended iteration left resident, make what it left evicted stale,
//! name the live state canonically ([`Boundary`]), and plan the next iteration
//! when it starts from the same state: now, or on a background thread.

use std::sync::Arc;

use ahash::AHashMap;

use super::super::{Runtime, TensorRec};
use crate::error::{Error, Result};
use crate::graph::Residency;
use crate::ids::{StorageId, TensorId};
use crate::plan::{Cursor, IterationPlan};
use crate::record::{Boundary, CarryRefusal, Recording, Ref};
use crate::stats::{IterationReport, NoPlan, PlanStatus, StartDiff};

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

/// What planning gave, as a boundary reports it: the plan and
/// [`PlanStatus::Planned`], or [`PlanStatus::NoPlan`] and why.
fn outcome(
    planned: crate::planner::Planned,
) -> (Option<IterationPlan>, PlanStatus, Option<NoPlan>) {
    match planned {
        Ok(plan) => (Some(plan), PlanStatus::Planned, None),
        Err(why) => (None, PlanStatus::NoPlan, Some(why)),
    }
}

/// A plan being made on a background thread from `recording`.
pub(crate) struct PendingPlan {
    recording: Arc<Recording>,
    /// What the plan may cost (ns, [`Runtime::plan_bound`]).
    bound: f64,
    job: std::thread::JoinHandle<Result<crate::planner::Planned>>,
}

/// The planning state kept across boundaries.
#[derive(Default)]
pub(crate) struct Planning {
    /// A recording being planned on a background thread
    /// ([`crate::DtrConfig::plan_background`]).
    pub pending: Option<PendingPlan>,
    /// Boundaries wait for a pending plan of the same program
    /// ([`Runtime::wait_for_background_plans`]).
    pub wait_for_plans: bool,
    /// First computations and replays (ns) of the last iteration, when it ran
    /// online from start to end (see [`Runtime::plan_bound`]).
    pub last_online: Option<(f64, f64)>,
    /// With swap on: what the last iteration that ran online from start to
    /// end cost, stalls included (ns): the alternative to a plan after a
    /// planned iteration.
    pub online_cost: Option<f64>,
}

impl<V> Runtime<V> {
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
        let rec = self.recorded_whole()?;
        crate::planner::min_feasible_budget(rec, &self.config, max_overhead)?.ok_or_else(|| {
            Error::Internal("the recorded iteration does not replay under any budget".into())
        })
    }

    /// The last iteration recorded whole, or why there is none
    /// ([`Error::NotRecorded`]).
    fn recorded_whole(&self) -> Result<&Arc<Recording>> {
        self.iter.recorder.last_recording.as_ref().ok_or_else(|| Error::NotRecorded {
            why: if self.iter.recorder.recording.is_some() {
                "no iteration has ended since recording started (call end_iteration after a step)"
            } else {
                "iterations are not recorded (set a budget with plan_ahead on, or call record_iterations)"
            },
        })
    }

    /// The last iteration recorded whole (see [`Runtime::record_iterations`]),
    /// the one [`Runtime::min_feasible_budget`] answers for; `None` before one
    /// has ended.
    pub fn last_recording(&self) -> Option<&Recording> {
        self.iter.recorder.last_recording.as_deref()
    }

    /// The last recorded iteration as a trace named `name`, in the DTR paper's
    /// format ([`Recording::to_trace`]; write it with
    /// [`crate::export::write_trace`]).
    ///
    /// Errors: [`Error::NotRecorded`] as for [`Runtime::min_feasible_budget`].
    pub fn export_trace(&self, name: &str) -> Result<remat_trace::Trace> {
        let rec = self.recorded_whole()?;
        rec.to_trace(name)
    }

    /// With [`DtrConfig::plan_background`](crate::DtrConfig::plan_background):
    /// whether a boundary waits for a background plan of the program that just
    /// ran again (`true`: the plan is taken at the first boundary after it was
    /// started, deterministically, as the replayer does) or takes it only once
    /// its thread has finished (`false`, the default: no boundary waits, and
    /// iterations run online until the plan is ready).
    pub fn wait_for_background_plans(&mut self, on: bool) {
        self.iter.planning.wait_for_plans = on;
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
    pub(super) fn plan_in_background(
        &mut self,
        rec: Arc<Recording>,
        measured_ns: f64,
    ) -> Result<(Option<IterationPlan>, PlanStatus, Option<NoPlan>)> {
        if let Some(p) = self.iter.planning.pending.take() {
            if p.recording.same_program(&rec) {
                if !p.job.is_finished() && !self.iter.planning.wait_for_plans {
                    self.iter.planning.pending = Some(p);
                    return Ok((None, PlanStatus::Planning, None));
                }
                let planned = p.job.join().map_err(|_| {
                    Error::Internal("the background planning thread panicked".into())
                })??;
                if planned.is_ok() || measured_ns <= p.bound {
                    return Ok(outcome(planned));
                }
            }
        }
        let config = self.config.clone();
        let job_rec = rec.clone();
        let job = std::thread::Builder::new()
            .name("remat-plan".into())
            .spawn(move || crate::planner::plan_iteration(&job_rec, &config, measured_ns))
            .map_err(|e| Error::Internal(format!("cannot start a planning thread: {e}")))?;
        self.iter.planning.pending = Some(PendingPlan {
            recording: rec,
            bound: measured_ns,
            job,
        });
        Ok((None, PlanStatus::Planning, None))
    }

    /// The live state as sizes, with the resident storages and the live
    /// tensors in the same order.
    ///
    /// Canonical order, the same in every iteration of a repeated program
    /// whichever slab slots its tensors took: resident storages by when their
    /// oldest live tensor was made ([`TensorRec::born`]; those without
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
    pub(super) fn boundary(&self) -> (Boundary, Vec<StorageId>, Vec<TensorId>) {
        self.boundary_as(&[])
    }

    /// [`Self::boundary`] as it would be with the resident storages of
    /// `as_swapped` in the host tier instead.
    fn boundary_as(&self, as_swapped: &[StorageId]) -> (Boundary, Vec<StorageId>, Vec<TensorId>) {
        let resident = |s: StorageId| self.graph.st(s).is_resident() && !as_swapped.contains(&s);
        let key = |s: StorageId| {
            let r = self.graph.st(s);
            let born = (r.tensors.iter())
                .filter_map(|&i| self.tensors.get(i))
                .map(|t| t.born)
                .min()
                .unwrap_or(u64::MAX);
            (!resident(s), born, r.epoch, r.seq, s.0)
        };
        // Each key is computed once (it reads the storage's tensors).
        let mut order: Vec<(_, StorageId)> = self
            .graph
            .storages
            .iter()
            .filter(|(_, r)| r.holds_value())
            .map(|(i, _)| (key(StorageId(i)), StorageId(i)))
            .collect();
        order.sort_unstable_by_key(|&(k, _)| k);
        // Tensors are numbered by their storage's key without its tier
        // (swapped or resident: the storages of a swapping plan move between
        // the two, and a plan names tensors by number), those on evicted
        // storages last (their key's first field). A held storage's key is
        // the one just computed; an evicted one's is computed once.
        let position: AHashMap<u32, (u32, _)> = (order.iter().enumerate())
            .map(|(k, &((_, born, epoch, seq, idx), s))| {
                (s.0, (k as u32, (false, born, epoch, seq, idx)))
            })
            .collect();
        let order: Vec<StorageId> = order.into_iter().map(|(_, s)| s).collect();
        let mut evicted: AHashMap<u32, _> = AHashMap::new();
        let mut live: Vec<(_, u32, &TensorRec)> = (self.tensors.iter())
            .map(|(i, t)| {
                let s = t.storage;
                let k = match position.get(&s.0) {
                    Some(&(_, k)) => k,
                    None => *evicted.entry(s.0).or_insert_with(|| key(s)),
                };
                ((k, t.born), i, t)
            })
            .collect();
        live.sort_unstable_by_key(|&(k, _, _)| k);
        let tensors = live
            .iter()
            .map(|(_, _, t)| (position.get(&t.storage.0).map(|&(p, _)| p), t.refs))
            .collect();
        let ids = live
            .iter()
            .map(|&(_, i, _)| TensorId {
                index: i,
                generation: self.generations[i as usize],
            })
            .collect();
        let storages = order.iter().map(|&s| self.graph.st(s).bytes).collect();
        let swapped = (order.iter())
            .filter(|&&s| {
                self.graph.st(s).residency == Residency::Swapped || as_swapped.contains(&s)
            })
            .count() as u32;
        let boundary = Boundary {
            storages,
            tensors,
            swapped,
        };
        (boundary, order, ids)
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
            planned: self.iter.follower.plan.is_some(),
            divergences: self.iter.follower.divergences,
            compute_ns: delta(self.stats.compute_ns, s0.compute_ns),
            remat_ns: delta(self.stats.remat_ns, s0.remat_ns),
            evictions: self.stats.evictions - s0.evictions,
            rematerializations: self.stats.rematerializations - s0.rematerializations,
            stall_ns: delta(self.stats.stall_ns, s0.stall_ns),
            defrag_ns: delta(self.stats.defrag_ns, s0.defrag_ns),
            swapped_out_bytes: self.stats.swapped_out_bytes - s0.swapped_out_bytes,
            swapped_in_bytes: self.stats.swapped_in_bytes - s0.swapped_in_bytes,
            arena_bytes: self.iter.follower.plan.as_ref().map(|p| p.arena_bytes),
            rescued: self.stats.rescued_since(&self.iter.start_stats),
            next_plan: None,
            planning: PlanStatus::Off,
            start_diff: None,
            no_plan: None,
            released_bytes: 0,
        };
        if self.config.release_at_boundary {
            // The next iteration, if it runs online, cuts its segments for its
            // own requests, as the first did (`DtrConfig::release_at_boundary`).
            report.released_bytes = self.memory.release_cached().map_err(Error::Memory)?;
            self.stats.boundary_released_bytes += report.released_bytes;
        }
        // Freeze what stays resident; what is evicted becomes stale (epoch).
        let ids: Vec<u32> = self.graph.storages.iter().map(|(i, _)| i).collect();
        for i in ids {
            let s = StorageId(i);
            let r = self.graph.st(s);
            if r.holds_value() && r.recomputable {
                self.graph.withdraw(s);
                self.graph.st_mut(s).recomputable = false;
                // Swappable still, with swap on.
                self.graph.offer(s);
            }
        }
        // An iteration that followed its plan to the end repeated the plan's
        // recording; one that stopped short of it diverged.
        let followed_whole = self.iter.follower.following
            && (self.iter.follower.plan.as_ref())
                .is_some_and(|p| self.iter.follower.matched == p.recording.events.len());
        if self.iter.follower.following && !followed_whole {
            self.diverge("the iteration ended before its plan did");
        }
        self.iter.epoch += 1;
        let (mut boundary, mut residents, live) = self.boundary();
        let own = self.iter.recorder.recording.take();
        let recorded = match (followed_whole, own, self.iter.follower.plan.as_ref()) {
            (true, Some(_), Some(p)) => Some(p.recording.clone()),
            (_, own, _) => own.map(Arc::new),
        };
        if let Some(rec) = recorded.as_ref() {
            if !self.iter.recorder.broken && !rec.events.is_empty() {
                self.iter.recorder.last_recording = Some(rec.clone());
            }
        }
        let previous = self.iter.follower.plan.take();
        let mut next = None;
        let unrepeated = unrepeated(self.iter.planning.last_online, &report);
        self.iter.planning.last_online = (!report.planned && !self.iter.recorder.broken)
            .then_some((report.compute_ns, report.remat_ns));
        let mut bound = Self::plan_bound(&report, unrepeated, self.swap_enabled());
        if self.swap_enabled() {
            // After a planned iteration the alternative to a new plan is an
            // online one, not the plan it followed (which may no longer
            // match the boundary: swaps move storages between the tiers).
            if !report.planned && !self.iter.recorder.broken {
                self.iter.planning.online_cost = Some(report.wall_ns());
            } else if report.planned {
                bound = bound.max(self.iter.planning.online_cost.unwrap_or(0.0));
            }
        }
        report.planning = match recorded {
            _ if !self.iter.enabled => PlanStatus::Off,
            None => PlanStatus::NotRecorded,
            Some(_) if self.iter.recorder.broken => PlanStatus::CallFailed,
            Some(r) if r.events.is_empty() => PlanStatus::NotRecorded,
            Some(r) if r.start != boundary => {
                let (diff, carried) = self.carry(&r, &boundary, &residents, &live);
                report.start_diff = Some(diff);
                match carried {
                    None => PlanStatus::StartDiffers,
                    Some(rec) => {
                        let (plan, status, why) =
                            self.plan_now_or_in_background(Arc::new(rec), bound)?;
                        next = plan;
                        report.no_plan = why;
                        status
                    }
                }
            }
            Some(rec) => match &previous {
                // The iteration repeated its plan exactly: the plan stands.
                Some(p) if followed_whole && p.recording.start == boundary => {
                    next = Some(p.clone());
                    PlanStatus::Kept
                }
                _ => {
                    let (plan, status, why) = self.plan_now_or_in_background(rec, bound)?;
                    next = plan;
                    report.no_plan = why;
                    status
                }
            },
        };
        // A plan followed to its end whose own start differs from this
        // boundary only in which storages are in the host tier stands, once
        // those storages are copied out again, where that costs no more than
        // the plan made for this boundary (or none was found): no plan lost
        // to a boundary.
        let mut restored = (0.0, 0);
        if let Some(p) = previous
            .as_ref()
            .filter(|_| followed_whole && self.swap_enabled())
        {
            let out = self.tiers_to_restore(&p.recording.start, &boundary, &residents);
            if let Some(out) = out.filter(|o| self.boundary_as(o).0 == p.recording.start) {
                let keep_ns = report.wall_ns() + self.restore_cost_ns(&out);
                if keep_ns <= next.as_ref().map_or(f64::INFINITY, |n| n.total_ns) {
                    let before = (self.stats.stall_ns, self.stats.swapped_out_bytes);
                    self.iter.follower.following = false;
                    let mut all = true;
                    for s in out {
                        all &= self.swap_out(s)?;
                    }
                    (boundary, residents, _) = self.boundary();
                    if all && boundary == p.recording.start {
                        next = Some(p.clone());
                        report.planning = PlanStatus::Kept;
                        report.no_plan = None;
                    } else if next.as_ref().is_some_and(|n| n.recording.start != boundary) {
                        // A refused copy left neither start: online.
                        next = None;
                        report.planning = PlanStatus::StartDiffers;
                    }
                    restored = (
                        self.stats.stall_ns - before.0,
                        self.stats.swapped_out_bytes - before.1,
                    );
                }
            }
        }
        report.next_plan = next.as_deref().map(Into::into);
        if let Some(plan) = next.clone() {
            self.adopt(&plan, &residents[..boundary.resident().len()])?;
        }
        self.iter.follower.following = next.is_some();
        self.iter.follower.moving = next.as_ref().is_some_and(|p| p.moves);
        self.iter.follower.stable_order = next.is_some();
        self.iter.follower.plan = next;
        self.iter.follower.cursor = Cursor::default();
        self.iter.follower.matched = 0;
        self.iter.set_prefix(&residents);
        self.iter.seq_storages.clear();
        self.iter.allocs = 0;
        self.iter.pos = 0;
        self.iter.recorder.new_tensors = 0;
        self.iter.recorder.broken = false;
        self.iter.follower.divergences = 0;
        if let Some(policy) = self.iter.rescue.set_aside_policy.take() {
            self.policy = policy;
        }
        self.iter.rescue.arena_since = None;
        self.iter.start_stats = self.stats.clone();
        // The copies that restored the plan's start are the next step's.
        self.iter.start_stats.stall_ns -= restored.0;
        self.iter.start_stats.swapped_out_bytes -= restored.1;
        if let Some(tier) = self.host.as_mut() {
            tier.restart_stall_marks(self.stats.stall_ns);
        }
        self.stats.iterations += 1;
        if self.iter.enabled || self.iter.recorder.record_always {
            self.iter.recorder.recording = Some(Recording {
                start: boundary,
                ..Recording::default()
            });
        }
        self.iter.recorder.refs.clear();
        if self.tracking() {
            for (k, t) in live.into_iter().enumerate() {
                self.iter.recorder.refs.insert(t, Ref::Prefix(k as u32));
            }
        }
        Ok(report)
    }

    /// The storages to copy out to the host tier so that this boundary
    /// (`have`, `order` its storages) starts as `want` (the start of the plan
    /// just followed) did: those `want` had there and `have` holds resident,
    /// matched by their live tensors, whose numbering does not depend on the
    /// tier. `None` when the two differ otherwise (other sizes or tensors), a
    /// matched storage is pinned, or nothing needs to move.
    ///
    /// A plan that swaps ends with the storages it copied back resident, so
    /// the next boundary can differ from the start it was planned from in
    /// that alone. Planned again from there, a held-out Llama-like model at
    /// 0.3 of its peak found no plan and ran online at 6.4× instead of
    /// following its 2.3× plan; t5_small at 0.2 found a dearer one (1.468×
    /// against 1.392×; `docs/dtr-results.md`, session 38).
    fn tiers_to_restore(
        &self,
        want: &Boundary,
        have: &Boundary,
        order: &[StorageId],
    ) -> Option<Vec<StorageId>> {
        if want.tensors.len() != have.tensors.len() || want.storages.len() != have.storages.len() {
            return None;
        }
        let want_resident = want.resident().len();
        let mut out: Vec<StorageId> = Vec::new();
        for (w, h) in want.tensors.iter().zip(&have.tensors) {
            let (Some(w), Some(h)) = (w.0, h.0) else {
                continue;
            };
            let s = *order.get(h as usize)?;
            let r = self.graph.st(s);
            if w as usize >= want_resident && r.is_resident() && !out.contains(&s) {
                if r.pins > 0 {
                    return None;
                }
                out.push(s);
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// What copying `out` to the host tier may cost the next step at most
    /// (ns): each copy not already there (no clean host copy) on the
    /// device-to-host engine, the step waiting for all of them.
    fn restore_cost_ns(&self, out: &[StorageId]) -> f64 {
        let bytes: u64 = (out.iter())
            .map(|&s| self.graph.st(s))
            .filter(|r| !r.host_copy)
            .map(|r| r.bytes)
            .sum();
        // GB/s = B/ns.
        self.config
            .swap
            .bandwidth_gbps
            .map_or(f64::INFINITY, |gbps| bytes as f64 / gbps)
    }

    /// Plan `rec` for the next iteration under `bound` (ns): now, or on a
    /// background thread with [`crate::DtrConfig::plan_background`]. With no
    /// plan found, what the planner's simulations ran into.
    fn plan_now_or_in_background(
        &mut self,
        rec: Arc<Recording>,
        bound: f64,
    ) -> Result<(Option<Arc<IterationPlan>>, PlanStatus, Option<NoPlan>)> {
        if self.config.plan_background {
            let (plan, status, why) = self.plan_in_background(rec, bound)?;
            return Ok((plan.map(Arc::new), status, why));
        }
        let (plan, status, why) =
            outcome(crate::planner::plan_iteration(&rec, &self.config, bound)?);
        Ok((plan.map(Arc::new), status, why))
    }

    /// The ended iteration's recording `rec` started from another state than
    /// `boundary`: what differs, and the recording carried to `boundary`
    /// ([`Recording::carried_to`]) when the difference is only external data
    /// the iteration put and left live. `residents` and `live` are the
    /// boundary's storages and tensors in its order.
    fn carry(
        &self,
        rec: &Recording,
        boundary: &Boundary,
        residents: &[StorageId],
        live: &[TensorId],
    ) -> (StartDiff, Option<Recording>) {
        // Storages the ended iteration made: those of the epoch before this one.
        let ended = self.iter.epoch.wrapping_sub(1);
        let made: Vec<u64> = (residents.iter())
            .map(|&s| self.graph.st(s))
            .filter(|r| r.epoch == ended)
            .map(|r| r.bytes)
            .collect();
        let names: Option<Vec<Ref>> = live
            .iter()
            .map(|&t| self.iter.recorder.refs.get(t))
            .collect();
        let carried = match names {
            None => Err(CarryRefusal::NamesMismatch),
            Some(names) => rec.carried_to(boundary, &names),
        };
        let diff = StartDiff {
            recorded_storages: rec.start.storages.len(),
            recorded_bytes: rec.start.resident_bytes(),
            recorded_tensors: rec.start.tensors.len(),
            boundary_storages: boundary.storages.len(),
            boundary_bytes: boundary.resident_bytes(),
            boundary_tensors: boundary.tensors.len(),
            made_storages: made.len(),
            made_bytes: made.iter().sum(),
            not_carried: carried.as_ref().err().copied(),
        };
        (diff, carried.ok())
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
    ///
    /// With swap on, the measured cost is the bound, rescued or not: an
    /// online iteration that may swap is bounded by construction (each
    /// eviction costs at most its round trip, and a swapped storage comes
    /// back without replaying anything), so the allowance that guards
    /// against online runaways would only adopt plans slower than the online
    /// iteration (lstm at 0.2, 24 GB/s: online 1.243 and 1.247, then a
    /// recompute-only plan of 1.332 taken under the allowance).
    pub(super) fn plan_bound(report: &IterationReport, unrepeated: bool, swap: bool) -> f64 {
        // Stalls on host-tier copies count: a recompute-only plan is adopted
        // only where it is no slower than the iteration that swapped.
        let measured = report.wall_ns();
        if (report.rescued || unrepeated) && !swap {
            measured.max(RESCUED_PLAN_LIMIT * report.compute_ns)
        } else {
            measured
        }
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
            stall_ns: 0.0,
            defrag_ns: 0.0,
            swapped_out_bytes: 0,
            swapped_in_bytes: 0,
            arena_bytes: None,
            rescued,
            next_plan: None,
            planning: PlanStatus::NotRecorded,
            start_diff: None,
            no_plan: None,
            released_bytes: 0,
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
        assert_eq!(R::plan_bound(&online, false, false), 110.0);
        assert_eq!(R::plan_bound(&online, true, false), 200.0);
        assert_eq!(
            R::plan_bound(&report(false, 100.0, 10.0, true), false, false),
            200.0
        );
        // An iteration that cost more than 2× is its own bound.
        assert_eq!(
            R::plan_bound(&report(false, 100.0, 150.0, false), true, false),
            250.0
        );
        // With swap on, what the iteration cost, stalls included, rescued or
        // not.
        let mut swapped = report(false, 100.0, 10.0, true);
        swapped.stall_ns = 5.0;
        assert_eq!(R::plan_bound(&swapped, true, true), 115.0);
    }
}
