//! Stress conformance: every op family of burn 0.21's backend traits run on
//! `Dtr<NdArray>` under heavy eviction, compared bit for bit with plain
//! `NdArray`.
//!
//! Each case is one generic function over the backend; it is run on NdArray and
//! on `Dtr<NdArray>` under two configurations:
//! - `threshold:0`: before each op, every storage one op away from resident
//!   inputs is evicted, so nearly every read of an intermediate replays it;
//! - a small physical budget (the default mode) that the cases' working sets
//!   fit but their totals do not.
//!
//! Families: float (element-wise, reductions, sorting, cumulative), int, bool,
//! matmul and linalg (det/LU, matvec, outer, trace, diag, norms), indexing
//! (gather/scatter/select/slice assign, cat/stack/repeat/flip/chunk), view
//! chains (swap_dims/permute/narrow/expand/reshape), module ops (conv 1d/2d,
//! transposed conv, pooling, interpolate, embedding, attention, CTC), a
//! transaction, seeded random ops, and a gradient through `Autodiff`. The cases
//! live in `common/cases.rs`, shared with `stress_table.rs` (and the CTC
//! gradient of `ctc_grad.rs`).

#[path = "common/cases.rs"]
mod cases;
#[path = "common/muted.rs"]
mod muted;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::linalg;
use cases::*;
use muted::catch_muted;
use remat_burn::{Dtr, DtrDevice};
use remat_dtr::{BudgetMode, DtrConfig};

type Ours = Dtr<NdArray>;

fn configs() -> Vec<(&'static str, DtrConfig)> {
    vec![
        (
            "threshold:0",
            DtrConfig::default()
                .with_budget_mode(BudgetMode::Logical)
                .with_threshold(Some(0)),
        ),
        (
            "physical 16 KiB",
            DtrConfig::default().with_budget(16 << 10),
        ),
    ]
}

/// One test, cases in sequence: the NdArray random generator is process-wide,
/// so seeded cases must not interleave with other tests' random ops.
#[test]
fn every_op_family_is_bit_identical_under_eviction() {
    let mut evictions = std::collections::HashMap::new();
    let plain = NdArrayDevice::Cpu;
    for ((case, want_of), (_, got_of)) in plain_cases::<NdArray>()
        .into_iter()
        .zip(plain_cases::<Ours>())
    {
        let want = want_of(&plain);
        for (name, config) in configs() {
            let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
            let got = got_of(&device);
            assert_same(case, name, &want, &got);
            assert!(device.take_error().is_none(), "{case} [{name}]");
            device.check_invariants().unwrap();
            *evictions.entry(name).or_insert(0) += device.stats().runtime.evictions;
            if name == "threshold:0" {
                assert!(
                    device.stats().runtime.evictions > 0,
                    "{case} [{name}]: evicts"
                );
            }
        }
    }
    for (name, _) in configs() {
        assert!(evictions[name] > 0, "{name}: {evictions:?}");
    }
    // A gradient through Autodiff over each backend.
    let want = gradients::<Autodiff<NdArray>>(&plain);
    for (name, config) in configs() {
        let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
        let got = gradients::<Autodiff<Ours>>(&device);
        assert_same("gradients", name, &want, &got);
        assert!(device.take_error().is_none(), "gradients [{name}]");
        device.check_invariants().unwrap();
    }
}

/// `det` runs LU, whose every step reads the running matrix twice with other
/// ops between: under `threshold:0` that used to replay the whole evicted chain
/// behind it (n²/2 replays; 23 s at 80×80 in a debug build).
#[test]
fn det_under_threshold_zero_replays_linearly() {
    for n in [16usize, 64] {
        let config = DtrConfig::default()
            .with_budget_mode(BudgetMode::Logical)
            .with_threshold(Some(0));
        let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
        let want = linalg::det::<NdArray, 3, 2, 1>(float::<NdArray, 3>(
            [1, n, n],
            30,
            &NdArrayDevice::Cpu,
        ))
        .into_data();
        let got =
            linalg::det::<Ours, 3, 2, 1>(float::<Ours, 3>([1, n, n], 30, &device)).into_data();
        assert_eq!(want.as_bytes(), got.as_bytes(), "det {n}×{n}");
        let s = device.stats();
        assert!(
            s.runtime.rematerializations <= 2 * s.ops,
            "det {n}×{n}: {} replays for {} ops",
            s.runtime.rematerializations,
            s.ops
        );
    }
}

/// One device for every case in a row, as a test suite runs in one process,
/// under a budget most cases cannot meet: each case must end as it ends alone
/// on a fresh device. A failure must not poison the device for the next case.
#[test]
fn failures_do_not_spread_between_cases_on_one_device() {
    let cases = plain_cases::<Ours>();
    let config = || DtrConfig::default().with_budget(4 << 10);
    let run = |case: Case<Ours>, device: &DtrDevice<NdArray>| {
        // A failed read panics in `into_data`; the panic's text is remat's.
        let ok = catch_muted(|| case(device)).is_ok();
        let error = device.take_error();
        ok && error.is_none()
    };
    let alone: Vec<bool> = cases
        .iter()
        .map(|&(_, case)| {
            let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config()).expect("device");
            run(case, &device)
        })
        .collect();
    eprintln!("alone: {alone:?}");
    assert!(alone.contains(&true) && alone.contains(&false), "{alone:?}");
    let shared = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config()).expect("device");
    for (k, &(name, case)) in cases.iter().enumerate() {
        assert_eq!(
            run(case, &shared),
            alone[k],
            "{name} after the cases before it"
        );
        shared.check_invariants().unwrap();
    }
    // Cases that fit run again after every failure.
    for (k, &(name, case)) in cases.iter().enumerate() {
        if alone[k] {
            assert!(run(case, &shared), "{name} once more");
        }
    }
}
