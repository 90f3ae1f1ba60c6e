//! [`Runtime`]: the DTR interpreter — put, apply, record, access, release, pin,
//! unpin, evict — over a [`MemoryModel`] and an [`EvictionPolicy`].
//!
//! Modules: `regen` makes evicted storages resident again (the work list
//! behind every read of an evicted value); `iteration` records iterations,
//! plans the next one at each boundary and follows the plan.

use std::sync::Arc;
use std::time::Instant;

use ahash::AHashMap;

mod iteration;
mod regen;

use crate::config::{BudgetMode, DtrConfig};
use crate::error::{Error, ImpossibleBudget, ImpossibleCause, Result};
use crate::execute::StepKind;
use crate::graph::{Graph, Hot, OpRec, Residency, StorageRec, NONE};
use crate::ids::{OpId, Slab, StorageId, TensorId};
use crate::memory::{AllocFailure, LogicalBudget, MemoryModel, MemoryUsage, Slot};
use crate::op::{OpHandle, OutputSpec};
use crate::policy::{make_policy, DecisionView, EvictionPolicy, Request};
use crate::record::Call;
use crate::rng::SplitMix64;
use crate::stats::RuntimeStats;
use iteration::IterationState;

/// Evicted ancestors visited to order a regeneration's inputs by need.
const REGEN_ORDER_NODES: usize = 256;

/// A user tensor: a (possibly shared) view of one storage.
#[derive(Debug, Clone, Copy)]
struct TensorRec {
    storage: StorageId,
    /// Live handles to this tensor (`retain` adds one, `release` drops one).
    refs: u32,
}

/// One step of the regeneration work list.
#[derive(Debug, Clone, Copy)]
enum Frame {
    /// Make `StorageId` resident and hold it once.
    Need(StorageId),
    /// All inputs of `op` are held: compute its missing outputs, release the
    /// inputs, hold `target`.
    Run { op: OpId, target: StorageId },
}

/// Where a regeneration stands with keeping what it regenerates
/// ([`Runtime::keep_regenerated`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Keeping {
    /// Releasing each input once its op has run (outside a regeneration, or
    /// where the thrash rescue cannot act).
    Off,
    /// Releasing, until its own replays (from this replay cost, ns) pass the
    /// iteration's first computations.
    Armed(f64),
    /// Keeping, until it ends or nothing else can make room.
    On,
}

/// The DTR runtime over values of type `V` (a storage handle of the adapter: a
/// candle storage, a burn tensor primitive, `()` for trace replay).
pub struct Runtime<V> {
    graph: Graph,
    /// Values by storage index; `Some` iff resident.
    values: Vec<Option<V>>,
    /// Op handles by op index.
    handles: Vec<Option<Arc<dyn OpHandle<V>>>>,
    tensors: Slab<TensorRec>,
    generations: Vec<u32>,
    memory: Box<dyn MemoryModel>,
    policy: Box<dyn EvictionPolicy>,
    config: DtrConfig,
    rng: SplitMix64,
    /// Resident storage by block address (models with addresses only). Kept
    /// lazily: while `by_ptr_stale` (set when an iteration starts to follow a
    /// plan, whose allocations never ask for it) it is neither read nor kept
    /// up to date, and the first reader rebuilds it from the resident slots
    /// ([`Runtime::refresh_by_ptr`]).
    by_ptr: AHashMap<u64, StorageId>,
    by_ptr_stale: bool,
    stats: RuntimeStats,
    record_decisions: bool,
    decision_ns: Vec<u32>,
    /// Stop with [`Error::ComputeLimit`] once total compute passes this (ns).
    compute_limit: Option<f64>,
    // Scratch.
    pool: Vec<StorageId>,
    pool_hot: Vec<Hot>,
    /// The pool is a √N sample (not every candidate).
    pool_sampled: bool,
    victims: Vec<StorageId>,
    /// Set while the threshold trigger evicts: only storages whose evicted
    /// region stays small are chosen ([`crate::graph::Graph::threshold_evictable`]).
    thresholding: bool,
    frames: Vec<Frame>,
    touched: Vec<StorageId>,
    /// True while [`Runtime::hold`] runs its work list: finished inputs waiting
    /// for their consumer ("parked") may then be evicted as a last resort.
    regenerating: bool,
    /// Storages evicted while parked during the current `hold` (each at most
    /// once, which bounds the work).
    parked_evicted: Vec<StorageId>,
    /// The current `hold` orders inputs by need (its retry).
    by_need: bool,
    /// The current `hold` replayed (or set out to replay) a compute path.
    replayed: bool,
    /// Whether the current regeneration keeps what it regenerated
    /// ([`Runtime::keep_regenerated`]).
    keeping: Keeping,
    /// Holds kept by a regeneration that keeps what it regenerated, released
    /// when it ends.
    kept: Vec<StorageId>,
    /// Iterations: the recorder, the plan being followed, the counters that name
    /// storages and allocations within the iteration (see `iteration`).
    iter: IterationState,
}

