//! The crate's typed errors.

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error `remat-burn-server` reports.
///
/// Burn's backend traits return no errors from tensor operations, so an op that
/// fails marks its outputs as *not computed*: reading one (`Tensor::try_into_data`,
/// or the panic of `into_data`) returns a Burn `ExecutionError` whose text is this
/// error's, figures included; an op that reads one is not run and its outputs are
/// not computed either. Every other tensor, and every later op, works as before:
/// one failure does not poison the device. The next `Backend::sync` reports the
/// first failure since the previous sync, and
/// [`DtrDevice::take_error`](crate::DtrDevice::take_error) hands out the typed
/// first failure since the previous take.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The DTR runtime failed, for instance with
    /// [`remat_dtr::Error::ImpossibleBudget`] when no eviction can make room.
    #[error(transparent)]
    Dtr(#[from] remat_dtr::Error),
    /// `REMAT_DTR_CONF` could not be parsed.
    #[error("REMAT_DTR_CONF: {0}")]
    Config(#[from] remat_dtr::ConfigError),
    /// An op named a tensor this device does not know (released, or produced by an
    /// op that failed earlier).
    #[error("unknown tensor {0} on this DTR device")]
    UnknownTensor(u64),
    /// The tensor was not computed: the op that produces it, or one it depends
    /// on, failed with this message (the typed error is the one
    /// [`DtrDevice::take_error`](crate::DtrDevice::take_error) returns).
    #[error("{0}")]
    Failed(std::sync::Arc<str>),
    /// An operation the adapter cannot run (custom or distributed ops).
    #[error("unsupported operation: {0}")]
    Unsupported(String),
    /// The inner backend reported an error (a failed sync, an unreadable
    /// memory pool), in its words.
    #[error("inner backend: {0}")]
    Inner(String),
    /// A device slot that was never created.
    #[error("unknown DTR device slot {0}")]
    UnknownDevice(u16),
    /// [`crate::serve`] could not listen on the address (a port already
    /// taken: pass another port, or port 0 for a free one).
    #[error("cannot listen on {address}: {source} (another port, or port 0 for a free one)")]
    Bind {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The server's thread or runtime could not start.
    #[error("server: {0}")]
    Io(std::io::Error),
    /// The server failed while serving (burn-remote's words).
    #[error("server failed while serving: {0}")]
    Serve(String),
    /// [`crate::RemoteDtr::connect`] could not reach the server.
    #[error("cannot connect to the DTR server at {url}: {reason}")]
    Connect {
        /// The url asked for.
        url: String,
        /// burn-remote's reason.
        reason: String,
    },
    /// [`crate::RemoteDtr::new`] was given a device that is not a remote one.
    #[error(
        "not a remote device: {0} (connect one with RemoteDtr::connect or Device::remote_options)"
    )]
    NotRemote(String),
    /// A remat call on a remote device failed (the server's reason).
    #[error("remote DTR device: {0}")]
    Remote(String),
    /// All 65 535 device slots are in use.
    #[error("too many DTR devices (at most {max})")]
    TooManyDevices {
        /// The limit.
        max: usize,
    },
}

impl Error {
    /// The impossible-budget report, when this is one.
    pub fn impossible_budget(&self) -> Option<&remat_dtr::ImpossibleBudget> {
        match self {
            Error::Dtr(remat_dtr::Error::ImpossibleBudget(report)) => Some(report),
            _ => None,
        }
    }

    /// The failed copy to or from the host tier, when this is one (a swap-in
    /// that failed: the host copy is kept, and a later use copies it back).
    pub fn transfer(&self) -> Option<&remat_dtr::TransferError> {
        match self {
            Error::Dtr(remat_dtr::Error::Transfer(e)) => Some(e),
            _ => None,
        }
    }
}
