//! How much memory can this Burn model save, and at what cost? Records one
//! training step of the burn-nn model `burn_train_under_budget` trains
//! (Embedding, multi-head attention, LayerNorm, Conv2d, Linear; Adam), writes
//! it as a trace (`DtrDevice::export_trace`), and prints its budget curve:
//! from the step's peak down to its floor, the first and the steady step's
//! overhead at each budget.
//!
//! ```text
//! cargo run --release -p remat-burn --example burn_advise -- --out tinynet.log
//! remat advise tinynet.log --svg tinynet.svg    # the same curve, with a chart
//! ```
//!
//! Exits with status 2 on an error.

#[path = "../tests/common/model.rs"]
mod model;

use std::path::PathBuf;
use std::process::ExitCode;

use burn_autodiff::Autodiff;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use model::{adam, param_bits, train, Dims, TinyNet};
use remat_burn::{Dtr, DtrDevice, Sealing};
use remat_dtr::replay::advise::{advise, AdviseSpec};
use remat_dtr::DtrConfig;

type Ours = Autodiff<Dtr<NdArray>>;

fn run(out: PathBuf) -> Result<(), String> {
    // No budget: the steps run as plain Burn would, and are recorded.
    let device = DtrDevice::<NdArray>::new(NdArrayDevice::Cpu, DtrConfig::default())
        .map_err(|e| e.to_string())?;
    device.record_iterations();
    Ours::seed(&device, 7);
    let d = Dims::tiny();
    let model = TinyNet::<Ours>::new(&d, &device);
    let _ = param_bits(&model);
    // Three steps (Sealing ends each): the last is exported.
    train(model, &d, 3, false, &device, Sealing::new(adam(), &device));
    if let Some(e) = device.take_error() {
        return Err(e.to_string());
    }
    let trace = device.export_trace(&out).map_err(|e| e.to_string())?;
    println!(
        "wrote {} ({} lines): one training step of the burn-nn model",
        out.display(),
        trace.instructions.len()
    );
    let spec = AdviseSpec {
        base: DtrConfig::default().with_plan_restarts(0),
        ..AdviseSpec::default()
    };
    let advice = advise(&trace, &spec, |_, _| {}).map_err(|e| e.to_string())?;
    // The same table as `remat advise` on the exported file.
    print!("{advice}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => match args.get(i + 1) {
            Some(p) => PathBuf::from(p),
            None => {
                eprintln!("--out needs a file name");
                return ExitCode::from(2);
            }
        },
        None => std::env::temp_dir().join("tinynet-step.log"),
    };
    match run(out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
