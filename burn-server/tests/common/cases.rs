//! The stress cases of `stress.rs`, remat-burn's (Burn 0.21) cases ported to
//! Burn 0.22's API: each case is one function of a `Device` that returns every
//! output's data, so that a run on a remote `Dtr<Flex>` device can be compared
//! bit for bit with one on plain Flex.

#![allow(dead_code)]

use burn::linalg;
use burn::tensor::ops::{AttentionModuleOptions, ConvOptions, ConvTransposeOptions};
use burn::tensor::ops::{AvgPoolOptions, InterpolateMode, InterpolateOptions, MaxPoolOptions};
use burn::tensor::{
    activation, module, Bool, Device, Distribution, Int, Tensor, TensorData, Transaction,
};

/// Deterministic data in [-1, 1).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut z = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Deterministic data of `shape`, as the output of an op (`× 1.0`, exact) so
/// that it can be evicted and replayed like any intermediate.
pub fn float<const D: usize>(shape: [usize; D], seed: u64, d: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    Tensor::<1>::from_floats(data(n, seed).as_slice(), d).reshape(shape) * 1.0
}

/// Deterministic ints in [0, modulo), as the output of an op.
pub fn ints<const D: usize>(shape: [usize; D], modulo: i64, d: &Device) -> Tensor<D, Int> {
    let n: usize = shape.iter().product();
    let v: Vec<i64> = (0..n as i64).map(|i| (i * 7 + 3) % modulo).collect();
    Tensor::<1, Int>::from_data(TensorData::new(v, [n]), d).reshape(shape) * 1
}

/// Every output of a case, read.
pub type Out = Vec<TensorData>;

/// Element-wise float ops and activations.
pub fn float_elementwise(d: &Device) -> Out {
    let a = float::<2>([16, 32], 1, d);
    let b = float::<2>([16, 32], 2, d);
    let pos = b.clone().abs() + 0.5;
    vec![
        (a.clone() + b.clone()).into_data(),
        (a.clone() - b.clone() * 3.0).into_data(),
        (a.clone() / pos.clone()).into_data(),
        a.clone().exp().log().into_data(),
        pos.clone().sqrt().powf_scalar(1.5).into_data(),
        a.clone().tanh().sin().cos().into_data(),
        a.clone().erf().recip().into_data(),
        a.clone().clamp(-0.3, 0.4).neg().into_data(),
        activation::sigmoid(a.clone()).into_data(),
        activation::gelu(a.clone()).into_data(),
        activation::softmax(a.clone(), 1).into_data(),
        activation::log_softmax(b.clone(), 0).into_data(),
        a.clone()
            .mask_where(a.clone().greater(b.clone()), b.clone())
            .into_data(),
        a.clone()
            .mask_fill(b.clone().lower_elem(0.0), 7.0)
            .into_data(),
        a.clone().max_pair(b.clone()).into_data(),
        (a.clone().remainder_scalar(0.3) * b).into_data(),
    ]
}

/// Float reductions, sorting and cumulative ops.
pub fn float_reductions(d: &Device) -> Out {
    let a = float::<3>([4, 8, 16], 3, d);
    vec![
        a.clone().sum().into_data(),
        a.clone().sum_dim(1).into_data(),
        a.clone().mean_dim(2).into_data(),
        a.clone().max_dim(0).into_data(),
        a.clone().min_dim(2).into_data(),
        a.clone().argmax(1).into_data(),
        a.clone().argmin(2).into_data(),
        a.clone().cumsum(2).into_data(),
        a.clone().sort(2).into_data(),
        a.clone().argsort(1).into_data(),
        a.clone().topk(3, 2).into_data(),
        a.clone().var(1).into_data(),
        a.prod_dim(0).into_data(),
    ]
}

/// Int arithmetic and reductions, casts, comparisons and bool logic.
pub fn int_and_bool(d: &Device) -> Out {
    let i = ints::<2>([8, 12], 11, d);
    let j = ints::<2>([8, 12], 5, d) + 1;
    let f = float::<2>([8, 12], 4, d);
    let m = f.clone().greater_elem(0.0);
    let k = f.clone().lower_equal_elem(0.25);
    vec![
        (i.clone() + j.clone() * 3).into_data(),
        (i.clone() / j.clone()).into_data(),
        i.clone().remainder(j.clone()).into_data(),
        i.clone().sum_dim(1).into_data(),
        i.clone().argmax(0).into_data(),
        i.clone().float().mul(f.clone()).into_data(),
        i.clone().equal(j.clone()).into_data(),
        i.clone().greater_equal_elem(4).int().into_data(),
        m.clone().bool_not().into_data(),
        m.clone().bool_and(k.clone()).into_data(),
        m.clone().bool_or(k.clone()).into_data(),
        m.clone().any().into_data(),
        k.clone().all_dim(1).into_data(),
        i.mask_fill(m, -1).into_data(),
        Tensor::<2, Bool>::tril_mask([6, 6], 0, d).into_data(),
        f.int().into_data(),
    ]
}

