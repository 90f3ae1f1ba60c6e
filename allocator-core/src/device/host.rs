//! [`HostDevice`]: segments are real host memory, so tests can write bytes
//! through an allocation and read them back.
//!
//! The host is synchronous: every event is complete as soon as it is recorded.
//! There is no virtual memory, so expandable segments are off on this device.

use super::{Device, DeviceError, DevicePtr, EventId, MemInfo, StreamId};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashSet};
use std::ptr::NonNull;

/// One live segment: the pointer `std::alloc` returned and the layout it was
/// allocated with (needed to free it).
#[derive(Debug)]
struct HostSegment {
    /// Start of the allocation; valid for `layout.size()` bytes, zero-initialised
    /// or written since, until it is deallocated with `layout`.
    ptr: NonNull<u8>,
    /// The layout passed to `alloc_zeroed`; `layout.size() > 0`.
    layout: Layout,
}

// SAFETY: a `HostSegment` is the unique owner of a plain heap allocation (no
// thread-local state, no aliasing handle elsewhere); `NonNull` is only `!Send`
// as a lint. Moving it to another thread and freeing it there is what `Box`
// does too.
unsafe impl Send for HostSegment {}

/// A [`Device`] backed by host memory, with a capacity it enforces.
///
/// - `allocate` returns zeroed memory aligned to [`HostDevice::SEGMENT_ALIGN`], or
///   [`DeviceError::OutOfMemory`] when the live segments plus the request would
///   exceed the capacity (or the system allocator fails).
/// - `free` checks the pointer and size against the live segments:
///   [`DeviceError::InvalidPointer`] for an unknown pointer or a double free.
/// - Events complete at once; [`Device::virtual_memory`] is `None`.
/// - [`HostDevice::write_bytes`] / [`HostDevice::read_bytes`] give safe access
///   to the bytes of a live segment.
/// - Dropping the device frees every segment still allocated.
///
/// ```
/// use remat_alloc::device::{Device, HostDevice};
///
/// let mut dev = HostDevice::new(1 << 20);
/// let seg = dev.allocate(4096).unwrap();
/// dev.write_bytes(seg + 100, b"hello").unwrap();
/// assert_eq!(dev.read_bytes(seg + 100, 5).unwrap(), b"hello");
/// dev.free(seg, 4096).unwrap();
/// ```
#[derive(Debug)]
pub struct HostDevice {
    /// Most bytes the live segments may add up to.
    capacity: usize,
    /// Sum of `layout.size()` over `segments`; always `<= capacity`.
    used: usize,
    /// Live segments by base address (the address as a [`DevicePtr`]).
    /// Segments never overlap, so the one that may contain an address is the
    /// last one whose base is `<=` it.
    segments: BTreeMap<DevicePtr, HostSegment>,
    /// Events recorded and not yet destroyed.
    live_events: HashSet<u64>,
    /// Next event id to hand out; ids are never reused.
    next_event: u64,
}

impl HostDevice {
    /// Alignment of every host segment, in bytes: the allocator's minimum block
    /// size (`kMinBlockSize`), so every block carved out of a segment is
    /// aligned as on CUDA.
    pub const SEGMENT_ALIGN: usize = 512;

    /// A host device that hands out at most `capacity_bytes` bytes at a time.
    pub fn new(capacity_bytes: usize) -> Self {
        HostDevice {
            capacity: capacity_bytes,
            used: 0,
            segments: BTreeMap::new(),
            live_events: HashSet::new(),
            next_event: 1,
        }
    }

    /// The capacity given to [`HostDevice::new`], in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by live segments.
    pub fn used_bytes(&self) -> usize {
        self.used
    }

    /// Number of live segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Number of events recorded and not yet destroyed.
    pub fn live_event_count(&self) -> usize {
        self.live_events.len()
    }

