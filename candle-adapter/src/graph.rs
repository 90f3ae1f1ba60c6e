//! The evict/restore mechanism and the autograd hook.
//!
//! One adapter op, [`apply`]:
//!
//! ```text
//!  1. pin the inputs in the runtime (regenerating evicted ones)
//!  2. run the real candle op on *detached* inputs              ──► out (fresh storage)
//!  3. move out's storage into a stash                          (cell::take_storage)
//!  4. inputs.apply_opN(Attach { stash, node })                 ──► attached output:
//!     its forward returns the stash, so candle records an ordinary graph node
//!  5. runtime.record(Recompute { fwd, detached inputs, target }, inputs, fresh(bytes))
//!  6. unpin the inputs
//! ```
//!
//! Eviction is the runtime dropping the output's [`Cell`]: the storage is moved out
//! and freed; every view and graph node sharing the cell sees an empty storage.
//! Rematerialization is [`Recompute::compute`]: run the same candle op again on the
//! (rematerialized) inputs and move the result back into the cell. candle's
//! `backward()` calls [`Attach`]'s `bwd`, which pins the inputs (and the output when
//! the gradient formula reads it) before computing the vector-Jacobian product with
//! the same candle ops candle's own backward uses, so gradients are bit-identical.
//! Dropping the graph node releases the handles it retained.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, CustomOp3, Layout, MetalStorage, Shape, Storage,
    Tensor,
};
use remat_dtr::{OpError, OpHandle, OutputSpec, Runtime, TensorId};

use crate::cell::{put_storage, storage_addr, take_storage, tensor_bytes, Cell};
use crate::context::Inner;
use crate::device::{evict_after_oom, is_device_oom, retry_on_device_oom};
use crate::error::{Error, Typed as Result};
use crate::tensor::RTensor;

/// The forward computation of an op on detached inputs; must be deterministic.
pub(crate) type FwdFn = dyn Fn(&[Tensor]) -> candle_core::Result<Tensor> + Send + Sync;

/// The vector-Jacobian product: `(inputs, output if needed, grad) -> grads`, one
/// entry per input (`None`: no gradient).
pub(crate) type VjpFn = dyn Fn(&[Tensor], Option<&Tensor>, &Tensor) -> candle_core::Result<Vec<Option<Tensor>>>
    + Send
    + Sync;

/// Run `fwd` and make sure the result owns a fresh, contiguous storage that no
/// input shares (a view of an input would otherwise be moved out of the input).
pub(crate) fn run_fwd(fwd: &FwdFn, inputs: &[Tensor]) -> candle_core::Result<Tensor> {
    let out = fwd(inputs)?;
    let addr = storage_addr(&out);
    let fresh = out.is_contiguous()
        && out.layout().start_offset() == 0
        && !inputs.iter().any(|i| storage_addr(i) == addr);
    if fresh {
        Ok(out)
    } else {
        out.force_contiguous()
    }
}

/// The compute path the runtime replays: the same candle op on the same inputs,
/// its result moved into the original storage cell.
struct Recompute {
    name: &'static str,
    fwd: Arc<FwdFn>,
    /// Detached inputs: same storage cells and layouts as the op's inputs.
    inputs: Vec<Tensor>,
    /// Detached output: the storage cell shared with the attached output.
    target: Tensor,
}

impl OpHandle<Cell> for Recompute {
    fn name(&self) -> &str {
        self.name
    }

    fn compute(&self, _inputs: &[&Cell]) -> std::result::Result<Vec<Cell>, OpError> {
        let err = |e: candle_core::Error| {
            if is_device_oom(&e) {
                // The runtime evicts and calls again.
                OpError::out_of_memory(self.name, e.to_string())
            } else {
                OpError::new(self.name, e.to_string())
            }
        };
        let out = run_fwd(&*self.fwd, &self.inputs).map_err(err)?;
        if out.shape() != self.target.shape() || out.dtype() != self.target.dtype() {
            return Err(OpError::new(
                self.name,
                format!(
                    "recomputed {:?} {:?}, expected {:?} {:?}",
                    out.shape(),
                    out.dtype(),
                    self.target.shape(),
                    self.target.dtype()
                ),
            ));
        }
        let storage = take_storage(&out).map_err(err)?;
        drop(out);
        put_storage(&self.target, storage).map_err(err)?;
        Ok(vec![Cell::armed(self.target.clone())])
    }
}

