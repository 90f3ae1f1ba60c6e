//! Typed errors: one enum for the crate, an [`ImpossibleBudget`] report with the
//! figures that explain why no eviction can make room, and [`OpError`] for op handles.

use std::fmt;

use crate::ids::{StorageId, TensorId};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from an op handle's (re)computation, with a message from the adapter.
///
/// An op that failed because the *real* device ran out of memory (a CUDA OOM,
/// say, where the memory model is only an estimate of the device) says so with
/// [`OpError::out_of_memory`]: the runtime then evicts and calls it again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("op `{op}` failed: {message}")]
pub struct OpError {
    /// The op's name as the handle reports it.
    pub op: String,
    /// What went wrong, in the adapter's words.
    pub message: String,
    /// The device had no memory for the op's outputs or workspace; evicting
    /// resident storages and retrying may succeed.
    pub out_of_memory: bool,
}

impl OpError {
    /// An error for op `op` with a message.
    pub fn new(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            op: op.into(),
            message: message.into(),
            out_of_memory: false,
        }
    }

    /// The device ran out of memory while op `op` ran (retryable after eviction).
    pub fn out_of_memory(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            out_of_memory: true,
            ..Self::new(op, message)
        }
    }
}

/// A device out-of-memory error that eviction could not cure: the op kept
/// failing after every evictable storage was evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOutOfMemory {
    /// The op that ran out of memory.
    pub op: String,
    /// The device's last error, in the adapter's words.
    pub message: String,
    /// Times the op was called again after an eviction.
    pub retries: u32,
    /// The runtime's figures when it gave up (`needed` is the retry's hint: the
    /// op's fresh output bytes when the runtime knows them, else 0).
    pub figures: ImpossibleBudget,
}

impl fmt::Display for DeviceOutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "op `{}` ran out of device memory ({}) and nothing is left to evict after {} retries: {}",
            self.op, self.message, self.retries, self.figures
        )
    }
}

/// The reason an [`ImpossibleBudget`] names first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImpossibleCause {
    /// The request alone is larger than the budget.
    RequestExceedsBudget,
    /// The op being placed needs its inputs and all its fresh outputs
    /// resident at once, and they alone exceed the budget
    /// ([`ImpossibleBudget::op`]).
    OpWorkingSetExceedsBudget,
    /// What must stay resident (pinned, not recomputable, below the minimum
    /// evictee) plus the request exceed the budget: no placement of any
    /// allocator can help; a larger budget or fewer pins can.
    #[default]
    WorkingSetExceedsBudget,
    /// The resident storages and the request fit the budget as requested, but
    /// not as the memory model rounds them (512 B blocks per storage in the
    /// physical model and its arena): the rounding is the missing margin.
    Rounding,
    /// The working set fits the budget but the memory model cannot place the
    /// request in one piece and cannot move its blocks (a planner simulation,
    /// or a plan being followed).
    Fragmentation,
}

impl ImpossibleCause {
    /// Short name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            ImpossibleCause::RequestExceedsBudget => "the request alone exceeds the budget",
            ImpossibleCause::OpWorkingSetExceedsBudget => {
                "the op's own inputs and outputs exceed the budget"
            }
            ImpossibleCause::WorkingSetExceedsBudget => {
                "what must stay resident plus the request exceed the budget"
            }
            ImpossibleCause::Rounding => {
                "the working set fits as requested, but not rounded to the memory model's blocks"
            }
            ImpossibleCause::Fragmentation => {
                "the free bytes would hold the request, but not in one piece"
            }
        }
    }
}

/// Why no eviction can make room: all figures in bytes at the moment of failure.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImpossibleBudget {
    /// The reason, from the figures below (sizes rounded as the memory model
    /// rounds them).
    pub cause: ImpossibleCause,
    /// The request that could not be placed (as asked, before allocator rounding).
    pub needed: u64,
    /// The budget (capacity of the memory model).
    pub budget: u64,
    /// Bytes of resident storages (allocated bytes).
    pub resident: u64,
    /// Resident bytes that an eviction could still free (none of them helped).
    pub evictable: u64,
    /// Resident bytes of recomputable storages that are pinned: the inputs and
    /// outputs of the op being placed, storages held by an in-flight
    /// regeneration, and user pins.
    pub pinned: u64,
    /// Resident bytes that can never be evicted: external tensors (inputs,
    /// parameters, optimizer state) and outputs of non-recomputable ops. A budget
    /// at or below this figure cannot work for any policy.
    pub not_recomputable: u64,
    /// Resident, recomputable, unpinned bytes below `min_evictee_bytes` (never
    /// candidates).
    pub below_min_evictee: u64,
    /// Free bytes inside the budget that could not hold the request (fragmentation:
    /// cached free blocks plus device memory not yet reserved).
    pub free_but_fragmented: u64,
    /// The op being placed, when its own working set (its inputs and its
    /// fresh outputs, all resident at once while it runs) exceeds the budget:
    /// then no policy, swap or placement can run it
    /// ([`ImpossibleCause::OpWorkingSetExceedsBudget`]).
    pub op: Option<OpWorkingSet>,
}

/// An op whose inputs and outputs alone exceed the budget.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpWorkingSet {
    /// The op's name.
    pub name: String,
    /// Bytes of its distinct input storages.
    pub input_bytes: u64,
    /// Bytes of its fresh outputs.
    pub output_bytes: u64,
}