    /// Copies `data` to `[ptr, ptr + data.len())`, which must lie entirely
    /// inside one live segment ([`DeviceError::InvalidPointer`] otherwise).
    pub fn write_bytes(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), DeviceError> {
        let (seg, offset) = self.locate(ptr, data.len())?;
        // SAFETY: `locate` checked that `offset + data.len() <= layout.size()`,
        // so the destination lies inside the live allocation `seg.ptr`, which
        // this device owns exclusively (`&mut self`); `data` is a distinct Rust
        // slice, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), seg.ptr.as_ptr().add(offset), data.len());
        }
        Ok(())
    }

    /// Reads `len` bytes at `[ptr, ptr + len)`, which must lie entirely inside
    /// one live segment ([`DeviceError::InvalidPointer`] otherwise).
    pub fn read_bytes(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, DeviceError> {
        let (seg, offset) = self.locate(ptr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: `locate` checked that `offset + len <= layout.size()`, so the
        // source lies inside the live allocation `seg.ptr`; every byte of it is
        // initialised (allocated with `alloc_zeroed`, then only written through
        // `write_bytes`); `out` is a fresh buffer of `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(seg.ptr.as_ptr().add(offset), out.as_mut_ptr(), len);
        }
        Ok(out)
    }

    /// The live segment that contains `[ptr, ptr + len)` and the offset of `ptr`
    /// in it. `ptr` itself must lie inside the segment even when `len == 0`.
    fn locate(&self, ptr: DevicePtr, len: usize) -> Result<(&HostSegment, usize), DeviceError> {
        let invalid = DeviceError::InvalidPointer { ptr };
        let (&base, seg) = self
            .segments
            .range(..=ptr)
            .next_back()
            .ok_or(invalid.clone())?;
        let offset = usize::try_from(ptr - base).map_err(|_| invalid.clone())?;
        let end = offset.checked_add(len).ok_or(invalid.clone())?;
        if offset >= seg.layout.size() || end > seg.layout.size() {
            return Err(invalid);
        }
        Ok((seg, offset))
    }
}

