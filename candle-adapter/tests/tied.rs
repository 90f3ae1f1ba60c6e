//! Tied weights: a Llama-style decoder (RmsNorm, rotary embeddings, a causal
//! mask by `masked_fill`, a SiLU-gated MLP) whose output layer is its embedding
//! table. The table's gradient is the sum of the lookup's `index_add` and the
//! output layer's matmul, in candle's order: losses and parameters equal plain
//! candle's bit for bit over several AdamW steps, unconstrained and at 50 % and
//! 30 % of the activation peak. The shared table is counted once in the budget.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Module as _, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use common::{bits, rand};
use remat_candle::nn::{self, ops, rotary_emb, Module};
use remat_candle::{BudgetMode, DtrConfig, RTensor, Remat, RematConfig};

const VOCAB: usize = 48;
const DIM: usize = 32;
const HEADS: usize = 4;
const HD: usize = DIM / HEADS;
const HIDDEN: usize = 64;
const LAYERS: usize = 2;
const B: usize = 3;
const T: usize = 10;
const STEPS: usize = 4;
const EPS: f64 = 1e-6;

/// One fixed batch: the loss must fall over the steps.
fn tokens(_step: usize) -> (Tensor, Tensor) {
    let ids: Vec<u32> = (0..B * (T + 1))
        .map(|i| ((i * 7 + i / 5) % VOCAB) as u32)
        .collect();
    let all = Tensor::from_vec(ids, (B, T + 1), &Device::Cpu).unwrap();
    (
        all.narrow(1, 0, T).unwrap().contiguous().unwrap(),
        all.narrow(1, 1, T)
            .unwrap()
            .contiguous()
            .unwrap()
            .flatten_all()
            .unwrap(),
    )
}

