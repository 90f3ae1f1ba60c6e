//! Whole models (an MLP, a small CNN, an attention block) trained with AdamW under
//! budgets of 100 %, 50 % and 30 % of their measured peak activation memory: the
//! losses of every step and the final parameters are bit-identical to each other
//! and, for the MLP and the CNN, to the same model written with plain candle-nn.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Module as _, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use common::{bits, logical_remat, rand};
use remat_candle::nn::{self, loss, Module};
use remat_candle::{RTensor, Remat};

const STEPS: usize = 4;

/// A model under test: builds itself on a context and computes a batch's loss.
trait Model {
    fn build(remat: &Remat, vb: VarBuilder) -> Self;
    fn loss(&self, remat: &Remat, step: usize) -> remat_candle::Result<RTensor>;
    /// Bytes of the batch inputs of one step (external, never evicted).
    fn batch_bytes() -> u64;
}

struct Run {
    losses: Vec<u32>,
    params: HashMap<String, Vec<u64>>,
    peak: u64,
    param_bytes: u64,
    evictions: u64,
    remats: u64,
}

fn snapshot(varmap: &VarMap) -> HashMap<String, Tensor> {
    let data = varmap.data().lock().unwrap();
    data.iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().copy().unwrap()))
        .collect()
}

fn initial<M: Model>() -> HashMap<String, Tensor> {
    let varmap = VarMap::new();
    let remat = Remat::unbounded().unwrap();
    let _m = M::build(
        &remat,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    );
    snapshot(&varmap)
}

fn train<M: Model>(init: &HashMap<String, Tensor>, budget: Option<u64>) -> Run {
    let remat = logical_remat(budget);
    let varmap = VarMap::new();
    let model = M::build(
        &remat,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    );
    let mut param_bytes = 0;
    for (k, v) in varmap.data().lock().unwrap().iter() {
        v.set(&init[k]).unwrap();
        param_bytes += (v.elem_count() * 4) as u64;
    }
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let loss = model.loss(&remat, step).unwrap();
        let grads = loss.backward().unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap().to_bits());
        drop(loss);
        opt.step(&grads).unwrap();
        remat.check_invariants().unwrap();
    }
    let s = remat.stats().unwrap();
    let peak = remat.memory_usage().unwrap().peak_allocated;
    if let Some(b) = budget {
        assert!(peak <= b, "peak {peak} B above the budget {b} B");
    }
    let params = snapshot(&varmap)
        .into_iter()
        .map(|(k, v)| (k, bits(&v)))
        .collect();
    drop(model);
    remat.flush().unwrap();
    assert_eq!(remat.storage_count().unwrap(), 0, "records leaked");
    Run {
        losses,
        params,
        peak,
        param_bytes,
        evictions: s.evictions,
        remats: s.rematerializations,
    }
}

/// Train unconstrained, then at 50 % and 30 % of the activation peak; everything
/// must match bit for bit, and the constrained runs must have rematerialized.
fn under_budgets<M: Model>() -> Run {
    let init = initial::<M>();
    let free = train::<M>(&init, None);
    assert_eq!(free.evictions, 0);
    let ext = free.param_bytes + M::batch_bytes();
    let act = free.peak - ext;
    for frac in [1.0, 0.5, 0.3] {
        let budget = ext + (act as f64 * frac) as u64;
        let run = train::<M>(&init, Some(budget));
        assert_eq!(run.losses, free.losses, "losses differ at {frac}");
        assert_eq!(run.params, free.params, "parameters differ at {frac}");
        if frac < 1.0 {
            assert!(run.evictions > 0 && run.remats > 0, "no remat at {frac}");
        }
    }
    free
}

fn f32_losses(run: &Run) -> Vec<f32> {
    run.losses.iter().map(|b| f32::from_bits(*b)).collect()
}

// ----- MLP ---------------------------------------------------------------------------

struct Mlp {
    l1: nn::Linear,
    l2: nn::Linear,
    l3: nn::Linear,
}

fn mlp_batch(step: usize) -> (Tensor, Tensor) {
    let x = rand(100 + step as u64, &[16, 32], -1.0, 1.0);
    let y: Vec<u32> = (0..16).map(|i| ((i * 7 + step * 3) % 10) as u32).collect();
    (x, Tensor::new(y, &Device::Cpu).unwrap())
}

