//! Convolution layers (candle-nn's `Conv1d`, `Conv2d`, `ConvTranspose2d`) and
//! their builders.

use super::{Conv1dConfig, Conv2dConfig, ConvTranspose2dConfig, Module, VarBuilder};
use crate::context::Remat;
use crate::error::Result;
use crate::tensor::RTensor;

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
            vb.candle().clone(),
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
            vb.candle().clone(),
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
            vb.candle().clone(),
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
            vb.candle().clone(),
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
            vb.candle().clone(),
        )?,
    )
}
