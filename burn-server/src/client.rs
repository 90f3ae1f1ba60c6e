//! [`DtrClient`]: the router client of a DTR device. Every op the router sends is
//! run on burn's IR runner and recorded in a remat-dtr [`Runtime`]; the runtime
//! decides which results stay resident.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use burn_backend::backend::ExecutionError;
use burn_backend::{DType, DTypeUsageSet, Shape, TensorData};
use burn_ir::{BackendIr, OperationIr, TensorId, TensorIr, TensorStatus};
use burn_ir::{GraphBindings, GraphId};
use burn_router::{RouterClient, RouterTensor};
use remat_dtr::{
    make_policy, DtrConfig, IterationReport, LogicalBudget, MemoryUsage, OutputSpec, Runtime,
    RuntimeStats,
};

use crate::cost::{tensor_bytes, CostModel};
use crate::device::{options_of, DtrDevice};
use crate::error::{Error, Result};
use crate::op::{is_recomputable, is_view, with_views, Chain, IrOp, Resident, Shared};
use crate::swap::{measure_bandwidth, HostCopies};

/// Figures of one DTR device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DtrStats {
    /// The runtime's counters (evictions, rematerializations, compute time…).
    pub runtime: RuntimeStats,
    /// The memory model's figures (allocated / reserved bytes and their peaks).
    pub memory: MemoryUsage,
    /// Storage records the runtime keeps (resident, evicted, fake-deleted).
    pub records: usize,
    /// Live burn tensors known to the device.
    pub tensors: usize,
    /// Inner tensors currently held (resident storages).
    pub resident: usize,
    /// Ops run (first executions, not replays).
    pub ops: u64,
    /// View ops recorded as aliases.
    pub views: u64,
    /// Uploads of data (external, never evicted).
    pub uploads: u64,
    /// Non-recomputable ops run (random, empty): never evicted.
    pub non_recomputable: u64,
    /// The last step that ended ([`DtrClient::end_iteration`]; `RemoteDtr::end_step` ends
    /// one after each optimizer step): its figures and whether it followed a
    /// plan.
    pub last_iteration: Option<IterationReport>,
    /// Wall-clock ns spent copying to and from the host tier (the runtime's
    /// `stall_ns` is the time model's figure at the configured bandwidth).
    pub host_copy_ns: u64,
    /// Storages of live tensors in the host tier now.
    pub swapped: usize,
    /// Of [`DtrStats::swapped`], those of roots: parameters, inputs,
    /// optimizer state (sealed values), which only swap can take off the
    /// device.
    pub swapped_roots: usize,
}

impl fmt::Display for DtrStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ops {} (views {}, uploads {}, non-recomputable {}), evictions {}, \
             rematerializations {}, peak allocated {} B, records {}, tensors {}, resident {}",
            self.ops,
            self.views,
            self.uploads,
            self.non_recomputable,
            self.runtime.evictions,
            self.runtime.rematerializations,
            self.memory.peak_allocated,
            self.records,
            self.tensors,
            self.resident
        )?;
        let r = &self.runtime;
        if r.swap_outs + r.swap_ins + r.swap_failures > 0 {
            write!(
                f,
                ", swap-outs {} ({} B), swap-ins {} ({} B), peak host {} B, \
                 stall {:.0} ns, copies {} ns, failed copies {}",
                r.swap_outs,
                r.swapped_out_bytes,
                r.swap_ins,
                r.swapped_in_bytes,
                r.peak_host_bytes,
                r.stall_ns,
                self.host_copy_ns,
                r.swap_failures
            )?;
        }
        Ok(())
    }
}

/// A live burn tensor: its runtime tensor (one handle held) and, for views, how
/// it derives from its storage's base.
#[derive(Clone)]
struct Entry {
    t: remat_dtr::TensorId,
    chain: Option<Arc<Chain>>,
    /// The storage is a root: external data, a non-recomputable op's output, or
    /// sealed by [`DtrClient::seal`].
    root: bool,
}

