//! [`RTensor`]: a rematerializing tensor whose ops mirror candle's `Tensor`.
//!
//! Each op runs the real candle op, registers the output with the DTR runtime with
//! its recompute closure, and attaches it to candle's autograd graph (see the
//! crate-private `graph` module). Views (reshape, transpose, narrow, broadcast,
//! squeeze…) are candle's own layout-only views on the attached tensor: they share
//! the storage cell and the runtime handle, so an evicted base is restored for all
//! its views at once.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::op::CmpOp;
use candle_core::shape::{Dim, Dims};
use candle_core::{DType, Device, Shape, Tensor, WithDType, D};
use remat_dtr::{StorageId, TensorId};

use crate::context::{Inner, Remat};
use crate::error::{DtrResultExt, Error, Result};
use crate::graph::{apply, apply_native, escape};

mod conv;

/// The runtime handle of a storage, shared by a tensor and its views; dropping the
/// last one releases the handle.
pub(crate) struct Handle {
    id: TensorId,
    ctx: Arc<Inner>,
    /// External data (an input or a parameter): never evicted.
    external: bool,
    /// Computed from constants only (see [`RTensor::is_constant`]).
    constant: bool,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.ctx.release_later(self.id);
    }
}

/// A tensor whose storage the DTR runtime may evict and rematerialize.
///
/// It wraps the candle tensor that sits in candle's autograd graph (the *attached*
/// tensor). Its storage may be empty while evicted: read values through
/// [`RTensor::to_vec1`] and friends, [`RTensor::pinned`] or [`RTensor::to_candle`],
/// never through the attached tensor directly.
#[derive(Clone)]
pub struct RTensor {
    t: Tensor,
    h: Arc<Handle>,
}

impl AsRef<RTensor> for RTensor {
    fn as_ref(&self) -> &RTensor {
        self
    }
}

impl std::fmt::Debug for RTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RTensor")
            .field("id", &self.h.id)
            .field("shape", self.t.shape())
            .field("dtype", &self.t.dtype())
            .finish()
    }
}

/// A pinned tensor: resident until the guard drops. Derefs to the attached candle
/// tensor, which plain candle ops may read while the guard lives. Do not keep
/// clones of it past the guard: the storage may be evicted afterwards, and reading
/// an evicted storage fails (CPU: panics inside candle).
pub struct Pinned<'a> {
    t: &'a RTensor,
}

impl std::ops::Deref for Pinned<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.t.t
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.t.h.ctx.unpin_later(self.t.h.id);
    }
}

fn op1<F, G>(t: &RTensor, name: &'static str, needs_output: bool, f: F, g: G) -> Result<RTensor>
where
    F: Fn(&Tensor) -> candle_core::Result<Tensor> + Send + Sync + 'static,
    G: Fn(&Tensor, Option<&Tensor>, &Tensor) -> candle_core::Result<Tensor> + Send + Sync + 'static,
{
    apply(
        name,
        &[t],
        Arc::new(move |x: &[Tensor]| f(&x[0])),
        Arc::new(move |x: &[Tensor], o: Option<&Tensor>, grad: &Tensor| {
            Ok(vec![Some(g(&x[0], o, grad)?)])
        }),
        needs_output,
    )
}

fn out_of(o: Option<&Tensor>) -> candle_core::Result<&Tensor> {
    o.ok_or_else(|| candle_core::Error::Msg("remat: output not pinned for backward".into()))
}

/// Elementwise binary ops on same-shape tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
}

impl Bin {
    fn name(self) -> &'static str {
        match self {
            Bin::Add => "add",
            Bin::Sub => "sub",
            Bin::Mul => "mul",
            Bin::Div => "div",
            Bin::Maximum => "maximum",
            Bin::Minimum => "minimum",
        }
    }
    fn run(self, a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Bin::Add => a.add(b),
            Bin::Sub => a.sub(b),
            Bin::Mul => a.mul(b),
            Bin::Div => a.div(b),
            Bin::Maximum => a.maximum(b),
            Bin::Minimum => a.minimum(b),
        }
    }
    /// candle's backward formulas (backprop.rs); a `sum.sub(g)` there is returned
    /// as `-g` here, which candle then adds: IEEE `s - g == s + (-g)` exactly.
    fn vjp(
        self,
        lhs: &Tensor,
        rhs: &Tensor,
        node: Option<&Tensor>,
        grad: &Tensor,
    ) -> candle_core::Result<Vec<Option<Tensor>>> {
        Ok(match self {
            Bin::Add => vec![Some(grad.clone()), Some(grad.clone())],
            Bin::Sub => vec![Some(grad.clone()), Some(grad.neg()?)],
            Bin::Mul => vec![Some(grad.mul(rhs)?), Some(grad.mul(lhs)?)],
            Bin::Div => {
                let l = grad.div(rhs)?;
                let r = grad.mul(lhs)?.div(&rhs.sqr()?)?;
                vec![Some(l), Some(r.neg()?)]
            }
            Bin::Maximum | Bin::Minimum => {
                let node = out_of(node)?;
                let mask_lhs = node.eq(lhs)?.to_dtype(grad.dtype())?;
                let mask_rhs = node.eq(rhs)?.to_dtype(grad.dtype())?;
                let l = mask_lhs.mul(grad)?.div(&(&mask_rhs + 1.)?)?;
                let r = mask_rhs.mul(grad)?.div(&(&mask_lhs + 1.)?)?;
                vec![Some(l), Some(r)]
            }
        })
    }
}

impl RTensor {
    pub(crate) fn from_parts(
        t: Tensor,
        id: TensorId,
        ctx: Arc<Inner>,
        external: bool,
        constant: bool,
    ) -> Self {
        Self {
            t,
            h: Arc::new(Handle {
                id,
                ctx,
                external,
                constant,
            }),
        }
    }

    /// A weak reference to this tensor's runtime handle (the context keeps one
    /// per external storage, to count a storage wrapped twice once).
    pub(crate) fn weak_handle(&self) -> std::sync::Weak<Handle> {
        Arc::downgrade(&self.h)
    }

    /// `t` (a view of the storage behind `h`) under the live handle `h`.
    pub(crate) fn with_handle(t: Tensor, h: Arc<Handle>) -> RTensor {
        RTensor { t, h }
    }

    /// Whether the storage is external data ([`Remat::input`], [`Remat::param`]),
    /// which the runtime never evicts.
    pub fn is_external(&self) -> bool {
        self.h.external
    }

    /// Whether the value is a function of constants only: external data that
    /// tracks no gradient ([`Remat::input`] of plain data, not a parameter), or
    /// the output of ops whose inputs all are. Recomputing such a value is
    /// valid in any iteration, so [`Remat::end_iteration`] restores one the
    /// step left evicted (and still held) instead of leaving it stale: label
    /// conversions, masks and rotary tables computed before the first step stay
    /// readable.
    pub fn is_constant(&self) -> bool {
        self.h.constant
    }

    pub(crate) fn ctx(&self) -> &Arc<Inner> {
        &self.h.ctx
    }

    /// The runtime handle of this tensor's storage.
    pub fn id(&self) -> TensorId {
        self.h.id
    }

    /// The attached candle tensor: the node in candle's autograd graph (use it to
    /// look gradients up in a `GradStore`). Its storage may be evicted: do not read
    /// it (see [`RTensor::pinned`]).
    pub fn attached(&self) -> &Tensor {
        &self.t
    }

    /// The context this tensor belongs to.
    pub fn remat(&self) -> Remat {
        Remat {
            inner: self.h.ctx.clone(),
        }
    }

