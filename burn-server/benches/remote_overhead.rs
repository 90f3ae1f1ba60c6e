//! What serving DTR behind burn-remote costs, side by side in one run: the
//! same work on Burn 0.22's Flex directly, on a plain burn-remote server of
//! Flex (the socket alone), and on remat's server of `Dtr<Flex>` (the socket
//! and the DTR runtime), unbounded and at 50 % of the peak. Prints a table of
//! medians and ratios.
//!
//! ```text
//! cargo bench -p remat-burn-server --bench remote_overhead
//! ```
//!
//! Cases: a chain of small element-wise ops ending in one read (per-op cost:
//! where the socket matters), a chain of 256×256 matmuls (where it does not),
//! and one training step (forward, backward, Adam) of the tests' model.

#[path = "../tests/common/model.rs"]
mod model;

use std::hint::black_box;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Tensor};
use burn_flex::Flex;
use burn_remote::server::{BackendServer, WebSocketTransport};
use model::{batch, train, Dims, TinyNet};
use remat_burn_server::{serve, CostModel, RemoteDtr, ServeConfig, Server};
use remat_dtr::{BudgetMode, DtrConfig};

const REPS: usize = 7;
const SMALL_OPS: usize = 2000;
const MATMULS: usize = 20;

/// A plain burn-remote server of Flex on a free localhost port, on its own
/// runtime (dropped with the process).
fn plain_remote() -> Device {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let server = BackendServer::<Flex>::new([Default::default()]);
    let serving = server.serve_async(WebSocketTransport::from_listener(listener));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let _ = rt.block_on(serving);
    });
    Device::remote_options(&burn::remote::RemoteHost::websocket(&url))
        .init()
        .expect("connect")
}

fn dtr_server(budget: Option<u64>) -> Server<Flex> {
    let mut config = DtrConfig::default().with_budget_mode(BudgetMode::Logical);
    config.budget = budget;
    serve::<Flex>(ServeConfig::new(Default::default(), config).with_cost_model(CostModel::gpu()))
        .expect("serve")
}

/// Median wall time of `REPS` runs of `f` (after one warm-up run).
fn median(mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[REPS / 2]
}

fn small_ops(device: &Device) {
    let mut x = Tensor::<1>::ones([16], device);
    for _ in 0..SMALL_OPS {
        x = x.add_scalar(1.0);
    }
    black_box(x.into_data());
}

fn matmuls(device: &Device) {
    let a = Tensor::<2>::ones([256, 256], device).mul_scalar(1e-3);
    let mut x = a.clone();
    for _ in 0..MATMULS {
        x = x.matmul(a.clone());
    }
    black_box(x.into_data());
}

/// Median time of a training step (forward, backward, Adam, the loss read;
/// `end_step` on a DTR server), over `REPS` steps after two warm-up steps
/// (the first is online, the plan starts from the third).
fn step_times(init: &TinyNet, d: &Dims, device: &Device, remat: Option<&RemoteDtr>) -> Duration {
    let device = device.clone().autodiff();
    let mut model = init.clone().fork(&device);
    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut times = Vec::new();
    for step in 0..REPS + 2 {
        let t = Instant::now();
        let (tokens, labels) = batch(d, step, &device);
        let loss = loss_fn.forward(model.forward(tokens), labels);
        black_box(loss.clone().into_data());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        if let Some(r) = remat {
            r.end_step();
        }
        device.sync().expect("sync");
        if step >= 2 {
            times.push(t.elapsed());
        }
    }
    times.sort();
    times[REPS / 2]
}

struct Row {
    case: &'static str,
    unit: &'static str,
    per: f64,
    times: Vec<Duration>,
}

fn main() {
    let d = Dims {
        blocks: 8,
        ..Dims::tiny()
    };
    let flex = Device::flex();
    let remote = plain_remote();
    let unbounded = dtr_server(None);
    let dtr = RemoteDtr::connect(&unbounded.url()).expect("connect");
    let dtr_device = dtr.device();

    // The peak of one step, for the 50 % server.
    let init = {
        let device = Device::flex().autodiff();
        device.seed(7);
        TinyNet::new(&d, &device)
    };
    black_box(train(
        init.clone().fork(&dtr_device.clone().autodiff()),
        &d,
        1,
        &dtr_device.clone().autodiff(),
        || dtr.end_step(),
    ));
    let peak = dtr.stats().expect("stats").peak_allocated;
    let half = dtr_server(Some(peak / 2));
    let dtr_half = RemoteDtr::connect(&half.url()).expect("connect");
    let half_device = dtr_half.device();

    let mut rows = Vec::new();
    let devices: [(&Device, Option<&RemoteDtr>); 4] = [
        (&flex, None),
        (&remote, None),
        (&dtr_device, Some(&dtr)),
        (&half_device, Some(&dtr_half)),
    ];
    rows.push(Row {
        case: "small ops ([16] add_scalar)",
        unit: "µs/op",
        per: SMALL_OPS as f64,
        times: devices
            .iter()
            .map(|(dev, _)| median(|| small_ops(dev)))
            .collect(),
    });
    rows.push(Row {
        case: "matmul 256x256",
        unit: "µs/op",
        per: MATMULS as f64,
        times: devices
            .iter()
            .map(|(dev, _)| median(|| matmuls(dev)))
            .collect(),
    });
    rows.push(Row {
        case: "training step (8 blocks)",
        unit: "ms/step",
        per: 1e3,
        times: devices
            .iter()
            .map(|(dev, r)| step_times(&init, &d, dev, *r))
            .collect(),
    });

    println!(
        "\n{:<30} {:>8} {:>10} {:>12} {:>10} {:>12} | {:>12} {:>11} {:>10}",
        "case",
        "unit",
        "flex",
        "remote flex",
        "remote dtr",
        "dtr 50 %",
        "remote/flex",
        "dtr/remote",
        "dtr/flex"
    );
    for r in &rows {
        let v: Vec<f64> = r
            .times
            .iter()
            .map(|t| t.as_secs_f64() * 1e6 / r.per)
            .collect();
        println!(
            "{:<30} {:>8} {:>10.2} {:>12.2} {:>10.2} {:>12.2} | {:>11.2}x {:>10.2}x {:>9.2}x",
            r.case,
            r.unit,
            v[0],
            v[1],
            v[2],
            v[3],
            v[1] / v[0],
            v[2] / v[1],
            v[2] / v[0]
        );
    }
    let s = dtr_half.stats().expect("stats");
    println!("\ndtr 50 % server after the runs: {s}");
    println!("(medians of {REPS} runs after a warm-up; peak of one step {peak} B)");
    half.shutdown().expect("shutdown");
    unbounded.shutdown().expect("shutdown");
}
