//! Convolution layers: one wrapper, [`Conv`], over candle-nn's configuration
//! type, which names the convolution ([`ConvKind`]); [`Conv1d`], [`Conv2d`] and
//! [`ConvTranspose2d`] are its candle-nn names, with candle-nn's builders.

use candle_core::Tensor;

use super::{Conv1dConfig, Conv2dConfig, ConvTranspose2dConfig, Module, VarBuilder};
use crate::context::Remat;
use crate::error::Result;
use crate::tensor::RTensor;

/// What differs between convolution layers, named by candle-nn's configuration
/// type: the candle-nn layer it wraps and the [`RTensor`] convolution it runs.
pub trait ConvKind: Copy + std::fmt::Debug {
    /// candle-nn's layer with this configuration (`candle_nn::Conv1d` for
    /// `Conv1dConfig`).
    type Candle;
    /// The layer's candle-nn name (its `Debug` name).
    const NAME: &'static str;
    /// The candle-nn layer's weight, bias and configuration.
    fn parts(layer: &Self::Candle) -> (&Tensor, Option<&Tensor>, Self);
    /// The convolution of `x` by `weight` under this configuration; with a bias,
    /// one op (see [`RTensor::conv1d_bias`]), candle-nn's values.
    fn conv(&self, x: &RTensor, weight: &RTensor, bias: Option<&RTensor>) -> Result<RTensor>;
}

impl ConvKind for Conv1dConfig {
    type Candle = candle_nn::Conv1d;
    const NAME: &'static str = "Conv1d";
    fn parts(layer: &candle_nn::Conv1d) -> (&Tensor, Option<&Tensor>, Self) {
        (layer.weight(), layer.bias(), *layer.config())
    }
    fn conv(&self, x: &RTensor, w: &RTensor, bias: Option<&RTensor>) -> Result<RTensor> {
        let c = self;
        match bias {
            None => x.conv1d(w, c.padding, c.stride, c.dilation, c.groups),
            Some(b) => x.conv1d_bias(w, b, c.padding, c.stride, c.dilation, c.groups),
        }
    }
}

impl ConvKind for Conv2dConfig {
    type Candle = candle_nn::Conv2d;
    const NAME: &'static str = "Conv2d";
    fn parts(layer: &candle_nn::Conv2d) -> (&Tensor, Option<&Tensor>, Self) {
        (layer.weight(), layer.bias(), *layer.config())
    }
    fn conv(&self, x: &RTensor, w: &RTensor, bias: Option<&RTensor>) -> Result<RTensor> {
        let c = self;
        match bias {
            None => x.conv2d(w, c.padding, c.stride, c.dilation, c.groups),
            Some(b) => x.conv2d_bias(w, b, c.padding, c.stride, c.dilation, c.groups),
        }
    }
}

impl ConvKind for ConvTranspose2dConfig {
    type Candle = candle_nn::ConvTranspose2d;
    const NAME: &'static str = "ConvTranspose2d";
    fn parts(layer: &candle_nn::ConvTranspose2d) -> (&Tensor, Option<&Tensor>, Self) {
        (layer.weight(), layer.bias(), *layer.config())
    }
    fn conv(&self, x: &RTensor, w: &RTensor, bias: Option<&RTensor>) -> Result<RTensor> {
        let (p, op, s, d) = (
            self.padding,
            self.output_padding,
            self.stride,
            self.dilation,
        );
        match bias {
            None => x.conv_transpose2d(w, p, op, s, d),
            Some(b) => x.conv_transpose2d_bias(w, b, p, op, s, d),
        }
    }
}

/// A convolution layer under candle-nn's configuration `C`: a kernel, an
/// optional bias `(c_out,)` and the configuration. Use it by its candle-nn
/// names, [`Conv1d`], [`Conv2d`], [`ConvTranspose2d`].
#[derive(Clone)]
pub struct Conv<C> {
    weight: RTensor,
    bias: Option<RTensor>,
    config: C,
}

impl<C: ConvKind> std::fmt::Debug for Conv<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(C::NAME)
            .field("weight", &self.weight)
            .field("bias", &self.bias)
            .field("config", &self.config)
            .finish()
    }
}

/// A 1D convolution (candle-nn's `Conv1d`, any `groups`): kernel
/// `(c_out, c_in / groups, k)`.
pub type Conv1d = Conv<Conv1dConfig>;

/// A 2D convolution (candle-nn's `Conv2d`, any `groups`): kernel
/// `(c_out, c_in / groups, kh, kw)`.
pub type Conv2d = Conv<Conv2dConfig>;

/// A 2D transposed convolution (candle-nn's `ConvTranspose2d`): kernel
/// `(c_in, c_out, kh, kw)`.
pub type ConvTranspose2d = Conv<ConvTranspose2dConfig>;

impl<C: ConvKind> Conv<C> {
    /// A layer over `weight` (the kernel, shaped as the layer's alias says), an
    /// optional `bias: (c_out,)` and candle-nn's config (candle-nn's
    /// `Conv1d::new`, `Conv2d::new`, `ConvTranspose2d::new`).
    pub fn new(weight: RTensor, bias: Option<RTensor>, config: C) -> Self {
        Self {
            weight,
            bias,
            config,
        }
    }
    /// Wrap a candle-nn layer's parameters (shared, not copied).
    pub fn from_candle(remat: &Remat, layer: &C::Candle) -> Result<Self> {
        let (weight, bias, config) = C::parts(layer);
        Ok(Self::new(
            remat.input(weight)?,
            bias.map(|b| remat.input(b)).transpose()?,
            config,
        ))
    }
    /// The kernel.
    pub fn weight(&self) -> &RTensor {
        &self.weight
    }
    /// The bias, `(c_out,)`.
    pub fn bias(&self) -> Option<&RTensor> {
        self.bias.as_ref()
    }
    /// The configuration.
    pub fn config(&self) -> &C {
        &self.config
    }
}

impl<C: ConvKind> Module for Conv<C> {
    fn forward(&self, x: &RTensor) -> Result<RTensor> {
        self.config.conv(x, &self.weight, self.bias.as_ref())
    }
}

/// candle-nn's builders of the same names over `vb`: each builds candle-nn's
/// layer from `vb`'s candle-nn builder and wraps its parameters.
macro_rules! builders {
    ($($name:ident: $config:ident -> $layer:ident;)+) => {
        $(
            #[doc = concat!("candle-nn's `", stringify!($name), "` over `vb`.")]
            pub fn $name(
                in_channels: usize,
                out_channels: usize,
                kernel_size: usize,
                cfg: $config,
                vb: VarBuilder,
            ) -> Result<$layer> {
                let remat = vb.remat()?;
                let layer = candle_nn::$name(
                    in_channels,
                    out_channels,
                    kernel_size,
                    cfg,
                    vb.candle().clone(),
                )?;
                Conv::from_candle(&remat, &layer)
            }
        )+
    };
}

builders! {
    conv1d: Conv1dConfig -> Conv1d;
    conv1d_no_bias: Conv1dConfig -> Conv1d;
    conv2d: Conv2dConfig -> Conv2d;
    conv2d_no_bias: Conv2dConfig -> Conv2d;
    conv_transpose2d: ConvTranspose2dConfig -> ConvTranspose2d;
}
