//! `Autodiff<Dtr<NdArray>>` against `Autodiff<NdArray>`, bit for bit, plus views,
//! non-recomputable ops, the impossible-budget error and leak checks.

#[path = "common/model.rs"]
mod model;

use std::sync::Mutex;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use burn_tensor::{Distribution, Int, Tensor, TensorData};
use model::{adam, param_bits, train, train_batches, Dims, TinyNet, Trace};
use remat_burn::{CostModel, Dtr, DtrDevice, DtrOptions, Sealing};
use remat_dtr::{BudgetMode, DtrConfig};

type Ref = Autodiff<NdArray>;
type Ours = Autodiff<Dtr<NdArray>>;
type Plain = Dtr<NdArray>;

/// NdArray's random generator is process-global: model initialization (the only
/// random use) is serialized and seeded.
static RNG: Mutex<()> = Mutex::new(());
const STEPS: usize = 3;

/// A device with deterministic eviction decisions: costs from the IR (not the
/// clock), a full scan of the candidates, the default policy (`remat`; its
/// first step at 30 % replays more than MSPS would, and the steps after it
/// follow a plan; see docs/burn.md).
fn dtr_device(budget: Option<u64>) -> DtrDevice<NdArray> {
    let mut config = DtrConfig::default()
        .with_budget_mode(BudgetMode::Logical)
        .with_sampling(false)
        .with_filter(false);
    if let Some(b) = budget {
        config = config.with_budget(b);
    }
    let options = DtrOptions::new(config).with_cost_model(CostModel::gpu());
    DtrDevice::with_options(NdArrayDevice::Cpu, options).expect("device")
}

fn bits<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<u32> {
    t.into_data()
        .to_vec::<f32>()
        .expect("f32")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn reference(d: &Dims) -> (Vec<Vec<u32>>, Trace) {
    let device = NdArrayDevice::Cpu;
    let (model, init) = {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        Ref::seed(&device, 7);
        let model = TinyNet::<Ref>::new(d, &device);
        let init = param_bits(&model);
        (model, init)
    };
    (init, train(model, d, STEPS, true, &device, adam()))
}

fn ours(d: &Dims, device: &DtrDevice<NdArray>) -> (Vec<Vec<u32>>, Trace) {
    let (model, init) = {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        Ours::seed(device, 7);
        let model = TinyNet::<Ours>::new(d, device);
        let init = param_bits(&model);
        (model, init)
    };
    let optim = Sealing::new(adam(), device);
    (init, train(model, d, STEPS, true, device, optim))
}

#[test]
fn training_is_bit_identical_at_100_50_30_percent() {
    // Twelve blocks: activations dominate the peak (as in the deep models DTR
    // is for), so 30 % of it stays above the largest op's working set plus the
    // parameters and Adam state. With four blocks it does not: the run ends in
    // a typed ImpossibleBudget whatever the policy.
    let d = Dims {
        blocks: 12,
        ..Dims::tiny()
    };
    let (ref_init, ref_trace) = reference(&d);

    let unbounded = dtr_device(None);
    let (init, trace) = ours(&d, &unbounded);
    assert_eq!(init, ref_init, "initial parameters differ");
    assert_eq!(trace, ref_trace, "unbounded run differs");
    let peak = unbounded.stats().memory.peak_allocated;
    assert!(peak > 0);
    assert_eq!(unbounded.stats().runtime.evictions, 0);

    for percent in [100u64, 50, 30] {
        let device = dtr_device(Some(peak * percent / 100));
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ours(&d, &device)));
        let stats = device.stats();
        let error = device.take_error();
        let (init, trace) = match run {
            Ok(x) if error.is_none() => x,
            _ => panic!("{percent} %: run failed: {error:?}"),
        };
        assert_eq!(init, ref_init, "{percent} %: initial parameters differ");
        assert_eq!(trace.losses, ref_trace.losses, "{percent} %: losses differ");
        assert_eq!(
            trace.grads, ref_trace.grads,
            "{percent} %: gradients differ"
        );
        assert_eq!(
            trace.params, ref_trace.params,
            "{percent} %: parameters differ"
        );
        assert!(stats.memory.peak_allocated <= peak * percent / 100);
        if percent < 100 {
            assert!(stats.runtime.evictions > 0, "{percent} %: no eviction");
            assert!(
                stats.runtime.rematerializations > 0,
                "{percent} %: no replay"
            );
        }
        eprintln!("{percent} %: {}", stats.runtime);
        // Sealing ends an iteration after each step: the first two run online
        // (the first creates Adam's state), the third follows a plan.
        let last = stats
            .last_iteration
            .as_ref()
            .expect("Sealing ends iterations");
        assert!(
            last.planned,
            "{percent} %: the last step ran online: {last:?}"
        );
        assert_eq!(last.divergences, 0, "{percent} %: {last:?}");
        assert_eq!(stats.runtime.iterations, STEPS as u64);
        device.check_invariants().expect("invariants");
    }
}

