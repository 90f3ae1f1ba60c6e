//! Stress conformance: every op family of burn 0.21's backend traits run on
//! `Dtr<NdArray>` under heavy eviction, compared bit for bit with plain
//! `NdArray`.
//!
//! Each case is one generic function over the backend; it is run on NdArray and
//! on `Dtr<NdArray>` under two configurations:
//! - `threshold:0`: before each op, every storage one op away from resident
//!   inputs is evicted, so nearly every read of an intermediate replays it;
//! - a small physical budget (the default mode) that the cases' working sets
//!   fit but their totals do not.
//!
//! Families: float (element-wise, reductions, sorting, cumulative), int, bool,
//! matmul and linalg (det/LU, matvec, outer, trace, diag, norms), indexing
//! (gather/scatter/select/slice assign, cat/stack/repeat/flip/chunk), view
//! chains (swap_dims/permute/narrow/expand/reshape), module ops (conv 1d/2d,
//! transposed conv, pooling, interpolate, embedding, attention, CTC), a
//! transaction, seeded random ops, and a gradient through `Autodiff`.

use burn_autodiff::Autodiff;
use burn_backend::backend::Backend;
use burn_backend::ops::{AttentionModuleOptions, ConvOptions, ConvTransposeOptions};
use burn_backend::ops::{InterpolateMode, InterpolateOptions};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::{
    activation, linalg, module, Bool, Distribution, Int, Tensor, TensorData, Transaction,
};
use remat_burn::{Dtr, DtrDevice};
use remat_dtr::{BudgetMode, DtrConfig};

type Ours = Dtr<NdArray>;

/// Deterministic data in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
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
fn float<B: Backend, const D: usize>(shape: [usize; D], seed: u64, d: &B::Device) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::<B, 1>::from_floats(data(n, seed).as_slice(), d).reshape(shape) * 1.0
}

fn ints<B: Backend, const D: usize>(
    shape: [usize; D],
    modulo: i64,
    d: &B::Device,
) -> Tensor<B, D, Int> {
    let n: usize = shape.iter().product();
    let v: Vec<i64> = (0..n as i64).map(|i| (i * 7 + 3) % modulo).collect();
    Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n]), d).reshape(shape) * 1
}

type Out = Vec<TensorData>;

