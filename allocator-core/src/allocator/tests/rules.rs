//! Core rules the spec lists without an upstream Python test (§7.5, "extra
//! core-behaviour tests"), plus handle misuse and the adjacent-free query.

use super::{check, sim, GB, MB};
use crate::{AllocatorConfig, CachingAllocator, DeviceError, Error, SimulatedDevice, StreamId};

const S0: StreamId = StreamId::DEFAULT;

#[test]
fn best_fit_ties_go_to_the_lowest_address() {
    let a = sim(GB, "");
    // Three 3 MiB holes and one 4 MiB hole in one 20 MiB segment.
    let blocks: Vec<_> = (0..6).map(|_| a.malloc(3 * MB, S0).unwrap()).collect();
    let ptrs: Vec<u64> = blocks.iter().map(|b| b.ptr()).collect();
    let mut it = blocks.into_iter();
    let b0 = it.next().unwrap();
    let keep1 = it.next().unwrap();
    let b2 = it.next().unwrap();
    let keep3 = it.next().unwrap();
    let b4 = it.next().unwrap();
    let keep5 = it.next().unwrap();
    a.free(b4).unwrap();
    a.free(b2).unwrap();
    a.free(b0).unwrap();
    // The tail (2 MiB) is too small; three equal 3 MiB holes: the lowest wins.
    let x = a.malloc(3 * MB, S0).unwrap();
    assert_eq!(x.ptr(), ptrs[0]);
    let y = a.malloc(3 * MB, S0).unwrap();
    assert_eq!(y.ptr(), ptrs[2]);
    for h in [x, y, keep1, keep3, keep5] {
        a.free(h).unwrap();
    }
    check(&a);
}

