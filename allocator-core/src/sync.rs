//! The one place that names a mutex: `std` normally, `loom` under `cfg(loom)`, so
//! loom models exercise the real locking code. Nothing else in the crate imports
//! either.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// A process-wide id for each allocator instance, stamped into its handles so a
/// handle from another allocator is rejected. A plain std atomic even under
/// loom: it is not part of the locking protocol that loom models check.
pub(crate) fn next_instance_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Locks `m`, recovering the data if a previous holder panicked: the allocator's
/// state is only mutated through methods that restore its invariants before any
/// call that can panic, so a poisoned lock still guards consistent state.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
