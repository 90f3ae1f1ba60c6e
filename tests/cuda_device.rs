//! `CudaDevice` on a real GPU (feature `cuda`): raw segments, memory info,
//! streams and events, virtual memory, and the caching allocator on top (plain
//! and expandable segments).
//!
//! Every test opens GPU 0 first; where that fails (no driver, no GPU) it prints
//! `skipping <test>: no CUDA device (<error>)` and passes, so the suite runs
//! anywhere with `cargo test --features cuda`.
#![cfg(feature = "cuda")]

use remat_alloc::{AllocatorConfig, CachingAllocator, CudaDevice, Device, DeviceError, StreamId};

/// GPU 0, or `None` (after saying why) when there is none.
fn device_or_skip(test: &str) -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(dev) => Some(dev),
        Err(e) => {
            println!("skipping {test}: no CUDA device ({e})");
            None
        }
    }
}

#[test]
fn segment_malloc_free_and_mem_info_round_trip() {
    let Some(mut dev) = device_or_skip("segment_malloc_free_and_mem_info_round_trip") else {
        return;
    };
    assert_eq!(dev.kind(), "CUDA");
    assert_eq!(dev.index(), 0);
    let info = dev.mem_info().unwrap();
    assert!(info.total > 0 && info.free <= info.total, "{info:?}");

    let bytes = 4 << 20;
    let ptr = dev.allocate(bytes).unwrap();
    assert_ne!(ptr, 0);
    assert_eq!(
        ptr % 512,
        0,
        "cuMemAlloc returns at least 512-byte aligned memory"
    );
    let after = dev.mem_info().unwrap();
    assert_eq!(after.total, info.total);

    // The memory is real: bytes written come back, also at the very end.
    dev.write_bytes(ptr, b"remat").unwrap();
    dev.write_bytes(ptr + bytes as u64 - 3, b"end").unwrap();
    assert_eq!(dev.read_bytes(ptr, 5).unwrap(), b"remat");
    assert_eq!(dev.read_bytes(ptr + bytes as u64 - 3, 3).unwrap(), b"end");
    assert!(matches!(
        dev.read_bytes(ptr + bytes as u64 - 3, 4),
        Err(DeviceError::InvalidPointer { .. })
    ));

    assert!(matches!(
        dev.free(ptr + 512, bytes),
        Err(DeviceError::InvalidPointer { .. })
    ));
    dev.free(ptr, bytes).unwrap();
    assert_eq!(
        dev.free(ptr, bytes),
        Err(DeviceError::InvalidPointer { ptr }),
        "double free"
    );
}

#[test]
fn too_large_a_segment_is_out_of_memory() {
    let Some(mut dev) = device_or_skip("too_large_a_segment_is_out_of_memory") else {
        return;
    };
    let total = dev.mem_info().unwrap().total;
    let requested = total.saturating_mul(2);
    assert_eq!(
        dev.allocate(requested),
        Err(DeviceError::OutOfMemory { requested })
    );
    // The device is still usable after an out-of-memory error.
    let ptr = dev.allocate(1 << 20).unwrap();
    dev.free(ptr, 1 << 20).unwrap();
}

#[test]
fn events_on_default_and_side_streams() {
    let Some(mut dev) = device_or_skip("events_on_default_and_side_streams") else {
        return;
    };
    assert!(dev.raw_stream(StreamId::DEFAULT).unwrap().is_null());
    let side = dev.raw_stream(StreamId(7)).unwrap();
    assert!(!side.is_null());
    assert_eq!(
        dev.raw_stream(StreamId(7)).unwrap(),
        side,
        "one driver stream per id"
    );

    let e0 = dev.record_event(StreamId::DEFAULT).unwrap();
    let e7 = dev.record_event(StreamId(7)).unwrap();
    assert_ne!(e0, e7);
    dev.synchronize_event(e0).unwrap();
    dev.synchronize_event(e7).unwrap();
    assert_eq!(dev.query_event(e0), Ok(true));
    assert_eq!(dev.query_event(e7), Ok(true));
    dev.destroy_event(e0);
    dev.destroy_event(e7);
    assert_eq!(dev.query_event(e0), Err(DeviceError::InvalidEvent(e0)));

    // Events are reused after destroy; ids are not.
    for _ in 0..100 {
        let e = dev.record_event(StreamId(8)).unwrap();
        assert_ne!(e, e0);
        dev.synchronize_event(e).unwrap();
        dev.destroy_event(e);
    }
    dev.synchronize().unwrap();
}