/// Matmul (2-D, batched) and linalg: matvec, outer, trace, diag, norms, det, LU.
pub fn matmul_and_linalg(d: &Device) -> Out {
    let a = float::<2>([8, 16], 5, d);
    let b = float::<2>([16, 12], 6, d);
    let c = float::<3>([3, 8, 16], 7, d);
    let sq = float::<3>([1, 12, 12], 8, d);
    let v = float::<1>([16], 9, d);
    let (p, l, u) = linalg::lu::<3, 2>(sq.clone());
    vec![
        a.clone().matmul(b.clone()).into_data(),
        c.clone().matmul(b.clone().unsqueeze::<3>()).into_data(),
        linalg::matvec::<2, 1, _>(a.clone(), v.clone()).into_data(),
        linalg::outer::<1, 2, _>(v.clone(), v.clone()).into_data(),
        linalg::trace::<2, 1>(a.clone().slice([0..8, 0..8])).into_data(),
        linalg::diag::<3, 2, _>(sq.clone()).into_data(),
        linalg::vector_norm(a.clone(), linalg::Norm::L2, 1).into_data(),
        linalg::cosine_similarity(a.clone(), a.clone().flip([1]), 1, None).into_data(),
        linalg::det::<3, 2, 1>(sq).into_data(),
        p.into_data(),
        l.into_data(),
        u.into_data(),
    ]
}

/// Gather, scatter, select, slice assign, cat, stack, repeat, flip, chunk, narrow, tril.
pub fn indexing(d: &Device) -> Out {
    let a = float::<2>([10, 6], 10, d);
    let b = float::<2>([10, 6], 11, d);
    let idx = ints::<2>([10, 6], 6, d);
    let rows = ints::<1>([4], 10, d);
    let parts = a.clone().chunk(3, 0);
    vec![
        a.clone().gather(1, idx.clone()).into_data(),
        a.clone()
            .scatter(1, idx, b.clone(), burn::tensor::IndexingUpdateOp::Add)
            .into_data(),
        a.clone().select(0, rows.clone()).into_data(),
        a.clone()
            .select_assign(
                0,
                rows,
                b.clone().slice([0..4, 0..6]),
                burn::tensor::IndexingUpdateOp::Add,
            )
            .into_data(),
        a.clone()
            .slice_assign([2..5, 1..4], b.clone().slice([0..3, 0..3]))
            .into_data(),
        Tensor::cat(vec![a.clone(), b.clone()], 1).into_data(),
        Tensor::stack::<3>(vec![a.clone(), b.clone()], 0).into_data(),
        a.clone().repeat_dim(0, 3).into_data(),
        a.clone().flip([0, 1]).into_data(),
        Tensor::cat(parts, 0).exp().into_data(),
        a.clone().narrow(0, 2, 5).into_data(),
        a.tril(1).into_data(),
    ]
}

/// View chains (swap_dims → permute → narrow → reshape, expand) read by compute.
pub fn view_chains(d: &Device) -> Out {
    let a = float::<3>([4, 6, 8], 12, d);
    let s = a.clone().swap_dims(0, 2); // [8, 6, 4]
    let p = s.clone().permute([2, 0, 1]); // [4, 8, 6]
    let n = p.clone().narrow(1, 2, 4); // [4, 4, 6]
    let r = n.clone().reshape([16, 6]);
    let e = float::<2>([1, 6], 13, d).expand([16, 6]);
    vec![
        (r.clone() * e.clone()).exp().into_data(),
        s.clone().sum_dim(2).into_data(),
        (p + 1.0).into_data(),
        n.swap_dims(1, 2)
            .reshape([4, 24])
            .matmul(float::<2>([24, 3], 14, d))
            .into_data(),
        e.into_data(),
        r.into_data(),
    ]
}