impl Model for Mlp {
    fn build(remat: &Remat, vb: VarBuilder) -> Self {
        let vb = nn::VarBuilder::new(remat, vb);
        Mlp {
            l1: nn::linear(32, 64, vb.pp("l1")).unwrap(),
            l2: nn::linear(64, 64, vb.pp("l2")).unwrap(),
            l3: nn::linear(64, 10, vb.pp("l3")).unwrap(),
        }
    }
    fn loss(&self, remat: &Remat, step: usize) -> remat_candle::Result<RTensor> {
        let (x, y) = mlp_batch(step);
        let (x, y) = (remat.input(&x)?, remat.input(&y)?);
        let h = self.l1.forward(&x)?.relu()?;
        let h = self
            .l2
            .forward(&h)?
            .gelu()?
            .dropout_with_seed(0.2, step as u64)?;
        loss::cross_entropy(&self.l3.forward(&h)?, &y)
    }
    fn batch_bytes() -> u64 {
        16 * 32 * 4 + 16 * 4
    }
}

fn plain_mlp(init: &HashMap<String, Tensor>) -> Vec<f32> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let l1 = candle_nn::linear(32, 64, vb.pp("l1")).unwrap();
    let l2 = candle_nn::linear(64, 64, vb.pp("l2")).unwrap();
    let l3 = candle_nn::linear(64, 10, vb.pp("l3")).unwrap();
    for (k, v) in varmap.data().lock().unwrap().iter() {
        v.set(&init[k]).unwrap();
    }
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = mlp_batch(step);
        let h = l1.forward(&x).unwrap().relu().unwrap();
        let h = l2.forward(&h).unwrap().gelu().unwrap();
        let mask =
            remat_candle::dropout_mask(step as u64, h.shape(), 0.2, DType::F32, &Device::Cpu)
                .unwrap();
        let h = h.mul(&mask).unwrap();
        let loss = candle_nn::loss::cross_entropy(&l3.forward(&h).unwrap(), &y).unwrap();
        let grads = loss.backward().unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        opt.step(&grads).unwrap();
    }
    losses
}

#[test]
fn mlp_under_budgets_matches_plain_candle() {
    let free = under_budgets::<Mlp>();
    let init = initial::<Mlp>();
    let free2 = train::<Mlp>(&init, None);
    let plain = plain_mlp(&init);
    assert_eq!(
        plain.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        free2.losses,
        "adapter {:?} vs plain candle {:?}",
        f32_losses(&free2),
        plain
    );
    assert!(f32_losses(&free).iter().all(|l| l.is_finite()));
}

// ----- CNN ---------------------------------------------------------------------------

struct Cnn {
    c1: nn::Conv2d,
    bn: nn::BatchNorm,
    c2: nn::Conv2d,
    fc: nn::Linear,
}

fn cnn_batch(step: usize) -> (Tensor, Tensor) {
    let x = rand(200 + step as u64, &[8, 1, 16, 16], 0.0, 1.0);
    let y: Vec<u32> = (0..8).map(|i| ((i * 3 + step) % 10) as u32).collect();
    (x, Tensor::new(y, &Device::Cpu).unwrap())
}

fn conv_cfg() -> candle_nn::Conv2dConfig {
    candle_nn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    }
}

impl Model for Cnn {
    fn build(remat: &Remat, vb: VarBuilder) -> Self {
        let vb = nn::VarBuilder::new(remat, vb);
        Cnn {
            c1: nn::conv2d(1, 8, 3, conv_cfg(), vb.pp("c1")).unwrap(),
            bn: nn::batch_norm(8, 1e-5, vb.pp("bn")).unwrap(),
            c2: nn::conv2d(8, 16, 3, conv_cfg(), vb.pp("c2")).unwrap(),
            fc: nn::linear(16 * 4 * 4, 10, vb.pp("fc")).unwrap(),
        }
    }
    fn loss(&self, remat: &Remat, step: usize) -> remat_candle::Result<RTensor> {
        let (x, y) = cnn_batch(step);
        let (x, y) = (remat.input(&x)?, remat.input(&y)?);
        let h = self
            .bn
            .forward(&self.c1.forward(&x)?)?
            .relu()?
            .max_pool2d(2)?;
        let h = self.c2.forward(&h)?.relu()?.max_pool2d(2)?;
        let logits = self.fc.forward(&h.flatten_from(1)?)?;
        loss::cross_entropy(&logits, &y)
    }
    fn batch_bytes() -> u64 {
        8 * 16 * 16 * 4 + 8 * 4
    }
}