impl OpWorkingSet {
    /// Inputs plus outputs.
    pub fn bytes(&self) -> u64 {
        self.input_bytes + self.output_bytes
    }
}

impl fmt::Display for ImpossibleBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot place {} B under a budget of {} B: {}; {} B resident ({} B evictable, {} B pinned, \
             {} B not recomputable, {} B below min_evictee_bytes), {} B free but fragmented",
            self.needed,
            self.budget,
            self.cause.name(),
            self.resident,
            self.evictable,
            self.pinned,
            self.not_recomputable,
            self.below_min_evictee,
            self.free_but_fragmented
        )?;
        if let Some(op) = &self.op {
            write!(
                f,
                "; op `{}` alone needs {} B resident at once ({} B of inputs, {} B of outputs)",
                op.name,
                op.bytes(),
                op.input_bytes,
                op.output_bytes
            )?;
        }
        Ok(())
    }
}

/// Every error `remat-dtr` returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No eviction can make room for a request: the budget is too small for what
    /// must stay resident (pinned inputs, external tensors, the op's own outputs).
    #[error("impossible budget: {0}")]
    ImpossibleBudget(Box<ImpossibleBudget>),
    /// The real device ran out of memory inside an op (see
    /// [`OpError::out_of_memory`]) and no eviction left could make it succeed.
    #[error("device out of memory: {0}")]
    DeviceOutOfMemory(Box<DeviceOutOfMemory>),
    /// A tensor handle that is not (or no longer) live.
    #[error("unknown or released tensor {0:?}")]
    UnknownTensor(TensorId),
    /// An output spec names an input index that does not exist.
    #[error("output {output} is a view of input {input}, but the op has {inputs} inputs")]
    BadViewIndex {
        /// Output position.
        output: usize,
        /// Input index it names.
        input: usize,
        /// Number of inputs.
        inputs: usize,
    },
    /// An op handle returned the wrong number of values.
    #[error("op `{op}` returned {got} values for {expected} fresh outputs")]
    OutputCount {
        /// Op name.
        op: String,
        /// Values returned.
        got: usize,
        /// Fresh outputs expected.
        expected: usize,
    },
    /// Unpin without a matching pin.
    #[error("unpin of tensor {0:?} that is not pinned")]
    NotPinned(TensorId),
    /// A storage that must be regenerated has no compute path (external data that
    /// was dropped, or a non-recomputable op's output). This is a bug in the caller
    /// or in remat-dtr.
    #[error("storage {0:?} is evicted and cannot be regenerated")]
    NotRegenerable(StorageId),
    /// A storage evicted in an earlier iteration would have to be recomputed: its
    /// inputs (the weights) may have been updated since, so the result could
    /// differ from the value it had. Read values before
    /// [`crate::Runtime::end_iteration`], or keep them resident until then.
    #[error(
        "storage {storage:?} was evicted in iteration {created_in} and cannot be recomputed in \
         iteration {current}: its inputs may have been updated since (read it before \
         end_iteration(), or keep it resident until then)"
    )]
    StaleValue {
        /// The storage.
        storage: StorageId,
        /// The iteration that computed it.
        created_in: u32,
        /// The current iteration.
        current: u32,
    },
    /// Rematerialization passed the compute limit set with
    /// [`crate::Runtime::set_compute_limit`] (the run is thrashing).
    #[error("compute limit of {limit_ns:.0} ns passed ({spent_ns:.0} ns spent): thrashing")]
    ComputeLimit {
        /// The limit.
        limit_ns: f64,
        /// Compute spent so far.
        spent_ns: f64,
    },
    /// A copy between the device and the host tier failed while swapping a
    /// storage back in: its host copy stays, the slot was freed, and the
    /// device is usable (see [`crate::swap`]).
    #[error("swap: {0}")]
    Transfer(#[from] crate::swap::TransferError),
    /// An op handle failed.
    #[error(transparent)]
    Op(#[from] OpError),
    /// The memory model failed for a reason other than lack of room.
    #[error("memory model: {0}")]
    Memory(String),
    /// A bad `REMAT_DTR_CONF` value.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An argument outside what the call accepts.
    #[error("bad `{name}`: {value} (expected {expected})")]
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A query that needs a recorded iteration found none.
    #[error("no recorded iteration: {why}")]
    NotRecorded {
        /// Why, and what to call.
        why: &'static str,
    },
    /// A trace does not parse or replay (see [`crate::export`]).
    #[error("trace: {0}")]
    Trace(#[from] remat_trace::TraceError),
    /// A trace file could not be written ([`crate::export::write_trace`]).
    #[error("cannot write trace {}: {source}", path.display())]
    TraceWrite {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Broken invariant: a bug in remat-dtr.
    #[error("internal error: {0} (this is a bug)")]
    Internal(String),
}

impl Error {
    /// True when this is an [`Error::ImpossibleBudget`].
    pub fn is_impossible_budget(&self) -> bool {
        matches!(self, Error::ImpossibleBudget(_))
    }

    /// True when memory ran out for good: an impossible budget in the memory
    /// model or a device out-of-memory that eviction could not cure.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Error::ImpossibleBudget(_) | Error::DeviceOutOfMemory(_)
        )
    }
}
