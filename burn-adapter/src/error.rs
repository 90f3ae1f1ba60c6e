//! The crate's typed errors.

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error `remat-burn` reports.
///
/// Burn's backend traits return no errors from tensor operations, so an error met
/// while running an op is kept by the device's client (the client is then
/// *poisoned*: later ops are skipped) and surfaces as a Burn `ExecutionError` from
/// the next read (`Tensor::try_into_data`) or `Backend::sync`, and as this typed
/// value from [`DtrDevice::take_error`](crate::DtrDevice::take_error).
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
    /// The device's client was poisoned by an earlier error (taken out with
    /// [`DtrDevice::take_error`](crate::DtrDevice::take_error)); ops are skipped
    /// until then.
    #[error("device poisoned by an earlier error: {0}")]
    Poisoned(String),
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
}
