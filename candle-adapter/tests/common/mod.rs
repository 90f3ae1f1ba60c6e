//! Helpers shared by the integration tests.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};

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
