//! Per-op gradient equality: every adapter op against plain candle, bit for bit,
//! with its inputs resident and with every intermediate evicted before backward.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[a.clone()]` reads better in the op table

mod common;

use candle_core::{DType, Device, Tensor, Var, D};
use common::{bits, rand};
use remat_candle::{dropout_mask, RTensor, Remat, RematConfig};

type PlainFn = dyn Fn(&[Tensor]) -> candle_core::Result<Tensor>;
type OursFn = dyn Fn(&[RTensor]) -> remat_candle::Result<RTensor>;

/// Run `plain` on candle variables and `ours` on the same variables through the
/// adapter; compare outputs, losses and gradients bit for bit. Each input first
/// goes through an affine op `x + 0.25` (so it is an evictable intermediate; its
/// backward copies the gradient exactly, so a different summation order in the
/// op shows in the variables' gradients); with `evict`,
/// every intermediate and the output are evicted before backward.
fn check(name: &str, inputs: &[Tensor], plain: &PlainFn, ours: &OursFn, evict: bool) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    // Plain candle.
    let pa: Vec<Tensor> = vars
        .iter()
        .map(|v| v.as_tensor().affine(1.0, 0.25).unwrap())
        .collect();
    let py = plain(&pa).unwrap();
    let w = rand(99, py.dims(), -1.0, 1.0).to_dtype(py.dtype()).unwrap();
    let ploss = py.mul(&w).unwrap().sum_all().unwrap();
    let pgrads = ploss.backward().unwrap();

    // Adapter.
    let remat = Remat::new(RematConfig::new()).unwrap();
    let params: Vec<RTensor> = vars.iter().map(|v| remat.param(v).unwrap()).collect();
    let ra: Vec<RTensor> = params
        .iter()
        .map(|p| p.affine(1.0, 0.25).unwrap())
        .collect();
    let ry = ours(&ra).unwrap();
    let rw = remat.input(&w).unwrap();
    let prod = ry.mul(&rw).unwrap();
    let rloss = prod.sum_all().unwrap();
    assert_eq!(
        bits(&ry.to_candle().unwrap()),
        bits(&py),
        "{name}: forward output differs"
    );
    if evict {
        let mut evicted = 0;
        for t in ra.iter().chain([&ry, &prod]) {
            if t.evict().unwrap() {
                evicted += 1;
            }
        }
        assert!(
            evicted >= ra.len(),
            "{name}: intermediates were not evicted"
        );
        assert!(!ra[0].is_resident().unwrap());
    }
    let rgrads = rloss.backward().unwrap();
    assert_eq!(
        bits(&rloss.to_candle().unwrap()),
        bits(&ploss),
        "{name}: loss differs"
    );
    for (i, v) in vars.iter().enumerate() {
        let pg = pgrads.get(v.as_tensor());
        let rg = rgrads.get(v.as_tensor());
        match (pg, rg) {
            (Some(p), Some(r)) => {
                assert_eq!(p.dims(), r.dims(), "{name}: grad {i} shape");
                assert_eq!(
                    bits(r),
                    bits(p),
                    "{name}: grad of input {i} differs (evict={evict})"
                );
            }
            (None, None) => {}
            (p, r) => panic!(
                "{name}: grad {i} present in plain {} / ours {}",
                p.is_some(),
                r.is_some()
            ),
        }
    }
    if evict {
        let s = remat.stats().unwrap();
        assert!(
            s.rematerializations > 0,
            "{name}: nothing was rematerialized"
        );
    }
    remat.check_invariants().unwrap();
    drop((rgrads, rloss, prod, rw, ry, ra, params));
    remat.flush().unwrap();
    assert_eq!(remat.storage_count().unwrap(), 0, "{name}: records leaked");
}

fn both(name: &str, inputs: &[Tensor], plain: &PlainFn, ours: &OursFn) {
    check(name, inputs, plain, ours, false);
    check(name, inputs, plain, ours, true);
}

fn m(shape: &[usize], seed: u64) -> Tensor {
    rand(seed, shape, -2.0, 2.0)
}

fn pos(shape: &[usize], seed: u64) -> Tensor {
    rand(seed, shape, 0.5, 3.0)
}

#[test]
fn binary_ops() {
    let (a, b) = (m(&[3, 4], 1), m(&[3, 4], 2));
    both("add", &[a.clone(), b.clone()], &|x| x[0].add(&x[1]), &|x| {
        x[0].add(&x[1])
    });
    both("sub", &[a.clone(), b.clone()], &|x| x[0].sub(&x[1]), &|x| {
        x[0].sub(&x[1])
    });
    both("mul", &[a.clone(), b.clone()], &|x| x[0].mul(&x[1]), &|x| {
        x[0].mul(&x[1])
    });
    both(
        "div",
        &[a.clone(), pos(&[3, 4], 3)],
        &|x| x[0].div(&x[1]),
        &|x| x[0].div(&x[1]),
    );
    // Ties between the two sides exercise the half-gradient rule.
    let tie = Tensor::cat(&[a.narrow(0, 0, 2).unwrap(), b.narrow(0, 2, 1).unwrap()], 0).unwrap();
    both(
        "maximum",
        &[a.clone(), tie.clone()],
        &|x| x[0].maximum(&x[1]),
        &|x| x[0].maximum(&x[1]),
    );
    both(
        "minimum",
        &[a.clone(), tie],
        &|x| x[0].minimum(&x[1]),
        &|x| x[0].minimum(&x[1]),
    );
    both(
        "same input twice",
        &[a.clone()],
        &|x| x[0].mul(&x[0]),
        &|x| x[0].mul(&x[0]),
    );
}

