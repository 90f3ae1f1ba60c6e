//! Training steps as iterations (`Remat::end_iteration`): a value evicted in an
//! ended step is a typed stale-value error, never a recompute from updated
//! weights; repeated steps follow a plan; a step with another shape falls back,
//! stays bit-identical and is planned again.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};
use common::{bits, logical_remat, rand, seed_vars};
use remat_candle::nn::{self, loss, Module};
use remat_candle::{BudgetMode, CandleErrorExt, CostModel, IterationReport, Remat, RematConfig};

#[test]
fn a_value_evicted_before_end_iteration_is_stale_after_it() {
    let remat = Remat::unbounded().unwrap();
    let w = Var::from_tensor(&rand(1, &[8, 8], -1.0, 1.0)).unwrap();
    let wp = remat.param(&w).unwrap();
    let x = remat.input(&rand(2, &[4, 8], -1.0, 1.0)).unwrap();
    let h = x.matmul(&wp).unwrap().tanh().unwrap();
    let loss = h.sqr().unwrap().sum_all().unwrap();
    let kept = h.exp().unwrap();
    let kept_value = bits(&kept.to_candle().unwrap());
    assert!(loss.evict().unwrap());
    remat.end_iteration().unwrap();
    // The optimizer updates the weights in place: a recompute would differ.
    w.set(&rand(3, &[8, 8], -1.0, 1.0)).unwrap();
    match loss.to_scalar::<f32>() {
        // The runtime's typed error, carried inside candle's.
        Err(e) if matches!(e.dtr_error(), Some(remat_dtr::Error::StaleValue { .. })) => {}
        other => panic!("expected a stale-value error, got {other:?}"),
    }
    // A value left resident is still the one computed before the update.
    assert_eq!(bits(&kept.to_candle().unwrap()), kept_value);
}

fn batch(step: usize) -> (Tensor, Tensor) {
    let rows = if step == 4 { 8 } else { 16 };
    let x = rand(100 + step as u64, &[rows, 32], -1.0, 1.0);
    let y: Vec<u32> = (0..rows)
        .map(|i| ((i * 7 + step * 3) % 10) as u32)
        .collect();
    (x, Tensor::new(y, &Device::Cpu).unwrap())
}

/// What [`try_train`] returns: the bits of each step's loss, then of the final
/// weights (by name), the reports, the peak and the
/// smallest budget asked for.
type Trained = (Vec<u32>, Vec<IterationReport>, u64, Option<u64>);

/// `steps` AdamW steps of an MLP; step 4 has half the batch. Returns the bits
/// of the losses and final weights, the reports, the peak and, with
/// `floor_at`, the smallest budget at
/// that overhead (every step recorded).
fn train(budget: Option<u64>, steps: usize, floor_at: Option<f64>) -> Trained {
    try_train(budget, steps, floor_at).unwrap()
}

/// [`train`], with a failed step as an error.
fn try_train(
    budget: Option<u64>,
    steps: usize,
    floor_at: Option<f64>,
) -> candle_core::Result<Trained> {
    let remat = logical_remat(budget);
    if floor_at.is_some() {
        remat.record_iterations()?;
    }
    let (l, r, p) = try_train_with(&remat, steps)?;
    let floor = match floor_at {
        Some(x) => Some(remat.min_feasible_budget(x)?),
        None => None,
    };
    Ok((l, r, p, floor))
}

