//! `PlannedArena` on the DTR-paper traces: each trace's storages replayed as
//! several identical iterations (every storage still alive at the end of an
//! iteration is freed there). After the pattern is planned, the device sees no
//! new allocation, the reserved bytes stay flat (nothing fragments), and the
//! arena is smaller than what the caching allocator reserved for the same
//! sequence while recording.

use remat_alloc::plan::{ArenaAllocation, ArenaConfig, ArenaMode, PlannedArena};
use remat_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
use remat_trace::{baseline, require_traces, storage_events, trace_files, StorageEvent, Trace};

fn iteration(arena: &PlannedArena<SimulatedDevice>, events: &[StorageEvent], storages: usize) {
    arena.begin_iteration().unwrap();
    let mut live: Vec<Option<ArenaAllocation>> = vec![None; storages];
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                live[storage] = Some(arena.malloc(bytes as usize, StreamId::DEFAULT).unwrap());
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(a) = live[storage].take() {
                    arena.free(a).unwrap();
                }
            }
            _ => {}
        }
    }
    for a in live.into_iter().flatten() {
        arena.free(a).unwrap();
    }
}

#[test]
fn repeated_trace_iterations_need_no_device_allocation_after_planning() {
    if require_traces("repeated_trace_iterations_need_no_device_allocation_after_planning")
        .is_none()
    {
        return;
    }
    for path in trace_files() {
        let trace = Trace::load(&path).unwrap();
        let events = storage_events(&trace).unwrap();
        let storages = events
            .iter()
            .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
            .count();
        let peak = baseline(&trace).unwrap().peak_bytes;
        let inner = CachingAllocator::new(
            SimulatedDevice::new(4 * peak as usize),
            AllocatorConfig::default(),
        )
        .unwrap();
        let arena = PlannedArena::new(inner, ArenaConfig::default()).unwrap();
        for _ in 0..2 {
            iteration(&arena, &events, storages);
        }
        iteration(&arena, &events, storages); // the plan is made as this one begins
        let s = arena.stats();
        assert_eq!(s.mode, ArenaMode::Planned, "{}", trace.name);
        let device_allocs = arena.allocator().stats().num_device_alloc;
        let reserved = arena.allocator().memory_reserved();
        for _ in 0..3 {
            iteration(&arena, &events, storages);
            assert_eq!(
                arena.allocator().memory_reserved(),
                reserved,
                "{}: reserved bytes moved",
                trace.name
            );
        }
        arena.begin_iteration().unwrap();
        let s = arena.stats();
        let a = arena.allocator().stats();
        assert_eq!(
            a.num_device_alloc, device_allocs,
            "{}: device allocations after planning",
            trace.name
        );
        assert_eq!(s.planned_iterations, 4, "{}: {s:?}", trace.name);
        assert_eq!(s.divergences, 0, "{}", trace.name);
        // The planned lower bound counts sizes rounded to 512 B: at least the
        // trace's peak, at most 511 B more per storage.
        assert!(
            s.max_live_bytes >= peak && s.max_live_bytes <= peak + 511 * storages as u64,
            "{}",
            trace.name
        );
        let over = (s.arena_bytes as f64 / s.max_live_bytes as f64 - 1.0) * 100.0;
        eprintln!(
            "{:<12} arena {} B, max live (512-B rounded) {} B, +{over:.4} %, reserved after planning {} B, recording-phase reserved peak {} B",
            trace.name, s.arena_bytes, s.max_live_bytes, reserved, a.reserved_bytes.all.peak
        );
        assert!(
            s.arena_bytes < a.reserved_bytes.all.peak as u64,
            "{}: the arena does not beat the cache",
            trace.name
        );
    }
}
