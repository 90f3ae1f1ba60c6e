//! loom models of the allocator's real locking code (through the `sync` facade,
//! which switches to loom under `cfg(loom)`). Each model is tiny and checks one
//! property under every interleaving loom explores.
//!
//! Run with: `RUSTFLAGS="--cfg loom" cargo test -p remat-alloc --test loom --release`

#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use remat_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};

const MB: usize = 1 << 20;

fn allocator() -> Arc<CachingAllocator<SimulatedDevice>> {
    Arc::new(
        CachingAllocator::new(SimulatedDevice::new(64 * MB), AllocatorConfig::default()).unwrap(),
    )
}

fn settle(a: &CachingAllocator<SimulatedDevice>) {
    a.check_invariants().unwrap();
}

/// Two threads malloc and free concurrently: they never get overlapping blocks,
/// and afterwards the stats equal a recount.
#[test]
fn concurrent_malloc_free() {
    loom::model(|| {
        let a = allocator();
        let b = a.clone();
        let t = thread::spawn(move || {
            let x = b.malloc(MB, StreamId::DEFAULT).unwrap();
            let range = (x.ptr(), x.ptr() + x.size() as u64);
            b.free(x).unwrap();
            range
        });
        let y = a.malloc(3 * MB, StreamId::DEFAULT).unwrap();
        let yr = (y.ptr(), y.ptr() + y.size() as u64);
        let xr = t.join().unwrap();
        // x may have been freed before y was carved; if both were live at once
        // they came from different pools (1 MiB small, 3 MiB large): never overlapping.
        assert!(xr.1 <= yr.0 || yr.1 <= xr.0, "{xr:?} overlaps {yr:?}");
        a.free(y).unwrap();
        settle(&a);
        assert_eq!(a.memory_allocated(), 0);
    });
}

/// A free racing `empty_cache`: the segment is released exactly once, or stays
/// cached; reserved bytes always equal what the device holds.
#[test]
fn free_racing_empty_cache() {
    loom::model(|| {
        let a = allocator();
        let x = a.malloc(4 * MB, StreamId::DEFAULT).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || b.empty_cache().unwrap());
        a.free(x).unwrap();
        t.join().unwrap();
        settle(&a);
        assert_eq!(a.memory_reserved(), a.with_device(|d| d.used()));
        a.empty_cache().unwrap();
        assert_eq!(a.with_device(|d| d.used()), 0);
    });
}

/// `record_stream` + free on one thread while another allocates and completes the
/// side stream: the block is never handed out while its event is pending.
#[test]
fn record_stream_deferred_free() {
    loom::model(|| {
        let a = allocator();
        let side = StreamId(1);
        let x = a.malloc(MB, StreamId::DEFAULT).unwrap();
        let xptr = x.ptr();
        a.with_device(|d| d.enqueue_work(side));
        a.record_stream(&x, side).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || {
            let y = b.malloc(MB, StreamId::DEFAULT).unwrap();
            let pending = b.with_device(|d| d.is_busy(side));
            let reused = y.ptr() == xptr;
            b.free(y).unwrap();
            (reused, pending)
        });
        a.free(x).unwrap();
        a.with_device(|d| d.complete_stream(side));
        let (reused, pending_at_malloc) = t.join().unwrap();
        assert!(
            !(reused && pending_at_malloc),
            "block reused while its stream was busy"
        );
        settle(&a);
    });
}

/// With `release_lock_on_cudamalloc`, the state lock is dropped around the
/// device allocation of a new segment: two threads growing the cache at once
/// still end with consistent state and distinct segments.
#[test]
fn release_lock_on_device_malloc() {
    loom::model(|| {
        let cfg = AllocatorConfig::parse("release_lock_on_cudamalloc:True").unwrap();
        let a = Arc::new(CachingAllocator::new(SimulatedDevice::new(64 * MB), cfg).unwrap());
        let b = a.clone();
        let t = thread::spawn(move || b.malloc(24 * MB, StreamId::DEFAULT).unwrap());
        let x = a.malloc(24 * MB, StreamId::DEFAULT).unwrap();
        let y = t.join().unwrap();
        assert_ne!(x.ptr(), y.ptr());
        assert_eq!(a.with_device(|d| d.segments().len()), 2);
        a.free(x).unwrap();
        a.free(y).unwrap();
        settle(&a);
    });
}

/// The host allocator: `record_event` + free on one thread while another
/// allocates the same size and the stream completes: the block is never
/// handed out while its event is pending, and the bookkeeping stays exact.
#[test]
fn host_record_event_deferred_free() {
    use remat_alloc::host::{AlignedHostProvider, CachingHostAllocator, HostAllocatorOptions};
    loom::model(|| {
        let provider = AlignedHostProvider::with_events(SimulatedDevice::new(0));
        let a =
            Arc::new(CachingHostAllocator::new(provider, HostAllocatorOptions::default()).unwrap());
        let side = StreamId(1);
        let x = a.allocate(4096).unwrap();
        let xptr = x.ptr();
        a.with_provider(|p| p.event_device().enqueue_work(side));
        a.record_event(&x, side).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || {
            let y = b.allocate(4096).unwrap();
            let pending = b.with_provider(|p| p.event_device().is_busy(side));
            let reused = y.ptr() == xptr;
            b.free(y).unwrap();
            (reused, pending)
        });
        a.free(x).unwrap();
        a.with_provider(|p| p.event_device().complete_stream(side));
        let (reused, pending_at_alloc) = t.join().unwrap();
        assert!(
            !(reused && pending_at_alloc),
            "host block reused while its stream was busy"
        );
        a.check_invariants().unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.pinned_bytes(), 0);
    });
}

