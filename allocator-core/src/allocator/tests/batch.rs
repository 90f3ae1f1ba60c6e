//! [`crate::AllocatorBatch`]: one lock for many operations, the same decisions,
//! and a slow path that releases the lock for callbacks and observers.

use super::{check, sim, GB, MB};
use crate::{Error, StreamId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const S0: StreamId = StreamId::DEFAULT;

#[test]
fn batch_serves_malloc_free_and_adjacent_queries() {
    let a = sim(GB, "");
    let mut g = a.batch();
    let x = g.malloc(3 * MB, S0).unwrap();
    let y = g.malloc(2 * MB, S0).unwrap();
    g.free(x.clone()).unwrap();
    let free = g.adjacent_free_size(&y).unwrap();
    assert_eq!((free.left, free.right), (3 * MB, 15 * MB));
    assert_eq!(
        g.view().stats().allocated_bytes.all.current,
        (2 * MB) as i64
    );
    assert!(matches!(g.free(x), Err(Error::InvalidHandle { .. })));
    g.record_stream(&y, StreamId(1)).unwrap();
    g.free(y).unwrap();
    drop(g);
    check(&a);
    assert_eq!(a.memory_allocated(), 0);
}

/// A miss inside a batch runs the free-memory callbacks and OOM observers with
/// the lock released: both call back into the allocator's public API here,
/// which would deadlock if the batch kept the lock.
#[test]
fn batch_miss_releases_the_lock_for_callbacks_and_observers() {
    let a = Arc::new(sim(64 * MB, ""));
    let donated = Arc::new(Mutex::new(Vec::new()));
    let (weak, d) = (Arc::downgrade(&a), donated.clone());
    a.add_free_memory_callback(move || {
        let a = weak.upgrade().unwrap();
        let x = d.lock().unwrap().pop();
        x.is_some_and(|x| a.free(x).is_ok())
    });
    let seen = Arc::new(AtomicUsize::new(0));
    let (weak, s) = (Arc::downgrade(&a), seen.clone());
    a.add_oom_observer(move |_| {
        s.store(weak.upgrade().unwrap().memory_reserved(), Ordering::SeqCst);
    });
    let mut g = a.batch();
    let big = g.malloc(40 * MB, S0).unwrap();
    donated.lock().unwrap().push(big);
    // 40 MiB live of 64: a second 40 MiB misses; the callback frees the first.
    let again = g.malloc(40 * MB, S0).unwrap();
    assert!(donated.lock().unwrap().is_empty(), "the callback ran");
    // Now nothing is donated: a request larger than the device fails, and the
    // observer reads the allocator from outside the lock.
    let err = g.malloc(100 * MB, S0).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(seen.load(Ordering::SeqCst), 40 * MB);
    g.free(again).unwrap();
    drop(g);
    check(&a);
}
