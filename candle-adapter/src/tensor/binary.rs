//! Binary ops on [`RTensor`]: element-wise arithmetic, maximum and minimum,
//! same-shape or broadcast, each with candle's backward formula, and the
//! operator impls (`+ - * /` on tensors, references, `Result`s and `f64`).

use super::*;

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