impl<V> std::fmt::Debug for Runtime<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("policy", &self.policy.name())
            .field("memory", &self.memory.name())
            .field("storages", &self.graph.storages.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<V> Runtime<V> {
    /// A runtime for `config`: the policy it names, and its budget accounted by the
    /// memory model of its [`BudgetMode`] (physical: a remat-alloc caching allocator
    /// over a simulated device of the budget's capacity; unbounded budgets and the
    /// logical mode use [`LogicalBudget`]). A setting out of range is an
    /// [`Error::Config`] ([`DtrConfig::check`]).
    pub fn new(config: DtrConfig) -> Result<Self> {
        config.check()?;
        let memory = memory_model(&config)?;
        let policy = make_policy(config.policy, &config);
        Ok(Self::with_parts(config, memory, policy))
    }

    /// A runtime over an explicit memory model and policy (the config's budget,
    /// mode and policy fields are then informative only).
    pub fn with_parts(
        config: DtrConfig,
        memory: Box<dyn MemoryModel>,
        policy: Box<dyn EvictionPolicy>,
    ) -> Self {
        let graph = Graph {
            min_evictee_bytes: config.min_evictee_bytes,
            ..Graph::default()
        };
        Self {
            graph,
            values: Vec::new(),
            handles: Vec::new(),
            tensors: Slab::default(),
            generations: Vec::new(),
            memory,
            policy,
            rng: SplitMix64::new(config.seed),
            config,
            by_ptr: AHashMap::new(),
            by_ptr_stale: false,
            stats: RuntimeStats::default(),
            record_decisions: false,
            decision_ns: Vec::new(),
            compute_limit: None,
            pool: Vec::new(),
            pool_hot: Vec::new(),
            pool_sampled: false,
            victims: Vec::new(),
            thresholding: false,
            frames: Vec::new(),
            touched: Vec::new(),
            regenerating: false,
            parked_evicted: Vec::new(),
            by_need: false,
            replayed: false,
            keeping: Keeping::Off,
            kept: Vec::new(),
            iter: IterationState::default(),
        }
        .with_recording()
    }

    /// Fail rematerializations with [`Error::ComputeLimit`] once first computations
    /// plus rematerializations exceed `ns` (thrash protection; `None`: no limit).
    pub fn set_compute_limit(&mut self, ns: Option<f64>) {
        self.compute_limit = ns;
    }

    /// Keep the duration of every eviction decision (see [`Runtime::decision_ns`]).
    pub fn record_decision_times(&mut self, on: bool) {
        self.record_decisions = on;
    }

    /// Durations in ns of the recorded decisions.
    pub fn decision_ns(&self) -> &[u32] {
        &self.decision_ns
    }

    /// The config.
    pub fn config(&self) -> &DtrConfig {
        &self.config
    }

    /// The work of the policy decisions so far: candidates offered plus the
    /// neighbour links their walks examined (the planner's measure of a
    /// simulation's cost; deterministic, unlike a clock).
    pub(crate) fn decision_work(&self) -> u64 {
        self.stats.candidates_offered + self.graph.walk_steps
    }

    /// Counters.
    pub fn stats(&self) -> &RuntimeStats {
        &self.stats
    }

    /// The memory model's figures.
    pub fn memory_usage(&self) -> MemoryUsage {
        let mut u = self.memory.usage();
        // Peaks of the memory models this one replaced (a plan's arena, a
        // defragmenting arena) count too.
        u.peak_allocated = u.peak_allocated.max(self.iter.retired_peaks.0);
        u.peak_reserved = u.peak_reserved.max(self.iter.retired_peaks.1);
        u
    }

    /// The memory model.
    pub fn memory(&self) -> &dyn MemoryModel {
        &*self.memory
    }

    /// Name of the configured policy (the one this runtime was built with or
    /// given), also while a thrash rescue runs another one until the
    /// iteration's boundary: what reports name.
    pub fn policy_name(&self) -> &'static str {
        match &self.iter.set_aside_policy {
            Some(configured) => configured.name(),
            None => self.policy.name(),
        }
    }

    /// Name of the policy deciding now: the configured one, or the rescue's
    /// (`msps`) while a losing iteration runs under it.
    pub fn active_policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Compute clock in ns (first computations plus rematerializations).
    pub fn clock(&self) -> f64 {
        self.graph.clock
    }

    /// Number of storage records (resident, evicted, fake-deleted).
    pub fn storage_count(&self) -> usize {
        self.graph.storages.len()
    }

    /// Number of current eviction candidates.
    pub fn candidate_count(&self) -> usize {
        self.graph.candidates.len()
    }

    // ----- tensors -------------------------------------------------------------

    fn tensor(&self, t: TensorId) -> Result<TensorRec> {
        match self.tensors.get(t.index) {
            Some(r) if self.generations[t.index as usize] == t.generation => Ok(*r),
            _ => Err(Error::UnknownTensor(t)),
        }
    }

    fn new_tensor(&mut self, storage: StorageId) -> TensorId {
        let index = self.tensors.insert(TensorRec { storage, refs: 1 });
        if self.generations.len() <= index as usize {
            self.generations.resize(index as usize + 1, 0);
        }
        let st = self.graph.st_mut(storage);
        st.handles += 1;
        st.tensors.push(index);
        let t = TensorId {
            index,
            generation: self.generations[index as usize],
        };
        self.on_new_tensor(t);
        t
    }

    /// The order in which a regeneration takes its inputs. Online: by slab
    /// index (what remat's published figures were measured with). Planned and in
    /// the planner's simulations: creation order (iteration, then sequence
    /// number), which, unlike reused slab indices, is the same in every
    /// iteration, so a plan's regenerations replay exactly.
    fn creation_key(&self, s: StorageId) -> (u32, u32, u32) {
        if self.iter.stable_order {
            let r = self.graph.st(s);
            (r.epoch, r.seq, s.0)
        } else {
            (0, 0, s.0)
        }
    }

    /// Sort storages into regeneration order and drop repeats.
    fn creation_order(&self, v: &mut Vec<StorageId>) {
        v.sort_unstable_by_key(|&s| self.creation_key(s));
        v.dedup();
    }

    /// The storage behind tensor `t`.
    pub fn storage_of(&self, t: TensorId) -> Result<StorageId> {
        Ok(self.tensor(t)?.storage)
    }

    /// Whether `t`'s storage is resident.
    pub fn is_resident(&self, t: TensorId) -> Result<bool> {
        Ok(self.graph.st(self.tensor(t)?.storage).is_resident())
    }

    /// A key that orders tensors by when their storages were made (iteration,
    /// then creation order within it). Unlike [`TensorId::index`] (slab slots
    /// are reused), a repeated program gives its tensors the same keys in every
    /// iteration: adapters that visit many tensors at once (a seal) sort by it so
    /// that their calls repeat, and a plan can be followed.
    pub fn creation_rank(&self, t: TensorId) -> Result<(u32, u32)> {
        let r = self.graph.st(self.tensor(t)?.storage);
        Ok((r.epoch, r.seq))
    }

    /// Bytes of `t`'s storage.
    pub fn bytes(&self, t: TensorId) -> Result<u64> {
        Ok(self.graph.st(self.tensor(t)?.storage).bytes)
    }

    /// Times `t`'s storage was rematerialized.
    pub fn recompute_count(&self, t: TensorId) -> Result<u32> {
        Ok(self.graph.st(self.tensor(t)?.storage).recomputes)
    }

    /// The value of `t`'s storage if resident (no regeneration, no use recorded).
    pub fn peek(&self, t: TensorId) -> Result<Option<&V>> {
        let s = self.tensor(t)?.storage;
        Ok(self.values[s.0 as usize].as_ref())
    }

    /// One more handle on `t` (a copy of the name); balance with [`Runtime::release`].
    pub fn retain(&mut self, t: TensorId) -> Result<()> {
        let rec = self.tensor(t)?;
        self.note(Call::Retain(t), &[]);
        self.tensors[t.index].refs += 1;
        self.graph.st_mut(rec.storage).handles += 1;
        Ok(())
    }

    // ----- put / apply / record -----------------------------------------------

    /// Bring external data in (an input or a parameter): placed in the budget,
    /// never evicted.
    pub fn put(&mut self, value: V, bytes: u64) -> Result<TensorId> {
        self.note(Call::Put { bytes }, &[]);
        let slot = self.place_all(&[bytes]).map(|mut v| v.remove(0));
        let slot = self.track(slot)?;
        let s = self.new_storage(bytes, Some(slot), None, 0, false, 0.0);
        self.values[s.0 as usize] = Some(value);
        Ok(self.new_tensor(s))
    }

    /// Run `op` on `inputs` through the runtime: hold the inputs (regenerating
    /// evicted ones), place the fresh outputs (evicting as needed), compute, release
    /// the inputs. Returns one tensor per output spec.
    pub fn apply(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        outputs: &[OutputSpec],
        cost_ns: u64,
    ) -> Result<Vec<TensorId>> {
        let r = self.apply_inner(op, inputs, outputs, cost_ns, None);
        self.track(r)
    }

    /// Register outputs the adapter already computed with `op` on `inputs` (the
    /// candle design: run the real op, then hand the result to the runtime).
    /// `values` holds one value per fresh output, in order.
    pub fn record(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        outputs: &[OutputSpec],
        values: Vec<V>,
        cost_ns: u64,
    ) -> Result<Vec<TensorId>> {
        let r = self.apply_inner(op, inputs, outputs, cost_ns, Some(values));
        self.track(r)
    }

    fn apply_inner(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        outputs: &[OutputSpec],
        cost_ns: u64,
        given: Option<Vec<V>>,
    ) -> Result<Vec<TensorId>> {
        let mut in_storages = Vec::with_capacity(inputs.len());
        for &t in inputs {
            in_storages.push(self.tensor(t)?.storage);
        }
        self.rescue_from_fragmentation()?;
        self.note(
            Call::Apply {
                name: op.name(),
                inputs,
                outputs,
                recomputable: op.recomputable(),
                cost_ns,
            },
            &in_storages,
        );
        let mut fresh = Vec::new();
        for (o, spec) in outputs.iter().enumerate() {
            match *spec {
                OutputSpec::Fresh { bytes } => fresh.push(bytes),
                OutputSpec::View { input } if input >= inputs.len() => {
                    return Err(Error::BadViewIndex {
                        output: o,
                        input,
                        inputs: inputs.len(),
                    })
                }
                OutputSpec::View { .. } => {}
            }
        }
        // Hold the inputs first, then apply the threshold: the threshold must
        // not evict what this op reads (an adapter that ran the op already
        // holds its values; evicting and regenerating them here would make a
        // chain of n ops cost n(n-1)/2 rematerializations).
        let mut unique = in_storages.clone();
        self.creation_order(&mut unique);
        self.hold(&unique)?;
        let result = match self.evict_to_threshold() {
            Ok(()) => self.place_and_compute(&op, &in_storages, &fresh, given),
            Err(e) => Err(e),
        };
        let now = self.graph.clock + cost_ns as f64;
        for &s in &unique {
            self.graph.st_mut(s).last_used = now;
            self.unpin_storage(s, true);
        }
        let (slots, values) = result?;
        self.graph.clock = now;
        self.stats.compute_ns += cost_ns as f64;
        self.graph.note_op_cost(cost_ns as f64, false);
        let recomputable = op.recomputable();
        let op_id = if fresh.is_empty() {
            None
        } else {
            let rec = OpRec {
                inputs: in_storages.clone(),
                unique_inputs: unique.clone(),
                outputs: Vec::with_capacity(fresh.len()),
                live_outputs: fresh.len() as u32,
                cost: cost_ns as f64,
            };
            let id = self.register_op(rec, op);
            for &s in &unique {
                self.graph.st_mut(s).users.push(id);
            }
            Some(id)
        };
        let mut fresh_ids = Vec::with_capacity(fresh.len());
        for (k, (slot, value)) in slots.into_iter().zip(values).enumerate() {
            let bytes = fresh[k];
            let s = self.new_storage(
                bytes,
                Some(slot),
                op_id,
                k as u32,
                recomputable,
                cost_ns as f64,
            );
            self.values[s.0 as usize] = Some(value);
            self.graph.st_mut(s).last_used = now;
            if let Some(id) = op_id {
                self.graph.ops[id.0].outputs.push(Some(s));
            }
            self.graph.offer(s);
            fresh_ids.push(s);
        }
        let mut out = Vec::with_capacity(outputs.len());
        let mut next_fresh = 0;
        for spec in outputs {
            let s = match *spec {
                OutputSpec::Fresh { .. } => {
                    next_fresh += 1;
                    fresh_ids[next_fresh - 1]
                }
                OutputSpec::View { input } => in_storages[input],
            };
            out.push(self.new_tensor(s));
        }
        Ok(out)
    }

    /// Run an in-place op: `op` computes new values for the inputs listed in
    /// `mutated` (one value each, in that order) from all inputs. Every tensor on a
    /// mutated storage sees the new value.
    ///
    /// The mutated storage keeps its memory (no allocation): the new value becomes a
    /// new *version* record that takes over the slot and the tensors, produced by
    /// `op` from the old version, which stays as an evicted record so readers of
    /// the old value can still be replayed. When the old version cannot be
    /// recomputed (external data, non-recomputable op) and compute paths still read
    /// it, the new value gets a fresh allocation instead (copy on write) — or,
    /// without a budget, those readers are detached.
    pub fn mutate(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        mutated: &[usize],
        cost_ns: u64,
    ) -> Result<()> {
        let r = self.mutate_inner(op, inputs, mutated, cost_ns);
        self.track(r)
    }

    fn mutate_inner(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        mutated: &[usize],
        cost_ns: u64,
    ) -> Result<()> {
        let mut in_storages = Vec::with_capacity(inputs.len());
        for &t in inputs {
            in_storages.push(self.tensor(t)?.storage);
        }
        self.note(
            Call::Mutate {
                name: op.name(),
                inputs,
                mutated,
                recomputable: op.recomputable(),
                cost_ns,
            },
            &in_storages,
        );
        let mut targets: Vec<StorageId> = Vec::new();
        for &k in mutated {
            let s = *in_storages.get(k).ok_or(Error::BadViewIndex {
                output: 0,
                input: k,
                inputs: inputs.len(),
            })?;
            if !targets.contains(&s) {
                targets.push(s);
            }
        }
        let mut unique = in_storages.clone();
        self.creation_order(&mut unique);
        if self.unbounded() {
            for &t in &targets {
                if !self.graph.st(t).recomputable && !self.graph.st(t).users.is_empty() {
                    self.detach_users(t)?;
                }
            }
        }
        self.hold(&unique)?;
        // Copy on write where the old version must stay readable and resident.
        let mut cow = Vec::new();
        for &t in &targets {
            let r = self.graph.st(t);
            let need_copy = !r.recomputable && !r.users.is_empty();
            cow.push(need_copy);
        }
        let cow_sizes: Vec<u64> = (targets.iter().zip(&cow))
            .filter(|(_, &c)| c)
            .map(|(&t, _)| self.graph.st(t).bytes)
            .collect();
        let mut slots: Vec<Option<Slot>> = Vec::new();
        let mut failed = None;
        match self.place_all(&cow_sizes) {
            Ok(placed) => {
                let mut placed = placed.into_iter();
                slots.extend(cow.iter().map(|&c| if c { placed.next() } else { None }));
            }
            Err(e) => failed = Some(e),
        }
        let values = if failed.is_none() {
            match self.compute_retrying(&op, &in_storages, 0) {
                Ok(v) if v.len() == targets.len() => Some(v),
                Ok(v) => {
                    failed = Some(Error::OutputCount {
                        op: op.name().to_string(),
                        got: v.len(),
                        expected: targets.len(),
                    });
                    None
                }
                Err(e) => {
                    failed = Some(e);
                    None
                }
            }
        } else {
            None
        };
        let now = self.graph.clock + cost_ns as f64;
        let (Some(values), None) = (values, failed.as_ref()) else {
            let e = failed.unwrap_or_else(|| Error::Internal("mutate failed".into()));
            self.free_slots(slots.into_iter().flatten().collect());
            for &s in &unique {
                self.unpin_storage(s, true);
            }
            return Err(e);
        };
        self.graph.clock = now;
        self.stats.compute_ns += cost_ns as f64;
        self.graph.note_op_cost(cost_ns as f64, false);
        let recomputable_op = op.recomputable();
        let rec = OpRec {
            inputs: in_storages.clone(),
            unique_inputs: Vec::new(),
            outputs: Vec::with_capacity(targets.len()),
            live_outputs: targets.len() as u32,
            cost: cost_ns as f64,
        };
        let id = self.register_op(rec, op);
        let mut all_recomputable = true;
        for (k, (value, slot)) in values.into_iter().zip(slots).enumerate() {
            let old = targets[k];
            let old_rec = self.graph.st(old);
            let recomputable = recomputable_op && old_rec.recomputable;
            all_recomputable &= recomputable;
            let bytes = old_rec.bytes;
            let slot = match slot {
                Some(slot) => slot,
                None => {
                    // Take over the old version's slot: it becomes an evicted record.
                    let r = self.graph.st_mut(old);
                    let slot = r
                        .slot
                        .take()
                        .ok_or_else(|| Error::Internal("mutated storage not resident".into()))?;
                    r.residency = Residency::Evicted;
                    self.values[old.0 as usize] = None;
                    self.stats.live_bytes -= bytes;
                    if self.memory.has_addresses() {
                        self.unmap_ptr(&slot);
                    }
                    self.graph.dsu_on_evict(old);
                    slot
                }
            };
            let new = self.new_storage(
                bytes,
                Some(slot),
                Some(id),
                k as u32,
                recomputable,
                cost_ns as f64,
            );
            self.values[new.0 as usize] = Some(value);
            self.graph.ops[id.0].outputs.push(Some(new));
            // Move the tensors (and their handles) to the new version.
            let tensors = std::mem::take(&mut self.graph.st_mut(old).tensors);
            let handles = std::mem::replace(&mut self.graph.st_mut(old).handles, 0);
            for &ti in &tensors {
                self.tensors[ti].storage = new;
            }
            let nr = self.graph.st_mut(new);
            nr.tensors = tensors;
            nr.handles = handles;
            nr.last_used = now;
            self.graph.st_mut(old).released = true;
        }
        if all_recomputable {
            self.graph.ops[id.0].unique_inputs = unique.clone();
            for &s in &unique {
                self.graph.st_mut(s).users.push(id);
            }
        } else {
            // Not replayable: it reads nothing as far as regeneration goes.
            self.graph.ops[id.0].inputs.clear();
        }
        for &s in &unique {
            if self.graph.st(s).is_resident() {
                self.graph.st_mut(s).last_used = now;
            }
            self.unpin_storage(s, true);
        }
        let news: Vec<StorageId> = self.graph.ops[id.0]
            .outputs
            .iter()
            .flatten()
            .copied()
            .collect();
        for s in news {
            self.graph.offer(s);
        }
        // Old versions nobody reads any more go for real.
        for &t in &targets {
            if self
                .graph
                .storages
                .get(t.0)
                .is_some_and(|r| r.released && r.users.is_empty() && r.pins == 0)
            {
                self.delete_cascade(t)?;
            }
        }
        Ok(())
    }

    /// Place `fresh` outputs and obtain their values (compute, or the given ones).
    #[allow(clippy::type_complexity)]
    fn place_and_compute(
        &mut self,
        op: &Arc<dyn OpHandle<V>>,
        inputs: &[StorageId],
        fresh: &[u64],
        given: Option<Vec<V>>,
    ) -> Result<(Vec<Slot>, Vec<V>)> {
        let slots = self.place_all(fresh)?;
        let values = match given {
            Some(v) => Ok(v),
            None => {
                let hint = fresh.iter().sum();
                self.compute_retrying(op, inputs, hint)
            }
        };
        self.outputs_or_free(op.name(), values, fresh.len(), slots)
    }

    /// The `result` of op `name`, which must give `expected` values for
    /// `slots`: the slots and the values, or the error (a wrong count is
    /// [`Error::OutputCount`]) with the slots freed.
    fn outputs_or_free(
        &mut self,
        name: &str,
        result: Result<Vec<V>>,
        expected: usize,
        slots: Vec<Slot>,
    ) -> Result<(Vec<Slot>, Vec<V>)> {
        match result {
            Ok(v) if v.len() == expected => Ok((slots, v)),
            Ok(v) => {
                self.free_slots(slots);
                Err(Error::OutputCount {
                    op: name.to_string(),
                    got: v.len(),
                    expected,
                })
            }
            Err(e) => {
                self.free_slots(slots);
                Err(e)
            }
        }
    }

    fn free_slots(&mut self, slots: Vec<Slot>) {
        for slot in slots {
            // Best effort on an error path: the slot was just handed out.
            let _ = self.memory.free(slot);
        }
    }

    fn new_storage(
        &mut self,
        bytes: u64,
        slot: Option<Slot>,
        producer: Option<OpId>,
        output_index: u32,
        recomputable: bool,
        cost: f64,
    ) -> StorageId {
        let resident = slot.is_some();
        let ptr = slot.as_ref().filter(|s| s.size > 0).map(|s| s.ptr);
        let idx = self.graph.storages.insert(StorageRec {
            bytes,
            residency: if resident {
                Residency::Resident
            } else {
                Residency::Evicted
            },
            slot,
            producer,
            output_index,
            users: Vec::new(),
            handles: 0,
            tensors: Vec::new(),
            pins: 0,
            holds: 0,
            last_used: self.graph.clock,
            recomputes: 0,
            dsu: NONE,
            cand_pos: NONE,
            released: false,
            recomputable: recomputable && producer.is_some(),
            cost,
            stamp: 0,
            seq: self.iter.next_seq(),
            epoch: self.iter.epoch,
        });
        let s = StorageId(idx);
        if self.graph.st(s).seq != NONE {
            self.iter.seq_storages.push(s);
        }
        if let Some(ptr) = ptr {
            self.map_ptr(ptr, s);
        }
        if self.values.len() <= idx as usize {
            self.values.resize_with(idx as usize + 1, || None);
        }
        if resident {
            self.stats.live_bytes += bytes;
            self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
        }
        s
    }

    // ----- access / pin / release / evict -------------------------------------

    /// The value of `t`, regenerating its storage if evicted; records a use.
    pub fn access(&mut self, t: TensorId) -> Result<&V> {
        let s = self.tensor(t)?.storage;
        self.note(Call::Access(t), &[s]);
        let held = self.hold(&[s]);
        self.track(held)?;
        self.graph.st_mut(s).last_used = self.graph.clock;
        self.unpin_storage(s, true);
        self.values[s.0 as usize]
            .as_ref()
            .ok_or_else(|| Error::Internal("accessed storage is not resident".into()))
    }

    /// Make `t` resident and keep it so until [`Runtime::unpin`] (for handing it to
    /// code outside the runtime).
    pub fn pin(&mut self, t: TensorId) -> Result<()> {
        let s = self.tensor(t)?.storage;
        self.note(Call::Pin(t), &[s]);
        let held = self.hold(&[s]);
        self.track(held)?;
        self.graph.st_mut(s).holds -= 1;
        Ok(())
    }

    /// Undo one [`Runtime::pin`].
    pub fn unpin(&mut self, t: TensorId) -> Result<()> {
        let s = self.tensor(t)?.storage;
        let r = self.graph.st(s);
        if r.pins <= r.holds {
            return Err(Error::NotPinned(t));
        }
        self.note(Call::Unpin(t), &[]);
        self.unpin_storage(s, false);
        Ok(())
    }

    /// Evict `t`'s storage now if it can be (resident, recomputable, unpinned).
    pub fn evict(&mut self, t: TensorId) -> Result<bool> {
        let s = self.tensor(t)?.storage;
        self.note(Call::Evict(t), &[]);
        if self.graph.eligible(s) || {
            let r = self.graph.st(s);
            r.is_resident() && r.recomputable && r.pins == 0
        } {
            self.evict_storage(s, false)?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Drop one handle on `t`. When no handle on its storage remains: a fake
    /// delete (free the memory, keep the record) while compute paths that may
    /// be replayed still read it, else a real delete that cascades to inputs
    /// nothing needs any more.
    pub fn release(&mut self, t: TensorId) -> Result<()> {
        let rec = self.tensor(t)?;
        self.note(Call::Release(t), &[]);
        let tr = &mut self.tensors[t.index];
        tr.refs -= 1;
        let gone = tr.refs == 0;
        if gone {
            self.on_tensor_gone(t);
            self.tensors.remove(t.index);
            self.generations[t.index as usize] = self.generations[t.index as usize].wrapping_add(1);
        }
        let s = rec.storage;
        let st = self.graph.st_mut(s);
        if gone {
            if let Some(p) = st.tensors.iter().position(|x| *x == t.index) {
                st.tensors.swap_remove(p);
            }
        }
        st.handles -= 1;
        if st.handles == 0 {
            st.released = true;
            if st.pins == 0 {
                self.settle_released(s, true)?;
            }
        }
        Ok(())
    }

    /// A released storage with no pins: delete it when nothing reads it, else
    /// (when `eager`) fake-delete it.
    fn settle_released(&mut self, s: StorageId, eager: bool) -> Result<()> {
        let r = self.graph.st(s);
        if eager && !r.users.is_empty() && !r.recomputable && self.unbounded() {
            // Nothing is ever evicted without a budget: readers need not be
            // replayable, so detach them and free the data now.
            self.detach_users(s)?;
        }
        let Some(r) = self.graph.storages.get(s.0) else {
            return Ok(()); // deleted by the cascade of a detached reader
        };
        if r.users.is_empty() {
            self.delete_cascade(s)
        } else if eager && r.is_resident() && r.recomputable {
            self.evict_storage(s, true)
        } else {
            self.graph.offer(s);
            Ok(())
        }
    }

    /// Note that `s` lives at `ptr` (a block of more than 0 bytes), unless the
    /// map is stale (see [`Runtime::refresh_by_ptr`]).
    fn map_ptr(&mut self, ptr: u64, s: StorageId) {
        if !self.by_ptr_stale && self.memory.has_addresses() {
            self.by_ptr.insert(ptr, s);
        }
    }

    fn unmap_ptr(&mut self, slot: &Slot) {
        if self.by_ptr_stale {
            return;
        }
        if slot.size > 0 && self.by_ptr.get(&slot.ptr).is_some() {
            self.by_ptr.remove(&slot.ptr);
        }
    }

    /// Make `by_ptr` current before reading it: rebuilt if stale, it holds
    /// every resident storage whose slot has more than 0 bytes, under models
    /// with addresses (what the map holds when kept up to date).
    fn refresh_by_ptr(&mut self) {
        if self.by_ptr_stale {
            self.by_ptr = self.derived_by_ptr();
            self.by_ptr_stale = false;
        }
    }

    /// `by_ptr` as the resident slots define it.
    fn derived_by_ptr(&self) -> AHashMap<u64, StorageId> {
        if !self.memory.has_addresses() {
            return AHashMap::new();
        }
        (self.graph.storages.iter())
            .filter_map(|(i, r)| r.slot.as_ref().map(|slot| (slot, StorageId(i))))
            .filter(|(slot, _)| slot.size > 0)
            .map(|(slot, s)| (slot.ptr, s))
            .collect()
    }

    /// No budget and no threshold: eviction never happens on its own.
    fn unbounded(&self) -> bool {
        self.memory.capacity().is_none() && self.config.threshold.is_none()
    }

    /// MegEngine's `detach_users`, without regenerating dead records: every compute
    /// path reading `s` stops reading it; its outputs become non-recomputable. A
    /// live output that is evicted is regenerated first; an evicted output nobody
    /// holds (a fake-deleted record) is detached in turn (work list) and deleted.
    fn detach_users(&mut self, s: StorageId) -> Result<()> {
        let mut work = vec![s];
        let mut dead = Vec::new();
        while let Some(x) = work.pop() {
            let Some(xr) = self.graph.storages.get_mut(x.0) else {
                continue;
            };
            let users = std::mem::take(&mut xr.users);
            for op in users {
                let outs: Vec<StorageId> = self.graph.ops[op.0]
                    .outputs
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                for o in outs {
                    let r = self.graph.st(o);
                    if !r.is_resident() {
                        if r.released {
                            work.push(o);
                            dead.push(o);
                        } else {
                            self.hold(&[o])?;
                            self.unpin_storage(o, true);
                        }
                    }
                    self.graph.withdraw(o);
                    self.graph.st_mut(o).recomputable = false;
                }
                // The op stays as its outputs' producer record but reads nothing.
                let inputs = std::mem::take(&mut self.graph.ops[op.0].unique_inputs);
                self.graph.ops[op.0].inputs.clear();
                for i in inputs {
                    let Some(ir) = self.graph.storages.get_mut(i.0) else {
                        continue;
                    };
                    if let Some(p) = ir.users.iter().position(|u| *u == op) {
                        ir.users.swap_remove(p);
                    }
                    if i != s && ir.released && ir.users.is_empty() && ir.pins == 0 {
                        dead.push(i);
                    }
                }
            }
        }
        for d in dead {
            if d != s {
                self.delete_cascade(d)?;
            }
        }
        Ok(())
    }

    fn unpin_storage(&mut self, s: StorageId, hold: bool) {
        let r = self.graph.st_mut(s);
        r.pins -= 1;
        if hold {
            r.holds -= 1;
        }
        if r.pins == 0 {
            if r.released {
                // Errors here are memory-model failures on free: surface later via
                // invariants; nothing to undo for the caller.
                let _ = self.settle_released(s, false);
            } else {
                self.graph.offer(s);
            }
        }
    }

    fn evict_storage(&mut self, s: StorageId, fake_delete: bool) -> Result<()> {
        self.graph.withdraw(s);
        let r = self.graph.st_mut(s);
        let slot = r.slot.take();
        r.residency = Residency::Evicted;
        let bytes = r.bytes;
        self.values[s.0 as usize] = None;
        self.stats.live_bytes -= bytes;
        if fake_delete {
            self.stats.fake_deletes += 1;
        } else {
            self.stats.evictions += 1;
        }
        if let Some(slot) = slot {
            if self.memory.has_addresses() {
                self.unmap_ptr(&slot);
            }
            self.memory.free(slot).map_err(Error::Memory)?;
        }
        self.graph.dsu_on_evict(s);
        tracing::trace!(target: "remat_dtr::evict", storage = s.0, bytes, "evict");
        Ok(())
    }

    /// Real delete of released storages nothing reads, cascading to inputs.
    fn delete_cascade(&mut self, first: StorageId) -> Result<()> {
        let mut work = vec![first];
        while let Some(s) = work.pop() {
            let Some(r) = self.graph.storages.get(s.0) else {
                continue;
            };
            if !(r.released && r.users.is_empty() && r.pins == 0) {
                continue;
            }
            self.graph.withdraw(s);
            let r = self
                .graph
                .storages
                .remove(s.0)
                .ok_or_else(|| Error::Internal("vanished".into()))?;
            self.values[s.0 as usize] = None;
            if let Some(slot) = r.slot {
                self.stats.live_bytes -= r.bytes;
                if self.memory.has_addresses() {
                    self.unmap_ptr(&slot);
                }
                self.memory.free(slot).map_err(Error::Memory)?;
            }
            if let Some(op) = r.producer {
                self.drop_output(op, r.output_index, &mut work)?;
            }
        }
        Ok(())
    }

    /// Output `index` of compute path `op` is gone (deleted or made a root). When
    /// it was the last, the path goes too: it stops reading its inputs, and inputs
    /// that are released and read by nothing else are pushed on `dead`.
    fn drop_output(&mut self, op: OpId, index: u32, dead: &mut Vec<StorageId>) -> Result<()> {
        let o = &mut self.graph.ops[op.0];
        o.outputs[index as usize] = None;
        o.live_outputs -= 1;
        if o.live_outputs > 0 {
            return Ok(());
        }
        let o = self
            .graph
            .ops
            .remove(op.0)
            .ok_or_else(|| Error::Internal("op vanished".into()))?;
        self.handles[op.0 as usize] = None;
        for i in o.unique_inputs {
            let ir = self.graph.st_mut(i);
            if let Some(p) = ir.users.iter().position(|u| *u == op) {
                ir.users.swap_remove(p);
            }
            if ir.released && ir.users.is_empty() && ir.pins == 0 {
                dead.push(i);
            }
        }
        Ok(())
    }

    /// Cut `t`'s storage from its history: make it resident (regenerating it if
    /// evicted) and turn it into external data, like a [`Runtime::put`] — never
    /// evicted again. Its compute path forgets it; a path left without outputs is
    /// deleted, and released storages that only it still read are freed (the real
    /// delete cascade). Returns `false` when the storage was external already.
    ///
    /// For tensors that outlive a training step (parameters, optimizer state):
    /// without it their lineage, and the evicted records it keeps, grows with
    /// every step.
    pub fn make_root(&mut self, t: TensorId) -> Result<bool> {
        let s = self.tensor(t)?.storage;
        self.note(Call::MakeRoot(t), &[]);
        self.root_storage(s)
    }

    /// [`Runtime::make_root`] for every tensor of `ts` in one call (a training
    /// step's seal: parameters and optimizer state). Resident storages go first
    /// (rooting them needs no memory and frees the lineage only they kept, which
    /// leaves room to regenerate the rest), then the evicted ones, each group in
    /// the caller's order. One call whatever the residency, so a step's seal
    /// repeats exactly and a plan can be followed through it. Returns how many
    /// storages were cut (not external already).
    pub fn make_roots(&mut self, ts: &[TensorId]) -> Result<usize> {
        let mut storages = Vec::with_capacity(ts.len());
        for &t in ts {
            storages.push(self.tensor(t)?.storage);
        }
        self.note(Call::MakeRoots(ts), &[]);
        let mut order: Vec<(bool, StorageId)> = storages
            .into_iter()
            .map(|s| (!self.graph.st(s).is_resident(), s))
            .collect();
        // Stable: the caller's order within each group.
        order.sort_by_key(|&(evicted, _)| evicted);
        let mut cut = 0;
        for (_, s) in order {
            // A storage named twice is external after its first cut.
            if self.root_storage(s)? {
                cut += 1;
            }
        }
        Ok(cut)
    }

    fn root_storage(&mut self, s: StorageId) -> Result<bool> {
        let Some(op) = self.graph.st(s).producer else {
            return Ok(false);
        };
        let held = self.hold(&[s]);
        self.track(held)?;
        let r = self.graph.st_mut(s);
        r.holds -= 1;
        r.pins -= 1;
        r.producer = None;
        r.recomputable = false;
        r.cost = 0.0;
        let index = r.output_index;
        self.graph.withdraw(s);
        let mut dead = Vec::new();
        self.drop_output(op, index, &mut dead)?;
        for d in dead {
            self.delete_cascade(d)?;
        }
        tracing::trace!(target: "remat_dtr::root", storage = s.0, "make_root");
        Ok(true)
    }

    /// Evict policy-chosen storages until at least `bytes` of resident storage
    /// are freed or nothing evictable is left; returns the bytes freed.
    ///
    /// For adapters whose real allocations happen outside the runtime (an op
    /// that ran out of device memory before its outputs were recorded): free
    /// memory, then run the op again. Pinned and non-recomputable storages are
    /// never evicted.
    pub fn free_up(&mut self, bytes: u64) -> Result<u64> {
        let start = self.stats.live_bytes;
        while start.saturating_sub(self.stats.live_bytes) < bytes {
            let req = Request {
                bytes,
                shape: Some(self.memory.shape(bytes)),
                free_bytes: self.memory.free_bytes(),
            };
            if !self.evict_some(req)? && !self.evict_parked()? {
                break;
            }
        }
        Ok(start.saturating_sub(self.stats.live_bytes))
    }

    /// An op failed because the real device ran out of memory: count it, and
    /// evict at least `hint` bytes (one storage when `hint` is 0) with
    /// [`Runtime::free_up`]. Returns the bytes freed; 0 means nothing is left to
    /// evict and retrying is pointless (report [`Error::DeviceOutOfMemory`] with
    /// [`Runtime::memory_report`]).
    pub fn recover_from_device_oom(&mut self, hint: u64) -> Result<u64> {
        self.stats.device_oom_retries += 1;
        self.free_up(hint.max(1))
    }

    /// Threshold mode: evict while the resident bytes exceed the threshold (the
    /// storages held by the op being placed are not candidates).
    fn evict_to_threshold(&mut self) -> Result<()> {
        let Some(threshold) = self.config.threshold else {
            return Ok(());
        };
        self.thresholding = true;
        let mut result = Ok(());
        while self.stats.live_bytes > threshold {
            let req = Request {
                bytes: 0,
                shape: None,
                free_bytes: self.memory.free_bytes(),
            };
            match self.evict_some(req) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.thresholding = false;
        result
    }

    /// Set (or clear) the byte threshold: before each op, evict while resident
    /// bytes exceed it. Adapters lower it when the real device holds memory the
    /// model does not see (see the candle adapter's calibration).
    pub fn set_threshold(&mut self, bytes: Option<u64>) {
        self.config.threshold = bytes;
    }

    // ----- eviction ------------------------------------------------------------

    /// Place allocations of `sizes` bytes together (the outputs of one op),
    /// evicting as needed. When no eviction can place them under a physical
    /// budget that the working set fits, the runtime moves into a compacting
    /// arena ([`Runtime::fall_back_to_arena`]) and places them again. On error
    /// nothing stays allocated.
    fn place_all(&mut self, sizes: &[u64]) -> Result<Vec<Slot>> {
        let (mut fell_back, mut compacted) = (false, false);
        loop {
            let mut slots = Vec::with_capacity(sizes.len());
            let mut failed = None;
            for &bytes in sizes {
                match self.make_room(bytes) {
                    Ok(slot) => slots.push(slot),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let Some(e) = failed else {
                return Ok(slots);
            };
            let in_flight = !slots.is_empty();
            self.free_slots(slots);
            if !matches!(e, Error::ImpossibleBudget(_)) {
                return Err(e);
            }
            if !fell_back && self.fall_back_to_arena(sizes)? {
                fell_back = true;
                continue;
            }
            // The group's own first allocations may split the free space a
            // compaction cannot join (blocks in flight do not move): freed now,
            // compact once and place the group again.
            if in_flight && !compacted && self.defragment()? {
                compacted = true;
                continue;
            }
            return Err(e);
        }
    }

    /// Place `bytes`, evicting while the memory model says there is no room.
    fn make_room(&mut self, bytes: u64) -> Result<Slot> {
        if self.iter.following {
            if let Some(slot) = self.planned_alloc(bytes)? {
                self.iter.allocs += 1;
                return Ok(slot);
            }
        }
        let mut first = true;
        let mut defragged = false;
        loop {
            match self.memory.allocate(bytes) {
                Ok(slot) => {
                    self.iter.allocs += 1;
                    return Ok(slot);
                }
                Err(AllocFailure::Other(m)) => return Err(Error::Memory(m)),
                Err(AllocFailure::NoRoom { free_bytes }) => {
                    // Enough free bytes, in pieces: defragment and retry (once
                    // per eviction round).
                    if !defragged && free_bytes >= self.memory.shape(bytes).block {
                        defragged = true;
                        if self.defragment()? {
                            continue;
                        }
                    }
                    defragged = false;
                    if first {
                        self.note_fragmentation(bytes, free_bytes);
                        first = false;
                        self.stats.evicting_allocations += 1;
                        self.stats.free_at_failure_bytes += free_bytes as f64;
                        if let Some(f) = self.memory.free_by_pool() {
                            let by_pool = &mut self.stats.free_at_failure_by_pool;
                            by_pool[0] += f.small_pool as f64;
                            by_pool[1] += f.large_pool as f64;
                            by_pool[2] += f.unreserved as f64;
                        }
                    }
                    self.stats.oom_retries += 1;
                    tracing::trace!(target: "remat_dtr::oom", bytes, free_bytes, "allocation failed; evicting");
                    let req = Request {
                        bytes,
                        shape: Some(self.memory.shape(bytes)),
                        free_bytes,
                    };
                    if !self.evict_some(req)? && !self.evict_parked()? {
                        self.log_step(StepKind::Fail);
                        return Err(self.impossible(bytes));
                    }
                }
            }
        }
    }

    #[cold]
    fn impossible(&self, needed: u64) -> Error {
        let report = self.memory_report(needed);
        tracing::debug!(target: "remat_dtr::oom", %report, "impossible budget");
        Error::ImpossibleBudget(Box::new(report))
    }

    /// Where the resident bytes are now (resident, evictable, pinned, not
    /// recomputable, below the minimum evictee, free but fragmented), for a
    /// request of `needed` bytes: the figures of an impossible budget.
    pub fn memory_report(&self, needed: u64) -> ImpossibleBudget {
        let usage = self.memory.usage();
        let resident = self.stats.live_bytes;
        let evictable = self.graph.candidate_bytes;
        let (mut pinned, mut not_recomputable, mut below_min) = (0u64, 0u64, 0u64);
        for (_, r) in self.graph.storages.iter() {
            if !r.is_resident() {
                continue;
            }
            if !r.recomputable {
                not_recomputable += r.bytes;
            } else if r.pins > 0 {
                pinned += r.bytes;
            } else if r.cand_pos == NONE {
                below_min += r.bytes;
            }
        }
        let budget = usage.capacity.unwrap_or(u64::MAX);
        let block = self.memory.shape(needed).block;
        let cause = if block > budget {
            ImpossibleCause::RequestExceedsBudget
        } else if usage.allocated.saturating_add(block) > budget {
            if resident.saturating_add(needed) <= budget && usage.allocated > resident {
                ImpossibleCause::Rounding
            } else {
                ImpossibleCause::WorkingSetExceedsBudget
            }
        } else {
            ImpossibleCause::Fragmentation
        };
        ImpossibleBudget {
            cause,
            needed,
            budget,
            resident,
            evictable,
            pinned,
            not_recomputable,
            below_min_evictee: below_min,
            free_but_fragmented: self.memory.free_bytes(),
        }
    }

    /// Fill the decision pool: all candidates or a seeded ⌈√N⌉ sample, without
    /// those under 1 % of the mean candidate size when filtering.
    fn fill_pool(&mut self) {
        self.pool.clear();
        self.pool_hot.clear();
        let cands = &self.graph.candidates;
        let n = cands.len();
        if n == 0 {
            return;
        }
        let threshold = if self.config.filter {
            self.graph.candidate_bytes / n as u64 / 100
        } else {
            0
        };
        let hot = &self.graph.hot;
        self.pool_sampled = self.config.sampling && n > self.policy.whole_pool_up_to();
        if self.pool_sampled {
            let k = (n as f64).sqrt().ceil() as usize;
            for _ in 0..k {
                let i = self.rng.below(n);
                if hot[i].bytes >= threshold {
                    self.pool.push(cands[i]);
                    self.pool_hot.push(hot[i]);
                }
            }
        } else {
            for (i, &s) in cands.iter().enumerate() {
                if hot[i].bytes >= threshold {
                    self.pool.push(s);
                    self.pool_hot.push(hot[i]);
                }
            }
        }
        if self.pool.is_empty() {
            self.pool.extend(cands.iter().take(64));
            self.pool_hot.extend(hot.iter().take(64));
        }
        if self.thresholding {
            self.keep_threshold_evictable();
        }
    }

    /// Threshold trigger: keep the pool's storages whose eviction keeps their
    /// evicted region small; when the sample holds none, scan every candidate.
    fn keep_threshold_evictable(&mut self) {
        let mut k = 0;
        for i in 0..self.pool.len() {
            if self.graph.threshold_evictable(self.pool[i]) {
                self.pool.swap(k, i);
                self.pool_hot.swap(k, i);
                k += 1;
            }
        }
        self.pool.truncate(k);
        self.pool_hot.truncate(k);
        if k == 0 {
            for i in 0..self.graph.candidates.len() {
                let s = self.graph.candidates[i];
                if self.graph.threshold_evictable(s) {
                    self.pool.push(s);
                    self.pool_hot.push(self.graph.hot[i]);
                }
            }
        }
    }

    /// Ask the policy which storages it would evict to place `bytes` now, without
    /// evicting (a dry run: benches, debugging). Advances the sampler. The slice
    /// lives until the next call that decides or evicts.
    pub fn decide(&mut self, bytes: u64) -> &[StorageId] {
        let request = Request {
            bytes,
            shape: Some(self.memory.shape(bytes)),
            free_bytes: self.memory.free_bytes(),
        };
        self.choose_victims(request);
        &self.victims
    }

    /// Fill the pool and let the policy put its victims for `request` in
    /// `self.victims` (nothing is evicted).
    fn choose_victims(&mut self, request: Request) {
        self.refresh_by_ptr();
        let defragmenting = self.defragmenting();
        self.fill_pool();
        self.victims.clear();
        if self.pool.is_empty() {
            return;
        }
        let mut view = DecisionView {
            graph: &mut self.graph,
            memory: &*self.memory,
            pool: &self.pool,
            pool_hot: &self.pool_hot,
            by_ptr: &self.by_ptr,
            request,
            defragmenting,
            sampled: self.pool_sampled,
        };
        self.policy.choose(&mut view, &mut self.victims);
    }

    /// One policy decision and its evictions. `false` when nothing is evictable.
    #[cold]
    fn evict_some(&mut self, request: Request) -> Result<bool> {
        if self.graph.candidates.is_empty() {
            return Ok(false);
        }
        let start = Instant::now();
        self.choose_victims(request);
        let elapsed = start.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        self.stats.decisions += 1;
        self.stats.candidates_offered += self.pool.len() as u64;
        if self.record_decisions {
            self.decision_ns.push(elapsed);
        }
        let mut victims = std::mem::take(&mut self.victims);
        victims.retain(|s| {
            self.graph
                .storages
                .get(s.0)
                .is_some_and(|r| r.cand_pos != NONE)
        });
        victims.dedup();
        if victims.is_empty() {
            // The policy gave nothing usable: least recently used of the pool.
            let g = &self.graph;
            if let Some(&s) = self
                .pool
                .iter()
                .min_by(|a, b| g.st(**a).last_used.total_cmp(&g.st(**b).last_used))
            {
                victims.push(s);
            }
        }
        let mut evicted = false;
        for &s in &victims {
            // Under the threshold trigger, an earlier victim may have grown this
            // one's region: checked at each eviction.
            if self.graph.st(s).cand_pos != NONE
                && (!self.thresholding || self.graph.threshold_evictable(s))
            {
                self.log_eviction(s, false);
                self.evict_storage(s, false)?;
                evicted = true;
            }
        }
        self.victims = victims;
        Ok(evicted || !self.thresholding)
    }

    // ----- invariants ----------------------------------------------------------

    /// Walk every record and check the invariants (tests call it after each step).
    pub fn check_invariants(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Internal(m));
        let mut live = 0u64;
        let mut cand_bytes = 0u64;
        for (i, r) in self.graph.storages.iter() {
            let s = StorageId(i);
            let has_value = self.values[i as usize].is_some();
            if r.is_resident() != r.slot.is_some() || r.is_resident() != has_value {
                return bad(format!(
                    "{s:?}: residency {:?}, slot {}, value {has_value}",
                    r.residency,
                    r.slot.is_some()
                ));
            }
            if r.is_resident() {
                live += r.bytes;
            }
            if r.holds != 0 {
                return bad(format!("{s:?}: {} holds outside a call", r.holds));
            }
            let should = self.graph.eligible(s);
            if should != (r.cand_pos != NONE) {
                return bad(format!(
                    "{s:?}: eligible {should} but cand_pos {}",
                    r.cand_pos
                ));
            }
            if r.cand_pos != NONE {
                cand_bytes += r.bytes;
                if self.graph.candidates.get(r.cand_pos as usize) != Some(&s) {
                    return bad(format!("{s:?}: candidate position mismatch"));
                }
                let h = self.graph.hot[r.cand_pos as usize];
                if h.bytes != r.bytes || h.cost != r.cost || h.last_used != r.last_used {
                    return bad(format!("{s:?}: stale hot fields {h:?}"));
                }
            }
            if r.released && r.handles != 0 {
                return bad(format!("{s:?}: released with {} handles", r.handles));
            }
            if r.residency == Residency::Evicted && r.dsu == NONE {
                return bad(format!("{s:?}: evicted without a union-find node"));
            }
            for u in &r.users {
                match self.graph.ops.get(u.0) {
                    Some(o) if o.unique_inputs.contains(&s) => {}
                    _ => return bad(format!("{s:?}: user {u:?} does not read it")),
                }
            }
            if let Some(op) = r.producer {
                match self.graph.ops.get(op.0) {
                    Some(o) if o.outputs.get(r.output_index as usize) == Some(&Some(s)) => {}
                    _ => return bad(format!("{s:?}: producer {op:?} does not list it")),
                }
            }
        }
        if live != self.stats.live_bytes {
            return bad(format!(
                "live bytes {live} != counter {}",
                self.stats.live_bytes
            ));
        }
        if cand_bytes != self.graph.candidate_bytes {
            return bad(format!(
                "candidate bytes {cand_bytes} != counter {}",
                self.graph.candidate_bytes
            ));
        }
        let mut handles: AHashMap<u32, u32> = AHashMap::new();
        for (_, t) in self.tensors.iter() {
            *handles.entry(t.storage.0).or_default() += t.refs;
        }
        for (i, r) in self.graph.storages.iter() {
            if handles.get(&i).copied().unwrap_or(0) != r.handles {
                return bad(format!(
                    "storage {i}: handle count {} != recount",
                    r.handles
                ));
            }
        }
        for (i, o) in self.graph.ops.iter() {
            for s in &o.unique_inputs {
                match self.graph.storages.get(s.0) {
                    Some(r) if r.users.contains(&OpId(i)) => {}
                    _ => return bad(format!("op {i}: input {s:?} does not list it as user")),
                }
            }
            if o.outputs.iter().flatten().count() as u32 != o.live_outputs {
                return bad(format!("op {i}: live output count"));
            }
        }
        if !self.by_ptr_stale && self.by_ptr != self.derived_by_ptr() {
            return bad(format!(
                "by_ptr holds {} entries, the resident slots {}",
                self.by_ptr.len(),
                self.derived_by_ptr().len()
            ));
        }
        // Blocks never overlap, whatever the model keeps them in (the arena's
        // map or its planned live flags), nor do the resident storages' slots.
        self.memory.check_blocks().map_err(Error::Internal)?;
        if self.memory.has_addresses() {
            let mut slots: Vec<(u64, u64)> = (self.graph.storages.iter())
                .filter_map(|(_, r)| r.slot.as_ref())
                .filter(|slot| slot.size > 0)
                .map(|slot| (slot.ptr, slot.size))
                .collect();
            slots.sort_unstable();
            if let Some(w) = slots.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
                return bad(format!("slots {:?} and {:?} overlap", w[0], w[1]));
            }
        }
        Ok(())
    }
}

/// The memory model [`Runtime::new`] uses for `config`: a physical budget (a
/// remat-alloc caching allocator with the config's allocator settings over a
/// simulated device of the budget's capacity), else a [`LogicalBudget`]
/// (unbounded when there is no budget).
pub fn memory_model(config: &DtrConfig) -> Result<Box<dyn MemoryModel>> {
    Ok(match (config.budget_mode, config.budget) {
        (BudgetMode::Physical, Some(b)) => Box::new(crate::physical::PhysicalBudget::with_config(
            b,
            config.physical_allocator(),
        )?),
        (_, budget) => Box::new(LogicalBudget::new(budget)),
    })
}

impl<V> Runtime<V> {
    /// Inserts an op record and keeps its handle at the same index.
    fn register_op(&mut self, rec: OpRec, op: Arc<dyn OpHandle<V>>) -> OpId {
        let id = OpId(self.graph.ops.insert(rec));
        let i = id.0 as usize;
        if self.handles.len() <= i {
            self.handles.resize_with(i + 1, || None);
        }
        self.handles[i] = Some(op);
        id
    }
}
