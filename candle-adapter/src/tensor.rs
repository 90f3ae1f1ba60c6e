//! [`RTensor`]: a rematerializing tensor whose ops mirror candle's `Tensor`.
//!
//! Each op runs the real candle op, registers the output with the DTR runtime with
//! its recompute closure, and attaches it to candle's autograd graph (see the
//! crate-private `graph` module). Views (reshape, transpose, narrow, broadcast,
//! squeeze…) are candle's own layout-only views on the attached tensor: they share
//! the storage cell and the runtime handle, so an evicted base is restored for all
//! its views at once.
//!
//! The ops are grouped in submodules by kind: `unary`, `binary` (and the
//! operator impls), `conv` (convolutions, pooling, upsampling), `indexing`,
//! `compare`; views, reductions, matmul, constructors and composites are here.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::op::CmpOp;
use candle_core::shape::{Dim, Dims, ShapeWithOneHole};
use candle_core::{DType, Device, Shape, Tensor, WithDType, D};
use remat_dtr::{StorageId, TensorId};

use crate::context::{Inner, Remat};
use crate::error::{DtrResultExt, Error, Result};
use crate::graph::{apply, apply_native, escape};

mod binary;
mod compare;
mod conv;
mod convert;
mod indexing;
mod unary;

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

impl Handle {
    /// The runtime handle.
    pub(crate) fn id(&self) -> TensorId {
        self.id
    }
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

    /// Whether the storage is in the host tier now (swapped out; see
    /// [`RematConfig::with_swap`](crate::RematConfig::with_swap)). Reading it
    /// through this tensor copies it back.
    pub fn is_swapped(&self) -> Result<bool> {
        self.h.ctx.lock()?.is_swapped(self.h.id).c()
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
    pub fn reshape<S: ShapeWithOneHole>(&self, s: S) -> Result<RTensor> {
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
    // ----- constructors in the thread's current context ---------------------------

    /// candle's `Tensor::new(array, device)`, as an input of the thread's
    /// current context ([`Remat::current`]: the context created last on this
    /// thread, or made current with [`Remat::make_current`]).
    pub fn new<A: candle_core::NdArray>(array: A, device: &Device) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::new(array, device)?)
    }
    /// candle's `Tensor::from_vec`, in the current context. `shape` is any
    /// of candle's shapes, one dimension of which may be a hole `()` that the
    /// length of `data` fills (`(b, ())`).
    pub fn from_vec<S: ShapeWithOneHole, V: WithDType>(
        data: Vec<V>,
        shape: S,
        device: &Device,
    ) -> Result<RTensor> {
        Remat::current()?.input(&Tensor::from_vec(data, shape, device)?)
    }
    /// candle's `Tensor::from_slice`, in the current context; `shape` may
    /// have one hole `()` (as for [`RTensor::from_vec`]).
    pub fn from_slice<S: ShapeWithOneHole, V: WithDType>(
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
