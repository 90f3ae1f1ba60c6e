//! Layers mirroring candle-nn, over [`RTensor`]s: porting a model is mostly a
//! change of imports. Parameters come from a candle-nn `VarBuilder` (so a `VarMap`
//! and candle-nn's optimizers work unchanged) with candle-nn's initializations, and
//! each forward uses the same candle ops in the same order as candle-nn's, so the
//! results equal a plain candle-nn model's bit for bit.

use candle_core::{DType, Tensor, D};

/// candle-nn's configuration structs, initializers, optimizers and variable
/// map, taken where candle-nn takes them.
pub use candle_nn::{
    init, AdamW, BatchNormConfig, Conv1dConfig, Conv2dConfig, ConvTranspose2dConfig, Init,
    LayerNormConfig, ParamsAdamW, VarMap, SGD,
};

use crate::context::Remat;
use crate::error::{Error, Result};
use crate::tensor::RTensor;

/// A layer: `forward` on rematerializing tensors.
pub trait Module {
    /// Apply the layer.
    fn forward(&self, xs: &RTensor) -> Result<RTensor>;
}

impl<F: Fn(&RTensor) -> Result<RTensor>> Module for F {
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        self(xs)
    }
}

impl<M: Module> Module for Option<&M> {
    /// The identity when `None` (candle-nn's impl).
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        match self {
            None => Ok(xs.clone()),
            Some(m) => m.forward(xs),
        }
    }
}

/// A layer whose forward depends on training (candle-nn's `ModuleT`): dropout,
/// for instance. Every [`Module`] is one, ignoring the flag.
pub trait ModuleT {
    /// Apply the layer, in training mode when `train`.
    fn forward_t(&self, xs: &RTensor, train: bool) -> Result<RTensor>;
}

impl<M: Module> ModuleT for M {
    fn forward_t(&self, xs: &RTensor, _train: bool) -> Result<RTensor> {
        self.forward(xs)
    }
}

/// candle-nn's `VarBuilder` carrying its [`Remat`] context: the layer builders
/// of this module take it where candle-nn's take theirs (`linear(in, out, vb)`),
/// and [`VarBuilder::get`] returns the variable as an [`RTensor`] of the context
/// (shared with the `Var`, counted once however often it is fetched).
///
/// [`VarBuilder::from_varmap`] has candle-nn's signature and takes the thread's
/// current context ([`Remat::current`]), so a training loop that builds its
/// model with `VarBuilder::from_varmap(&varmap, DType::F32, &dev)` ports
/// unchanged; [`VarBuilder::from_varmap_in`] names the context.
#[derive(Clone)]
pub struct VarBuilder<'a> {
    inner: candle_nn::VarBuilder<'a>,
    /// The context; `None` when none was current at creation (then the one
    /// current when a variable is fetched, or a typed error).
    remat: Option<Remat>,
}

impl<'a> VarBuilder<'a> {
    /// Wrap candle-nn's builder for `remat`.
    pub fn new(remat: &Remat, inner: candle_nn::VarBuilder<'a>) -> Self {
        Self {
            inner,
            remat: Some(remat.clone()),
        }
    }
    /// Variables of `varmap` (created on first use with the builders'
    /// initializations), in the thread's current context: candle-nn's
    /// `VarBuilder::from_varmap`, same signature. The context is the one
    /// current now ([`Remat::current`]: created last on this thread, or made
    /// current); if none is, the one current when a variable is fetched, and a
    /// typed error then if there is still none.
    pub fn from_varmap(varmap: &VarMap, dtype: DType, device: &candle_core::Device) -> Self {
        Self {
            inner: candle_nn::VarBuilder::from_varmap(varmap, dtype, device),
            remat: Remat::current().ok(),
        }
    }
    /// Variables of `varmap` in the context `remat` (see
    /// [`VarBuilder::from_varmap`]).
    pub fn from_varmap_in(
        remat: &Remat,
        varmap: &VarMap,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Self {
        Self::new(
            remat,
            candle_nn::VarBuilder::from_varmap(varmap, dtype, device),
        )
    }
    /// The context (see [`VarBuilder::from_varmap`]); a typed error when the
    /// builder has none and none is current.
    pub fn remat(&self) -> Result<Remat> {
        match &self.remat {
            Some(r) => Ok(r.clone()),
            None => Remat::current(),
        }
    }
    /// candle-nn's builder underneath (for plain candle-nn layers).
    pub fn candle(&self) -> &candle_nn::VarBuilder<'a> {
        &self.inner
    }
    /// The builder under the prefix `s` (candle-nn's `pp`).
    pub fn pp<S: ToString>(&self, s: S) -> Self {
        Self {
            inner: self.inner.pp(s),
            remat: self.remat.clone(),
        }
    }
    /// The same as [`VarBuilder::pp`].
    pub fn push_prefix<S: ToString>(&self, s: S) -> Self {
        self.pp(s)
    }
    /// The device of the variables.
    pub fn device(&self) -> &candle_core::Device {
        self.inner.device()
    }
    /// The dtype of the variables.
    pub fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    /// Whether a variable `name` exists under the prefix.
    pub fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
    /// The variable `name` of shape `s` (candle-nn's default initialization when
    /// created), as an input of the context.
    pub fn get<S: Into<candle_core::Shape>>(&self, s: S, name: &str) -> Result<RTensor> {
        self.remat()?.input(&self.inner.get(s, name)?)
    }
    /// The variable `name` of shape `s`, initialized by `init` when created.
    pub fn get_with_hints<S: Into<candle_core::Shape>>(
        &self,
        s: S,
        name: &str,
        init: Init,
    ) -> Result<RTensor> {
        self.remat()?
            .input(&self.inner.get_with_hints(s, name, init)?)
    }
}