#[test]
fn broadcast_ops() {
    let (a, row, col) = (m(&[3, 4], 4), m(&[4], 5), pos(&[3, 1], 6));
    both(
        "broadcast_add",
        &[a.clone(), row.clone()],
        &|x| x[0].broadcast_add(&x[1]),
        &|x| x[0].broadcast_add(&x[1]),
    );
    both(
        "broadcast_sub",
        &[row.clone(), a.clone()],
        &|x| x[0].broadcast_sub(&x[1]),
        &|x| x[0].broadcast_sub(&x[1]),
    );
    both(
        "broadcast_mul",
        &[a.clone(), col.clone()],
        &|x| x[0].broadcast_mul(&x[1]),
        &|x| x[0].broadcast_mul(&x[1]),
    );
    both(
        "broadcast_div",
        &[a.clone(), col],
        &|x| x[0].broadcast_div(&x[1]),
        &|x| x[0].broadcast_div(&x[1]),
    );
    both(
        "broadcast_maximum",
        &[a, row],
        &|x| x[0].broadcast_maximum(&x[1]),
        &|x| x[0].broadcast_maximum(&x[1]),
    );
}

#[test]
fn matmuls() {
    both(
        "matmul",
        &[m(&[2, 3, 5], 7), m(&[2, 5, 4], 8)],
        &|x| x[0].matmul(&x[1]),
        &|x| x[0].matmul(&x[1]),
    );
    both(
        "matmul transposed rhs",
        &[m(&[3, 5], 9), m(&[4, 5], 10)],
        &|x| x[0].matmul(&x[1].t()?),
        &|x| x[0].matmul(&x[1].t()?),
    );
    both(
        "broadcast_matmul rank-2 rhs",
        &[m(&[2, 3, 5], 11), m(&[5, 4], 12)],
        &|x| x[0].broadcast_matmul(&x[1]),
        &|x| x[0].broadcast_matmul(&x[1]),
    );
    both(
        "broadcast_matmul both",
        &[m(&[2, 1, 3, 5], 13), m(&[3, 5, 4], 14)],
        &|x| x[0].broadcast_matmul(&x[1]),
        &|x| x[0].broadcast_matmul(&x[1]),
    );
}

#[test]
fn unary_ops() {
    let a = m(&[4, 6], 20);
    let p = pos(&[4, 6], 21);
    both("exp", &[a.clone()], &|x| x[0].exp(), &|x| x[0].exp());
    both("log", &[p.clone()], &|x| x[0].log(), &|x| x[0].log());
    both("sqr", &[a.clone()], &|x| x[0].sqr(), &|x| x[0].sqr());
    both("sqrt", &[p.clone()], &|x| x[0].sqrt(), &|x| x[0].sqrt());
    both("recip", &[p], &|x| x[0].recip(), &|x| x[0].recip());
    both("neg", &[a.clone()], &|x| x[0].neg(), &|x| x[0].neg());
    both("abs", &[a.clone()], &|x| x[0].abs(), &|x| x[0].abs());
    both("tanh", &[a.clone()], &|x| x[0].tanh(), &|x| x[0].tanh());
    both("sin", &[a.clone()], &|x| x[0].sin(), &|x| x[0].sin());
    both("erf", &[a.clone()], &|x| x[0].erf(), &|x| x[0].erf());
    // No gradient through rounding and detach: only the second factor's.
    both(
        "floor, ceil, round, sign (no gradient)",
        &[a.clone()],
        &|x| (x[0].floor()? + x[0].ceil()? + x[0].round()? + x[0].sign()?)?.mul(&x[0]),
        &|x| (x[0].floor()? + x[0].ceil()? + x[0].round()? + x[0].sign()?)?.mul(&x[0]),
    );
    both(
        "detach",
        &[a.clone()],
        &|x| x[0].detach().exp()?.mul(&x[0]),
        &|x| x[0].detach().exp()?.mul(&x[0]),
    );
    both("cos", &[a.clone()], &|x| x[0].cos(), &|x| x[0].cos());
    both("relu", &[a.clone()], &|x| x[0].relu(), &|x| x[0].relu());
    both("gelu", &[a.clone()], &|x| x[0].gelu(), &|x| x[0].gelu());
    both("gelu_erf", &[a.clone()], &|x| x[0].gelu_erf(), &|x| {
        x[0].gelu_erf()
    });
    both("silu", &[a.clone()], &|x| x[0].silu(), &|x| x[0].silu());
    both(
        "sigmoid",
        &[a.clone()],
        &|x| candle_nn::ops::sigmoid(&x[0]),
        &|x| x[0].sigmoid(),
    );
    both("powf", &[pos(&[4, 6], 22)], &|x| x[0].powf(2.5), &|x| {
        x[0].powf(2.5)
    });
    both("affine", &[a.clone()], &|x| x[0].affine(-0.5, 3.0), &|x| {
        x[0].affine(-0.5, 3.0)
    });
    both(
        "scalar ops",
        &[a.clone()],
        &|x| (((&x[0] + 1.0)? * 2.0)? - 0.5)? / 3.0,
        &|x| (((&x[0] + 1.0)? * 2.0)? - 0.5)? / 3.0,
    );
    both(
        "to_dtype f64",
        &[a],
        &|x| x[0].to_dtype(DType::F64)?.sqr(),
        &|x| x[0].to_dtype(DType::F64)?.sqr(),
    );
}