    /// A view of this tensor's storage made by a layout-only candle op on the
    /// attached tensor (candle records it in the graph; its backward reads no
    /// storage).
    fn view(&self, f: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>) -> Result<RTensor> {
        Ok(RTensor {
            t: f(&self.t)?,
            h: self.h.clone(),
        })
    }

    // ----- metadata -------------------------------------------------------------

    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.t.shape()
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.t.dims()
    }
    /// The size of dimension `d`.
    pub fn dim<T: Dim>(&self, d: T) -> Result<usize> {
        self.t.dim(d)
    }
    /// The rank.
    pub fn rank(&self) -> usize {
        self.t.rank()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.t.dtype()
    }
    /// The device.
    pub fn device(&self) -> &Device {
        self.t.device()
    }
    /// The number of elements.
    pub fn elem_count(&self) -> usize {
        self.t.elem_count()
    }
    /// Whether the layout is row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        self.t.is_contiguous()
    }
    /// The dimensions of a rank-0 tensor (an error naming the rank otherwise).
    pub fn dims0(&self) -> Result<()> {
        self.t.dims0()
    }
    /// The dimension of a rank-1 tensor.
    pub fn dims1(&self) -> Result<usize> {
        self.t.dims1()
    }
    /// The dimensions of a rank-2 tensor.
    pub fn dims2(&self) -> Result<(usize, usize)> {
        self.t.dims2()
    }
    /// The dimensions of a rank-3 tensor.
    pub fn dims3(&self) -> Result<(usize, usize, usize)> {
        self.t.dims3()
    }
    /// The dimensions of a rank-4 tensor.
    pub fn dims4(&self) -> Result<(usize, usize, usize, usize)> {
        self.t.dims4()
    }
    /// The dimensions of a rank-5 tensor.
    pub fn dims5(&self) -> Result<(usize, usize, usize, usize, usize)> {
        self.t.dims5()
    }

    /// `m.forward(self)`: candle's `Tensor::apply`, for chaining layers.
    pub fn apply<M: crate::nn::Module + ?Sized>(&self, m: &M) -> Result<RTensor> {
        m.forward(self)
    }
    /// `m.forward_t(self, train)`: candle's `Tensor::apply_t`.
    pub fn apply_t<M: crate::nn::ModuleT + ?Sized>(&self, m: &M, train: bool) -> Result<RTensor> {
        m.forward_t(self, train)
    }

    // ----- runtime ----------------------------------------------------------------

    /// Whether the storage is resident (not evicted).
    pub fn is_resident(&self) -> Result<bool> {
        self.h.ctx.lock()?.is_resident(self.h.id).c()
    }

    /// The runtime storage behind this tensor (views share it).
    pub fn storage_id(&self) -> Result<StorageId> {
        self.h.ctx.lock()?.storage_of(self.h.id).c()
    }

    /// Evict the storage now if it can be (resident, recomputable, unpinned):
    /// `Ok(false)` for inputs, parameters and pinned tensors.
    pub fn evict(&self) -> Result<bool> {
        self.h.ctx.lock()?.evict(self.h.id).c()
    }

    /// Times the storage was rematerialized.
    pub fn recompute_count(&self) -> Result<u32> {
        self.h.ctx.lock()?.recompute_count(self.h.id).c()
    }

    /// Make the storage resident and keep it so while the guard lives.
    pub fn pinned(&self) -> Result<Pinned<'_>> {
        self.h.ctx.lock()?.pin(self.h.id).c()?;
        Ok(Pinned { t: self })
    }

    /// Escape to plain candle: a copy of the data, attached to candle's graph
    /// (gradients flow back through this tensor) and independent of the runtime:
    /// its memory is outside the budget and never evicted.
    pub fn to_candle(&self) -> Result<Tensor> {
        escape(self)
    }

    /// The same storage without gradient (candle's `detach`): a view sharing
    /// the runtime handle, so eviction and rematerialization still cover it.
    pub fn detach(&self) -> RTensor {
        RTensor {
            t: self.t.detach(),
            h: self.h.clone(),
        }
    }

    /// The values as a vector (rank 1).
    pub fn to_vec1<T: WithDType>(&self) -> Result<Vec<T>> {
        let p = self.pinned()?;
        p.to_vec1()
    }
    /// The values as nested vectors (rank 2).
    pub fn to_vec2<T: WithDType>(&self) -> Result<Vec<Vec<T>>> {
        let p = self.pinned()?;
        p.to_vec2()
    }
    /// The values as nested vectors (rank 3).
    pub fn to_vec3<T: WithDType>(&self) -> Result<Vec<Vec<Vec<T>>>> {
        let p = self.pinned()?;
        p.to_vec3()
    }
    /// The value of a rank-0 tensor (candle's `to_vec0`).
    pub fn to_vec0<T: WithDType>(&self) -> Result<T> {
        self.to_scalar()
    }
    /// The value of a rank-0 tensor.
    pub fn to_scalar<T: WithDType>(&self) -> Result<T> {
        let p = self.pinned()?;
        p.to_scalar()
    }

    /// candle's `backward()` from this tensor: gradients of every variable it
    /// depends on. Evicted inputs are rematerialized as their nodes are reached.
    pub fn backward(&self) -> Result<GradStore> {
        self.remat().flush()?;
        let ctx = self.ctx();
        let _ = ctx.take_bwd_error();
        self.t
            .backward()
            .map_err(|e| ctx.take_bwd_error().map_or(e, Into::into))
    }

    // ----- views --------------------------------------------------------------------

    /// Reshape (a view when contiguous, else a contiguous copy first).
    pub fn reshape<S: candle_core::shape::ShapeWithOneHole>(&self, s: S) -> Result<RTensor> {
        let base = self.contiguous()?;
        base.view(|t| t.reshape(s))
    }
    /// Swap two dimensions (view).
    pub fn transpose<D1: Dim, D2: Dim>(&self, d1: D1, d2: D2) -> Result<RTensor> {
        self.view(|t| t.transpose(d1, d2))
    }
    /// Transpose the last two dimensions (view).
    pub fn t(&self) -> Result<RTensor> {
        self.view(|t| t.t())
    }
    /// Permute the dimensions (view).
    pub fn permute<T: Dims>(&self, dims: T) -> Result<RTensor> {
        self.view(|t| t.permute(dims))
    }
    /// A slice along `dim` (view).
    pub fn narrow<T: Dim>(&self, dim: T, start: usize, len: usize) -> Result<RTensor> {
        self.view(|t| t.narrow(dim, start, len))
    }
    /// Split into `chunks` views along `dim`.
    pub fn chunk<T: Dim>(&self, chunks: usize, dim: T) -> Result<Vec<RTensor>> {
        let parts = self.t.chunk(chunks, dim)?;
        Ok(parts
            .into_iter()
            .map(|t| RTensor {
                t,
                h: self.h.clone(),
            })
            .collect())
    }
    /// Remove a dimension of size 1 (view).
    pub fn squeeze<T: Dim>(&self, dim: T) -> Result<RTensor> {
        self.view(|t| t.squeeze(dim))
    }
    /// Insert a dimension of size 1 (view).
    pub fn unsqueeze<T: Dim>(&self, dim: T) -> Result<RTensor> {
        self.view(|t| t.unsqueeze(dim))
    }
    /// Broadcast to `shape` (view).
    pub fn broadcast_as<S: Into<Shape>>(&self, shape: S) -> Result<RTensor> {
        self.view(|t| t.broadcast_as(shape))
    }
    /// Broadcast to `shape` (view; candle's `expand`).
    pub fn expand<S: Into<Shape>>(&self, shape: S) -> Result<RTensor> {
        self.broadcast_as(shape)
    }
    /// Broadcast with extra leading dimensions (view).
    pub fn broadcast_left<S: Into<Shape>>(&self, left: S) -> Result<RTensor> {
        self.view(|t| t.broadcast_left(left))
    }
    fn flatten_dims(&self, start: Option<usize>, end: Option<usize>) -> Result<RTensor> {
        if self.rank() == 0 {
            return self.reshape(1);
        }
        let start = start.unwrap_or(0);
        let end = end.unwrap_or(self.rank() - 1);
        if start >= end {
            return Ok(self.clone());
        }
        let dims = self.dims();
        let mut dst = dims[..start].to_vec();
        dst.push(dims[start..end + 1].iter().product::<usize>());
        dst.extend(&dims[end + 1..]);
        self.reshape(dst)
    }
    /// Flatten dimensions `start..=end` into one (candle's `flatten`).
    pub fn flatten<D1: Dim, D2: Dim>(&self, start: D1, end: D2) -> Result<RTensor> {
        let s = start.to_index(self.shape(), "flatten")?;
        let e = end.to_index(self.shape(), "flatten")?;
        self.flatten_dims(Some(s), Some(e))
    }
    /// Flatten dimensions `0..=end` into one (candle's `flatten_to`).
    pub fn flatten_to<D: Dim>(&self, end: D) -> Result<RTensor> {
        let e = end.to_index(self.shape(), "flatten")?;
        self.flatten_dims(None, Some(e))
    }
    /// The sub-tensor at index `i` of dimension 0 (view; candle's `get`).
    pub fn get(&self, i: usize) -> Result<RTensor> {
        let dims = self.dims().to_vec();
        if dims.is_empty() {
            return Ok(self.clone());
        }
        self.narrow(0, i, 1)?.reshape(&dims[1..])
    }
    /// The sub-tensor at `index` of dimension `dim` (view; candle's `get_on_dim`).
    pub fn get_on_dim<D: Dim>(&self, dim: D, index: usize) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "get_on_dim")?;
        self.narrow(dim, index, 1)?.squeeze(dim)
    }
    /// Flatten everything into one dimension.
    pub fn flatten_all(&self) -> Result<RTensor> {
        self.contiguous()?.view(|t| t.flatten_all())
    }
    /// Flatten dimensions from `start` on.
    pub fn flatten_from<T: Dim>(&self, start: T) -> Result<RTensor> {
        self.contiguous()?.view(|t| t.flatten_from(start))
    }

    // ----- unary ----------------------------------------------------------------------

    /// A contiguous tensor (itself when already contiguous, else a copy).
    pub fn contiguous(&self) -> Result<RTensor> {
        if self.t.is_contiguous() {
            return Ok(self.clone());
        }
        op1(
            self,
            "copy",
            false,
            |x| x.force_contiguous(),
            |_, _, g| Ok(g.clone()),
        )
    }
    /// candle's `to_device`: itself on its own device (as candle returns it). A
    /// context places one device, so a move to another device is a typed
    /// `Unsupported` error: bring the data in on the target device with
    /// [`Remat::input`] instead.
    pub fn to_device(&self, device: &Device) -> Result<RTensor> {
        if self.device().same_device(device) {
            return Ok(self.clone());
        }
        Err(crate::error::Error::unsupported(
            "to_device",
            format!(
                "a remat context places one device; this tensor is on {:?}, not {:?}: \
                 bring the data in on the target device with Remat::input",
                self.device().location(),
                device.location()
            ),
        ))
    }
    /// Convert the element type (itself when already `dtype`).
    pub fn to_dtype(&self, dtype: DType) -> Result<RTensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        op1(
            self,
            "to-dtype",
            false,
            move |x| x.to_dtype(dtype),
            |x, _, g| g.to_dtype(x.dtype()),
        )
    }
    /// `x * mul + add`.
    pub fn affine(&self, mul: f64, add: f64) -> Result<RTensor> {
        op1(
            self,
            "affine",
            false,
            move |x| x.affine(mul, add),
            move |_, _, g| g.affine(mul, 0.),
        )
    }
    /// `e^x`.
    pub fn exp(&self) -> Result<RTensor> {
        op1(self, "exp", true, |x| x.exp(), |_, o, g| g.mul(out_of(o)?))
    }
    /// Natural logarithm.
    pub fn log(&self) -> Result<RTensor> {
        op1(self, "log", false, |x| x.log(), |x, _, g| g.div(x))
    }
    /// `x²`.
    pub fn sqr(&self) -> Result<RTensor> {
        op1(
            self,
            "sqr",
            false,
            |x| x.sqr(),
            |x, _, g| x.mul(g)?.affine(2., 0.),
        )
    }
    /// `√x`.
    pub fn sqrt(&self) -> Result<RTensor> {
        op1(
            self,
            "sqrt",
            true,
            |x| x.sqrt(),
            |_, o, g| g.div(out_of(o)?)?.affine(0.5, 0.),
        )
    }
    /// `1 / x`.
    pub fn recip(&self) -> Result<RTensor> {
        op1(
            self,
            "recip",
            false,
            |x| x.recip(),
            |x, _, g| g.div(&x.sqr()?)?.neg(),
        )
    }
    /// `-x`.
    pub fn neg(&self) -> Result<RTensor> {
        op1(self, "neg", false, |x| x.neg(), |_, _, g| g.neg())
    }
    /// `|x|`.
    pub fn abs(&self) -> Result<RTensor> {
        op1(
            self,
            "abs",
            false,
            |x| x.abs(),
            |x, _, g| {
                let ones = x.ones_like()?;
                let abs_grad = x.ge(&x.zeros_like()?)?.where_cond(&ones, &ones.neg()?)?;
                g.mul(&abs_grad)
            },
        )
    }
    /// Sine (candle's backward: `grad · cos x`).
    pub fn sin(&self) -> Result<RTensor> {
        op1(self, "sin", false, |x| x.sin(), |x, _, g| g.mul(&x.cos()?))
    }
    /// Cosine (candle's backward: `−grad · sin x`).
    pub fn cos(&self) -> Result<RTensor> {
        op1(
            self,
            "cos",
            false,
            |x| x.cos(),
            |x, _, g| g.mul(&x.sin()?)?.neg(),
        )
    }
    /// The error function (candle's backward: `grad · 2/√π · e^(−x²)`).
    pub fn erf(&self) -> Result<RTensor> {
        op1(
            self,
            "erf",
            false,
            |x| x.erf(),
            |arg, _, grad| {
                let erf_grad = (2. / std::f64::consts::PI.sqrt()) * (arg.sqr()?.neg()?).exp()?;
                grad * erf_grad
            },
        )
    }
    /// Rounding ops: no gradient flows through them (as in candle).
    fn rounding(
        &self,
        name: &'static str,
        f: fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<RTensor> {
        self.no_grad(name, &[], Arc::new(move |x: &[Tensor]| f(&x[0])))
    }
    /// Round down (no gradient, as in candle).
    pub fn floor(&self) -> Result<RTensor> {
        self.rounding("floor", Tensor::floor)
    }
    /// Round up (no gradient, as in candle).
    pub fn ceil(&self) -> Result<RTensor> {
        self.rounding("ceil", Tensor::ceil)
    }
    /// Round to nearest (no gradient, as in candle).
    pub fn round(&self) -> Result<RTensor> {
        self.rounding("round", Tensor::round)
    }
    /// −1, 0 or 1 (no gradient, as in candle).
    pub fn sign(&self) -> Result<RTensor> {
        self.rounding("sign", Tensor::sign)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<RTensor> {
        op1(
            self,
            "tanh",
            true,
            |x| x.tanh(),
            |_, o, g| {
                let minus_dtanh = (out_of(o)?.sqr()? - 1.)?;
                g.mul(&minus_dtanh)?.neg()
            },
        )
    }
    /// Rectified linear unit.
    pub fn relu(&self) -> Result<RTensor> {
        op1(
            self,
            "relu",
            false,
            |x| x.relu(),
            |x, _, g| {
                let relu_grad = x.ge(&x.zeros_like()?)?.to_dtype(x.dtype())?;
                g.mul(&relu_grad)
            },
        )
    }
    /// GELU, tanh approximation.
    pub fn gelu(&self) -> Result<RTensor> {
        op1(
            self,
            "gelu",
            false,
            |x| x.gelu(),
            |arg, _, g| {
                let cube = arg.powf(3.)?;
                let tanh = (0.0356774 * &cube + (0.797885 * arg)?)?.tanh()?;
                let gelu_grad = (((0.5 * &tanh)?
                    + (0.0535161 * cube + (0.398942 * arg)?)? * (1. - tanh.powf(2.)?))?
                    + 0.5)?;
                g.mul(&gelu_grad)
            },
        )
    }
    /// GELU, exact (erf).
    pub fn gelu_erf(&self) -> Result<RTensor> {
        op1(
            self,
            "gelu-erf",
            false,
            |x| x.gelu_erf(),
            |arg, _, g| {
                let neg_half_square = (arg.sqr()?.neg()? / 2.)?;
                let scaled_exp_arg = (0.398942 * neg_half_square.exp()? * arg)?;
                let arg_scaled_sqrt = (arg / 2f64.sqrt())?;
                let erf_scaled_sqrt = (0.5 * arg_scaled_sqrt.erf()?)?;
                let gelu_erf_grad = (0.5 + scaled_exp_arg + erf_scaled_sqrt)?;
                g.mul(&gelu_erf_grad)
            },
        )
    }
    /// SiLU (swish).
    pub fn silu(&self) -> Result<RTensor> {
        op1(
            self,
            "silu",
            true,
            |x| x.silu(),
            |arg, o, g| {
                let node = out_of(o)?;
                let sigmoid_arg = (arg.neg()?.exp()? + 1.)?.recip()?;
                let silu_grad = ((&sigmoid_arg * (1. - node)?)? + node)?;
                g.mul(&silu_grad)
            },
        )
    }
    /// Logistic sigmoid (candle-nn's fused op and its backward).
    pub fn sigmoid(&self) -> Result<RTensor> {
        op1(self, "sigmoid", true, candle_nn::ops::sigmoid, |_, o, g| {
            let res = out_of(o)?;
            let d_dx_sigmoid = res.ones_like()?.sub(res)?.mul(res)?;
            g.mul(&d_dx_sigmoid)
        })
    }
    /// ELU: `x` for `x > 0`, `alpha · (eˣ − 1)` otherwise (candle's op and backward).
    pub fn elu(&self, alpha: f64) -> Result<RTensor> {
        op1(
            self,
            "elu",
            true,
            move |x| x.elu(alpha),
            move |arg, o, grad| {
                let node = out_of(o)?;
                let zeros = arg.zeros_like()?;
                let positive_mask = arg.gt(&zeros)?.to_dtype(arg.dtype())?;
                let negative_mask = arg.le(&zeros)?.to_dtype(arg.dtype())?;
                let negative_exp_mask = (negative_mask * (node + alpha)?)?;
                let combined_mask = (positive_mask + negative_exp_mask)?;
                grad * combined_mask
            },
        )
    }
    /// `x^e`.
    pub fn powf(&self, e: f64) -> Result<RTensor> {
        op1(
            self,
            "powf",
            false,
            move |x| x.powf(e),
            move |x, _, g| g.mul(&x.powf(e - 1.)?)? * e,
        )
    }

    // ----- reductions -------------------------------------------------------------------

    /// Sum over `dims`, keeping them as size 1.
    pub fn sum_keepdim<T: Dims>(&self, dims: T) -> Result<RTensor> {
        let dims = dims.to_indexes(self.shape(), "sum-keepdim")?;
        op1(
            self,
            "sum",
            false,
            move |x| x.sum_keepdim(dims.as_slice()),
            |x, _, g| g.broadcast_as(x.shape()),
        )
    }
    /// Sum over `dims`, removing them.
    pub fn sum<T: Dims>(&self, dims: T) -> Result<RTensor> {
        let dims = dims.to_indexes(self.shape(), "sum")?;
        let s = self.sum_keepdim(dims.as_slice())?;
        s.squeeze_dims(&dims)
    }
    /// Sum of all elements (rank 0).
    pub fn sum_all(&self) -> Result<RTensor> {
        let dims: Vec<usize> = (0..self.rank()).collect();
        self.sum(dims)
    }
    /// Mean over `dims`, keeping them.
    pub fn mean_keepdim<T: Dims>(&self, dims: T) -> Result<RTensor> {
        let dims = dims.to_indexes(self.shape(), "mean-keepdim")?;
        let n: usize = dims.iter().map(|i| self.dims()[*i]).product();
        self.sum_keepdim(dims)?.affine(1f64 / n as f64, 0.)
    }
    /// Mean over `dims`, removing them.
    pub fn mean<T: Dims>(&self, dims: T) -> Result<RTensor> {
        let dims = dims.to_indexes(self.shape(), "mean")?;
        let n: usize = dims.iter().map(|i| self.dims()[*i]).product();
        self.sum(dims)?.affine(1f64 / n as f64, 0.)
    }
    /// Mean of all elements (rank 0).
    pub fn mean_all(&self) -> Result<RTensor> {
        let n = self.elem_count();
        self.sum_all()?.affine(1. / n as f64, 0.)
    }
    /// Cumulative sum along `dim` (candle's composition: a matmul with an
    /// upper-triangular matrix of ones, an input of the context).
    pub fn cumsum<D: Dim>(&self, dim: D) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "cumsum")?;
        let rank = self.rank();
        if rank == 0 {
            return Ok(self.clone());
        }
        let n_axis = self.dim(dim)?;
        let triu = self
            .remat()
            .input(&Tensor::triu2(n_axis, self.dtype(), self.device())?)?;
        if rank == 1 {
            self.unsqueeze(0)?.matmul(&triu)?.squeeze(0)
        } else {
            let last = rank - 1;
            let t = self.transpose(dim, last)?;
            let t = t.broadcast_matmul(&triu)?;
            t.transpose(dim, last)
        }
    }
    /// `self^rhs` elementwise (candle's composition `exp(rhs · ln self)`).
    pub fn pow(&self, rhs: &RTensor) -> Result<RTensor> {
        rhs.mul(&self.log()?)?.exp()
    }
    /// `self^rhs` with broadcasting (candle's composition).
    pub fn broadcast_pow(&self, rhs: &RTensor) -> Result<RTensor> {
        rhs.broadcast_mul(&self.log()?)?.exp()
    }
    /// Unbiased variance over `dim`, keeping it (candle's composition).
    pub fn var_keepdim<D: Dim>(&self, dim: D) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "var")?;
        let mean = self.mean_keepdim(dim)?;
        let squares = self.broadcast_sub(&mean)?.sqr()?;
        squares.sum_keepdim(dim)? / (self.dim(dim)? - 1) as f64
    }
    /// Unbiased variance over `dim`, removing it.
    pub fn var<D: Dim>(&self, dim: D) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "var")?;
        self.var_keepdim(dim)?.squeeze(dim)
    }
    /// `log Σ exp` over `sum_dims`, stabilized by the maximum (candle's
    /// composition).
    pub fn log_sum_exp<T: Dims>(&self, sum_dims: T) -> Result<RTensor> {
        let sum_dims = sum_dims.to_indexes(self.shape(), "log-sum-exp")?;
        if sum_dims.is_empty() {
            return Ok(self.clone());
        }
        let mut max = self.max_keepdim(sum_dims[0])?;
        for &dim in &sum_dims[1..] {
            max = max.max_keepdim(dim)?;
        }
        let exp = self.broadcast_sub(&max)?.exp()?;
        let sum = exp.sum(sum_dims.clone())?;
        sum.log()? + max.squeeze_dims(&sum_dims)?
    }
    fn squeeze_dims(&self, dims: &[usize]) -> Result<RTensor> {
        match dims {
            [] => Ok(self.clone()),
            [i] => self.squeeze(*i),
            dims => {
                let keep: Vec<usize> = self
                    .dims()
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &v)| (!dims.contains(&i)).then_some(v))
                    .collect();
                self.reshape(keep)
            }
        }
    }
    fn extremum_keepdim(&self, dim: usize, max: bool) -> Result<RTensor> {
        let name = if max { "max" } else { "min" };
        op1(
            self,
            name,
            true,
            move |x| {
                if max {
                    x.max_keepdim(dim)
                } else {
                    x.min_keepdim(dim)
                }
            },
            |x, o, g| {
                let node = out_of(o)?.broadcast_as(x.shape())?;
                let grad = g.broadcast_as(x.shape())?;
                node.eq(x)?.to_dtype(grad.dtype())?.mul(&grad)
            },
        )
    }
    /// Maximum over `dim`, keeping it.
    pub fn max_keepdim<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "max")?;
        self.extremum_keepdim(dim, true)
    }
    /// Maximum over `dim`, removing it.
    pub fn max<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "max")?;
        self.extremum_keepdim(dim, true)?.squeeze(dim)
    }
    /// Minimum over `dim`, keeping it.
    pub fn min_keepdim<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "min")?;
        self.extremum_keepdim(dim, false)
    }
    /// Minimum over `dim`, removing it.
    pub fn min<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "min")?;
        self.extremum_keepdim(dim, false)?.squeeze(dim)
    }

    // ----- binary ---------------------------------------------------------------------

    fn binary(&self, rhs: &RTensor, op: Bin) -> Result<RTensor> {
        apply(
            op.name(),
            &[self, rhs],
            Arc::new(move |x: &[Tensor]| op.run(&x[0], &x[1])),
            Arc::new(move |x: &[Tensor], o: Option<&Tensor>, g: &Tensor| {
                op.vjp(&x[0], &x[1], o, g)
            }),
            matches!(op, Bin::Maximum | Bin::Minimum),
        )
    }
    /// candle's `broadcast_binary_op!`: broadcast the sides that differ, then the op.
    fn broadcast_binary(&self, rhs: &RTensor, op: Bin) -> Result<RTensor> {
        let shape = self
            .shape()
            .broadcast_shape_binary_op(rhs.shape(), op.name())?;
        let l = if self.shape() != &shape {
            self.broadcast_as(&shape)?
        } else {
            self.clone()
        };
        let r = if rhs.shape() != &shape {
            rhs.broadcast_as(&shape)?
        } else {
            rhs.clone()
        };
        l.binary(&r, op)
    }
    /// Elementwise sum (same shapes).
    pub fn add(&self, rhs: &RTensor) -> Result<RTensor> {
        self.binary(rhs, Bin::Add)
    }
    /// Elementwise difference (same shapes).
    pub fn sub(&self, rhs: &RTensor) -> Result<RTensor> {
        self.binary(rhs, Bin::Sub)
    }
    /// Elementwise product (same shapes).
    pub fn mul(&self, rhs: &RTensor) -> Result<RTensor> {
        self.binary(rhs, Bin::Mul)
    }
    /// Elementwise quotient (same shapes).
    pub fn div(&self, rhs: &RTensor) -> Result<RTensor> {
        self.binary(rhs, Bin::Div)
    }
    /// Elementwise maximum (same shapes).
    pub fn maximum(&self, rhs: &RTensor) -> Result<RTensor> {
        self.binary(rhs, Bin::Maximum)
    }
    /// Elementwise minimum (same shapes).
    pub fn minimum(&self, rhs: &RTensor) -> Result<RTensor> {
        self.binary(rhs, Bin::Minimum)
    }
    /// Sum with broadcasting.
    pub fn broadcast_add(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_binary(rhs, Bin::Add)
    }
    /// Difference with broadcasting.
    pub fn broadcast_sub(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_binary(rhs, Bin::Sub)
    }
    /// Product with broadcasting.
    pub fn broadcast_mul(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_binary(rhs, Bin::Mul)
    }
    /// Quotient with broadcasting.
    pub fn broadcast_div(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_binary(rhs, Bin::Div)
    }
    /// Maximum with broadcasting.
    pub fn broadcast_maximum(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_binary(rhs, Bin::Maximum)
    }
    /// Minimum with broadcasting.
    pub fn broadcast_minimum(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_binary(rhs, Bin::Minimum)
    }

    // ----- matmul / conv ----------------------------------------------------------------

    /// Batched matrix product (same batch dims).
    pub fn matmul(&self, rhs: &RTensor) -> Result<RTensor> {
        apply(
            "matmul",
            &[self, rhs],
            Arc::new(|x: &[Tensor]| x[0].matmul(&x[1])),
            Arc::new(|x: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
                let lhs_grad = g.matmul(&x[1].t()?)?;
                let rhs_grad = x[0].t()?.matmul(g)?;
                Ok(vec![Some(lhs_grad), Some(rhs_grad)])
            }),
            false,
        )
    }
    /// Matrix product with batch broadcasting (candle's `broadcast_matmul`).
    pub fn broadcast_matmul(&self, rhs: &RTensor) -> Result<RTensor> {
        let (l_shape, r_shape) = broadcast_shape_matmul(self.shape(), rhs.shape())?;
        let l_b = l_shape != *self.shape();
        let r_b = r_shape != *rhs.shape();
        match (l_b, r_b) {
            (true, true) => self
                .broadcast_as(&l_shape)?
                .contiguous()?
                .matmul(&rhs.broadcast_as(&r_shape)?.contiguous()?),
            (false, true) if rhs.rank() == 2 && self.is_contiguous() => {
                let dims = self.dims();
                let (m, k) = (dims[self.rank() - 2], dims[self.rank() - 1]);
                let n = rhs.dims()[1];
                let batch: usize = dims[..self.rank() - 2].iter().product();
                let mut out_dims = dims.to_vec();
                out_dims.pop();
                out_dims.push(n);
                self.reshape((batch * m, k))?.matmul(rhs)?.reshape(out_dims)
            }
            (false, true) => self.matmul(&rhs.broadcast_as(&r_shape)?.contiguous()?),
            (true, false) => self.broadcast_as(&l_shape)?.contiguous()?.matmul(rhs),
            (false, false) => self.matmul(rhs),
        }
    }
    // ----- indexing -----------------------------------------------------------------------

    /// Select rows of `self` along `dim` by `ids` (an integer tensor).
    ///
    /// With external ids (an input, as usual for token ids) this is candle's own
    /// graph node, whose backward `index_add`s into the running gradient sum, so
    /// a table also used elsewhere (tied embeddings) gets its gradient summed in
    /// candle's order. Ids computed by an op use a node that adds its gradient
    /// instead (equal values; another rounding order when the table has other
    /// uses).
    pub fn index_select<T: Dim>(&self, ids: &RTensor, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "index-select")?;
        let fwd: Arc<crate::graph::FwdFn> =
            Arc::new(move |x: &[Tensor]| x[0].index_select(&x[1], dim));
        if ids.is_external() {
            return apply_native("index-select", &[self, ids], fwd);
        }
        apply(
            "index-select",
            &[self, ids],
            fwd,
            Arc::new(move |x: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
                let ids = x[1].contiguous()?;
                let grad = x[0].zeros_like()?.index_add(&ids, g, dim)?;
                Ok(vec![Some(grad), None])
            }),
            false,
        )
    }
    /// `self` with the rows of `src` added at `ids` along `dim` (candle's
    /// `index_add` and its backward: the gradient of `self` passes through, the
    /// gradient of `src` is the gradient's rows at `ids`).
    pub fn index_add<T: Dim>(&self, ids: &RTensor, src: &RTensor, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "index-add")?;
        apply(
            "index-add",
            &[self, ids, src],
            Arc::new(move |x: &[Tensor]| x[0].index_add(&x[1], &x[2], dim)),
            Arc::new(move |x: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
                let src_grad = g.index_select(&x[1], dim)?;
                Ok(vec![Some(g.clone()), None, Some(src_grad)])
            }),
            false,
        )
    }
    /// Gather values along `dim` at `ids` (same rank as `self`); external ids use
    /// candle's own node, as for [`RTensor::index_select`].
    pub fn gather<T: Dim>(&self, ids: &RTensor, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "gather")?;
        let fwd: Arc<crate::graph::FwdFn> = Arc::new(move |x: &[Tensor]| x[0].gather(&x[1], dim));
        if ids.is_external() {
            return apply_native("gather", &[self, ids], fwd);
        }
        apply(
            "gather",
            &[self, ids],
            fwd,
            Arc::new(move |x: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
                let grad = x[0].zeros_like()?.scatter_add(&x[1], g, dim)?;
                Ok(vec![Some(grad), None])
            }),
            false,
        )
    }
    /// Concatenate along `dim` (candle's `Tensor::cat`): one node for any number
    /// of tensors, candle's own, so the gradient of a tensor given several times
    /// (`repeat`, `repeat_kv`) is summed in candle's order. Non-contiguous
    /// arguments are made contiguous first (an identity for gradients).
    pub fn cat<A: AsRef<RTensor>, T: Dim>(args: &[A], dim: T) -> Result<RTensor> {
        let first = args
            .first()
            .ok_or_else(|| Error::unsupported("cat", "no tensors"))?
            .as_ref();
        let dim = dim.to_index(first.shape(), "cat")?;
        if args.len() == 1 {
            return Ok(first.clone());
        }
        let parts = args
            .iter()
            .map(|a| a.as_ref().contiguous())
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&RTensor> = parts.iter().collect();
        apply_native(
            "cat",
            &refs,
            Arc::new(move |x: &[Tensor]| Tensor::cat(x, dim)),
        )
    }
    /// Stack along a new dimension `dim` (candle's `Tensor::stack`).
    pub fn stack<A: AsRef<RTensor>, T: Dim>(args: &[A], dim: T) -> Result<RTensor> {
        let first = args
            .first()
            .ok_or_else(|| Error::unsupported("stack", "no tensors"))?
            .as_ref();
        let dim = dim.to_index_plus_one(first.shape(), "stack")?;
        let args = args
            .iter()
            .map(|t| t.as_ref().unsqueeze(dim))
            .collect::<Result<Vec<_>>>()?;
        Self::cat(&args, dim)
    }
    /// Pad with `left` zeros before and `right` zeros after along `dim`
    /// (candle's composition: a `cat` with zero tensors).
    pub fn pad_with_zeros<T: Dim>(&self, dim: T, left: usize, right: usize) -> Result<RTensor> {
        if left == 0 && right == 0 {
            return Ok(self.clone());
        }
        let dim = dim.to_index(self.shape(), "pad_with_zeros")?;
        let zeros = |n: usize| -> Result<RTensor> {
            let mut dims = self.dims().to_vec();
            dims[dim] = n;
            self.remat()
                .input(&Tensor::zeros(dims, self.dtype(), self.device())?)
        };
        if left == 0 {
            Self::cat(&[self, &zeros(right)?], dim)
        } else if right == 0 {
            Self::cat(&[&zeros(left)?, self], dim)
        } else {
            Self::cat(&[&zeros(left)?, self, &zeros(right)?], dim)
        }
    }
    /// Repeat along each dimension (candle's composition: one `cat` of copies per
    /// repeated dimension; leading dimensions are added when `shape` is longer).
    pub fn repeat<S: Into<Shape>>(&self, shape: S) -> Result<RTensor> {
        let repeats = shape.into();
        let repeats = repeats.dims();
        let mut inp = if self.rank() < repeats.len() {
            let shape = [vec![1; repeats.len() - self.rank()], self.dims().to_vec()].concat();
            self.reshape(shape)?
        } else {
            self.clone()
        };
        for (idx, &repeat) in repeats.iter().enumerate() {
            inp = match repeat {
                0 => inp.narrow(idx, 0, 0)?,
                1 => inp,
                repeat => Self::cat(&vec![&inp; repeat], idx)?,
            };
        }
        Ok(inp)
    }
    /// Where `self` (a `u8`/`u32` mask) is non-zero take `on_true`, else
    /// `on_false` (same shapes; candle's `where_cond` and its backward).
    pub fn where_cond(&self, on_true: &RTensor, on_false: &RTensor) -> Result<RTensor> {
        apply(
            "where-cond",
            &[self, on_true, on_false],
            Arc::new(|x: &[Tensor]| x[0].where_cond(&x[1], &x[2])),
            Arc::new(|x: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
                let zeros = g.zeros_like()?;
                let t = x[0].where_cond(g, &zeros)?;
                let f = x[0].where_cond(&zeros, g)?;
                Ok(vec![None, Some(t), Some(f)])
            }),
            false,
        )
    }
    /// `value` where `mask` is non-zero, `self` elsewhere: candle-transformers'
    /// `masked_fill(on_false, mask, on_true)` helper (a broadcast constant and
    /// `where_cond`). `mask` has `self`'s shape; `value` must have `self`'s dtype.
    pub fn masked_fill<V: WithDType>(&self, mask: &RTensor, value: V) -> Result<RTensor> {
        let on_true = self
            .remat()
            .input(&Tensor::new(value, self.device())?)?
            .broadcast_as(mask.shape())?;
        mask.where_cond(&on_true, self)
    }
    /// A scalar of `self`'s dtype broadcast to its shape, as candle makes the
    /// right-hand side of `maximum(f64)` and friends.
    fn scalar_like(&self, v: f64) -> Result<RTensor> {
        self.remat()
            .input(&Tensor::new(v, self.device())?.to_dtype(self.dtype())?)?
            .broadcast_as(self.shape())
    }
    /// Elementwise maximum with a scalar (candle's `maximum(f64)`).
    pub fn maximum_scalar(&self, v: f64) -> Result<RTensor> {
        self.maximum(&self.scalar_like(v)?)
    }
    /// Elementwise minimum with a scalar (candle's `minimum(f64)`).
    pub fn minimum_scalar(&self, v: f64) -> Result<RTensor> {
        self.minimum(&self.scalar_like(v)?)
    }
    /// Clamp into `[min, max]` (candle's `clamp`: `maximum(min)` then
    /// `minimum(max)`, with their gradients, halved at ties).
    pub fn clamp(&self, min: f64, max: f64) -> Result<RTensor> {
        self.maximum_scalar(min)?.minimum_scalar(max)
    }

    // ----- comparisons and arg-reductions (no gradient) --------------------------

    fn no_grad(
        &self,
        name: &'static str,
        others: &[&RTensor],
        f: Arc<crate::graph::FwdFn>,
    ) -> Result<RTensor> {
        let mut inputs = vec![self];
        inputs.extend_from_slice(others);
        let n = inputs.len();
        apply(
            name,
            &inputs,
            f,
            Arc::new(move |_: &[Tensor], _: Option<&Tensor>, _: &Tensor| Ok(vec![None; n])),
            false,
        )
    }
    /// Elementwise comparison (same shapes), a `u8` tensor of 0 and 1.
    pub fn cmp(&self, rhs: &RTensor, op: CmpOp) -> Result<RTensor> {
        self.no_grad(
            "cmp",
            &[rhs],
            Arc::new(move |x: &[Tensor]| x[0].cmp(&x[1], op)),
        )
    }
    /// Elementwise comparison with a scalar, a `u8` tensor of 0 and 1.
    pub fn cmp_scalar(&self, rhs: f64, op: CmpOp) -> Result<RTensor> {
        self.no_grad("cmp", &[], Arc::new(move |x: &[Tensor]| x[0].cmp(rhs, op)))
    }
    /// `self == rhs` elementwise (`u8`).
    pub fn eq(&self, rhs: &RTensor) -> Result<RTensor> {
        self.cmp(rhs, CmpOp::Eq)
    }
    /// `self != rhs` elementwise (`u8`).
    pub fn ne(&self, rhs: &RTensor) -> Result<RTensor> {
        self.cmp(rhs, CmpOp::Ne)
    }
    /// `self < rhs` elementwise (`u8`).
    pub fn lt(&self, rhs: &RTensor) -> Result<RTensor> {
        self.cmp(rhs, CmpOp::Lt)
    }
    /// `self <= rhs` elementwise (`u8`).
    pub fn le(&self, rhs: &RTensor) -> Result<RTensor> {
        self.cmp(rhs, CmpOp::Le)
    }
    /// `self > rhs` elementwise (`u8`).
    pub fn gt(&self, rhs: &RTensor) -> Result<RTensor> {
        self.cmp(rhs, CmpOp::Gt)
    }
    /// `self >= rhs` elementwise (`u8`).
    pub fn ge(&self, rhs: &RTensor) -> Result<RTensor> {
        self.cmp(rhs, CmpOp::Ge)
    }
    /// Broadcast both sides to a common shape, then compare.
    fn broadcast_cmp(&self, rhs: &RTensor, op: CmpOp) -> Result<RTensor> {
        let shape = self.shape().broadcast_shape_binary_op(rhs.shape(), "cmp")?;
        self.broadcast_as(&shape)?
            .cmp(&rhs.broadcast_as(&shape)?, op)
    }
    /// `==` with broadcasting (`u8`).
    pub fn broadcast_eq(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_cmp(rhs, CmpOp::Eq)
    }
    /// `!=` with broadcasting (`u8`).
    pub fn broadcast_ne(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_cmp(rhs, CmpOp::Ne)
    }
    /// `<` with broadcasting (`u8`).
    pub fn broadcast_lt(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_cmp(rhs, CmpOp::Lt)
    }
    /// `<=` with broadcasting (`u8`).
    pub fn broadcast_le(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_cmp(rhs, CmpOp::Le)
    }
    /// `>` with broadcasting (`u8`).
    pub fn broadcast_gt(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_cmp(rhs, CmpOp::Gt)
    }
    /// `>=` with broadcasting (`u8`).
    pub fn broadcast_ge(&self, rhs: &RTensor) -> Result<RTensor> {
        self.broadcast_cmp(rhs, CmpOp::Ge)
    }
    /// Index of the maximum along `dim`, keeping it (`u32`).
    pub fn argmax_keepdim<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "argmax")?;
        self.no_grad(
            "argmax",
            &[],
            Arc::new(move |x: &[Tensor]| x[0].argmax_keepdim(dim)),
        )
    }
    /// Index of the maximum along `dim`, removing it (`u32`).
    pub fn argmax<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "argmax")?;
        self.argmax_keepdim(dim)?.squeeze(dim)
    }
    /// Index of the minimum along `dim`, keeping it (`u32`).
    pub fn argmin_keepdim<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "argmin")?;
        self.no_grad(
            "argmin",
            &[],
            Arc::new(move |x: &[Tensor]| x[0].argmin_keepdim(dim)),
        )
    }
    /// Index of the minimum along `dim`, removing it (`u32`).
    pub fn argmin<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "argmin")?;
        self.argmin_keepdim(dim)?.squeeze(dim)
    }

    // ----- constructors in the thread's current context ---------------------------

    /// candle's `Tensor::new(array, device)`, as an input of the thread's
    /// current context ([`Remat::current`]: the context created last on this
    /// thread, or made current with [`Remat::make_current`]).
    pub fn new<A: candle_core::NdArray>(array: A, device: &Device) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::new(array, device)?)
    }
    /// candle's `Tensor::from_vec`, in the current context.
    pub fn from_vec<S: Into<Shape>, V: WithDType>(
        data: Vec<V>,
        shape: S,
        device: &Device,
    ) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::from_vec(data, shape, device)?)
    }
    /// candle's `Tensor::from_slice`, in the current context.
    pub fn from_slice<S: Into<Shape>, V: WithDType>(
        data: &[V],
        shape: S,
        device: &Device,
    ) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::from_slice(data, shape, device)?)
    }
    /// candle's `Tensor::arange(start, end, device)`, in the current context.
    pub fn arange<V: WithDType>(start: V, end: V, device: &Device) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::arange(start, end, device)?)
    }
    /// candle's `Tensor::arange_step`, in the current context.
    pub fn arange_step<V: WithDType>(
        start: V,
        end: V,
        step: V,
        device: &Device,
    ) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::arange_step(start, end, step, device)?)
    }
    /// candle's `Tensor::zeros`, in the current context.
    pub fn zeros<S: Into<Shape>>(shape: S, dtype: DType, device: &Device) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::zeros(shape, dtype, device)?)
    }
    /// candle's `Tensor::ones`, in the current context.
    pub fn ones<S: Into<Shape>>(shape: S, dtype: DType, device: &Device) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::ones(shape, dtype, device)?)
    }
    /// candle's `Tensor::full`, in the current context.
    pub fn full<V: WithDType, S: Into<Shape>>(
        value: V,
        shape: S,
        device: &Device,
    ) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::full(value, shape, device)?)
    }

    // ----- constants in the same context -----------------------------------------

    /// Zeros of `self`'s shape, dtype and device (external data of the context).
    pub fn zeros_like(&self) -> Result<RTensor> {
        self.remat().input(&self.t.zeros_like()?)
    }
    /// Ones of `self`'s shape, dtype and device (external data of the context).
    pub fn ones_like(&self) -> Result<RTensor> {
        self.remat().input(&self.t.ones_like()?)
    }
    /// `value` everywhere, `self`'s shape, dtype and device.
    pub fn full_like(&self, value: f64) -> Result<RTensor> {
        self.remat()
            .input(&Tensor::full(value, self.shape(), self.device())?.to_dtype(self.dtype())?)
    }

    // ----- composites ------------------------------------------------------------------

    /// Softmax over `dim` (candle-nn's `ops::softmax` composition).
    pub fn softmax<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let dim = dim.to_index(self.shape(), "softmax")?;
        let max = self.max_keepdim(dim)?;
        let diff = self.broadcast_sub(&max)?;
        let num = diff.exp()?;
        let den = num.sum_keepdim(dim)?;
        num.broadcast_div(&den)
    }
    /// Softmax over the last dimension.
    pub fn softmax_last_dim(&self) -> Result<RTensor> {
        self.softmax(D::Minus1)
    }
    /// Log-softmax over `dim` (candle-nn's `ops::log_softmax` composition).
    pub fn log_softmax<T: Dim>(&self, dim: T) -> Result<RTensor> {
        let d = dim.to_index(self.shape(), "log-softmax")?;
        let max = self.max_keepdim(d)?;
        let diff = self.broadcast_sub(&max)?;
        let sum_exp = diff.exp()?.sum_keepdim(d)?;
        diff.broadcast_sub(&sum_exp.log()?)
    }
    /// Dropout with probability `p`, its mask drawn from a seed recorded in the op
    /// (so a rematerialization replays the same mask). See [`dropout_mask`].
    pub fn dropout(&self, p: f32) -> Result<RTensor> {
        if !(0. ..1.).contains(&p) {
            return Err(Error::Unsupported {
                op: "dropout",
                message: format!("probability {p} is not in [0, 1)"),
            }
            .into());
        }
        let seed = self.h.ctx.next_dropout_seed();
        self.dropout_with_seed(p, seed)
    }
    /// Dropout with an explicit seed.
    pub fn dropout_with_seed(&self, p: f32, seed: u64) -> Result<RTensor> {
        op1(
            self,
            "dropout",
            false,
            move |x| x.mul(&dropout_mask(seed, x.shape(), p, x.dtype(), x.device())?),
            move |x, _, g| g.mul(&dropout_mask(seed, x.shape(), p, x.dtype(), x.device())?),
        )
    }
}

