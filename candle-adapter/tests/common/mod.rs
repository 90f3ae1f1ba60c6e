//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};

/// Deterministic values in [lo, hi) (SplitMix64).
pub fn values(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            lo + (hi - lo) * ((z >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// A deterministic f32 tensor.
pub fn rand(seed: u64, shape: &[usize], lo: f32, hi: f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(values(seed, n, lo, hi), shape, &Device::Cpu).unwrap()
}

/// The bits of a float tensor's values (f32 or f64), row-major.
pub fn bits(t: &Tensor) -> Vec<u64> {
    let flat = t.flatten_all().unwrap();
    match t.dtype() {
        DType::F64 => flat
            .to_vec1::<f64>()
            .unwrap()
            .into_iter()
            .map(f64::to_bits)
            .collect(),
        _ => flat
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
    }
}

/// A context under a logical budget of `budget` bytes (`None`: unbounded).
pub fn logical_remat(budget: Option<u64>) -> remat_candle::Remat {
    let dtr =
        remat_candle::DtrConfig::default().with_budget_mode(remat_candle::BudgetMode::Logical);
    let cfg = remat_candle::RematConfig::new()
        .with_dtr(dtr)
        .with_cost_model(remat_candle::CostModel::OutputBytes);
    let cfg = match budget {
        Some(b) => cfg.with_budget_bytes(b),
        None => cfg,
    };
    remat_candle::Remat::new(cfg).unwrap()
}

/// Set a `VarMap`'s variables to seeded values, in name order (candle-nn's
/// init draws from a thread RNG); the variables by name.
pub fn seed_vars(varmap: &candle_nn::VarMap) -> Vec<(String, Var)> {
    let mut vars: Vec<(String, Var)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, (_, v)) in vars.iter().enumerate() {
        v.set(&rand(k as u64 + 1, v.dims(), -0.3, 0.3)).unwrap();
    }
    vars
}

/// Synthetic MNIST with the real set's fields and dtypes: `train` and `test`
/// f32 images of `image` values in [0, 1) (seeds `seed` and `seed + 1`) and
/// u8 labels, as `[train images, train labels, test images, test labels]`.
pub fn synthetic_mnist(train: usize, test: usize, image: usize, seed: u64) -> [Tensor; 4] {
    let labels = |n: usize, s: usize| {
        let y: Vec<u8> = (0..n).map(|i| ((i * 7 + s) % 10) as u8).collect();
        Tensor::new(y, &Device::Cpu).unwrap()
    };
    [
        rand(seed, &[train, image], 0.0, 1.0),
        labels(train, 1),
        rand(seed + 1, &[test, image], 0.0, 1.0),
        labels(test, 2),
    ]
}

/// Bytes of the tensors' values.
pub fn bytes_of(ts: &[&Tensor]) -> u64 {
    ts.iter()
        .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
        .sum()
}

/// A file in the temp dir for this test process: `remat-<test>-<pid>-<name>`.
pub fn tmp_path(test: &str, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("remat-{test}-{}-{name}", std::process::id()))
}