#[test]
fn reductions() {
    let a = m(&[3, 4, 5], 30);
    both(
        "sum_keepdim",
        &[a.clone()],
        &|x| x[0].sum_keepdim(1),
        &|x| x[0].sum_keepdim(1),
    );
    both("sum two dims", &[a.clone()], &|x| x[0].sum((0, 2)), &|x| {
        x[0].sum((0, 2))
    });
    both("sum_all", &[a.clone()], &|x| x[0].sum_all(), &|x| {
        x[0].sum_all()
    });
    both("mean", &[a.clone()], &|x| x[0].mean(2), &|x| x[0].mean(2));
    both(
        "mean_keepdim",
        &[a.clone()],
        &|x| x[0].mean_keepdim(0),
        &|x| x[0].mean_keepdim(0),
    );
    both("mean_all", &[a.clone()], &|x| x[0].mean_all(), &|x| {
        x[0].mean_all()
    });
    both("max", &[a.clone()], &|x| x[0].max(1), &|x| x[0].max(1));
    both(
        "max_keepdim",
        &[a.clone()],
        &|x| x[0].max_keepdim(2),
        &|x| x[0].max_keepdim(2),
    );
    both("min", &[a.clone()], &|x| x[0].min(D::Minus1), &|x| {
        x[0].min(D::Minus1)
    });
    both(
        "var_keepdim",
        &[a.clone()],
        &|x| x[0].var_keepdim(1),
        &|x| x[0].var_keepdim(1),
    );
    both("var", &[a.clone()], &|x| x[0].var(2), &|x| x[0].var(2));
    both("cumsum", &[a.clone()], &|x| x[0].cumsum(1), &|x| {
        x[0].cumsum(1)
    });
    both(
        "cumsum rank 1",
        &[m(&[7], 180)],
        &|x| x[0].cumsum(0),
        &|x| x[0].cumsum(0),
    );
    both(
        "pow",
        &[pos(&[3, 4, 5], 181), m(&[3, 4, 5], 182)],
        &|x| x[0].pow(&x[1]),
        &|x| x[0].pow(&x[1]),
    );
    both(
        "broadcast_pow",
        &[pos(&[3, 4, 5], 183), m(&[4, 1], 184)],
        &|x| x[0].broadcast_pow(&x[1]),
        &|x| x[0].broadcast_pow(&x[1]),
    );
    both(
        "log_sum_exp",
        &[a.clone()],
        &|x| x[0].log_sum_exp((0, 2)),
        &|x| x[0].log_sum_exp((0, 2)),
    );
    both(
        "softmax",
        &[a.clone()],
        &|x| candle_nn::ops::softmax(&x[0], D::Minus1),
        &|x| x[0].softmax(D::Minus1),
    );
    both(
        "softmax dim 1",
        &[a.clone()],
        &|x| candle_nn::ops::softmax(&x[0], 1),
        &|x| x[0].softmax(1),
    );
    both(
        "log_softmax",
        &[a],
        &|x| candle_nn::ops::log_softmax(&x[0], 1),
        &|x| x[0].log_softmax(1),
    );
}