/// A candle-nn optimizer stepping from an [`RTensor`] loss: candle-nn's
/// `Optimizer` under the same name, implemented for every candle-nn optimizer
/// (`AdamW`, `SGD`), with `backward_step` taking the adapter's loss. Import it
/// instead of candle-nn's.
pub trait Optimizer: Sized {
    /// The optimizer's settings (`ParamsAdamW`, `f64` for SGD).
    type Config: Sized;
    /// An optimizer over `vars`.
    fn new(vars: Vec<candle_core::Var>, config: Self::Config) -> Result<Self>;
    /// One step from the gradients.
    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()>;
    /// The learning rate.
    fn learning_rate(&self) -> f64;
    /// Set the learning rate.
    fn set_learning_rate(&mut self, lr: f64);
    /// One training step from the adapter's loss: `loss.backward()`, the loss
    /// made resident, [`Optimizer::step`], then [`Remat::end_iteration`].
    ///
    /// Ending the iteration is what keeps a value read after the step honest:
    /// the step changes the parameters in place, so a value evicted before it
    /// could otherwise be recomputed from the new weights. The loss is resident
    /// when this returns (reading it gives this step's value, as in candle's
    /// `backward_step` then `loss.to_vec0()`), and any value the step left
    /// evicted reads as a typed `StaleValue` error, never as a recomputation.
    /// Under a budget, the step's activations that only the loss's graph still
    /// holds (no tensor of the user's refers to them) are evicted before the
    /// iteration ends: a loop that keeps the loss through an evaluation (as
    /// candle's mnist-training does) then does not keep the step's activations
    /// resident with it.
    /// Do not call `end_iteration` again for this step.
    fn backward_step(&mut self, loss: &RTensor) -> Result<()> {
        let grads = loss.backward()?;
        drop(loss.pinned()?);
        self.step(&grads)?;
        loss.remat().end_iteration_after_backward()?;
        Ok(())
    }
}

impl<O: candle_nn::Optimizer> Optimizer for O {
    type Config = O::Config;
    fn new(vars: Vec<candle_core::Var>, config: Self::Config) -> Result<Self> {
        <O as candle_nn::Optimizer>::new(vars, config)
    }
    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()> {
        <O as candle_nn::Optimizer>::step(self, grads)
    }
    fn learning_rate(&self) -> f64 {
        <O as candle_nn::Optimizer>::learning_rate(self)
    }
    fn set_learning_rate(&mut self, lr: f64) {
        <O as candle_nn::Optimizer>::set_learning_rate(self, lr)
    }
}

/// A fully connected layer, `x Wᵀ + b` (candle-nn's `Linear`).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: RTensor,
    bias: Option<RTensor>,
}

impl Linear {
    /// A layer over `weight: (out, in)` and an optional `bias: (out,)`
    /// (candle-nn's `Linear::new`). Give the embedding table itself to tie an
    /// output layer to it: one storage, counted once.
    pub fn new(weight: RTensor, bias: Option<RTensor>) -> Self {
        Self { weight, bias }
    }
    /// The same as [`Linear::new`] (candle-transformers' `with_tracing` name).
    pub fn from_weights(weight: RTensor, bias: Option<RTensor>) -> Self {
        Self::new(weight, bias)
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, l: &candle_nn::Linear) -> Result<Self> {
        Ok(Self {
            weight: remat.input(l.weight())?,
            bias: l.bias().map(|b| remat.input(b)).transpose()?,
        })
    }
    /// The weight, `(out, in)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The bias, `(out,)`.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
}

impl Module for Linear {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let x = match *x.dims() {
            [b1, b2, m, k] => {
                if x.is_contiguous() {
                    let w = self.weight.t()?;
                    x.reshape((b1 * b2 * m, k))?
                        .matmul(&w)?
                        .reshape((b1, b2, m, ()))?
                } else {
                    let w = self.weight.broadcast_left((b1, b2))?.t()?;
                    x.matmul(&w)?
                }
            }
            [bsize, m, k] => {
                if x.is_contiguous() {
                    let w = self.weight.t()?;
                    x.reshape((bsize * m, k))?
                        .matmul(&w)?
                        .reshape((bsize, m, ()))?
                } else {
                    let w = self.weight.broadcast_left(bsize)?.t()?;
                    x.matmul(&w)?
                }
            }
            _ => {
                let w = self.weight.t()?;
                x.matmul(&w)?
            }
        };
        match &self.bias {
            None => Ok(x),
            Some(bias) => x.broadcast_add(bias),
        }
    }
}

