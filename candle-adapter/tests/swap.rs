//! The host tier under candle (issue 33): with swap on, a model trains under
//! budgets where parameters and inputs leave the device between their uses,
//! bit-identically to plain candle-nn; a budget that parameters and inputs
//! alone exceed (an `ImpossibleBudget` without swap) trains; failed copies lose
//! nothing; swapped variables read back whole.
//!
//! The model: an MLP of `DEPTH` 64×64 layers (ReLU) and a 10-way head,
//! cross-entropy, AdamW, in logical mode with costs by output bytes and a fixed
//! bandwidth, so that the runtime's decisions — and where an injected failure
//! lands — are the same on every run.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Module as _, VarMap};
use common::{bits, rand, seed_vars};
use remat_candle::nn::{self, loss, Module, Optimizer};
use remat_candle::{
    BudgetMode, CandleErrorExt, CostModel, DtrConfig, HostBudget, RTensor, Remat, RematConfig,
};

const WIDTH: usize = 64;
const DEPTH: usize = 6;
const CLASSES: usize = 10;
const ROWS: usize = 32;
const STEPS: usize = 4;

/// Bytes of the parameters: `DEPTH` 64×64 layers with biases, the head.
const PARAM_BYTES: u64 = ((DEPTH * (WIDTH * WIDTH + WIDTH) + WIDTH * CLASSES + CLASSES) * 4) as u64;
/// Bytes of one batch's inputs: the rows and their u32 labels.
const BATCH_BYTES: u64 = (ROWS * WIDTH * 4 + ROWS * 4) as u64;

fn batch(step: usize) -> (Tensor, Tensor) {
    let x = rand(700 + step as u64, &[ROWS, WIDTH], -1.0, 1.0);
    let y: Vec<u32> = (0..ROWS)
        .map(|i| ((i * 7 + step * 3) % CLASSES) as u32)
        .collect();
    (x, Tensor::new(y, &Device::Cpu).unwrap())
}

fn layer_name(i: usize) -> String {
    format!("l{i}")
}

fn adamw() -> candle_nn::ParamsAdamW {
    candle_nn::ParamsAdamW {
        lr: 0.01,
        ..Default::default()
    }
}

/// The bits of each step's loss and of the final parameters (by name).
#[derive(Debug, PartialEq)]
struct Run {
    losses: Vec<u32>,
    params: Vec<(String, Vec<u64>)>,
}

/// The MLP in plain candle-nn.
fn plain(steps: usize) -> Run {
    let varmap = VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layers: Vec<candle_nn::Linear> = (0..DEPTH)
        .map(|i| candle_nn::linear(WIDTH, WIDTH, vb.pp(layer_name(i))).unwrap())
        .collect();
    let head = candle_nn::linear(WIDTH, CLASSES, vb.pp("head")).unwrap();
    let vars = seed_vars(&varmap);
    let mut opt =
        <candle_nn::AdamW as candle_nn::Optimizer>::new(varmap.all_vars(), adamw()).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (x, y) = batch(step);
        let mut h = x;
        for l in &layers {
            h = l.forward(&h).unwrap().relu().unwrap();
        }
        let l = candle_nn::loss::cross_entropy(&head.forward(&h).unwrap(), &y).unwrap();
        candle_nn::Optimizer::backward_step(&mut opt, &l).unwrap();
        losses.push(l.to_scalar::<f32>().unwrap().to_bits());
    }
    let params = vars
        .iter()
        .map(|(k, v)| (k.clone(), bits(v.as_tensor())))
        .collect();
    Run { losses, params }
}

/// The MLP through remat-candle.
struct Model {
    layers: Vec<nn::Linear>,
    head: nn::Linear,
    vars: Vec<(String, Var)>,
    opt: candle_nn::AdamW,
}

