//! The policy probe behind docs/burn.md's "Low budgets and policies": one policy
//! trains the test model for 3 Adam steps at a fraction of its unconstrained
//! peak, and the result (time, bit-identity, replay cost, evictions, error) is
//! printed. Ignored by default (thrashing runs take minutes); run by hand, one
//! policy per process so a thrashing one can be stopped with `timeout`:
//!
//! ```sh
//! PROBE_POLICY=msps PROBE_PERCENT=30 PROBE_BLOCKS=12 \
//!   timeout 60 cargo test --release -p remat-burn --test policy_probe -- --ignored --nocapture
//! ```
//!
//! `PROBE_SAMPLING=1` turns √N sampling on (default: full scan);
//! `PROBE_MODE=physical` uses the physical budget mode (default: logical);
//! `PROBE_FLOOR=1` also prints `min_feasible_budget(2.0)` of the unbudgeted
//! run (in the probe's budget mode);
//! `PROBE_GRADS=1` reads every gradient as the equivalence test does (their
//! values stay live until read: a harder budget than training alone);
//! `PROBE_CONF` adds settings in `REMAT_DTR_CONF` syntax (e.g.
//! `keep_read_again:on`); the last step's iteration report is printed too.

#[path = "common/model.rs"]
mod model;
#[path = "common/probe_env.rs"]
mod probe_env;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use model::{adam, param_bits, train, Dims, TinyNet};
use probe_env::env;
use remat_burn::{CostModel, Dtr, DtrDevice, DtrOptions, Sealing};
use remat_dtr::{BudgetMode, DtrConfig, PolicyKind};

type Ours = Autodiff<Dtr<NdArray>>;

fn device(budget: Option<u64>, policy: PolicyKind, sampling: bool) -> DtrDevice<NdArray> {
    let mode = match std::env::var("PROBE_MODE").as_deref() {
        Ok("physical") => BudgetMode::Physical,
        _ => BudgetMode::Logical,
    };
    // Further settings in REMAT_DTR_CONF syntax (`PROBE_CONF=keep_read_again:on`).
    let base = match std::env::var("PROBE_CONF") {
        Ok(conf) => DtrConfig::parse(&conf).expect("PROBE_CONF"),
        Err(_) => DtrConfig::default(),
    };
    let mut config = base
        .with_budget_mode(mode)
        .with_policy(policy)
        .with_sampling(sampling)
        .with_filter(false);
    if let Some(b) = budget {
        config = config.with_budget(b);
    }
    let options = DtrOptions::new(config).with_cost_model(CostModel::gpu());
    DtrDevice::with_options(NdArrayDevice::Cpu, options).expect("device")
}

fn losses(d: &Dims, device: &DtrDevice<NdArray>) -> Option<Vec<u32>> {
    Ours::seed(device, 7);
    let model = TinyNet::<Ours>::new(d, device);
    let _ = param_bits(&model);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let grads = std::env::var("PROBE_GRADS").is_ok();
        train(model, d, 3, grads, device, Sealing::new(adam(), device)).losses
    }))
    .ok()
}

#[test]
#[ignore = "a by-hand probe: thrashing policies run for minutes"]
fn probe() {
    let d = Dims {
        blocks: env("PROBE_BLOCKS", 12usize),
        ..Dims::tiny()
    };
    let percent: u64 = env("PROBE_PERCENT", 30);
    let policy: PolicyKind = env("PROBE_POLICY", PolicyKind::Remat);
    let sampling = std::env::var("PROBE_SAMPLING").is_ok();
    let unconstrained = device(None, PolicyKind::Msps, false);
    let floor = std::env::var("PROBE_FLOOR").is_ok();
    if floor {
        unconstrained.record_iterations();
    }
    let want = losses(&d, &unconstrained).expect("unconstrained run");
    let peak = unconstrained.stats().memory.peak_allocated;
    if floor {
        let f = unconstrained
            .min_feasible_budget(2.0)
            .expect("a recorded step");
        println!(
            "peak {peak} B; smallest budget at 2x: {f} B ({:.1} % of the peak)",
            100.0 * f as f64 / peak as f64
        );
    }
    let dev = device(Some(peak * percent / 100), policy, sampling);
    // Reads panic on a device error; the typed error is taken below.
    std::panic::set_hook(Box::new(|_| {}));
    let start = std::time::Instant::now();
    let got = losses(&d, &dev);
    let s = dev.stats();
    let err = dev.take_error();
    println!(
        "{policy:?} blocks={} {percent} % sampling={sampling}: {:.2} s, finished={}, bit-identical={}, \
         replay/compute={:.2}, evictions={}, error={}",
        d.blocks,
        start.elapsed().as_secs_f64(),
        got.is_some() && err.is_none(),
        got.as_ref() == Some(&want),
        s.runtime.remat_ns / s.runtime.compute_ns.max(1.0),
        s.runtime.evictions,
        err.map(|e| e.to_string()).unwrap_or_default()
    );
    println!("last step: {:?}", s.last_iteration);
}