#[test]
fn convolutions_and_pooling() {
    both(
        "conv1d",
        &[m(&[2, 3, 9], 40), m(&[4, 3, 3], 41)],
        &|x| x[0].conv1d(&x[1], 1, 1, 1, 1),
        &|x| x[0].conv1d(&x[1], 1, 1, 1, 1),
    );
    both(
        "conv1d stride 2",
        &[m(&[2, 3, 10], 42), m(&[4, 3, 3], 43)],
        &|x| x[0].conv1d(&x[1], 0, 2, 1, 1),
        &|x| x[0].conv1d(&x[1], 0, 2, 1, 1),
    );
    both(
        "conv2d",
        &[m(&[2, 3, 8, 8], 44), m(&[5, 3, 3, 3], 45)],
        &|x| x[0].conv2d(&x[1], 1, 1, 1, 1),
        &|x| x[0].conv2d(&x[1], 1, 1, 1, 1),
    );
    both(
        "conv2d stride 2 dilation 2",
        &[m(&[1, 2, 9, 9], 46), m(&[3, 2, 3, 3], 47)],
        &|x| x[0].conv2d(&x[1], 0, 2, 2, 1),
        &|x| x[0].conv2d(&x[1], 0, 2, 2, 1),
    );
    both(
        "conv1d groups 3",
        &[m(&[2, 6, 9], 160), m(&[9, 2, 3], 161)],
        &|x| x[0].conv1d(&x[1], 1, 1, 1, 3),
        &|x| x[0].conv1d(&x[1], 1, 1, 1, 3),
    );
    both(
        "conv2d groups 2 (depthwise-like)",
        &[m(&[2, 4, 7, 7], 162), m(&[6, 2, 3, 3], 163)],
        &|x| x[0].conv2d(&x[1], 1, 2, 1, 2),
        &|x| x[0].conv2d(&x[1], 1, 2, 1, 2),
    );
    let cfg1 = candle_nn::Conv1dConfig {
        padding: 1,
        groups: 2,
        ..Default::default()
    };
    both(
        "nn::Conv1d layer, groups 2",
        &[m(&[2, 4, 9], 168), m(&[6, 2, 3], 169), m(&[6], 170)],
        &move |x| {
            use candle_nn::Module as _;
            candle_nn::Conv1d::new(x[1].clone(), Some(x[2].clone()), cfg1).forward(&x[0])
        },
        &move |x| {
            use remat_candle::nn::Module as _;
            remat_candle::nn::Conv1d::new(x[1].clone(), Some(x[2].clone()), cfg1).forward(&x[0])
        },
    );
    let cfg2 = candle_nn::Conv2dConfig {
        stride: 2,
        groups: 3,
        ..Default::default()
    };
    both(
        "nn::Conv2d layer, groups 3",
        &[m(&[1, 6, 7, 7], 171), m(&[3, 2, 3, 3], 172), m(&[3], 173)],
        &move |x| {
            use candle_nn::Module as _;
            candle_nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), cfg2).forward(&x[0])
        },
        &move |x| {
            use remat_candle::nn::Module as _;
            remat_candle::nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), cfg2).forward(&x[0])
        },
    );
    // Groups 1 with a bias: one fused op (convolution, bias added in place).
    let cfg3 = candle_nn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    both(
        "nn::Conv2d layer with bias (fused)",
        &[m(&[2, 3, 6, 6], 190), m(&[4, 3, 3, 3], 191), m(&[4], 192)],
        &move |x| {
            use candle_nn::Module as _;
            candle_nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), cfg3).forward(&x[0])
        },
        &move |x| {
            use remat_candle::nn::Module as _;
            remat_candle::nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), cfg3).forward(&x[0])
        },
    );
    // Batch 1 and a 1×1 output: the bias's gradient sums over no batch dim.
    both(
        "nn::Conv2d layer with bias, 1×1 output",
        &[m(&[1, 2, 3, 3], 193), m(&[3, 2, 3, 3], 194), m(&[3], 195)],
        &move |x| {
            use candle_nn::Module as _;
            candle_nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), Default::default())
                .forward(&x[0])
        },
        &move |x| {
            use remat_candle::nn::Module as _;
            remat_candle::nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), Default::default())
                .forward(&x[0])
        },
    );
    // Other float dtypes: the in-place sum is the dtype's own addition, as candle's.
    // (candle's CPU convolution has no bf16 matmul.)
    for dtype in [DType::F64, DType::F16] {
        let t = |shape: &[usize], seed| m(shape, seed).to_dtype(dtype).unwrap();
        both(
            &format!("nn::Conv2d layer with bias, {dtype:?}"),
            &[t(&[2, 2, 5, 5], 199), t(&[3, 2, 3, 3], 200), t(&[3], 201)],
            &move |x| {
                use candle_nn::Module as _;
                candle_nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), cfg3).forward(&x[0])
            },
            &move |x| {
                use remat_candle::nn::Module as _;
                remat_candle::nn::Conv2d::new(x[1].clone(), Some(x[2].clone()), cfg3).forward(&x[0])
            },
        );
    }
    let cfg4 = candle_nn::Conv1dConfig {
        stride: 2,
        ..Default::default()
    };
    both(
        "nn::Conv1d layer with bias (fused)",
        &[m(&[2, 3, 11], 196), m(&[5, 3, 3], 197), m(&[5], 198)],
        &move |x| {
            use candle_nn::Module as _;
            candle_nn::Conv1d::new(x[1].clone(), Some(x[2].clone()), cfg4).forward(&x[0])
        },
        &move |x| {
            use remat_candle::nn::Module as _;
            remat_candle::nn::Conv1d::new(x[1].clone(), Some(x[2].clone()), cfg4).forward(&x[0])
        },
    );
    both(
        "conv_transpose2d",
        &[m(&[2, 3, 5, 5], 174), m(&[3, 4, 3, 3], 175)],
        &|x| x[0].conv_transpose2d(&x[1], 1, 1, 2, 1),
        &|x| x[0].conv_transpose2d(&x[1], 1, 1, 2, 1),
    );
    let cfgt = candle_nn::ConvTranspose2dConfig {
        stride: 2,
        ..Default::default()
    };
    both(
        "nn::ConvTranspose2d layer",
        &[m(&[1, 3, 4, 4], 176), m(&[3, 2, 3, 3], 177), m(&[2], 178)],
        &move |x| {
            use candle_nn::Module as _;
            candle_nn::ConvTranspose2d::new(x[1].clone(), Some(x[2].clone()), cfgt).forward(&x[0])
        },
        &move |x| {
            use remat_candle::nn::Module as _;
            remat_candle::nn::ConvTranspose2d::new(x[1].clone(), Some(x[2].clone()), cfgt)
                .forward(&x[0])
        },
    );
    both(
        "max_pool2d_with_stride",
        &[m(&[2, 3, 8, 6], 164)],
        &|x| x[0].max_pool2d_with_stride((2, 3), (2, 3)),
        &|x| x[0].max_pool2d_with_stride((2, 3), (2, 3)),
    );
    both(
        "avg_pool2d_with_stride",
        &[m(&[2, 3, 8, 6], 165)],
        &|x| x[0].avg_pool2d_with_stride((4, 2), (4, 2))?.exp(),
        &|x| x[0].avg_pool2d_with_stride((4, 2), (4, 2))?.exp(),
    );
    // The input also feeds another op: candle's upsample backward replaces the
    // running gradient sum instead of adding to it; its own node does the same.
    both(
        "upsample_nearest2d",
        &[m(&[2, 3, 4, 5], 166)],
        &|x| {
            x[0].upsample_nearest2d(8, 10)?
                .exp()?
                .sum_keepdim(1)?
                .broadcast_add(&x[0].sum_keepdim(1)?.upsample_nearest2d(8, 10)?)
        },
        &|x| {
            x[0].upsample_nearest2d(8, 10)?
                .exp()?
                .sum_keepdim(1)?
                .broadcast_add(&x[0].sum_keepdim(1)?.upsample_nearest2d(8, 10)?)
        },
    );
    both(
        "upsample_nearest1d",
        &[m(&[2, 3, 5], 167)],
        &|x| x[0].upsample_nearest1d(15)?.tanh(),
        &|x| x[0].upsample_nearest1d(15)?.tanh(),
    );
    both(
        "max_pool2d",
        &[m(&[2, 3, 8, 8], 48)],
        &|x| x[0].max_pool2d(2),
        &|x| x[0].max_pool2d(2),
    );
    both(
        "avg_pool2d",
        &[m(&[2, 3, 8, 8], 49)],
        &|x| x[0].avg_pool2d(2),
        &|x| x[0].avg_pool2d(2),
    );
}