impl Device for HostDevice {
    fn kind(&self) -> &'static str {
        "host"
    }

    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Other(
                "cannot allocate a zero-size host segment".into(),
            ));
        }
        let oom = DeviceError::OutOfMemory { requested: bytes };
        if bytes > self.capacity - self.used {
            return Err(oom);
        }
        // A size no layout can describe (over `isize::MAX` once aligned) can
        // never be served: report it as out of memory, like a failed malloc.
        let layout =
            Layout::from_size_align(bytes, HostDevice::SEGMENT_ALIGN).map_err(|_| oom.clone())?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(oom)?;
        let addr = ptr.as_ptr() as usize as DevicePtr;
        debug_assert!(
            !self.segments.contains_key(&addr),
            "allocator returned live address {addr:#x}"
        );
        self.segments.insert(addr, HostSegment { ptr, layout });
        self.used += bytes;
        Ok(addr)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        let seg = self
            .segments
            .get(&ptr)
            .ok_or(DeviceError::InvalidPointer { ptr })?;
        if seg.layout.size() != bytes {
            return Err(DeviceError::Other(format!(
                "host segment {ptr:#x} freed with size {bytes}, but it has {} bytes",
                seg.layout.size()
            )));
        }
        let seg = self
            .segments
            .remove(&ptr)
            .ok_or(DeviceError::InvalidPointer { ptr })?;
        self.used -= seg.layout.size();
        // SAFETY: `seg.ptr` was returned by `alloc_zeroed(seg.layout)` and was
        // live until just now: it has been removed from `segments`, so it
        // cannot be freed or accessed again.
        unsafe { std::alloc::dealloc(seg.ptr.as_ptr(), seg.layout) };
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        Ok(MemInfo {
            free: self.capacity - self.used,
            total: self.capacity,
        })
    }

    fn record_event(&mut self, _stream: StreamId) -> Result<EventId, DeviceError> {
        let id = self.next_event;
        self.next_event += 1;
        self.live_events.insert(id);
        Ok(EventId(id))
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        if self.live_events.contains(&event.0) {
            Ok(true)
        } else {
            Err(DeviceError::InvalidEvent(event))
        }
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.query_event(event).map(|_| ())
    }

    fn destroy_event(&mut self, event: EventId) {
        self.live_events.remove(&event.0);
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        for (_, seg) in std::mem::take(&mut self.segments) {
            // SAFETY: every entry of `segments` is a live allocation made with
            // `alloc_zeroed(seg.layout)`; taking the map means none is freed twice.
            unsafe { std::alloc::dealloc(seg.ptr.as_ptr(), seg.layout) };
        }
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_free_round_trip_tracks_usage() {
        let mut dev = HostDevice::new(1 << 20);
        assert_eq!(dev.kind(), "host");
        let a = dev.allocate(4096).unwrap();
        let b = dev.allocate(1000).unwrap();
        assert_ne!(a, 0);
        assert_eq!(a % HostDevice::SEGMENT_ALIGN as u64, 0);
        assert_eq!(b % HostDevice::SEGMENT_ALIGN as u64, 0);
        assert_eq!(dev.used_bytes(), 5096);
        assert_eq!(dev.segment_count(), 2);
        assert_eq!(
            dev.mem_info().unwrap(),
            MemInfo {
                free: (1 << 20) - 5096,
                total: 1 << 20
            }
        );
        dev.free(a, 4096).unwrap();
        dev.free(b, 1000).unwrap();
        assert_eq!(dev.used_bytes(), 0);
        assert_eq!(dev.segment_count(), 0);
        assert_eq!(dev.mem_info().unwrap().free, 1 << 20);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut dev = HostDevice::new(8192);
        let a = dev.allocate(8192).unwrap();
        assert_eq!(
            dev.allocate(1),
            Err(DeviceError::OutOfMemory { requested: 1 })
        );
        dev.free(a, 8192).unwrap();
        let b = dev.allocate(4096).unwrap();
        assert_eq!(
            dev.allocate(4097),
            Err(DeviceError::OutOfMemory { requested: 4097 })
        );
        let c = dev.allocate(4096).unwrap();
        dev.free(b, 4096).unwrap();
        dev.free(c, 4096).unwrap();
    }

    #[test]
    fn zero_size_and_huge_requests_are_typed_errors() {
        let mut dev = HostDevice::new(usize::MAX);
        assert!(matches!(dev.allocate(0), Err(DeviceError::Other(_))));
        // No layout can describe this size: out of memory, not a panic.
        assert_eq!(
            dev.allocate(usize::MAX),
            Err(DeviceError::OutOfMemory {
                requested: usize::MAX
            })
        );
        assert_eq!(
            dev.allocate(isize::MAX as usize),
            Err(DeviceError::OutOfMemory {
                requested: isize::MAX as usize
            })
        );
        assert_eq!(dev.used_bytes(), 0);
    }

    #[test]
    fn bad_frees_are_rejected() {
        let mut dev = HostDevice::new(1 << 20);
        let a = dev.allocate(4096).unwrap();
        assert_eq!(
            dev.free(a + 512, 4096),
            Err(DeviceError::InvalidPointer { ptr: a + 512 })
        );
        assert_eq!(
            dev.free(0, 4096),
            Err(DeviceError::InvalidPointer { ptr: 0 })
        );
        assert!(matches!(dev.free(a, 2048), Err(DeviceError::Other(_))));
        assert_eq!(
            dev.segment_count(),
            1,
            "a rejected free leaves the segment live"
        );
        dev.free(a, 4096).unwrap();
        assert_eq!(
            dev.free(a, 4096),
            Err(DeviceError::InvalidPointer { ptr: a }),
            "double free"
        );
    }

    #[test]
    fn fresh_segments_are_zeroed_and_bytes_round_trip() {
        let mut dev = HostDevice::new(1 << 20);
        let a = dev.allocate(4096).unwrap();
        assert_eq!(dev.read_bytes(a, 4096).unwrap(), vec![0u8; 4096]);
        dev.write_bytes(a + 10, b"remat").unwrap();
        dev.write_bytes(a + 4091, b"tail!").unwrap();
        assert_eq!(dev.read_bytes(a + 10, 5).unwrap(), b"remat");
        assert_eq!(dev.read_bytes(a + 4091, 5).unwrap(), b"tail!");
        assert_eq!(dev.read_bytes(a + 9, 7).unwrap(), b"\0remat\0");
        assert_eq!(dev.read_bytes(a + 100, 0).unwrap(), Vec::<u8>::new());
        dev.free(a, 4096).unwrap();
    }

    #[test]
    fn byte_access_outside_a_live_segment_is_rejected() {
        let mut dev = HostDevice::new(1 << 20);
        let a = dev.allocate(4096).unwrap();
        let b = dev.allocate(4096).unwrap();
        let invalid = |ptr| Some(DeviceError::InvalidPointer { ptr });
        // Crossing the end of the segment, even by one byte.
        assert_eq!(
            dev.write_bytes(a + 4090, b"1234567").err(),
            invalid(a + 4090)
        );
        assert_eq!(dev.read_bytes(a + 4090, 7).err(), invalid(a + 4090));
        // Starting at the end (valid only if `b` happens to start there), at 0.
        let at_end = if a + 4096 == b {
            None
        } else {
            invalid(a + 4096)
        };
        assert_eq!(dev.read_bytes(a + 4096, 0).err(), at_end);
        assert_eq!(dev.read_bytes(0, 1).err(), invalid(0));
        assert_eq!(dev.write_bytes(0, b"x").err(), invalid(0));
        // A length that overflows.
        assert_eq!(dev.read_bytes(a, usize::MAX).err(), invalid(a));
        // After free.
        dev.free(a, 4096).unwrap();
        assert_eq!(dev.read_bytes(a, 1).err(), invalid(a));
        assert_eq!(dev.write_bytes(b, b"ok"), Ok(()));
        dev.free(b, 4096).unwrap();
        assert_eq!(dev.read_bytes(b, 1).err(), invalid(b));
    }

    #[test]
    fn events_complete_at_once_and_unknown_events_are_errors() {
        let mut dev = HostDevice::new(0);
        let e1 = dev.record_event(StreamId::DEFAULT).unwrap();
        let e2 = dev.record_event(StreamId(7)).unwrap();
        assert_ne!(e1, e2);
        assert_eq!(dev.live_event_count(), 2);
        assert_eq!(dev.query_event(e1), Ok(true));
        assert_eq!(dev.synchronize_event(e2), Ok(()));
        dev.destroy_event(e1);
        assert_eq!(dev.query_event(e1), Err(DeviceError::InvalidEvent(e1)));
        assert_eq!(
            dev.synchronize_event(e1),
            Err(DeviceError::InvalidEvent(e1))
        );
        assert_eq!(
            dev.query_event(EventId(999)),
            Err(DeviceError::InvalidEvent(EventId(999)))
        );
        dev.destroy_event(EventId(999)); // unknown: ignored
        dev.destroy_event(e2);
        assert_eq!(dev.live_event_count(), 0);
        let e3 = dev.record_event(StreamId::DEFAULT).unwrap();
        assert!(e3 != e1 && e3 != e2, "ids are not reused");
    }

    #[test]
    fn no_virtual_memory_and_usable_as_boxed_trait_object() {
        let mut dev: Box<dyn Device> = Box::new(HostDevice::new(1 << 16));
        assert!(dev.virtual_memory().is_none());
        assert_eq!(dev.kind(), "host");
        assert_eq!(dev.index(), 0);
        let p = dev.allocate(512).unwrap();
        dev.free(p, 512).unwrap();
    }

    #[test]
    fn drop_frees_live_segments_and_device_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let mut dev = HostDevice::new(1 << 20);
        assert_send(&dev);
        for _ in 0..8 {
            dev.allocate(4096).unwrap();
        }
        // Dropping on another thread frees the segments there.
        std::thread::spawn(move || drop(dev)).join().unwrap();
    }
}
