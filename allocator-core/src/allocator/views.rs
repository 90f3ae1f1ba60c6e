//! Views of `State`: the memory snapshot (which records its own trace entry)
//! and the block list.

use super::block::{Block, BlockId};
use super::state::State;
use super::BlockInfo;
use crate::device::{DevicePtr, StreamId};
use crate::snapshot::{BlockSnapshot, BlockState, SegmentSnapshot, Snapshot, TraceAction};

impl State {
    fn block_state(b: &Block) -> BlockState {
        if !b.mapped {
            BlockState::Unmapped
        } else if b.allocated {
            BlockState::ActiveAllocated
        } else if !b.is_free() {
            BlockState::ActivePendingFree
        } else {
            BlockState::Inactive
        }
    }

    /// Heads of every segment in address order: a block with no (mapped) `prev`.
    /// For expandable segments each maximal mapped run is one segment.
    pub(crate) fn segment_heads(&self, include_unmapped: bool) -> Vec<BlockId> {
        let mut heads: Vec<(DevicePtr, BlockId)> = self
            .blocks
            .iter()
            .filter(|(_, b)| {
                (include_unmapped || b.mapped)
                    && match b.prev {
                        None => true,
                        Some(p) => !include_unmapped && !self.blocks[p].mapped,
                    }
            })
            .map(|(id, b)| (b.ptr, id))
            .collect();
        heads.sort_unstable();
        heads.into_iter().map(|(_, id)| id).collect()
    }

    pub(crate) fn snapshot(&mut self) -> Snapshot {
        self.record(TraceAction::Snapshot, 0, 0, StreamId::DEFAULT);
        let mut segments = Vec::new();
        for head in self.segment_heads(false) {
            let h = &self.blocks[head];
            let mut seg = SegmentSnapshot {
                device: self.device_index,
                address: h.ptr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: h.stream,
                segment_type: if h.pool.is_small() { "small" } else { "large" },
                is_expandable: h.expandable.is_some(),
                blocks: Vec::new(),
            };
            let mut cur = Some(head);
            while let Some(id) = cur {
                let b = &self.blocks[id];
                if !b.mapped {
                    break;
                }
                let state = Self::block_state(b);
                seg.total_size += b.size;
                if b.allocated {
                    seg.allocated_size += b.size;
                }
                if state != BlockState::Inactive {
                    seg.active_size += b.size;
                    seg.requested_size += b.requested;
                }
                seg.blocks.push(BlockSnapshot {
                    address: b.ptr,
                    size: b.size,
                    requested_size: b.requested,
                    state,
                });
                cur = b.next;
            }
            segments.push(seg);
        }
        Snapshot {
            segments,
            device_traces: self.trace.entries().cloned().collect(),
            allocator_settings: self.config.effective_settings(),
        }
    }

    pub(crate) fn block_infos(&self) -> Vec<BlockInfo> {
        let mut out = Vec::with_capacity(self.blocks.live());
        for (seg, head) in self.segment_heads(true).into_iter().enumerate() {
            let mut cur = Some(head);
            while let Some(id) = cur {
                let b = &self.blocks[id];
                out.push(BlockInfo {
                    ptr: b.ptr,
                    size: b.size,
                    allocated: b.allocated,
                    segment: seg,
                    requested: b.requested,
                    state: Self::block_state(b),
                });
                cur = b.next;
            }
        }
        out
    }
}