#[test]
fn views_and_cat() {
    let a = m(&[4, 6], 50);
    both(
        "reshape",
        &[a.clone()],
        &|x| x[0].reshape((2, 12))?.exp(),
        &|x| x[0].reshape((2, 12))?.exp(),
    );
    both(
        "transpose + reshape (copy)",
        &[a.clone()],
        &|x| x[0].t()?.reshape(24)?.exp(),
        &|x| x[0].t()?.reshape(24)?.exp(),
    );
    both(
        "narrow",
        &[a.clone()],
        &|x| x[0].narrow(1, 2, 3)?.sqr(),
        &|x| x[0].narrow(1, 2, 3)?.sqr(),
    );
    both(
        "contiguous",
        &[a.clone()],
        &|x| x[0].t()?.contiguous(),
        &|x| x[0].t()?.contiguous(),
    );
    both(
        "unsqueeze/squeeze",
        &[a.clone()],
        &|x| x[0].unsqueeze(0)?.squeeze(0)?.tanh(),
        &|x| x[0].unsqueeze(0)?.squeeze(0)?.tanh(),
    );
    let c = m(&[2, 3, 4], 52);
    both(
        "flatten(1, 2)",
        &[c.clone()],
        &|x| x[0].flatten(1, 2)?.exp(),
        &|x| x[0].flatten(1, 2)?.exp(),
    );
    both(
        "flatten_to of a transpose (copy)",
        &[c.clone()],
        &|x| x[0].transpose(0, 2)?.flatten_to(1)?.exp(),
        &|x| x[0].transpose(0, 2)?.flatten_to(1)?.exp(),
    );
    both("get", &[c.clone()], &|x| x[0].get(1)?.sqr(), &|x| {
        x[0].get(1)?.sqr()
    });
    both(
        "get_on_dim",
        &[c],
        &|x| x[0].get_on_dim(2, 3)?.tanh(),
        &|x| x[0].get_on_dim(2, 3)?.tanh(),
    );
    both(
        "cat 2",
        &[a.clone(), m(&[4, 2], 51)],
        &|x| Tensor::cat(&[&x[0], &x[1]], 1),
        &|x| RTensor::cat(&[&x[0], &x[1]], 1),
    );
    let five: Vec<Tensor> = (0..5).map(|i| m(&[2, 3], 60 + i)).collect();
    both("cat 5", &five, &|x| Tensor::cat(x, 0), &|x| {
        let refs: Vec<&RTensor> = x.iter().collect();
        RTensor::cat(&refs, 0)
    });
}