impl Model {
    fn new(remat: &Remat) -> candle_core::Result<(Self, VarMap)> {
        let varmap = VarMap::new();
        let vb = nn::VarBuilder::from_varmap_in(remat, &varmap, DType::F32, &Device::Cpu);
        let layers = (0..DEPTH)
            .map(|i| nn::linear(WIDTH, WIDTH, vb.pp(layer_name(i))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let head = nn::linear(WIDTH, CLASSES, vb.pp("head"))?;
        let vars = seed_vars(&varmap);
        let opt = <candle_nn::AdamW as Optimizer>::new(varmap.all_vars(), adamw())?;
        Ok((
            Self {
                layers,
                head,
                vars,
                opt,
            },
            varmap,
        ))
    }

    /// The parameters' tensors in the context.
    fn params(&self) -> Vec<&RTensor> {
        let mut out = Vec::new();
        for l in self.layers.iter().chain([&self.head]) {
            out.push(l.weight());
            out.extend(l.bias());
        }
        out
    }

    /// One step (forward, backward, AdamW through the adapter's
    /// `backward_step`): the loss's bits, and how many parameters were in the
    /// host tier when the forward ended.
    fn step(&mut self, remat: &Remat, step: usize) -> candle_core::Result<(u32, usize)> {
        let (x, y) = batch(step);
        let (x, y) = (remat.input(&x)?, remat.input(&y)?);
        let mut h = x;
        for l in &self.layers {
            h = l.forward(&h)?.relu()?;
        }
        let l = loss::cross_entropy(&self.head.forward(&h)?, &y)?;
        drop(h);
        let mut swapped = 0;
        for p in self.params() {
            swapped += usize::from(p.is_swapped()?);
        }
        self.opt.backward_step(&l)?;
        Ok((l.to_scalar::<f32>()?.to_bits(), swapped))
    }

    /// The final parameters' bits, read from the `Var`s with the parameters
    /// pinned (swapped ones are emptied in candle until brought back).
    fn param_bits(&self, remat: &Remat) -> candle_core::Result<Vec<(String, Vec<u64>)>> {
        let pinned = remat.pin_params()?;
        let out = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), bits(v.as_tensor())))
            .collect();
        drop(pinned);
        Ok(out)
    }
}

/// A context in logical mode, costs by output bytes, swap at 8 GB/s.
fn config(budget: u64, swap: bool) -> RematConfig {
    let cfg = RematConfig::new()
        .with_dtr(DtrConfig::default().with_budget_mode(BudgetMode::Logical))
        .with_cost_model(CostModel::OutputBytes)
        .with_budget_bytes(budget);
    if swap {
        cfg.with_swap(Some(8.0))
    } else {
        cfg
    }
}

/// [`Model::step`] `steps` times; the run, and the most parameters seen in
/// the host tier at the end of a forward.
fn train(remat: &Remat, steps: usize) -> candle_core::Result<(Run, usize)> {
    let (mut m, _varmap) = Model::new(remat)?;
    let mut losses = Vec::new();
    let mut most_swapped = 0;
    for step in 0..steps {
        let (loss, swapped) = m.step(remat, step)?;
        losses.push(loss);
        most_swapped = most_swapped.max(swapped);
        remat.check_invariants()?;
    }
    let params = m.param_bits(remat)?;
    Ok((Run { losses, params }, most_swapped))
}

#[test]
fn parameters_and_inputs_swap_out_between_uses_under_a_budget_they_exceed() {
    let reference = plain(STEPS);
    // The parameters and one batch's inputs alone exceed this budget; the
    // parameters fit it (an optimizer step updates them all at once).
    let budget = PARAM_BYTES + 3 * 1024;
    assert!(PARAM_BYTES + BATCH_BYTES > budget);

    let remat = Remat::new(config(budget, false)).unwrap();
    match train(&remat, STEPS) {
        Err(e) => assert!(e.is_impossible_budget(), "without swap: {e}"),
        Ok(_) => panic!("trained without swap in {budget} B"),
    }

    let remat = Remat::new(config(budget, true)).unwrap();
    assert!(remat.swap_enabled().unwrap());
    assert_eq!(remat.swap_bandwidth(), Some(8.0));
    let (run, most_swapped) = train(&remat, STEPS).unwrap();
    assert_eq!(run, reference, "with swap: not plain candle's bits");
    let s = remat.stats().unwrap();
    eprintln!(
        "budget {budget} B (parameters {PARAM_BYTES} B + batch {BATCH_BYTES} B): \
         {} swap-outs ({} B), {} swap-ins ({} B), stall {:.1} µs, peak host {} B, \
         {} evictions, {} parameters swapped after a forward",
        s.swap_outs,
        s.swapped_out_bytes,
        s.swap_ins,
        s.swapped_in_bytes,
        s.stall_ns / 1e3,
        s.peak_host_bytes,
        s.evictions,
        most_swapped
    );
    assert!(most_swapped > 0, "no parameter was swapped out");
    assert!(
        s.swap_outs > 0 && s.swap_ins > 0 && s.stall_ns > 0.0,
        "{s:?}"
    );
    assert_eq!(s.swap_failures, 0);
    assert!(remat.memory_usage().unwrap().peak_allocated <= budget);
}

#[test]
fn swap_under_a_looser_budget_is_bit_identical() {
    let reference = plain(STEPS);
    // Parameters, a batch and a third of the activations: swap serves both
    // activations and parameters.
    let budget = PARAM_BYTES + BATCH_BYTES + 16 * 1024;
    let remat = Remat::new(config(budget, true)).unwrap();
    let (run, _) = train(&remat, STEPS).unwrap();
    assert_eq!(run, reference);
    let s = remat.stats().unwrap();
    assert!(s.swap_outs > 0, "{s:?}");
    assert!(remat.memory_usage().unwrap().peak_allocated <= budget);
    let summary = remat.memory_summary().unwrap();
    assert!(summary.contains("swap outs / ins"), "{summary}");
}