/// candle-nn's `linear` (with bias) over `vb`.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    Linear::from_candle(
        &vb.remat()?,
        &candle_nn::linear(in_dim, out_dim, vb.inner.clone())?,
    )
}

/// candle-nn's `linear_b`: with a bias when `bias`.
pub fn linear_b(in_dim: usize, out_dim: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    Linear::from_candle(
        &vb.remat()?,
        &candle_nn::linear_b(in_dim, out_dim, bias, vb.inner.clone())?,
    )
}

/// candle-nn's `linear_no_bias` over `vb`.
pub fn linear_no_bias(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    Linear::from_candle(
        &vb.remat()?,
        &candle_nn::linear_no_bias(in_dim, out_dim, vb.inner.clone())?,
    )
}

/// A 1D convolution (candle-nn's `Conv1d`, any `groups`).
#[derive(Debug, Clone)]
pub struct Conv1d {
    weight: RTensor,
    bias: Option<RTensor>,
    config: Conv1dConfig,
}

impl Conv1d {
    /// A layer over `weight: (c_out, c_in / groups, k)`, an optional
    /// `bias: (c_out,)` and candle-nn's config (candle-nn's `Conv1d::new`).
    pub fn new(weight: RTensor, bias: Option<RTensor>, config: Conv1dConfig) -> Self {
        Self {
            weight,
            bias,
            config,
        }
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, c: &candle_nn::Conv1d) -> Result<Self> {
        Ok(Self::new(
            remat.input(c.weight())?,
            c.bias().map(|b| remat.input(b)).transpose()?,
            *c.config(),
        ))
    }
    /// The kernel, `(c_out, c_in / groups, k)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The bias, `(c_out,)`.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
    /// The configuration.
    pub fn config(&self) -> &Conv1dConfig {
        &self.config
    }
}

impl Module for Conv1d {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let c = &self.config;
        // With a bias: one op (see `RTensor::conv1d_bias`), candle-nn's values.
        match &self.bias {
            None => x.conv1d(&self.weight, c.padding, c.stride, c.dilation, c.groups),
            Some(b) => x.conv1d_bias(&self.weight, b, c.padding, c.stride, c.dilation, c.groups),
        }
    }
}

/// candle-nn's `conv1d` over `vb`.
pub fn conv1d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv1dConfig,
    vb: VarBuilder,
) -> Result<Conv1d> {
    Conv1d::from_candle(
        &vb.remat()?,
        &candle_nn::conv1d(
            in_channels,
            out_channels,
            kernel_size,
            cfg,
            vb.inner.clone(),
        )?,
    )
}

/// candle-nn's `conv1d_no_bias` over `vb`.
pub fn conv1d_no_bias(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv1dConfig,
    vb: VarBuilder,
) -> Result<Conv1d> {
    Conv1d::from_candle(
        &vb.remat()?,
        &candle_nn::conv1d_no_bias(
            in_channels,
            out_channels,
            kernel_size,
            cfg,
            vb.inner.clone(),
        )?,
    )
}

/// A 2D convolution (candle-nn's `Conv2d`, any `groups`).
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: RTensor,
    bias: Option<RTensor>,
    config: Conv2dConfig,
}

impl Conv2d {
    /// A layer over `weight: (c_out, c_in / groups, kh, kw)`, an optional
    /// `bias: (c_out,)` and candle-nn's config (candle-nn's `Conv2d::new`).
    pub fn new(weight: RTensor, bias: Option<RTensor>, config: Conv2dConfig) -> Self {
        Self {
            weight,
            bias,
            config,
        }
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, c: &candle_nn::Conv2d) -> Result<Self> {
        Ok(Self::new(
            remat.input(c.weight())?,
            c.bias().map(|b| remat.input(b)).transpose()?,
            *c.config(),
        ))
    }
    /// The kernel, `(c_out, c_in / groups, kh, kw)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The bias, `(c_out,)`.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
    /// The configuration.
    pub fn config(&self) -> &Conv2dConfig {
        &self.config
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let c = &self.config;
        // With a bias: one op (see `RTensor::conv2d_bias`), candle-nn's values.
        match &self.bias {
            None => x.conv2d(&self.weight, c.padding, c.stride, c.dilation, c.groups),
            Some(b) => x.conv2d_bias(&self.weight, b, c.padding, c.stride, c.dilation, c.groups),
        }
    }
}

/// A 2D transposed convolution (candle-nn's `ConvTranspose2d`).
#[derive(Debug, Clone)]
pub struct ConvTranspose2d {
    weight: RTensor,
    bias: Option<RTensor>,
    config: ConvTranspose2dConfig,
}

impl ConvTranspose2d {
    /// A layer over `weight: (c_in, c_out, kh, kw)`, an optional `bias: (c_out,)`
    /// and candle-nn's config (candle-nn's `ConvTranspose2d::new`).
    pub fn new(weight: RTensor, bias: Option<RTensor>, config: ConvTranspose2dConfig) -> Self {
        Self {
            weight,
            bias,
            config,
        }
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, c: &candle_nn::ConvTranspose2d) -> Result<Self> {
        Ok(Self::new(
            remat.input(c.weight())?,
            c.bias().map(|b| remat.input(b)).transpose()?,
            *c.config(),
        ))
    }
    /// The kernel, `(c_in, c_out, kh, kw)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The bias, `(c_out,)`.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
}

