//! Comparisons and arg-reductions on [`RTensor`]: no gradient, as in candle.

use super::*;

impl RTensor {
    /// An op that gives no input a gradient (comparisons, arg-reductions,
    /// rounding), run like any other so that it can be evicted and replayed.
    pub(super) fn no_grad(
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
}
