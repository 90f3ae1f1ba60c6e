//! `remat-burn-server`: serve one DTR device over Burn's Flex CPU backend to
//! stock Burn 0.22 clients (`Device::remote_options(&RemoteHost::websocket(url))`),
//! until Ctrl+C.
//!
//! ```sh
//! REMAT_DTR_CONF=budget:64MiB cargo run --release -p remat-burn-server -- --port 3000
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use burn_flex::Flex;
use clap::Parser;
use remat_burn_server::{serve, ServeConfig};
use remat_dtr::DtrConfig;

/// Serve a DTR device (remat's budget, eviction and plans) over Flex to
/// burn-remote clients.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The port to listen on (0: a free one, printed).
    #[arg(long, default_value_t = 3000)]
    port: u16,
    /// The interface to listen on. Localhost by default: burn-remote's
    /// WebSocket transport is unencrypted and unauthenticated.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,
    /// The DTR configuration (`REMAT_DTR_CONF` syntax, e.g.
    /// `budget:64MiB,policy:dtr`); `REMAT_DTR_CONF` when absent.
    #[arg(long)]
    conf: Option<String>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let config = match &args.conf {
        Some(conf) => DtrConfig::parse(conf)?,
        None => DtrConfig::from_env()?,
    };
    let address = SocketAddr::new(args.host, args.port);
    let server = serve::<Flex>(ServeConfig::new(Default::default(), config).with_address(address))?;
    println!(
        "remat-burn-server: serving a DTR device over Flex at {}",
        server.url()
    );
    println!("(Ctrl+C to stop)");
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc_channel(tx);
    let _ = rx.recv();
    println!("{}", server.device().stats());
    server.shutdown()?;
    Ok(())
}

/// Send on `tx` at SIGINT/SIGTERM (through tokio's signal handling, which
/// burn-remote's runtime already links).
fn ctrlc_channel(tx: std::sync::mpsc::Sender<()>) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(async {
                let _ = tokio::signal::ctrl_c().await;
            });
        }
        let _ = tx.send(());
    });
}