#[test]
fn failed_swap_outs_lose_nothing_and_training_stays_bit_identical() {
    let reference = plain(STEPS);
    let budget = PARAM_BYTES + BATCH_BYTES + 16 * 1024;
    let remat = Remat::new(config(budget, true)).unwrap();
    remat.inject_transfer_failures(5, 0);
    let (run, _) = train(&remat, STEPS).unwrap();
    assert_eq!(run, reference);
    let s = remat.stats().unwrap();
    assert_eq!(remat.transfer_faults().pending(), (0, 0), "{s:?}");
    assert_eq!(s.swap_failures, 5, "{s:?}");
    assert!(s.swap_outs > 0);
}

#[test]
fn a_failed_swap_in_is_a_typed_error_and_the_step_runs_again() {
    let reference = plain(STEPS);
    let budget = PARAM_BYTES + 3 * 1024;
    let remat = Remat::new(config(budget, true)).unwrap();
    let (mut m, _varmap) = Model::new(&remat).unwrap();
    let mut losses = Vec::new();
    let mut failed = 0;
    for step in 0..STEPS {
        if step == 1 {
            remat.inject_transfer_failures(0, 1);
        }
        loop {
            match m.step(&remat, step) {
                Ok((loss, _)) => {
                    losses.push(loss);
                    break;
                }
                Err(e) => {
                    assert!(
                        matches!(e.dtr_error(), Some(remat_dtr::Error::Transfer(t))
                            if t.direction == "host-to-device"),
                        "expected a typed transfer error, got {e}"
                    );
                    failed += 1;
                    assert_eq!(failed, 1, "the retry failed too: {e}");
                    // Nothing lost, the device usable: the runtime's records
                    // hold, the budget too.
                    remat.check_invariants().unwrap();
                    let u = remat.memory_usage().unwrap();
                    assert!(u.allocated <= budget);
                }
            }
        }
    }
    assert_eq!(failed, 1);
    let run = Run {
        losses,
        params: m.param_bits(&remat).unwrap(),
    };
    assert_eq!(run, reference, "the retried step differs");
    let s = remat.stats().unwrap();
    assert_eq!(s.swap_failures, 1);
}

/// Elements in the candle storage behind `t` (0: emptied).
fn storage_len(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(c) => c.as_slice::<f32>().unwrap().len(),
        _ => unreachable!("CPU test"),
    }
}

#[test]
fn a_swapped_variable_is_put_back_when_the_context_lets_go() {
    let w = Var::from_tensor(&rand(5, &[64, 64], -1.0, 1.0)).unwrap();
    let before = bits(w.as_tensor());
    let x = rand(6, &[8, 64], -1.0, 1.0);
    let plain = bits(&x.matmul(w.as_tensor()).unwrap());
    {
        // Room for one 16 KiB storage and a little: the weight is swapped
        // out while the input is brought in and used.
        let remat = Remat::new(config(24 * 1024, true)).unwrap();
        let wp = remat.param(&w).unwrap();
        let xs = remat.input(&x).unwrap();
        let wide = remat.input(&rand(7, &[64, 64], -1.0, 1.0)).unwrap();
        assert!(wp.is_swapped().unwrap(), "the weight stayed resident");
        // Its memory is freed: the variable's storage is empty meanwhile.
        assert_eq!(storage_len(w.as_tensor()), 0);
        // Read through the runtime: swapped back in, the same bits.
        assert_eq!(bits(&wp.to_candle().unwrap()), before);
        let y = xs.matmul(&wp).unwrap();
        assert_eq!(bits(&y.to_candle().unwrap()), plain);
        drop((y, wide));
        // Swapped again (the wide input in), then the context goes: the
        // variable gets its data back.
        let _wide = remat.input(&rand(8, &[64, 64], -1.0, 1.0)).unwrap();
        assert!(wp.is_swapped().unwrap());
        assert_eq!(storage_len(w.as_tensor()), 0);
    }
    assert_eq!(bits(w.as_tensor()), before);
}