impl Module for ConvTranspose2d {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let c = &self.config;
        let (w, p, op, s, d) = (
            &self.weight,
            c.padding,
            c.output_padding,
            c.stride,
            c.dilation,
        );
        // With a bias: one op (see `RTensor::conv_transpose2d_bias`), candle-nn's values.
        match &self.bias {
            None => x.conv_transpose2d(w, p, op, s, d),
            Some(b) => x.conv_transpose2d_bias(w, b, p, op, s, d),
        }
    }
}

/// candle-nn's `conv_transpose2d` over `vb`.
pub fn conv_transpose2d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: ConvTranspose2dConfig,
    vb: VarBuilder,
) -> Result<ConvTranspose2d> {
    ConvTranspose2d::from_candle(
        &vb.remat()?,
        &candle_nn::conv_transpose2d(
            in_channels,
            out_channels,
            kernel_size,
            cfg,
            vb.inner.clone(),
        )?,
    )
}

/// candle-nn's `conv2d` over `vb`.
pub fn conv2d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv2dConfig,
    vb: VarBuilder,
) -> Result<Conv2d> {
    Conv2d::from_candle(
        &vb.remat()?,
        &candle_nn::conv2d(
            in_channels,
            out_channels,
            kernel_size,
            cfg,
            vb.inner.clone(),
        )?,
    )
}

/// candle-nn's `conv2d_no_bias` over `vb`.
pub fn conv2d_no_bias(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv2dConfig,
    vb: VarBuilder,
) -> Result<Conv2d> {
    Conv2d::from_candle(
        &vb.remat()?,
        &candle_nn::conv2d_no_bias(
            in_channels,
            out_channels,
            kernel_size,
            cfg,
            vb.inner.clone(),
        )?,
    )
}

/// Layer normalization over the last dimension (candle-nn's `LayerNorm`): the
/// composition of candle-nn's `LayerNorm::forward` (its non-fused path, which
/// has a gradient; the fused kernel has none), with or without bias, and
/// without the mean for RMS normalization.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: RTensor,
    bias: Option<RTensor>,
    remove_mean: bool,
    eps: f64,
}

impl LayerNorm {
    /// With weight and bias (candle-nn's `LayerNorm::new`).
    pub fn new(weight: RTensor, bias: RTensor, eps: f64) -> Self {
        Self {
            weight,
            bias: Some(bias),
            remove_mean: true,
            eps,
        }
    }
    /// Without bias (candle-nn's `LayerNorm::new_no_bias`).
    pub fn new_no_bias(weight: RTensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            remove_mean: true,
            eps,
        }
    }
    /// RMS normalization: no mean, no bias (candle-nn's `LayerNorm::rms_norm`).
    pub fn rms_norm(weight: RTensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            remove_mean: false,
            eps,
        }
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, ln: &candle_nn::LayerNorm) -> Result<Self> {
        Ok(Self {
            weight: remat.input(ln.weight())?,
            bias: ln.bias().map(|b| remat.input(b)).transpose()?,
            remove_mean: ln.remove_mean(),
            eps: ln.eps(),
        })
    }
    /// The scale, `(size,)`.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The shift, `(size,)`, when there is one.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        let x_dtype = x.dtype();
        let internal_dtype = match x_dtype {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let hidden_size = x.dim(D::Minus1)?;
        let x = x.to_dtype(internal_dtype)?;
        let x = if self.remove_mean {
            let mean_x = (x.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
            x.broadcast_sub(&mean_x)?
        } else {
            x
        };
        let norm_x = (x.sqr()?.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
        let x_normed = x.broadcast_div(&(norm_x + self.eps)?.sqrt()?)?;
        let x = x_normed.to_dtype(x_dtype)?.broadcast_mul(&self.weight)?;
        match &self.bias {
            None => Ok(x),
            Some(bias) => x.broadcast_add(bias),
        }
    }
}

/// candle-nn's `layer_norm` over `vb` (weight 1, bias 0 when `affine`); `config`
/// is a `LayerNormConfig` or an `eps: f64`.
pub fn layer_norm<C: Into<LayerNormConfig>>(
    size: usize,
    config: C,
    vb: VarBuilder,
) -> Result<LayerNorm> {
    LayerNorm::from_candle(
        &vb.remat()?,
        &candle_nn::layer_norm(size, config, vb.inner.clone())?,
    )
}

/// candle-nn's `layer_norm_no_bias` over `vb`.
pub fn layer_norm_no_bias(size: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
    LayerNorm::from_candle(
        &vb.remat()?,
        &candle_nn::layer_norm_no_bias(size, eps, vb.inner.clone())?,
    )
}

/// RMS normalization (candle-nn's `RmsNorm`). Its forward is candle-nn's
/// `RmsNorm::forward_diff` (the differentiable composition): candle-nn's
/// `forward` uses a fused kernel without backward on contiguous input, so a
/// plain-candle reference must call `forward_diff` to train (see docs/candle.md).
#[derive(Debug, Clone)]
pub struct RmsNorm(LayerNorm);

impl RmsNorm {
    /// Over `weight: (size,)` (candle-nn's `RmsNorm::new`).
    pub fn new(weight: RTensor, eps: f64) -> Self {
        Self(LayerNorm::rms_norm(weight, eps))
    }
    /// The layer norm it is.
    pub fn into_inner(self) -> LayerNorm {
        self.0
    }
    /// The scale, `(size,)`.
    pub fn weight(&self) -> &RTensor {
        self.0.weight()
    }
    /// The same as `forward` (candle-nn's name for the differentiable path).
    pub fn forward_diff(&self, xs: &RTensor) -> Result<RTensor> {
        self.0.forward(xs)
    }
}

impl Module for RmsNorm {
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        self.0.forward(xs)
    }
}