fn float_elementwise<B: Backend>(d: &B::Device) -> Out {
    let a = float::<B, 2>([16, 32], 1, d);
    let b = float::<B, 2>([16, 32], 2, d);
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

fn float_reductions<B: Backend>(d: &B::Device) -> Out {
    let a = float::<B, 3>([4, 8, 16], 3, d);
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

fn int_and_bool<B: Backend>(d: &B::Device) -> Out {
    let i = ints::<B, 2>([8, 12], 11, d);
    let j = ints::<B, 2>([8, 12], 5, d) + 1;
    let f = float::<B, 2>([8, 12], 4, d);
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
        Tensor::<B, 2, Bool>::tril_mask([6, 6], 0, d).into_data(),
        f.int().into_data(),
    ]
}

fn matmul_and_linalg<B: Backend>(d: &B::Device) -> Out {
    let a = float::<B, 2>([8, 16], 5, d);
    let b = float::<B, 2>([16, 12], 6, d);
    let c = float::<B, 3>([3, 8, 16], 7, d);
    let sq = float::<B, 3>([1, 12, 12], 8, d);
    let v = float::<B, 1>([16], 9, d);
    let (p, l, u) = linalg::lu::<B, 3, 2>(sq.clone());
    vec![
        a.clone().matmul(b.clone()).into_data(),
        c.clone().matmul(b.clone().unsqueeze::<3>()).into_data(),
        linalg::matvec::<B, 2, 1, _>(a.clone(), v.clone()).into_data(),
        linalg::outer::<B, 1, 2, _>(v.clone(), v.clone()).into_data(),
        linalg::trace::<B, 2, 1>(a.clone().slice([0..8, 0..8])).into_data(),
        linalg::diag::<B, 3, 2, _>(sq.clone()).into_data(),
        linalg::vector_norm(a.clone(), linalg::Norm::L2, 1).into_data(),
        linalg::cosine_similarity(a.clone(), a.clone().flip([1]), 1, None).into_data(),
        linalg::det::<B, 3, 2, 1>(sq).into_data(),
        p.into_data(),
        l.into_data(),
        u.into_data(),
    ]
}

fn indexing<B: Backend>(d: &B::Device) -> Out {
    let a = float::<B, 2>([10, 6], 10, d);
    let b = float::<B, 2>([10, 6], 11, d);
    let idx = ints::<B, 2>([10, 6], 6, d);
    let rows = ints::<B, 1>([4], 10, d);
    let parts = a.clone().chunk(3, 0);
    vec![
        a.clone().gather(1, idx.clone()).into_data(),
        a.clone()
            .scatter(1, idx, b.clone(), burn_tensor::IndexingUpdateOp::Add)
            .into_data(),
        a.clone().select(0, rows.clone()).into_data(),
        a.clone()
            .select_assign(
                0,
                rows,
                b.clone().slice([0..4, 0..6]),
                burn_tensor::IndexingUpdateOp::Add,
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

fn view_chains<B: Backend>(d: &B::Device) -> Out {
    let a = float::<B, 3>([4, 6, 8], 12, d);
    let s = a.clone().swap_dims(0, 2); // [8, 6, 4]
    let p = s.clone().permute([2, 0, 1]); // [4, 8, 6]
    let n = p.clone().narrow(1, 2, 4); // [4, 4, 6]
    let r = n.clone().reshape([16, 6]);
    let e = float::<B, 2>([1, 6], 13, d).expand([16, 6]);
    vec![
        (r.clone() * e.clone()).exp().into_data(),
        s.clone().sum_dim(2).into_data(),
        (p + 1.0).into_data(),
        n.swap_dims(1, 2)
            .reshape([4, 24])
            .matmul(float::<B, 2>([24, 3], 14, d))
            .into_data(),
        e.into_data(),
        r.into_data(),
    ]
}

fn module_ops<B: Backend>(d: &B::Device) -> Out {
    let x = float::<B, 4>([2, 3, 10, 10], 15, d);
    let w = float::<B, 4>([4, 3, 3, 3], 16, d);
    let bias = float::<B, 1>([4], 17, d);
    let conv = module::conv2d(
        x.clone(),
        w,
        Some(bias.clone()),
        ConvOptions::new([2, 1], [1, 1], [1, 2], 1),
    );
    let wt = float::<B, 4>([4, 2, 3, 3], 18, d);
    let convt = module::conv_transpose2d(
        conv.clone(),
        wt,
        None,
        ConvTransposeOptions::new([2, 2], [1, 1], [1, 0], [1, 1], 1),
    );
    let x1 = float::<B, 3>([2, 4, 20], 19, d);
    let w1 = float::<B, 3>([6, 2, 5], 20, d);
    let conv1 = module::conv1d(x1, w1, None, ConvOptions::new([1], [2], [1], 2));
    let (mp, mi) =
        module::max_pool2d_with_indices(x.clone(), [3, 3], [2, 2], [1, 1], [1, 1], false);
    let table = float::<B, 2>([12, 5], 21, d);
    let tokens = ints::<B, 2>([2, 7], 12, d);
    vec![
        conv.clone().into_data(),
        convt.into_data(),
        conv1.into_data(),
        module::max_pool2d(x.clone(), [2, 2], [2, 2], [0, 0], [1, 1], true).into_data(),
        module::avg_pool2d(x.clone(), [3, 3], [1, 1], [1, 1], false, false).into_data(),
        module::adaptive_avg_pool2d(conv, [3, 2]).into_data(),
        mp.into_data(),
        mi.into_data(),
        module::interpolate(
            x.clone(),
            [13, 7],
            InterpolateOptions::new(InterpolateMode::Bilinear),
        )
        .into_data(),
        module::interpolate(
            x,
            [5, 15],
            InterpolateOptions::new(InterpolateMode::Nearest),
        )
        .into_data(),
        module::embedding(table, tokens).into_data(),
    ]
}

fn attention_and_ctc<B: Backend>(d: &B::Device) -> Out {
    let q = float::<B, 4>([2, 3, 5, 8], 22, d);
    let k = float::<B, 4>([2, 3, 6, 8], 23, d);
    let v = float::<B, 4>([2, 3, 6, 8], 24, d);
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
    let log_probs = activation::log_softmax(float::<B, 3>([12, 2, 5], 25, d) * 3.0, 2);
    let targets = ints::<B, 2>([2, 4], 4, d) + 1;
    let input_lengths = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![12i64, 10], [2]), d);
    let target_lengths = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![4i64, 3], [2]), d);
    vec![
        module::attention(q.clone(), k.clone(), v.clone(), None, None, causal).into_data(),
        module::attention(q, k, v, None, None, plain).into_data(),
        module::ctc_loss(log_probs, targets, input_lengths, target_lengths, 0).into_data(),
    ]
}

