//! Tests of the host allocator on [`AlignedHostProvider`] (real bytes) with
//! simulated events: PyTorch's host-allocator tests ported by name
//! (`test/test_cuda.py`), the rules one by one, and a model-based property
//! test of random alloc / free / record_event / stream progress / empty_cache
//! sequences.

use super::*;
use crate::device::{SimOp, SimulatedDevice};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const KB: usize = 1 << 10;
const MB: usize = 1 << 20;

type SimHost = CachingHostAllocator<AlignedHostProvider<SimulatedDevice>>;

/// A host allocator whose events are completed on command.
fn sim_host(options: HostAllocatorOptions) -> SimHost {
    let provider = AlignedHostProvider::with_events(SimulatedDevice::new(0));
    CachingHostAllocator::new(provider, options).expect("host allocator")
}

fn sim_host_conf(settings: &str) -> SimHost {
    let cfg = AllocatorConfig::parse(settings).expect("valid settings");
    sim_host(HostAllocatorOptions::from_config(&cfg))
}

#[track_caller]
fn check(a: &SimHost) {
    if let Err(e) = a.check_invariants() {
        panic!("invariant violated: {e}\n{a:?}");
    }
}

fn busy(a: &SimHost, stream: u64) {
    a.with_provider(|p| p.event_device().enqueue_work(StreamId(stream)));
}

fn complete(a: &SimHost, stream: u64) {
    a.with_provider(|p| p.event_device().complete_stream(StreamId(stream)));
}

// ---------------------------------------------------------------------------
// PyTorch's tests (test/test_cuda.py), ported by name.
// ---------------------------------------------------------------------------

/// `test_caching_pinned_memory`: a freed block is reused; one still in use by
/// a copy (a stream busy behind it) is not, until the copy is done.
#[test]
fn test_caching_pinned_memory() {
    let a = sim_host(HostAllocatorOptions::default());
    // check that allocations are reused after deletion
    let t = a.allocate(4).unwrap();
    let ptr = t.ptr();
    a.free(t).unwrap();
    let t = a.allocate(4).unwrap();
    assert_eq!(t.ptr(), ptr, "allocation not reused");
    // check that the allocation is not reused if it's in use by a copy
    busy(&a, 0); // torch.cuda._sleep: the copy waits behind a 1 s kernel
    a.write_bytes(&t, 0, &1f32.to_ne_bytes()).unwrap();
    a.record_event(&t, StreamId::DEFAULT).unwrap(); // gpu_tensor.copy_(t, non_blocking=True)
    a.free(t).unwrap();
    let t2 = a.allocate(4).unwrap();
    assert_ne!(t2.ptr(), ptr, "allocation re-used too soon");
    check(&a);
    // once the copy is done the first block is cached again
    complete(&a, 0);
    a.free(t2).unwrap();
    let t3 = a.allocate(4).unwrap();
    let t4 = a.allocate(4).unwrap();
    assert_eq!(
        [t3.ptr(), t4.ptr()].iter().filter(|&&p| p == ptr).count(),
        1
    );
    check(&a);
}

/// `test_caching_pinned_memory_multi_gpu`: a block copied to a second device
/// (here: a second stream) is not reused while that copy is pending.
#[test]
fn test_caching_pinned_memory_multi_gpu() {
    let a = sim_host(HostAllocatorOptions::default());
    let t = a.allocate(4).unwrap();
    let ptr = t.ptr();
    busy(&a, 1);
    a.record_event(&t, StreamId(1)).unwrap();
    a.free(t).unwrap();
    let t = a.allocate(4).unwrap();
    assert_ne!(t.ptr(), ptr, "allocation re-used too soon");
    complete(&a, 1);
    a.free(t).unwrap();
    check(&a);
}