/// What a graph node keeps for its backward: retained runtime handles.
pub(crate) struct NodeState {
    ctx: Arc<Inner>,
    name: &'static str,
    /// Retained handles on the inputs (empty when the node tracks no gradient).
    inputs: Vec<TensorId>,
    /// Retained handle on the output, when the vjp reads it.
    output: OnceLock<TensorId>,
    needs_output: bool,
    vjp: Arc<VjpFn>,
}

impl Drop for NodeState {
    fn drop(&mut self) {
        for &id in &self.inputs {
            self.ctx.release_later(id);
        }
        if let Some(&id) = self.output.get() {
            self.ctx.release_later(id);
        }
    }
}

impl NodeState {
    fn pin_all(&self, rt: &mut Runtime<Cell>) -> Result<Vec<TensorId>> {
        let mut pinned = Vec::with_capacity(self.inputs.len() + 1);
        let ids = self.inputs.iter().chain(self.output.get());
        for &id in ids {
            if let Err(e) = rt.pin(id) {
                for &p in &pinned {
                    let _ = rt.unpin(p);
                }
                return Err(e.into());
            }
            pinned.push(id);
        }
        Ok(pinned)
    }

    fn backward(
        &self,
        args: &[&Tensor],
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Vec<Option<Tensor>>> {
        let pinned = {
            let mut rt = self.ctx.lock().map_err(|e| self.ctx.stash_bwd_error(e))?;
            self.pin_all(&mut rt)
                .map_err(|e| self.ctx.stash_bwd_error(e))?
        };
        let det: Vec<Tensor> = args.iter().map(|a| a.detach()).collect();
        let out = self.needs_output.then(|| res.detach());
        // The gradient's allocations happen outside the runtime: on a device
        // OOM, evict (the inputs and output are pinned) and compute again.
        let result = retry_on_device_oom(
            self.name,
            tensor_bytes(grad),
            || (self.vjp)(&det, out.as_ref(), grad),
            |hint| evict_after_oom(&mut *self.ctx.lock()?, hint),
        );
        drop((det, out));
        let mut rt = self.ctx.lock().map_err(|e| self.ctx.stash_bwd_error(e))?;
        for id in pinned {
            rt.unpin(id)
                .map_err(|e| self.ctx.stash_bwd_error(e.into()))?;
        }
        let grads = result.map_err(|e| match e {
            // candle's own errors pass through as before; the runtime's (a
            // device OOM nothing could cure) are kept typed.
            Error::Candle(c) => c,
            other => self.ctx.stash_bwd_error(other),
        })?;
        if grads.len() != args.len() {
            return Err(candle_core::Error::Msg(format!(
                "remat: vjp of `{}` returned {} gradients for {} inputs",
                self.name,
                grads.len(),
                args.len()
            )));
        }
        Ok(grads)
    }
}

/// The custom op that attaches a computed storage to candle's graph.
pub(crate) struct Attach {
    stash: Mutex<Option<(Storage, Shape)>>,
    node: Arc<NodeState>,
}

impl Attach {
    fn take(&self) -> candle_core::Result<(Storage, Shape)> {
        self.stash
            .lock()
            .map_err(|_| candle_core::Error::Msg("remat: stash poisoned".into()))?
            .take()
            .ok_or_else(|| candle_core::Error::Msg("remat: attach forward ran twice".into()))
    }
    fn cpu(&self) -> candle_core::Result<(CpuStorage, Shape)> {
        match self.take()? {
            (Storage::Cpu(s), shape) => Ok((s, shape)),
            _ => Err(candle_core::Error::Msg("remat: device mismatch".into())),
        }
    }
    fn cuda(&self) -> candle_core::Result<(CudaStorage, Shape)> {
        match self.take()? {
            (Storage::Cuda(s), shape) => Ok((s, shape)),
            _ => Err(candle_core::Error::Msg("remat: device mismatch".into())),
        }
    }
    fn grad(&self, i: usize, g: &mut [Option<Tensor>]) -> Option<Tensor> {
        g.get_mut(i).and_then(Option::take)
    }
}

fn no_metal<T>() -> candle_core::Result<T> {
    Err(candle_core::Error::Msg(
        "remat-candle does not support metal".into(),
    ))
}

/// `Attach` as candle's custom op of one arity: each forward hands over the
/// stash (the input storages are not read), `bwd` runs the node's backward
/// over the arguments. Listed per argument: its name in `bwd`, the names of its
/// storage and layout in the forwards, its index.
macro_rules! attach_op {
    ($op:ident -> $grads:ty, $(($arg:ident, $s:ident, $l:ident, $i:tt)),+) => {
        impl $op for Attach {
            fn name(&self) -> &'static str {
                self.node.name
            }
            fn cpu_fwd(
                &self,
                $($s: &CpuStorage, $l: &Layout),+
            ) -> candle_core::Result<(CpuStorage, Shape)> {
                self.cpu()
            }
            fn cuda_fwd(
                &self,
                $($s: &CudaStorage, $l: &Layout),+
            ) -> candle_core::Result<(CudaStorage, Shape)> {
                self.cuda()
            }
            fn metal_fwd(
                &self,
                $($s: &MetalStorage, $l: &Layout),+
            ) -> candle_core::Result<(MetalStorage, Shape)> {
                no_metal()
            }
            #[allow(unused_parens, clippy::type_complexity)]
            fn bwd(
                &self,
                $($arg: &Tensor,)+
                res: &Tensor,
                grad: &Tensor,
            ) -> candle_core::Result<$grads> {
                let mut g = self.node.backward(&[$($arg),+], res, grad)?;
                Ok(($(self.grad($i, &mut g)),+))
            }
        }
    };
}