/// Module ops: convolutions, pooling, interpolation, embedding.
pub fn module_ops(d: &Device) -> Out {
    let x = float::<4>([2, 3, 10, 10], 15, d);
    let w = float::<4>([4, 3, 3, 3], 16, d);
    let bias = float::<1>([4], 17, d);
    let conv = module::conv2d(
        x.clone(),
        w,
        Some(bias.clone()),
        ConvOptions::new([2, 1], [1, 1], [1, 2], 1),
    );
    let wt = float::<4>([4, 2, 3, 3], 18, d);
    let convt = module::conv_transpose2d(
        conv.clone(),
        wt,
        None,
        ConvTransposeOptions::new([2, 2], [1, 1], [1, 0], [1, 1], 1),
    );
    let x1 = float::<3>([2, 4, 20], 19, d);
    let w1 = float::<3>([6, 2, 5], 20, d);
    let conv1 = module::conv1d(x1, w1, None, ConvOptions::new([1], [2], [1], 2));
    let (mp, mi) = module::max_pool2d_with_indices(
        x.clone(),
        MaxPoolOptions::new([3, 3])
            .with_stride([2, 2])
            .with_padding([1, 1]),
    );
    let table = float::<2>([12, 5], 21, d);
    let tokens = ints::<2>([2, 7], 12, d);
    vec![
        conv.clone().into_data(),
        convt.into_data(),
        conv1.into_data(),
        module::max_pool2d(
            x.clone(),
            MaxPoolOptions::new([2, 2])
                .with_stride([2, 2])
                .with_ceil_mode(true),
        )
        .into_data(),
        module::avg_pool2d(
            x.clone(),
            AvgPoolOptions::new([3, 3])
                .with_stride([1, 1])
                .with_padding([1, 1])
                .with_count_include_pad(false),
        )
        .into_data(),
        module::adaptive_avg_pool2d(conv, [3, 2]).into_data(),
        mp.into_data(),
        mi.into_data(),
        module::interpolate(
            x.clone(),
            InterpolateOptions::new(InterpolateMode::Bilinear).with_output_size([13, 7]),
        )
        .into_data(),
        module::interpolate(
            x,
            InterpolateOptions::new(InterpolateMode::Nearest).with_output_size([5, 15]),
        )
        .into_data(),
        module::embedding(table, tokens).into_data(),
    ]
}

/// Attention (causal; scale + softcap) and the CTC loss forward.
pub fn attention_and_ctc(d: &Device) -> Out {
    let q = float::<4>([2, 3, 5, 8], 22, d);
    let k = float::<4>([2, 3, 6, 8], 23, d);
    let v = float::<4>([2, 3, 6, 8], 24, d);
    let causal = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: true,
    };
    let plain = AttentionModuleOptions {
        scale: Some(0.5),
        softcap: Some(4.0),
        is_causal: false,
    };
    // CTC: T = 12 steps, batch 2, 5 classes (0 = blank), targets of length 4.
    let log_probs = activation::log_softmax(float::<3>([12, 2, 5], 25, d) * 3.0, 2);
    let targets = ints::<2>([2, 4], 4, d) + 1;
    let input_lengths = Tensor::<1, Int>::from_data(TensorData::new(vec![12i64, 10], [2]), d);
    let target_lengths = Tensor::<1, Int>::from_data(TensorData::new(vec![4i64, 3], [2]), d);
    vec![
        module::attention(q.clone(), k.clone(), v.clone(), None, None, causal).into_data(),
        module::attention(q, k, v, None, None, plain).into_data(),
        module::ctc_loss(log_probs, targets, input_lengths, target_lengths, 0).into_data(),
    ]
}

/// A `Transaction` of three reads.
pub fn transaction(d: &Device) -> Out {
    let a = float::<2>([6, 6], 26, d);
    let b = a.clone().exp();
    let c = ints::<1>([9], 4, d);
    Transaction::default()
        .register(a.matmul(b.clone()))
        .register(b)
        .register(c)
        .execute()
}

/// Seeded random ops (uniform, normal, Bernoulli) and compute on them.
pub fn seeded_random(d: &Device) -> Out {
    d.seed(42);
    let u = Tensor::<2>::random([16, 16], Distribution::Default, d);
    let n = Tensor::<2>::random([16, 16], Distribution::Normal(0.0, 2.0), d);
    let bern = Tensor::<2>::random([16, 16], Distribution::Bernoulli(0.3), d);
    let prod = u.clone() * n.clone();
    let e = prod.clone().exp();
    let sin = e.clone().sin();
    vec![
        (sin * prod).into_data(),
        e.into_data(),
        u.into_data(),
        n.into_data(),
        bern.into_data(),
    ]
}

