//! One training step (forward, backward, Adam, seal) of the burn-nn demo model on
//! plain `Autodiff<NdArray>` and on `Autodiff<Dtr<NdArray>>` unconstrained and at
//! 70 / 50 / 40 % of its peak, in one criterion group so the report shows the
//! ratios. Peaks are printed once per configuration.
//!
//! ```text
//! cargo bench -p remat-burn --bench burn_dtr
//! ```

#[path = "../tests/common/model.rs"]
mod model;

use std::hint::black_box;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use model::{adam, param_bits, train, Dims, TinyNet};
use remat_burn::{Dtr, DtrDevice, Sealing};
use remat_dtr::{BudgetMode, DtrConfig};

type Ref = Autodiff<NdArray>;
type Ours = Autodiff<Dtr<NdArray>>;

fn dtr_device(budget: Option<u64>) -> DtrDevice<NdArray> {
    let mut config = DtrConfig::default().with_budget_mode(BudgetMode::Logical);
    config.budget = budget;
    DtrDevice::new(NdArrayDevice::Cpu, config).expect("device")
}

/// Peak of one unconstrained step.
fn unconstrained_peak(d: &Dims) -> u64 {
    let device = dtr_device(None);
    Ours::seed(&device, 7);
    let model = TinyNet::<Ours>::new(d, &device);
    let _ = param_bits(&model);
    let _ = train(model, d, 1, false, &device, Sealing::new(adam(), &device));
    device.stats().memory.peak_allocated
}

fn bench(c: &mut Criterion) {
    let d = Dims::demo();
    let peak = unconstrained_peak(&d);
    let mut group = c.benchmark_group("burn_train_step");
    group.sample_size(10);
    group.throughput(Throughput::Elements(d.batch as u64));

    let device = NdArrayDevice::Cpu;
    Ref::seed(&device, 7);
    let model = TinyNet::<Ref>::new(&d, &device);
    let _ = param_bits(&model);
    group.bench_function("autodiff_ndarray", |b| {
        b.iter(|| black_box(train(model.clone(), &d, 1, false, &device, adam())))
    });

    for percent in [None, Some(70u64), Some(50), Some(40)] {
        let device = dtr_device(percent.map(|p| peak * p / 100));
        Ours::seed(&device, 7);
        let model = TinyNet::<Ours>::new(&d, &device);
        let _ = param_bits(&model);
        let name = match percent {
            None => "dtr_unconstrained".to_string(),
            Some(p) => format!("dtr_{p}_percent"),
        };
        group.bench_function(&name, |b| {
            b.iter(|| {
                black_box(train(
                    model.clone(),
                    &d,
                    1,
                    false,
                    &device,
                    Sealing::new(adam(), &device),
                ))
            })
        });
        let s = device.stats();
        eprintln!(
            "{name}: peak {} B of unconstrained {peak} B, evictions {}, rematerializations {}, error {:?}",
            s.memory.peak_allocated,
            s.runtime.evictions,
            s.runtime.rematerializations,
            device.take_error()
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
