//! Issue 33's motivating case: candle's `mnist-training` ConvNet at upstream's
//! sizes (28×28 images; convolutions 1→32 and 32→64 with 5×5 kernels, `fc1`
//! 1024→1024), ported by its imports, at 30 % of its activation peak.
//!
//! Its parameters and data (6 053 928 B here: 448 training and 64 test
//! images) cannot be recomputed. The first convolution's output
//! (64 × 32 × 24 × 24 f32 = 4 718 592 B) pinned beside its pooled quarter does
//! not fit beside them in the 30 % budget, so without swap the step fails with
//! a typed `ImpossibleBudget`. With swap on, parameters and data leave the
//! device between their uses and the same loop trains, bit-identically to plain
//! candle: losses of every step and the final parameters. The test prints the
//! swap figures (`cargo test -p remat-candle --test swap_mnist -- --nocapture`).
//! It trains on the first 3 of the 7 batches; `REMAT_SWAP_MNIST_FULL=1` runs
//! the whole pass (the figures in `docs/candle.md`).
//!
//! As in `tests/imports_only.rs`, the model and the loop are stamped twice by
//! one macro, under candle's imports and under remat-candle's. Not upstream's:
//! synthetic data (seeded), seeded start weights loaded through `VarMap::load`
//! (upstream's `--load`), no dropout (as `imports_only.rs`), the loop runs
//! `EPOCHS` passes over the first batches and returns its losses, and the
//! caller reads the final parameters (with swap, holding
//! [`Remat::pin_params`]).

extern crate candle_core as candle;

mod common;

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use common::{bits, bytes_of, rand, synthetic_mnist, tmp_path};
use remat_candle::{CandleErrorExt, Remat, RematConfig};

/// Upstream's ConvNet (at upstream's sizes) and `training_loop_cnn`'s step
/// loop, as written for candle.
macro_rules! mnist_convnet {
    () => {
        pub const LABELS: usize = 10;
        const BSIZE: usize = 64;

        pub struct ConvNet {
            conv1: Conv2d,
            conv2: Conv2d,
            fc1: Linear,
            fc2: Linear,
        }

        impl ConvNet {
            pub fn new(vs: VarBuilder) -> Result<Self> {
                let conv1 = candle_nn::conv2d(1, 32, 5, Default::default(), vs.pp("c1"))?;
                let conv2 = candle_nn::conv2d(32, 64, 5, Default::default(), vs.pp("c2"))?;
                let fc1 = candle_nn::linear(1024, 1024, vs.pp("fc1"))?;
                let fc2 = candle_nn::linear(1024, LABELS, vs.pp("fc2"))?;
                Ok(Self {
                    conv1,
                    conv2,
                    fc1,
                    fc2,
                })
            }

            pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
                let (b_sz, _img_dim) = xs.dims2()?;
                xs.reshape((b_sz, 1, 28, 28))?
                    .apply(&self.conv1)?
                    .max_pool2d(2)?
                    .apply(&self.conv2)?
                    .max_pool2d(2)?
                    .flatten_from(1)?
                    .apply(&self.fc1)?
                    .relu()?
                    .apply(&self.fc2)
            }
        }

        /// `training_loop_cnn` without its data loading and saving: the
        /// model, the start weights from `load`, AdamW, `epochs` passes over
        /// the first `batches` training batches, each pass followed by the
        /// test set's accuracy. Returns each step's loss and each pass's
        /// count of correct test answers.
        pub fn training_loop_cnn(
            m: &Dataset,
            varmap: &mut VarMap,
            load: &str,
            learning_rate: f64,
            epochs: usize,
            batches: usize,
        ) -> anyhow::Result<Vec<f32>> {
            let dev = Device::Cpu;
            let train_images = m.train_images.clone();
            let train_labels = m.train_labels.to_dtype(DType::U32)?;
            let vs = VarBuilder::from_varmap(varmap, DType::F32, &dev);
            let model = ConvNet::new(vs.clone())?;
            varmap.load(load)?;
            let adamw_params = candle_nn::ParamsAdamW {
                lr: learning_rate,
                ..Default::default()
            };
            let mut opt = candle_nn::AdamW::new(varmap.all_vars(), adamw_params)?;
            let test_images = m.test_images.clone();
            let test_labels = m.test_labels.to_dtype(DType::U32)?;
            let n_batches = (train_images.dim(0)? / BSIZE).min(batches);
            let mut losses = Vec::new();
            for _epoch in 0..epochs {
                for batch_idx in 0..n_batches {
                    let train_images = train_images.narrow(0, batch_idx * BSIZE, BSIZE)?;
                    let train_labels = train_labels.narrow(0, batch_idx * BSIZE, BSIZE)?;
                    let logits = model.forward(&train_images)?;
                    let log_sm = ops::log_softmax(&logits, D::Minus1)?;
                    let loss = loss::nll(&log_sm, &train_labels)?;
                    opt.backward_step(&loss)?;
                    losses.push(loss.to_vec0::<f32>()?);
                }
                let test_logits = model.forward(&test_images)?;
                let sum_ok = test_logits
                    .argmax(D::Minus1)?
                    .eq(&test_labels)?
                    .to_dtype(DType::F32)?
                    .sum_all()?
                    .to_scalar::<f32>()?;
                losses.push(sum_ok);
            }
            Ok(losses)
        }
    };
}