fn plain_batch_norm(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let x_t = x.transpose(0, 1)?;
    let dims_t = x_t.dims().to_vec();
    let x_t = x_t.flatten_from(1)?.contiguous()?;
    let mean_x = x_t.mean_keepdim(1)?;
    let x_t = x_t.broadcast_sub(&mean_x)?;
    let norm_x = x_t.sqr()?.mean_keepdim(1)?;
    let x_t = x_t.broadcast_div(&(norm_x + 1e-5)?.sqrt()?)?;
    let c = w.dims1()?;
    let x_t = x_t
        .broadcast_mul(&w.reshape((c, 1))?)?
        .broadcast_add(&b.reshape((c, 1))?)?;
    x_t.reshape(dims_t)?.transpose(0, 1)
}

fn plain_cnn(init: &HashMap<String, Tensor>) -> Vec<f32> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let c1 = candle_nn::conv2d(1, 8, 3, conv_cfg(), vb.pp("c1")).unwrap();
    let bw = vb
        .pp("bn")
        .get_with_hints(8, "weight", candle_nn::Init::Const(1.))
        .unwrap();
    let bb = vb
        .pp("bn")
        .get_with_hints(8, "bias", candle_nn::Init::Const(0.))
        .unwrap();
    let c2 = candle_nn::conv2d(8, 16, 3, conv_cfg(), vb.pp("c2")).unwrap();
    let fc = candle_nn::linear(256, 10, vb.pp("fc")).unwrap();
    for (k, v) in varmap.data().lock().unwrap().iter() {
        v.set(&init[k]).unwrap();
    }
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = cnn_batch(step);
        let h = plain_batch_norm(&c1.forward(&x).unwrap(), &bw, &bb).unwrap();
        let h = h.relu().unwrap().max_pool2d(2).unwrap();
        let h = c2
            .forward(&h)
            .unwrap()
            .relu()
            .unwrap()
            .max_pool2d(2)
            .unwrap();
        let logits = fc.forward(&h.flatten_from(1).unwrap()).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        let grads = loss.backward().unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        opt.step(&grads).unwrap();
    }
    losses
}

#[test]
fn cnn_under_budgets_matches_plain_candle() {
    let free = under_budgets::<Cnn>();
    let init = initial::<Cnn>();
    let plain = plain_cnn(&init);
    let ours = train::<Cnn>(&init, None);
    assert_eq!(
        plain.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        ours.losses,
        "adapter {:?} vs plain candle {:?}",
        f32_losses(&ours),
        plain
    );
    assert!(f32_losses(&free).iter().all(|l| l.is_finite()));
}

// ----- attention block ------------------------------------------------------------------

struct Block {
    emb: nn::Embedding,
    ln1: nn::LayerNorm,
    att: nn::MultiHeadAttention,
    ln2: nn::LayerNorm,
    up: nn::Linear,
    down: nn::Linear,
    head: nn::Linear,
}

const VOCAB: usize = 32;
const T: usize = 12;
const B: usize = 4;
const DIM: usize = 32;

fn tokens(_step: usize) -> (Tensor, Tensor) {
    // One fixed batch: the loss must fall over the steps.
    let ids: Vec<u32> = (0..B * (T + 1))
        .map(|i| ((i * 5 + i / 3) % VOCAB) as u32)
        .collect();
    let all = Tensor::from_vec(ids, (B, T + 1), &Device::Cpu).unwrap();
    (
        all.narrow(1, 0, T).unwrap().contiguous().unwrap(),
        all.narrow(1, 1, T).unwrap().contiguous().unwrap(),
    )
}

