//! The last import gaps of a candle-transformers port (issue 34): shapes with a
//! hole in `from_vec` / `from_slice`, `with_tracing::{layer_norm, LayerNorm,
//! Embedding}`, `Tensor::try_from(scalar)`, and the text candle prints for a
//! remat error. Each is checked bit for bit against plain candle; then a model
//! file in candle-transformers' style that uses all three, stamped once under
//! candle's imports and once under remat-candle's with not a character changed,
//! trains bit-identically unconstrained and at 50 % of its activation peak.

// candle-transformers names candle-core `candle`.
extern crate candle_core as candle;

mod common;
#[path = "../examples/shared/setup.rs"]
mod setup;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use common::{bits, rand};
use remat_candle::nn::{self, Module};
use remat_candle::{BudgetMode, CandleErrorExt, DtrConfig, RTensor, Remat, RematConfig};

#[test]
fn from_vec_and_from_slice_take_a_shape_with_a_hole() {
    let remat = Remat::unbounded().unwrap();
    let dev = Device::Cpu;
    let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.37 - 1.0).collect();
    let plain = Tensor::from_vec(data.clone(), (3, ()), &dev).unwrap();
    let ours = RTensor::from_vec(data.clone(), (3, ()), &dev).unwrap();
    assert_eq!(ours.dims(), plain.dims());
    assert_eq!(bits(&ours.to_candle().unwrap()), bits(&plain));
    let plain = Tensor::from_slice(&data, ((), 2, 3), &dev).unwrap();
    let ours = RTensor::from_slice(&data, ((), 2, 3), &dev).unwrap();
    assert_eq!(ours.dims(), &[2, 2, 3]);
    assert_eq!(bits(&ours.to_candle().unwrap()), bits(&plain));
    // A length the other dimensions do not divide: candle's error, unchanged.
    let e = RTensor::from_vec(data, (5, ()), &dev).unwrap_err();
    let p = Tensor::from_vec(vec![0f32; 12], (5, ()), &dev).unwrap_err();
    let first = |e: &candle_core::Error| e.to_string().lines().next().map(str::to_owned);
    assert_eq!(first(&e), first(&p)); // (a backtrace may follow)
    assert!(e.remat_error().is_none());
    assert_eq!(remat.storage_count().unwrap(), 2);
}

#[test]
fn with_tracing_layer_norm_matches_candle() {
    use remat_candle::nn::with_tracing;
    let dev = Device::Cpu;
    let remat = Remat::unbounded().unwrap();
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap_in(&remat, &varmap, DType::F32, &dev);
    let ln = with_tracing::layer_norm(8, 1e-5, vb.pp("ln")).unwrap();
    // Non-trivial scale and shift, shared with the plain layer below.
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let seed = if name.ends_with("weight") { 7 } else { 8 };
        var.set(&rand(seed, &[8], -1.0, 1.0)).unwrap();
    }
    let by_new =
        with_tracing::LayerNorm::new(ln.weight().clone(), ln.bias().unwrap().clone(), 1e-5);
    let x = rand(3, &[2, 3, 8], -2.0, 2.0);
    let xv = candle_core::Var::from_tensor(&x).unwrap();
    let xr = remat.param(&xv).unwrap();
    let ours = ln.forward(&xr).unwrap();
    let ours2 = by_new.forward(&xr).unwrap();

    // candle-transformers' `with_tracing::LayerNorm` is candle-nn's, whose
    // fused forward has no backward: the reference is its composition.
    let data = varmap.data().lock().unwrap();
    let (w, b) = (data["ln.weight"].as_tensor(), data["ln.bias"].as_tensor());
    let plain = candle_nn::ops::layer_norm_slow(xv.as_tensor(), w, b, 1e-5).unwrap();
    assert_eq!(bits(&ours.to_candle().unwrap()), bits(&plain));
    assert_eq!(bits(&ours2.to_candle().unwrap()), bits(&plain));

    let g_ours = (ours.sqr().unwrap().sum_all().unwrap()).backward().unwrap();
    let g_plain = plain.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    for t in [xv.as_tensor(), w, b] {
        assert_eq!(
            bits(g_ours.get(t).unwrap()),
            bits(g_plain.get(t).unwrap()),
            "gradient of {:?}",
            t.shape()
        );
    }
}

