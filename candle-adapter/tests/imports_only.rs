//! candle's `mnist-training` example (candle-examples, 0.11 API) ports to
//! remat-candle by changing imports only, models **and** training loops: the
//! code below is stamped twice by one macro, once under candle's imports and
//! once under remat-candle's, with not a character changed. The three models (a
//! zero-initialized linear model, an MLP, a ConvNet applied with `.apply(..)`,
//! at reduced sizes: 16×16 images) and upstream's two loops (`training_loop`:
//! the whole training set per step, SGD; `training_loop_cnn`: shuffled batches
//! of 64, AdamW, `loss.to_vec0()` after `backward_step`; both evaluate the test
//! set after each step) run as upstream has them.
//!
//! What is not upstream's, and why:
//! - `candle_datasets` is a stand-in (`data`): synthetic MNIST-shaped data (the
//!   test cannot download MNIST). For the port its fields are `RTensor`s, brought
//!   into the context by the caller — where upstream's `main` loads the data set.
//! - `rand::prelude` is a stand-in (`seeded`): `thread_rng()` is seeded, so
//!   both runs shuffle the batches alike.
//! - The caller creates the context (`Remat::new`, which makes it the thread's
//!   current one) before calling the loop; the loop's
//!   `VarBuilder::from_varmap(&varmap, DType::F32, &dev)` takes it from there.
//! - Start weights come through upstream's `--load` path (`args.load`, a seeded
//!   safetensors file; candle-nn's initializers draw from an unseeded RNG) and
//!   results through `--save` (`args.save`): the saved parameters of the plain
//!   and the ported run are compared bit for bit.
//!
//! Each model trains unconstrained, then at 50 % of its activation peak in the
//! default (physical) mode. The activation peak is the unconstrained peak less
//! parameters and data set, measured with layers as candle-nn composes them
//! (`RematConfig::with_split_layer_ops`): the tensors plain candle's graph
//! holds, a convolution's output beside its bias sum included. remat-candle's
//! default runs such a layer as one op, which is what makes the ConvNet's 50 %
//! feasible: split, the first convolution's output (pinned) and its bias sum
//! are 69 % of the peak at once. Every run's saved parameters are
//! bit-identical to plain candle's, and the constrained run evicts and
//! rematerializes.

extern crate candle_core as candle;

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use common::{bits, bytes_of, rand, synthetic_mnist, tmp_path};
use remat_candle::{RTensor, Remat, RematConfig};