mod plain {
    use crate::Dataset as Data;
    use candle::{DType, Device, Result, Tensor, D};
    use candle_nn::{loss, ops, Conv2d, Linear, Optimizer, VarBuilder, VarMap};
    type Dataset = Data<Tensor>;
    mnist_convnet!();
}

mod ported {
    use crate::Dataset as Data;
    use remat_candle::as_candle::{DType, Device, Result, Tensor, D};
    use remat_candle::nn::{
        self as candle_nn, loss, ops, Conv2d, Linear, Optimizer, VarBuilder, VarMap,
    };
    type Dataset = Data<Tensor>;
    mnist_convnet!();
}

/// MNIST's fields and dtypes: f32 images in [0, 1], u8 labels.
pub struct Dataset<T> {
    /// `TRAIN` × 784 images.
    pub train_images: T,
    /// Their labels.
    pub train_labels: T,
    /// `TEST` × 784 images.
    pub test_images: T,
    /// Their labels.
    pub test_labels: T,
}

const TRAIN: usize = 448;
const TEST: usize = 64;
const EPOCHS: usize = 1;
const IMAGE: usize = 28 * 28;
const LR: f64 = 0.001;

/// Training batches run: 3, or all 7 with `REMAT_SWAP_MNIST_FULL=1`.
fn batches() -> usize {
    match std::env::var("REMAT_SWAP_MNIST_FULL").as_deref() {
        Ok("1") => usize::MAX,
        _ => 3,
    }
}

fn dataset() -> Dataset<Tensor> {
    let [train_images, train_labels, test_images, test_labels] =
        synthetic_mnist(TRAIN, TEST, IMAGE, 600);
    Dataset {
        train_images,
        train_labels,
        test_images,
        test_labels,
    }
}

fn data_bytes(d: &Dataset<Tensor>) -> u64 {
    bytes_of(&[
        &d.train_images,
        &d.train_labels,
        &d.test_images,
        &d.test_labels,
    ])
}

fn tmp(name: &str) -> PathBuf {
    tmp_path("swap-mnist", name)
}

/// Seeded start weights, saved where the loop loads them; their bytes.
fn start_weights() -> (PathBuf, u64) {
    let varmap = candle_nn::VarMap::new();
    plain::ConvNet::new(candle_nn::VarBuilder::from_varmap(
        &varmap,
        DType::F32,
        &Device::Cpu,
    ))
    .unwrap();
    let mut bytes = 0;
    for (k, v) in varmap.data().lock().unwrap().iter() {
        bytes += (v.elem_count() * 4) as u64;
        let s = k.bytes().map(u64::from).sum::<u64>();
        v.set(&rand(s, v.dims(), -0.05, 0.05)).unwrap();
    }
    let path = tmp("start.safetensors");
    varmap.save(&path).unwrap();
    (path, bytes)
}

/// The bits of every variable, by name.
fn params(varmap: &candle_nn::VarMap) -> Vec<(String, Vec<u64>)> {
    let mut out: Vec<(String, Vec<u64>)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), bits(v.as_tensor())))
        .collect();
    out.sort();
    out
}

struct Trained {
    losses: Vec<u32>,
    params: Vec<(String, Vec<u64>)>,
    secs: f64,
}

fn plain_run(load: &str) -> Trained {
    let mut varmap = candle_nn::VarMap::new();
    let start = Instant::now();
    let losses =
        plain::training_loop_cnn(&dataset(), &mut varmap, load, LR, EPOCHS, batches()).unwrap();
    Trained {
        losses: losses.iter().map(|l| l.to_bits()).collect(),
        params: params(&varmap),
        secs: start.elapsed().as_secs_f64(),
    }
}