/// `test_pinned_memory_with_cudaregister`: with
/// `pinned_use_cuda_host_register:True,pinned_num_register_threads:8`, blocks
/// of 8 MiB and 64 MiB are pinned by registering, with 8 threads.
#[test]
fn test_pinned_memory_with_cudaregister() {
    let a = CachingHostAllocator::from_config(
        AlignedHostProvider::new(),
        &AllocatorConfig::parse("pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
            .unwrap(),
    )
    .unwrap();
    for floats in [1usize << 21, 1 << 24] {
        let t = a.allocate(floats * 4).unwrap();
        let mode = a.with_provider(|p| p.mode_of(t.ptr()));
        assert_eq!(mode, Some(PinMode::HostRegister { threads: 8 }));
        a.write_bytes(&t, floats * 4 - 4, &[1, 2, 3, 4]).unwrap();
        assert_eq!(a.read_bytes(&t, floats * 4 - 4, 4).unwrap(), [1, 2, 3, 4]);
        a.free(t).unwrap();
    }
    a.set_config(&AllocatorConfig::parse("pinned_use_cuda_host_register:False").unwrap())
        .unwrap();
    let t = a.allocate(3 * MB).unwrap();
    assert_eq!(
        a.with_provider(|p| p.mode_of(t.ptr())),
        Some(PinMode::HostAlloc)
    );
    a.free(t).unwrap();
}

/// `test_pinned_memory_with_cudaregister_multithread`: the same from 4
/// threads sharing one allocator.
#[test]
fn test_pinned_memory_with_cudaregister_multithread() {
    let cfg =
        AllocatorConfig::parse("pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
            .unwrap();
    let a = Arc::new(CachingHostAllocator::from_config(AlignedHostProvider::new(), &cfg).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|i| {
            let a = a.clone();
            std::thread::spawn(move || {
                for floats in [1usize << 21, 1 << 22] {
                    let t = a.allocate(floats * 4).unwrap();
                    a.write_bytes(&t, 0, &[i; 64]).unwrap();
                    assert_eq!(a.read_bytes(&t, 0, 64).unwrap(), [i; 64]);
                    a.free(t).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!(a.stats().active_requests.current, 0);
}

/// `test_pinned_memory_empty_cache`: for both pinning modes, a freed block is
/// returned to the provider by `empty_cache`.
#[test]
fn test_pinned_memory_empty_cache() {
    for register in [true, false] {
        let a = CachingHostAllocator::from_config(
            AlignedHostProvider::new(),
            &AllocatorConfig::parse(&format!(
                "pinned_use_cuda_host_register:{}",
                if register { "True" } else { "False" }
            ))
            .unwrap(),
        )
        .unwrap();
        let t = a.allocate(4 * MB).unwrap();
        a.free(t).unwrap();
        assert_eq!(a.with_provider(|p| p.live_count()), 1);
        a.empty_cache().unwrap();
        assert_eq!(a.with_provider(|p| p.live_count()), 0);
        assert_eq!(a.pinned_bytes(), 0);
        assert_eq!(a.stats().num_host_free, 1);
    }
}

/// `test_host_memory_stats`: every key PyTorch checks, after two allocations
/// (10 Ki and 20 Ki floats: 64 KiB and 128 KiB blocks), after `empty_cache`
/// with both still live, and after the resets.
#[test]
fn test_host_memory_stats() {
    fn empty_stats() -> BTreeMap<&'static str, i64> {
        [
            "allocated_bytes.allocated",
            "allocated_bytes.current",
            "allocated_bytes.freed",
            "allocated_bytes.peak",
            "allocations.allocated",
            "allocations.current",
            "allocations.freed",
            "allocations.peak",
            "host_alloc_time.count",
            "host_free_time.count",
            "num_host_alloc",
            "num_host_free",
            "active_bytes.allocated",
            "active_bytes.current",
            "active_bytes.freed",
            "active_bytes.peak",
            "active_requests.allocated",
            "active_requests.current",
            "active_requests.freed",
            "active_requests.peak",
        ]
        .into_iter()
        .map(|k| (k, 0))
        .collect()
    }
    let a = sim_host(HostAllocatorOptions::default());
    let check_stats = |expected: &BTreeMap<&'static str, i64>| {
        let stats = a.stats();
        for (k, v) in expected {
            assert_eq!(stats.get(k), Some(*v), "key {k}");
        }
    };
    let (alloc1, alloc1_aligned, alloc2, alloc2_aligned) = (10, 16, 20, 32);
    let mut expected = empty_stats();
    a.empty_cache().unwrap();
    check_stats(&expected);

    let bump = |expected: &mut BTreeMap<&'static str, i64>, size: i64| {
        for prefix in ["active_requests", "allocations"] {
            for suffix in ["allocated", "current", "peak"] {
                *expected
                    .get_mut(format!("{prefix}.{suffix}").as_str())
                    .unwrap() += 1;
            }
        }
        for prefix in ["allocated_bytes", "active_bytes"] {
            for suffix in ["allocated", "current", "peak"] {
                *expected
                    .get_mut(format!("{prefix}.{suffix}").as_str())
                    .unwrap() += size;
            }
        }
        *expected.get_mut("num_host_alloc").unwrap() += 1;
        *expected.get_mut("host_alloc_time.count").unwrap() += 1;
    };
    let t1 = a.allocate(alloc1 * KB * 4).unwrap();
    bump(&mut expected, (alloc1_aligned * KB * 4) as i64);
    check_stats(&expected);
    let t2 = a.allocate(alloc2 * KB * 4).unwrap();
    bump(&mut expected, (alloc2_aligned * KB * 4) as i64);
    check_stats(&expected);

    a.empty_cache().unwrap();
    check_stats(&expected);

    a.free(t1).unwrap();
    a.free(t2).unwrap();
    a.empty_cache().unwrap();
    a.reset_peak_stats();
    a.reset_accumulated_stats();
    check_stats(&empty_stats());
    check(&a);
}

// ---------------------------------------------------------------------------
// The rules.
// ---------------------------------------------------------------------------

#[test]
fn sizes_round_to_powers_of_two_and_pages_align() {
    let a = sim_host(HostAllocatorOptions::default());
    for (req, size) in [(1, 1), (3, 4), (4096, 4096), (4097, 8192), (3 * MB, 4 * MB)] {
        let b = a.allocate(req).unwrap();
        assert_eq!((b.requested(), b.size()), (req, size));
        assert_eq!(b.ptr() % HOST_PAGE as u64, 0);
        a.free(b).unwrap();
    }
    check(&a);
}

#[test]
fn a_free_block_is_reused_only_for_its_own_size_class() {
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(1000).unwrap(); // 1024
    let px = x.ptr();
    a.free(x).unwrap();
    let y = a.allocate(2000).unwrap(); // 2048: not the 1024 block
    assert_ne!(y.ptr(), px);
    let z = a.allocate(600).unwrap(); // 1024 again
    assert_eq!(z.ptr(), px);
    assert_eq!(a.stats().num_host_alloc, 2);
    // last freed, first reused
    let w = a.allocate(1024).unwrap();
    let (pz, pw) = (z.ptr(), w.ptr());
    a.free(z).unwrap();
    a.free(w).unwrap();
    assert_eq!(a.allocate(1024).unwrap().ptr(), pw);
    assert_eq!(a.allocate(1024).unwrap().ptr(), pz);
    a.free(y).unwrap();
}

#[test]
fn a_block_used_on_several_streams_waits_for_all_of_them() {
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(MB).unwrap();
    let px = x.ptr();
    busy(&a, 1);
    busy(&a, 2);
    a.record_event(&x, StreamId(1)).unwrap();
    a.record_event(&x, StreamId(2)).unwrap();
    a.record_event(&x, StreamId(2)).unwrap(); // once per stream
    a.free(x).unwrap();
    assert_eq!(a.with_provider(|p| p.event_device().live_events()), 2);
    assert_eq!(
        a.stats().active_requests.current,
        1,
        "pending counts as active"
    );
    complete(&a, 1);
    assert_eq!(a.process_events().unwrap(), 1);
    let y = a.allocate(MB).unwrap();
    assert_ne!(y.ptr(), px);
    complete(&a, 2);
    let z = a.allocate(MB).unwrap();
    assert_eq!(z.ptr(), px);
    assert_eq!(a.with_provider(|p| p.event_device().live_events()), 0);
    check(&a);
}

#[test]
fn events_are_polled_oldest_first_up_to_the_first_incomplete_one() {
    // PyTorch's process_events stops at the first event that is not ready,
    // even when newer ones are: a block freed later waits behind it.
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(64).unwrap();
    let y = a.allocate(64).unwrap();
    busy(&a, 1);
    a.record_event(&x, StreamId(1)).unwrap();
    a.record_event(&y, StreamId(2)).unwrap(); // stream 2 idle: complete at once
    a.free(x).unwrap();
    a.free(y).unwrap();
    assert_eq!(a.process_events().unwrap(), 2);
    complete(&a, 1);
    assert_eq!(a.process_events().unwrap(), 0);
    check(&a);
}

#[test]
fn empty_cache_returns_free_blocks_but_not_pending_ones() {
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(MB).unwrap();
    let y = a.allocate(2 * MB).unwrap();
    busy(&a, 1);
    a.record_event(&y, StreamId(1)).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.pinned_bytes(), 2 * MB);
    assert_eq!(a.stats().num_host_free, 1);
    complete(&a, 1);
    a.empty_cache().unwrap();
    assert_eq!(a.pinned_bytes(), 0);
    assert_eq!(a.with_provider(|p| p.live_count()), 0);
    check(&a);
}

#[test]
fn zero_huge_double_free_and_foreign_handles_are_typed_errors() {
    let a = sim_host(HostAllocatorOptions::default());
    let b = sim_host(HostAllocatorOptions::default());
    assert_eq!(a.allocate(0).unwrap_err(), Error::ZeroSize);
    assert!(matches!(
        a.allocate(1 << 60).unwrap_err(),
        Error::RequestTooLarge { kind: "host", requested } if requested == 1 << 60
    ));
    assert!(matches!(
        a.allocate(usize::MAX),
        Err(Error::RequestTooLarge { .. })
    ));
    let x = a.allocate(100).unwrap();
    let copy = x.clone();
    a.free(x).unwrap();
    assert!(matches!(
        a.free(copy.clone()),
        Err(Error::InvalidHandle { .. })
    ));
    // the block is reused: the stale handle still does not free it
    let y = a.allocate(100).unwrap();
    assert_eq!(y.ptr(), copy.ptr());
    assert!(matches!(
        a.free(copy.clone()),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(matches!(
        a.write_bytes(&copy, 0, b"x"),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(matches!(
        a.record_event(&copy, StreamId(1)),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(matches!(
        b.free(y.clone()),
        Err(Error::ForeignHandle { .. })
    ));
    a.free(y).unwrap();
    check(&a);
    check(&b);
}

#[test]
fn bytes_round_trip_and_ranges_are_checked() {
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(100).unwrap(); // 128 bytes
    a.write_bytes(&x, 120, &[7; 8]).unwrap();
    assert_eq!(
        a.read_bytes(&x, 119, 9).unwrap(),
        [0, 7, 7, 7, 7, 7, 7, 7, 7]
    );
    assert!(matches!(
        a.write_bytes(&x, 121, &[7; 8]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.read_bytes(&x, usize::MAX, 2),
        Err(Error::InvalidArgument { .. })
    ));
    a.free(x).unwrap();
}

#[test]
fn the_budget_releases_the_cache_then_fails_naming_budget_and_request() {
    let a = sim_host(HostAllocatorOptions::default().with_budget(3 * MB));
    let x = a.allocate(MB).unwrap();
    let y = a.allocate(MB).unwrap();
    a.free(y).unwrap(); // cached: 2 MiB pinned
                        // 2 MiB more: over the budget until the cached 1 MiB block is released
    let z = a.allocate(2 * MB).unwrap();
    assert_eq!(a.pinned_bytes(), 3 * MB);
    assert_eq!(a.stats().num_host_free, 1);
    let err = a.allocate(MB + 1).unwrap_err();
    assert_eq!(
        err,
        Error::HostBudgetExceeded {
            requested: MB + 1,
            rounded: 2 * MB,
            budget: 3 * MB,
            pinned: 3 * MB
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("3145728-byte host budget") && msg.contains("1048577 bytes"),
        "{msg}"
    );
    assert!(!err.is_out_of_memory());
    // nothing changed
    assert_eq!(a.stats().active_requests.current, 2);
    a.free(x).unwrap();
    a.set_budget(None);
    let big = a.allocate(8 * MB).unwrap();
    a.free(big).unwrap();
    a.free(z).unwrap();
    check(&a);
}

#[test]
fn a_provider_out_of_memory_empties_the_cache_and_retries() {
    let provider = AlignedHostProvider::with_events(SimulatedDevice::new(0)).with_capacity(3 * MB);
    let a = CachingHostAllocator::new(provider, HostAllocatorOptions::default()).unwrap();
    let x = a.allocate(2 * MB).unwrap();
    a.free(x).unwrap();
    let y = a.allocate(MB).unwrap(); // 2 + 1 fits
    let z = a.allocate(2 * MB).unwrap(); // the cached 2 MiB block
    a.free(z).unwrap();
    let w = a.allocate(2 * MB + 1).unwrap_err(); // 4 MiB: never fits
    assert!(
        matches!(w, Error::Device(DeviceError::OutOfMemory { .. })),
        "{w}"
    );
    assert_eq!(
        a.pinned_bytes(),
        MB,
        "the cache was released before giving up"
    );
    a.free(y).unwrap();
    check(&a);
}

#[test]
fn a_failed_event_record_keeps_the_block_allocated() {
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(64).unwrap();
    a.record_event(&x, StreamId(1)).unwrap();
    a.record_event(&x, StreamId(2)).unwrap();
    a.with_provider(|p| {
        p.event_device()
            .inject_failure_on(SimOp::RecordEvent, DeviceError::Other("boom".into()))
    });
    assert!(matches!(a.free(x.clone()), Err(Error::Device(_))));
    assert_eq!(a.stats().active_requests.current, 1);
    assert_eq!(a.with_provider(|p| p.event_device().live_events()), 0);
    check(&a);
    a.free(x).unwrap(); // now it works, with both streams
    assert_eq!(a.with_provider(|p| p.event_device().live_events()), 2);
    check(&a);
}

#[test]
fn the_reserve_segment_serves_blocks_and_is_never_freed() {
    let a = sim_host_conf("pinned_reserve_segment_size_mb:1");
    let x = a.allocate(100).unwrap(); // 128 B, 4 KiB of the reserve
    let y = a.allocate(300 * KB).unwrap(); // 512 KiB
    let z = a.allocate(600 * KB).unwrap(); // 1 MiB: does not fit what is left
    let reserve_base = x.ptr();
    assert_eq!(y.ptr(), reserve_base + 4096);
    assert_eq!(a.stats().num_host_alloc, 2, "the reserve and z");
    assert_eq!(a.pinned_bytes(), 2 * MB);
    for b in [x, y, z] {
        a.free(b).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.pinned_bytes(), MB, "the reserve stays");
    assert_eq!(a.stats().allocations.current, 2, "its blocks stay cached");
    assert_eq!(a.allocate(128).unwrap().ptr(), reserve_base);
    check(&a);
}

#[test]
fn a_reserve_above_the_budget_is_skipped() {
    let cfg = AllocatorConfig::parse("pinned_reserve_segment_size_mb:4").unwrap();
    let a = sim_host(HostAllocatorOptions::from_config(&cfg).with_budget(2 * MB));
    let x = a.allocate(MB).unwrap();
    assert_eq!(a.pinned_bytes(), MB);
    a.free(x).unwrap();
    check(&a);
}

#[test]
fn bad_thread_counts_are_rejected() {
    let o = HostAllocatorOptions {
        num_register_threads: 3,
        ..HostAllocatorOptions::default()
    };
    assert!(matches!(
        CachingHostAllocator::new(AlignedHostProvider::new(), o),
        Err(Error::InvalidArgument {
            what: "num_register_threads",
            ..
        })
    ));
}

#[test]
fn the_allocator_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CachingHostAllocator<AlignedHostProvider>>();
    assert_send_sync::<HostBlock>();
}

#[test]
fn stats_keys_and_durations() {
    let a = sim_host(HostAllocatorOptions::default());
    let x = a.allocate(MB).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    let s = a.stats();
    let m = s.to_map();
    assert_eq!(m.len(), 4 * 4 + 2 * 5 + 2);
    assert_eq!(s.host_free_time.count, 1);
    assert!(s.host_alloc_time.min <= s.host_alloc_time.max);
    assert_eq!(m["allocated_bytes.peak"], MB as i64);
    assert!(s.to_string().contains("num_host_free: 1"));
    let mut d = DurationStat::default();
    d.increase(5);
    d.increase(3);
    d.increase(9);
    assert_eq!((d.count, d.total, d.min, d.max, d.avg()), (3, 17, 3, 9, 5));
}

// ---------------------------------------------------------------------------
// Model-based property test.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize },
    Free { index: usize },
    RecordEvent { index: usize, stream: u8 },
    Busy { stream: u8 },
    Complete { stream: u8 },
    EmptyCache,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => prop_oneof![1usize..5000, 5000usize..(3 << 20)].prop_map(|size| Op::Alloc { size }),
        8 => any::<usize>().prop_map(|index| Op::Free { index }),
        4 => (any::<usize>(), 0u8..3).prop_map(|(index, stream)| Op::RecordEvent { index, stream }),
        2 => (0u8..3).prop_map(|stream| Op::Busy { stream }),
        2 => (0u8..3).prop_map(|stream| Op::Complete { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

/// A block freed with events: address, size, and (stream, ticket) per event.
type Pending = (HostPtr, usize, Vec<(u8, u64)>);

/// The model: live blocks with the tag written into them, blocks freed with
/// events and whether each of those events may still be incomplete, and the
/// streams' work counters (as the simulated device keeps them).
#[derive(Default)]
struct Model {
    live: Vec<(HostBlock, u8, Vec<u8>)>,
    /// Freed blocks with their events as (stream, ticket): complete once the
    /// stream's completed count reaches the ticket.
    pending: Vec<Pending>,
    submitted: [u64; 3],
    completed: [u64; 3],
}

impl Model {
    fn incomplete(&self, ptr: HostPtr) -> bool {
        self.pending.iter().any(|(p, _, evs)| {
            *p == ptr && evs.iter().any(|&(s, t)| self.completed[s as usize] < t)
        })
    }
}

fn run(ops: &[Op], budget: Option<usize>, reserve_mb: usize) {
    let mut options = HostAllocatorOptions {
        reserve_segment_size: reserve_mb * MB,
        ..HostAllocatorOptions::default()
    };
    options.budget = budget;
    let a = sim_host(options);
    let mut m = Model::default();
    let mut tag = 0u8;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { size } => match a.allocate(size) {
                Ok(b) => {
                    assert_eq!(b.size(), size.next_power_of_two(), "step {step}");
                    assert!(
                        !m.incomplete(b.ptr()),
                        "step {step}: {b:?} reused before its events completed"
                    );
                    let (lo, hi) = (b.ptr(), b.ptr() + b.size() as u64);
                    for (y, _, _) in &m.live {
                        let (ylo, yhi) = (y.ptr(), y.ptr() + y.size() as u64);
                        assert!(hi <= ylo || yhi <= lo, "step {step}: {b:?} overlaps {y:?}");
                    }
                    m.pending.retain(|(p, _, _)| *p != b.ptr());
                    tag = tag.wrapping_add(1);
                    let n = b.size().min(64);
                    a.write_bytes(&b, b.size() - n, &vec![tag; n]).unwrap();
                    m.live.push((b, tag, Vec::new()));
                }
                Err(Error::HostBudgetExceeded {
                    rounded,
                    budget: bgt,
                    pinned,
                    ..
                }) => {
                    assert_eq!(Some(bgt), budget, "step {step}");
                    assert!(pinned + rounded > bgt, "step {step}");
                    let s = a.stats();
                    // every cached block outside the reserve was released first
                    let cached = s.allocations.current - s.active_requests.current;
                    if reserve_mb == 0 {
                        assert_eq!(cached, 0, "step {step}: refused with blocks cached");
                    }
                }
                Err(e) => panic!("step {step}: unexpected error {e}"),
            },
            Op::Free { index } if !m.live.is_empty() => {
                let (b, t, streams) = m.live.swap_remove(index % m.live.len());
                let n = b.size().min(64);
                assert_eq!(
                    a.read_bytes(&b, b.size() - n, n).unwrap(),
                    vec![t; n],
                    "step {step}: the bytes of {b:?} changed"
                );
                let evs = streams
                    .iter()
                    .map(|&s| (s, m.submitted[s as usize]))
                    .collect::<Vec<_>>();
                let (ptr, size) = (b.ptr(), b.size());
                a.free(b).unwrap();
                if !evs.is_empty() {
                    m.pending.push((ptr, size, evs));
                }
            }
            Op::RecordEvent { index, stream } if !m.live.is_empty() => {
                let i = index % m.live.len();
                a.record_event(&m.live[i].0, StreamId(u64::from(stream)))
                    .unwrap();
                if !m.live[i].2.contains(&stream) {
                    m.live[i].2.push(stream);
                }
            }
            Op::Busy { stream } => {
                busy(&a, u64::from(stream));
                m.submitted[stream as usize] += 1;
            }
            Op::Complete { stream } => {
                complete(&a, u64::from(stream));
                m.completed[stream as usize] = m.submitted[stream as usize];
            }
            Op::EmptyCache => {
                a.empty_cache().unwrap();
                // with every stream idle, only live blocks (and the reserve) remain
                if m.submitted == m.completed && reserve_mb == 0 {
                    let live: usize = m.live.iter().map(|(b, _, _)| b.size()).sum();
                    assert_eq!(a.pinned_bytes(), live, "step {step}");
                    assert_eq!(a.stats().allocations.current as usize, m.live.len());
                }
            }
            _ => {}
        }
        check(&a);
        let s = a.stats();
        let live_bytes: usize = m.live.iter().map(|(b, _, _)| b.size()).sum();
        let pending_bytes: usize = m.pending.iter().map(|&(_, size, _)| size).sum();
        assert!(
            (live_bytes..=live_bytes + pending_bytes).contains(&(s.active_bytes.current as usize)),
            "step {step}: active {} outside live {live_bytes} + pending {pending_bytes}",
            s.active_bytes.current
        );
        assert_eq!(
            a.pinned_bytes(),
            a.with_provider(|p| p.live_bytes()),
            "step {step}: provider and allocator disagree"
        );
        if let Some(bgt) = budget {
            assert!(a.pinned_bytes() <= bgt, "step {step}: over the budget");
        }
    }
    for (b, _, _) in m.live.drain(..) {
        a.free(b).unwrap();
    }
    a.with_provider(|p| p.event_device().complete_all());
    a.empty_cache().unwrap();
    check(&a);
    let pinned = a.pinned_bytes();
    assert!(
        pinned == 0 || pinned == reserve_mb * MB,
        "{pinned} left pinned"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn host_allocator_matches_the_model(ops in proptest::collection::vec(op_strategy(), 1..120)) {
        run(&ops, None, 0);
    }

    #[test]
    fn host_allocator_matches_the_model_with_a_budget(
        ops in proptest::collection::vec(op_strategy(), 1..120),
        budget_mb in 1usize..12,
    ) {
        run(&ops, Some(budget_mb * MB), 0);
    }

    #[test]
    fn host_allocator_matches_the_model_with_a_reserve(
        ops in proptest::collection::vec(op_strategy(), 1..80),
    ) {
        run(&ops, Some(16 * MB), 2);
    }
}