struct State<B: BackendIr> {
    rt: Runtime<Resident<B>>,
    entries: HashMap<TensorId, Entry>,
    /// The first error since the last [`DtrClient::take_error`] (typed).
    error: Option<Error>,
    /// The first error since the last sync, which reports it.
    unsynced: Option<Arc<str>>,
    /// Tensors that were not computed (their op, or one they depend on,
    /// failed), with the first failure's message. Reading one is an error;
    /// ops that read one are not run.
    failed: HashMap<TensorId, Arc<str>>,
    /// The device's configuration was invalid: every op and upload fails with
    /// this message (never a silent run without the budget asked for).
    broken: Option<Arc<str>>,
    cost: CostModel,
    ops: u64,
    views: u64,
    uploads: u64,
    non_recomputable: u64,
    last_iteration: Option<IterationReport>,
    /// Wall-clock ns spent in copies to and from the host tier.
    copy_ns: Arc<AtomicU64>,
}

/// The client of one DTR device (a [`burn_router::RunnerClient`]).
pub struct DtrClient<B: BackendIr> {
    state: Arc<Mutex<State<B>>>,
    shared: Arc<Shared<B>>,
    device: DtrDevice<B>,
}

impl<B: BackendIr> Clone for DtrClient<B> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            shared: self.shared.clone(),
            device: self.device.clone(),
        }
    }
}

impl<B: BackendIr> fmt::Debug for DtrClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DtrClient")
            .field("device", &self.device)
            .finish()
    }
}

fn execution_error(e: &Error) -> ExecutionError {
    ExecutionError::WithContext {
        reason: format!("remat-burn: {e}"),
    }
}

impl<B: BackendIr> DtrClient<B> {
    /// The client of `device`, with a runtime built from the device's options. A
    /// bad configuration makes every op fail with its message (reads, sync and
    /// `take_error` report it).
    pub(crate) fn new(device: &DtrDevice<B>) -> Self {
        let shared = Arc::new(Shared::new(device.inner().clone()));
        let copy_ns = Arc::new(AtomicU64::new(0));
        let mut error = None;
        let mut unsynced = None;
        let (rt, cost) = match Self::runtime(device, &shared, &copy_ns) {
            Ok(x) => x,
            Err(e) => {
                // Every op fails with it (see `State::broken`); the runtime
                // below only keeps the types whole.
                unsynced = Some(Arc::from(e.to_string()));
                error = Some(e);
                let config = DtrConfig::default();
                let policy = make_policy(config.policy, &config);
                let rt = Runtime::with_parts(config, Box::new(LogicalBudget::new(None)), policy);
                (rt, CostModel::default())
            }
        };
        Self {
            state: Arc::new(Mutex::new(State {
                rt,
                entries: HashMap::new(),
                error,
                broken: unsynced.clone(),
                unsynced,
                failed: HashMap::new(),
                cost,
                ops: 0,
                views: 0,
                uploads: 0,
                non_recomputable: 0,
                last_iteration: None,
                copy_ns,
            })),
            shared,
            device: device.clone(),
        }
    }

