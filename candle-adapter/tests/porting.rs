//! Porting from candle: the error and result types of model code written for
//! candle (`candle_core::Result`, `bail!`, a tail `forward`) compile unchanged,
//! and remat's typed errors are recovered from candle's error by downcast.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use common::rand;
use remat_candle::nn::{self, Module};
use remat_candle::{
    BudgetMode, CandleErrorExt, DtrConfig, Error, MemoryUsage, RTensor, Remat, RematConfig,
    RuntimeStats,
};

/// A block as candle-transformers writes it: candle's `Result`, `bail!`, `?` on
/// plain candle calls and a tail call of a layer's `forward`.
struct Block {
    linear: nn::Linear,
}

impl Block {
    fn forward(&self, xs: &RTensor) -> candle_core::Result<RTensor> {
        let (_b, d) = xs.dims2()?;
        if d != 4 {
            candle_core::bail!("expected 4 features, got {d}")
        }
        let _plain = Tensor::zeros(1, DType::F32, xs.device())?; // a plain candle call
        self.linear.forward(xs)
    }
}

impl Module for Block {
    fn forward(&self, xs: &RTensor) -> remat_candle::Result<RTensor> {
        Block::forward(self, xs)
    }
}

#[test]
fn candle_result_bail_and_tail_forward_compile_and_run() {
    let remat = Remat::unbounded().unwrap();
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap_in(&remat, &varmap, DType::F32, &Device::Cpu);
    let block = Block {
        linear: nn::linear(4, 3, vb.pp("l")).unwrap(),
    };
    let x = remat.input(&rand(1, &[2, 4], -1.0, 1.0)).unwrap();
    assert_eq!(block.forward(&x).unwrap().dims(), &[2, 3]);
    assert_eq!(x.apply(&block).unwrap().dims(), &[2, 3]);
    let bad = remat.input(&rand(2, &[2, 5], -1.0, 1.0)).unwrap();
    let e = Block::forward(&block, &bad).unwrap_err();
    assert!(e.to_string().contains("expected 4 features, got 5"), "{e}");
    // A candle error carries no remat error.
    assert!(e.remat_error().is_none());
}

#[test]
fn typed_errors_are_recovered_through_context_layers() {
    let budget = 1000;
    let remat = Remat::new(
        RematConfig::new()
            .with_budget_bytes(budget)
            .with_dtr(DtrConfig::default().with_budget_mode(BudgetMode::Logical)),
    )
    .unwrap();
    let x = remat.input(&rand(6, &[100], -1.0, 1.0)).unwrap();
    let e = x
        .reshape((100, 1))
        .unwrap()
        .matmul(&x.reshape((1, 100)).unwrap())
        .map_err(|e| e.context("attention scores"))
        .expect_err("a 40 kB output fit a 1 kB budget");
    assert!(e.is_impossible_budget(), "{e}");
    assert_eq!(e.impossible_budget().unwrap().needed, 40_000);
    assert!(e.to_string().contains("attention scores"), "{e}");
    // Owned: the typed error out of candle's, for a `match`.
    match Error::downcast(e) {
        Ok(Error::Dtr(d)) => assert!(d.is_impossible_budget()),
        other => panic!("expected Error::Dtr, got {other:?}"),
    }
    // Errors of this crate's own checks are typed too.
    let e = x.dropout(1.5).unwrap_err();
    assert!(matches!(
        e.remat_error(),
        Some(Error::Unsupported { op: "dropout", .. })
    ));
    // Round trip: candle's error back into the typed one keeps the variant.
    let typed: Error = e.into();
    assert!(matches!(typed, Error::Unsupported { op: "dropout", .. }));
}

#[test]
fn figures_and_settings_come_from_this_crate() {
    let remat = Remat::unbounded().unwrap();
    let _x = remat.input(&rand(1, &[4], 0.0, 1.0)).unwrap();
    let s: RuntimeStats = remat.stats().unwrap();
    let u: MemoryUsage = remat.memory_usage().unwrap();
    assert_eq!(s.live_bytes, 16);
    assert_eq!(u.allocated, 16);
    let _cfg: remat_candle::AllocatorConfig = Default::default();
}