/// Llama's rotary tables `(T, HD / 2)` and the causal mask (1 above the diagonal).
fn tables() -> (Tensor, Tensor, Tensor) {
    let inv: Vec<f32> = (0..HD)
        .step_by(2)
        .map(|i| 1f32 / 10000f32.powf(i as f32 / HD as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, HD / 2), &Device::Cpu).unwrap();
    let t = Tensor::arange(0u32, T as u32, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .reshape((T, 1))
        .unwrap();
    let freqs = t.matmul(&inv).unwrap();
    let mask: Vec<u8> = (0..T)
        .flat_map(|i| (0..T).map(move |j| u8::from(j > i)))
        .collect();
    (
        freqs.cos().unwrap(),
        freqs.sin().unwrap(),
        Tensor::from_vec(mask, (T, T), &Device::Cpu).unwrap(),
    )
}

// ----- remat-candle -------------------------------------------------------------------

struct Layer {
    rms1: nn::RmsNorm,
    q: nn::Linear,
    k: nn::Linear,
    v: nn::Linear,
    o: nn::Linear,
    rms2: nn::RmsNorm,
    gate: nn::Linear,
    up: nn::Linear,
    down: nn::Linear,
}

struct Lm {
    embed: nn::Embedding,
    layers: Vec<Layer>,
    norm: nn::RmsNorm,
    head: nn::Linear,
    cos: RTensor,
    sin: RTensor,
    mask: RTensor,
}

impl Lm {
    fn new(remat: &Remat, vb: VarBuilder) -> remat_candle::Result<Self> {
        let embed = nn::embedding(remat, VOCAB, DIM, vb.pp("embed"))?;
        let lin = |i, o, p: &str, vb: &VarBuilder| nn::linear_no_bias(remat, i, o, vb.pp(p));
        let layers = (0..LAYERS)
            .map(|l| {
                let vb = vb.pp(format!("layers.{l}"));
                Ok(Layer {
                    rms1: nn::rms_norm(remat, DIM, EPS, vb.pp("rms1"))?,
                    q: lin(DIM, DIM, "q", &vb)?,
                    k: lin(DIM, DIM, "k", &vb)?,
                    v: lin(DIM, DIM, "v", &vb)?,
                    o: lin(DIM, DIM, "o", &vb)?,
                    rms2: nn::rms_norm(remat, DIM, EPS, vb.pp("rms2"))?,
                    gate: lin(DIM, HIDDEN, "gate", &vb)?,
                    up: lin(DIM, HIDDEN, "up", &vb)?,
                    down: lin(HIDDEN, DIM, "down", &vb)?,
                })
            })
            .collect::<remat_candle::Result<Vec<_>>>()?;
        let norm = nn::rms_norm(remat, DIM, EPS, vb.pp("norm"))?;
        // Tied as candle-transformers writes it: a candle-nn Linear over the
        // embedding's candle tensor, wrapped; the storage is shared, not counted twice.
        let table = vb.pp("embed").get((VOCAB, DIM), "weight")?;
        let head = nn::Linear::from_candle(remat, &candle_nn::Linear::new(table, None))?;
        let (cos, sin, mask) = tables();
        Ok(Self {
            embed,
            layers,
            norm,
            head,
            cos: remat.input(&cos)?,
            sin: remat.input(&sin)?,
            mask: remat.input(&mask)?,
        })
    }

    fn attention(&self, l: &Layer, x: &RTensor) -> remat_candle::Result<RTensor> {
        let (b, t, _) = x.dims3()?;
        let split = |y: RTensor| y.reshape((b, t, HEADS, HD))?.transpose(1, 2)?.contiguous();
        let q = rotary_emb::rope(&split(l.q.forward(x)?)?, &self.cos, &self.sin)?;
        let k = rotary_emb::rope(&split(l.k.forward(x)?)?, &self.cos, &self.sin)?;
        let v = split(l.v.forward(x)?)?;
        let att = (q.matmul(&k.t()?)? / (HD as f64).sqrt())?;
        let mask = self.mask.broadcast_as(att.shape())?;
        let att = ops::softmax_last_dim(&att.masked_fill(&mask, f32::NEG_INFINITY)?)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, DIM))?;
        l.o.forward(&y)
    }

    fn forward(&self, ids: &RTensor) -> remat_candle::Result<RTensor> {
        let mut x = self.embed.forward(ids)?;
        for l in &self.layers {
            x = (&x + self.attention(l, &l.rms1.forward(&x)?)?)?;
            let h = l.rms2.forward(&x)?;
            let m = l
                .down
                .forward(&(ops::silu(&l.gate.forward(&h)?)? * l.up.forward(&h)?)?)?;
            x = (&x + m)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}

// ----- plain candle --------------------------------------------------------------------

struct PlainLayer {
    rms1: candle_nn::RmsNorm,
    q: candle_nn::Linear,
    k: candle_nn::Linear,
    v: candle_nn::Linear,
    o: candle_nn::Linear,
    rms2: candle_nn::RmsNorm,
    gate: candle_nn::Linear,
    up: candle_nn::Linear,
    down: candle_nn::Linear,
}

struct PlainLm {
    embed: candle_nn::Embedding,
    layers: Vec<PlainLayer>,
    norm: candle_nn::RmsNorm,
    head: candle_nn::Linear,
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
}

impl PlainLm {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        let embed = candle_nn::embedding(VOCAB, DIM, vb.pp("embed"))?;
        let lin = |i, o, p: &str, vb: &VarBuilder| candle_nn::linear_no_bias(i, o, vb.pp(p));
        let layers = (0..LAYERS)
            .map(|l| {
                let vb = vb.pp(format!("layers.{l}"));
                Ok(PlainLayer {
                    rms1: candle_nn::rms_norm(DIM, EPS, vb.pp("rms1"))?,
                    q: lin(DIM, DIM, "q", &vb)?,
                    k: lin(DIM, DIM, "k", &vb)?,
                    v: lin(DIM, DIM, "v", &vb)?,
                    o: lin(DIM, DIM, "o", &vb)?,
                    rms2: candle_nn::rms_norm(DIM, EPS, vb.pp("rms2"))?,
                    gate: lin(DIM, HIDDEN, "gate", &vb)?,
                    up: lin(DIM, HIDDEN, "up", &vb)?,
                    down: lin(HIDDEN, DIM, "down", &vb)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let norm = candle_nn::rms_norm(DIM, EPS, vb.pp("norm"))?;
        let head = candle_nn::Linear::new(embed.embeddings().clone(), None);
        let (cos, sin, mask) = tables();
        Ok(Self {
            embed,
            layers,
            norm,
            head,
            cos,
            sin,
            mask,
        })
    }

    fn attention(&self, l: &PlainLayer, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let split = |y: Tensor| y.reshape((b, t, HEADS, HD))?.transpose(1, 2)?.contiguous();
        // The differentiable forms: candle-nn's fused rope and softmax_last_dim
        // have no backward on the CPU.
        let q = candle_nn::rotary_emb::rope_slow(&split(l.q.forward(x)?)?, &self.cos, &self.sin)?;
        let k = candle_nn::rotary_emb::rope_slow(&split(l.k.forward(x)?)?, &self.cos, &self.sin)?;
        let v = split(l.v.forward(x)?)?;
        let att = (q.matmul(&k.t()?)? / (HD as f64).sqrt())?;
        let mask = self.mask.broadcast_as(att.shape())?;
        let on_true = Tensor::new(f32::NEG_INFINITY, att.device())?.broadcast_as(mask.shape())?;
        let att = candle_nn::ops::softmax(&mask.where_cond(&on_true, &att)?, D::Minus1)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, DIM))?;
        l.o.forward(&y)
    }

    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = self.embed.forward(ids)?;
        for l in &self.layers {
            x = (&x + self.attention(l, &l.rms1.forward_diff(&x)?)?)?;
            let h = l.rms2.forward_diff(&x)?;
            let m = l
                .down
                .forward(&(candle_nn::ops::silu(&l.gate.forward(&h)?)? * l.up.forward(&h)?)?)?;
            x = (&x + m)?;
        }
        self.head.forward(&self.norm.forward_diff(&x)?)
    }
}

// ----- training ------------------------------------------------------------------------

struct Run {
    losses: Vec<u32>,
    params: HashMap<String, Vec<u64>>,
    peak: u64,
    evictions: u64,
    remats: u64,
}

fn init() -> HashMap<String, Tensor> {
    let varmap = VarMap::new();
    PlainLm::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    let data = varmap.data().lock().unwrap();
    data.iter()
        .map(|(k, v)| {
            let fresh = rand(k.len() as u64 * 31 + 7, v.dims(), -0.3, 0.3);
            let value = if k.contains("rms") || k.starts_with("norm") {
                v.as_tensor().copy().unwrap()
            } else {
                fresh
            };
            (k.clone(), value)
        })
        .collect()
}

fn params(varmap: &VarMap) -> HashMap<String, Vec<u64>> {
    let data = varmap.data().lock().unwrap();
    data.iter()
        .map(|(k, v)| (k.clone(), bits(v.as_tensor())))
        .collect()
}

fn set(varmap: &VarMap, init: &HashMap<String, Tensor>) {
    for (k, v) in varmap.data().lock().unwrap().iter() {
        v.set(&init[k]).unwrap();
    }
}

fn train_plain(init: &HashMap<String, Tensor>) -> Run {
    let varmap = VarMap::new();
    let model = PlainLm::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    set(&varmap, init);
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = tokens(step);
        let logits = model.forward(&x).unwrap().reshape((B * T, VOCAB)).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        let grads = loss.backward().unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap().to_bits());
        opt.step(&grads).unwrap();
    }
    Run {
        losses,
        params: params(&varmap),
        peak: 0,
        evictions: 0,
        remats: 0,
    }
}