#[test]
fn virtual_memory_reserve_map_unmap_release() {
    let Some(mut dev) = device_or_skip("virtual_memory_reserve_map_unmap_release") else {
        return;
    };
    let Some(granularity) = dev.vmm_granularity() else {
        println!("skipping virtual_memory_reserve_map_unmap_release: device has no VMM support");
        return;
    };
    // 2 MiB pages, as the small pool uses, where the granularity allows.
    let page = if (2 << 20) % granularity == 0 {
        2 << 20
    } else {
        granularity
    };
    let vm = dev.virtual_memory().expect("vmm_granularity is Some");
    let va = vm.reserve(4 * page).unwrap();
    assert!(
        vm.map(va, page, page + 1).is_err(),
        "page size off the granularity"
    );
    vm.map(va, 2 * page, page).unwrap();
    assert!(
        vm.map(va + page as u64, page, page).is_err(),
        "already mapped"
    );

    // The mapped range is readable and writable across the page boundary.
    let boundary = va + page as u64 - 4;
    dev.write_bytes(boundary, b"01234567").unwrap();
    assert_eq!(dev.read_bytes(boundary, 8).unwrap(), b"01234567");
    assert!(
        dev.read_bytes(va + 2 * page as u64, 1).is_err(),
        "third page unmapped"
    );

    let vm = dev.virtual_memory().unwrap();
    assert!(vm.release(va, 4 * page).is_err(), "pages still mapped");
    vm.unmap(va + page as u64, page, page).unwrap();
    vm.unmap(va, page, page).unwrap();
    vm.release(va, 4 * page).unwrap();
    assert!(dev.read_bytes(va, 1).is_err());
}

#[test]
fn caching_allocator_malloc_free_empty_cache() {
    let Some(dev) = device_or_skip("caching_allocator_malloc_free_empty_cache") else {
        return;
    };
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let small = alloc.malloc(1000, StreamId::DEFAULT).unwrap();
    let large = alloc.malloc(3 << 20, StreamId::DEFAULT).unwrap();
    assert!(small.size() >= 1000 && large.size() >= 3 << 20);
    assert_ne!(small.ptr(), large.ptr());
    assert_eq!(small.ptr() % 512, 0);
    assert_eq!(large.ptr() % 512, 0);
    assert!(alloc.stats().reserved_bytes.all.current > 0);
    alloc.free(small).unwrap();
    alloc.free(large).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
}

#[test]
fn caching_allocator_expandable_segments() {
    let Some(dev) = device_or_skip("caching_allocator_expandable_segments") else {
        return;
    };
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let alloc = CachingAllocator::new(dev, config).unwrap();
    // Without VMM support the allocator falls back to plain segments; the
    // round trip below holds either way.
    let a = alloc.malloc((1 << 20) + 512, StreamId::DEFAULT).unwrap();
    let b = alloc.malloc(5 << 20, StreamId::DEFAULT).unwrap();
    assert!(alloc.stats().reserved_bytes.all.current >= (6 << 20) + 512);
    assert_eq!(a.ptr() % 512, 0);
    assert_eq!(b.ptr() % 512, 0);
    alloc.free(a).unwrap();
    alloc.free(b).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
}

/// The driver's free bytes, read through the allocator's device.
fn driver_free<D: Device>(alloc: &CachingAllocator<D>) -> usize {
    alloc.with_device(|d| d.mem_info()).unwrap().free
}

/// Slack for the driver's own bookkeeping between two `cuMemGetInfo` reads.
const SLACK: usize = 2 << 20;

