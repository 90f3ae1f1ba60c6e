//! Failures under a budget reach the user with remat's message and figures, and
//! do not poison the device: the failed op's outputs (and what reads them) are
//! not computed, everything else keeps working.

use burn_backend::backend::Backend;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::Tensor;
use remat_burn::{Dtr, DtrDevice, Error};
use remat_dtr::{BudgetMode, DtrConfig, ImpossibleCause};

type B = Dtr<NdArray>;

fn device(budget: u64) -> DtrDevice<NdArray> {
    DtrDevice::new(NdArrayDevice::Cpu, DtrConfig::default().with_budget(budget)).expect("device")
}

fn floats(t: Tensor<B, 1>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 data")
}

#[test]
fn a_tiny_physical_budget_runs_tiny_ops() {
    // 4 KiB in the default (physical) mode: PyTorch's rules would need a 2 MiB
    // segment for the first 24-byte tensor.
    let device = device(4 << 10);
    let x = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &device);
    let mut y = x.clone();
    for _ in 0..20 {
        y = y + 1.0;
    }
    assert_eq!(floats(y), vec![21.0, 22.0, 23.0, 24.0, 25.0, 26.0]);
    assert!(device.take_error().is_none());
    assert!(device.stats().memory.peak_reserved <= 4 << 10);
    device.check_invariants().unwrap();
}

#[test]
fn a_failed_op_reaches_the_reader_with_remat_figures_and_the_device_goes_on() {
    let device = device(16 << 10);
    let ok = Tensor::<B, 1>::from_floats([1.0, 2.0], &device);
    // 12 000 B of parameters, then an op whose 12 000 B output cannot fit
    // beside its input (a working set of 24 000 B under 16 KiB).
    let params = Tensor::<B, 1>::ones([3000], &device);
    let big = params.clone() * 2.0;
    let err = big
        .clone()
        .try_into_data()
        .expect_err("the op cannot be placed");
    let text = err.to_string();
    assert!(text.contains("impossible budget"), "{text}");
    assert!(
        text.contains("the op's own inputs and outputs exceed the budget"),
        "{text}"
    );
    assert!(text.contains("under a budget of 16384 B"), "{text}");
    // What reads the failed tensor fails with the same cause…
    let derived = big.clone().exp();
    let text2 = derived
        .try_into_data()
        .expect_err("not computed")
        .to_string();
    assert!(text2.contains("impossible budget"), "{text2}");
    // …and `into_data` panics with it rather than a generic message.
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        big.clone().into_data();
    }))
    .expect_err("into_data of a failed tensor panics");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("impossible budget"), "{message}");
    // The typed error, once.
    match device.take_error() {
        Some(Error::Dtr(remat_dtr::Error::ImpossibleBudget(b))) => {
            assert_eq!(b.cause, ImpossibleCause::OpWorkingSetExceedsBudget, "{b}");
            assert_eq!(b.budget, 16 << 10);
            let op = b.op.as_ref().expect("the op is named");
            assert_eq!((op.input_bytes, op.output_bytes), (12_000, 12_000), "{b}");
        }
        other => panic!("{other:?}"),
    }
    assert!(device.take_error().is_none());
    // The first sync reports the failure since the last sync, the next one is clean.
    assert!(B::sync(&device).is_err());
    assert!(B::sync(&device).is_ok());
    // The device is not poisoned: independent work goes on, also work that
    // reads the tensors the failed op read.
    assert_eq!(floats(ok.clone() + 1.0), vec![2.0, 3.0]);
    let small = params.narrow(0, 0, 4) * 3.0;
    assert_eq!(floats(small), vec![3.0; 4]);
    drop(big);
    assert_eq!(floats(ok * 10.0), vec![10.0, 20.0]);
    assert!(device.take_error().is_none());
    device.check_invariants().unwrap();
}

#[test]
fn an_upload_larger_than_the_budget_fails_alone() {
    let device = device(4 << 10);
    let huge = Tensor::<B, 1>::ones([4096], &device);
    let text = huge
        .try_into_data()
        .expect_err("16 KiB cannot be uploaded under 4 KiB")
        .to_string();
    assert!(
        text.contains("the request alone exceeds the budget"),
        "{text}"
    );
    let x = Tensor::<B, 1>::from_floats([1.0, 2.0], &device);
    assert_eq!(floats(x * 2.0), vec![2.0, 4.0]);
}

#[test]
fn a_read_that_cannot_be_regenerated_fails_typed_and_later_succeeds() {
    // Logical budget: bytes as requested, no rounding.
    let config = DtrConfig::default()
        .with_budget_mode(BudgetMode::Logical)
        .with_budget(16_000);
    let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, config).expect("device");
    let upload = || Tensor::<B, 1>::from_floats(vec![1.0f32; 1000].as_slice(), &device);
    let a = upload(); // 4 000 B, never evicted
    let c = (a.clone() * 2.0) * 3.0;
    assert!(device.evict_all().expect("evict") > 0);
    // Two more uploads: 12 000 B resident that cannot be evicted, so reading
    // `c` (its input, then itself: 8 000 B) cannot fit.
    let d = upload();
    let e = upload();
    let text = c
        .clone()
        .try_into_data()
        .expect_err("no room to regenerate c")
        .to_string();
    assert!(text.contains("impossible budget"), "{text}");
    match device.take_error() {
        Some(Error::Dtr(remat_dtr::Error::ImpossibleBudget(b))) => {
            assert_eq!(b.cause, ImpossibleCause::WorkingSetExceedsBudget, "{b}");
            assert_eq!(b.budget, 16_000);
        }
        other => panic!("the failed read's typed error: {other:?}"),
    }
    // Once memory allows, the same tensor reads.
    drop(d);
    assert_eq!(floats(c), vec![6.0; 1000]);
    assert_eq!(floats(e + a), vec![2.0; 1000]);
    assert!(device.take_error().is_none());
    device.check_invariants().unwrap();
}

#[test]
fn a_value_evicted_before_a_bare_end_iteration_is_stale_not_recomputed() {
    // `end_iteration` without `Sealing`'s seal: `a`, evicted, would be
    // recomputed from `w`, which an optimizer step may have changed since.
    let device = DtrDevice::new(
        NdArrayDevice::Cpu,
        DtrConfig::default()
            .with_budget(1 << 20)
            .with_budget_mode(BudgetMode::Logical),
    )
    .expect("device");
    let w = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.0], &device);
    let a = w.clone() * 2.0;
    assert_eq!(floats(a.clone()), vec![2.0, 4.0, 6.0]);
    assert!(device.evict_all().expect("evict") > 0);
    // Made after the eviction, so resident at the boundary: it stays readable.
    let c = w.clone() * 3.0;
    assert_eq!(floats(c.clone()), vec![3.0, 6.0, 9.0]);
    device.end_iteration().expect("boundary");
    let err = a.clone().try_into_data().expect_err("a stale value");
    assert!(err.to_string().contains("end_iteration"), "{err}");
    match device.take_error() {
        Some(Error::Dtr(remat_dtr::Error::StaleValue {
            created_in: 0,
            current: 1,
            ..
        })) => {}
        other => panic!("expected a stale-value error, got {other:?}"),
    }
    // The weights (uploaded, never evicted) and `c` are read as they were.
    assert_eq!(floats(c), vec![3.0, 6.0, 9.0]);
    assert_eq!(floats(w), vec![1.0, 2.0, 3.0]);
    assert!(device.take_error().is_none());
}