fn train_remat(init: &HashMap<String, Tensor>, budget: Option<u64>) -> Run {
    let dtr = DtrConfig::default().with_budget_mode(BudgetMode::Logical);
    let cfg = RematConfig::new().with_dtr(dtr);
    let cfg = match budget {
        Some(b) => cfg.with_budget_bytes(b),
        None => cfg,
    };
    let remat = Remat::new(cfg).unwrap();
    let varmap = VarMap::new();
    let model = Lm::new(
        &remat,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    set(&varmap, init);
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = tokens(step);
        let logits = model
            .forward(&remat.input(&x).unwrap())
            .unwrap()
            .reshape((B * T, VOCAB))
            .unwrap();
        let loss = nn::loss::cross_entropy(&logits, &remat.input(&y).unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap().to_bits());
        drop((loss, logits));
        opt.step(&grads).unwrap();
        remat.check_invariants().unwrap();
    }
    let s = remat.stats().unwrap();
    let peak = remat.memory_usage().unwrap().peak_allocated;
    if let Some(b) = budget {
        assert!(peak <= b, "peak {peak} B above the budget {b} B");
    }
    drop(model);
    remat.flush().unwrap();
    assert_eq!(remat.storage_count().unwrap(), 0, "records leaked");
    Run {
        losses,
        params: params(&varmap),
        peak,
        evictions: s.evictions,
        remats: s.rematerializations,
    }
}