#[test]
fn swap_is_read_from_remat_dtr_conf_and_the_bandwidth_measured() {
    let cfg =
        RematConfig::parse("budget:100000,budget_mode:logical,swap:on,host_budget:200%").unwrap();
    assert!(cfg.dtr.swap.enabled);
    assert_eq!(
        cfg.dtr.swap.host_budget,
        Some(HostBudget::PercentOfBudget(200.0))
    );
    let remat = Remat::new(cfg).unwrap();
    let gbps = remat.swap_bandwidth().expect("measured");
    assert!(gbps.is_finite() && gbps > 0.0, "{gbps}");
    assert!(remat.swap_enabled().unwrap());
    eprintln!("measured CPU copy bandwidth: {gbps:.2} GB/s per direction");

    let cfg = RematConfig::parse("swap:on,swap_bandwidth:24").unwrap();
    assert_eq!(Remat::new(cfg).unwrap().swap_bandwidth(), Some(24.0));
    let off = Remat::new(RematConfig::parse("swap:off").unwrap()).unwrap();
    assert!(!off.swap_enabled().unwrap());
    assert_eq!(off.swap_bandwidth(), None);
    // Without swap, pinning the parameters pins nothing.
    assert!(off.pin_params().unwrap().is_empty());
}

#[test]
fn a_view_of_a_larger_input_is_never_swapped() {
    let big = rand(9, &[128, 64], -1.0, 1.0);
    let remat = Remat::new(config(40 * 1024, true)).unwrap();
    // Rows 0..64: a view sharing `big`'s storage, which holds more.
    let part = remat.input(&big.narrow(0, 0, 64).unwrap()).unwrap();
    let mut held = Vec::new();
    for k in 0..4 {
        // Each one needs another out: never the view.
        held.push(remat.input(&rand(10 + k, &[64, 64], -1.0, 1.0)).unwrap());
        assert!(!part.is_swapped().unwrap());
    }
    assert!(held[0].is_swapped().unwrap());
    // `big` kept every row.
    assert_eq!(bits(&big), bits(&rand(9, &[128, 64], -1.0, 1.0)));
    assert!(remat.stats().unwrap().swap_failures > 0);
}

/// `loss = Σ table[ids]² + Σ tanh(tanh(x·w₀)·w₁)…²`: a lookup by external
/// ids (candle's own backward reads the ids) beside a branch whose backward
/// needs room.
fn lookup_and_branch(
    table: &Tensor,
    ids: &Tensor,
    x: &Tensor,
    ws: &[Tensor],
) -> candle_core::Result<Tensor> {
    let e = table.index_select(ids, 0)?;
    let mut h = x.clone();
    for w in ws {
        h = h.matmul(w)?.tanh()?;
    }
    e.sqr()?.sum_all()? + h.sqr()?.sum_all()?
}

#[test]
fn lookup_ids_stay_readable_for_candles_own_backward() {
    let table = Var::from_tensor(&rand(20, &[256, 64], -1.0, 1.0)).unwrap();
    let ws: Vec<Var> = (0..4)
        .map(|k| Var::from_tensor(&rand(30 + k, &[64, 64], -0.3, 0.3)).unwrap())
        .collect();
    let ids_v: Vec<u32> = (0..256).map(|i| (i * 37 % 256) as u32).collect();
    let ids = || Tensor::new(ids_v.as_slice(), &Device::Cpu).unwrap();
    let x = || rand(22, &[64, 64], -1.0, 1.0);

    let wt: Vec<Tensor> = ws.iter().map(|w| w.as_tensor().clone()).collect();
    let loss = lookup_and_branch(table.as_tensor(), &ids(), &x(), &wt).unwrap();
    let grads = loss.backward().unwrap();
    let expected: Vec<Vec<u64>> = std::iter::once(&table)
        .chain(&ws)
        .map(|v| bits(grads.get(v).unwrap()))
        .collect();

    // Parameters 128 KiB, ids 1 KiB, x 16 KiB, activations 16–64 KiB: the
    // ids leave the device after the lookup. candle's own backward of the
    // lookup reads them right after the adapter's identity node above it
    // pinned them back (candle visits the two nodes one after the other).
    let remat = Remat::new(config(136 * 1024, true)).unwrap();
    let tp = remat.param(&table).unwrap();
    let wp: Vec<RTensor> = ws.iter().map(|w| remat.param(w).unwrap()).collect();
    let (ids, x) = (remat.input(&ids()).unwrap(), remat.input(&x()).unwrap());
    let e = tp.index_select(&ids, 0).unwrap();
    let mut h = x;
    for w in &wp {
        h = h.matmul(w).unwrap().tanh().unwrap();
    }
    let loss = (e.sqr().unwrap().sum_all().unwrap() + h.sqr().unwrap().sum_all().unwrap()).unwrap();
    drop((e, h));
    // Swapped between the forward and the backward, which reads them.
    assert!(ids.is_swapped().unwrap());
    let grads = loss.backward().unwrap();
    let got: Vec<Vec<u64>> = std::iter::once(&table)
        .chain(&ws)
        .map(|v| bits(grads.get(v).unwrap()))
        .collect();
    assert!(got == expected, "gradients differ from plain candle");
    let s = remat.stats().unwrap();
    assert!(s.swap_outs > 0, "{s:?}");
    remat.check_invariants().unwrap();
}