#[test]
fn with_tracing_embedding_matches_candle() {
    use remat_candle::nn::with_tracing;
    let dev = Device::Cpu;
    let remat = Remat::unbounded().unwrap();
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap_in(&remat, &varmap, DType::F32, &dev);
    let emb = with_tracing::Embedding::new(10, 4, vb.pp("e")).unwrap();
    let tied = with_tracing::Embedding::from_weights(emb.embeddings().clone()).unwrap();
    let ids = Tensor::new(&[[1u32, 9, 3], [0, 0, 7]], &dev).unwrap();
    let table = varmap.data().lock().unwrap()["e.weight"]
        .as_tensor()
        .clone();
    let plain = candle_nn::Embedding::new(table, 4);
    let plain = candle_core::Module::forward(&plain, &ids).unwrap();
    let ids = remat.input(&ids).unwrap();
    assert_eq!(
        bits(&emb.forward(&ids).unwrap().to_candle().unwrap()),
        bits(&plain)
    );
    assert_eq!(
        bits(&tied.forward(&ids).unwrap().to_candle().unwrap()),
        bits(&plain)
    );
}

#[test]
fn tensor_try_from_scalars_slices_and_back_matches_candle() {
    use half::{bf16, f16};
    let remat = Remat::unbounded().unwrap();
    macro_rules! scalar {
        ($($v:expr),*) => {$({
            let plain = Tensor::try_from($v).unwrap();
            let ours = RTensor::try_from($v).unwrap();
            assert_eq!((ours.dims(), ours.dtype()), (plain.dims(), plain.dtype()));
            assert_eq!(ours.to_scalar::<f64>().ok(), plain.to_scalar::<f64>().ok());
            assert_eq!(
                bits(&ours.to_candle().unwrap().to_dtype(DType::F64).unwrap()),
                bits(&plain.to_dtype(DType::F64).unwrap())
            );
        })*};
    }
    scalar!(f32::MIN, -0.0f64, f16::from_f32(1.5), bf16::from_f32(-2.25));
    scalar!(7i64, -3i32, 5i16, 9u32, 200u8);
    // Back to a scalar, and a vector both ways.
    assert_eq!(
        f32::try_from(RTensor::try_from(f32::MIN).unwrap()).unwrap(),
        f32::MIN
    );
    assert_eq!(u8::try_from(&RTensor::try_from(3u8).unwrap()).unwrap(), 3);
    let v = RTensor::try_from(vec![1f32, 2., 3.]).unwrap();
    let s = RTensor::try_from(&[4u32, 5][..]).unwrap();
    assert_eq!(Vec::<f32>::try_from(&v).unwrap(), [1., 2., 3.]);
    assert_eq!(Vec::<u32>::try_from(s).unwrap(), [4, 5]);
    // bert's extended attention mask, both ways.
    let mask = Tensor::new(&[[1f32, 1., 0.], [1., 0., 0.]], &Device::Cpu).unwrap();
    let plain = (mask.ones_like().unwrap() - &mask)
        .unwrap()
        .broadcast_mul(&Tensor::try_from(f32::MIN).unwrap())
        .unwrap();
    let m = remat.input(&mask).unwrap();
    let ours = (m.ones_like().unwrap() - &m)
        .unwrap()
        .broadcast_mul(&RTensor::try_from(f32::MIN).unwrap())
        .unwrap();
    assert_eq!(bits(&ours.to_candle().unwrap()), bits(&plain));
    // Without a context on the thread: a typed error naming the fix.
    let e = std::thread::spawn(|| RTensor::try_from(1f32).unwrap_err())
        .join()
        .unwrap();
    assert!(e.to_string().contains("Remat::new"), "{e}");
}