/// A step with another batch size leaves the plan made from the step before
/// (a divergence), runs online, stays bit-identical, and later steps are
/// planned again.
#[test]
fn a_step_with_another_batch_shape_falls_back_and_stays_identical() {
    let d = Dims::tiny();
    let steps = 8;
    let batch_of = |step: usize| if step == 4 { d.batch / 2 } else { d.batch };
    let device = NdArrayDevice::Cpu;
    let (model, _) = {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        Ref::seed(&device, 7);
        let model = TinyNet::<Ref>::new(&d, &device);
        let init = param_bits(&model);
        (model, init)
    };
    let reference = train_batches(model, &d, steps, false, &device, adam(), batch_of);

    let peak = {
        let unbounded = dtr_device(None);
        let _ = ours(&d, &unbounded);
        unbounded.stats().memory.peak_allocated
    };
    let dtr = dtr_device(Some(peak / 2));
    let model = {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        Ours::seed(&dtr, 7);
        TinyNet::<Ours>::new(&d, &dtr)
    };
    let optim = Sealing::new(adam(), &dtr);
    let run = train_batches(model, &d, steps, false, &dtr, optim, batch_of);
    assert!(dtr.take_error().is_none());
    assert_eq!(run.losses, reference.losses, "losses differ");
    assert_eq!(run.params, reference.params, "parameters differ");
    let stats = dtr.stats();
    assert!(stats.runtime.divergences >= 1, "{:?}", stats.runtime);
    let last = stats.last_iteration.expect("Sealing ends iterations");
    assert!(last.planned && last.divergences == 0, "{last:?}");
}

#[test]
fn ops_and_views_match_ndarray() {
    fn run<B: Backend>(device: &B::Device) -> Vec<Vec<u32>> {
        let data: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::<B, 1>::from_data(TensorData::new(data, [24]), device);
        let m = x.clone().reshape([4, 6]);
        let p = m.clone().swap_dims(0, 1); // [6, 4]
        let s = p.clone().slice([1..5, 0..4]); // [4, 4]
        let e = s.clone().sum_dim(0).expand([3, 4]); // [3, 4]
        let mm = e.clone().matmul(s.clone().exp());
        let mask = mm.clone().greater_elem(0.5);
        let masked = mm.clone().mask_fill(mask, -1.0);
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![2i64, 0, 1], [3]), device);
        let sel = masked.clone().select(0, idx);
        let cat = Tensor::cat(vec![sel.clone(), e.clone().flip([1])], 0);
        vec![
            bits(m),
            bits(p),
            bits(s),
            bits(e),
            bits(mm),
            bits(masked),
            bits(sel),
            bits(cat.permute([1, 0]).tanh()),
        ]
    }
    let reference = run::<NdArray>(&NdArrayDevice::Cpu);
    let device = dtr_device(None);
    assert_eq!(run::<Plain>(&device), reference);
    // Again with everything evicted before each read.
    let device = dtr_device(Some(1 << 20));
    let _ = device.evict_all().expect("evict");
    assert_eq!(run::<Plain>(&device), reference);
    assert!(device.take_error().is_none());
}

#[test]
fn views_are_aliases_of_one_storage() {
    let device = dtr_device(None);
    let x = Tensor::<Plain, 2>::ones([64, 64], &device) * 2.0;
    let before = device.stats();
    let v = x
        .clone()
        .reshape([32, 128])
        .swap_dims(0, 1)
        .slice([0..64, 0..16]);
    let after = device.stats();
    assert_eq!(after.views, before.views + 3);
    assert_eq!(after.records, before.records, "a view made a record");
    assert_eq!(
        after.memory.allocated, before.memory.allocated,
        "a view took bytes"
    );
    // Evicting the base evicts the views' memory with it; reading a view replays it.
    let y = x.clone() + 1.0;
    assert!(device.evict_all().expect("evict") > 0);
    assert_eq!(bits(v), vec![2.0f32.to_bits(); 64 * 16]);
    assert_eq!(bits(y), vec![3.0f32.to_bits(); 64 * 64]);
    drop(x);
    let s = device.stats();
    assert_eq!((s.tensors, s.records, s.resident), (0, 0, 0), "{s}");
}