/// candle's `Shape::broadcast_shape_matmul` (crate-private there).
fn broadcast_shape_matmul(lhs: &Shape, rhs: &Shape) -> Result<(Shape, Shape)> {
    let (ld, rd) = (lhs.dims(), rhs.dims());
    if ld.len() < 2 || rd.len() < 2 {
        return Err(Error::Unsupported {
            op: "broadcast_matmul",
            message: format!("only 2d matrixes are supported {lhs:?} {rhs:?}"),
        }
        .into());
    }
    let (m, lk) = (ld[ld.len() - 2], ld[ld.len() - 1]);
    let (rk, n) = (rd[rd.len() - 2], rd[rd.len() - 1]);
    if lk != rk {
        return Err(Error::Unsupported {
            op: "broadcast_matmul",
            message: format!("different inner dimensions {lhs:?} {rhs:?}"),
        }
        .into());
    }
    let lb = Shape::from(&ld[..ld.len() - 2]);
    let rb = Shape::from(&rd[..rd.len() - 2]);
    let b = lb.broadcast_shape_binary_op(&rb, "broadcast_matmul")?;
    let bd = b.dims();
    Ok((
        Shape::from([bd, &[m, lk]].concat()),
        Shape::from([bd, &[rk, n]].concat()),
    ))
}