#[test]
fn a_remat_error_prints_what_to_do_not_the_crate_name() {
    let remat = Remat::new(
        RematConfig::new()
            .with_budget_bytes(1000)
            .with_dtr(DtrConfig::default().with_budget_mode(BudgetMode::Logical)),
    )
    .unwrap();
    let x = remat.input(&rand(6, &[100], -1.0, 1.0)).unwrap();
    let e = x
        .reshape((100, 1))
        .unwrap()
        .matmul(&x.reshape((1, 100)).unwrap())
        .unwrap_err();
    assert!(e.is_impossible_budget(), "{e}");
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "{text}"); // (a backtrace may follow)
    assert!(lines[0].contains("impossible budget"), "{text}");
    assert_ne!(lines[1], "\"remat-candle\"", "{text}");
    assert!(lines[1].contains("min_feasible_budget"), "{text}");
    // Every kind of error gets a line of its own.
    let mismatch = remat_candle::Error::ContextMismatch { op: "add" };
    assert!(mismatch.hint().contains("one Remat context"));
    let wrapped: candle_core::Error = mismatch.into();
    assert!(
        wrapped.to_string().contains("one Remat context\""),
        "{wrapped}"
    );
}

/// A model file in candle-transformers' style, written for candle: a rotary
/// table built with `Tensor::from_vec(inv_freq, (1, ()), dev)` (phi3), a
/// `with_tracing::layer_norm` and a `with_tracing::LayerNorm::new` (bert,
/// …), bert's extended attention mask with `Tensor::try_from(f32::MIN)?`, a
/// `with_tracing::Embedding` and `candle_nn` layers. It names `Tensor`,
/// `Result`, `DType`, `Device`, `D`, `Module`, `VarBuilder`, `candle_nn`,
/// `with_tracing` from the imports of the module that expands it.
macro_rules! gaps_model {
    () => {
        pub struct RotaryEmbedding {
            sin: Tensor,
            cos: Tensor,
        }

        impl RotaryEmbedding {
            pub fn new(dim: usize, max_len: usize, dev: &Device) -> Result<Self> {
                let inv_freq: Vec<_> = (0..dim)
                    .step_by(2)
                    .map(|i| 1f32 / 10000f32.powf(i as f32 / dim as f32))
                    .collect();
                let inv_freq = Tensor::from_vec(inv_freq, (1, ()), dev)?;
                let t = Tensor::arange(0u32, max_len as u32, dev)?
                    .to_dtype(DType::F32)?
                    .reshape((max_len, 1))?;
                let freqs = t.matmul(&inv_freq)?;
                let freqs = Tensor::cat(&[&freqs, &freqs], D::Minus1)?;
                Ok(Self {
                    sin: freqs.sin()?,
                    cos: freqs.cos()?,
                })
            }

            pub fn apply(&self, xs: &Tensor) -> Result<Tensor> {
                let (_b, seq_len, _d) = xs.dims3()?;
                let cos = self.cos.narrow(0, 0, seq_len)?;
                let sin = self.sin.narrow(0, 0, seq_len)?;
                xs.broadcast_mul(&cos)? + xs.broadcast_mul(&sin)?
            }
        }

        fn get_extended_attention_mask(attention_mask: &Tensor, dtype: DType) -> Result<Tensor> {
            let attention_mask = match attention_mask.rank() {
                3 => attention_mask.unsqueeze(1)?,
                2 => attention_mask.unsqueeze(1)?.unsqueeze(1)?,
                _ => candle::bail!("Wrong shape for input_ids or attention_mask"),
            };
            let attention_mask = attention_mask.to_dtype(dtype)?;
            // torch.finfo(dtype).min
            (attention_mask.ones_like()? - &attention_mask)?.broadcast_mul(
                &Tensor::try_from(f32::MIN)?
                    .to_device(attention_mask.device())?
                    .to_dtype(dtype)?,
            )
        }

        pub struct Model {
            embeddings: with_tracing::Embedding,
            norm: with_tracing::LayerNorm,
            query: candle_nn::Linear,
            key: candle_nn::Linear,
            out_norm: with_tracing::LayerNorm,
            head: candle_nn::Linear,
            rotary: RotaryEmbedding,
            hidden: usize,
        }

        impl Model {
            pub fn new(
                vocab: usize,
                hidden: usize,
                max_len: usize,
                vb: VarBuilder,
            ) -> Result<Self> {
                let embeddings = with_tracing::Embedding::new(vocab, hidden, vb.pp("embeddings"))?;
                let norm = with_tracing::layer_norm(hidden, 1e-12, vb.pp("norm"))?;
                let query = candle_nn::linear(hidden, hidden, vb.pp("query"))?;
                let key = candle_nn::linear(hidden, hidden, vb.pp("key"))?;
                let w = vb.get(hidden, "out_norm.weight")?;
                let b = vb.get(hidden, "out_norm.bias")?;
                let out_norm = with_tracing::LayerNorm::new(w, b, 1e-12);
                let head = candle_nn::linear(hidden, vocab, vb.pp("head"))?;
                let rotary = RotaryEmbedding::new(hidden, max_len, vb.device())?;
                Ok(Self {
                    embeddings,
                    norm,
                    query,
                    key,
                    out_norm,
                    head,
                    rotary,
                    hidden,
                })
            }

            /// Logits `(b, vocab)` of the last position.
            pub fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
                let (_b, seq_len) = input_ids.dims2()?;
                let xs = self.embeddings.forward(input_ids)?;
                let xs = self.norm.forward(&xs)?;
                let q = self.rotary.apply(&self.query.forward(&xs)?)?;
                let k = self.rotary.apply(&self.key.forward(&xs)?)?;
                let scores = (q.matmul(&k.t()?)? / (self.hidden as f64).sqrt())?;
                let mask = get_extended_attention_mask(attention_mask, DType::F32)?.squeeze(1)?;
                let scores = scores.broadcast_add(&mask)?;
                let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
                let ys = (probs.matmul(&xs)? + &xs)?;
                let ys = self.out_norm.forward(&ys)?;
                let last = ys.narrow(1, seq_len - 1, 1)?.squeeze(1)?;
                self.head.forward(&last)
            }
        }
    };
}