impl Model for Block {
    fn build(remat: &Remat, vb: VarBuilder) -> Self {
        let vb = nn::VarBuilder::new(remat, vb);
        Block {
            emb: nn::embedding(VOCAB, DIM, vb.pp("emb")).unwrap(),
            ln1: nn::layer_norm(DIM, 1e-5, vb.pp("ln1")).unwrap(),
            att: nn::MultiHeadAttention::new(DIM, 4, vb.pp("att")).unwrap(),
            ln2: nn::layer_norm(DIM, 1e-5, vb.pp("ln2")).unwrap(),
            up: nn::linear(DIM, 4 * DIM, vb.pp("up")).unwrap(),
            down: nn::linear(4 * DIM, DIM, vb.pp("down")).unwrap(),
            head: nn::linear(DIM, VOCAB, vb.pp("head")).unwrap(),
        }
    }
    fn loss(&self, remat: &Remat, step: usize) -> remat_candle::Result<RTensor> {
        let (x, y) = tokens(step);
        let (x, y) = (remat.input(&x)?, remat.input(&y.flatten_all()?)?);
        let mask = remat.input(&nn::causal_mask(T, DType::F32, &Device::Cpu)?)?;
        let h = self.emb.forward(&x)?;
        let a = self
            .att
            .forward_masked(&self.ln1.forward(&h)?, Some(&mask))?;
        let h = (&h + &a)?;
        let m = self
            .down
            .forward(&self.up.forward(&self.ln2.forward(&h)?)?.gelu()?)?;
        let h = (&h + &m)?;
        let logits = self.head.forward(&h)?.reshape((B * T, VOCAB))?;
        loss::cross_entropy(&logits, &y)
    }
    fn batch_bytes() -> u64 {
        (B * T * 4 * 2 + T * T * 4) as u64
    }
}

fn plain_ln(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let h = DIM as f64;
    let mean = (x.sum_keepdim(candle_core::D::Minus1)? / h)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = (xc.sqr()?.sum_keepdim(candle_core::D::Minus1)? / h)?;
    let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
    xn.broadcast_mul(w)?.broadcast_add(b)
}

fn plain_block(init: &HashMap<String, Tensor>) -> Vec<f32> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let emb = candle_nn::embedding(VOCAB, DIM, vb.pp("emb")).unwrap();
    let ln = |p: &str| {
        let l = candle_nn::layer_norm(DIM, 1e-5, vb.pp(p)).unwrap();
        (l.weight().clone(), l.bias().unwrap().clone())
    };
    let (w1, b1) = ln("ln1");
    let lin = |p: &str, i, o| candle_nn::linear(i, o, vb.pp(p)).unwrap();
    let (q, k, v, o) = (
        lin("att.q", DIM, DIM),
        lin("att.k", DIM, DIM),
        lin("att.v", DIM, DIM),
        lin("att.o", DIM, DIM),
    );
    let (w2, b2) = ln("ln2");
    let (up, down, head) = (
        lin("up", DIM, 4 * DIM),
        lin("down", 4 * DIM, DIM),
        lin("head", DIM, VOCAB),
    );
    for (k, v) in varmap.data().lock().unwrap().iter() {
        v.set(&init[k]).unwrap();
    }
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mask = nn::causal_mask(T, DType::F32, &Device::Cpu).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = tokens(step);
        let fwd = || -> candle_core::Result<Tensor> {
            let h = emb.forward(&x)?;
            let a_in = plain_ln(&h, &w1, &b1)?;
            let split = |t: Tensor| -> candle_core::Result<Tensor> {
                t.reshape((B, T, 4, DIM / 4))?.transpose(1, 2)?.contiguous()
            };
            let (qq, kk, vv) = (
                split(q.forward(&a_in)?)?,
                split(k.forward(&a_in)?)?,
                split(v.forward(&a_in)?)?,
            );
            let att = (qq.matmul(&kk.t()?)? * (1f64 / ((DIM / 4) as f64).sqrt()))?;
            let att = candle_nn::ops::softmax(&att.broadcast_add(&mask)?, candle_core::D::Minus1)?;
            let a = o.forward(&att.matmul(&vv)?.transpose(1, 2)?.reshape((B, T, DIM))?)?;
            let h = (&h + &a)?;
            let m = down.forward(&up.forward(&plain_ln(&h, &w2, &b2)?)?.gelu()?)?;
            let h = (&h + &m)?;
            let logits = head.forward(&h)?.reshape((B * T, VOCAB))?;
            candle_nn::loss::cross_entropy(&logits, &y.flatten_all()?)
        };
        let loss = fwd().unwrap();
        let grads = loss.backward().unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        opt.step(&grads).unwrap();
    }
    losses
}

#[test]
fn attention_block_under_budgets_matches_plain_candle() {
    let free = under_budgets::<Block>();
    let init = initial::<Block>();
    let ours = train::<Block>(&init, None);
    let plain = plain_block(&init);
    assert_eq!(
        plain.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        ours.losses,
        "adapter {:?} vs plain candle {:?}",
        f32_losses(&ours),
        plain
    );
    let l = f32_losses(&free);
    assert!(l.iter().all(|x| x.is_finite()), "{l:?}");
    assert!(
        l[STEPS - 1] < l[0],
        "training did not reduce the loss: {l:?}"
    );
}
