//! Convolutions, pooling and upsampling on [`RTensor`], with candle's forward
//! ops and the vector-Jacobian products of candle's own backward.
//!
//! A convolution with a bias ([`RTensor::conv1d_bias`], [`RTensor::conv2d_bias`],
//! used by `nn::Conv1d`/`nn::Conv2d`) is one op: the convolution's output gets
//! the bias added in place, so the op's working set is its input and its output.
//! Two ops (convolution, then a broadcast add, as candle-nn composes them) would
//! hold the convolution's output pinned beside the sum's: for a ConvNet's first
//! layer that pair alone is most of the activation peak. The values and
//! gradients are candle's, bit for bit (see `conv_bias`).

use std::sync::Arc;

use candle_core::{Tensor, ToUsize2};

use super::{op1, out_of, RTensor};
use crate::error::{Error, Result};
use crate::graph::{apply, apply_native};

impl RTensor {
    /// A convolution in `groups` groups, as candle composes it: the input
    /// chunked on its channels and the kernel on its outputs, `single` per
    /// group, the results concatenated; `single` alone when `groups` is 1.
    fn grouped(
        &self,
        op: &'static str,
        kernel: &RTensor,
        groups: usize,
        single: impl Fn(&RTensor, &RTensor) -> Result<RTensor>,
    ) -> Result<RTensor> {
        self.check_groups(op, kernel, groups)?;
        if groups == 1 {
            return single(self, kernel);
        }
        let blocks = self.chunk(groups, 1)?;
        let kernels = kernel.chunk(groups, 0)?;
        let outs = (blocks.iter().zip(&kernels))
            .map(|(b, k)| single(b, k))
            .collect::<Result<Vec<_>>>()?;
        Self::cat(&outs, 1)
    }
    /// Checks candle makes before a grouped convolution, as a typed error.
    fn check_groups(&self, op: &'static str, kernel: &RTensor, groups: usize) -> Result<()> {
        let c_in = self.dim(1)?;
        let (c_out, c_in_k) = (kernel.dim(0)?, kernel.dim(1)?);
        if groups == 0 || c_in != c_in_k * groups || c_out % groups != 0 {
            return Err(Error::unsupported(
                op,
                format!(
                    "{groups} groups for {c_in} input channels and a kernel of shape {:?}",
                    kernel.dims()
                ),
            ));
        }
        Ok(())
    }
    /// 1D convolution, input `(b, c_in, l)`, kernel `(c_out, c_in / groups, k)`.
    /// With `groups > 1` it is candle's composition: the input and the kernel
    /// chunked per group, one convolution each, concatenated.
    pub fn conv1d(
        &self,
        kernel: &RTensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<RTensor> {
        self.grouped("conv1d", kernel, groups, |x, k| {
            x.conv1d_single(k, padding, stride, dilation)
        })
    }
    fn conv1d_single(
        &self,
        kernel: &RTensor,
        padding: usize,
        stride: usize,
        dilation: usize,
    ) -> Result<RTensor> {
        conv_op(
            "conv1d",
            [self, kernel],
            Arc::new(move |x: &Tensor, k: &Tensor| x.conv1d(k, padding, stride, dilation, 1)),
            Arc::new(move |x: &Tensor, k: &Tensor, g: &Tensor| {
                conv1d_grads(x, k, g, padding, stride, dilation)
            }),
        )
    }
    /// 2D convolution, input `(b, c_in, h, w)`, kernel
    /// `(c_out, c_in / groups, kh, kw)`; `groups > 1` as for [`RTensor::conv1d`].
    pub fn conv2d(
        &self,
        kernel: &RTensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<RTensor> {
        self.grouped("conv2d", kernel, groups, |x, k| {
            x.conv2d_single(k, padding, stride, dilation)
        })
    }
    fn conv2d_single(
        &self,
        kernel: &RTensor,
        padding: usize,
        stride: usize,
        dilation: usize,
    ) -> Result<RTensor> {
        conv_op(
            "conv2d",
            [self, kernel],
            Arc::new(move |x: &Tensor, k: &Tensor| x.conv2d(k, padding, stride, dilation, 1)),
            Arc::new(move |x: &Tensor, k: &Tensor, g: &Tensor| {
                conv2d_grads(x, k, g, padding, stride, dilation)
            }),
        )
    }
    /// 2D transposed convolution, input `(b, c_in, h, w)`, kernel
    /// `(c_in, c_out, kh, kw)` (candle's op and backward).
    pub fn conv_transpose2d(
        &self,
        kernel: &RTensor,
        padding: usize,
        output_padding: usize,
        stride: usize,
        dilation: usize,
    ) -> Result<RTensor> {
        conv_op(
            "conv-transpose2d",
            [self, kernel],
            Arc::new(move |x: &Tensor, k: &Tensor| {
                x.conv_transpose2d(k, padding, output_padding, stride, dilation)
            }),
            Arc::new(move |x: &Tensor, k: &Tensor, g: &Tensor| {
                conv_transpose2d_grads(x, k, g, padding, stride, dilation)
            }),
        )
    }
    /// Whether a convolution with `bias` runs as one op ([`conv_bias`]): one
    /// group, a bias of shape `(c_out,)`, and layers not split
    /// ([`RematConfig::split_layer_ops`](crate::RematConfig::split_layer_ops)).
    fn fuses_bias(&self, bias: &RTensor, c_out: usize, groups: usize) -> bool {
        groups == 1 && bias.dims() == [c_out] && !self.h.ctx.split_layer_ops
    }
    /// [`RTensor::conv1d`] plus a bias `(c_out,)` on every channel, as one op:
    /// candle-nn's `Conv1d::forward` with a bias (the same values and
    /// gradients, bit for bit). With `groups > 1`, or a bias whose shape is not
    /// `(c_out,)`, or with [`RematConfig::split_layer_ops`](crate::RematConfig::split_layer_ops),
    /// it is candle-nn's composition (and its error).
    pub fn conv1d_bias(
        &self,
        kernel: &RTensor,
        bias: &RTensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<RTensor> {
        if !self.fuses_bias(bias, kernel.dim(0)?, groups) {
            return plus_channel_bias(
                self.conv1d(kernel, padding, stride, dilation, groups)?,
                bias,
            );
        }
        self.check_groups("conv1d", kernel, 1)?;
        conv_bias(
            "conv1d-bias",
            [self, kernel, bias],
            Arc::new(move |x: &Tensor, k: &Tensor| x.conv1d(k, padding, stride, dilation, 1)),
            Arc::new(move |x: &Tensor, k: &Tensor, g: &Tensor| {
                conv1d_grads(x, k, g, padding, stride, dilation)
            }),
        )
    }
    /// [`RTensor::conv2d`] plus a bias `(c_out,)` on every channel, as one op:
    /// candle-nn's `Conv2d::forward` with a bias (the same values and
    /// gradients, bit for bit). With `groups > 1`, or a bias whose shape is not
    /// `(c_out,)`, or with [`RematConfig::split_layer_ops`](crate::RematConfig::split_layer_ops),
    /// it is candle-nn's composition (and its error).
    pub fn conv2d_bias(
        &self,
        kernel: &RTensor,
        bias: &RTensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<RTensor> {
        if !self.fuses_bias(bias, kernel.dim(0)?, groups) {
            return plus_channel_bias(
                self.conv2d(kernel, padding, stride, dilation, groups)?,
                bias,
            );
        }
        self.check_groups("conv2d", kernel, 1)?;
        conv_bias(
            "conv2d-bias",
            [self, kernel, bias],
            Arc::new(move |x: &Tensor, k: &Tensor| x.conv2d(k, padding, stride, dilation, 1)),
            Arc::new(move |x: &Tensor, k: &Tensor, g: &Tensor| {
                conv2d_grads(x, k, g, padding, stride, dilation)
            }),
        )
    }
    /// [`RTensor::conv_transpose2d`] plus a bias `(c_out,)` on every channel,
    /// as one op: candle-nn's `ConvTranspose2d::forward` with a bias (the same
    /// values and gradients, bit for bit). With a bias whose shape is not
    /// `(c_out,)`, or with [`RematConfig::split_layer_ops`](crate::RematConfig::split_layer_ops),
    /// it is candle-nn's composition (and its error).
    pub fn conv_transpose2d_bias(
        &self,
        kernel: &RTensor,
        bias: &RTensor,
        padding: usize,
        output_padding: usize,
        stride: usize,
        dilation: usize,
    ) -> Result<RTensor> {
        if !self.fuses_bias(bias, kernel.dim(1)?, 1) {
            let out = self.conv_transpose2d(kernel, padding, output_padding, stride, dilation)?;
            return plus_channel_bias(out, bias);
        }
        conv_bias(
            "conv-transpose2d-bias",
            [self, kernel, bias],
            Arc::new(move |x: &Tensor, k: &Tensor| {
                x.conv_transpose2d(k, padding, output_padding, stride, dilation)
            }),
            Arc::new(move |x: &Tensor, k: &Tensor, g: &Tensor| {
                conv_transpose2d_grads(x, k, g, padding, stride, dilation)
            }),
        )
    }
    /// 2D max pooling with stride = kernel size.
    pub fn max_pool2d<T: ToUsize2>(&self, sz: T) -> Result<RTensor> {
        let sz = sz.to_usize2();
        self.max_pool2d_with_stride(sz, sz)
    }
    /// 2D max pooling; its gradient is candle's, which needs stride = kernel
    /// size (otherwise `backward()` fails with candle's error, as in candle).
    pub fn max_pool2d_with_stride<T: ToUsize2>(&self, kernel: T, stride: T) -> Result<RTensor> {
        let (kernel, stride) = (kernel.to_usize2(), stride.to_usize2());
        op1(
            self,
            "max-pool2d",
            true,
            move |x| x.max_pool2d_with_stride(kernel, stride),
            move |arg, o, grad| {
                if kernel != stride {
                    candle_core::bail!(
                        "backward not supported for maxpool2d if ksize {kernel:?} != stride {stride:?}"
                    )
                }
                let node = out_of(o)?;
                let (_n, _c, h, w) = arg.dims4()?;
                let node_upsampled = node.upsample_nearest2d(h, w)?;
                let mask = arg.eq(&node_upsampled)?.to_dtype(arg.dtype())?;
                let avg = mask.avg_pool2d_with_stride(kernel, stride)?;
                (grad * avg)?.upsample_nearest2d(h, w)? * mask
            },
        )
    }
    /// 2D average pooling with stride = kernel size.
    pub fn avg_pool2d<T: ToUsize2>(&self, sz: T) -> Result<RTensor> {
        let sz = sz.to_usize2();
        self.avg_pool2d_with_stride(sz, sz)
    }
    /// 2D average pooling: candle's own node (its backward reads only the
    /// input's shape), so stride ≠ kernel size fails in `backward()` as in candle.
    pub fn avg_pool2d_with_stride<T: ToUsize2>(&self, kernel: T, stride: T) -> Result<RTensor> {
        let (kernel, stride) = (kernel.to_usize2(), stride.to_usize2());
        apply_native(
            "avg-pool2d",
            &[self],
            Arc::new(move |x: &[Tensor]| x[0].avg_pool2d_with_stride(kernel, stride)),
        )
    }
    /// Nearest-neighbour upsampling of `(b, c, h, w)` to `(b, c, target_h,
    /// target_w)`: candle's own node and backward (integer, uniform factors).
    pub fn upsample_nearest2d(&self, target_h: usize, target_w: usize) -> Result<RTensor> {
        apply_native(
            "upsample-nearest2d",
            &[self],
            Arc::new(move |x: &[Tensor]| x[0].upsample_nearest2d(target_h, target_w)),
        )
    }
    /// Nearest-neighbour upsampling of `(b, c, l)` to `(b, c, target)`: candle's
    /// own node and backward (integer factors).
    pub fn upsample_nearest1d(&self, target: usize) -> Result<RTensor> {
        apply_native(
            "upsample-nearest1d",
            &[self],
            Arc::new(move |x: &[Tensor]| x[0].upsample_nearest1d(target)),
        )
    }
}

/// A convolution on detached tensors: `(input, kernel) -> output`.
type ConvFn = dyn Fn(&Tensor, &Tensor) -> candle_core::Result<Tensor> + Send + Sync;
/// Its vector-Jacobian product: `(input, kernel, grad) -> (grad input, grad kernel)`.
type ConvGradsFn =
    dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<(Tensor, Tensor)> + Send + Sync;

/// candle-nn's bias add after a convolution: `bias` reshaped to
/// `(1, c, 1, ..)` (candle's error if it is not 1-D) and broadcast-added.
fn plus_channel_bias(out: RTensor, bias: &RTensor) -> Result<RTensor> {
    let mut shape = vec![1; out.rank()];
    shape[1] = bias.dims1()?;
    out.broadcast_add(&bias.reshape(shape)?)
}

/// One op for `conv(input, kernel)` with the gradients `grads` gives.
fn conv_op(
    name: &'static str,
    [x, kernel]: [&RTensor; 2],
    conv: Arc<ConvFn>,
    grads: Arc<ConvGradsFn>,
) -> Result<RTensor> {
    apply(
        name,
        &[x, kernel],
        Arc::new(move |t: &[Tensor]| conv(&t[0], &t[1])),
        Arc::new(move |t: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
            let (gx, gk) = grads(&t[0], &t[1], g)?;
            Ok(vec![Some(gx), Some(gk)])
        }),
        false,
    )
}

/// One op for `conv(input, kernel) + bias` broadcast on the channels (dim 1).
///
/// Forward: the convolution, then the bias added into its output in place
/// ([`add_channel_bias`]): each element is `conv + bias[c]`, the f32 (f64,
/// f16, bf16) sum candle's `broadcast_add` computes, in the same operand order.
///
/// Backward: candle's graph for the composition is conv → add ← broadcast ←
/// reshape ← bias. The add passes the output's gradient `g` to both sides;
/// the convolution's gradients are then `conv_grads(input, kernel, g)`, and the
/// bias gets the broadcast's backward (`g` summed over every dim where the
/// output is not 1, keeping dims) reshaped to `(c_out,)`. candle accumulates
/// each into a zero tensor (`0 + x`), which is the identity on bits after the
/// first time, so one accumulation here gives the same bits as candle's two.
fn conv_bias(
    name: &'static str,
    [x, kernel, bias]: [&RTensor; 3],
    conv: Arc<ConvFn>,
    grads: Arc<ConvGradsFn>,
) -> Result<RTensor> {
    apply(
        name,
        &[x, kernel, bias],
        Arc::new(move |t: &[Tensor]| add_channel_bias(conv(&t[0], &t[1])?, &t[2])),
        Arc::new(move |t: &[Tensor], _: Option<&Tensor>, g: &Tensor| {
            let (gx, gk) = grads(&t[0], &t[1], g)?;
            let gb = bias_grad(g, t[2].dim(0)?)?;
            Ok(vec![Some(gx), Some(gk), Some(gb)])
        }),
        false,
    )
}

/// `y + bias` with `bias: (c,)` broadcast on dim 1 of `y`. On the CPU, for a
/// contiguous float `y` of the bias's dtype, the sum is written into `y`'s own
/// storage (a fresh convolution output that nothing else shares), so no second
/// buffer of `y`'s size exists. Elsewhere (CUDA, Metal, other dtypes) it is
/// candle's `broadcast_add`, whose second buffer lives for the op's duration,
/// like a kernel's workspace.
fn add_channel_bias(y: Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    use candle_core::DType;
    let c = bias.dim(0)?;
    let in_place = y.device().is_cpu()
        && y.is_contiguous()
        && y.dtype() == bias.dtype()
        && matches!(
            y.dtype(),
            DType::F32 | DType::F64 | DType::F16 | DType::BF16
        );
    if !in_place {
        let mut shape = vec![1; y.rank()];
        shape[1] = c;
        return y.broadcast_add(&bias.reshape(shape)?);
    }
    y.inplace_op2(&bias.contiguous()?, &AddChannelBias)?;
    Ok(y)
}

/// `y[n, c, ..] += bias[c]` in place on contiguous CPU storage.
struct AddChannelBias;

impl candle_core::InplaceOp2 for AddChannelBias {
    fn name(&self) -> &'static str {
        "add-channel-bias"
    }

    fn cpu_fwd(
        &self,
        y: &mut candle_core::CpuStorage,
        yl: &candle_core::Layout,
        b: &candle_core::CpuStorage,
        bl: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use candle_core::CpuStorage as S;
        let dims = yl.dims();
        // Elements per (n, c) plane: the product of the dims after the channels.
        let plane: usize = dims[2..].iter().product();
        let c = dims[1];
        let (Some((y0, y1)), Some((b0, b1))) = (yl.contiguous_offsets(), bl.contiguous_offsets())
        else {
            candle_core::bail!("add-channel-bias: non-contiguous operands")
        };
        if plane == 0 || c == 0 || y1 == y0 {
            return Ok(());
        }
        fn add<T: Copy + std::ops::Add<Output = T>>(y: &mut [T], b: &[T], c: usize, plane: usize) {
            for (k, ys) in y.chunks_mut(plane).enumerate() {
                let bc = b[k % c];
                for v in ys {
                    *v = *v + bc;
                }
            }
        }
        match (y, b) {
            (S::F32(y), S::F32(b)) => add(&mut y[y0..y1], &b[b0..b1], c, plane),
            (S::F64(y), S::F64(b)) => add(&mut y[y0..y1], &b[b0..b1], c, plane),
            (S::F16(y), S::F16(b)) => add(&mut y[y0..y1], &b[b0..b1], c, plane),
            (S::BF16(y), S::BF16(b)) => add(&mut y[y0..y1], &b[b0..b1], c, plane),
            _ => candle_core::bail!("add-channel-bias: unsupported dtypes"),
        }
        Ok(())
    }
}

/// The bias's gradient as candle's backward computes it for
/// `bias.reshape((1, c, 1..))` broadcast to `grad`'s shape: `grad` summed
/// (keeping dims) over every dim where the broadcast bias is 1 and `grad` is
/// not, then reshaped to `(c,)`.
fn bias_grad(grad: &Tensor, c: usize) -> candle_core::Result<Tensor> {
    let sum_dims: Vec<usize> = (grad.dims().iter().enumerate())
        .filter(|&(d, &n)| n != if d == 1 { c } else { 1 })
        .map(|(d, _)| d)
        .collect();
    grad.sum_keepdim(sum_dims.as_slice())?.reshape(c)
}

/// candle's backward of `conv1d` (groups 1): the input's and the kernel's
/// gradients.
fn conv1d_grads(
    arg: &Tensor,
    kernel: &Tensor,
    grad: &Tensor,
    padding: usize,
    stride: usize,
    dilation: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let grad_l_in = grad.dim(2)?;
    let k_size = kernel.dim(2)?;
    let out_size = (grad_l_in - 1) * stride + dilation * (k_size - 1) + 1 - 2 * padding;
    let out_padding = arg.dim(2)? - out_size;
    let grad_arg = grad.conv_transpose1d(kernel, padding, out_padding, stride, dilation, 1)?;
    let grad_kernel = arg
        .transpose(0, 1)?
        .conv1d(&grad.transpose(0, 1)?, padding, dilation, stride, 1)?
        .transpose(0, 1)?;
    let (_, _, k0) = kernel.dims3()?;
    let (_, _, g_k0) = grad_kernel.dims3()?;
    let grad_kernel = if g_k0 != k0 {
        grad_kernel.narrow(2, 0, k0)?
    } else {
        grad_kernel
    };
    Ok((grad_arg, grad_kernel))
}

/// candle's backward of `conv2d` (groups 1): the input's and the kernel's
/// gradients.
fn conv2d_grads(
    arg: &Tensor,
    kernel: &Tensor,
    grad: &Tensor,
    padding: usize,
    stride: usize,
    dilation: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let grad_h = grad.dim(2)?;
    let k_h = kernel.dim(2)?;
    let out_size = (grad_h - 1) * stride + dilation * (k_h - 1) + 1 - 2 * padding;
    let out_padding = arg.dim(2)? - out_size;
    let grad_arg = grad.conv_transpose2d(kernel, padding, out_padding, stride, dilation)?;
    let grad_kernel = arg
        .transpose(0, 1)?
        .conv2d(&grad.transpose(0, 1)?, padding, dilation, stride, 1)?
        .transpose(0, 1)?;
    Ok((grad_arg, trim_kernel_grad(kernel, grad_kernel)?))
}

/// candle's backward of `conv_transpose2d`: the input's and the kernel's
/// gradients.
fn conv_transpose2d_grads(
    arg: &Tensor,
    kernel: &Tensor,
    grad: &Tensor,
    padding: usize,
    stride: usize,
    dilation: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let grad_arg = grad.conv2d(kernel, padding, stride, dilation, 1)?;
    let grad_kernel = grad
        .transpose(0, 1)?
        .conv2d(&arg.transpose(0, 1)?, padding, dilation, stride, 1)?
        .transpose(0, 1)?;
    Ok((grad_arg, trim_kernel_grad(kernel, grad_kernel)?))
}

/// A 2D kernel's gradient cut to the kernel's size where the strided
/// convolution made it larger (as candle does).
fn trim_kernel_grad(kernel: &Tensor, grad_kernel: Tensor) -> candle_core::Result<Tensor> {
    let (_, _, k0, k1) = kernel.dims4()?;
    let (_, _, g_k0, g_k1) = grad_kernel.dims4()?;
    if g_k0 != k0 || g_k1 != k1 {
        grad_kernel.narrow(2, 0, k0)?.narrow(3, 0, k1)
    } else {
        Ok(grad_kernel)
    }
}