#[test]
fn random_and_uploaded_tensors_are_never_evicted() {
    let device = dtr_device(Some(1 << 20));
    let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let r = Tensor::<Plain, 2>::random([32, 32], Distribution::Default, &device);
    let u = Tensor::<Plain, 2>::from_data(TensorData::new(vec![1.5f32; 64], [8, 8]), &device);
    let first = bits(r.clone());
    let derived = r.clone() * 3.0;
    assert_eq!(device.stats().non_recomputable, 1);
    let evicted = device.evict_all().expect("evict");
    assert_eq!(evicted, 1, "only the derived tensor is evictable");
    assert_eq!(bits(r.clone()), first);
    assert_eq!(bits(u), vec![1.5f32.to_bits(); 64]);
    let expected: Vec<u32> = first
        .iter()
        .map(|&b| (f32::from_bits(b) * 3.0).to_bits())
        .collect();
    assert_eq!(bits(derived), expected);
    assert_eq!(device.stats().runtime.rematerializations, 1);
}

#[test]
fn long_chain_replays_without_recursion() {
    // 20 000 ops of 4 KiB under a 64 KiB budget: reading the last one after
    // evicting everything replays the whole chain from the upload.
    let device = dtr_device(Some(64 << 10));
    let mut t = Tensor::<Plain, 1>::zeros([1024], &device);
    let mut kept = Vec::new();
    for i in 0..20_000 {
        t = t + 1.0;
        if i % 5_000 == 4_999 {
            kept.push(t.clone());
        }
    }
    assert!(device.evict_all().expect("evict") > 0);
    assert_eq!(bits(t), vec![20_000f32.to_bits(); 1024]);
    assert_eq!(bits(kept.swap_remove(0)), vec![5_000f32.to_bits(); 1024]);
    assert!(device.take_error().is_none());
}

#[test]
fn impossible_budget_is_a_typed_error() {
    let device = dtr_device(Some(4 << 10));
    let x = Tensor::<Plain, 2>::ones([64, 64], &device); // 16 KiB > 4 KiB
    let err = x.clone().try_into_data().expect_err("must fail");
    assert!(err.to_string().contains("impossible budget"), "{err}");
    let typed = device.take_error().expect("typed error");
    let report = typed.impossible_budget().expect("impossible budget");
    assert_eq!(report.budget, 4 << 10);
    assert_eq!(report.needed, 16 << 10);
    // The device runs again after the error was taken.
    let y = Tensor::<Plain, 1>::ones([16], &device) * 2.0;
    assert_eq!(bits(y), vec![2.0f32.to_bits(); 16]);
    // Dropping the tensor of the failed op is harmless.
    drop(x);
    assert!(device.take_error().is_none());
    let s = device.stats();
    assert_eq!((s.tensors, s.records, s.resident), (0, 0, 0), "{s}");
}

#[test]
fn no_records_leak_when_tensors_are_dropped() {
    let d = Dims::tiny();
    let device = dtr_device(None);
    let peak_device = {
        let (_init, _trace) = ours(&d, &device);
        device.stats()
    };
    assert!(peak_device.ops > 0);
    let s = device.stats();
    assert_eq!(s.tensors, 0, "live tensors left: {s}");
    assert_eq!(s.records, 0, "records left: {s}");
    assert_eq!(s.resident, 0, "inner tensors left: {s}");
    assert_eq!(s.memory.allocated, 0, "bytes left: {s}");
    device.check_invariants().expect("invariants");

    // Under a budget too.
    let budget = dtr_device(Some(peak_device.memory.peak_allocated / 2));
    let _ = ours(&d, &budget);
    let s = budget.stats();
    assert_eq!(
        (s.tensors, s.records, s.resident, s.memory.allocated),
        (0, 0, 0, 0),
        "{s}"
    );
}