/// candle-nn's `rms_norm` over `vb` (weight 1).
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<RmsNorm> {
    let rms = candle_nn::rms_norm(size, eps, vb.inner.clone())?;
    Ok(RmsNorm::new(vb.remat()?.input(rms.weight())?, eps))
}

/// Batch normalization in training mode over dimension 1 (batch statistics, the
/// composition of candle-nn's `BatchNorm::forward_train` without its running
/// statistics, which candle-nn updates in place and a replay could not repeat).
#[derive(Debug, Clone)]
pub struct BatchNorm {
    weight: RTensor,
    bias: RTensor,
    eps: f64,
}

impl Module for BatchNorm {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        if x.rank() < 2 {
            return Err(Error::Unsupported {
                op: "batch_norm",
                message: format!("input of rank {} (at least 2)", x.rank()),
            }
            .into());
        }
        let x_t = x.transpose(0, 1)?;
        let dims_t = x_t.dims().to_vec();
        let x_t = x_t.flatten_from(1)?.contiguous()?;
        let mean_x = x_t.mean_keepdim(1)?;
        let x_t = x_t.broadcast_sub(&mean_x)?;
        let norm_x = x_t.sqr()?.mean_keepdim(1)?;
        let x_t = x_t.broadcast_div(&(norm_x + self.eps)?.sqrt()?)?;
        let c = self.weight.dims()[0];
        let w = self.weight.reshape((c, 1))?;
        let b = self.bias.reshape((c, 1))?;
        let x_t = x_t.broadcast_mul(&w)?.broadcast_add(&b)?;
        x_t.reshape(dims_t)?.transpose(0, 1)
    }
}

/// Batch norm parameters (weight 1, bias 0) over `vb`, as candle-nn's
/// `batch_norm` names them.
/// `config` is candle-nn's `BatchNormConfig` or an `eps: f64`; only its `eps`
/// is used (no running statistics).
pub fn batch_norm<C: Into<BatchNormConfig>>(
    channels: usize,
    config: C,
    vb: VarBuilder,
) -> Result<BatchNorm> {
    Ok(BatchNorm {
        weight: vb.get_with_hints(channels, "weight", candle_nn::Init::Const(1.))?,
        bias: vb.get_with_hints(channels, "bias", candle_nn::Init::Const(0.))?,
        eps: config.into().eps,
    })
}

/// An embedding table (candle-nn's `Embedding`).
#[derive(Debug, Clone)]
pub struct Embedding {
    table: RTensor,
    hidden_size: usize,
}

impl Embedding {
    /// A table `(n, hidden_size)` (candle-nn's `Embedding::new`).
    pub fn new(embeddings: RTensor, hidden_size: usize) -> Self {
        Self {
            table: embeddings,
            hidden_size,
        }
    }
    /// The table, `(n, hidden_size)`: give it to [`Linear::new`] to tie an
    /// output layer to it.
    pub fn embeddings(&self) -> &RTensor {
        &self.table
    }
    /// The width of an embedding.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }
}

impl Module for Embedding {
    /// `ids`: an integer tensor of any shape; the output adds a last dimension.
    fn forward(&self, ids: &RTensor) -> Result<RTensor> {
        let mut final_dims = ids.dims().to_vec();
        final_dims.push(self.hidden_size);
        let ids = ids.flatten_all()?;
        let values = self.table.index_select(&ids, 0)?;
        values.reshape(final_dims)
    }
}

/// candle-nn's `embedding` over `vb`.
pub fn embedding(n: usize, hidden: usize, vb: VarBuilder) -> Result<Embedding> {
    let e = candle_nn::embedding(n, hidden, vb.inner.clone())?;
    Ok(Embedding {
        table: vb.remat()?.input(e.embeddings())?,
        hidden_size: hidden,
    })
}

/// candle-nn's `Activation` itself (so configs that deserialize it, such as
/// candle-transformers' `hidden_act`, work unchanged), applied to [`RTensor`]s
/// with candle-nn's formula for every variant: `Gelu` is the erf GELU,
/// `NewGelu` and `GeluPytorchTanh` the tanh approximation.
pub use candle_nn::Activation;