#[test]
fn split_puts_the_allocation_at_the_low_address() {
    let a = sim(GB, "");
    let x = a.malloc(3 * MB, S0).unwrap();
    let seg = a.with_device(|d| d.segments());
    assert_eq!(seg.len(), 1);
    assert_eq!(x.ptr(), seg[0].0);
    let y = a.malloc(3 * MB, S0).unwrap();
    assert_eq!(y.ptr(), seg[0].0 + (3 * MB) as u64);
    a.free(x).unwrap();
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn large_pool_tail_of_at_most_1mib_is_not_split() {
    let a = sim(GB, "");
    // 19.5 MiB from a fresh 20 MiB segment: the caller holds all 20 MiB.
    let x = a.malloc(19 * MB + MB / 2, S0).unwrap();
    assert_eq!(x.size(), 20 * MB);
    assert_eq!(a.stats().allocated_bytes.all.current, (20 * MB) as i64);
    a.free(x).unwrap();
    // A tail of 1 MiB + 512 is split.
    let y = a.malloc(19 * MB - 512, S0).unwrap();
    assert_eq!(y.size(), 19 * MB - 512);
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn free_merges_with_both_neighbours() {
    let a = sim(GB, "");
    let x = a.malloc(4 * MB, S0).unwrap();
    let y = a.malloc(4 * MB, S0).unwrap();
    let z = a.malloc(4 * MB, S0).unwrap();
    let w = a.malloc(4 * MB, S0).unwrap();
    a.free(x).unwrap();
    a.free(z).unwrap();
    assert_eq!(a.adjacent_free_size(&y).unwrap().total(), 8 * MB);
    assert_eq!(
        a.stats().inactive_split.all.current,
        3,
        "x, z and the 4 MiB tail"
    );
    a.free(y).unwrap();
    // x, y and z merged into one 12 MiB block.
    let blocks = a.blocks();
    assert_eq!(blocks.len(), 3, "{blocks:#?}");
    assert_eq!(blocks[0].size, 12 * MB);
    assert!(!blocks[0].allocated);
    assert_eq!(
        a.stats().inactive_split.all.current,
        2,
        "the merged block and the tail"
    );
    a.free(w).unwrap();
    assert_eq!(a.blocks().len(), 1);
    assert_eq!(a.stats().inactive_split.all.current, 0);
    check(&a);
}

#[test]
fn empty_cache_releases_only_whole_segments() {
    let a = sim(GB, "");
    let x = a.malloc(4 * MB, S0).unwrap();
    let y = a.malloc(4 * MB, S0).unwrap();
    let whole = a.malloc(30 * MB, S0).unwrap();
    a.free(x).unwrap();
    a.free(whole).unwrap();
    a.empty_cache().unwrap();
    // The 30 MiB segment went back; the split 20 MiB segment stays (y lives in it).
    assert_eq!(a.memory_reserved(), 20 * MB);
    assert_eq!(a.stats().num_device_free, 1);
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    check(&a);
}

#[test]
fn max_split_size_rules() {
    let a = sim(4 * GB, "max_split_size_mb:100");
    // A cached oversize block (200 MiB) ...
    let big = a.malloc(200 * MB, S0).unwrap();
    a.free(big).unwrap();
    // ... is never taken by a normal request (below max_split_size).
    let small = a.malloc(50 * MB, S0).unwrap();
    assert_eq!(a.stats().segment.all.current, 2);
    // An oversize request takes it only if it wastes < 20 MiB.
    let fits = a.malloc(185 * MB, S0).unwrap();
    assert_eq!(fits.size(), 200 * MB, "oversize blocks are never split");
    assert_eq!(a.stats().segment.all.current, 2);
    a.free(fits).unwrap();
    let wasteful = a.malloc(150 * MB, S0).unwrap();
    assert_eq!(wasteful.size(), 150 * MB);
    assert_eq!(
        a.stats().num_device_alloc,
        3,
        "150 MiB does not take the 200 MiB block"
    );
    assert_eq!(a.stats().oversize_allocations.current, 1);
    assert_eq!(a.stats().max_split_size, (100 * MB) as i64);
    a.free(small).unwrap();
    a.free(wasteful).unwrap();
    check(&a);
}

#[test]
fn max_split_size_stat_is_minus_one_by_default() {
    assert_eq!(sim(GB, "").stats().max_split_size, -1);
}

#[test]
fn release_available_cached_blocks_single_block() {
    let a = sim(GB, "max_split_size_mb:100");
    let keep = a.malloc(400 * MB, S0).unwrap();
    let x = a.malloc(500 * MB, S0).unwrap();
    a.free(x).unwrap();
    // 300 MiB is oversize; the cached 500 MiB block would waste >= 20 MiB, so it is
    // not taken, the device is full, and releasing that one block is enough.
    let y = a.malloc(300 * MB, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 0, "no release-all retry was needed");
    assert_eq!(s.num_sync_all_streams, 0);
    assert_eq!(a.memory_reserved(), 700 * MB);
    a.free(y).unwrap();
    a.free(keep).unwrap();
    check(&a);
}

#[test]
fn release_available_cached_blocks_largest_first() {
    let a = sim(GB, "max_split_size_mb:100");
    let hs: Vec<_> = [300, 200, 150]
        .iter()
        .map(|&m| a.malloc(m * MB, S0).unwrap())
        .collect();
    let keep = a.malloc(300 * MB, S0).unwrap();
    for h in hs {
        a.free(h).unwrap();
    }
    // 400 MiB: no single cached block is big enough; released largest first
    // (300 then 200) until 400 MiB are free, the 150 MiB block stays cached.
    let before = a.stats().num_alloc_retries;
    let x = a.malloc(400 * MB, S0).unwrap();
    assert_eq!(
        a.stats().num_alloc_retries,
        before,
        "no release-all retry was needed"
    );
    let cached: Vec<usize> = a
        .blocks()
        .iter()
        .filter(|b| !b.allocated)
        .map(|b| b.size)
        .collect();
    assert_eq!(cached, vec![150 * MB]);
    a.free(x).unwrap();
    a.free(keep).unwrap();
    check(&a);
}

#[test]
fn garbage_collection_frees_the_oldest_blocks() {
    let a = sim(GB, "garbage_collection_threshold:0.3");
    a.set_memory_fraction(0.5).unwrap(); // 512 MiB allowed, GC above 153.6 MiB reserved
    let old = a.malloc(100 * MB, S0).unwrap();
    let young = a.malloc(120 * MB, S0).unwrap();
    a.free(old).unwrap();
    // Large-pool lookups on another stream age the cached blocks (the pool's GC
    // clock ticks while GC is enabled) without touching them.
    for _ in 0..10 {
        let t = a.malloc(4 * MB, StreamId(1)).unwrap();
        a.free(t).unwrap();
    }
    a.free(young).unwrap();
    // 300 MiB fits no cached block; reserved (240 MiB) is above the threshold, so
    // GC releases the blocks at or above the mean age: the old one only.
    let big = a.malloc(300 * MB, S0).unwrap();
    let cached: Vec<usize> = a
        .blocks()
        .iter()
        .filter(|b| !b.allocated && b.size >= 100 * MB)
        .map(|b| b.size)
        .collect();
    assert_eq!(cached, vec![120 * MB]);
    assert_eq!(a.stats().num_device_free, 1);
    a.free(big).unwrap();
    check(&a);
}

#[test]
fn counters() {
    let a = sim(GB, "");
    let x = a.malloc(600 * MB, S0).unwrap();
    a.free(x).unwrap();
    let y = a.malloc(700 * MB, S0).unwrap(); // needs the cached 600 MiB released
    let s = a.stats();
    assert_eq!(s.num_device_alloc, 2);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_sync_all_streams, 1);
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn adjacent_free_size_reads_both_neighbours() {
    let a = sim(GB, "");
    let x = a.malloc(2 * MB, S0).unwrap();
    let y = a.malloc(3 * MB, S0).unwrap();
    let z = a.malloc(4 * MB, S0).unwrap();
    // [x 2][y 3][z 4][tail 11]
    let f = a.adjacent_free_size(&y).unwrap();
    assert_eq!((f.left, f.right), (0, 0));
    assert_eq!(a.adjacent_free_size(&z).unwrap().right, 11 * MB);
    a.free(x).unwrap();
    a.free(z).unwrap();
    let f = a.adjacent_free_size(&y).unwrap();
    assert_eq!((f.left, f.right), (2 * MB, 15 * MB));
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn adjacent_free_size_ignores_pending_blocks() {
    let a = sim(GB, "");
    let x = a.malloc(2 * MB, S0).unwrap();
    let y = a.malloc(3 * MB, S0).unwrap();
    a.with_device(|d| d.enqueue_work(StreamId(5)));
    a.record_stream(&x, StreamId(5)).unwrap();
    a.free(x).unwrap();
    assert_eq!(
        a.adjacent_free_size(&y).unwrap().left,
        0,
        "x still waits for stream 5"
    );
    a.with_device(|d| d.complete_all());
    let t = a.malloc(512, S0).unwrap(); // any malloc processes completed events
    assert_eq!(a.adjacent_free_size(&y).unwrap().left, 2 * MB);
    a.free(t).unwrap();
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn bad_sizes_are_typed_errors() {
    let a = sim(GB, "");
    assert_eq!(a.malloc(0, S0), Err(Error::ZeroSize));
    assert!(matches!(
        a.malloc(1 << 60, S0),
        Err(Error::RequestTooLarge { .. })
    ));
    assert!(matches!(
        a.malloc(usize::MAX, S0),
        Err(Error::RequestTooLarge { .. })
    ));
    check(&a);
}

#[test]
fn double_free_and_foreign_handles_are_typed_errors() {
    let a = sim(GB, "");
    let b = sim(GB, "");
    let x = a.malloc(4096, S0).unwrap();
    let copy = x.clone();
    a.free(x).unwrap();
    assert!(matches!(
        a.free(copy.clone()),
        Err(Error::InvalidHandle { .. })
    ));
    // The block is reused by a new allocation: the stale handle is still rejected.
    let y = a.malloc(4096, S0).unwrap();
    assert_eq!(y.ptr(), copy.ptr());
    assert!(matches!(
        a.free(copy.clone()),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(matches!(
        a.adjacent_free_size(&copy),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(matches!(
        a.record_stream(&copy, StreamId(3)),
        Err(Error::InvalidHandle { .. })
    ));
    // A handle of another allocator.
    assert!(matches!(
        b.free(y.clone()),
        Err(Error::ForeignHandle { .. })
    ));
    a.free(y).unwrap();
    check(&a);
    check(&b);
}

#[test]
fn non_oom_device_errors_propagate_without_retry() {
    let a = sim(GB, "");
    a.with_device(|d| d.inject_failure(DeviceError::Other("ECC error".into())));
    let err = a.malloc(4 * MB, S0).unwrap_err();
    assert_eq!(err, Error::Device(DeviceError::Other("ECC error".into())));
    assert_eq!(a.stats().num_ooms, 0);
    assert_eq!(a.stats().num_alloc_retries, 0);
    let x = a.malloc(4 * MB, S0).unwrap();
    a.free(x).unwrap();
    check(&a);
}

#[test]
fn injected_oom_enters_the_retry_path() {
    let a = sim(GB, "");
    let x = a.malloc(30 * MB, S0).unwrap();
    a.free(x).unwrap();
    a.with_device(|d| d.inject_failure(DeviceError::OutOfMemory { requested: 0 }));
    let y = a.malloc(40 * MB, S0).unwrap(); // fails once, releases the cache, retries
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_device_free, 1);
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn streams_do_not_share_cached_blocks() {
    let a = sim(GB, "");
    let x = a.malloc(MB, StreamId(1)).unwrap();
    a.free(x).unwrap();
    let y = a.malloc(MB, StreamId(2)).unwrap();
    assert_eq!(a.stats().segment.all.current, 2);
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn expandable_segments_tile_contiguously_and_unmap_free_pages() {
    let a = sim(GB, "expandable_segments:True");
    assert!(a.expandable_segments_active());
    let xs: Vec<_> = (0..5)
        .map(|i| a.malloc((3 + i) * MB + 512, S0).unwrap())
        .collect();
    for w in xs.windows(2) {
        assert_eq!(
            w[0].ptr() + w[0].size() as u64,
            w[1].ptr(),
            "allocations tile contiguously"
        );
    }
    let used: usize = xs.iter().map(|x| x.size()).sum();
    assert_eq!(a.memory_reserved(), used.div_ceil(20 * MB) * 20 * MB);
    check(&a);
    let mut it = xs.into_iter();
    let first = it.next().unwrap();
    let rest: Vec<_> = it.collect();
    for x in rest {
        a.free(x).unwrap();
        check(&a);
    }
    a.empty_cache().unwrap();
    check(&a);
    assert_eq!(
        a.memory_reserved(),
        20 * MB,
        "only the page holding `first` stays mapped"
    );
    a.free(first).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.with_device(|d| d.used()), 0);
    check(&a);
}

#[test]
fn expandable_segments_need_virtual_memory() {
    let dev = SimulatedDevice::builder(GB).virtual_memory(false).build();
    let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let err = CachingAllocator::new(dev, cfg).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    let a = CachingAllocator::new(
        SimulatedDevice::builder(GB).virtual_memory(false).build(),
        AllocatorConfig::default(),
    )
    .unwrap();
    assert!(matches!(
        a.set_settings("expandable_segments:True"),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn oom_message_has_the_figures_and_the_hint() {
    let a = sim(GB, "");
    let keep = a.malloc(600 * MB, S0).unwrap();
    let small = a.malloc(100 * MB, S0).unwrap();
    let err = match a.malloc(500 * MB, S0) {
        Err(Error::OutOfMemory(e)) => e,
        other => panic!("expected OOM, got {other:?}"),
    };
    assert_eq!(err.requested, 500 * MB);
    assert_eq!(err.alloc_size, 500 * MB);
    assert_eq!(err.total_capacity, GB);
    assert_eq!(err.device_free, GB - 700 * MB);
    assert_eq!(err.allocated, 700 * MB);
    assert_eq!(err.reserved, 700 * MB);
    let msg = err.to_string();
    assert!(msg.starts_with("simulated out of memory. Tried to allocate 500.00 MiB. Device 0 has a total capacity of 1024.00 MiB of which 324.00 MiB is free."), "{msg}");
    assert!(msg.contains("expandable_segments:True"), "{msg}");
    assert!(msg.contains("max_split_size_mb"), "{msg}");
    a.free(keep).unwrap();
    a.free(small).unwrap();
}

#[test]
fn free_memory_callbacks_run_outside_the_lock_and_retry() {
    use std::sync::{Arc, Mutex};
    let a = Arc::new(sim(GB, ""));
    let held = Arc::new(Mutex::new(Some(a.malloc(8 * MB, S0).unwrap())));
    let (a2, h2) = (a.clone(), held.clone());
    // The callback frees an allocation of this very allocator: it must not deadlock.
    a.add_free_memory_callback(move || match h2.lock().unwrap().take() {
        Some(x) => a2.free(x).is_ok(),
        None => false,
    });
    let y = a.malloc(20 * MB, S0).unwrap(); // misses the cache: runs the callback
    assert!(held.lock().unwrap().is_none());
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn summary_and_snapshot_reflect_state() {
    let a = sim(GB, "");
    let x = a.malloc(5 * MB, S0).unwrap();
    let table = a.memory_summary();
    assert!(table.contains("Allocated memory"), "{table}");
    assert!(table.contains("Reserved memory"), "{table}");
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].total_size, 20 * MB);
    assert_eq!(snap.segments[0].blocks.len(), 2);
    assert!(snap
        .allocator_settings
        .iter()
        .any(|(k, _)| *k == "max_split_size_mb"));
    a.free(x).unwrap();
}

#[cfg(feature = "serde")]
#[test]
fn snapshot_exports_json_and_pickle() {
    let a = sim(GB, "");
    a.record_history(Some(Default::default())).unwrap();
    let x = a.malloc(5 * MB, S0).unwrap();
    let snap = a.snapshot();
    let v: serde_json::Value = serde_json::from_str(&snap.to_json()).unwrap();
    assert_eq!(v["segments"][0]["total_size"], 20 * MB);
    assert_eq!(v["segments"][0]["blocks"][0]["state"], "active_allocated");
    assert_eq!(v["device_traces"][0][0]["action"], "segment_alloc");
    let pickle = snap.to_pickle().unwrap();
    let back: serde_json::Value = serde_pickle::from_slice(&pickle, Default::default()).unwrap();
    assert_eq!(back["segments"][0]["total_size"], 20 * MB);
    a.free(x).unwrap();
}

#[test]
fn throw_on_cudamalloc_oom_skips_the_release_and_retry() {
    let a = sim(GB, "throw_on_cudamalloc_oom:True");
    let x = a.malloc(600 * MB, S0).unwrap();
    a.free(x).unwrap();
    assert!(a.malloc(700 * MB, S0).unwrap_err().is_out_of_memory());
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_device_free, s.num_ooms),
        (0, 0, 1)
    );
    // Without the option the cached block is released and the retry succeeds.
    a.set_settings("throw_on_cudamalloc_oom:False").unwrap();
    let y = a.malloc(700 * MB, S0).unwrap();
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn expandable_request_beyond_any_reservation_is_oom_and_leaves_nothing() {
    let a = sim(GB, "expandable_segments:True");
    for size in [800_000_000usize << 30, 1 << 40, 2 * GB] {
        assert!(
            matches!(a.malloc(size, S0), Err(Error::OutOfMemory(_))),
            "{size}"
        );
    }
    a.empty_cache().unwrap();
    assert!(
        a.blocks().is_empty(),
        "no reservation is left behind: {:?}",
        a.blocks()
    );
    let x = a.malloc(100 * MB, S0).unwrap();
    a.free(x).unwrap();
    check(&a);
}

#[test]
fn hand_edited_configs_are_validated() {
    let mk = |f: &dyn Fn(&mut AllocatorConfig)| {
        let mut c = AllocatorConfig::default();
        f(&mut c);
        CachingAllocator::new(SimulatedDevice::new(GB), c)
    };
    assert!(matches!(
        mk(&|c| c.large_segment_size = 4 * MB),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        mk(&|c| c.large_segment_size = 0),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        mk(&|c| c.roundup_power2_divisions = [3; 16]),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        mk(&|c| c.max_split_size = MB),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        mk(&|c| c.garbage_collection_threshold = 1.5),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        mk(&|c| c.per_process_memory_fraction = f64::NAN),
        Err(Error::Config(_))
    ));
    assert!(mk(&|c| c.max_split_size = 64 * MB).is_ok());
}

#[test]
fn failed_event_record_leaves_the_allocation_live() {
    use crate::device::SimOp;
    let a = sim(GB, "");
    let x = a.malloc(4096, S0).unwrap();
    a.record_stream(&x, StreamId(1)).unwrap();
    a.record_stream(&x, StreamId(2)).unwrap();
    a.with_device(|d| {
        d.enqueue_work(StreamId(1));
        d.inject_failure_on(
            SimOp::RecordEvent,
            DeviceError::Other("event pool exhausted".into()),
        )
    });
    assert!(matches!(a.free(x.clone()), Err(Error::Device(_))));
    check(&a);
    assert_eq!(a.memory_allocated(), 512 * 8, "nothing changed");
    assert_eq!(a.with_device(|d| d.live_events()), 0, "no event leaked");
    a.free(x).unwrap(); // the handle is still live; now the events are recorded
    a.with_device(|d| d.complete_all());
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    check(&a);
}

#[test]
fn failed_device_free_keeps_the_segment_cached() {
    use crate::device::SimOp;
    let a = sim(GB, "");
    let x = a.malloc(30 * MB, S0).unwrap();
    a.free(x).unwrap();
    a.with_device(|d| d.inject_failure_on(SimOp::Free, DeviceError::Other("busy".into())));
    assert!(matches!(a.empty_cache(), Err(Error::Device(_))));
    assert_eq!(a.memory_reserved(), 30 * MB, "still counted");
    check(&a);
    a.empty_cache().unwrap();
    assert_eq!((a.memory_reserved(), a.with_device(|d| d.used())), (0, 0));
}

/// The handle carries no spare discriminant: its serial is never 0, so an
/// `Option<Allocation>` (a replayer's or a framework's slot) is the handle's size.
#[test]
fn an_optional_handle_is_as_small_as_the_handle() {
    use crate::Allocation;
    let n = std::mem::size_of::<Allocation>();
    assert_eq!(std::mem::size_of::<Option<Allocation>>(), n);
    assert!(n <= 48, "Allocation grew to {n} bytes");
}