fn ported_run(remat: &Remat, load: &str, batches: usize) -> Result<Trained, candle_core::Error> {
    let d = dataset();
    let data = Dataset {
        train_images: remat.input(&d.train_images)?,
        train_labels: remat.input(&d.train_labels)?,
        test_images: remat.input(&d.test_images)?,
        test_labels: remat.input(&d.test_labels)?,
    };
    drop(d);
    let mut varmap = candle_nn::VarMap::new();
    let start = Instant::now();
    let losses =
        ported::training_loop_cnn(&data, &mut varmap, load, LR, EPOCHS, batches).map_err(|e| {
            match e.downcast::<candle_core::Error>() {
                Ok(e) => e,
                Err(e) => candle_core::Error::Msg(e.to_string()),
            }
        })?;
    let secs = start.elapsed().as_secs_f64();
    let pinned = remat.pin_params()?;
    let params = params(&varmap);
    drop(pinned);
    Ok(Trained {
        losses: losses.iter().map(|l| l.to_bits()).collect(),
        params,
        secs,
    })
}

#[test]
fn upstream_convnet_trains_at_30_percent_with_swap_and_not_without() {
    let (load, param_bytes) = start_weights();
    let load_s = load.to_string_lossy().into_owned();
    let reference = plain_run(&load_s);

    // The activation peak as candle-nn composes the layers (a convolution,
    // then its bias add), as `tests/imports_only.rs` measures it: one step
    // and the test set's forward reach it.
    let ext = param_bytes + data_bytes(&dataset());
    let split = Remat::new(RematConfig::new().with_split_layer_ops(true)).unwrap();
    let free = ported_run(&split, &load_s, 1).unwrap();
    assert_eq!(free.losses[0], reference.losses[0]);
    let act = split.memory_usage().unwrap().peak_allocated - ext;
    drop(split);
    let budget = ext + act * 30 / 100;
    eprintln!(
        "parameters {param_bytes} B + data {} B = {ext} B not recomputable; activation \
         peak {act} B; 30 % budget {budget} B",
        ext - param_bytes
    );

    let without = Remat::new(RematConfig::new().with_budget_bytes(budget)).unwrap();
    match ported_run(&without, &load_s, batches()) {
        Ok(_) => panic!("trained at 30 % without swap"),
        Err(e) => {
            let b = e
                .impossible_budget()
                .unwrap_or_else(|| panic!("expected an impossible budget, got {e}"));
            eprintln!("without swap: {b}");
        }
    }
    drop(without);

    let remat = Remat::new(RematConfig::new().with_budget_bytes(budget).with_swap(None)).unwrap();
    let gbps = remat.swap_bandwidth().unwrap();
    let trained =
        ported_run(&remat, &load_s, batches()).unwrap_or_else(|e| panic!("with swap: {e}"));
    std::fs::remove_file(&load).unwrap();
    assert!(
        trained.losses == reference.losses,
        "losses differ from plain candle"
    );
    assert!(
        trained.params == reference.params,
        "parameters differ from plain candle"
    );
    let s = remat.stats().unwrap();
    let peak = remat.memory_usage().unwrap().peak_allocated;
    eprintln!(
        "with swap ({gbps:.2} GB/s measured): trains, bit-identical; peak {peak} B; \
         {} swap-outs ({:.2} MB), {} swap-ins ({:.2} MB), peak host {:.2} MB; \
         modelled copy stall {:.2} ms = {:.1} % of compute {:.1} ms; \
         {} evictions, {} rematerializations ({:.1} ms); wall {:.2} s vs plain {:.2} s \
         ({} build)",
        s.swap_outs,
        s.swapped_out_bytes as f64 / 1e6,
        s.swap_ins,
        s.swapped_in_bytes as f64 / 1e6,
        s.peak_host_bytes as f64 / 1e6,
        s.stall_ns / 1e6,
        100.0 * s.stall_ns / s.compute_ns,
        s.compute_ns / 1e6,
        s.evictions,
        s.rematerializations,
        s.remat_ns / 1e6,
        trained.secs,
        reference.secs,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    );
    assert!(peak <= budget, "peak {peak} B above the budget {budget} B");
    assert!(s.swap_outs > 0 && s.swap_ins > 0);
    assert_eq!(s.swap_failures, 0);
}