fn transaction<B: Backend>(d: &B::Device) -> Out {
    let a = float::<B, 2>([6, 6], 26, d);
    let b = a.clone().exp();
    let c = ints::<B, 1>([9], 4, d);
    Transaction::default()
        .register(a.matmul(b.clone()))
        .register(b)
        .register(c)
        .execute()
}

fn seeded_random<B: Backend>(d: &B::Device) -> Out {
    B::seed(d, 42);
    let u = Tensor::<B, 2>::random([16, 16], Distribution::Default, d);
    let n = Tensor::<B, 2>::random([16, 16], Distribution::Normal(0.0, 2.0), d);
    let bern = Tensor::<B, 2>::random([16, 16], Distribution::Bernoulli(0.3), d);
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

fn gradients<B: burn_tensor::backend::AutodiffBackend>(d: &B::Device) -> Out {
    let x = float::<B, 4>([2, 2, 8, 8], 27, d);
    let w = float::<B, 4>([3, 2, 3, 3], 28, d).require_grad();
    let lin = float::<B, 2>([48, 5], 29, d).require_grad();
    let h = module::conv2d(
        x,
        w.clone(),
        None,
        ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
    );
    let h = module::max_pool2d(activation::relu(h), [2, 2], [2, 2], [0, 0], [1, 1], false);
    let logits = h.reshape([2, 48]).matmul(lin.clone());
    let loss = activation::log_softmax(logits, 1).mean().neg();
    let grads = loss.backward();
    vec![
        w.grad(&grads).expect("grad of w").into_data(),
        lin.grad(&grads).expect("grad of lin").into_data(),
    ]
}

fn assert_same(case: &str, config: &str, want: &Out, got: &Out) {
    assert_eq!(want.len(), got.len(), "{case} [{config}]");
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.shape, g.shape, "{case} [{config}] output {k}: shape");
        assert_eq!(w.dtype, g.dtype, "{case} [{config}] output {k}: dtype");
        assert!(
            w.as_bytes() == g.as_bytes(),
            "{case} [{config}] output {k}: bytes differ from NdArray"
        );
    }
}

fn configs() -> Vec<(&'static str, DtrConfig)> {
    vec![
        (
            "threshold:0",
            DtrConfig::default()
                .with_budget_mode(BudgetMode::Logical)
                .with_threshold(Some(0)),
        ),
        (
            "physical 16 KiB",
            DtrConfig::default().with_budget(16 << 10),
        ),
    ]
}

macro_rules! run_cases {
    ($evictions:ident; $($case:ident),* $(,)?) => {{
        let plain = NdArrayDevice::Cpu;
        $(
            let want = $case::<NdArray>(&plain);
            for (name, config) in configs() {
                let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
                let got = $case::<Ours>(&device);
                assert_same(stringify!($case), name, &want, &got);
                assert!(device.take_error().is_none(), "{} [{name}]", stringify!($case));
                device.check_invariants().unwrap();
                *$evictions.entry(name).or_insert(0) += device.stats().runtime.evictions;
                if name == "threshold:0" {
                    assert!(
                        device.stats().runtime.evictions > 0,
                        "{} [{name}]: evicts", stringify!($case)
                    );
                }
            }
        )*
    }};
}

