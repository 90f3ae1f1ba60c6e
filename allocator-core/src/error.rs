//! The crate's error type. One enum; an out-of-memory error carries its figures.

use crate::config::ConfigError;
use crate::device::{DeviceError, DevicePtr};
use crate::size::format_size;
use std::fmt;

/// Everything that can go wrong in `remat-alloc`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// No memory could be found or obtained for a request, after freeing cached
    /// segments and retrying. Prints PyTorch's message.
    #[error(transparent)]
    OutOfMemory(#[from] OutOfMemoryError),
    /// A request of 1 EiB (2^60 bytes) or more, refused before anything else.
    #[error("{kind} out of memory. Tried to allocate more than 1EB memory (requested {requested} bytes).")]
    RequestTooLarge {
        /// The word for the device, e.g. "CUDA".
        kind: &'static str,
        /// Bytes asked for.
        requested: usize,
    },
    /// A request of zero bytes. Allowed sizes are 1 byte up to (excluding) 1 EiB.
    #[error("invalid allocation size 0: allowed sizes are 1 byte up to (excluding) 1 EiB")]
    ZeroSize,
    /// A handle whose allocation was already freed (a double free) or is otherwise
    /// no longer live in this allocator.
    #[error("invalid allocation handle {ptr:#x}: {reason}")]
    InvalidHandle {
        /// Address the handle names.
        ptr: DevicePtr,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A handle issued by a different allocator instance.
    #[error(
        "allocation handle {ptr:#x} belongs to allocator #{owner}, not to this allocator #{this}"
    )]
    ForeignHandle {
        /// Address the handle names.
        ptr: DevicePtr,
        /// Id of the allocator that issued it.
        owner: u32,
        /// Id of the allocator it was given to.
        this: u32,
    },
    /// A memory fraction outside [0, 1].
    #[error("invalid fraction: {value}. Please set within [0, 1].")]
    InvalidFraction {
        /// The rejected value.
        value: f64,
    },
    /// A host (pinned) block would take the page-locked bytes held from the
    /// provider past the host budget, even after the cached free blocks were
    /// returned (see [`crate::host::HostAllocatorOptions::budget`]).
    #[error(
        "host budget exceeded: a request of {requested} bytes needs a {rounded}-byte pinned block, \
         but {pinned} of the {budget}-byte host budget are held (cached blocks already released)"
    )]
    HostBudgetExceeded {
        /// Bytes asked for.
        requested: usize,
        /// The request rounded up to a power of two (what the block would hold).
        rounded: usize,
        /// The host budget, in bytes.
        budget: usize,
        /// Page-locked bytes held when the request failed.
        pinned: usize,
    },
    /// A bad argument to an allocator method (not a size: those have their own
    /// variants).
    #[error("invalid {what}: {value}; allowed: {allowed}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
        /// The value received.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// A bad configuration string.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A setting the device cannot honour, e.g. `expandable_segments:True` on a
    /// device without virtual memory. Never silently ignored.
    #[error("{setting} is not supported by the {kind} device: {reason}")]
    Unsupported {
        /// The setting.
        setting: &'static str,
        /// The device kind.
        kind: &'static str,
        /// What is missing.
        reason: &'static str,
    },
    /// A device error other than out-of-memory (propagated at once, never retried).
    #[error(transparent)]
    Device(DeviceError),
    /// A broken internal invariant: this is a bug in remat-alloc.
    #[error("internal error (this is a bug in remat-alloc): {0}")]
    Internal(String),
}

impl Error {
    /// True for [`Error::OutOfMemory`] and [`Error::RequestTooLarge`]: the
    /// errors a caller such as DTR answers by freeing memory and retrying.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory(_) | Error::RequestTooLarge { .. })
    }
}

/// The figures of a failed allocation. `Display` prints PyTorch's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemoryError {
    /// Device kind word, e.g. "CUDA" (from [`crate::Device::kind`]).
    pub device_kind: &'static str,
    /// Device index.
    pub device_index: usize,
    /// Bytes the caller asked for.
    pub requested: usize,
    /// The request rounded (what a block would have cost).
    pub rounded: usize,
    /// The segment that would have been requested from the device (PyTorch
    /// prints this as "Tried to allocate").
    pub alloc_size: usize,
    /// Total device memory.
    pub total_capacity: usize,
    /// Free device memory as the device reports it.
    pub device_free: usize,
    /// The memory-fraction limit, when one is set.
    pub allowed: Option<usize>,
    /// Bytes handed out to callers (`allocated_bytes.all.current`).
    pub allocated: usize,
    /// Bytes held from the device (`reserved_bytes.all.current`).
    pub reserved: usize,
    /// `max_split_size` in bytes (`usize::MAX` = unlimited).
    pub max_split_size: usize,
    /// Whether expandable segments were in use.
    pub expandable_segments: bool,
}

impl OutOfMemoryError {
    /// Reserved from the device but not handed out: cached free blocks, the
    /// fragmentation the hint is about.
    pub fn reserved_unallocated(&self) -> usize {
        self.reserved.saturating_sub(self.allocated)
    }
}

impl std::error::Error for OutOfMemoryError {}

impl fmt::Display for OutOfMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fs = |n: usize| format_size(n as u64);
        let unit = if self.device_kind == "CUDA" {
            "GPU"
        } else {
            "Device"
        };
        write!(
            f,
            "{} out of memory. Tried to allocate {}. {} {} has a total capacity of {} of which {} is free. ",
            self.device_kind,
            fs(self.alloc_size),
            unit,
            self.device_index,
            fs(self.total_capacity),
            fs(self.device_free),
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, "{} allowed; ", fs(allowed))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by remat, and {} is reserved by remat but unallocated.",
            fs(self.allocated),
            fs(self.reserved_unallocated()),
        )?;
        if !self.expandable_segments {
            write!(
                f,
                " If reserved but unallocated memory is large try setting REMAT_ALLOC_CONF=expandable_segments:True to avoid fragmentation"
            )?;
            if self.max_split_size == usize::MAX {
                write!(
                    f,
                    " (or max_split_size_mb:<N> to stop large cached blocks from being split)"
                )?;
            }
            write!(f, ".")?;
        }
        write!(
            f,
            "  See the README's Configuration section (PYTORCH_CUDA_ALLOC_CONF syntax)."
        )
    }
}
