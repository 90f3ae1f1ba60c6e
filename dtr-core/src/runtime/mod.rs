//! [`Runtime`]: the DTR interpreter — put, apply, record, access, release, pin,
//! unpin, evict — over a [`MemoryModel`] and an [`EvictionPolicy`].
//!
//! Modules, each an `impl` block of [`Runtime`] for one idea:
//! - `evict` places allocations under the budget: the decision pool, the
//!   policy's choice, the evictions, the figures of an impossible budget;
//! - `regen` makes evicted storages resident again (the work list behind
//!   every read of an evicted value);
//! - `delete` frees released storages (fake and real deletes, the cascade to
//!   inputs) and cuts storages from their history (`make_root`);
//! - `iteration` records iterations, plans the next one at each boundary and
//!   follows the plan;
//! - `mutate` runs in-place ops: a new version of each mutated storage;
//! - `swap` moves storages to the host tier and back, and chooses between
//!   swapping and evicting each victim ([`crate::swap`]);
//! - `invariants` checks every record against the counters and indexes.
//!
//! This file keeps the state, construction and the calls a framework makes
//! (put, apply, mutate, access, pin, release).

use std::sync::Arc;

use ahash::AHashMap;

mod delete;
mod evict;
mod invariants;
mod iteration;
mod mutate;
mod regen;
mod regen_order;
mod swap;

use crate::config::{BudgetMode, DtrConfig};
use crate::error::{Error, Result};
use crate::graph::{Graph, Hot, OpRec, Residency, StorageRec, NONE};
use crate::ids::{OpId, Slab, StorageId, TensorId};
use crate::memory::{LogicalBudget, MemoryModel, MemoryUsage, Slot};
use crate::op::{OpHandle, OutputSpec};
use crate::policy::{make_policy, EvictionPolicy};
use crate::record::Call;
use crate::rng::SplitMix64;
use crate::stats::RuntimeStats;
use iteration::IterationState;
use swap::HostTier;

/// Evicted ancestors visited to order a regeneration's inputs by need.
const REGEN_ORDER_NODES: usize = 256;

/// A user tensor: a (possibly shared) view of one storage.
#[derive(Debug, Clone, Copy)]
struct TensorRec {
    storage: StorageId,
    /// Live handles to this tensor (`retain` adds one, `release` drops one).
    refs: u32,
    /// When the tensor was made: the count of tensors made before it. Unlike
    /// its storage's version, which a mutation renews, this stays with the
    /// handle, so iteration boundaries number their live tensors by it.
    born: u64,
}

