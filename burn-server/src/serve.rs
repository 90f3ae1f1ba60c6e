//! [`serve`]: one DTR device behind burn-remote's WebSocket server, on a thread
//! of its own, with remat's calls as custom ops.
//!
//! The listening socket is bound here (a taken port is [`Error::Bind`] before
//! anything starts), on `127.0.0.1` unless told otherwise: burn-remote's
//! WebSocket transport is unencrypted and unauthenticated. [`Server::shutdown`]
//! (or dropping the [`Server`]) ends the sessions and joins the thread.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::thread::JoinHandle;
use std::time::Duration;

use burn_backend::ops::FloatTensorOps;
use burn_backend::TensorData;
use burn_ir::{BackendIr, CustomOpIr, HandleContainer};
use burn_remote::server::{BackendServer, CustomOpRegistry, WebSocketTransport};

use crate::cost::CostModel;
use crate::device::{DtrDevice, DtrOptions};
use crate::error::{Error, Result};
use crate::remote::{stats_values, END_STEP, FLOOR, STATS, STATS_LEN};
use crate::Dtr;

/// How to serve: the inner device, the DTR options, the address.
#[derive(Debug, Clone)]
pub struct ServeConfig<B: BackendIr> {
    /// The inner backend's device the DTR device runs on.
    pub inner: B::Device,
    /// Budget, policy, cost model, host tier (see [`DtrOptions`]).
    pub options: DtrOptions,
    /// Where to listen. `127.0.0.1:0` (localhost, a free port) unless set;
    /// [`Server::url`] says which port was taken.
    pub address: SocketAddr,
}

impl<B: BackendIr> ServeConfig<B> {
    /// Serve a DTR device over `inner` configured by `config`, on localhost
    /// at a free port.
    pub fn new(inner: B::Device, config: remat_dtr::DtrConfig) -> Self {
        Self {
            inner,
            options: DtrOptions::new(config),
            address: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
        }
    }

    /// Replace the DTR options (cost model, host tier, …).
    pub fn with_options(mut self, options: DtrOptions) -> Self {
        self.options = options;
        self
    }

    /// Take op costs with `cost` (see [`CostModel`]; wall-clock unless set).
    pub fn with_cost_model(mut self, cost: CostModel) -> Self {
        self.options.cost = cost;
        self
    }

    /// Listen on `address` (a non-loopback address exposes the device to the
    /// network, unencrypted: burn-remote's WebSocket transport).
    pub fn with_address(mut self, address: SocketAddr) -> Self {
        self.address = address;
        self
    }
}

/// A running server of one DTR device. Dropping it shuts it down.
///
/// Serve one training process per server: every session shares the device,
/// its budget and its steps ([`crate::RemoteDtr::end_step`] seals all of it).
pub struct Server<B: BackendIr> {
    address: SocketAddr,
    device: DtrDevice<B>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<std::result::Result<(), String>>>,
}

impl<B: BackendIr> std::fmt::Debug for Server<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("address", &self.address)
            .field("device", &self.device)
            .finish()
    }
}

impl<B: BackendIr> Server<B> {
    /// The address it listens on (the port the OS chose for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `ws://<address>`, for [`crate::RemoteDtr::connect`] or
    /// `RemoteHost::websocket`.
    pub fn url(&self) -> String {
        format!("ws://{}", self.address)
    }

    /// The DTR device it serves (stats, errors, invariants, in process).
    pub fn device(&self) -> &DtrDevice<B> {
        &self.device
    }

    /// End the sessions, stop listening and join the server's thread.
    ///
    /// Errors: [`Error::Serve`] when the server had failed while serving.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            // The thread may have ended already (a failed serve): then the
            // receiver is gone and the join below says why.
            let _ = stop.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(Error::Serve(e)),
            Some(Err(_)) => Err(Error::Serve("the server's thread panicked".into())),
        }
    }
}