#[test]
fn split_and_merge_reuse_the_cached_segment() {
    let Some(dev) = device_or_skip("split_and_merge_reuse_the_cached_segment") else {
        return;
    };
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let free0 = driver_free(&alloc);
    let whole = alloc.malloc(12 << 20, StreamId::DEFAULT).unwrap();
    let base = whole.ptr();
    let free1 = driver_free(&alloc);
    assert!(
        free1 + (12 << 20) <= free0 + SLACK,
        "cuMemAlloc of 12 MiB: {free0} -> {free1}"
    );
    alloc.free(whole).unwrap();
    // Cached, not returned: the driver still counts the segment.
    assert!(driver_free(&alloc) + (12 << 20) <= free0 + SLACK);

    // Two blocks split from the cached segment, back to back; no new segment.
    let a = alloc.malloc(4 << 20, StreamId::DEFAULT).unwrap();
    let b = alloc.malloc(6 << 20, StreamId::DEFAULT).unwrap();
    assert_eq!(a.ptr(), base);
    assert_eq!(b.ptr(), base + (4 << 20));
    assert_eq!(alloc.stats().reserved_bytes.all.current, 12 << 20);
    assert!(driver_free(&alloc).abs_diff(free1) <= SLACK);

    // Freed, they merge back into one 12 MiB block.
    alloc.free(a).unwrap();
    alloc.free(b).unwrap();
    let again = alloc.malloc(12 << 20, StreamId::DEFAULT).unwrap();
    assert_eq!(again.ptr(), base);
    alloc.free(again).unwrap();
    println!("split/merge: driver free {free0} -> {free1} B after one 12 MiB segment");
}

#[test]
fn empty_cache_returns_memory_to_the_driver() {
    let Some(dev) = device_or_skip("empty_cache_returns_memory_to_the_driver") else {
        return;
    };
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let bytes = 256 << 20;
    let free0 = driver_free(&alloc);
    let x = alloc.malloc(bytes, StreamId::DEFAULT).unwrap();
    alloc.free(x).unwrap();
    let cached = driver_free(&alloc);
    assert!(cached + bytes <= free0 + SLACK, "{free0} -> {cached}");
    alloc.empty_cache().unwrap();
    let after = driver_free(&alloc);
    assert!(after + SLACK >= free0, "{free0} -> {cached} -> {after}");
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
    println!("empty_cache: driver free {free0} -> {cached} (cached) -> {after} B");
}

#[test]
fn out_of_memory_message_has_the_real_figures() {
    let Some(dev) = device_or_skip("out_of_memory_message_has_the_real_figures") else {
        return;
    };
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let total = alloc.with_device(|d| d.mem_info()).unwrap().total;
    let held = alloc.malloc(20 << 20, StreamId::DEFAULT).unwrap();
    let err = alloc
        .malloc(total.saturating_mul(2), StreamId::DEFAULT)
        .unwrap_err();
    let remat_alloc::Error::OutOfMemory(oom) = &err else {
        panic!("expected an out-of-memory error, got {err:?}");
    };
    assert_eq!(oom.device_kind, "CUDA");
    assert_eq!(oom.total_capacity, total);
    assert!(oom.device_free <= total && oom.device_free > 0);
    assert_eq!(oom.allocated, 20 << 20);
    assert!(oom.reserved >= oom.allocated);
    let msg = err.to_string();
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate")
            && msg.contains("GPU 0 has a total capacity of"),
        "{msg}"
    );
    println!("oom message: {msg}");
    // Still usable afterwards.
    alloc.free(held).unwrap();
    let x = alloc.malloc(1 << 20, StreamId::DEFAULT).unwrap();
    alloc.free(x).unwrap();
}

#[test]
fn record_stream_with_real_streams_and_events() {
    let Some(dev) = device_or_skip("record_stream_with_real_streams_and_events") else {
        return;
    };
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    let side = StreamId(3);
    let x = alloc.malloc(8 << 20, StreamId::DEFAULT).unwrap();
    let ptr = x.ptr();
    let reserved = alloc.stats().reserved_bytes.all.current;
    alloc.record_stream(&x, side).unwrap();
    // The free records a real event on the side stream; the block comes back
    // to the pool once the driver reports it complete.
    alloc.free(x).unwrap();
    alloc.with_device(|d| d.synchronize()).unwrap();
    let y = alloc.malloc(8 << 20, StreamId::DEFAULT).unwrap();
    assert_eq!(
        y.ptr(),
        ptr,
        "the block is reused once the side stream's event completed"
    );
    assert_eq!(alloc.stats().reserved_bytes.all.current, reserved);
    alloc.free(y).unwrap();
    alloc.empty_cache().unwrap();
}