#[test]
fn indexing() {
    let ids = Tensor::new(&[3u32, 0, 3, 1, 4], &Device::Cpu).unwrap();
    let ids2 = ids.clone();
    both(
        "index_select",
        &[m(&[5, 4], 70)],
        &move |x| x[0].index_select(&ids, 0),
        &move |x| {
            let r = x[0].remat().input(&ids2)?;
            x[0].index_select(&r, 0)
        },
    );
    let ia = Tensor::new(&[2u32, 0, 2], &Device::Cpu).unwrap();
    let ia2 = ia.clone();
    both(
        "index_add",
        &[m(&[4, 5], 185), m(&[3, 5], 186)],
        &move |x| x[0].index_add(&ia, &x[1], 0),
        &move |x| {
            let r = x[0].remat().input(&ia2)?;
            x[0].index_add(&r, &x[1], 0)
        },
    );
    let g = Tensor::new(&[[1u32], [0], [2]], &Device::Cpu).unwrap();
    let g2 = g.clone();
    both(
        "gather",
        &[m(&[3, 4], 71)],
        &move |x| x[0].gather(&g, 1),
        &move |x| {
            let r = x[0].remat().input(&g2)?;
            x[0].gather(&r, 1)
        },
    );
}

#[test]
fn dropout_replays_its_mask() {
    let seed = 1234;
    both(
        "dropout",
        &[m(&[8, 16], 80)],
        &move |x| {
            x[0].mul(&dropout_mask(
                seed,
                x[0].shape(),
                0.3,
                x[0].dtype(),
                x[0].device(),
            )?)
        },
        &move |x| x[0].dropout_with_seed(0.3, seed),
    );
    // Seeds drawn by the context are recorded: a replay gives the same values.
    let remat = Remat::new(RematConfig::new()).unwrap();
    let x = remat.input(&m(&[64], 81)).unwrap();
    let y = x.affine(1.0, 1.0).unwrap().dropout(0.5).unwrap();
    let first = y.to_vec1::<f32>().unwrap();
    assert!(first.contains(&0.0) && first.iter().any(|v| *v != 0.0));
    assert!(y.evict().unwrap());
    let again = y.to_vec1::<f32>().unwrap();
    assert_eq!(
        first.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(y.recompute_count().unwrap(), 1);
    // A second dropout call draws another seed: another mask.
    let z = x.affine(1.0, 1.0).unwrap().dropout(0.5).unwrap();
    assert_ne!(z.to_vec1::<f32>().unwrap(), first);
}

#[test]
fn layer_norm_composition() {
    let (x, w, b) = (m(&[3, 8], 90), m(&[8], 91), m(&[8], 92));
    let plain = |x: &[Tensor]| -> candle_core::Result<Tensor> {
        // candle-nn's LayerNorm::forward (non-fused path).
        let h = x[0].dim(D::Minus1)? as f64;
        let mean = (x[0].sum_keepdim(D::Minus1)? / h)?;
        let xc = x[0].broadcast_sub(&mean)?;
        let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / h)?;
        let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
        xn.broadcast_mul(&x[1])?.broadcast_add(&x[2])
    };
    let ours = |x: &[RTensor]| -> remat_candle::Result<RTensor> {
        let h = x[0].dim(D::Minus1)? as f64;
        let mean = (x[0].sum_keepdim(D::Minus1)? / h)?;
        let xc = x[0].broadcast_sub(&mean)?;
        let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / h)?;
        let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
        xn.broadcast_mul(&x[1])?.broadcast_add(&x[2])
    };
    both("layer norm", &[x, w, b], &plain, &ours);
}

#[test]
fn indexing_with_i() {
    use candle_core::IndexOp as _;
    use remat_candle::IndexOp as _;
    let a = m(&[4, 6], 100);
    both(
        "i select + range",
        &[a.clone()],
        &|x| x[0].i((1.., 2))?.exp(),
        &|x| x[0].i((1.., 2))?.exp(),
    );
    both(
        "i ranges",
        &[a.clone()],
        &|x| x[0].i((..3, 1..=4))?.sqr(),
        &|x| x[0].i((..3, 1..=4))?.sqr(),
    );
    let ids = Tensor::new(&[2u32, 0, 2], &Device::Cpu).unwrap();
    let ids2 = ids.clone();
    both(
        "i tensor",
        &[a.clone()],
        &move |x| x[0].i((.., &ids))?.tanh(),
        &move |x| x[0].i((.., &ids2))?.tanh(),
    );
    both(
        "expand",
        &[m(&[1, 6], 101)],
        &|x| x[0].expand((4, 6))?.exp(),
        &|x| x[0].expand((4, 6))?.exp(),
    );
}