#[test]
fn escaping_to_plain_candle_and_back_keeps_gradients() {
    use candle_core::Var;
    let v = Var::from_tensor(&rand(3, &[4, 5], -1.0, 1.0)).unwrap();
    // Plain candle: exp, then a sort (an op remat-candle does not cover), then sqr.
    let plain = v.as_tensor().exp().unwrap().sort_last_dim(true).unwrap().0;
    let plain_loss = plain.sqr().unwrap().sum_all().unwrap();
    let plain_grad = plain_loss.backward().unwrap();
    // remat-candle: the same, the sort done on an escaped copy and brought back.
    let remat = Remat::unbounded().unwrap();
    let x = remat.param(&v).unwrap().exp().unwrap();
    let s = x.to_candle().unwrap().sort_last_dim(true).unwrap().0; // plain candle, in candle's graph
    let back = remat.input(&s).unwrap(); // an input of the runtime: never evicted
    let loss = back.sqr().unwrap().sum_all().unwrap();
    assert!(x.evict().unwrap()); // the escaped copy does not depend on x's storage
    let grads = loss.backward().unwrap();
    assert_eq!(
        common::bits(&loss.to_candle().unwrap()),
        common::bits(&plain_loss)
    );
    assert_eq!(
        common::bits(grads.get(v.as_tensor()).unwrap()),
        common::bits(plain_grad.get(v.as_tensor()).unwrap())
    );
}

#[test]
fn constructors_use_the_threads_current_context() {
    let first = Remat::unbounded().unwrap();
    let second = Remat::unbounded().unwrap(); // created last: current
    let t = RTensor::arange(0f32, 4., &Device::Cpu).unwrap();
    assert_eq!(t.storage_id().unwrap(), t.storage_id().unwrap());
    assert_eq!(second.storage_count().unwrap(), 1);
    assert_eq!(first.storage_count().unwrap(), 0);
    first.make_current();
    let u = RTensor::new(&[1f32, 2., 3., 4.], &Device::Cpu).unwrap();
    assert_eq!(first.storage_count().unwrap(), 1);
    // Tensors of two contexts do not mix: a typed error, not a silent copy.
    let e = t.add(&u).unwrap_err();
    assert!(matches!(
        e.remat_error(),
        Some(Error::ContextMismatch { op: "add" })
    ));
    let v = RTensor::from_vec(vec![1f32, 2., 3., 4.], (2, 2), &Device::Cpu).unwrap();
    assert_eq!(
        (&u.reshape((2, 2)).unwrap() + &v)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap(),
        [[2., 4.], [6., 8.]]
    );
    let z = RTensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(z.dims(), &[2, 3]);
    // A thread without a context gets a typed error naming the fix.
    let e = std::thread::spawn(|| RTensor::ones(2, DType::F32, &Device::Cpu).unwrap_err())
        .join()
        .unwrap();
    assert!(
        matches!(
            e.remat_error(),
            Some(Error::Unsupported {
                op: "Remat::current",
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("Remat::new"), "{e}");
    drop((t, u, v, z, first, second));
    assert!(Remat::current().is_err());
}

#[test]
fn with_tracing_layers_match_the_nn_ones() {
    use remat_candle::nn::with_tracing;
    let remat = Remat::unbounded().unwrap();
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap_in(&remat, &varmap, DType::F32, &Device::Cpu);
    let traced = with_tracing::RmsNorm::new(8, 1e-6, vb.pp("n")).unwrap();
    let plain = nn::rms_norm(8, 1e-6, vb.pp("n")).unwrap(); // the same variable
    let x = remat.input(&rand(4, &[3, 8], -1.0, 1.0)).unwrap();
    assert_eq!(
        common::bits(&traced.forward(&x).unwrap().to_candle().unwrap()),
        common::bits(&plain.forward(&x).unwrap().to_candle().unwrap())
    );
    let emb = nn::embedding(10, 8, vb.pp("e")).unwrap();
    let head = with_tracing::Linear::from_weights(emb.embeddings().clone(), None);
    assert_eq!(
        head.weight().storage_id().unwrap(),
        emb.embeddings().storage_id().unwrap()
    );
    assert_eq!(head.forward(&x).unwrap().dims(), &[3, 10]);
}

#[test]
fn to_device_on_its_own_device_is_the_same_tensor() {
    let remat = remat_candle::Remat::unbounded().unwrap();
    let x = remat.input(&common::rand(1, &[3, 4], -1.0, 1.0)).unwrap();
    let y = (&x + 1.0).unwrap();
    let moved = y.to_device(&candle_core::Device::Cpu).unwrap();
    assert_eq!(moved.storage_id().unwrap(), y.storage_id().unwrap());
    assert_eq!(moved.id(), y.id());
}