attach_op!(CustomOp1 -> Option<Tensor>, (a, _s0, _l0, 0));
attach_op!(
    CustomOp2 -> (Option<Tensor>, Option<Tensor>),
    (a, _s0, _l0, 0),
    (b, _s1, _l1, 1)
);
attach_op!(
    CustomOp3 -> (Option<Tensor>, Option<Tensor>, Option<Tensor>),
    (a, _s0, _l0, 0),
    (b, _s1, _l1, 1),
    (c, _s2, _l2, 2)
);

/// Attach `storage` (of `shape`) as the output of a graph node over `args`.
fn attach(
    args: &[&Tensor],
    storage: Storage,
    shape: Shape,
    node: Arc<NodeState>,
) -> Result<Tensor> {
    let op = Attach {
        stash: Mutex::new(Some((storage, shape))),
        node,
    };
    let t = match args {
        [a] => a.apply_op1_arc(Arc::new(Box::new(op)))?,
        [a, b] => a.apply_op2_arc(b, Arc::new(Box::new(op)))?,
        [a, b, c] => a.apply_op3_arc(b, c, Arc::new(Box::new(op)))?,
        _ => {
            return Err(Error::Unsupported {
                op: "attach",
                message: format!("{} inputs (1 to 3 supported)", args.len()),
            })
        }
    };
    Ok(t)
}

/// Run an op through the runtime (see the module doc). `inputs`: 1 to 3 tensors
/// of one context; `needs_output`: the vjp reads the op's output.
pub(crate) fn apply(
    name: &'static str,
    inputs: &[&RTensor],
    fwd: Arc<FwdFn>,
    vjp: Arc<VjpFn>,
    needs_output: bool,
) -> crate::Result<RTensor> {
    Ok(apply_typed(name, inputs, fwd, Some(vjp), needs_output)?)
}

/// Run an op through the runtime with candle's own graph node: `fwd` runs on the
/// *attached* inputs, so candle records its own op and its own backward (which
/// accumulates gradients exactly as plain candle does, e.g. `index_add` into the
/// running sum for `index_select`, one `add` per argument for `cat`). Its output
/// storage is then moved into an identity [`Attach`] node, which makes it
/// evictable and keeps the inputs' handles for the graph's lifetime.
///
/// Only for ops whose candle backward reads no storage of an evictable input (nor
/// its own output): `cat` reads none, `index_select`/`gather` read only their ids,
/// so the caller passes ids that are external. `inputs`: any number (≥ 1).
pub(crate) fn apply_native(
    name: &'static str,
    inputs: &[&RTensor],
    fwd: Arc<FwdFn>,
) -> crate::Result<RTensor> {
    Ok(apply_typed(name, inputs, fwd, None, false)?)
}

fn identity_vjp() -> Arc<VjpFn> {
    Arc::new(|_, _, g| Ok(vec![Some(g.clone())]))
}