/// One step of the regeneration work list.
#[derive(Debug, Clone, Copy)]
enum Frame {
    /// Make `StorageId` resident and hold it once.
    Need(StorageId),
    /// All inputs of `op` are held: compute its missing outputs, release the
    /// inputs, hold `target`.
    Run {
        op: OpId,
        target: StorageId,
        /// The clock (ns) when `target`'s regeneration was asked for, before
        /// any of the replays it needs ran. With `request_stamp` the inputs
        /// `op` reads are stamped with it, not with the clock after those
        /// replays (`Runtime::run`, in `regen.rs`, says why).
        asked_at: f64,
    },
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
    /// Keeping until the work list's current frame is done, then trying
    /// the ordered pass over what is left of its region
    /// (`Runtime::replay_region_in_order`); keeping goes on where it does
    /// not fit.
    Due,
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
    /// Tensors made so far (the next [`TensorRec::born`]).
    tensors_made: u64,
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
    /// The current `hold` swaps its parked last-resort victims (its last
    /// retry, swap on; [`Runtime::hold`]).
    swap_parked: bool,
    /// The current `hold` replayed (or set out to replay) a compute path.
    replayed: bool,
    /// Whether the current regeneration keeps what it regenerated
    /// ([`Runtime::keep_regenerated`]).
    keeping: Keeping,
    /// Holds kept by a regeneration that keeps what it regenerated, released
    /// when it ends.
    kept: Vec<StorageId>,
    /// While keeping: the reads still to come inside the running
    /// regeneration, by storage, counted over the ops of its evicted region
    /// when keeping began (`Runtime::count_region_reads`).
    reads_to_come: AHashMap<StorageId, u32>,
    /// The ops counted in `reads_to_come` that have not run since.
    counted: ahash::AHashSet<OpId>,
    /// The targets of the running regeneration.
    regen_targets: Vec<StorageId>,
    /// Iterations: the recorder, the plan being followed, the counters that name
    /// storages and allocations within the iteration (see `iteration`).
    iter: IterationState,
    /// The host tier, when swap is on ([`Runtime::set_host_transfer`]).
    host: Option<HostTier<V>>,
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
            tensors_made: 0,
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
            swap_parked: false,
            replayed: false,
            keeping: Keeping::Off,
            kept: Vec::new(),
            reads_to_come: AHashMap::new(),
            counted: ahash::AHashSet::new(),
            regen_targets: Vec::new(),
            iter: IterationState::default(),
            host: None,
        }
        .with_recording()
    }

    /// Fail rematerializations with [`Error::ComputeLimit`] once first computations
    /// plus rematerializations (plus stalls on host-tier copies) exceed `ns`
    /// (thrash protection; `None`: no limit).
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
        match &self.iter.rescue.set_aside_policy {
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
        let born = self.tensors_made;
        self.tensors_made += 1;
        let index = self.tensors.insert(TensorRec {
            storage,
            refs: 1,
            born,
        });
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
    /// iteration, so a plan's regenerations replay exactly. With the host
    /// tier, a storage of the boundary the iteration started from goes by its
    /// position there, first: the simulation made those storages in that
    /// order, while the real ones were made over earlier iterations in
    /// another (swapped parameters read by one op were swapped back in in
    /// different orders, and the plan diverged).
    #[inline]
    fn creation_key(&self, s: StorageId) -> (u32, u32, u32) {
        if self.iter.follower.stable_order {
            let r = self.graph.st(s);
            // Only swapped storages need a place when read, so only with the
            // host tier does the boundary's order matter (and cost a lookup).
            match self.host.is_some() {
                false => (r.epoch, r.seq, s.0),
                true if r.epoch < self.iter.epoch => self.boundary_key(s, r.epoch, r.seq),
                true => (r.epoch.max(1), r.seq, s.0),
            }
        } else {
            (0, 0, s.0)
        }
    }

    /// [`Runtime::creation_key`] of a storage made before this iteration,
    /// with the host tier: its position in the boundary, before all others.
    #[inline(never)]
    fn boundary_key(&self, s: StorageId, epoch: u32, seq: u32) -> (u32, u32, u32) {
        match self.iter.prefix_pos.get(&s.0) {
            Some(&pos) => (0, pos, 0),
            None => (epoch.max(1), seq, s.0),
        }
    }

    /// Sort storages into regeneration order and drop repeats.
    fn creation_order(&self, v: &mut Vec<StorageId>) {
        if self.iter.follower.stable_order {
            v.sort_unstable_by_key(|&s| self.creation_key(s));
        } else {
            v.sort_unstable_by_key(|s| s.0);
        }
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
    /// then creation order within it), and tensors on one storage by when each
    /// was made, so no two live tensors tie. Unlike [`TensorId::index`] (slab
    /// slots are reused), a repeated program gives its tensors keys in the same
    /// order in every iteration: adapters that visit many tensors at once (a
    /// seal) sort by it so that their calls repeat, and a plan can be followed.
    pub fn creation_rank(&self, t: TensorId) -> Result<(u32, u32, u64)> {
        let rec = self.tensor(t)?;
        let r = self.graph.st(rec.storage);
        Ok((r.epoch, r.seq, rec.born))
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
    /// never evicted for recomputation (it has no compute path). With swap on
    /// it may leave for the host tier between uses ([`crate::swap`]).
    pub fn put(&mut self, value: V, bytes: u64) -> Result<TensorId> {
        self.note(Call::Put { bytes }, &[]);
        let slot = self.place_all(&[bytes]).map(|mut v| v.remove(0));
        let slot = self.track(slot)?;
        let s = self.new_storage(bytes, Some(slot), None, 0, false, 0.0);
        self.values[s.0 as usize] = Some(value);
        self.graph.offer(s);
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
        self.hold(&unique)
            .map_err(|e| self.name_op_working_set(e, &op, &unique, &fresh))?;
        let result = match self.evict_to_threshold() {
            Ok(()) => self.place_and_compute(&op, &in_storages, &fresh, given),
            Err(e) => Err(e),
        };
        let now = self.graph.clock + cost_ns as f64;
        for &s in &unique {
            self.graph.st_mut(s).last_used = now;
            self.unpin_storage(s, true);
        }
        let (slots, values) =
            result.map_err(|e| self.name_op_working_set(e, &op, &unique, &fresh))?;
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
        self.copy_ahead(&fresh_ids, &unique, now, cost_ns as f64);
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

    /// An impossible budget while placing `op`'s outputs: when the op's own
    /// inputs (`unique`) and fresh outputs exceed the budget, say so by name.
    pub(super) fn name_op_working_set(
        &self,
        e: Error,
        op: &Arc<dyn OpHandle<V>>,
        unique: &[StorageId],
        fresh: &[u64],
    ) -> Error {
        let Error::ImpossibleBudget(mut report) = e else {
            return e;
        };
        let mut inputs = unique.to_vec();
        inputs.sort_unstable_by_key(|s| s.0);
        inputs.dedup();
        let input_bytes = inputs.iter().map(|&s| self.graph.st(s).bytes).sum();
        let working = crate::error::OpWorkingSet {
            name: op.name().to_string(),
            input_bytes,
            output_bytes: fresh.iter().sum(),
        };
        if working.bytes() > report.budget
            && report.cause == crate::error::ImpossibleCause::WorkingSetExceedsBudget
        {
            report.cause = crate::error::ImpossibleCause::OpWorkingSetExceedsBudget;
            report.op = Some(working);
        }
        Error::ImpossibleBudget(report)
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
            swap_refused: false,
            host_copy: false,
            copied_ahead: false,
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
        // Code outside the runtime may write it: a clean host copy would go stale.
        self.drop_clean_copy(s);
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
}

/// The memory model [`Runtime::new`] uses for `config`: a physical budget (a
/// remat-alloc caching allocator with the config's allocator settings over a
/// simulated device of the budget's capacity), else a [`LogicalBudget`]
/// (unbounded when there is no budget).
pub fn memory_model(config: &DtrConfig) -> Result<Box<dyn MemoryModel>> {
    Ok(match (config.budget_mode, config.budget) {
        (BudgetMode::Physical, Some(b)) => Box::new(
            crate::memory::physical::PhysicalBudget::with_config(b, config.physical_allocator())?,
        ),
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
