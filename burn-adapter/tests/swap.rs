//! The host tier under Burn (issue 33): `Autodiff<Dtr<NdArray>>` trains the
//! burn-nn test model with Adam under a budget with swap on, bit for bit as
//! `Autodiff<NdArray>`; parameters and Adam state leave the device between
//! uses, so a budget they alone exceed trains with swap and fails without;
//! failed copies lose nothing (`SwapFaults`); the bandwidth is measured when
//! unset; the config keys turn it on.

#[path = "common/model.rs"]
mod model;

use std::sync::Mutex;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, Int, Tensor, TensorData};
use model::{adam, param_bits, train, Dims, TinyNet, Trace};
use remat_burn::{CostModel, Dtr, DtrDevice, DtrOptions, DtrStats, Error, Sealing, SwapFaults};
use remat_dtr::{BudgetMode, DtrConfig, HostBudget};

type Ref = Autodiff<NdArray>;
type Ours = Autodiff<Dtr<NdArray>>;
type Plain = Dtr<NdArray>;

/// NdArray's random generator is process-global: model initialization is
/// serialized and seeded. burn initializes parameters lazily (on first use):
/// `init` forces them while the lock is held.
static RNG: Mutex<()> = Mutex::new(());
const STEPS: usize = 3;

/// Parameters dominate: a wider model with a narrow convolution, so that the
/// parameters and Adam's two moments (3 × the parameters) outweigh the
/// largest op's working set.
fn dims() -> Dims {
    Dims {
        d_model: 32,
        channels: 2,
        ..Dims::tiny()
    }
}

fn options(budget: Option<u64>) -> DtrOptions {
    let mut config = DtrConfig::default()
        .with_budget_mode(BudgetMode::Logical)
        .with_sampling(false)
        .with_filter(false);
    if let Some(b) = budget {
        config = config.with_budget(b);
    }
    DtrOptions::new(config).with_cost_model(CostModel::gpu())
}

fn device(options: DtrOptions) -> DtrDevice<NdArray> {
    DtrDevice::with_options(NdArrayDevice::Cpu, options).expect("device")
}

/// `model` with its parameters initialized (burn draws them on first use).
fn init<B: burn_tensor::backend::AutodiffBackend>(model: TinyNet<B>) -> TinyNet<B> {
    let _ = param_bits(&model);
    model
}

fn reference(d: &Dims) -> Trace {
    let device = NdArrayDevice::Cpu;
    let model = {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        Ref::seed(&device, 7);
        init(TinyNet::<Ref>::new(d, &device))
    };
    train(model, d, STEPS, true, &device, adam())
}

/// Train on `device`; `Err` with the typed error when the run failed.
fn ours(d: &Dims, device: &DtrDevice<NdArray>) -> Result<Trace, Option<Error>> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let model = {
            let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
            Ours::seed(device, 7);
            init(TinyNet::<Ours>::new(d, device))
        };
        train(model, d, STEPS, true, device, Sealing::new(adam(), device))
    }));
    let error = device.take_error();
    match run {
        Ok(trace) if error.is_none() => Ok(trace),
        _ => Err(error),
    }
}

/// Bytes of the model's parameters.
fn param_bytes(d: &Dims) -> u64 {
    let device = NdArrayDevice::Cpu;
    let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
    Ref::seed(&device, 7);
    let model = TinyNet::<Ref>::new(d, &device);
    param_bits(&model).iter().map(|p| p.len() as u64 * 4).sum()
}

fn assert_identical(what: &str, got: &Trace, want: &Trace) {
    assert_eq!(got.losses, want.losses, "{what}: losses differ");
    assert_eq!(got.grads, want.grads, "{what}: gradients differ");
    assert_eq!(got.params, want.params, "{what}: parameters differ");
}

fn peak_unbounded(d: &Dims) -> DtrStats {
    let unbounded = device(options(None));
    ours(d, &unbounded).expect("unbounded run");
    unbounded.stats()
}

#[test]
fn training_with_swap_is_bit_identical_and_swaps_parameters_and_adam_state() {
    let d = dims();
    let want = reference(&d);
    let peak = peak_unbounded(&d).memory.peak_allocated;
    for percent in [50u64, 30] {
        let budget = peak * percent / 100;
        // 24 GB/s (PCIe 4.0 ×16): decisions do not depend on this machine.
        let dev = device(options(Some(budget)).with_swap_bandwidth(24.0));
        let got = ours(&d, &dev).unwrap_or_else(|e| panic!("{percent} %: {e:?}"));
        assert_identical(&format!("{percent} %"), &got, &want);
        let s = dev.stats();
        eprintln!("{percent} %: {s}");
        let r = &s.runtime;
        assert!(r.swap_outs > 0 && r.swap_ins > 0, "{percent} %: {s}");
        assert!(
            r.swapped_out_bytes > 0 && r.stall_ns > 0.0,
            "{percent} %: {s}"
        );
        assert_eq!(r.swap_failures, 0);
        assert!(s.memory.peak_allocated <= budget, "{percent} %: {s}");
        assert_eq!(dev.swap_bandwidth(), Some(24.0));
        dev.check_invariants().expect("invariants");
    }
}

