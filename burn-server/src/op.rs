//! The compute path of a DTR device: the recorded [`OperationIr`] replayed on burn's
//! IR runner, the guard that owns a resident value ([`Resident`]), view chains, and
//! the classification of ops (views, non-recomputable ops).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use burn_backend::TensorData;
use burn_ir::{
    BackendIr, BaseOperationIr, FloatOperationIr, HandleKind, NumericOperationIr, OperationIr,
    TensorId, TensorIr, TensorStatus,
};
use burn_router::TensorInterpreter;
use remat_dtr::{OpError, OpHandle};

/// State shared by a client, its op handles and its resident values: the inner
/// backend's runner (whose handle container holds every resident tensor) and the
/// owner of each registered handle.
pub(crate) struct Shared<B: BackendIr> {
    /// burn's IR interpreter over the inner backend: executes ops, holds
    /// handles by id. Locked for one call at a time, never while a
    /// [`Resident`] is dropped (its drop locks it).
    interpreter: Mutex<TensorInterpreter<B>>,
    /// Tensor id → generation of the [`Resident`] guard that owns its handle in the
    /// runner. Invariant: a handle is registered in the runner (outside of an op's
    /// execution) iff its id is here.
    owners: Mutex<HashMap<TensorId, u64>>,
    /// Next guard generation (0 is reserved for non-owning guards).
    next_gen: AtomicU64,
    /// Next tensor id in the interpreter. Every id there is made here (the
    /// interpreter's own counter is never used), so ids never collide.
    next_id: AtomicU64,
}

impl<B: BackendIr> Shared<B> {
    pub(crate) fn new(device: B::Device) -> Self {
        Self {
            interpreter: Mutex::new(TensorInterpreter::new(device)),
            owners: Mutex::new(HashMap::new()),
            next_gen: AtomicU64::new(1),
            next_id: AtomicU64::new(0),
        }
    }

