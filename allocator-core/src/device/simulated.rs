//! A simulated device: fixed capacity, deterministic fake addresses, streams whose
//! work completes only when the test says so, and injectable failures.

use super::{Device, DeviceError, DevicePtr, EventId, MemInfo, StreamId, VirtualMemory};
use std::collections::{BTreeMap, VecDeque};

/// First address handed out; segments are laid out upwards from here.
const BASE_ADDRESS: DevicePtr = 0x7f00_0000_0000;
/// Virtual reservations are laid out from here, far above physical segments.
const VA_BASE_ADDRESS: DevicePtr = 0x007e_0000_0000_0000;
/// Segment start addresses are aligned to this (like `cudaMalloc`'s 2 MiB
/// granularity for large allocations).
const SEGMENT_ALIGNMENT: u64 = 2 << 20;

/// Per-stream work counters: an event recorded at `submitted = n` is complete
/// once `completed >= n`.
#[derive(Debug, Default, Clone, Copy)]
struct StreamState {
    submitted: u64,
    completed: u64,
}

/// A fixed-capacity pretend device. Addresses are deterministic: the same
/// sequence of calls yields the same addresses.
///
/// Stream work is explicit: [`SimulatedDevice::enqueue_work`] makes a stream busy,
/// so events recorded on it stay incomplete until [`SimulatedDevice::complete_stream`]
/// (or a synchronize) runs. An idle stream completes its events at once.
#[derive(Debug)]
pub struct SimulatedDevice {
    capacity: usize,
    used: usize,
    next_addr: DevicePtr,
    next_va: DevicePtr,
    /// Live segments `(address, size)` in address order. Addresses only grow
    /// (`next_addr`), so a new segment is appended: a miss costs a push, not
    /// a tree insert; a free is a binary search and a shift.
    segments: Vec<(DevicePtr, usize)>,
    /// Live reservations: address → size, and mapped pages inside them: address → size.
    reservations: BTreeMap<DevicePtr, usize>,
    mapped_pages: BTreeMap<DevicePtr, usize>,
    vmm: bool,
    streams: BTreeMap<StreamId, StreamState>,
    events: BTreeMap<u64, (StreamId, u64)>,
    next_event: u64,
    /// Failures to inject, each into the next call of its operation, in order.
    injected: VecDeque<(SimOp, DeviceError)>,
    /// Counters, for tests.
    allocate_calls: u64,
    free_calls: u64,
}

/// Operations of a [`SimulatedDevice`] that can be made to fail
/// ([`SimulatedDevice::inject_failure_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimOp {
    /// `allocate`, and `map` of virtual memory.
    Allocate,
    /// `free`.
    Free,
    /// `record_event`.
    RecordEvent,
}

/// Builder for a [`SimulatedDevice`].
#[derive(Debug, Clone)]
pub struct SimulatedDeviceBuilder {
    capacity: usize,
    vmm: bool,
}

impl SimulatedDeviceBuilder {
    /// Enables or disables the simulated virtual-memory interface (on by default).
    pub fn virtual_memory(mut self, enabled: bool) -> Self {
        self.vmm = enabled;
        self
    }

    /// Builds the device.
    pub fn build(self) -> SimulatedDevice {
        SimulatedDevice {
            capacity: self.capacity,
            used: 0,
            next_addr: BASE_ADDRESS,
            next_va: VA_BASE_ADDRESS,
            segments: Vec::new(),
            reservations: BTreeMap::new(),
            mapped_pages: BTreeMap::new(),
            vmm: self.vmm,
            streams: BTreeMap::new(),
            events: BTreeMap::new(),
            next_event: 1,
            injected: VecDeque::new(),
            allocate_calls: 0,
            free_calls: 0,
        }
    }
}

impl SimulatedDevice {
    /// A device with `capacity` bytes and virtual memory support.
    pub fn new(capacity: usize) -> SimulatedDevice {
        SimulatedDevice::builder(capacity).build()
    }

    /// A builder for a device with `capacity` bytes.
    pub fn builder(capacity: usize) -> SimulatedDeviceBuilder {
        SimulatedDeviceBuilder {
            capacity,
            vmm: true,
        }
    }

    /// Total capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes currently held by segments and mapped pages.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Live segments (address, size), in address order.
    pub fn segments(&self) -> Vec<(DevicePtr, usize)> {
        self.segments.clone()
    }

    /// Number of `allocate` calls that reached the device (successful or not).
    pub fn allocate_calls(&self) -> u64 {
        self.allocate_calls
    }