#[test]
fn a_budget_below_the_parameters_and_adam_state_trains_only_with_swap() {
    let d = dims();
    let params = param_bytes(&d);
    // Parameters and Adam's two moments: 3 × the parameters, all roots
    // between steps. Two thirds of that cannot hold them.
    let budget = 2 * params;
    let without = device(options(Some(budget)));
    match ours(&d, &without) {
        Err(Some(e)) => assert!(e.impossible_budget().is_some(), "{e}"),
        Err(None) => panic!("the run failed without a typed error"),
        Ok(_) => panic!("trained without swap under {budget} B (parameters {params} B)"),
    }
    let want = reference(&d);
    let dev = device(options(Some(budget)).with_swap_bandwidth(24.0));
    let got = ours(&d, &dev).unwrap_or_else(|e| panic!("with swap: {e:?}"));
    assert_identical("with swap", &got, &want);
    let s = dev.stats();
    eprintln!("parameters {params} B, budget {budget} B: {s}");
    assert!(s.memory.peak_allocated <= budget);
    // The roots alone need 3 × the parameters: at least the third that does
    // not fit was in the host tier at once.
    assert!(s.runtime.peak_host_bytes >= params, "{s}");
    assert!(s.runtime.swapped_out_bytes > budget, "{s}");
    dev.check_invariants().expect("invariants");
}