/// One test, cases in sequence: the NdArray random generator is process-wide,
/// so seeded cases must not interleave with other tests' random ops.
#[test]
fn every_op_family_is_bit_identical_under_eviction() {
    let mut evictions = std::collections::HashMap::new();
    run_cases!(
        evictions;
        float_elementwise,
        float_reductions,
        int_and_bool,
        matmul_and_linalg,
        indexing,
        view_chains,
        module_ops,
        attention_and_ctc,
        transaction,
        seeded_random,
    );
    for (name, _) in configs() {
        assert!(evictions[name] > 0, "{name}: {evictions:?}");
    }
    // A gradient through Autodiff over each backend.
    let want = gradients::<Autodiff<NdArray>>(&NdArrayDevice::Cpu);
    for (name, config) in configs() {
        let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
        let got = gradients::<Autodiff<Ours>>(&device);
        assert_same("gradients", name, &want, &got);
        assert!(device.take_error().is_none());
    }
}

/// `det` runs LU, whose every step reads the running matrix twice with other
/// ops between: under `threshold:0` that used to replay the whole evicted chain
/// behind it (n²/2 replays; 23 s at 80×80 in a debug build).
#[test]
fn det_under_threshold_zero_replays_linearly() {
    for n in [16usize, 64] {
        let config = DtrConfig::default()
            .with_budget_mode(BudgetMode::Logical)
            .with_threshold(Some(0));
        let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
        let want = linalg::det::<NdArray, 3, 2, 1>(float::<NdArray, 3>(
            [1, n, n],
            30,
            &NdArrayDevice::Cpu,
        ))
        .into_data();
        let got =
            linalg::det::<Ours, 3, 2, 1>(float::<Ours, 3>([1, n, n], 30, &device)).into_data();
        assert_eq!(want.as_bytes(), got.as_bytes(), "det {n}×{n}");
        let s = device.stats();
        assert!(
            s.runtime.rematerializations <= 2 * s.ops,
            "det {n}×{n}: {} replays for {} ops",
            s.runtime.rematerializations,
            s.ops
        );
    }
}

/// One device for every case in a row, as a test suite runs in one process,
/// under a budget most cases cannot meet: each case must end as it ends alone
/// on a fresh device. A failure must not poison the device for the next case.
#[test]
fn failures_do_not_spread_between_cases_on_one_device() {
    type Case = fn(&DtrDevice<NdArray>) -> Out;
    let cases: [(&str, Case); 10] = [
        ("float_elementwise", float_elementwise::<Ours>),
        ("float_reductions", float_reductions::<Ours>),
        ("int_and_bool", int_and_bool::<Ours>),
        ("matmul_and_linalg", matmul_and_linalg::<Ours>),
        ("indexing", indexing::<Ours>),
        ("view_chains", view_chains::<Ours>),
        ("module_ops", module_ops::<Ours>),
        ("attention_and_ctc", attention_and_ctc::<Ours>),
        ("transaction", transaction::<Ours>),
        ("seeded_random", seeded_random::<Ours>),
    ];
    let config = || DtrConfig::default().with_budget(4 << 10);
    let run = |case: Case, device: &DtrDevice<NdArray>| {
        // A failed read panics in `into_data`; the panic's text is remat's.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(device))).is_ok();
        std::panic::set_hook(hook);
        let error = device.take_error();
        ok && error.is_none()
    };
    let alone: Vec<bool> = cases
        .iter()
        .map(|&(_, case)| {
            let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config()).expect("device");
            run(case, &device)
        })
        .collect();
    eprintln!("alone: {alone:?}");
    assert!(alone.contains(&true) && alone.contains(&false), "{alone:?}");
    let shared = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config()).expect("device");
    for (k, &(name, case)) in cases.iter().enumerate() {
        assert_eq!(
            run(case, &shared),
            alone[k],
            "{name} after the cases before it"
        );
        shared.check_invariants().unwrap();
    }
    // Cases that fit run again after every failure.
    for (k, &(name, case)) in cases.iter().enumerate() {
        if alone[k] {
            assert!(run(case, &shared), "{name} once more");
        }
    }
}