/// The file under candle's imports, with candle-transformers' `with_tracing`
/// stood in by candle-nn's layers (forward through the composition: the fused
/// layer norm has no backward in plain candle).
mod plain {
    use candle::{DType, Device, Module, Result, Tensor, D};
    use candle_nn::VarBuilder;

    pub mod with_tracing {
        use candle::{Module, Result, Tensor};
        use candle_nn::VarBuilder;

        pub struct LayerNorm {
            inner: candle_nn::LayerNorm,
        }
        impl LayerNorm {
            pub fn new(weight: Tensor, bias: Tensor, eps: f64) -> Self {
                Self {
                    inner: candle_nn::LayerNorm::new(weight, bias, eps),
                }
            }
        }
        pub fn layer_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
            Ok(LayerNorm {
                inner: candle_nn::layer_norm(size, eps, vb)?,
            })
        }
        impl Module for LayerNorm {
            fn forward(&self, xs: &Tensor) -> Result<Tensor> {
                // Upstream: `self.inner.forward(xs)` (the fused kernel).
                let ln = &self.inner;
                let eps = ln.eps() as f32;
                candle_nn::ops::layer_norm_slow(xs, ln.weight(), ln.bias().unwrap(), eps)
            }
        }

        pub struct Embedding {
            inner: candle_nn::Embedding,
        }
        impl Embedding {
            pub fn new(d1: usize, d2: usize, vb: VarBuilder) -> Result<Self> {
                Ok(Self {
                    inner: candle_nn::embedding(d1, d2, vb)?,
                })
            }
        }
        impl Module for Embedding {
            fn forward(&self, xs: &Tensor) -> Result<Tensor> {
                self.inner.forward(xs)
            }
        }
    }

    gaps_model!();
}

/// The same file under remat-candle's imports.
mod ported {
    use remat_candle::as_candle::{DType, Device, Module, Result, Tensor, D};
    use remat_candle::nn as candle_nn;
    use remat_candle::nn::with_tracing;
    use remat_candle::nn::VarBuilder;

    gaps_model!();
}

