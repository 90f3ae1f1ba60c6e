//! Snapshots of the allocator's segments and blocks, and the alloc/free trace.
//!
//! The layout follows `torch.cuda.memory._snapshot()`: segments (sorted by
//! address) with their blocks, one trace list per device, and the allocator
//! settings. With the `serde` feature a snapshot exports as JSON and as the pickle
//! that PyTorch's memory viewer opens: the memory_viz page
//! (`pytorch.org/memory_viz`) and `python -m torch.cuda._memory_viz`.

use crate::device::{DevicePtr, StreamId};

/// State of a block in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller but waiting for other streams' events.
    ActivePendingFree,
    /// Free, cached.
    Inactive,
    /// An unmapped range of an expandable segment (not listed by PyTorch; kept
    /// out of `segments` and only reported by [`crate::CachingAllocator::blocks`]).
    Unmapped,
}

impl BlockState {
    /// PyTorch's name: `"active_allocated"`, `"active_pending_free"`, `"inactive"`.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Unmapped => "unmapped",
        }
    }
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSnapshot {
    /// Start address.
    pub address: DevicePtr,
    /// Bytes.
    pub size: usize,
    /// The caller's unrounded size at the last allocation (0 if never allocated).
    pub requested_size: usize,
    /// State.
    pub state: BlockState,
}

/// One segment: a device allocation, or a contiguous mapped range of an
/// expandable segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSnapshot {
    /// Device index.
    pub device: usize,
    /// Start address.
    pub address: DevicePtr,
    /// Bytes of the segment.
    pub total_size: usize,
    /// Bytes of allocated blocks.
    pub allocated_size: usize,
    /// Bytes of active blocks (allocated or pending free).
    pub active_size: usize,
    /// Σ requested bytes of active blocks.
    pub requested_size: usize,
    /// Allocation stream.
    pub stream: StreamId,
    /// `"small"` or `"large"`.
    pub segment_type: &'static str,
    /// Whether the segment is a mapped range of an expandable segment.
    pub is_expandable: bool,
    /// Blocks in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// What a trace entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block was handed out.
    Alloc,
    /// A caller freed a block (it may still wait for other streams).
    FreeRequested,
    /// The block returned to its pool.
    FreeCompleted,
    /// A segment was allocated from the device.
    SegmentAlloc,
    /// A segment was returned to the device.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// A snapshot was taken.
    Snapshot,
    /// An out-of-memory error was returned (`addr` holds the device's free bytes).
    Oom,
}

impl TraceAction {
    /// PyTorch's name, e.g. `"segment_alloc"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
        }
    }
}

/// One entry of the allocator's trace ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Address (for [`TraceAction::Oom`]: the device's free bytes).
    pub addr: u64,
    /// Bytes.
    pub size: usize,
    /// Stream.
    pub stream: StreamId,
    /// When it happened, in microseconds since the Unix epoch (as PyTorch's
    /// `time_us`): the wall clock read when the allocator was created plus the
    /// monotonic time elapsed since, so entries never go back in time.
    pub time_us: u64,
}

/// Which events the trace records (`torch.cuda.memory._record_memory_history`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Ring-buffer capacity (≥ 1).
    pub max_entries: usize,
    /// Actions never recorded.
    pub skip_actions: Vec<TraceAction>,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            max_entries: 100_000,
            skip_actions: Vec::new(),
        }
    }
}

/// A snapshot of the allocator.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Segments in address order.
    pub segments: Vec<SegmentSnapshot>,
    /// The trace, oldest first (empty unless history recording is on).
    pub device_traces: Vec<TraceEntry>,
    /// Effective allocator settings (key, value).
    pub allocator_settings: Vec<(&'static str, String)>,
}

impl Snapshot {
    /// Σ `total_size` of the segments.
    pub fn reserved_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Σ `allocated_size` of the segments.
    pub fn allocated_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.allocated_size).sum()
    }
}