/// Equal parameters, naming the ones that differ (not printing millions of bits).
fn same_params(a: &HashMap<String, Vec<u64>>, b: &HashMap<String, Vec<u64>>, what: &str) {
    let mut differ: Vec<&String> = a.keys().filter(|k| a.get(*k) != b.get(*k)).collect();
    differ.sort();
    assert!(
        differ.is_empty() && a.len() == b.len(),
        "{what}: parameters differ: {differ:?}"
    );
}

fn param_bytes(init: &HashMap<String, Tensor>) -> u64 {
    init.values().map(|t| (t.elem_count() * 4) as u64).sum()
}

#[test]
fn tied_embeddings_train_bit_identically_to_plain_candle() {
    let init = init();
    let plain = train_plain(&init);
    let free = train_remat(&init, None);
    let l: Vec<f32> = plain.losses.iter().map(|b| f32::from_bits(*b)).collect();
    assert!(
        l.iter().all(|x| x.is_finite()) && l[STEPS - 1] < l[0],
        "{l:?}"
    );
    assert_eq!(free.losses, plain.losses, "losses differ from plain candle");
    same_params(&free.params, &plain.params, "unconstrained vs plain candle");
    // External bytes: parameters (the table once), the rotary tables, the mask
    // and one step's ids and targets.
    let ext = param_bytes(&init) + (2 * T * HD / 2 * 4 + T * T + 2 * B * T * 4) as u64;
    let act = free.peak - ext;
    for frac in [0.5, 0.3] {
        let budget = ext + (act as f64 * frac) as u64;
        let run = train_remat(&init, Some(budget));
        assert_eq!(run.losses, plain.losses, "losses differ at {frac}");
        same_params(
            &run.params,
            &plain.params,
            &format!("{frac} vs plain candle"),
        );
        assert!(run.evictions > 0 && run.remats > 0, "no remat at {frac}");
    }
}

#[test]
fn a_shared_storage_is_counted_once() {
    let remat = Remat::unbounded().unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let emb = nn::embedding(&remat, VOCAB, DIM, vb.pp("embed")).unwrap();
    let before = remat.stats().unwrap().live_bytes;
    assert_eq!(before, (VOCAB * DIM * 4) as u64);
    // The same storage wrapped again, as a candle-nn layer over the table.
    let table = vb.pp("embed").get((VOCAB, DIM), "weight").unwrap();
    let head =
        nn::Linear::from_candle(&remat, &candle_nn::Linear::new(table.clone(), None)).unwrap();
    assert_eq!(remat.stats().unwrap().live_bytes, before);
    assert_eq!(
        head.weight().storage_id().unwrap(),
        emb.embeddings().storage_id().unwrap()
    );
    // A view of it that is smaller is the same record too; other data is not.
    let part = remat.input(&table.narrow(0, 0, 2).unwrap()).unwrap();
    assert_eq!(
        part.storage_id().unwrap(),
        emb.embeddings().storage_id().unwrap()
    );
    assert_eq!(remat.stats().unwrap().live_bytes, before);
    let copy = remat.input(&table.copy().unwrap()).unwrap();
    assert_eq!(remat.stats().unwrap().live_bytes, 2 * before);
    drop((emb, head, part, copy));
    remat.flush().unwrap();
    assert_eq!(remat.storage_count().unwrap(), 0);
}