    /// Number of successful `free` calls.
    pub fn free_calls(&self) -> u64 {
        self.free_calls
    }

    /// Makes the next `allocate` (or `map`) call fail with `err` instead of
    /// running. Several injections fail several calls, in order.
    pub fn inject_failure(&mut self, err: DeviceError) {
        self.inject_failure_on(SimOp::Allocate, err);
    }

    /// Makes the next call of `op` fail with `err` instead of running.
    pub fn inject_failure_on(&mut self, op: SimOp, err: DeviceError) {
        self.injected.push_back((op, err));
    }

    /// Queues work on `stream`: events recorded from now on stay incomplete
    /// until [`SimulatedDevice::complete_stream`].
    pub fn enqueue_work(&mut self, stream: StreamId) {
        self.streams.entry(stream).or_default().submitted += 1;
    }

    /// Finishes all work queued on `stream`.
    pub fn complete_stream(&mut self, stream: StreamId) {
        let s = self.streams.entry(stream).or_default();
        s.completed = s.submitted;
    }

    /// Finishes all work on every stream.
    pub fn complete_all(&mut self) {
        for s in self.streams.values_mut() {
            s.completed = s.submitted;
        }
    }

    /// True when `stream` has unfinished work.
    pub fn is_busy(&self, stream: StreamId) -> bool {
        self.streams
            .get(&stream)
            .is_some_and(|s| s.completed < s.submitted)
    }

    /// Number of events recorded and not yet destroyed.
    pub fn live_events(&self) -> usize {
        self.events.len()
    }

    fn take_injected(&mut self, op: SimOp) -> Result<(), DeviceError> {
        match self.injected.iter().position(|(o, _)| *o == op) {
            Some(i) => Err(self
                .injected
                .remove(i)
                .map_or_else(|| DeviceError::Other("injected".into()), |(_, e)| e)),
            None => Ok(()),
        }
    }

    fn reserve_bytes(&mut self, bytes: usize) -> Result<(), DeviceError> {
        if bytes > self.capacity - self.used {
            return Err(DeviceError::OutOfMemory { requested: bytes });
        }
        self.used += bytes;
        Ok(())
    }
}

impl Device for SimulatedDevice {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        self.allocate_calls += 1;
        self.take_injected(SimOp::Allocate)?;
        if bytes == 0 {
            return Err(DeviceError::Other("allocate of 0 bytes".into()));
        }
        self.reserve_bytes(bytes)?;
        let ptr = self.next_addr;
        let span = (bytes as u64).div_ceil(SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT;
        self.next_addr += span;
        debug_assert!(self.segments.last().is_none_or(|&(last, _)| last < ptr));
        self.segments.push((ptr, bytes));
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        self.take_injected(SimOp::Free)?;
        match self.segments.binary_search_by_key(&ptr, |&(a, _)| a) {
            Ok(i) if self.segments[i].1 == bytes => {
                let (_, size) = self.segments.remove(i);
                self.used -= size;
                self.free_calls += 1;
                Ok(())
            }
            _ => Err(DeviceError::InvalidPointer { ptr }),
        }
    }

    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        Ok(MemInfo {
            free: self.capacity - self.used,
            total: self.capacity,
        })
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.take_injected(SimOp::RecordEvent)?;
        let id = self.next_event;
        self.next_event += 1;
        let ticket = self.streams.get(&stream).map_or(0, |s| s.submitted);
        self.events.insert(id, (stream, ticket));
        Ok(EventId(id))
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        let (stream, ticket) = *self
            .events
            .get(&event.0)
            .ok_or(DeviceError::InvalidEvent(event))?;
        Ok(self.streams.get(&stream).map_or(0, |s| s.completed) >= ticket)
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        let (stream, ticket) = *self
            .events
            .get(&event.0)
            .ok_or(DeviceError::InvalidEvent(event))?;
        let s = self.streams.entry(stream).or_default();
        s.completed = s.completed.max(ticket);
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) {
        self.events.remove(&event.0);
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        if self.vmm {
            Some(self)
        } else {
            None
        }
    }
}

