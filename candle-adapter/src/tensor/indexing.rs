//! Indexing ops on [`RTensor`]: select, gather, scatter-style adds, `cat`,
//! `stack`, padding and masking, with candle's gradients.

use super::*;

impl RTensor {
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
}