impl Module for Activation {
    fn forward(&self, xs: &RTensor) -> Result<RTensor> {
        match *self {
            Activation::Gelu => xs.gelu_erf(),
            Activation::NewGelu | Activation::GeluPytorchTanh => xs.gelu(),
            Activation::Relu => xs.relu(),
            Activation::Relu2 => xs.relu()?.sqr(),
            Activation::Relu6 => xs.clamp(0., 6.),
            Activation::Silu => xs.silu(),
            Activation::Sigmoid => xs.sigmoid(),
            Activation::HardSigmoid => ops::hard_sigmoid(xs),
            Activation::Swiglu => ops::swiglu(xs),
            Activation::Swish => xs * xs.sigmoid()?,
            Activation::HardSwish => xs * ops::hard_sigmoid(xs)?,
            Activation::Mish => ops::mish(xs),
            Activation::Elu(alpha) => xs.elu(alpha),
            Activation::LeakyRelu(slope) => ops::leaky_relu(xs, slope),
        }
    }
}

/// Dropout with probability `p` in training, the identity otherwise
/// (candle-nn's `Dropout`, a [`ModuleT`]). Each training call draws a recorded
/// seed (see [`RTensor::dropout`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Drop probability.
    pub p: f32,
}

impl Dropout {
    /// Dropout with probability `p` (checked when applied: `[0, 1)`).
    pub fn new(p: f32) -> Self {
        Self { p }
    }

    /// candle-nn's `Dropout::forward(xs, train)`.
    pub fn forward(&self, xs: &RTensor, train: bool) -> Result<RTensor> {
        if train {
            xs.dropout(self.p)
        } else {
            Ok(xs.clone())
        }
    }
}

impl ModuleT for Dropout {
    fn forward_t(&self, xs: &RTensor, train: bool) -> Result<RTensor> {
        self.forward(xs, train)
    }
}

/// Multi-head self-attention: `softmax(q kᵀ / √d + mask) v` over `heads` heads,
/// with input, key, value and output projections.
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
    head_dim: usize,
}

impl MultiHeadAttention {
    /// Projections `q`, `k`, `v`, `o` of `dim × dim` under `vb`.
    pub fn new(dim: usize, heads: usize, vb: VarBuilder) -> Result<Self> {
        if heads == 0 || dim % heads != 0 {
            return Err(Error::Unsupported {
                op: "attention",
                message: format!("{dim} is not divisible into {heads} heads"),
            }
            .into());
        }
        Ok(Self {
            q: linear(dim, dim, vb.pp("q"))?,
            k: linear(dim, dim, vb.pp("k"))?,
            v: linear(dim, dim, vb.pp("v"))?,
            o: linear(dim, dim, vb.pp("o"))?,
            heads,
            head_dim: dim / heads,
        })
    }

    /// Attention over `x: (b, t, dim)` with an optional additive `mask: (t, t)`.
    pub fn forward_masked(&self, x: &RTensor, mask: Option<&RTensor>) -> Result<RTensor> {
        let (b, t, dim) = match *x.dims() {
            [b, t, d] => (b, t, d),
            _ => {
                return Err(Error::Unsupported {
                    op: "attention",
                    message: format!("input of shape {:?} (expected (b, t, dim))", x.dims()),
                }
                .into())
            }
        };
        let split = |y: RTensor| -> Result<RTensor> {
            y.reshape((b, t, self.heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.q.forward(x)?)?;
        let k = split(self.k.forward(x)?)?;
        let v = split(self.v.forward(x)?)?;
        let scale = 1f64 / (self.head_dim as f64).sqrt();
        let att = (q.matmul(&k.t()?)? * scale)?;
        let att = match mask {
            Some(m) => att.broadcast_add(m)?,
            None => att,
        };
        let att = att.softmax_last_dim()?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, dim))?;
        self.o.forward(&y)
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        self.forward_masked(x, None)
    }
}

/// A causal mask `(t, t)`: 0 on and below the diagonal, −∞ above (plain tensor;
/// bring it in with [`Remat::input`]).
pub fn causal_mask(t: usize, dtype: DType, device: &candle_core::Device) -> Result<Tensor> {
    let v: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(v, (t, t), device)?.to_dtype(dtype)
}

/// Losses mirroring `candle_nn::loss`.
pub mod loss {
    use crate::error::{Error, Result};
    use crate::tensor::RTensor;

    /// Negative log likelihood of `inp: (b, c)` log-probabilities at `target: (b,)`
    /// class ids.
    pub fn nll(inp: &RTensor, target: &RTensor) -> Result<RTensor> {
        let b_sz = match *target.dims() {
            [b] => b,
            ref d => {
                return Err(Error::Unsupported {
                    op: "nll",
                    message: format!("target of shape {d:?} (expected one dimension)"),
                }
                .into())
            }
        };
        match *inp.dims() {
            [ib, _] if ib == b_sz => {}
            ref d => {
                return Err(Error::Unsupported {
                    op: "nll",
                    message: format!("input of shape {d:?} for a batch of {b_sz}"),
                }
                .into())
            }
        }
        inp.gather(&target.unsqueeze(1)?, 1)?
            .sum_all()?
            .affine(-1f64 / b_sz as f64, 0.)
    }

