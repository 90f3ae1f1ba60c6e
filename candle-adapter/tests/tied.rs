//! Tied weights: a Llama-style decoder (RmsNorm, rotary embeddings, a causal
//! mask by `masked_fill`, a SiLU-gated MLP) whose output layer is its embedding
//! table. The table's gradient is the sum of the lookup's `index_add` and the
//! output layer's matmul, in candle's order: losses and parameters equal plain
//! candle's bit for bit over several AdamW steps, unconstrained and at 50 % and
//! 30 % of the activation peak. The shared table is counted once in the budget.
//! The model is `examples/shared/lm.rs` (also the `decoder_lm` example's).

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use common::{bits, logical_remat, rand};
use remat_candle::nn;
use remat_candle::Remat;

#[path = "../examples/shared/lm.rs"]
mod lm;
use lm::{Config, Lm, PlainLm};

const CFG: Config = Config {
    vocab: 48,
    dim: 32,
    heads: 4,
    hidden: 64,
    layers: 2,
    seq: 10,
    rms_eps: 1e-6,
    rope_theta: 10000.,
};
const VOCAB: usize = CFG.vocab;
const DIM: usize = CFG.dim;
const B: usize = 3;
const T: usize = CFG.seq;
const STEPS: usize = 4;

/// One fixed batch: the loss must fall over the steps.
fn tokens(_step: usize) -> (Tensor, Tensor) {
    lm::tokens(&CFG, B, &Device::Cpu).unwrap()
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
    PlainLm::new(
        CFG,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
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
    let model = PlainLm::new(
        CFG,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
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
    let remat = logical_remat(budget);
    let varmap = VarMap::new();
    let model = Lm::new(
        CFG,
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
    let ext = param_bytes(&init) + CFG.table_bytes() + (2 * B * T * 4) as u64;
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
    let vb = nn::VarBuilder::from_varmap_in(&remat, &varmap, DType::F32, &Device::Cpu);
    let emb = nn::embedding(VOCAB, DIM, vb.pp("embed")).unwrap();
    let before = remat.stats().unwrap().live_bytes;
    assert_eq!(before, (VOCAB * DIM * 4) as u64);
    // The same storage wrapped again, as a candle-nn layer over the table.
    let table = vb.candle().pp("embed").get((VOCAB, DIM), "weight").unwrap();
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