/// The dropout mask for `seed`: `(u >= p) / (1 - p)` with `u` uniform in `[0, 1)`
/// from SplitMix64, one draw per element in row-major order. Deterministic, so a
/// plain-candle model can reproduce it (`x * mask`) and a replay gets the same mask.
pub fn dropout_mask(
    seed: u64,
    shape: &Shape,
    p: f32,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let n = shape.elem_count();
    let mut state = seed;
    let scale = 1.0 / (1.0 - p);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let u = (z >> 40) as f32 / (1u64 << 24) as f32;
        v.push(if u >= p { scale } else { 0.0 });
    }
    Tensor::from_vec(v, shape, device)?.to_dtype(dtype)
}

// candle's operator impls (`bin_trait!` in candle-core), over `RTensor`: tensors,
// references, `Result`s of either, and `f64` on either side.
macro_rules! bin_trait {
    ($trait:ident, $fn:ident, $mul:expr, $add:expr) => {
        impl<B: std::borrow::Borrow<RTensor>> std::ops::$trait<B> for RTensor {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: B) -> Result<RTensor> {
                RTensor::$fn(&self, rhs.borrow())
            }
        }
        impl<B: std::borrow::Borrow<RTensor>> std::ops::$trait<B> for &RTensor {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: B) -> Result<RTensor> {
                RTensor::$fn(self, rhs.borrow())
            }
        }
        impl<B: std::borrow::Borrow<RTensor>> std::ops::$trait<RTensor> for Result<B> {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: RTensor) -> Result<RTensor> {
                RTensor::$fn(self?.borrow(), &rhs)
            }
        }
        impl<B: std::borrow::Borrow<RTensor>> std::ops::$trait<&RTensor> for Result<B> {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: &RTensor) -> Result<RTensor> {
                RTensor::$fn(self?.borrow(), rhs)
            }
        }
        impl<B: std::borrow::Borrow<RTensor>> std::ops::$trait<Result<B>> for RTensor {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: Result<B>) -> Result<RTensor> {
                RTensor::$fn(&self, rhs?.borrow())
            }
        }
        impl<B: std::borrow::Borrow<RTensor>> std::ops::$trait<Result<B>> for &RTensor {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: Result<B>) -> Result<RTensor> {
                RTensor::$fn(self, rhs?.borrow())
            }
        }
        impl std::ops::$trait<f64> for RTensor {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: f64) -> Result<RTensor> {
                self.affine($mul(rhs), $add(rhs))
            }
        }
        impl std::ops::$trait<f64> for &RTensor {
            type Output = Result<RTensor>;
            fn $fn(self, rhs: f64) -> Result<RTensor> {
                self.affine($mul(rhs), $add(rhs))
            }
        }
    };
}