    /// The interpreter, for one call.
    pub(crate) fn runner(&self) -> MutexGuard<'_, TensorInterpreter<B>> {
        // The handle container stays valid if an op panicked: ignore poisoning.
        self.interpreter.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn owners(&self) -> MutexGuard<'_, HashMap<TensorId, u64>> {
        // The map stays valid if a holder panicked: ignore poisoning.
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh tensor id of this device.
    pub(crate) fn empty_handle(&self) -> TensorId {
        TensorId::new(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Register `data` under a fresh id; returns its description (not owned
    /// yet: see [`Shared::adopt`]).
    pub(crate) fn upload(&self, data: TensorData) -> TensorIr {
        let ir = TensorIr {
            id: self.empty_handle(),
            shape: data.shape().clone(),
            status: TensorStatus::ReadWrite,
            dtype: data.dtype(),
        };
        self.runner().register_tensor_data_id(ir.id, data);
        ir
    }

    /// Register the inner `handle` (moved in from another device) under `ir`.
    pub(crate) fn register_handle(&self, ir: &TensorIr, handle: B::Handle) {
        let h = burn_ir::TensorHandle {
            handle,
            shape: ir.shape.clone(),
        };
        let kind = if ir.dtype.is_float() {
            HandleKind::Float(B::float_tensor(h))
        } else if ir.dtype.is_bool() {
            HandleKind::Bool(B::bool_tensor(h))
        } else {
            HandleKind::Int(B::int_tensor(h))
        };
        self.runner().register_tensor_to_device(ir.id, kind);
    }

    /// Number of handles owned by live guards (resident storages).
    pub(crate) fn owned(&self) -> usize {
        self.owners().len()
    }

    /// A guard for `ir`, whose handle was just registered in the runner. When a
    /// live guard already owns that id (an op replayed for a sibling output), the
    /// new guard does not own it: dropping it leaves the runner alone.
    pub(crate) fn adopt(self: &Arc<Self>, ir: &TensorIr) -> Resident<B> {
        let mut owners = self.owners();
        let generation = match owners.entry(ir.id) {
            std::collections::hash_map::Entry::Occupied(_) => 0,
            std::collections::hash_map::Entry::Vacant(v) => {
                *v.insert(self.next_gen.fetch_add(1, Ordering::Relaxed))
            }
        };
        Resident {
            shared: self.clone(),
            ir: TensorIr {
                id: ir.id,
                shape: ir.shape.clone(),
                status: TensorStatus::ReadWrite,
                dtype: ir.dtype,
            },
            generation,
        }
    }

    /// Whether a live guard owns `id` (its handle is registered in the runner).
    pub(crate) fn is_owned(&self, id: TensorId) -> bool {
        self.owners().contains_key(&id)
    }

    /// Register `data` in the runner under `ir`'s id (a value coming back from
    /// the host tier) and take ownership of it. `ir.dtype` must not be
    /// quantized (the runner cannot register those from data), and no live
    /// guard may own the id.
    pub(crate) fn restore(self: &Arc<Self>, ir: &TensorIr, data: TensorData) -> Resident<B> {
        self.runner().register_tensor_data_id(ir.id, data);
        self.adopt(ir)
    }

    /// Remove `ir`'s handle from the runner (drops the inner tensor).
    pub(crate) fn unregister(&self, ir: &TensorIr) {
        let mut ir = ir.clone();
        ir.status = TensorStatus::ReadWrite;
        self.runner().register_op(OperationIr::Drop(ir));
    }
}

/// The value the DTR runtime keeps for a resident storage: the ownership of one
/// handle in the runner. Dropping it (eviction, deletion) removes the handle, which
/// drops the inner backend's tensor and frees its memory.
pub struct Resident<B: BackendIr> {
    shared: Arc<Shared<B>>,
    ir: TensorIr,
    /// 0: not the owner (a duplicate from a replay).
    generation: u64,
}

impl<B: BackendIr> Resident<B> {
    /// The burn tensor id under which the value is registered.
    pub fn id(&self) -> TensorId {
        self.ir.id
    }

    /// The tensor's description: id, shape, dtype.
    pub(crate) fn ir(&self) -> &TensorIr {
        &self.ir
    }
}

impl<B: BackendIr> std::fmt::Debug for Resident<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident")
            .field("id", &self.ir.id)
            .field("generation", &self.generation)
            .finish()
    }
}

impl<B: BackendIr> Drop for Resident<B> {
    fn drop(&mut self) {
        if self.generation == 0 {
            return;
        }
        let owned = {
            let mut owners = self.shared.owners();
            if owners.get(&self.ir.id) == Some(&self.generation) {
                owners.remove(&self.ir.id);
                true
            } else {
                false
            }
        };
        if owned {
            self.shared.unregister(&self.ir);
        }
    }
}

/// How a view tensor is derived from its storage's base tensor: view ops (inputs
/// marked read-only), each reading the previous one's output, the first reading
/// the base. Views are materialized in the runner only while an op reads them.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    ops: Vec<OperationIr>,
}

impl Chain {
    /// `parent`'s chain (none: the parent is a base) followed by `op`.
    pub(crate) fn extend(parent: Option<&Chain>, op: OperationIr) -> Self {
        let mut ops = parent.map(|c| c.ops.clone()).unwrap_or_default();
        ops.push(op);
        Self { ops }
    }

    /// Register the view in the runner (its base must be resident); returns the ids
    /// registered, to be removed by [`Chain::release`].
    fn materialize<B: BackendIr>(&self, shared: &Shared<B>, made: &mut Vec<TensorIr>) {
        for op in &self.ops {
            shared.runner().register_op(op.clone());
            made.extend(op.outputs().cloned());
        }
    }
}

/// Materialize `chains`, run `f`, remove the materialized views.
pub(crate) fn with_views<B: BackendIr, T>(
    shared: &Shared<B>,
    chains: &[Arc<Chain>],
    f: impl FnOnce() -> T,
) -> T {
    let mut made = Vec::new();
    for c in chains {
        c.materialize(shared, &mut made);
    }
    let out = f();
    for ir in made.iter().rev() {
        shared.unregister(ir);
    }
    out
}