    /// Cross-entropy of logits `inp: (b, c)` against class ids `target: (b,)`.
    pub fn cross_entropy(inp: &RTensor, target: &RTensor) -> Result<RTensor> {
        if inp.rank() != 2 {
            return Err(Error::Unsupported {
                op: "cross_entropy",
                message: format!("input of rank {} (expected 2)", inp.rank()),
            }
            .into());
        }
        nll(&inp.log_softmax(1)?, target)
    }

    /// Mean squared error.
    pub fn mse(inp: &RTensor, target: &RTensor) -> Result<RTensor> {
        (inp - target)?.sqr()?.mean_all()
    }
}

/// candle-nn's `ops` under the same names, over [`RTensor`]s. Fused candle-nn
/// kernels without a CPU backward (`softmax_last_dim`, `rms_norm`, `layer_norm`)
/// are their differentiable compositions here (`softmax`, `rms_norm_slow`,
/// `layer_norm_slow`): the same values, and a gradient.
pub mod ops {
    use candle_core::shape::Dim;
    use candle_core::{DType, D};

    use crate::error::Result;
    use crate::tensor::RTensor;

    /// Softmax over `dim` (candle-nn's composition).
    pub fn softmax<T: Dim>(xs: &RTensor, dim: T) -> Result<RTensor> {
        xs.softmax(dim)
    }
    /// Softmax over the last dimension (candle-nn's `softmax(xs, D::Minus1)`; its
    /// fused `softmax_last_dim` has no CPU backward).
    pub fn softmax_last_dim(xs: &RTensor) -> Result<RTensor> {
        xs.softmax(D::Minus1)
    }
    /// Log-softmax over `d` (candle-nn's composition).
    pub fn log_softmax<T: Dim>(xs: &RTensor, d: T) -> Result<RTensor> {
        xs.log_softmax(d)
    }
    /// SiLU.
    pub fn silu(xs: &RTensor) -> Result<RTensor> {
        xs.silu()
    }
    /// `silu(a) * b` of the two halves of the last dimension.
    pub fn swiglu(xs: &RTensor) -> Result<RTensor> {
        let xs = xs.chunk(2, D::Minus1)?;
        &xs[0].silu()? * &xs[1]
    }
    /// Logistic sigmoid (candle-nn's op and its backward).
    pub fn sigmoid(xs: &RTensor) -> Result<RTensor> {
        xs.sigmoid()
    }
    /// Dropout with probability `p` (a recorded seed, see [`RTensor::dropout`]).
    pub fn dropout(xs: &RTensor, p: f32) -> Result<RTensor> {
        xs.dropout(p)
    }
    /// candle-nn's `hard_sigmoid`: `clamp((x + 3) / 6, 0, 1)`.
    pub fn hard_sigmoid(xs: &RTensor) -> Result<RTensor> {
        ((xs + 3.0)? / 6.0)?.clamp(0., 1.)
    }
    /// candle-nn's `mish`: `x · tanh(ln(1 + eˣ))`.
    pub fn mish(xs: &RTensor) -> Result<RTensor> {
        xs * (1.0 + xs.exp()?)?.log()?.tanh()?
    }
    /// candle-nn's `leaky_relu`: `max(x, 0) + min(x, 0) · slope`.
    pub fn leaky_relu(xs: &RTensor, negative_slope: f64) -> Result<RTensor> {
        let zeros = xs.zeros_like()?;
        xs.maximum(&zeros)? + (xs.minimum(&zeros)? * negative_slope)?
    }
    /// RMS normalization of the last dimension scaled by `alpha` (candle-nn's
    /// `rms_norm_slow`, the differentiable form of its fused `rms_norm`).
    pub fn rms_norm(x: &RTensor, alpha: &RTensor, eps: f32) -> Result<RTensor> {
        let x_dtype = x.dtype();
        let internal_dtype = match x_dtype {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let hidden_size = x.dim(D::Minus1)?;
        let x = x.to_dtype(internal_dtype)?;
        let norm_x = (x.sqr()?.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
        let x_normed = x.broadcast_div(&(norm_x + eps as f64)?.sqrt()?)?;
        x_normed.to_dtype(x_dtype)?.broadcast_mul(alpha)
    }
    /// Layer normalization of the last dimension (candle-nn's `layer_norm_slow`,
    /// the differentiable form of its fused `layer_norm`).
    pub fn layer_norm(x: &RTensor, alpha: &RTensor, beta: &RTensor, eps: f32) -> Result<RTensor> {
        let x_dtype = x.dtype();
        let internal_dtype = match x_dtype {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let hidden_size = x.dim(D::Minus1)?;
        let x = x.to_dtype(internal_dtype)?;
        let mean_x = (x.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
        let x = x.broadcast_sub(&mean_x)?;
        let norm_x = (x.sqr()?.sum_keepdim(D::Minus1)? / hidden_size as f64)?;
        let x_normed = x.broadcast_div(&(norm_x + eps as f64)?.sqrt()?)?;
        x_normed
            .to_dtype(x_dtype)?
            .broadcast_mul(alpha)?
            .broadcast_add(beta)
    }
}

/// candle-nn's `rotary_emb` under the same names: `rope` (halves rotated) and
/// `rope_i` (interleaved pairs) on `xs: (b, h, t, d)` with `cos`/`sin: (t', d/2)`
/// (`t' >= t`). They are candle-nn's `rope_slow` / `rope_i_slow` compositions:
/// candle-nn's fused `rope` / `rope_i` are built with `apply_op3_no_bwd`, so no
/// gradient flows through them in plain candle (a plain reference must call the
/// `_slow` forms to train).
pub mod rotary_emb {
    use candle_core::D;

    use crate::error::{Error, Result};
    use crate::tensor::RTensor;

    fn check(xs: &RTensor, cos: &RTensor, sin: &RTensor) -> Result<(usize, usize, usize, usize)> {
        let (b, h, t, d) = xs.dims4()?;
        let (ct, cd) = cos.dims2()?;
        let (st, sd) = sin.dims2()?;
        if cd * 2 != d || sd * 2 != d || t > ct || t > st {
            return Err(Error::unsupported(
                "rope",
                format!(
                    "inconsistent shapes: xs {:?}, cos {:?}, sin {:?} (expected (t', d/2), t' >= t)",
                    xs.dims(),
                    cos.dims(),
                    sin.dims()
                ),
            ));
        }
        Ok((b, h, t, d))
    }

    fn rotate_half(xs: &RTensor) -> Result<RTensor> {
        let last_dim = xs.dim(D::Minus1)?;
        let xs1 = xs.narrow(D::Minus1, 0, last_dim / 2)?;
        let xs2 = xs.narrow(D::Minus1, last_dim / 2, last_dim - last_dim / 2)?;
        RTensor::cat(&[&xs2.neg()?, &xs1], D::Minus1)
    }

    /// Rotary embedding on rotated halves (candle-nn's `rope_slow`).
    pub fn rope(xs: &RTensor, cos: &RTensor, sin: &RTensor) -> Result<RTensor> {
        let (_b, _h, seq_len, _d) = check(xs, cos, sin)?;
        let cos = RTensor::cat(&[cos, cos], D::Minus1)?;
        let sin = RTensor::cat(&[sin, sin], D::Minus1)?;
        let cos = cos.narrow(0, 0, seq_len)?;
        let sin = sin.narrow(0, 0, seq_len)?;
        let cos = cos.unsqueeze(0)?.unsqueeze(0)?;
        let sin = sin.unsqueeze(0)?.unsqueeze(0)?;
        xs.broadcast_mul(&cos)? + rotate_half(xs)?.broadcast_mul(&sin)?
    }

    /// Rotary embedding on interleaved pairs (candle-nn's `rope_i_slow`).
    pub fn rope_i(xs: &RTensor, cos: &RTensor, sin: &RTensor) -> Result<RTensor> {
        let (b_sz, n_head, seq_len, n_embd) = check(xs, cos, sin)?;
        let cos = cos
            .narrow(0, 0, seq_len)?
            .reshape((seq_len, n_embd / 2, 1))?;
        let sin = sin
            .narrow(0, 0, seq_len)?
            .reshape((seq_len, n_embd / 2, 1))?;
        let cos = cos.broadcast_as((b_sz, 1, seq_len, n_embd / 2, 1))?;
        let sin = sin.broadcast_as((b_sz, 1, seq_len, n_embd / 2, 1))?;
        let x = xs.reshape((b_sz, n_head, seq_len, n_embd / 2, 2))?;
        let x0 = x.narrow(D::Minus1, 0, 1)?;
        let x1 = x.narrow(D::Minus1, 1, 1)?;
        let y0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
        let y1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
        let rope = RTensor::cat(&[y0, y1], D::Minus1)?;
        rope.flatten_from(D::Minus2)
    }
}

/// candle-transformers' `models::with_tracing` layers under their names and
/// signatures (its models import `linear`, `linear_no_bias`, `Linear`, `RmsNorm`
/// from there): `RmsNorm::new(size, eps, vb)` builds from a builder, and
/// `Linear::from_weights` ties a layer to a tensor. No tracing spans.
pub mod with_tracing {
    pub use super::{linear, linear_b, linear_no_bias, Linear};

    use super::{Module, VarBuilder};
    use crate::error::Result;
    use crate::tensor::RTensor;

    /// RMS normalization built from a builder (`with_tracing::RmsNorm`).
    #[derive(Debug, Clone)]
    pub struct RmsNorm {
        inner: super::RmsNorm,
    }

    impl RmsNorm {
        /// candle-nn's `rms_norm(size, eps, vb)`.
        pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
            Ok(Self {
                inner: super::rms_norm(size, eps, vb)?,
            })
        }
        /// The same as `forward` (candle-nn's name for the differentiable path).
        pub fn forward_diff(&self, x: &RTensor) -> Result<RTensor> {
            self.inner.forward(x)
        }
    }

    impl Module for RmsNorm {
        fn forward(&self, x: &RTensor) -> Result<RTensor> {
            self.inner.forward(x)
        }
    }
}
