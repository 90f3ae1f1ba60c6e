//! The hot path allocates nothing (issue 14): a counting global allocator counts
//! heap allocations made by this thread while a window is open, around cached
//! malloc+free pairs (exact fit and split/merge, large and small pool, with
//! other cached blocks around), adjacent-free queries, and the same through a
//! batch, after one warm-up round (the first use of a bin or of an arena slot may
//! grow a `Vec`; later uses reuse its capacity).

use remat_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Allocations counted on this thread; `None` when not counting.
    static COUNT: Cell<Option<usize>> = const { Cell::new(None) };
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter is a const-initialized thread-local `Cell`
// without a destructor, so touching it never allocates or re-enters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        COUNT.with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        COUNT.with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(Some(0)));
    f();
    COUNT.with(|c| c.replace(None)).unwrap_or(0)
}

const S: StreamId = StreamId::DEFAULT;
const MB: usize = 1 << 20;

fn warmed_allocator() -> CachingAllocator<SimulatedDevice> {
    let a =
        CachingAllocator::new(SimulatedDevice::new(1 << 30), AllocatorConfig::default()).unwrap();
    // Other cached blocks of various sizes, as in a real cache.
    let others: Vec<_> = (0..8)
        .map(|i| a.malloc((21 + i) * MB, S).unwrap())
        .collect();
    for x in others {
        a.free(x).unwrap();
    }
    a
}

/// The steady-state operations, run `n` times.
fn hot_ops(a: &CachingAllocator<SimulatedDevice>, n: usize) {
    let keep = a.malloc(4096, S).unwrap();
    for _ in 0..n {
        let x = a.malloc(20 * MB, S).unwrap(); // best fit: a cached 22 MiB segment, split
        a.free(x).unwrap();
        let y = a.malloc(4096, S).unwrap(); // small pool: split, then merge on free
        let adj = a.adjacent_free_size(&y).unwrap();
        assert!(adj.right > 0);
        a.inspect(|v| v.adjacent_free_size(&y).unwrap());
        a.free(y).unwrap();
        let z = a.malloc(3 * MB, S).unwrap(); // large pool: split a cached block
        a.free(z).unwrap();
    }
    a.free(keep).unwrap();
}

#[test]
fn cached_malloc_free_and_queries_allocate_nothing() {
    let a = warmed_allocator();
    hot_ops(&a, 2);
    assert_eq!(allocations(|| hot_ops(&a, 100)), 0);
}

#[test]
fn the_same_through_a_batch_allocates_nothing() {
    let a = warmed_allocator();
    let run = |n: usize| {
        let mut g = a.batch();
        for _ in 0..n {
            let x = g.malloc(20 * MB, S).unwrap();
            let y = g.malloc(4096, S).unwrap();
            assert!(g.adjacent_free_size(&y).unwrap().right > 0);
            g.free(y).unwrap();
            g.free(x).unwrap();
        }
    };
    run(2);
    assert_eq!(allocations(|| run(100)), 0);
}

/// The counter works (so the zeros above are not a counter that never counts):
/// one `Box` is one allocation.
#[test]
fn the_counter_counts_this_threads_allocations() {
    let n = allocations(|| {
        std::hint::black_box(Box::new(7u64));
    });
    assert_eq!(n, 1);
}