impl<B: BackendIr> Drop for Server<B> {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Serve a new DTR device (see [`ServeConfig`]) to burn-remote clients until
/// the returned [`Server`] is shut down or dropped.
///
/// Errors: [`Error::Bind`] when the address cannot be listened on (a port
/// already taken), the device's configuration errors ([`Error::Config`],
/// [`Error::Dtr`]) before anything listens, [`Error::Io`] when the server's
/// thread or runtime cannot start.
pub fn serve<B: BackendIr>(config: ServeConfig<B>) -> Result<Server<B>> {
    let device = DtrDevice::<B>::with_options(config.inner, config.options)?;
    // Start its client now, so that a bad configuration fails here and not
    // on the first op of the first session.
    let _ = device.stats();
    if let Some(e) = device.take_error() {
        return Err(e);
    }
    let listener = std::net::TcpListener::bind(config.address).map_err(|source| Error::Bind {
        address: config.address,
        source,
    })?;
    let address = listener.local_addr().map_err(Error::Io)?;
    let server = BackendServer::<Dtr<B>>::new([device.clone()]).with_custom_ops(custom_ops::<B>());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("remat-burn-server")
        .enable_all()
        .build()
        .map_err(Error::Io)?;
    let serving = server.serve_async(WebSocketTransport::from_listener(listener));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("remat-burn-server".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                tokio::select! {
                    served = serving => served.map_err(|e| e.to_string()),
                    _ = stopped => Ok(()),
                }
            });
            runtime.shutdown_timeout(Duration::from_secs(5));
            served
        })
        .map_err(Error::Io)?;
    Ok(Server {
        address,
        device,
        stop: Some(stop),
        thread: Some(thread),
    })
}

type Handles<B> = HandleContainer<<Dtr<B> as BackendIr>::Handle>;

/// remat's calls, as burn-remote custom ops of [`Dtr<B>`].
fn custom_ops<B: BackendIr>() -> CustomOpRegistry<Dtr<B>> {
    let mut ops = CustomOpRegistry::<Dtr<B>>::new();
    ops.register(
        END_STEP,
        |_: &mut Handles<B>, _: &CustomOpIr, device: &DtrDevice<B>| {
            // A failure is kept for the next sync (ops return nothing).
            if let Err(e) = device.seal().and_then(|_| device.end_iteration()) {
                device.report(e);
            }
        },
    );
    ops.register(
        STATS,
        |handles: &mut Handles<B>, ir: &CustomOpIr, device: &DtrDevice<B>| {
            let values = stats_values(&device.stats());
            debug_assert_eq!(values.len(), STATS_LEN);
            register_output::<B>(handles, ir, device, values);
        },
    );
    ops.register(
        FLOOR,
        |handles: &mut Handles<B>, ir: &CustomOpIr, device: &DtrDevice<B>| {
            let answer = match ir.scalars.first().map(|s| s.elem::<f64>()) {
                Some(max_overhead) => device.min_feasible_budget(max_overhead),
                None => Err(Error::Unsupported(format!(
                    "`{FLOOR}` takes one scalar (the most overhead)"
                ))),
            };
            let values = match answer {
                Ok(bytes) => vec![bytes as f64, 1.0],
                Err(e) => {
                    device.report(e);
                    vec![0.0, 0.0]
                }
            };
            register_output::<B>(handles, ir, device, values);
        },
    );
    ops
}

/// Upload `values` as the custom op's only output (an `f64` vector).
fn register_output<B: BackendIr>(
    handles: &mut Handles<B>,
    ir: &CustomOpIr,
    device: &DtrDevice<B>,
    values: Vec<f64>,
) {
    let Some(out) = ir.outputs.first() else {
        device.report(Error::Unsupported(format!(
            "custom op `{}` without its output",
            ir.id
        )));
        return;
    };
    let n = values.len();
    let t =
        <Dtr<B> as FloatTensorOps<Dtr<B>>>::float_from_data(TensorData::new(values, [n]), device);
    handles.register_float_tensor::<Dtr<B>>(&out.id, t);
}