#[cfg(feature = "serde")]
mod export {
    use super::*;
    use crate::pickle::{self, PyObject};
    use serde_json::Value;

    impl Snapshot {
        /// The dictionary `torch.cuda.memory._snapshot()` returns, as the Python
        /// object both exports are written from.
        fn to_py(&self) -> PyObject {
            let frames = || ("frames", PyObject::List(Vec::new()));
            let segments = self
                .segments
                .iter()
                .map(|s| {
                    let blocks = s
                        .blocks
                        .iter()
                        .map(|b| {
                            PyObject::Dict(vec![
                                ("address", PyObject::int(b.address)),
                                ("size", PyObject::usize(b.size)),
                                ("requested_size", PyObject::usize(b.requested_size)),
                                ("state", PyObject::str(b.state.as_str())),
                                frames(),
                            ])
                        })
                        .collect();
                    PyObject::Dict(vec![
                        ("device", PyObject::usize(s.device)),
                        ("address", PyObject::int(s.address)),
                        ("total_size", PyObject::usize(s.total_size)),
                        ("allocated_size", PyObject::usize(s.allocated_size)),
                        ("active_size", PyObject::usize(s.active_size)),
                        ("requested_size", PyObject::usize(s.requested_size)),
                        ("stream", PyObject::int(s.stream.0)),
                        ("segment_type", PyObject::str(s.segment_type)),
                        // PyTorch: a (pool id, pool id) tuple; (0, 0) is the default pool.
                        (
                            "segment_pool_id",
                            PyObject::Tuple(vec![PyObject::Int(0), PyObject::Int(0)]),
                        ),
                        ("is_expandable", PyObject::Bool(s.is_expandable)),
                        frames(),
                        ("blocks", PyObject::List(blocks)),
                    ])
                })
                .collect();
            let traces = self
                .device_traces
                .iter()
                .map(|t| {
                    let addr_key = if t.action == TraceAction::Oom {
                        "device_free"
                    } else {
                        "addr"
                    };
                    PyObject::Dict(vec![
                        ("action", PyObject::str(t.action.as_str())),
                        (addr_key, PyObject::int(t.addr)),
                        ("size", PyObject::usize(t.size)),
                        ("stream", PyObject::int(t.stream.0)),
                        ("time_us", PyObject::int(t.time_us)),
                        frames(),
                    ])
                })
                .collect();
            let settings = self
                .allocator_settings
                .iter()
                .map(|(k, v)| (*k, PyObject::Str(v.clone().into())))
                .collect();
            PyObject::Dict(vec![
                ("segments", PyObject::List(segments)),
                (
                    "device_traces",
                    PyObject::List(vec![PyObject::List(traces)]),
                ),
                ("allocator_settings", PyObject::Dict(settings)),
            ])
        }

        /// The snapshot as the dictionary `torch.cuda.memory._snapshot()` returns,
        /// in JSON (its tuples, such as `segment_pool_id`, become arrays).
        pub fn to_value(&self) -> Value {
            self.to_py().to_json()
        }

        /// JSON text of [`Snapshot::to_value`].
        pub fn to_json(&self) -> String {
            self.to_value().to_string()
        }

        /// The snapshot as the pickle `torch.cuda.memory._dump_snapshot` writes:
        /// protocol 4, integers in CPython's shortest form, tuples where PyTorch
        /// has tuples. Save it as `snapshot.pickle` and drop it on PyTorch's
        /// memory_viz page, or render it with
        /// `python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o out.html`.
        ///
        /// Writing cannot fail; the `Result` (with the uninhabited
        /// [`std::convert::Infallible`]) keeps `snapshot.to_pickle()?` callers
        /// compiling.
        pub fn to_pickle(&self) -> Result<Vec<u8>, std::convert::Infallible> {
            Ok(pickle::dumps(&self.to_py()))
        }
    }
}