/// A gradient through `Autodiff`: conv2d, relu, max_pool2d, matmul, log_softmax.
pub fn gradients(d: &Device) -> Out {
    let x = float::<4>([2, 2, 8, 8], 27, d);
    let w = float::<4>([3, 2, 3, 3], 28, d).require_grad();
    let lin = float::<2>([48, 5], 29, d).require_grad();
    let h = module::conv2d(
        x,
        w.clone(),
        None,
        ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
    );
    let h = module::max_pool2d(
        activation::relu(h),
        MaxPoolOptions::new([2, 2]).with_stride([2, 2]),
    );
    let logits = h.reshape([2, 48]).matmul(lin.clone());
    let loss = activation::log_softmax(logits, 1).mean().neg();
    let grads = loss.backward();
    vec![
        w.grad(&grads).expect("grad of w").into_data(),
        lin.grad(&grads).expect("grad of lin").into_data(),
    ]
}

/// Burn's `test_ctc_loss_grad` (burn-backend-tests, autodiff), rebuilt
/// with its shapes and data: logits of T = 5 steps, batch 3, 4 classes
/// (`sin(0.1 · (7t + 13n + 3c))`), `log_softmax`, CTC loss (blank 0) of targets
/// of lengths 2, 1 and 3, summed, and the gradient of the logits. Burn's
/// backward of `ctc_loss` decomposes into primitives (~570 ops through `Dtr`),
/// which issue 16 measured thrashing at 4 KiB under the default policy.
pub fn ctc_loss_grad(d: &Device) -> Out {
    let (t_len, batch, classes) = (5usize, 3usize, 4usize);
    let mut values = Vec::with_capacity(t_len * batch * classes);
    for t in 0..t_len {
        for n in 0..batch {
            for c in 0..classes {
                values.push(((t * 7 + n * 13 + c * 3) as f32 * 0.1).sin());
            }
        }
    }
    let logits =
        Tensor::<3>::from_data(TensorData::new(values, [t_len, batch, classes]), d).require_grad();
    let log_probs = activation::log_softmax(logits.clone(), 2);
    let targets = Tensor::<2, Int>::from_data(
        TensorData::new(vec![1i64, 2, 0, 1, 0, 0, 3, 2, 1], [3, 3]),
        d,
    );
    let input_lengths = Tensor::<1, Int>::from_data(TensorData::new(vec![5i64, 5, 5], [3]), d);
    let target_lengths = Tensor::<1, Int>::from_data(TensorData::new(vec![2i64, 1, 3], [3]), d);
    let loss = module::ctc_loss(log_probs, targets, input_lengths, target_lengths, 0).sum();
    let grads = loss.backward();
    vec![
        loss.into_data(),
        logits.grad(&grads).expect("grad of the logits").into_data(),
    ]
}

/// A case on a device.
pub type Case = fn(&Device) -> Out;

/// Every case on a plain device, by name, in the order `stress.rs` runs them
/// (the autodiff cases, [`gradients`] and [`ctc_loss_grad`], come apart: they
/// run on an autodiff device).
pub fn plain_cases() -> Vec<(&'static str, Case)> {
    vec![
        ("float_elementwise", float_elementwise),
        ("float_reductions", float_reductions),
        ("int_and_bool", int_and_bool),
        ("matmul_and_linalg", matmul_and_linalg),
        ("indexing", indexing),
        ("view_chains", view_chains),
        ("module_ops", module_ops),
        ("attention_and_ctc", attention_and_ctc),
        ("transaction", transaction),
        ("seeded_random", seeded_random),
    ]
}

/// Assert that two runs of a case gave the same shapes, dtypes and bytes.
pub fn assert_same(case: &str, config: &str, want: &Out, got: &Out) {
    assert_eq!(want.len(), got.len(), "{case} [{config}]");
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.shape(), g.shape(), "{case} [{config}] output {k}: shape");
        assert_eq!(w.dtype(), g.dtype(), "{case} [{config}] output {k}: dtype");
        assert!(
            w.as_bytes() == g.as_bytes(),
            "{case} [{config}] output {k}: bytes differ from Flex"
        );
    }
}
