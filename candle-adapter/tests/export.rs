//! `Remat::export_trace`: a recorded training step written in the DTR paper's
//! trace format replays, without a budget, to the step's peak of live bytes
//! and its compute exactly; and the file trains under a budget in the replayer.

mod common;

use candle_core::{DType, Device};
use candle_nn::VarMap;
use common::rand;
use remat_candle::dtr::replay::{replay, ReplayOptions, ReplayStatus};
use remat_candle::dtr::trace::{baseline, Instruction, Trace};
use remat_candle::nn::{self, Module, Optimizer};
use remat_candle::{BudgetMode, CandleErrorExt, DtrConfig, Remat, RematConfig};

/// Two steps of a small MLP (a view, a dropout, a loss read after the step),
/// the second recorded: the context, that step's compute (ns) and the run's
/// peak of live bytes.
fn train(remat: &Remat) -> (f64, u64) {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = nn::VarBuilder::from_varmap_in(remat, &varmap, DType::F32, &dev);
    let l1 = nn::linear(16, 64, vb.pp("l1")).unwrap();
    let l2 = nn::linear(64, 64, vb.pp("l2")).unwrap();
    let l3 = nn::linear(64, 4, vb.pp("l3")).unwrap();
    let mut opt = nn::SGD::new(varmap.all_vars(), 0.1).unwrap();
    let x = remat.input(&rand(1, &[32, 16], -1.0, 1.0)).unwrap();
    remat.end_iteration().unwrap();
    let mut compute = 0.0;
    for _ in 0..2 {
        let h = l1.forward(&x).unwrap().relu().unwrap();
        let h = l2
            .forward(&h)
            .unwrap()
            .dropout(0.1)
            .unwrap()
            .gelu()
            .unwrap();
        let y = l3.forward(&h.reshape((32, 64)).unwrap()).unwrap();
        let loss = y.sqr().unwrap().mean_all().unwrap();
        let grads = loss.backward().unwrap();
        let _ = loss.to_scalar::<f32>().unwrap();
        drop((h, y, loss));
        opt.step(&grads).unwrap();
        compute = remat.end_iteration().unwrap().compute_ns;
    }
    (compute, remat.stats().unwrap().peak_live_bytes)
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{name}-{}-step.log", std::process::id()))
}

#[test]
fn an_exported_step_replays_to_its_peak_and_compute_exactly() {
    let remat = Remat::unbounded().unwrap();
    remat.record_iterations().unwrap();
    let (compute, peak) = train(&remat);
    let path = temp("mlp");
    let trace = remat.export_trace(&path).unwrap();
    let read = Trace::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(read, trace);
    assert_eq!(trace.name, "mlp");
    let base = baseline(&read).unwrap();
    assert_eq!(base.compute_ns as f64, compute);
    assert_eq!(base.peak_bytes, peak);
    let r = replay(&read, &ReplayOptions::unbounded(), base.compute_ns).unwrap();
    assert_eq!(r.status, ReplayStatus::Ok);
    assert_eq!(
        (r.peak_live_bytes, r.total_compute_ns as f64),
        (peak, compute)
    );
    // The ops under their names, and the constants.
    let ins = &read.instructions;
    let op = |name: &str| {
        ins.iter()
            .any(|i| matches!(i, Instruction::Call { op, .. } if op == name))
    };
    assert!(op("matmul") || op("linear"), "no linear op in the trace");
    assert!(op("dropout"), "no dropout in the trace");
    // (remat-candle's views share their base's runtime handle: no `ALIAS k`.)
    assert!(ins
        .iter()
        .any(|i| matches!(i, Instruction::Constant { .. })));
}

#[test]
fn an_exported_step_trains_in_the_replayer_under_a_budget() {
    let remat = Remat::unbounded().unwrap();
    remat.record_iterations().unwrap();
    let (_, peak) = train(&remat);
    let path = temp("mlp-budget");
    let trace = remat.export_trace(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let base = baseline(&trace).unwrap();
    let budget = base.constant_bytes + (peak - base.constant_bytes) / 2;
    let mut opts = ReplayOptions::unbounded();
    opts.config = DtrConfig::default()
        .with_budget(budget)
        .with_budget_mode(BudgetMode::Logical);
    opts.iterations = 3;
    let r = replay(&trace, &opts, base.compute_ns).unwrap();
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.error);
    assert!(r.evictions > 0);
}

#[test]
fn exporting_needs_a_recorded_step_and_a_writable_path() {
    let remat = Remat::new(RematConfig::new()).unwrap();
    let e = remat.export_trace(temp("none")).unwrap_err();
    assert!(
        matches!(
            e.dtr_error(),
            Some(remat_candle::dtr::Error::NotRecorded { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("record_iterations"), "{e}");
    remat.record_iterations().unwrap();
    train(&remat);
    let e = remat.export_trace("/nonexistent-dir/step.log").unwrap_err();
    assert!(e.to_string().contains("/nonexistent-dir/step.log"), "{e}");
}