/// The op handle given to the DTR runtime: the recorded IR op (inputs read-only),
/// replayed on the runner.
pub(crate) struct IrOp<B: BackendIr> {
    pub(crate) shared: Arc<Shared<B>>,
    pub(crate) op: OperationIr,
    /// View chains of the op's view inputs.
    pub(crate) chains: Vec<Arc<Chain>>,
    /// The op's outputs (fresh storages, in order).
    pub(crate) outputs: Vec<TensorIr>,
    pub(crate) recomputable: bool,
}

impl<B: BackendIr> IrOp<B> {
    /// Execute the op on the runner (its inputs' storages must be resident) and
    /// take ownership of its outputs.
    pub(crate) fn run(&self) -> Vec<Resident<B>> {
        let op = self.op.clone();
        with_views(&self.shared, &self.chains, || {
            self.shared.runner().register_op(op);
        });
        self.outputs.iter().map(|o| self.shared.adopt(o)).collect()
    }
}

impl<B: BackendIr> OpHandle<Resident<B>> for IrOp<B> {
    fn name(&self) -> &str {
        op_name(&self.op)
    }

    fn compute(&self, _inputs: &[&Resident<B>]) -> Result<Vec<Resident<B>>, OpError> {
        // The runtime holds every input storage: their handles are in the runner.
        Ok(self.run())
    }

    fn recomputable(&self) -> bool {
        self.recomputable
    }
}

/// A short name of the op's family (for errors and tracing).
pub(crate) fn op_name(op: &OperationIr) -> &'static str {
    match op {
        OperationIr::BaseFloat(_) => "base_float",
        OperationIr::BaseInt(_) => "base_int",
        OperationIr::BaseBool(_) => "base_bool",
        OperationIr::NumericFloat(..) => "numeric_float",
        OperationIr::NumericInt(..) => "numeric_int",
        OperationIr::Bool(_) => "bool",
        OperationIr::Int(_) => "int",
        OperationIr::Float(_, FloatOperationIr::Matmul(_)) => "matmul",
        OperationIr::Float(..) => "float",
        OperationIr::Module(_) => "module",
        OperationIr::Init(_) => "init",
        OperationIr::Custom(_) => "custom",
        OperationIr::Drop(_) => "drop",
        OperationIr::Distributed(_) => "distributed",
        OperationIr::Activation(_) => "activation",
    }
}

/// Whether `op` is a view: one input, one output aliasing the input's storage.
pub(crate) fn is_view(op: &OperationIr) -> bool {
    let base = match op {
        OperationIr::BaseFloat(b) | OperationIr::BaseInt(b) | OperationIr::BaseBool(b) => b,
        _ => return false,
    };
    matches!(
        base,
        BaseOperationIr::Reshape(_)
            | BaseOperationIr::SwapDims(_)
            | BaseOperationIr::Permute(_)
            | BaseOperationIr::Expand(_)
            | BaseOperationIr::Slice(_)
            | BaseOperationIr::Flip(_)
    )
}

/// Whether replaying `op` gives the same bits: not for random ops (no recorded
/// seed: the backend's generator has moved on) nor `empty` (uninitialized memory).
pub(crate) fn is_recomputable(op: &OperationIr) -> bool {
    !matches!(
        op,
        OperationIr::Float(_, FloatOperationIr::Random(_))
            | OperationIr::NumericInt(_, NumericOperationIr::IntRandom(_))
            | OperationIr::NumericFloat(_, NumericOperationIr::IntRandom(_))
            | OperationIr::BaseFloat(BaseOperationIr::Empty(_))
            | OperationIr::BaseInt(BaseOperationIr::Empty(_))
            | OperationIr::BaseBool(BaseOperationIr::Empty(_))
            | OperationIr::Custom(_)
            | OperationIr::Distributed(_)
    )
}
