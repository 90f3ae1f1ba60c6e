//! Snapshots of the allocator's segments and blocks, and the alloc/free trace.
//!
//! The layout follows `torch.cuda.memory._snapshot()`: segments (sorted by
//! address) with their blocks, one trace list per device, and the allocator
//! settings. With the `serde` feature a snapshot exports as JSON and as the pickle
//! that PyTorch's memory_viz page (`pytorch.org/memory_viz`) opens.

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
    /// Microseconds since the allocator was created.
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
    use serde_json::{json, Value};

    impl Snapshot {
        /// The snapshot as the dictionary `torch.cuda.memory._snapshot()` returns.
        pub fn to_value(&self) -> Value {
            let segments: Vec<Value> = self
                .segments
                .iter()
                .map(|s| {
                    let blocks: Vec<Value> = s
                        .blocks
                        .iter()
                        .map(|b| {
                            json!({
                                "address": b.address, "size": b.size,
                                "requested_size": b.requested_size,
                                "state": b.state.as_str(), "frames": [],
                            })
                        })
                        .collect();
                    json!({
                        "device": s.device, "address": s.address, "total_size": s.total_size,
                        "allocated_size": s.allocated_size, "active_size": s.active_size,
                        "requested_size": s.requested_size, "stream": s.stream.0,
                        "segment_type": s.segment_type, "segment_pool_id": [0, 0],
                        "is_expandable": s.is_expandable, "frames": [], "blocks": blocks,
                    })
                })
                .collect();
            let traces: Vec<Value> = self
                .device_traces
                .iter()
                .map(|t| {
                    let addr_key = if t.action == TraceAction::Oom {
                        "device_free"
                    } else {
                        "addr"
                    };
                    json!({
                        "action": t.action.as_str(), addr_key: t.addr, "size": t.size,
                        "stream": t.stream.0, "time_us": t.time_us, "frames": [],
                    })
                })
                .collect();
            let settings: serde_json::Map<String, Value> = self
                .allocator_settings
                .iter()
                .map(|(k, v)| ((*k).to_string(), Value::String(v.clone())))
                .collect();
            json!({ "segments": segments, "device_traces": [traces], "allocator_settings": settings })
        }

        /// JSON text of [`Snapshot::to_value`].
        pub fn to_json(&self) -> String {
            self.to_value().to_string()
        }

        /// Pickle bytes of [`Snapshot::to_value`]: save as `snapshot.pickle` and
        /// drop it on PyTorch's memory_viz page.
        pub fn to_pickle(&self) -> Result<Vec<u8>, serde_pickle::Error> {
            serde_pickle::to_vec(&self.to_value(), serde_pickle::SerOptions::new())
        }
    }
}