bin_trait!(Add, add, |_| 1., |v| v);
bin_trait!(Sub, sub, |_| 1., |v: f64| -v);
bin_trait!(Mul, mul, |v| v, |_| 0.);
bin_trait!(Div, div, |v| 1. / v, |_| 0.);

macro_rules! scalar_lhs {
    ($($t:ty),+) => {
        $(
            impl std::ops::Add<$t> for f64 {
                type Output = Result<RTensor>;
                fn add(self, rhs: $t) -> Result<RTensor> {
                    rhs + self
                }
            }
            impl std::ops::Mul<$t> for f64 {
                type Output = Result<RTensor>;
                fn mul(self, rhs: $t) -> Result<RTensor> {
                    rhs * self
                }
            }
            impl std::ops::Sub<$t> for f64 {
                type Output = Result<RTensor>;
                fn sub(self, rhs: $t) -> Result<RTensor> {
                    rhs.affine(-1., self)
                }
            }
            impl std::ops::Div<$t> for f64 {
                type Output = Result<RTensor>;
                #[allow(clippy::suspicious_arithmetic_impl)]
                fn div(self, rhs: $t) -> Result<RTensor> {
                    rhs.recip()? * self
                }
            }
        )+
    };
}

scalar_lhs!(RTensor, &RTensor);