/// candle-examples' `mnist-training/main.rs` (0.11): the models (at 16×16
/// images) and the two training loops, as written for candle. It names
/// `Tensor`, `Result`, `VarBuilder`, `candle_nn::…`, `candle_datasets::…`,
/// `thread_rng`, all from the imports of the module that expands it.
macro_rules! mnist_training {
    () => {
        pub const IMAGE_DIM: usize = 256;
        pub const LABELS: usize = 10;

        fn linear_z(in_dim: usize, out_dim: usize, vs: VarBuilder) -> Result<Linear> {
            let ws = vs.get_with_hints((out_dim, in_dim), "weight", candle_nn::init::ZERO)?;
            let bs = vs.get_with_hints(out_dim, "bias", candle_nn::init::ZERO)?;
            Ok(Linear::new(ws, Some(bs)))
        }

        pub trait Model: Sized {
            fn new(vs: VarBuilder) -> Result<Self>;
            fn forward(&self, xs: &Tensor) -> Result<Tensor>;
        }

        pub struct LinearModel {
            linear: Linear,
        }

        impl Model for LinearModel {
            fn new(vs: VarBuilder) -> Result<Self> {
                let linear = linear_z(IMAGE_DIM, LABELS, vs)?;
                Ok(Self { linear })
            }

            fn forward(&self, xs: &Tensor) -> Result<Tensor> {
                self.linear.forward(xs)
            }
        }

        pub struct Mlp {
            ln1: Linear,
            ln2: Linear,
        }

        impl Model for Mlp {
            fn new(vs: VarBuilder) -> Result<Self> {
                let ln1 = candle_nn::linear(IMAGE_DIM, 100, vs.pp("ln1"))?;
                let ln2 = candle_nn::linear(100, LABELS, vs.pp("ln2"))?;
                Ok(Self { ln1, ln2 })
            }

            fn forward(&self, xs: &Tensor) -> Result<Tensor> {
                let xs = self.ln1.forward(xs)?;
                let xs = xs.relu()?;
                self.ln2.forward(&xs)
            }
        }

        pub struct ConvNet {
            conv1: Conv2d,
            conv2: Conv2d,
            fc1: Linear,
            fc2: Linear,
        }

        impl Model for ConvNet {
            fn new(vs: VarBuilder) -> Result<Self> {
                let conv1 = candle_nn::conv2d(1, 16, 3, Default::default(), vs.pp("c1"))?;
                let conv2 = candle_nn::conv2d(16, 32, 3, Default::default(), vs.pp("c2"))?;
                let fc1 = candle_nn::linear(128, 64, vs.pp("fc1"))?;
                let fc2 = candle_nn::linear(64, LABELS, vs.pp("fc2"))?;
                Ok(Self {
                    conv1,
                    conv2,
                    fc1,
                    fc2,
                })
            }

            fn forward(&self, xs: &Tensor) -> Result<Tensor> {
                let (b_sz, _img_dim) = xs.dims2()?;
                xs.reshape((b_sz, 1, 16, 16))?
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

        pub struct TrainingArgs {
            pub learning_rate: f64,
            pub load: Option<String>,
            pub save: Option<String>,
            pub epochs: usize,
        }

        pub fn training_loop_cnn(
            m: candle_datasets::vision::Dataset,
            args: &TrainingArgs,
        ) -> anyhow::Result<()> {
            const BSIZE: usize = 64;

            let dev = candle::Device::cuda_if_available(0)?;

            let train_labels = m.train_labels;
            let train_images = m.train_images.to_device(&dev)?;
            let train_labels = train_labels.to_dtype(DType::U32)?.to_device(&dev)?;

            let mut varmap = VarMap::new();
            let vs = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
            let model = ConvNet::new(vs.clone())?;

            if let Some(load) = &args.load {
                println!("loading weights from {load}");
                varmap.load(load)?
            }

            let adamw_params = candle_nn::ParamsAdamW {
                lr: args.learning_rate,
                ..Default::default()
            };
            let mut opt = candle_nn::AdamW::new(varmap.all_vars(), adamw_params)?;
            let test_images = m.test_images.to_device(&dev)?;
            let test_labels = m.test_labels.to_dtype(DType::U32)?.to_device(&dev)?;
            let n_batches = train_images.dim(0)? / BSIZE;
            let mut batch_idxs = (0..n_batches).collect::<Vec<usize>>();
            for epoch in 1..args.epochs {
                let mut sum_loss = 0f32;
                batch_idxs.shuffle(&mut thread_rng());
                for batch_idx in batch_idxs.iter() {
                    let train_images = train_images.narrow(0, batch_idx * BSIZE, BSIZE)?;
                    let train_labels = train_labels.narrow(0, batch_idx * BSIZE, BSIZE)?;
                    let logits = model.forward(&train_images)?;
                    let log_sm = ops::log_softmax(&logits, D::Minus1)?;
                    let loss = loss::nll(&log_sm, &train_labels)?;
                    opt.backward_step(&loss)?;
                    sum_loss += loss.to_vec0::<f32>()?;
                }
                let avg_loss = sum_loss / n_batches as f32;

                let test_logits = model.forward(&test_images)?;
                let sum_ok = test_logits
                    .argmax(D::Minus1)?
                    .eq(&test_labels)?
                    .to_dtype(DType::F32)?
                    .sum_all()?
                    .to_scalar::<f32>()?;
                let test_accuracy = sum_ok / test_labels.dims1()? as f32;
                println!(
                    "{epoch:4} train loss {:8.5} test acc: {:5.2}%",
                    avg_loss,
                    100. * test_accuracy
                );
            }
            if let Some(save) = &args.save {
                println!("saving trained weights in {save}");
                varmap.save(save)?
            }
            Ok(())
        }

        pub fn training_loop<M: Model>(
            m: candle_datasets::vision::Dataset,
            args: &TrainingArgs,
        ) -> anyhow::Result<()> {
            let dev = candle::Device::cuda_if_available(0)?;

            let train_labels = m.train_labels;
            let train_images = m.train_images.to_device(&dev)?;
            let train_labels = train_labels.to_dtype(DType::U32)?.to_device(&dev)?;

            let mut varmap = VarMap::new();
            let vs = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
            let model = M::new(vs.clone())?;

            if let Some(load) = &args.load {
                println!("loading weights from {load}");
                varmap.load(load)?
            }

            let mut sgd = candle_nn::SGD::new(varmap.all_vars(), args.learning_rate)?;
            let test_images = m.test_images.to_device(&dev)?;
            let test_labels = m.test_labels.to_dtype(DType::U32)?.to_device(&dev)?;
            for epoch in 1..args.epochs {
                let logits = model.forward(&train_images)?;
                let log_sm = ops::log_softmax(&logits, D::Minus1)?;
                let loss = loss::nll(&log_sm, &train_labels)?;
                sgd.backward_step(&loss)?;

                let test_logits = model.forward(&test_images)?;
                let sum_ok = test_logits
                    .argmax(D::Minus1)?
                    .eq(&test_labels)?
                    .to_dtype(DType::F32)?
                    .sum_all()?
                    .to_scalar::<f32>()?;
                let test_accuracy = sum_ok / test_labels.dims1()? as f32;
                println!(
                    "{epoch:4} train loss: {:8.5} test acc: {:5.2}%",
                    loss.to_scalar::<f32>()?,
                    100. * test_accuracy
                );
            }
            if let Some(save) = &args.save {
                println!("saving trained weights in {save}");
                varmap.save(save)?
            }
            Ok(())
        }
    };
}

mod plain {
    use crate::seeded::prelude::*; // upstream: use rand::prelude::*;

    use crate::data::plain as candle_datasets; // upstream: the candle-datasets crate
    use candle::{DType, Result, Tensor, D};
    use candle_nn::{loss, ops, Conv2d, Linear, Module, Optimizer, VarBuilder, VarMap};
    mnist_training!();
}

mod ported {
    use crate::seeded::prelude::*; // upstream: use rand::prelude::*;

    use crate::data::ported as candle_datasets; // upstream: the candle-datasets crate
    use remat_candle::as_candle::{DType, Result, Tensor, D};
    use remat_candle::nn::{
        self as candle_nn, loss, ops, Conv2d, Linear, Module, Optimizer, VarBuilder, VarMap,
    };
    mnist_training!();
}

/// Stand-in for `rand::prelude`: a seeded `thread_rng()` (SplitMix64) and
/// Fisher–Yates `shuffle`, so that both runs see the same batch order.
mod seeded {
    pub mod prelude {
        pub struct ThreadRng(u64);

        pub fn thread_rng() -> ThreadRng {
            ThreadRng(0x5eed)
        }

        impl ThreadRng {
            fn next(&mut self) -> u64 {
                self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = self.0;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            }
        }

        pub trait SliceRandom {
            fn shuffle(&mut self, rng: &mut ThreadRng);
        }

        impl<T> SliceRandom for [T] {
            fn shuffle(&mut self, rng: &mut ThreadRng) {
                for i in (1..self.len()).rev() {
                    let j = (rng.next() % (i as u64 + 1)) as usize;
                    self.swap(i, j);
                }
            }
        }
    }
}

/// Stand-in for `candle_datasets::vision`: MNIST's fields and dtypes (f32 images
/// in [0, 1], u8 labels), synthetic values.
mod data {
    pub struct Dataset<T> {
        pub train_images: T,
        pub train_labels: T,
        pub test_images: T,
        pub test_labels: T,
        pub labels: usize,
    }

    pub mod plain {
        pub mod vision {
            pub type Dataset = crate::data::Dataset<candle_core::Tensor>;
        }
    }

    pub mod ported {
        pub mod vision {
            pub type Dataset = crate::data::Dataset<remat_candle::RTensor>;
        }
    }
}

const TRAIN: usize = 128;
const TEST: usize = 32;
const EPOCHS: usize = 4; // upstream's `1..epochs`: 3 training passes

fn dataset() -> data::Dataset<Tensor> {
    let [train_images, train_labels, test_images, test_labels] =
        synthetic_mnist(TRAIN, TEST, plain::IMAGE_DIM, 500);
    data::Dataset {
        train_images,
        train_labels,
        test_images,
        test_labels,
        labels: 10,
    }
}

/// The caller's side of the port (where upstream's `main` loads the data set):
/// the data set brought into the current context.
fn into_context(remat: &Remat, d: &data::Dataset<Tensor>) -> data::Dataset<RTensor> {
    data::Dataset {
        train_images: remat.input(&d.train_images).unwrap(),
        train_labels: remat.input(&d.train_labels).unwrap(),
        test_images: remat.input(&d.test_images).unwrap(),
        test_labels: remat.input(&d.test_labels).unwrap(),
        labels: d.labels,
    }
}

fn data_bytes(d: &data::Dataset<Tensor>) -> u64 {
    bytes_of(&[
        &d.train_images,
        &d.train_labels,
        &d.test_images,
        &d.test_labels,
    ])
}

fn tmp(name: &str) -> PathBuf {
    tmp_path("imports-only", name)
}

/// Seeded start weights for `M`, saved where upstream's `--load` reads them;
/// the linear model's zero-initialized weights stay zero.
fn start_weights<M: plain::Model>(name: &str) -> (String, u64) {
    let varmap = candle_nn::VarMap::new();
    M::new(candle_nn::VarBuilder::from_varmap(
        &varmap,
        DType::F32,
        &Device::Cpu,
    ))
    .unwrap();
    let mut bytes = 0;
    for (k, v) in varmap.data().lock().unwrap().iter() {
        bytes += (v.elem_count() * 4) as u64;
        if k.contains('.') {
            let s = k.bytes().map(u64::from).sum::<u64>();
            v.set(&rand(s, v.dims(), -0.2, 0.2)).unwrap();
        }
    }
    let path = tmp(&format!("{name}-start.safetensors"));
    varmap.save(&path).unwrap();
    (path.to_string_lossy().into_owned(), bytes)
}

fn saved(path: &str) -> HashMap<String, Vec<u64>> {
    let t = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    let out = t.iter().map(|(k, v)| (k.clone(), bits(v))).collect();
    std::fs::remove_file(path).unwrap();
    out
}

fn args(lr: f64, load: &str, save: &std::path::Path) -> (String, f64, String) {
    (load.to_string(), lr, save.to_string_lossy().into_owned())
}

type PlainLoop = fn(data::Dataset<Tensor>, &plain::TrainingArgs) -> anyhow::Result<()>;
type PortedLoop = fn(data::Dataset<RTensor>, &ported::TrainingArgs) -> anyhow::Result<()>;

struct Ported {
    params: HashMap<String, Vec<u64>>,
    peak: u64,
    evictions: u64,
    remats: u64,
}

/// Upstream's loop through remat-candle under `budget` (`None`: unbounded);
/// `split`: layers as candle-nn composes them ([`RematConfig::split_layer_ops`]).
fn run_ported(
    f: PortedLoop,
    name: &str,
    load: &str,
    lr: f64,
    budget: Option<u64>,
    split: bool,
) -> Result<Ported, candle_core::Error> {
    let cfg = RematConfig::new().with_split_layer_ops(split);
    let remat = Remat::new(match budget {
        Some(b) => cfg.with_budget_bytes(b),
        None => cfg,
    })?;
    let save = tmp(&format!("{name}-{budget:?}-{split}.safetensors"));
    let (load, lr, save_s) = args(lr, load, &save);
    let a = ported::TrainingArgs {
        learning_rate: lr,
        load: Some(load),
        save: Some(save_s.clone()),
        epochs: EPOCHS,
    };
    let res = f(into_context(&remat, &dataset()), &a);
    if let Err(e) = res {
        let _ = std::fs::remove_file(&save);
        return Err(match e.downcast::<candle_core::Error>() {
            Ok(e) => e,
            Err(e) => candle_core::Error::Msg(e.to_string()),
        });
    }
    let s = remat.stats()?;
    let peak = remat.memory_usage()?.peak_allocated;
    if let Some(b) = budget {
        assert!(peak <= b, "{name}: peak {peak} B above the budget {b} B");
    }
    Ok(Ported {
        params: saved(&save_s),
        peak,
        evictions: s.evictions,
        remats: s.rematerializations,
    })
}

fn check<P: plain::Model, R: ported::Model>(
    name: &str,
    plain_loop: PlainLoop,
    ported_loop: PortedLoop,
    lr: f64,
) {
    let (load, param_bytes) = start_weights::<P>(name);
    let save = tmp(&format!("{name}-plain.safetensors"));
    let (l, lr, s) = args(lr, &load, &save);
    plain_loop(
        dataset(),
        &plain::TrainingArgs {
            learning_rate: lr,
            load: Some(l),
            save: Some(s.clone()),
            epochs: EPOCHS,
        },
    )
    .unwrap();
    let plain = saved(&s);
    let free = run_ported(ported_loop, name, &load, lr, None, false).unwrap();
    assert!(
        free.params == plain,
        "{name}: parameters differ from plain candle"
    );
    // Activation peak: the unconstrained peak less parameters and data set,
    // with layers split as candle-nn composes them, so the tensors live are
    // those plain candle's graph holds (a convolution's output beside its
    // bias sum). remat-candle's default fuses such a layer into one op.
    let split = run_ported(ported_loop, name, &load, lr, None, true).unwrap();
    assert!(
        split.params == plain,
        "{name}: parameters differ from plain candle (split layers)"
    );
    let ext = param_bytes + data_bytes(&dataset());
    let act = split.peak - ext;
    eprintln!(
        "{name}: activation peak {act} B as candle-nn composes the layers, {} B with \
         remat-candle's fused layers",
        free.peak - ext
    );
    let budget = |pct: u64| ext + act * pct / 100;
    let pct = 50;
    let trained = run_ported(ported_loop, name, &load, lr, Some(budget(pct)), false)
        .unwrap_or_else(|e| panic!("{name} at {pct} % ({} B): {e}", budget(pct)));
    eprintln!(
        "{name}: trains at {pct} % ({} B; external {ext} B, activation peak {act} B): \
         {} evictions, {} rematerializations, peak {} B",
        budget(pct),
        trained.evictions,
        trained.remats,
        trained.peak
    );
    std::fs::remove_file(&load).unwrap();
    assert!(
        trained.params == plain,
        "{name}: parameters differ under a budget"
    );
    assert!(
        trained.evictions > 0 && trained.remats > 0,
        "{name}: nothing evicted"
    );
}

#[test]
fn linear_model_ports_with_imports_only() {
    check::<plain::LinearModel, ported::LinearModel>(
        "linear",
        plain::training_loop::<plain::LinearModel>,
        ported::training_loop::<ported::LinearModel>,
        1.0,
    );
}

#[test]
fn mlp_ports_with_imports_only() {
    check::<plain::Mlp, ported::Mlp>(
        "mlp",
        plain::training_loop::<plain::Mlp>,
        ported::training_loop::<ported::Mlp>,
        0.05,
    );
}

#[test]
fn convnet_ports_with_imports_only() {
    check::<plain::ConvNet, ported::ConvNet>(
        "convnet",
        plain::training_loop_cnn,
        ported::training_loop_cnn,
        0.001,
    );
}