/// `vjp`: `None` for a native op ([`apply_native`]).
fn apply_typed(
    name: &'static str,
    inputs: &[&RTensor],
    fwd: Arc<FwdFn>,
    vjp: Option<Arc<VjpFn>>,
    needs_output: bool,
) -> Result<RTensor> {
    let ctx = inputs
        .first()
        .map(|t| t.ctx().clone())
        .ok_or(Error::Unsupported {
            op: name,
            message: "no inputs".into(),
        })?;
    if inputs.iter().any(|t| !Arc::ptr_eq(t.ctx(), &ctx)) {
        return Err(Error::ContextMismatch { op: name });
    }
    let ids: Vec<TensorId> = inputs.iter().map(|t| t.id()).collect();
    let mut rt = ctx.lock()?;
    let mut pinned = Vec::with_capacity(ids.len());
    let result = (|| -> Result<RTensor> {
        for &id in &ids {
            rt.pin(id)?;
            pinned.push(id);
        }
        let det: Vec<Tensor> = inputs.iter().map(|t| t.attached().detach()).collect();
        let native = vjp.is_none();
        let att: Vec<Tensor> = if native {
            inputs.iter().map(|t| t.attached().clone()).collect()
        } else {
            Vec::new()
        };
        let in_bytes = ids
            .iter()
            .map(|&id| rt.bytes(id))
            .sum::<remat_dtr::Result<u64>>()?;
        let mut start = Instant::now();
        // candle allocates the output itself: on a device OOM evict (the inputs
        // are pinned) and run again; the cost counts the successful run only.
        let out = retry_on_device_oom(
            name,
            in_bytes,
            || {
                start = Instant::now();
                // A native op's candle node sits on the attached inputs; a
                // view result is made contiguous by candle's own copy node.
                run_fwd(&*fwd, if native { &att } else { &det })
            },
            |hint| evict_after_oom(&mut rt, hint),
        )?;
        let elapsed = start.elapsed();
        let bytes = tensor_bytes(&out);
        let cost = ctx.cost_of(elapsed, bytes);
        let shape = out.shape().clone();
        let storage = take_storage(&out)?;
        // A native op's output stays in candle's graph (with an empty storage its
        // backward never reads) as the argument of the identity node below.
        let native_out = if native { Some(out) } else { None };
        let tracks = match &native_out {
            Some(o) => o.track_op(),
            None => inputs.iter().any(|t| t.attached().track_op()),
        };
        let mut retained = Vec::new();
        if tracks {
            for &id in &ids {
                rt.retain(id)?;
                retained.push(id);
            }
        }
        let node = Arc::new(NodeState {
            ctx: ctx.clone(),
            name,
            inputs: retained,
            output: OnceLock::new(),
            needs_output,
            vjp: vjp.unwrap_or_else(identity_vjp),
        });
        let args: Vec<&Tensor> = match &native_out {
            Some(o) => vec![o],
            None => inputs.iter().map(|t| t.attached()).collect(),
        };
        let attached = attach(&args, storage, shape, node.clone())?;
        let handle = Arc::new(Recompute {
            name,
            fwd,
            inputs: det,
            target: attached.detach(),
        });
        let out_id = rt.record(
            handle,
            &ids,
            &[OutputSpec::fresh(bytes)],
            vec![Cell::armed(attached.detach())],
            cost,
        )?[0];
        if tracks && needs_output {
            rt.retain(out_id)?;
            // Cannot already be set: the node was created above.
            let _ = node.output.set(out_id);
        }
        let constant = inputs.iter().all(|t| t.is_constant());
        let out = RTensor::from_parts(attached, out_id, ctx.clone(), false, constant);
        ctx.note_output(out_id, out.weak_handle(), constant)?;
        Ok(out)
    })();
    for id in pinned {
        // The pins were taken above on live handles.
        let _ = rt.unpin(id);
    }
    result
}

/// A copy of `t`'s data attached to the graph (gradients flow back into `t`),
/// outside the runtime: the escape hatch to plain candle.
pub(crate) fn escape(t: &RTensor) -> crate::Result<Tensor> {
    Ok(escape_typed(t)?)
}

fn escape_typed(t: &RTensor) -> Result<Tensor> {
    let ctx = t.ctx().clone();
    let mut rt = ctx.lock()?;
    rt.pin(t.id())?;
    let copy = t.attached().detach().force_contiguous();
    let _ = rt.unpin(t.id());
    drop(rt);
    let copy = copy?;
    let shape = copy.shape().clone();
    let storage = take_storage(&copy)?;
    let node = Arc::new(NodeState {
        ctx,
        name: "remat-escape",
        inputs: Vec::new(),
        output: OnceLock::new(),
        needs_output: false,
        vjp: identity_vjp(),
    });
    attach(&[t.attached()], storage, shape, node)
}
