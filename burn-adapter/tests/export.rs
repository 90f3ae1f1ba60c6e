//! `DtrDevice::export_trace`: the last recorded Burn training step written in
//! the DTR paper's trace format replays without a budget to that step's peak
//! and compute exactly, and trains in the replayer under a budget with
//! plan-ahead.

#[path = "common/model.rs"]
mod model;

use burn_ndarray::{NdArray, NdArrayDevice};
use model::{adam, train, Dims, TinyNet};
use remat_burn::{CostModel, DtrDevice, DtrOptions, Sealing};
use remat_dtr::replay::{replay, ReplayOptions, ReplayStatus};
use remat_dtr::trace::{baseline, Instruction, Trace};
use remat_dtr::{BudgetMode, DtrConfig};

type Ours = burn_autodiff::Autodiff<remat_burn::Dtr<NdArray>>;

#[test]
fn an_exported_burn_step_replays_to_its_compute_and_trains_under_a_budget() {
    let config = DtrConfig::default()
        .with_budget_mode(BudgetMode::Logical)
        .with_sampling(false);
    let options = DtrOptions::new(config).with_cost_model(CostModel::gpu());
    let device = DtrDevice::with_options(NdArrayDevice::Cpu, options).expect("device");
    device.record_iterations();
    let d = Dims::tiny();
    let model = TinyNet::<Ours>::new(&d, &device);
    train(model, &d, 3, false, &device, Sealing::new(adam(), &device));
    let stats = device.stats();
    let step = stats.last_iteration.expect("Sealing ends steps");
    let path = std::env::temp_dir().join(format!("tinynet-{}.log", std::process::id()));
    let trace = device.export_trace(&path).expect("a recorded step");
    let read = Trace::load(&path).expect("the file");
    std::fs::remove_file(&path).unwrap();
    assert_eq!(read, trace);
    assert_eq!(trace.name, "tinynet");
    let base = baseline(&read).unwrap();
    assert_eq!(
        base.compute_ns as f64, step.compute_ns,
        "the step's compute"
    );
    let r = replay(&read, &ReplayOptions::unbounded(), base.compute_ns).unwrap();
    assert_eq!(r.status, ReplayStatus::Ok);
    assert_eq!(r.peak_live_bytes, base.peak_bytes);
    // The steps are alike (Adam's state exists from the first): the run's
    // peak is the recorded step's.
    assert_eq!(
        base.peak_bytes, stats.runtime.peak_live_bytes,
        "the step's peak"
    );
    assert!(read
        .instructions
        .iter()
        .any(|i| matches!(i, Instruction::Mutate { .. } | Instruction::Call { .. })));
    let budget = base.constant_bytes + (base.peak_bytes - base.constant_bytes) / 2;
    let mut opts = ReplayOptions::unbounded();
    opts.config = DtrConfig::default()
        .with_budget(budget)
        .with_budget_mode(BudgetMode::Logical);
    opts.iterations = 3;
    let r = replay(&read, &opts, base.compute_ns).unwrap();
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.error);
    assert!(r.evictions > 0);
}
