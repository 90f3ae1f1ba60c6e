//! Errors: candle's `Result`/`Error` at the API surface, remat's typed errors
//! carried inside.
//!
//! Every public function returns [`Result`], which is `candle_core::Result`, so
//! model code written for candle compiles unchanged: a tail
//! `self.linear.forward(xs)`, `candle_core::bail!`, and `?` on plain candle calls
//! all work in a function returning `remat_candle::Result`. The crate's own
//! failures are the typed [`Error`] (an impossible budget with its figures, a
//! context mismatch, an unsupported argument). They travel inside
//! `candle_core::Error::WrappedContext` (candle's variant for a boxed
//! `std::error::Error`; its context text is [`Error::hint`], so candle prints the
//! error, then what to do about it), and [`Error::downcast_ref`] / [`Error::downcast`] (or the
//! [`CandleErrorExt`] methods on candle's error) recover them, through any
//! `.context(..)`, `.bt()` or `.with_path(..)` layers added on the way.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use remat_candle::{CandleErrorExt, Error, Remat};
//! # fn main() -> remat_candle::Result<()> {
//! let t = Tensor::ones(2, DType::F32, &Device::Cpu)?;
//! let (a, b) = (Remat::unbounded()?.input(&t)?, Remat::unbounded()?.input(&t)?);
//! let e = a.add(&b).unwrap_err(); // a candle_core::Error
//! assert!(matches!(e.remat_error(), Some(Error::ContextMismatch { op: "add" })));
//! # Ok(()) }
//! ```

/// `Result` with candle's error: what every public function of this crate returns.
pub type Result<T, E = candle_core::Error> = std::result::Result<T, E>;

/// `Result` with the typed [`Error`], used inside the crate.
pub(crate) type Typed<T> = std::result::Result<T, Error>;

/// Every error `remat-candle` raises itself. Public functions return it inside a
/// `candle_core::Error` (see the module doc); recover it with
/// [`Error::downcast_ref`].
#[derive(thiserror::Error)]
pub enum Error {
    /// A candle operation failed (shape mismatch, unsupported dtype, device error).
    #[error("candle: {0}")]
    Candle(candle_core::Error),
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

impl std::fmt::Debug for Error {
    /// The message, as candle's own errors print with `{:?}` (a `main` returning
    /// an error shows it readably).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl Error {
    /// An [`Error::Unsupported`] for `op`, as candle's error.
    pub(crate) fn unsupported(op: &'static str, message: impl Into<String>) -> candle_core::Error {
        Error::Unsupported {
            op,
            message: message.into(),
        }
        .into()
    }

    /// What to do about this error, one line: the context text of the
    /// `WrappedContext` layer that carries it in candle's error. candle prints
    /// that layer as the error, then this text on a second line.
    pub fn hint(&self) -> &'static str {
        match self {
            Error::Candle(_) => "remat-candle: a candle op failed",
            Error::Dtr(remat_dtr::Error::ImpossibleBudget(_)) => {
                "remat-candle: the step does not fit this budget; raise it \
                 (Remat::min_feasible_budget gives the smallest that fits)"
            }
            Error::Dtr(remat_dtr::Error::DeviceOutOfMemory(_)) => {
                "remat-candle: the device ran out of memory with nothing left to evict; \
                 set a budget below the device's free memory"
            }
            Error::Dtr(remat_dtr::Error::ComputeLimit { .. }) => {
                "remat-candle: the budget makes the step thrash; raise it"
            }
            Error::Dtr(remat_dtr::Error::Transfer(_)) => {
                "remat-candle: a copy back from host memory failed; nothing was lost \
                 (the host copy is kept): run the op again"
            }
            Error::Dtr(_) => "remat-candle: raised by the DTR runtime (remat-dtr)",
            Error::ContextMismatch { .. } => {
                "remat-candle: build the tensors of one model in one Remat context"
            }
            Error::Unsupported { .. } => {
                "remat-candle: docs/candle.md lists what is not covered and what to do instead"
            }
            Error::Poisoned => "remat-candle: create a new Remat context",
        }
    }

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

    /// The typed error carried by candle's error `e`, looking through context,
    /// backtrace and path layers; `None` when `e` is candle's own.
    pub fn downcast_ref(e: &candle_core::Error) -> Option<&Error> {
        match e {
            candle_core::Error::WrappedContext { wrapped, .. } => wrapped.downcast_ref::<Error>(),
            candle_core::Error::WithBacktrace { inner, .. }
            | candle_core::Error::Context { inner, .. }
            | candle_core::Error::WithPath { inner, .. } => Self::downcast_ref(inner),
            _ => None,
        }
    }

    /// Take the typed error out of candle's error `e` (context and backtrace
    /// layers around it are dropped); `Err(e)` when `e` carries none.
    pub fn downcast(e: candle_core::Error) -> std::result::Result<Error, candle_core::Error> {
        if Self::downcast_ref(&e).is_none() {
            return Err(e);
        }
        match e {
            candle_core::Error::WrappedContext { wrapped, context } => {
                match wrapped.downcast::<Error>() {
                    Ok(ours) => Ok(*ours),
                    Err(wrapped) => Err(candle_core::Error::WrappedContext { wrapped, context }),
                }
            }
            candle_core::Error::WithBacktrace { inner, .. }
            | candle_core::Error::Context { inner, .. }
            | candle_core::Error::WithPath { inner, .. } => Self::downcast(*inner),
            other => Err(other),
        }
    }
}

impl From<candle_core::Error> for Error {
    /// candle's error, or the typed error it carries.
    fn from(e: candle_core::Error) -> Self {
        Error::downcast(e).unwrap_or_else(Error::Candle)
    }
}

impl From<Error> for candle_core::Error {
    /// [`Error::Candle`] gives candle's error back; every other variant is carried
    /// in `WrappedContext`, recoverable with [`Error::downcast_ref`].
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => c,
            other => {
                let context = other.hint().into();
                candle_core::Error::WrappedContext {
                    wrapped: Box::new(other),
                    context,
                }
            }
        }
    }
}

/// Methods on candle's error for the typed [`Error`] it may carry.
pub trait CandleErrorExt {
    /// The carried [`Error`], if any ([`Error::downcast_ref`]).
    fn remat_error(&self) -> Option<&Error>;
    /// True when it carries an impossible budget.
    fn is_impossible_budget(&self) -> bool {
        self.remat_error().is_some_and(Error::is_impossible_budget)
    }
    /// The impossible-budget figures, when it carries one.
    fn impossible_budget(&self) -> Option<&remat_dtr::ImpossibleBudget> {
        self.remat_error().and_then(Error::impossible_budget)
    }
    /// The DTR runtime's error, when it carries one.
    fn dtr_error(&self) -> Option<&remat_dtr::Error> {
        match self.remat_error() {
            Some(Error::Dtr(e)) => Some(e),
            _ => None,
        }
    }
}

impl CandleErrorExt for candle_core::Error {
    fn remat_error(&self) -> Option<&Error> {
        Error::downcast_ref(self)
    }
}

/// Convert a runtime result to candle's at the API surface.
pub(crate) trait DtrResultExt<T> {
    /// The runtime's error as a typed [`Error::Dtr`] inside candle's error.
    fn c(self) -> Result<T>;
}

impl<T> DtrResultExt<T> for remat_dtr::Result<T> {
    fn c(self) -> Result<T> {
        self.map_err(|e| Error::Dtr(e).into())
    }
}
