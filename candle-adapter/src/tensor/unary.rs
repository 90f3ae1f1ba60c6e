//! Unary ops on [`RTensor`]: element-wise maps, activations, casts and
//! dropout, each with candle's backward formula.

use super::*;

impl RTensor {
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
}