/// The steps of [`train`] in `remat`: the bits of the losses and final
/// weights, the reports, the peak.
fn try_train_with(
    remat: &Remat,
    steps: usize,
) -> candle_core::Result<(Vec<u32>, Vec<IterationReport>, u64)> {
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap_in(remat, &varmap, DType::F32, &Device::Cpu);
    let l1 = nn::linear(32, 64, vb.pp("l1"))?;
    let l2 = nn::linear(64, 64, vb.pp("l2"))?;
    let l3 = nn::linear(64, 10, vb.pp("l3"))?;
    let vars = seed_vars(&varmap);
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let mut losses = Vec::new();
    let mut reports = Vec::new();
    for step in 0..steps {
        let (x, y) = batch(step);
        let (x, y) = (remat.input(&x)?, remat.input(&y)?);
        let h1 = l1.forward(&x)?.relu()?;
        let h = l2.forward(&h1)?.gelu()?;
        let l = loss::cross_entropy(&l3.forward(&h)?, &y)?;
        let grads = l.backward()?;
        losses.push(l.to_scalar::<f32>()?.to_bits());
        drop((l, h, h1, x, y));
        opt.step(&grads)?;
        drop(grads);
        reports.push(remat.end_iteration()?);
        remat.check_invariants()?;
    }
    // Then the final weights: equal runs trained bit-identically to the end,
    // the last update included.
    for (_, v) in &vars {
        losses.extend(bits(v.as_tensor()).into_iter().map(|b| b as u32));
    }
    let peak = remat.memory_usage()?.peak_allocated;
    Ok((losses, reports, peak))
}

#[test]
fn a_step_with_another_shape_falls_back_stays_identical_and_is_planned_again() {
    let (free, _, peak, _) = train(None, 8, None);
    // Parameters and one batch are external; half the activations fit.
    let external = (32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10) * 4 + 16 * 32 * 4 + 16 * 4;
    let (losses, reports, _, _) = train(Some(external + (peak - external) / 2), 8, None);
    assert_eq!(losses, free, "losses or final weights differ");
    assert!(
        reports.iter().any(|r| r.evictions > 0),
        "the budget must bind: {reports:?}"
    );
    // Steps 2 and 3 repeat step 1: planned, no divergence. Step 4 has another
    // shape: it leaves its plan. Step 5 is planned from what step 4 ran, so it
    // leaves its plan in turn; steps 6 and 7 follow theirs again.
    for r in [&reports[2], &reports[3], &reports[6], &reports[7]] {
        assert!(r.planned && r.divergences == 0, "{r:?}");
    }
    for r in [&reports[4], &reports[5]] {
        assert!(r.planned && r.divergences == 1, "{r:?}");
    }
}

#[test]
fn the_smallest_budget_query_answers_a_budget_that_trains() {
    // An unbudgeted run records its steps and asks for the smallest budget at
    // which a step costs at most twice its computations.
    let (free, _, peak, floor) = train(None, 4, Some(2.0));
    let floor = floor.unwrap();
    assert!(
        floor < peak,
        "replays let a step fit below its peak ({floor} vs {peak} B)"
    );
    // Every step trains there, bit-identically. (remat-burn's test checks
    // the steady step's replay cost too.)
    let (losses, reports, used, _) = train(Some(floor), 4, None);
    assert_eq!(losses, free, "bit-identical at the floor");
    assert!(used <= floor);
    assert_eq!(reports.len(), 4);
    // Brute force with real runs, every 256 B up to the peak: the answer is
    // the lower edge of the budgets that train with their last step within
    // 2×: every one from the answer up does, the answer less one f32 does not.
    // Feasibility is not monotone in the budget (a plan made for a smaller
    // budget can be cheaper), so budgets below the answer may train too: the
    // query bisects, and does not look for them.
    let trains = |b: u64| match try_train(Some(b), 4, None) {
        Ok((_, r, _, _)) => {
            let last = r.last().unwrap();
            last.compute_ns + last.remat_ns <= 2.0 * last.compute_ns
        }
        Err(e) if e.impossible_budget().is_some() => false,
        Err(e) => panic!("at {b} B: {e}"),
    };
    assert!(!trains(floor - 4), "the answer less 4 B trains");
    let grid: Vec<u64> = (1..).map(|k| 256 * k).take_while(|&b| b <= peak).collect();
    for &b in grid.iter().filter(|&&b| b >= floor).chain([&floor]) {
        assert!(
            trains(b),
            "{b} B, above the answer {floor} B, does not train"
        );
    }
    let lowest = grid.iter().find(|&&b| trains(b));
    eprintln!("answer {floor} B; the smallest budget on the 256-B grid that trains: {lowest:?}");
    // A query that cannot be answered says why, typed.
    let remat = Remat::unbounded().unwrap();
    let e = remat.min_feasible_budget(2.0).unwrap_err();
    assert!(
        matches!(e.dtr_error(), Some(remat_dtr::Error::NotRecorded { .. })),
        "{e}"
    );
    let e = remat.min_feasible_budget(0.5).unwrap_err();
    assert!(
        matches!(
            e.dtr_error(),
            Some(remat_dtr::Error::InvalidArgument { .. })
        ),
        "{e}"
    );
}