impl VirtualMemory for SimulatedDevice {
    fn reserve(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        let ptr = self.next_va;
        self.next_va += (bytes as u64).div_ceil(SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT;
        self.reservations.insert(ptr, bytes);
        Ok(ptr)
    }

    fn map(&mut self, va: DevicePtr, bytes: usize, page_size: usize) -> Result<(), DeviceError> {
        self.take_injected(SimOp::Allocate)?;
        if page_size == 0 || bytes % page_size != 0 {
            return Err(DeviceError::Other(format!(
                "map of {bytes} bytes is not whole pages of {page_size}"
            )));
        }
        let inside = self
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(base, len)| va + bytes as u64 <= base + *len as u64);
        if !inside {
            return Err(DeviceError::InvalidPointer { ptr: va });
        }
        // Pages are mapped one by one, as cuMemCreate + cuMemMap would; on failure
        // the pages mapped so far are undone.
        let mut mapped = 0usize;
        while mapped < bytes {
            let page = va + mapped as u64;
            if self.mapped_pages.contains_key(&page) || self.reserve_bytes(page_size).is_err() {
                let undo = mapped;
                let _ = VirtualMemory::unmap(self, va, undo, page_size);
                return Err(if self.mapped_pages.contains_key(&page) {
                    DeviceError::Other(format!("page {page:#x} is already mapped"))
                } else {
                    DeviceError::OutOfMemory {
                        requested: page_size,
                    }
                });
            }
            self.mapped_pages.insert(page, page_size);
            mapped += page_size;
        }
        Ok(())
    }

    fn unmap(&mut self, va: DevicePtr, bytes: usize, page_size: usize) -> Result<(), DeviceError> {
        let mut off = 0usize;
        while off < bytes {
            let page = va + off as u64;
            match self.mapped_pages.remove(&page) {
                Some(size) => self.used -= size,
                None => return Err(DeviceError::InvalidPointer { ptr: page }),
            }
            off += page_size;
        }
        Ok(())
    }

    fn release(&mut self, va: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        let end = va + bytes as u64;
        if self.mapped_pages.range(va..end).next().is_some() {
            return Err(DeviceError::Other(format!(
                "reservation {va:#x} still has mapped pages"
            )));
        }
        match self.reservations.remove(&va) {
            Some(_) => Ok(()),
            None => Err(DeviceError::InvalidPointer { ptr: va }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_and_addresses() {
        let mut d = SimulatedDevice::new(10 << 20);
        let a = d.allocate(4 << 20).unwrap();
        let b = d.allocate(4 << 20).unwrap();
        assert_eq!(a, BASE_ADDRESS);
        assert_eq!(b, BASE_ADDRESS + (4 << 20));
        assert_eq!(
            d.allocate(4 << 20),
            Err(DeviceError::OutOfMemory { requested: 4 << 20 })
        );
        d.free(a, 4 << 20).unwrap();
        assert_eq!(
            d.free(a, 4 << 20),
            Err(DeviceError::InvalidPointer { ptr: a })
        );
        assert_eq!(
            d.mem_info().unwrap(),
            MemInfo {
                free: 6 << 20,
                total: 10 << 20
            }
        );
    }

    #[test]
    fn events_follow_stream_work() {
        let mut d = SimulatedDevice::new(1 << 20);
        let s = StreamId(7);
        let idle = d.record_event(s).unwrap();
        assert!(d.query_event(idle).unwrap());
        d.enqueue_work(s);
        let busy = d.record_event(s).unwrap();
        assert!(!d.query_event(busy).unwrap());
        d.complete_stream(s);
        assert!(d.query_event(busy).unwrap());
        d.enqueue_work(s);
        let e = d.record_event(s).unwrap();
        d.synchronize_event(e).unwrap();
        assert!(d.query_event(e).unwrap());
        d.destroy_event(e);
        assert_eq!(d.query_event(e), Err(DeviceError::InvalidEvent(e)));
    }

    #[test]
    fn injected_failure_and_vmm() {
        let mut d = SimulatedDevice::new(8 << 20);
        d.inject_failure(DeviceError::Other("boom".into()));
        assert!(matches!(d.allocate(1 << 20), Err(DeviceError::Other(_))));
        let va = d.reserve(64 << 20).unwrap();
        d.map(va, 4 << 20, 2 << 20).unwrap();
        assert_eq!(d.used(), 4 << 20);
        // Over capacity: nothing stays mapped.
        assert!(matches!(
            d.map(va + (4 << 20), 6 << 20, 2 << 20),
            Err(DeviceError::OutOfMemory { .. })
        ));
        assert_eq!(d.used(), 4 << 20);
        assert!(d.release(va, 64 << 20).is_err());
        d.unmap(va, 4 << 20, 2 << 20).unwrap();
        d.release(va, 64 << 20).unwrap();
        assert_eq!(d.used(), 0);
    }
}
