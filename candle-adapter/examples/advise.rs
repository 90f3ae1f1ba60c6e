//! How much memory can this model save, and at what cost? Records one
//! training step of the CNN that `train_under_budget` trains, writes it as a
//! trace (`Remat::export_trace`), and prints its budget curve
//! (`Remat::advise`): from the step's peak down to its floor, the first and
//! the steady step's overhead at each budget.
//!
//! ```text
//! cargo run --release -p remat-candle --example advise -- --out cnn.log
//! remat advise cnn.log --svg cnn.svg      # the same curve, with a chart
//! ```
//!
//! Exits with status 2 on an error.

use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use remat_candle::dtr::replay::advise::AdviseSpec;
use remat_candle::dtr::DtrConfig;
use remat_candle::nn::loss;
use remat_candle::{Remat, RematConfig};

#[path = "shared/cnn.rs"]
mod cnn;
use cnn::{dataset, seeded_init, Cnn, BATCH, DATASET, SIDE};

fn run(out: PathBuf) -> remat_candle::Result<()> {
    let dev = Device::Cpu;
    // No budget: the step runs as plain candle would, and is recorded.
    let remat = Remat::new(RematConfig::new().with_dropout_seed(7))?;
    remat.record_iterations()?;
    let varmap = VarMap::new();
    let model = Cnn::new(&remat, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    seeded_init(&varmap, &dev)?;
    let mut opt = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let (xs, ys) = dataset();
    let images = Tensor::from_vec(xs, (DATASET, 1, SIDE, SIDE), &dev)?;
    let labels = Tensor::from_vec(ys, DATASET, &dev)?;
    let x = remat.input(&images.narrow(0, 0, BATCH)?)?;
    let y = remat.input(&labels.narrow(0, 0, BATCH)?)?;
    remat.end_iteration()?;
    // Two steps: the second starts as every later one does (Adam's state
    // exists); it is the one exported.
    for _ in 0..2 {
        let loss = loss::cross_entropy(&model.forward(&x)?, &y)?;
        let grads = loss.backward()?;
        drop(loss);
        opt.step(&grads)?;
        remat.end_iteration()?;
    }
    let trace = remat.export_trace(&out)?;
    println!(
        "wrote {} ({} lines): one training step of the CNN",
        out.display(),
        trace.instructions.len()
    );
    let spec = AdviseSpec {
        base: DtrConfig::default().with_plan_restarts(0),
        ..AdviseSpec::default()
    };
    let advice = remat.advise(&spec)?;
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
        None => std::env::temp_dir().join("cnn-step.log"),
    };
    match run(out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