#[test]
fn constants_stay_readable_and_backward_step_drops_what_only_the_graph_holds() {
    // A large budget: the drop after `backward_step` runs under a budget only.
    let remat = logical_remat(Some(1 << 30));
    let w = Var::from_tensor(&rand(1, &[8, 8], -1.0, 1.0)).unwrap();
    let wp = remat.param(&w).unwrap();
    // A label conversion, computed from an input only: a constant.
    let labels = remat
        .input(&Tensor::new(&[1u8, 2, 3, 4], &Device::Cpu).unwrap())
        .unwrap();
    let labels32 = labels.to_dtype(DType::U32).unwrap();
    assert!(labels32.is_constant());
    let x = remat.input(&rand(2, &[4, 8], -1.0, 1.0)).unwrap();
    let h = x.matmul(&wp).unwrap();
    assert!(!h.is_constant(), "computed from a parameter");
    let kept = h.tanh().unwrap();
    let kept_value = bits(&kept.to_candle().unwrap());
    let loss = kept.sqr().unwrap().sum_all().unwrap();
    assert!(labels32.evict().unwrap());
    // From here only the graph holds `h` (and `kept.sqr()`).
    drop(h);
    let before = remat.memory_usage().unwrap().allocated;
    let mut opt = candle_nn::SGD::new(vec![w.clone()], 0.1).unwrap();
    nn::Optimizer::backward_step(&mut opt, &loss).unwrap();
    // The constant was restored at the boundary instead of going stale.
    assert_eq!(labels32.to_vec1::<u32>().unwrap(), vec![1, 2, 3, 4]);
    // What the user holds stays readable, with the values of the step.
    loss.to_scalar::<f32>().unwrap();
    assert_eq!(bits(&kept.to_candle().unwrap()), kept_value);
    // What only the graph held was evicted: 2 × 128 B out, 16 B of labels in.
    let after = remat.memory_usage().unwrap().allocated;
    assert!(
        after < before,
        "{after} B after the step, {before} B before"
    );
}

#[test]
fn a_small_model_trains_in_the_default_mode_at_its_logical_floor_plus_the_margin() {
    // The logical floor: the smallest logical budget whose step finishes
    // within the first-iteration limit (20×).
    let (free, _, peak, floor) = train(None, 4, Some(20.0));
    let floor = floor.unwrap();
    // The physical model rounds each storage to 512 B: the stated margin is
    // 512 B per storage resident at once. This step holds at most 24: six
    // parameters, its two inputs, and 16 values of its 8-op forward and their
    // gradients' inputs.
    let margin = 512 * 24;
    let cfg = RematConfig::new()
        .with_cost_model(CostModel::OutputBytes)
        .with_budget_bytes(floor + margin);
    assert_eq!(
        cfg.dtr.budget_mode,
        BudgetMode::Physical,
        "the default mode"
    );
    let remat = Remat::new(cfg).unwrap();
    let (losses, _, used) = try_train_with(&remat, 4)
        .unwrap_or_else(|e| panic!("physical at {floor} + {margin} B: {e}"));
    assert_eq!(losses, free, "bit-identical");
    assert!(used <= floor + margin && floor + margin < peak);
    // Below 2 MiB: PyTorch's segment layout alone could not hold it.
    assert_eq!(remat.stats().unwrap().arena_fallbacks, 1);
}