/// A deliberately broken model: a check-then-act race in *user* code around the
/// allocator (read the allocated bytes, then allocate if zero). Each call is
/// atomic, the sequence is not; loom must find the interleaving where both
/// threads allocate, proving the harness explores our mutex's interleavings.
#[test]
#[should_panic(expected = "both threads allocated")]
fn broken_check_then_act_is_caught() {
    loom::model(|| {
        let a = allocator();
        let b = a.clone();
        let racy = |a: &CachingAllocator<SimulatedDevice>| {
            if a.memory_allocated() == 0 {
                Some(a.malloc(MB, StreamId::DEFAULT).unwrap())
            } else {
                None
            }
        };
        let t = thread::spawn(move || racy(&b).is_some());
        let mine = racy(&a).is_some();
        let theirs = t.join().unwrap();
        assert!(!(mine && theirs), "both threads allocated");
    });
}

/// A batch (one lock for many operations) on one thread while another thread
/// uses the public API: no overlapping blocks, and afterwards the stats equal a
/// recount. The batch holds the lock between its calls, so the other thread's
/// malloc runs before or after the whole batch, never between its operations.
#[test]
fn batch_against_public_calls() {
    loom::model(|| {
        let a = allocator();
        let b = a.clone();
        let t = thread::spawn(move || {
            let x = b.malloc(MB, StreamId::DEFAULT).unwrap();
            let range = (x.ptr(), x.ptr() + x.size() as u64);
            b.free(x).unwrap();
            range
        });
        {
            let mut g = a.batch();
            let y = g.malloc(MB, StreamId::DEFAULT).unwrap();
            let adj = g.adjacent_free_size(&y).unwrap();
            let yr = (y.ptr(), y.ptr() + y.size() as u64);
            g.free(y).unwrap();
            // Nothing ran in between: the freed block is the best fit again.
            let z = g.malloc(MB, StreamId::DEFAULT).unwrap();
            assert_eq!(z.ptr(), yr.0, "another thread ran inside the batch");
            assert_eq!(g.adjacent_free_size(&z).unwrap(), adj);
            g.free(z).unwrap();
        }
        let xr = t.join().unwrap();
        assert!(xr.0 < xr.1);
        settle(&a);
        assert_eq!(a.memory_allocated(), 0);
    });
}

/// A batch's malloc that misses the cache runs the free-memory callback with
/// the lock released: the callback frees through the public API (a deadlock,
/// which loom reports, if the batch kept the lock), while another thread
/// allocates from the cache; state stays consistent.
#[test]
fn batch_miss_runs_callbacks_outside_the_lock() {
    loom::model(|| {
        let a = Arc::new(
            CachingAllocator::new(SimulatedDevice::new(32 * MB), AllocatorConfig::default())
                .unwrap(),
        );
        // The callback reaches the allocator through a slot cleared at the end
        // (loom's Arc has no Weak), and frees the donated allocation.
        let slot = Arc::new(Mutex::new(Some(a.clone())));
        let spare = Arc::new(Mutex::new(None));
        let (sl, sp) = (slot.clone(), spare.clone());
        a.add_free_memory_callback(move || {
            let Some(a) = sl.lock().unwrap().clone() else {
                return false;
            };
            let x = sp.lock().unwrap().take();
            x.is_some_and(|x| a.free(x).is_ok())
        });
        // A cached small segment, so the other thread's malloc hits the cache
        // (a miss there would run the callback too); a 20 MiB segment, live and
        // donated to the callback.
        let warm = a.malloc(MB, StreamId::DEFAULT).unwrap();
        a.free(warm).unwrap();
        *spare.lock().unwrap() = Some(a.malloc(20 * MB, StreamId::DEFAULT).unwrap());
        let b = a.clone();
        let t = thread::spawn(move || {
            let x = b.malloc(MB, StreamId::DEFAULT).unwrap();
            b.free(x).unwrap();
        });
        let mut g = a.batch();
        // Nothing cached fits 16 MiB: a miss; the callback frees the 20 MiB
        // block and the retried lookup splits it.
        let y = g.malloc(16 * MB, StreamId::DEFAULT).unwrap();
        g.free(y).unwrap();
        drop(g);
        t.join().unwrap();
        assert!(spare.lock().unwrap().is_none(), "the callback ran");
        *slot.lock().unwrap() = None;
        settle(&a);
        assert_eq!(a.memory_allocated(), 0);
        assert_eq!(a.memory_reserved(), 22 * MB);
        assert_eq!(a.memory_reserved(), a.with_device(|d| d.used()));
    });
}