const VOCAB: usize = 16;
const HIDDEN: usize = 16;
const SEQ: usize = 8;
const BATCH: usize = 4;
const STEPS: usize = 3;

fn batch() -> (Tensor, Tensor, Tensor) {
    let dev = Device::Cpu;
    let ids: Vec<u32> = (0..BATCH * SEQ)
        .map(|i| ((i * 5 + i / SEQ) % VOCAB) as u32)
        .collect();
    let mask: Vec<u8> = (0..BATCH * SEQ)
        .map(|i| u8::from(i % SEQ < SEQ - i / SEQ))
        .collect();
    let target: Vec<u32> = (0..BATCH).map(|b| ((b * 3 + 1) % VOCAB) as u32).collect();
    (
        Tensor::from_vec(ids, (BATCH, SEQ), &dev).unwrap(),
        Tensor::from_vec(mask, (BATCH, SEQ), &dev).unwrap(),
        Tensor::from_vec(target, BATCH, &dev).unwrap(),
    )
}

struct Run {
    losses: Vec<u32>,
    params: std::collections::BTreeMap<String, Vec<u32>>,
    peak: u64,
    external: u64,
    evictions: u64,
}

fn train_plain() -> Run {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = plain::Model::new(VOCAB, HIDDEN, SEQ, vb).unwrap();
    setup::seeded_init(&varmap, |n| n.starts_with("norm.")).unwrap();
    let mut opt = <candle_nn::SGD as candle_nn::Optimizer>::new(varmap.all_vars(), 0.5).unwrap();
    let (ids, mask, target) = batch();
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let logits = model.forward(&ids, &mask).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &target).unwrap();
        candle_nn::Optimizer::backward_step(&mut opt, &loss).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap().to_bits());
    }
    Run {
        losses,
        params: setup::snapshot(&varmap).unwrap(),
        peak: 0,
        external: 0,
        evictions: 0,
    }
}

fn train_ported(budget: Option<u64>) -> Run {
    let dev = Device::Cpu;
    let cfg = RematConfig::new();
    let remat = Remat::new(match budget {
        Some(b) => cfg.with_budget_bytes(b),
        None => cfg,
    })
    .unwrap();
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = ported::Model::new(VOCAB, HIDDEN, SEQ, vb).unwrap();
    setup::seeded_init(&varmap, |n| n.starts_with("norm.")).unwrap();
    let mut opt = <candle_nn::SGD as candle_nn::Optimizer>::new(varmap.all_vars(), 0.5).unwrap();
    let (ids, mask, target) = batch();
    let (ids, mask, target) = (
        remat.input(&ids).unwrap(),
        remat.input(&mask).unwrap(),
        remat.input(&target).unwrap(),
    );
    let external = remat.memory_usage().unwrap().allocated;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let logits = model.forward(&ids, &mask).unwrap();
        let loss = nn::loss::cross_entropy(&logits, &target).unwrap();
        nn::Optimizer::backward_step(&mut opt, &loss).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap().to_bits());
    }
    Run {
        losses,
        params: setup::snapshot(&varmap).unwrap(),
        peak: remat.memory_usage().unwrap().peak_allocated,
        external,
        evictions: remat.stats().unwrap().evictions,
    }
}

#[test]
fn a_model_file_using_the_three_gaps_ports_by_its_imports() {
    let plain = train_plain();
    assert!(
        f32::from_bits(plain.losses[STEPS - 1]) < f32::from_bits(plain.losses[0]),
        "the reference does not learn"
    );
    let free = train_ported(None);
    assert_eq!(free.losses, plain.losses, "unconstrained losses");
    assert_eq!(free.params, plain.params, "unconstrained parameters");
    assert_eq!(free.evictions, 0);
    let budget = free.external + (free.peak - free.external) / 2;
    let half = train_ported(Some(budget));
    assert_eq!(half.losses, plain.losses, "50 % losses");
    assert_eq!(half.params, plain.params, "50 % parameters");
    assert!(half.peak <= budget, "peak {} > budget {budget}", half.peak);
    assert!(half.evictions > 0, "nothing evicted at 50 %");
}