#[test]
fn masks_and_clamp() {
    let mask = Tensor::new(&[[1u8, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0]], &Device::Cpu).unwrap();
    let (m1, m2, m3) = (mask.clone(), mask.clone(), mask.clone());
    both(
        "where_cond",
        &[m(&[3, 4], 110), m(&[3, 4], 111)],
        &move |x| m1.where_cond(&x[0], &x[1]),
        &move |x| x[0].remat().input(&m2)?.where_cond(&x[0], &x[1]),
    );
    // candle-transformers' masked_fill helper, with -inf then a softmax.
    let plain_fill = move |x: &[Tensor]| -> candle_core::Result<Tensor> {
        let on_true = Tensor::new(f32::NEG_INFINITY, x[0].device())?.broadcast_as(m3.shape())?;
        candle_nn::ops::softmax(&m3.where_cond(&on_true, &x[0])?, D::Minus1)
    };
    let mask2 = Tensor::new(&[[0u8, 0, 1, 1], [0, 0, 0, 1], [0, 1, 1, 1]], &Device::Cpu).unwrap();
    let mask3 = mask2.clone();
    both(
        "masked_fill + softmax",
        &[m(&[3, 4], 112)],
        &move |x| {
            let on_true = Tensor::new(f32::NEG_INFINITY, x[0].device())?.broadcast_as((3, 4))?;
            candle_nn::ops::softmax(&mask2.where_cond(&on_true, &x[0])?, D::Minus1)
        },
        &move |x| {
            let mask = x[0].remat().input(&mask3)?;
            remat_candle::nn::ops::softmax_last_dim(&x[0].masked_fill(&mask, f32::NEG_INFINITY)?)
        },
    );
    drop(plain_fill);
    both(
        "clamp",
        &[m(&[4, 6], 113)],
        &|x| x[0].clamp(-1f64, 1.5f64),
        &|x| x[0].clamp(-1.0, 1.5),
    );
}

#[test]
fn padding_repeat_stack_and_cat_of_one_tensor() {
    let a = m(&[3, 4], 120);
    both(
        "pad_with_zeros both sides",
        &[a.clone()],
        &|x| x[0].pad_with_zeros(1, 2, 1)?.exp(),
        &|x| x[0].pad_with_zeros(1, 2, 1)?.exp(),
    );
    both(
        "pad_with_zeros left",
        &[a.clone()],
        &|x| x[0].pad_with_zeros(0, 1, 0),
        &|x| x[0].pad_with_zeros(0, 1, 0),
    );
    both("repeat", &[a.clone()], &|x| x[0].repeat((2, 3)), &|x| {
        x[0].repeat((2, 3))
    });
    both(
        "stack",
        &[a.clone(), m(&[3, 4], 121)],
        &|x| Tensor::stack(&[&x[0], &x[1]], 1),
        &|x| RTensor::stack(&[&x[0], &x[1]], 1),
    );
    // One tensor given five times plus another use: the gradient is summed in
    // candle's order (repeat_kv in candle-transformers).
    both(
        "cat of one tensor 5 times",
        &[a],
        // `.exp()` after the cat: full-precision gradients, so that a different
        // summation order shows in the bits (checked with a chained cat).
        &|x| Tensor::cat(&[&x[0].exp()?, &x[0], &x[0], &x[0], &x[0]], 1)?.exp(),
        &|x| RTensor::cat(&[&x[0].exp()?, &x[0], &x[0], &x[0], &x[0]], 1)?.exp(),
    );
}

#[test]
fn comparisons_and_argmax_match_candle() {
    let remat = Remat::unbounded().unwrap();
    let (a, b) = (m(&[3, 5], 130), m(&[3, 5], 131));
    let b = Tensor::cat(&[a.narrow(0, 0, 1).unwrap(), b.narrow(0, 1, 2).unwrap()], 0).unwrap();
    let (ra, rb) = (remat.input(&a).unwrap(), remat.input(&b).unwrap());
    let ra = ra.affine(1.0, 0.0).unwrap(); // an evictable intermediate
    let u8s = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<u8>().unwrap();
    for (ours, plain) in [
        (ra.eq(&rb), a.eq(&b)),
        (ra.ne(&rb), a.ne(&b)),
        (ra.lt(&rb), a.lt(&b)),
        (ra.le(&rb), a.le(&b)),
        (ra.gt(&rb), a.gt(&b)),
        (ra.ge(&rb), a.ge(&b)),
        (ra.cmp_scalar(0.5, candle_core::op::CmpOp::Gt), a.gt(0.5)),
        (
            ra.broadcast_lt(&rb.narrow(0, 1, 1).unwrap()),
            a.broadcast_lt(&b.narrow(0, 1, 1).unwrap()),
        ),
        (
            ra.broadcast_ge(&rb.narrow(1, 2, 1).unwrap()),
            a.broadcast_ge(&b.narrow(1, 2, 1).unwrap()),
        ),
    ] {
        assert_eq!(
            u8s(&ours.unwrap().to_candle().unwrap()),
            u8s(&plain.unwrap())
        );
    }
    assert!(ra.evict().unwrap());
    let am = ra.argmax(1).unwrap();
    assert_eq!(
        am.to_vec1::<u32>().unwrap(),
        a.argmax(1).unwrap().to_vec1::<u32>().unwrap()
    );
    assert_eq!(
        ra.argmin_keepdim(0).unwrap().to_vec2::<u32>().unwrap(),
        a.argmin_keepdim(0).unwrap().to_vec2::<u32>().unwrap()
    );
    assert!(ra.recompute_count().unwrap() >= 1);
    let s = ra.sum_all().unwrap();
    assert_eq!(
        s.to_vec0::<f32>().unwrap(),
        a.sum_all().unwrap().to_vec0::<f32>().unwrap()
    );
}

