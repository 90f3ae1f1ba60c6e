//! # remat-burn-server — Dynamic Tensor Rematerialization for Burn 0.22
//!
//! Burn 0.22 removed the backend generic from `Tensor`: a program holds a
//! `burn::Device` and its ops dispatch over a closed set of built-in backends,
//! so a third-party backend such as remat's `Dtr<B>` cannot be put under a
//! stock burn-nn model in the same process. The door Burn keeps open is
//! burn-remote: its `BackendServer::<B: BackendIr>` serves *any* IR backend to
//! stock Burn clients, which reach it with `Device::remote_options(..)`. This
//! crate serves [`Dtr<B>`] there.
//!
//! ```text
//!  training process (stock burn 0.22)          server (this crate; same process or not)
//!  ──────────────────────────────────          ─────────────────────────────────────────
//!  Tensor / burn-nn / burn-optim                burn-remote BackendServer<Dtr<B>>
//!     │  Device::remote_options(ws://…)             │  TensorInterpreter<Dtr<B>>
//!  burn-autodiff (on the client)                    │    (each OperationIr → a Dtr<B> call)
//!     │                                          burn-router  BackendRouter<DtrChannel<B>>
//!  burn-remote client ── ops, batched, ──────▶      │
//!     (waits only on reads and syncs)            DtrClient ── remat_dtr::Runtime (budget,
//!  RemoteDtr: end_step / stats / floor               │        eviction, regeneration, plans)
//!     as custom ops ─────────────────────────▶       ▼
//!                                                TensorInterpreter<B>  the resident inner tensors
//! ```
//!
//! Autodiff runs on the client, so the server sees the forward and backward
//! passes and the optimizer's update as one flat stream of IR ops, the same
//! stream `remat-burn` (Burn 0.21) records in process; the runtime's
//! guarantees carry over: values are bit-identical (a replay is the very IR op
//! that produced the value), rematerialization runs on an explicit work list,
//! an op that fails marks its outputs not computed without poisoning the
//! device, and steps are planned from the step before.
//!
//! ## Module layout
//!
//! | module | what it owns |
//! |---|---|
//! | `channel` | [`DtrChannel`], the router channel ([`Dtr<B>`] is `BackendRouter<DtrChannel<B>>`), and [`DtrBridge`] |
//! | `client` | [`DtrClient`], the router client of one device: runs each op on burn's IR interpreter, records it in the runtime (views and aliases as aliases, uploads and non-recomputable ops as roots), reads, drops, seals, ends iterations, keeps the first error; [`DtrStats`] |
//! | `op` | the compute path: the recorded IR op replayed on the interpreter, [`Resident`], view chains, op classification |
//! | `device` | [`DtrDevice`] (one slot each: one client, one runtime, one budget), [`DtrOptions`] |
//! | `cost` | [`CostModel`]: wall-clock on synchronous backends, an analytic estimate on asynchronous ones |
//! | `swap` | the host tier ([`SwapFaults`] is its test hook) |
//! | `serve` | [`serve`] / [`ServeConfig`] / [`Server`]: a WebSocket server of one DTR device on its own thread, localhost by default, with remat's custom ops; the `remat-burn-server` binary runs it |
//! | `remote` | [`RemoteDtr`], the client side: a stock `burn::Device` on the server, and remat's calls as custom ops ([`RemoteDtr::end_step`], [`RemoteDtr::stats`], [`RemoteDtr::min_feasible_budget`]) |
//! | `error` | [`Error`] and [`Result`] |
//!
//! Arrows go one way: `serve` → `remote` (the protocol: op ids, the stats
//! layout), `device`, `client`; `client` → `op`, `cost`, `swap`; everything
//! → `error`.
//!
//! ## Use
//!
//! ```no_run
//! use burn_flex::Flex;
//! use remat_burn_server::{serve, RemoteDtr, ServeConfig};
//! use remat_dtr::DtrConfig;
//!
//! // The server: one DTR device over Flex, 8 MiB, on a free localhost port.
//! let server = serve::<Flex>(ServeConfig::new(
//!     Default::default(),
//!     DtrConfig::default().with_budget(8 << 20),
//! ))?;
//! // The client: a stock burn 0.22 device; train with `remat.device().autodiff()`.
//! let remat = RemoteDtr::connect(&server.url())?;
//! let device = remat.device().autodiff();
//! # let _ = device;
//! // … forward, backward, optimizer step …
//! remat.end_step(); // after each optimizer step
//! println!("{}", remat.stats()?);
//! server.shutdown()?;
//! # Ok::<(), remat_burn_server::Error>(())
//! ```
//!
//! ## What differs from `remat-burn` (Burn 0.21)
//!
//! - **Steps end with [`RemoteDtr::end_step`]** (a custom op that seals the
//!   device and ends the runtime's iteration), not with an optimizer wrapper:
//!   burn-optim 0.22's optimizers are not generic over a backend.
//! - **Every op crosses a loopback socket**, batched by the client; only
//!   reads and syncs wait. What that costs per op is in `docs/burn.md`.
//! - **Errors reach the client as Burn's**: a failed op's outputs fail to
//!   read (`try_into_data`), and the next `Device::sync` reports the first
//!   failure; [`RemoteDtr::stats`] carries the counters.
//! - Not yet here: cubecl's pool calibration (`calibrate`), Burn's fusion
//!   over the client (ops must reach the server one by one).

mod channel;
mod client;
mod cost;
mod device;
mod error;
mod op;
mod remote;
mod serve;
mod swap;

pub use channel::{DtrBridge, DtrChannel};
pub use client::{DtrClient, DtrStats};
pub use cost::CostModel;
pub use device::{DeviceMemory, DtrDevice, DtrOptions};
pub use error::{Error, Result};
pub use op::Resident;
pub use remote::{RemoteDtr, RemoteStats};
pub use serve::{serve, ServeConfig, Server};
pub use swap::SwapFaults;

/// Re-exported so that users name one version of the DTR runtime's config.
pub use remat_dtr;

/// Burn 0.22 backend with Dynamic Tensor Rematerialization over the inner
/// backend `B` (served by [`serve`]).
pub type Dtr<B> = burn_router::BackendRouter<DtrChannel<B>>;