    /// The runtime of `device` from its options; with swap on, its host tier
    /// (the bandwidth measured first when the config has none).
    fn runtime(
        device: &DtrDevice<B>,
        shared: &Arc<Shared<B>>,
        copy_ns: &Arc<AtomicU64>,
    ) -> Result<(Runtime<Resident<B>>, CostModel)> {
        let mut o = options_of(device.slot())?;
        let swap = o.config.swap;
        if swap.enabled && swap.bandwidth_gbps.is_none() {
            let gbps = measure_bandwidth(shared).map_err(remat_dtr::Error::Transfer)?;
            o.config.swap.bandwidth_gbps = Some(gbps);
        }
        let mut rt = Runtime::new(o.config)?;
        if swap.enabled {
            let copies = HostCopies::new(shared.clone(), o.swap_faults, copy_ns.clone());
            rt.set_host_transfer(Box::new(copies))?;
        }
        Ok((rt, o.cost))
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // A panic inside an op leaves the maps consistent enough to report and
        // release: ignore poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters and memory figures.
    pub fn stats(&self) -> DtrStats {
        let st = self.lock();
        let (mut swapped, mut swapped_roots) = (0, 0);
        if st.rt.swap_enabled() {
            let mut seen = std::collections::HashSet::new();
            for e in st.entries.values() {
                if seen.insert(e.t) && st.rt.is_swapped(e.t).unwrap_or(false) {
                    swapped += 1;
                    swapped_roots += usize::from(e.root);
                }
            }
        }
        DtrStats {
            swapped,
            swapped_roots,
            runtime: st.rt.stats().clone(),
            memory: st.rt.memory_usage(),
            records: st.rt.storage_count(),
            tensors: st.entries.len(),
            resident: self.shared.owned(),
            ops: st.ops,
            views: st.views,
            uploads: st.uploads,
            non_recomputable: st.non_recomputable,
            last_iteration: st.last_iteration.clone(),
            host_copy_ns: st.copy_ns.load(Ordering::Relaxed),
        }
    }

    /// The host tier's bandwidth per direction (GB/s) when swap is on.
    pub fn swap_bandwidth(&self) -> Option<f64> {
        let st = self.lock();
        (st.rt.swap_enabled())
            .then(|| st.rt.config().swap.bandwidth_gbps)
            .flatten()
    }

    /// Bytes of resident storages in the runtime's model, the budget, and the
    /// threshold in force.
    pub(crate) fn model_figures(&self) -> (u64, Option<u64>, Option<u64>) {
        let st = self.lock();
        let c = st.rt.config();
        (st.rt.stats().live_bytes, c.budget, c.threshold)
    }

    /// Set the runtime's eviction threshold (see
    /// [`remat_dtr::Runtime::set_threshold`]).
    pub(crate) fn set_threshold(&self, bytes: Option<u64>) {
        self.lock().rt.set_threshold(bytes);
    }

    /// Take the first error since the last take (typed).
    pub fn take_error(&self) -> Option<Error> {
        self.lock().error.take()
    }

    /// Check the runtime's invariants.
    pub fn check_invariants(&self) -> Result<()> {
        Ok(self.lock().rt.check_invariants()?)
    }

    /// Evict everything evictable; returns how many storages were evicted.
    pub fn evict_all(&self) -> Result<usize> {
        let mut st = self.lock();
        let ts: Vec<remat_dtr::TensorId> = st.entries.values().map(|e| e.t).collect();
        let mut n = 0;
        for t in ts {
            if st.rt.evict(t)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Make every live tensor a root: its current value becomes external data of
    /// the runtime (never evicted) and the compute paths behind it are dropped.
    ///
    /// Call it between training steps. Burn's optimizers are functional: each
    /// step computes new parameters from the old ones, so without a seal the
    /// parameters' lineage (and every upload it reads) would stay recorded, and
    /// non-recomputable inputs resident, for the whole run. Returns how many
    /// storages were sealed.
    pub fn seal(&self) -> Result<usize> {
        // Each tensor is rooted atomically: a failure leaves a consistent state
        // (what was sealed stays sealed) and the device usable.
        self.lock().seal()
    }
}

impl<B: BackendIr> DtrClient<B> {
    /// End a training step (after [`DtrClient::seal`]): the runtime's iteration
    /// boundary. The step just run is recorded; from the step after the next,
    /// when steps repeat, they follow a plan made from the one before (see
    /// [`remat_dtr::Runtime::end_iteration`]).
    pub fn end_iteration(&self) -> Result<IterationReport> {
        let mut st = self.lock();
        let r = st.rt.end_iteration()?;
        st.last_iteration = Some(r.clone());
        Ok(r)
    }
}

impl<B: BackendIr> DtrClient<B> {
    /// Record every step from the next boundary on, also without a budget (see
    /// [`remat_dtr::Runtime::record_iterations`]).
    pub fn record_iterations(&self) {
        self.lock().rt.record_iterations();
    }

    /// The smallest budget the last recorded step replays under at a cost of
    /// at most `max_overhead` times its first computations (see
    /// [`remat_dtr::Runtime::min_feasible_budget`]).
    pub fn min_feasible_budget(&self, max_overhead: f64) -> Result<u64> {
        Ok(self.lock().rt.min_feasible_budget(max_overhead)?)
    }

    /// Write the last recorded step to `path` as a trace in the DTR paper's
    /// format (see [`remat_dtr::Recording::to_trace`]); returns the trace,
    /// named after the file up to its first `-`.
    pub fn export_trace(&self, path: &std::path::Path) -> Result<remat_dtr::trace::Trace> {
        let name = remat_dtr::trace::Trace::name_of(path);
        let trace = self.lock().rt.export_trace(&name)?;
        remat_dtr::export::write_trace(&trace, path)?;
        Ok(trace)
    }
}

impl<B: BackendIr> State<B> {
    fn seal(&mut self) -> Result<usize> {
        let st = self;
        let mut groups: HashMap<remat_dtr::TensorId, Vec<TensorId>> = HashMap::new();
        for (id, e) in &st.entries {
            if !e.root {
                groups.entry(e.t).or_default().push(*id);
            }
        }
        // In creation order, the same in every step (slab indices are not);
        // one runtime call whatever the residency, so that the seal repeats
        // and a plan can be followed through it.
        let mut order = Vec::with_capacity(groups.len());
        for (t, ids) in groups {
            order.push((st.rt.creation_rank(t)?, t, ids));
        }
        order.sort_unstable_by_key(|(key, ..)| *key);
        let n = order.len();
        let roots: Vec<remat_dtr::TensorId> = order.iter().map(|(_, t, _)| *t).collect();
        st.rt.make_roots(&roots)?;
        for (_, _, ids) in order {
            for id in &ids {
                if let Some(e) = st.entries.get_mut(id) {
                    e.root = true;
                }
            }
        }
        Ok(n)
    }
}

impl<B: BackendIr> DtrClient<B> {
    /// Make `ir`'s value available in the runner under `ir.id` and run `f` with
    /// the read-only description of it (the view is removed afterwards).
    fn with_value<T>(&self, ir: &TensorIr, f: impl FnOnce(TensorIr) -> T) -> Result<T> {
        let mut st = self.lock();
        let out = st.read(&self.shared, ir, f);
        // A consumed tensor (`ReadWrite`) gets no drop op: release it even when
        // the read failed, so that no record is left behind.
        if ir.status == TensorStatus::ReadWrite {
            st.failed.remove(&ir.id);
        }
        if ir.status == TensorStatus::ReadWrite && st.entries.contains_key(&ir.id) {
            let released = st.release(ir.id);
            if out.is_ok() {
                released?;
            }
        }
        out
    }

    /// The inner handle of `ir` (used when moving a tensor between devices).
    pub(crate) fn handle(&self, ir: &TensorIr) -> Result<B::Handle> {
        self.with_value(ir, |ro| self.shared.runner().get_tensor_handle(&ro))
    }

    /// Take ownership of `handle`, already registered in the runner as `ir`, as
    /// external data.
    fn put(&self, ir: &TensorIr) {
        let mut st = self.lock();
        let value = self.shared.adopt(ir);
        if let Some(m) = st.broken.clone() {
            drop(value);
            st.failed.insert(ir.id, m);
            return;
        }
        let bytes = (tensor_bytes(ir) as u64).max(1);
        match st.rt.put(value, bytes) {
            Ok(t) => {
                st.entries.insert(
                    ir.id,
                    Entry {
                        t,
                        chain: None,
                        root: true,
                    },
                );
                st.uploads += 1;
            }
            Err(e) => st.fail(&[ir.id], e.into()),
        }
    }

    /// Register an inner handle (a tensor moved in from another device).
    pub(crate) fn register_handle(
        &self,
        handle: B::Handle,
        shape: Shape,
        dtype: DType,
    ) -> RouterTensor<Self> {
        let ir = TensorIr {
            id: self.shared.empty_handle(),
            shape,
            status: TensorStatus::ReadWrite,
            dtype,
        };
        self.shared.register_handle(&ir, handle);
        self.put(&ir);
        RouterTensor::new(ir.id, ir.shape, ir.dtype, self.clone())
    }
}

impl<B: BackendIr> State<B> {
    /// Pin `ir`'s storage, materialize it under its id and run `f` on its
    /// read-only description.
    fn read<T>(
        &mut self,
        shared: &Shared<B>,
        ir: &TensorIr,
        f: impl FnOnce(TensorIr) -> T,
    ) -> Result<T> {
        if let Some(m) = self.failed.get(&ir.id) {
            return Err(Error::Failed(m.clone()));
        }
        let entry = self.entry(ir.id)?;
        // A read that cannot be regenerated (no room for the evicted lineage)
        // fails alone, the tensor stays readable later; the typed error is kept
        // for `take_error`, as a failed op's is.
        if let Err(e) = self.rt.pin(entry.t) {
            let e = Error::from(e);
            let message = Error::Failed(Arc::from(e.to_string()));
            if self.error.is_none() {
                self.error = Some(e);
            }
            return Err(message);
        }
        let mut ro = ir.clone();
        ro.status = TensorStatus::ReadOnly;
        let chains: Vec<Arc<Chain>> = entry.chain.iter().cloned().collect();
        let out = with_views(shared, &chains, || f(ro));
        self.rt.unpin(entry.t)?;
        Ok(out)
    }

    fn entry(&self, id: TensorId) -> Result<Entry> {
        self.entries
            .get(&id)
            .cloned()
            .ok_or(Error::UnknownTensor(id.value()))
    }

    /// Mark `outputs` as not computed because of `e`, and keep `e` for the
    /// next sync and `take_error` (the first error wins in each).
    fn fail(&mut self, outputs: &[TensorId], e: Error) {
        let message: Arc<str> = Arc::from(e.to_string());
        for &id in outputs {
            self.failed.insert(id, message.clone());
        }
        self.unsynced.get_or_insert(message);
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Drop the burn tensor `id`: release its runtime handle.
    fn release(&mut self, id: TensorId) -> Result<()> {
        let entry = self
            .entries
            .remove(&id)
            .ok_or(Error::UnknownTensor(id.value()))?;
        self.rt.release(entry.t)?;
        Ok(())
    }

    fn execute(&mut self, shared: &Arc<Shared<B>>, op: OperationIr) -> Result<()> {
        match &op {
            OperationIr::Drop(ir) => {
                if self.failed.remove(&ir.id).is_some() {
                    return Ok(());
                }
                return match self.release(ir.id) {
                    // Tensors of ops that failed were never registered: dropping
                    // them is a no-op (also after the error was taken).
                    Err(Error::UnknownTensor(_)) => Ok(()),
                    r => r,
                };
            }
            OperationIr::Init(_) => return Ok(()),
            _ => {}
        }
        let mut consumed: Vec<TensorId> = op
            .inputs()
            .filter(|t| t.status == TensorStatus::ReadWrite)
            .map(|t| t.id)
            .collect();
        consumed.sort_unstable_by_key(|id| id.value());
        consumed.dedup();
        // An op that reads a tensor that was not computed is not run: its
        // outputs are not computed either, for the same reason.
        let upstream = (self.broken.clone())
            .or_else(|| op.inputs().find_map(|t| self.failed.get(&t.id).cloned()));
        let result = if let Some(message) = upstream {
            for o in op.outputs() {
                self.failed.insert(o.id, message.clone());
            }
            Ok(())
        } else if is_view(&op) {
            self.view(op)
        } else {
            self.compute(shared, op)
        };
        for id in consumed {
            if self.failed.remove(&id).is_some() {
                continue;
            }
            match self.release(id) {
                Err(e) if result.is_ok() => return Err(e),
                _ => {}
            }
        }
        result
    }

    /// A view: a new name on its input's storage (no compute, no bytes).
    fn view(&mut self, mut op: OperationIr) -> Result<()> {
        let (input, out) = match (op.inputs().next(), op.outputs().next()) {
            (Some(i), Some(o)) => (i.id, o.id),
            _ => return Err(Error::Unsupported("view without input or output".into())),
        };
        let parent = self.entry(input)?;
        op.mark_read_only(&[input]);
        let chain = Arc::new(Chain::extend(parent.chain.as_deref(), op));
        self.rt.retain(parent.t)?;
        self.entries.insert(
            out,
            Entry {
                t: parent.t,
                chain: Some(chain),
                root: parent.root,
            },
        );
        self.views += 1;
        self.ops += 1;
        Ok(())
    }

    /// Run `op` on the runner and record it as the compute path of its outputs.
    fn compute(&mut self, shared: &Arc<Shared<B>>, mut op: OperationIr) -> Result<()> {
        if let OperationIr::Custom(c) = &op {
            return Err(Error::Unsupported(format!("custom op `{}`", c.id)));
        }
        let mut ids: Vec<TensorId> = Vec::new();
        for t in op.inputs() {
            if !ids.contains(&t.id) {
                ids.push(t.id);
            }
        }
        let entries = ids
            .iter()
            .map(|&id| self.entry(id))
            .collect::<Result<Vec<_>>>()?;
        op.mark_read_only(&ids);
        let outputs: Vec<TensorIr> = op.outputs().cloned().collect();
        let recomputable = is_recomputable(&op);
        let estimate = match self.cost {
            CostModel::WallClock => None,
            CostModel::Analytic {
                ns_per_byte,
                ns_per_flop,
            } => Some(CostModel::estimate(ns_per_byte, ns_per_flop, &op)),
        };
        let handle = Arc::new(IrOp {
            shared: shared.clone(),
            op,
            chains: entries.iter().filter_map(|e| e.chain.clone()).collect(),
            outputs,
            recomputable,
        });
        let inputs: Vec<remat_dtr::TensorId> = entries.iter().map(|e| e.t).collect();
        // Pin every input (regenerating evicted ones) so that their handles are in
        // the runner while the op runs.
        for (k, &t) in inputs.iter().enumerate() {
            if let Err(e) = self.rt.pin(t) {
                for &u in &inputs[..k] {
                    let _ = self.rt.unpin(u);
                }
                return Err(e.into());
            }
        }
        let start = Instant::now();
        let values = handle.run();
        let wall = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        for &t in &inputs {
            self.rt.unpin(t)?;
        }
        let cost = estimate.unwrap_or(wall).max(1);
        let specs: Vec<OutputSpec> = handle
            .outputs
            .iter()
            .map(|o| OutputSpec::fresh((tensor_bytes(o) as u64).max(1)))
            .collect();
        let out_ids: Vec<TensorId> = handle.outputs.iter().map(|o| o.id).collect();
        let ts = self.rt.record(handle, &inputs, &specs, values, cost)?;
        for (id, t) in out_ids.into_iter().zip(ts) {
            self.entries.insert(
                id,
                Entry {
                    t,
                    chain: None,
                    root: !recomputable,
                },
            );
        }
        self.ops += 1;
        if !recomputable {
            self.non_recomputable += 1;
        }
        Ok(())
    }
}

impl<B: BackendIr> RouterClient for DtrClient<B> {
    type Device = DtrDevice<B>;

    fn register_op(&self, op: OperationIr) {
        let mut st = self.lock();
        let outputs: Vec<TensorId> = op.outputs().map(|t| t.id).collect();
        if let Err(e) = st.execute(&self.shared, op) {
            st.fail(&outputs, e);
        }
    }

    fn read_tensor_async(
        &self,
        tensor: TensorIr,
    ) -> Pin<Box<dyn Future<Output = Result<TensorData, ExecutionError>> + Send>> {
        match self.with_value(&tensor, |ro| self.shared.runner().read_tensor_async(ro)) {
            Ok(fut) => fut,
            Err(e) => {
                let err = execution_error(&e);
                Box::pin(async move { Err(err) })
            }
        }
    }

    fn sync(&self) -> Result<(), ExecutionError> {
        B::sync(self.device.inner())?;
        match self.lock().unsynced.take() {
            Some(m) => Err(execution_error(&Error::Failed(m))),
            None => Ok(()),
        }
    }

    fn flush(&self) {
        // Ops run when they are registered: nothing is buffered here.
    }

    fn create_empty_handle(&self) -> TensorId {
        self.shared.empty_handle()
    }

    fn register_tensor_data(&self, data: TensorData) -> RouterTensor<Self> {
        let ir = self.shared.upload(data);
        self.put(&ir);
        RouterTensor::new(ir.id, ir.shape, ir.dtype, self.clone())
    }

    fn device(&self) -> Self::Device {
        self.device.clone()
    }

    fn seed(&self, seed: u64) {
        B::seed(self.device.inner(), seed)
    }

    fn dtype_usage(&self, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(self.device.inner(), dtype)
    }

    /// Graphs are registered by burn's fusion layer, which a DTR device is
    /// never put under (it would hide the ops from the runtime): a graph is an
    /// [`Error::Unsupported`] kept for the next sync.
    fn register_and_execute_graph(
        &self,
        _graph_id: GraphId,
        relative_graph: Vec<OperationIr>,
        bindings: GraphBindings,
    ) {
        let _ = (relative_graph, bindings);
        self.report(Error::Unsupported(
            "op graphs (burn-fusion over a DTR device)".into(),
        ));
    }

    /// See [`DtrClient::register_and_execute_graph`].
    fn execute_graph(&self, _graph_id: GraphId, _bindings: GraphBindings) {
        self.report(Error::Unsupported(
            "op graphs (burn-fusion over a DTR device)".into(),
        ));
    }

    /// Aliases, too, come only from burn-fusion (its cross-stream sharing):
    /// the alias is marked not computed with an [`Error::Unsupported`].
    fn register_alias(&self, new_id: TensorId, src_id: TensorId) {
        let _ = src_id;
        self.lock().fail(
            &[new_id],
            Error::Unsupported("tensor aliases (burn-fusion over a DTR device)".into()),
        );
    }
}

impl<B: BackendIr> DtrClient<B> {
    /// Keep `e` as an error for the next sync and `take_error` (a failure that
    /// marks no tensor: a handle handed to another device).
    pub(crate) fn report(&self, e: Error) {
        self.lock().fail(&[], e);
    }

    /// The device of this client.
    pub(crate) fn device_ref(&self) -> &DtrDevice<B> {
        &self.device
    }
}
