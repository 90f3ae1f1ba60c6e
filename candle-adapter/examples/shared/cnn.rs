//! The demo model shared by the `train_under_budget` example and the
//! `train_step` bench: a small CNN on a deterministic synthetic image set, written
//! once over remat-candle and once over plain candle-nn (same ops, same order).

#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};
use candle_nn::{Module as _, VarBuilder, VarMap};
use remat_candle::nn::{self, Module};
use remat_candle::{RTensor, Remat};

pub const CLASSES: usize = 10;
pub const SIDE: usize = 32;
pub const BATCH: usize = 32;
pub const DATASET: usize = 320;

/// SplitMix64 in [0, 1).
pub fn uniform(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

/// Images of oriented stripes: the class sets frequency and orientation, plus a
/// random phase and noise. Deterministic.
pub fn dataset() -> (Vec<f32>, Vec<u32>) {
    let mut s = 42u64;
    let mut xs = Vec::with_capacity(DATASET * SIDE * SIDE);
    let mut ys = Vec::with_capacity(DATASET);
    for i in 0..DATASET {
        let c = (i * 7) % CLASSES;
        let freq = 1.0 + (c % 5) as f32;
        let angle: f32 = if c < 5 { 0.3 } else { 1.2 };
        let phase = uniform(&mut s) * std::f32::consts::TAU;
        for y in 0..SIDE {
            for x in 0..SIDE {
                let u = (x as f32 * angle.cos() + y as f32 * angle.sin()) / SIDE as f32;
                let v = (u * freq * std::f32::consts::TAU + phase).sin()
                    + 0.3 * (uniform(&mut s) - 0.5);
                xs.push(v);
            }
        }
        ys.push(c as u32);
    }
    (xs, ys)
}

pub struct Cnn {
    c1: nn::Conv2d,
    bn1: nn::BatchNorm,
    c2: nn::Conv2d,
    c3: nn::Conv2d,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Cnn {
    pub fn new(remat: &Remat, vb: VarBuilder) -> remat_candle::Result<Self> {
        let vb = nn::VarBuilder::new(remat, vb);
        let cfg = candle_nn::Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(Self {
            c1: nn::conv2d(1, 32, 3, cfg, vb.pp("c1"))?,
            bn1: nn::batch_norm(32, 1e-5, vb.pp("bn1"))?,
            c2: nn::conv2d(32, 32, 3, cfg, vb.pp("c2"))?,
            c3: nn::conv2d(32, 64, 3, cfg, vb.pp("c3"))?,
            fc1: nn::linear(64 * 8 * 8, 128, vb.pp("fc1"))?,
            fc2: nn::linear(128, CLASSES, vb.pp("fc2"))?,
        })
    }

    pub fn forward(&self, x: &RTensor) -> remat_candle::Result<RTensor> {
        let h = self.bn1.forward(&self.c1.forward(x)?)?.relu()?;
        let h = self.c2.forward(&h)?.relu()?.max_pool2d(2)?;
        let h = self.c3.forward(&h)?.relu()?.max_pool2d(2)?;
        let h = self
            .fc1
            .forward(&h.flatten_from(1)?)?
            .relu()?
            .dropout(0.1)?;
        self.fc2.forward(&h)
    }
}

/// Overwrite every variable of `varmap` with a seeded draw (candle-nn's init uses
/// a thread RNG): uniform in ±1/√fan_in, batch-norm weights 1. Returns the sorted
/// variable names.
pub fn seeded_init(varmap: &VarMap, dev: &Device) -> candle_core::Result<Vec<String>> {
    let mut names: Vec<String> = varmap.data().lock().unwrap().keys().cloned().collect();
    names.sort();
    for (k, name) in names.iter().enumerate() {
        let data = varmap.data().lock().unwrap();
        let var = &data[name];
        let n = var.elem_count();
        let fan_in = if var.rank() > 1 { n / var.dims()[0] } else { 1 };
        let bound = 1.0 / (fan_in as f32).sqrt();
        let mut s = 1000 + k as u64;
        let init: Vec<f32> = if name.starts_with("bn1") && name.ends_with("weight") {
            vec![1.0; n]
        } else if name.starts_with("bn1") {
            vec![0.0; n]
        } else {
            (0..n)
                .map(|_| (uniform(&mut s) * 2.0 - 1.0) * bound)
                .collect()
        };
        var.set(&Tensor::from_vec(init, var.shape(), dev)?)?;
    }
    Ok(names)
}

/// The same CNN over plain candle-nn (the baseline of the bench).
pub struct PlainCnn {
    c1: candle_nn::Conv2d,
    bn_w: Tensor,
    bn_b: Tensor,
    c2: candle_nn::Conv2d,
    c3: candle_nn::Conv2d,
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
}

impl PlainCnn {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        let cfg = candle_nn::Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        let bn = vb.pp("bn1");
        Ok(Self {
            c1: candle_nn::conv2d(1, 32, 3, cfg, vb.pp("c1"))?,
            bn_w: bn.get_with_hints(32, "weight", candle_nn::Init::Const(1.))?,
            bn_b: bn.get_with_hints(32, "bias", candle_nn::Init::Const(0.))?,
            c2: candle_nn::conv2d(32, 32, 3, cfg, vb.pp("c2"))?,
            c3: candle_nn::conv2d(32, 64, 3, cfg, vb.pp("c3"))?,
            fc1: candle_nn::linear(64 * 8 * 8, 128, vb.pp("fc1"))?,
            fc2: candle_nn::linear(128, CLASSES, vb.pp("fc2"))?,
        })
    }

    /// `seed`: the dropout seed the adapter would draw for this step.
    pub fn forward(&self, x: &Tensor, seed: u64) -> candle_core::Result<Tensor> {
        let h = self.c1.forward(x)?;
        // remat-candle's BatchNorm composition (training statistics).
        let x_t = h.transpose(0, 1)?;
        let dims_t = x_t.dims().to_vec();
        let x_t = x_t.flatten_from(1)?.contiguous()?;
        let mean_x = x_t.mean_keepdim(1)?;
        let x_t = x_t.broadcast_sub(&mean_x)?;
        let norm_x = x_t.sqr()?.mean_keepdim(1)?;
        let x_t = x_t.broadcast_div(&(norm_x + 1e-5)?.sqrt()?)?;
        let x_t = x_t
            .broadcast_mul(&self.bn_w.reshape((32, 1))?)?
            .broadcast_add(&self.bn_b.reshape((32, 1))?)?;
        let h = x_t.reshape(dims_t)?.transpose(0, 1)?.relu()?;
        let h = self.c2.forward(&h)?.relu()?.max_pool2d(2)?;
        let h = self.c3.forward(&h)?.relu()?.max_pool2d(2)?;
        let h = self.fc1.forward(&h.flatten_from(1)?)?.relu()?;
        let mask = remat_candle::dropout_mask(seed, h.shape(), 0.1, DType::F32, h.device())?;
        self.fc2.forward(&h.mul(&mask)?)
    }
}