#[test]
fn physical_budget_places_with_the_caching_allocator() {
    // remat-alloc's caching allocator over a simulated 24 MiB device: 1 MiB
    // tensors, 40 of them live, so most are evicted and replayed on the way back.
    let config = DtrConfig::default()
        .with_budget_mode(BudgetMode::Physical)
        .with_budget(24 << 20);
    let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
    let mut t = Tensor::<Plain, 1>::zeros([256 * 1024], &device);
    let mut all = Vec::new();
    for _ in 0..40 {
        t = t + 0.5;
        all.push(t.clone());
    }
    for (k, x) in all.into_iter().enumerate().rev() {
        let want = (0.5f32 * (k + 1) as f32).to_bits();
        assert!(bits(x).iter().all(|&b| b == want), "tensor {k}");
    }
    let s = device.stats();
    assert!(s.runtime.evictions > 0, "{s}");
    assert!(s.memory.peak_reserved <= 24 << 20, "{s}");
    assert!(device.take_error().is_none());
}

#[test]
fn calibration_lowers_the_eviction_threshold_and_cleanup_runs() {
    // 64 KiB tensors under a 4 MiB logical budget: nothing needs evicting until
    // calibration says 3.5 MiB of the device are used outside the model.
    let config = DtrConfig::default()
        .with_budget_mode(BudgetMode::Logical)
        .with_budget(4 << 20);
    let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
    let mut t = Tensor::<Plain, 1>::zeros([16 * 1024], &device);
    let mut all = Vec::new();
    for _ in 0..12 {
        t = t + 0.5;
        all.push(t.clone());
    }
    let _ = bits(t.clone());
    assert_eq!(device.stats().runtime.evictions, 0);
    let m = device.calibrate_to(7 << 19).expect("calibrate");
    assert_eq!(m.threshold, Some(1 << 19));
    assert_eq!(m.outside_model, Some(7 << 19));
    assert!(m.model_live > 1 << 19, "{m:?}");
    // The next op evicts down to the threshold first.
    let u = t + 1.0;
    let s = device.stats();
    assert!(s.runtime.evictions > 0, "{s}");
    assert!(s.runtime.live_bytes <= (1 << 19) + (64 << 10), "{s}");
    // Every value is still right.
    for (k, x) in all.into_iter().enumerate().rev() {
        let want = (0.5f32 * (k + 1) as f32).to_bits();
        assert!(bits(x).iter().all(|&b| b == want), "tensor {k}");
    }
    assert!(bits(u).iter().all(|&b| b == 7.0f32.to_bits()));
    // NdArray has no pools to trim; the call still syncs and succeeds.
    device.empty_cache().expect("empty_cache");
    assert!(device.take_error().is_none());
}

#[test]
fn the_smallest_budget_query_answers_a_budget_that_trains() {
    // Measure unbudgeted with every step recorded, ask for the smallest budget
    // whose planned step costs at most twice its computations, then train at
    // it with the default policy and budget mode.
    let d = Dims {
        blocks: 4,
        ..Dims::tiny()
    };
    let (ref_init, ref_trace) = reference(&d);
    let options = |budget: Option<u64>| {
        let mut config = DtrConfig::default();
        if let Some(b) = budget {
            config = config.with_budget(b);
        }
        DtrOptions::new(config).with_cost_model(CostModel::gpu())
    };
    let free = DtrDevice::with_options(NdArrayDevice::Cpu, options(None)).expect("device");
    free.record_iterations();
    let (_, trace) = ours(&d, &free);
    assert_eq!(trace.losses, ref_trace.losses);
    let peak = free.stats().memory.peak_allocated;
    let floor = free.min_feasible_budget(2.0).expect("a recorded step");
    eprintln!("peak {peak} B, smallest budget at 2x: {floor} B");
    assert!(floor < peak, "replays let a step fit below its peak");
    let device = DtrDevice::with_options(NdArrayDevice::Cpu, options(Some(floor))).expect("device");
    let (init, trace) = ours(&d, &device);
    assert!(device.take_error().is_none());
    assert_eq!(init, ref_init);
    assert_eq!(trace.losses, ref_trace.losses, "losses at the floor");
    assert_eq!(trace.params, ref_trace.params, "parameters at the floor");
    eprintln!("at the floor: {}", device.stats().runtime);
    // The steady step costs at most 2x, planned or online (a plan is adopted
    // only where it is cheaper than the online step).
    let last = device.stats().last_iteration.expect("Sealing ends steps");
    assert!(
        last.remat_ns <= last.compute_ns * (1.0 + 1e-9),
        "the steady step costs at most 2x: {last:?}"
    );
}
