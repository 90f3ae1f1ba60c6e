//! The crate's error type: candle's errors, remat-dtr's errors (an impossible budget
//! among them, with its figures) and misuse of the adapter, in one enum.

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error `remat-candle` returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A candle operation failed (shape mismatch, unsupported dtype, device error).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The DTR runtime failed; [`remat_dtr::Error::ImpossibleBudget`] carries the
    /// figures (needed, budget, resident, evictable, pinned, fragmented).
    #[error("remat-dtr: {0}")]
    Dtr(#[from] remat_dtr::Error),
    /// Two tensors of different [`crate::Remat`] contexts were combined.
    #[error("tensors of different remat contexts were combined in `{op}`")]
    ContextMismatch {
        /// The op that received them.
        op: &'static str,
    },
    /// An argument the op does not support (named in the message).
    #[error("`{op}`: {message}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// What is not supported.
        message: String,
    },
    /// The runtime lock was poisoned by a panic on another thread.
    #[error("the remat runtime lock is poisoned (a thread panicked while holding it)")]
    Poisoned,
}

impl Error {
    /// True when this is an impossible budget reported by the DTR runtime.
    pub fn is_impossible_budget(&self) -> bool {
        matches!(self, Error::Dtr(e) if e.is_impossible_budget())
    }

    /// The impossible-budget figures, when this is one.
    pub fn impossible_budget(&self) -> Option<&remat_dtr::ImpossibleBudget> {
        match self {
            Error::Dtr(remat_dtr::Error::ImpossibleBudget(b)) => Some(b),
            _ => None,
        }
    }
}

impl From<Error> for candle_core::Error {
    /// Lets model code that returns `candle_core::Result` use `?` on adapter calls.
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => c,
            other => candle_core::Error::Wrapped(Box::new(other)),
        }
    }
}