/// Between steps, what is live is the parameters and Adam's state: with the
/// model held, the host tier holds roots.
#[test]
fn between_steps_the_host_tier_holds_parameters_and_optimizer_state() {
    use burn_nn::loss::CrossEntropyLossConfig;
    use burn_optim::{GradientsParams, Optimizer};

    let d = dims();
    let budget = 2 * param_bytes(&d);
    let dev = device(options(Some(budget)).with_swap_bandwidth(24.0));
    let mut model = {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        Ours::seed(&dev, 7);
        init(TinyNet::<Ours>::new(&d, &dev))
    };
    let mut optim = Sealing::new(adam(), &dev);
    let loss_fn = CrossEntropyLossConfig::new().init(&dev);
    for step in 0..2 {
        let (tokens, labels) = model::batch::<Ours>(&d, step, &dev);
        let loss = loss_fn.forward(model.forward(tokens), labels);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    assert!(dev.take_error().is_none());
    let s = dev.stats();
    eprintln!("{s}; swapped {} (roots {})", s.swapped, s.swapped_roots);
    assert!(s.swapped_roots > 0, "{s}");
    assert_eq!(s.swapped, s.swapped_roots, "only roots are live: {s}");
}

#[test]
fn a_failed_swap_out_leaves_the_value_resident_and_training_stays_identical() {
    let d = dims();
    let want = reference(&d);
    let faults = SwapFaults::new();
    let budget = 2 * param_bytes(&d);
    let dev = device(
        options(Some(budget))
            .with_swap_bandwidth(24.0)
            .with_swap_faults(faults.clone()),
    );
    // The first 20 swap-outs fail: each leaves its value resident and the
    // runtime frees memory another way.
    faults.fail_swap_outs(20);
    let got = ours(&d, &dev).unwrap_or_else(|e| panic!("{e:?}"));
    assert_identical("failed swap-outs", &got, &want);
    assert_eq!(faults.injected(), 20);
    assert_eq!(faults.pending_swap_outs(), 0);
    let s = dev.stats();
    assert_eq!(s.runtime.swap_failures, 20, "{s}");
    assert!(s.runtime.swap_outs > 0, "{s}");
    dev.check_invariants().expect("invariants");
}

fn floats(t: Tensor<Plain, 1>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 data")
}

/// Four uploads of 4 000 B under a 12 000 B budget: one is always in the host
/// tier.
fn four_uploads(faults: &SwapFaults) -> (DtrDevice<NdArray>, Vec<Tensor<Plain, 1>>, Vec<Vec<f32>>) {
    let dev = device(
        options(Some(12_000))
            .with_swap_bandwidth(24.0)
            .with_swap_faults(faults.clone()),
    );
    let values: Vec<Vec<f32>> = (0..4)
        .map(|k| (0..1000).map(|i| (i * (k + 1)) as f32 * 0.25).collect())
        .collect();
    let ts: Vec<Tensor<Plain, 1>> = values
        .iter()
        .map(|v| Tensor::from_data(TensorData::new(v.clone(), [1000]), &dev))
        .collect();
    assert!(dev.take_error().is_none());
    assert_eq!(dev.stats().swapped, 1);
    (dev, ts, values)
}

#[test]
fn a_failed_swap_in_is_a_typed_error_the_device_goes_on_and_a_retry_succeeds() {
    let faults = SwapFaults::new();
    let (dev, ts, values) = four_uploads(&faults);
    faults.fail_swap_ins(1);
    // Reading each: the one read that needs a copy back fails, typed.
    let reads: Vec<_> = ts.iter().map(|t| t.clone().try_into_data()).collect();
    let failed: Vec<usize> = (0..4).filter(|&k| reads[k].is_err()).collect();
    assert_eq!(failed.len(), 1, "{reads:?}");
    let k = failed[0];
    let text = reads[k].as_ref().unwrap_err().to_string();
    assert!(text.contains("host-to-device"), "{text}");
    let e = dev.take_error().expect("typed error");
    let transfer = e.transfer().expect("a transfer error");
    assert_eq!(
        (transfer.direction, transfer.bytes),
        ("host-to-device", 4000)
    );
    assert!(transfer.message.contains("injected"), "{transfer:?}");
    dev.check_invariants().expect("invariants");
    // Nothing was lost: every tensor reads back its value, the failed one too.
    for (t, v) in ts.iter().zip(&values) {
        assert_eq!(&floats(t.clone()), v);
    }
    assert!(dev.take_error().is_none());

    // An op that needs a swapped input while the copy back fails: its output
    // is not computed, the error is typed; the same op again succeeds.
    faults.fail_swap_ins(1);
    let mut failed_op = None;
    for (k, t) in ts.iter().enumerate() {
        let y = t.clone() + 1.0;
        if y.try_into_data().is_err() {
            failed_op = Some(k);
            break;
        }
    }
    let k = failed_op.expect("one op needed a copy back");
    let e = dev.take_error().expect("typed error");
    assert_eq!(e.transfer().map(|t| t.direction), Some("host-to-device"));
    let want: Vec<f32> = values[k].iter().map(|v| v + 1.0).collect();
    assert_eq!(floats(ts[k].clone() + 1.0), want);
    assert!(dev.take_error().is_none());
    dev.check_invariants().expect("invariants");
    assert_eq!(faults.injected(), 2);
    let s = dev.stats();
    assert_eq!(s.runtime.swap_failures, 2, "{s}");
}

#[test]
fn the_bandwidth_is_measured_when_unset_and_reported() {
    let dev = device(options(Some(1 << 20)).with_swap());
    let gbps = dev.swap_bandwidth().expect("measured");
    assert!(gbps.is_finite() && gbps > 0.0, "{gbps}");
    eprintln!("measured {gbps:.2} GB/s per direction");
    // Swap off: none.
    let off = device(options(Some(1 << 20)));
    assert_eq!(off.swap_bandwidth(), None);
    // A bad bandwidth is a config error naming the key, on first use.
    let bad = device(options(Some(1 << 20)).with_swap_bandwidth(-1.0));
    let x = Tensor::<Plain, 1>::ones([4], &bad);
    assert!(x.try_into_data().is_err());
    let e = bad.take_error().expect("config error");
    assert!(e.to_string().contains("swap_bandwidth"), "{e}");
}

#[test]
fn the_config_keys_turn_swap_on_with_a_host_budget() {
    let config = DtrConfig::parse("budget:12000,budget_mode:logical,swap:on,host_budget:4000")
        .expect("keys parse");
    assert!(config.swap.enabled && config.swap.bandwidth_gbps.is_none());
    assert_eq!(config.swap.host_budget, Some(HostBudget::Bytes(4000)));
    let dev = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
    let ts: Vec<Tensor<Plain, 1>> = (0..4)
        .map(|k| Tensor::ones([1000], &dev) * (k as f32))
        .collect();
    assert!(dev.swap_bandwidth().is_some(), "measured at start-up");
    for (k, t) in ts.iter().enumerate() {
        assert_eq!(floats(t.clone()), vec![k as f32; 1000]);
    }
    let s = dev.stats();
    assert!(s.runtime.peak_host_bytes <= 4000, "{s}");
    assert!(dev.take_error().is_none());
}

#[test]
fn int_and_bool_tensors_round_trip_through_the_host_tier() {
    let dev = device(options(Some(6_000)).with_swap_bandwidth(24.0));
    let ints: Vec<i64> = (0..250).map(|i| i * 7 - 300).collect();
    let bools: Vec<bool> = (0..1000).map(|i| i % 3 == 0).collect();
    let i = Tensor::<Plain, 1, Int>::from_data(TensorData::new(ints.clone(), [250]), &dev);
    let b = Tensor::<Plain, 1, Bool>::from_data(TensorData::new(bools.clone(), [1000]), &dev);
    // Two uploads as large as the budget (roots, not recomputable): each
    // pushes everything else to the host tier.
    let fill = || Tensor::<Plain, 1>::from_data(TensorData::new(vec![0.5f32; 1500], [1500]), &dev);
    let f = [fill(), fill()];
    let s = dev.stats();
    assert_eq!(s.swapped, 3, "{s}");
    assert_eq!(i.into_data().to_vec::<i64>().unwrap(), ints);
    assert_eq!(b.into_data().to_vec::<bool>().unwrap(), bools);
    assert_eq!(dev.stats().runtime.swap_ins, 2);
    drop(f);
    assert!(dev.take_error().is_none());
    dev.check_invariants().expect("invariants");
}