#[test]
fn nn_ops_and_rotary_embeddings() {
    use remat_candle::nn::{ops, rotary_emb};
    let x = m(&[2, 3, 8], 140);
    both(
        "softmax_last_dim",
        &[x.clone()],
        &|x| candle_nn::ops::softmax(&x[0], D::Minus1),
        &|x| ops::softmax_last_dim(&x[0]),
    );
    both(
        "rms_norm",
        &[x.clone(), m(&[8], 141)],
        &|x| candle_nn::ops::rms_norm_slow(&x[0], &x[1], 1e-6),
        &|x| ops::rms_norm(&x[0], &x[1], 1e-6),
    );
    both(
        "layer_norm op",
        &[x.clone(), m(&[8], 142), m(&[8], 143)],
        &|x| candle_nn::ops::layer_norm_slow(&x[0], &x[1], &x[2], 1e-5),
        &|x| ops::layer_norm(&x[0], &x[1], &x[2], 1e-5),
    );
    both(
        "swiglu",
        &[x.clone()],
        &|x| candle_nn::ops::swiglu(&x[0]),
        &|x| ops::swiglu(&x[0]),
    );
    both(
        "leaky_relu",
        &[x],
        &|x| candle_nn::ops::leaky_relu(&x[0], 0.1),
        &|x| ops::leaky_relu(&x[0], 0.1),
    );
    // (b, h, t, d) = (2, 2, 5, 8); cos/sin (6, 4): t' > t.
    let (q, cos, sin) = (m(&[2, 2, 5, 8], 144), m(&[6, 4], 145), m(&[6, 4], 146));
    both(
        "rope",
        &[q.clone(), cos.clone(), sin.clone()],
        &|x| {
            candle_nn::rotary_emb::rope_slow(&x[0], &x[1].narrow(0, 0, 5)?, &x[2].narrow(0, 0, 5)?)
        },
        &|x| rotary_emb::rope(&x[0], &x[1], &x[2]),
    );
    both(
        "rope_i",
        &[q, cos, sin],
        &|x| candle_nn::rotary_emb::rope_i_slow(&x[0], &x[1], &x[2]),
        &|x| rotary_emb::rope_i(&x[0], &x[1], &x[2]),
    );
}

#[test]
fn activations_match_candle_nn() {
    use candle_nn::Activation;
    both("elu", &[m(&[4, 6], 150)], &|x| x[0].elu(0.7), &|x| {
        x[0].elu(0.7)
    });
    let all = [
        Activation::Gelu,
        Activation::NewGelu,
        Activation::Relu,
        Activation::Relu2,
        Activation::Relu6,
        Activation::Silu,
        Activation::Sigmoid,
        Activation::HardSigmoid,
        Activation::Swiglu,
        Activation::Swish,
        Activation::Mish,
        Activation::HardSwish,
        Activation::Elu(0.5),
        Activation::LeakyRelu(0.1),
        Activation::GeluPytorchTanh,
    ];
    for act in all {
        // Values past 6 and -3..3 so Relu6 and HardSigmoid clamp on both sides.
        let x = rand(151, &[4, 6], -8.0, 8.0);
        both(
            &format!("{act:?}"),
            &[x],
            &move |x| candle_nn::Module::forward(&act, &x[0]),
            &move |x| remat_candle::nn::Module::forward(&act, &x[0]),
        );
    }
}

#[test]
fn candle_transformers_helpers_and_to_device() {
    // candle-transformers 0.11.1's `utils::repeat_kv`, in plain candle.
    fn plain_repeat_kv(xs: &Tensor, n_rep: usize) -> candle_core::Result<Tensor> {
        let (b_sz, n_kv_head, seq_len, head_dim) = xs.dims4()?;
        Tensor::cat(&vec![xs; n_rep], 2)?.reshape((b_sz, n_kv_head * n_rep, seq_len, head_dim))
    }
    both(
        "repeat_kv",
        &[m(&[2, 2, 3, 4], 160)],
        &|x| plain_repeat_kv(&x[0], 3)?.sqr(),
        &|x| remat_candle::transformers::utils::repeat_kv(x[0].clone(), 3)?.sqr(),
    );
    both(
        "to_device",
        &[m(&[3, 4], 161)],
        &|x| x[0].to_device(&Device::Cpu)?.exp(),
        &|x| x[0].to_device(&Device::Cpu)?.exp(),
    );
}

#[test]
fn build_causal_mask_is_candle_transformers_mask() {
    let remat = Remat::unbounded().unwrap();
    for (t, pos) in [(4, 0), (3, 2)] {
        let m = remat_candle::transformers::utils::build_causal_mask(t, pos, &Device::Cpu).unwrap();
        assert!(m.is_constant() && m.is_external());
        assert_eq!(m.dims(), &[t, t + pos]);
        let rows = m.to_vec2::<u8>().unwrap();
        for (i, row) in rows.iter().enumerate() {
            // Query i sees the cached prefix and itself, not the keys after it.
            let visible = row.iter().filter(|&&v| v == 0).count();
            assert_eq!(visible, pos + i + 1, "row {i} of ({t}, {pos})");
            assert!(row[..pos + i + 1].iter().all(|&v| v == 0));
        }
    }
    drop(remat);
}
