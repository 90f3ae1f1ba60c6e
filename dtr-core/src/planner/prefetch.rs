//! What a plan's swap-ins cost once they are prefetched: the simulation
//! that makes a plan copies a swapped storage back at its read (it places
//! allocations as it goes, so it cannot know yet where the copy will land);
//! the iteration that follows the plan starts each copy as soon as its
//! destination range in the plan's arena is free and its host copy complete
//! (`Runtime::prefetch_issue`). This module re-times the simulation's
//! swap-ins under the plan's placement, as the follower will run them, so
//! the portfolio ranks a swapping plan by what it will cost.
//!
//! The re-timing models the host-to-device engine as the follower runs it
//! (one stream, copies in the order they are read) and moves every later
//! event earlier by the stalls saved before it; the device-to-host side is
//! kept as simulated. It is an estimate, for ranking: the iteration that
//! follows the plan measures its own stalls, and is held to the simulated
//! cost (`IterationPlan::bound_ns`), which prefetching never exceeds.

use ahash::AHashMap;

use remat_alloc::plan::Request as PlanRequest;

use crate::memory::arena::ArenaLayout;

/// A simulation's timing of its frees and swap-ins, on its wall clock (ns;
/// 0 at the start of the simulated iteration).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct SimTimes {
    /// `(slot key, since when nothing needed its contents)` of every free
    /// of a placed allocation (see `Runtime::release_slot`).
    pub frees: Vec<(u64, f64)>,
    /// `(slot key, wall)` of every allocation, in order.
    pub allocs: Vec<(u64, f64)>,
    /// Every swap-in, in the order they were read.
    pub swap_ins: Vec<SwapInTime>,
}

/// One swap-in of a simulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SwapInTime {
    /// The key of the slot it was copied into.
    pub key: u64,
    /// The wall clock at the read, before the stall (ns).
    pub read_ns: f64,
    /// The stall the simulation charged (ns).
    pub stall_ns: f64,
    /// When its host copy was complete (ns).
    pub ready_ns: f64,
    /// Bytes copied.
    pub bytes: u64,
}

/// A simulation's times by request (its allocations, in order): what the
/// re-timing reads, mapped from slot keys once per simulation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Timed {
    /// Since when nothing needed each request's contents, once freed (NaN:
    /// not seen freed).
    dead_at: Vec<f64>,
    /// The wall clock at each request's allocation (0 for the boundary's,
    /// made before the simulated iteration).
    alloc_ns: Vec<f64>,
    /// The swap-ins in read order, with the request each was copied into.
    swap_ins: Vec<(Option<usize>, SwapInTime)>,
}

impl Timed {
    /// `times` by the requests whose slot keys are `keys` (in allocation
    /// order).
    pub(crate) fn new(times: &SimTimes, keys: &[u64]) -> Self {
        let index: AHashMap<u64, usize> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        let mut dead_at = vec![f64::NAN; keys.len()];
        for &(key, at) in &times.frees {
            if let Some(&i) = index.get(&key) {
                dead_at[i] = at;
            }
        }
        let mut alloc_ns = vec![0.0; keys.len()];
        for &(key, wall) in &times.allocs {
            if let Some(&i) = index.get(&key) {
                alloc_ns[i] = wall;
            }
        }
        let swap_ins = (times.swap_ins.iter())
            .map(|sw| (index.get(&sw.key).copied(), *sw))
            .collect();
        Self {
            dead_at,
            alloc_ns,
            swap_ins,
        }
    }

    /// The most prefetching could save: every swap-in's simulated stall (ns).
    pub(crate) fn most_saved(&self) -> f64 {
        self.swap_ins.iter().map(|(_, sw)| sw.stall_ns).sum()
    }
}

/// The stalls (ns) that prefetching saves a simulation (`timed`) whose
/// allocations are placed at `offsets` with rounded `sizes`, copying at
/// `ns_per_byte` per direction: what to take off its total. 0 when it
/// swapped nothing in. A swap-in whose destination's predecessors were not
/// all seen freed starts at its read, as simulated.
pub(crate) fn stalls_saved(timed: &Timed, offsets: &[u64], sizes: &[u64], ns_per_byte: f64) -> f64 {
    if timed.swap_ins.is_empty() {
        return 0.0;
    }
    let layout = ArenaLayout::new(offsets, sizes);
    // `(read_ns, saved so far after it)` of the swap-ins re-timed so far, in
    // read order: an event at simulated time `t` happens `shift(t)` earlier.
    let mut done: Vec<(f64, f64)> = Vec::with_capacity(timed.swap_ins.len());
    let shift = |done: &[(f64, f64)], t: f64| -> f64 {
        let n = done.partition_point(|&(read, _)| read < t);
        if n == 0 {
            0.0
        } else {
            done[n - 1].1
        }
    };
    let mut h2d_free = 0.0f64;
    let mut saved = 0.0;
    for &(request, sw) in &timed.swap_ins {
        let now = sw.read_ns - saved;
        let issue = request.and_then(|k| {
            let mut issue = sw.ready_ns - shift(&done, sw.ready_ns);
            for &p in layout.preds(k) {
                let f = timed.dead_at[p as usize];
                if f.is_nan() {
                    return None;
                }
                issue = issue.max(f - shift(&done, f));
            }
            Some(issue)
        });
        let start = h2d_free.max(issue.unwrap_or(now).min(now));
        let end = start + sw.bytes as f64 * ns_per_byte;
        h2d_free = end;
        let stall = (end - now).max(0.0);
        saved += sw.stall_ns - stall;
        done.push((sw.read_ns, saved));
    }
    saved
}

/// The simulation's allocations (`requests`, timed by `timed`) with each
/// swap-in's lifetime reaching back to when its copy must start to be
/// complete at its read: `reach` copy times before it (at `ns_per_byte`),
/// not before its host copy is complete, from the step of the last
/// allocation made by then. A placement of these requests keeps each
/// swap-in's destination free from then on, so the follower can start the
/// copy there ([`stalls_saved`] times it). `None` when no lifetime moved.
pub(crate) fn reach_back(
    requests: &[PlanRequest],
    timed: &Timed,
    ns_per_byte: f64,
    reach: f64,
) -> Option<Vec<PlanRequest>> {
    let mut out: Option<Vec<PlanRequest>> = None;
    for &(request, sw) in &timed.swap_ins {
        let Some(i) = request else {
            continue;
        };
        let from = (sw.read_ns - reach * sw.bytes as f64 * ns_per_byte).max(sw.ready_ns);
        if from >= sw.read_ns {
            continue;
        }
        // Allocations are made in order, so their clocks never decrease: the
        // last one made by `from` (or the first of all).
        let j = timed.alloc_ns[..i]
            .partition_point(|&w| w <= from)
            .saturating_sub(1);
        let start = requests[j.min(i)].start;
        if start < requests[i].start {
            let v = out.get_or_insert_with(|| requests.to_vec());
            v[i].start = start;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swap_in(key: u64, read_ns: f64, stall_ns: f64, bytes: u64) -> SwapInTime {
        SwapInTime {
            key,
            read_ns,
            stall_ns,
            ready_ns: 0.0,
            bytes,
        }
    }

    #[test]
    fn a_copy_starts_when_its_range_is_free() {
        // Allocation 0 at [0, 512) freed at 100; the swap-in (allocation 1)
        // lands over it, read at 1000 with a 512 ns copy (1 ns per byte):
        // simulated as a 512 ns stall, prefetched from 100 it is hidden.
        let times = SimTimes {
            frees: vec![(7, 100.0)],
            allocs: vec![],
            swap_ins: vec![swap_in(9, 1000.0, 512.0, 512)],
        };
        let saved = stalls_saved(&Timed::new(&times, &[7, 9]), &[0, 0], &[512, 512], 1.0);
        assert_eq!(saved, 512.0);
        // Freed only at 900: 412 ns of the copy stay exposed.
        let late = SimTimes {
            frees: vec![(7, 900.0)],
            ..times.clone()
        };
        let saved = stalls_saved(&Timed::new(&late, &[7, 9]), &[0, 0], &[512, 512], 1.0);
        assert_eq!(saved, 100.0);
        // Its host copy complete only at 950: it cannot start before.
        let mut unready = times.clone();
        unready.swap_ins[0].ready_ns = 950.0;
        let saved = stalls_saved(&Timed::new(&unready, &[7, 9]), &[0, 0], &[512, 512], 1.0);
        assert_eq!(saved, 50.0);
        // The predecessor's free was never seen: no prefetch.
        let unseen = SimTimes {
            frees: vec![],
            ..times
        };
        let saved = stalls_saved(&Timed::new(&unseen, &[7, 9]), &[0, 0], &[512, 512], 1.0);
        assert_eq!(saved, 0.0);
    }

    #[test]
    fn copies_queue_on_one_engine_and_later_reads_shift() {
        // Two swap-ins into fresh ranges (no predecessors: free from the
        // start), 512 ns each at 1 ns per byte. Simulated: read at 600,
        // stalled 512 (wall 1112); read at 1200, stalled 512. Prefetched:
        // the first copies over 0–512, no stall; the second queues behind
        // it (512–1024) and is read 512 ns earlier, at 688: 336 stalled.
        let times = SimTimes {
            frees: vec![],
            allocs: vec![],
            swap_ins: vec![
                swap_in(1, 600.0, 512.0, 512),
                swap_in(2, 1200.0, 512.0, 512),
            ],
        };
        let saved = stalls_saved(&Timed::new(&times, &[1, 2]), &[0, 512], &[512, 512], 1.0);
        assert_eq!(saved, 512.0 + (512.0 - 336.0));
        // A range freed after the first read (at 1150) is free 512 ns
        // earlier once the first stall is gone: at 638; the copy runs
        // 638–1150 against the read at 688: 462 stalled.
        let later = SimTimes {
            frees: vec![(5, 1150.0)],
            ..times.clone()
        };
        let saved = stalls_saved(
            &Timed::new(&later, &[1, 5, 2]),
            &[0, 512, 512],
            &[512, 512, 512],
            1.0,
        );
        assert_eq!(saved, 512.0 + (512.0 - 462.0));
        // Nothing swapped in: nothing saved.
        assert_eq!(
            stalls_saved(&Timed::new(&SimTimes::default(), &[]), &[], &[], 1.0),
            0.0
        );
    }

    #[test]
    fn a_swap_in_reaches_back_to_the_allocation_before_its_copy_must_start() {
        // Three allocations at 0, 500 and 1000 ns; the third is a swap-in of
        // 512 B read at 1000 (1 ns per byte): its copy must start by 488,
        // so its destination is held from the first allocation's step.
        let requests: Vec<PlanRequest> = (0..3).map(|k| PlanRequest::new(512, k, 3)).collect();
        let mut times = SimTimes {
            frees: vec![],
            allocs: vec![(10, 0.0), (11, 500.0), (12, 1000.0)],
            swap_ins: vec![swap_in(12, 1000.0, 512.0, 512)],
        };
        let keys = [10, 11, 12];
        let ext = reach_back(&requests, &Timed::new(&times, &keys), 1.0, 1.0).unwrap();
        assert_eq!((ext[2].start, ext[2].end), (0, 3));
        assert_eq!(ext[..2], requests[..2]);
        // Half a copy ahead (by 744): from the second allocation's step.
        let ext = reach_back(&requests, &Timed::new(&times, &keys), 1.0, 0.5).unwrap();
        assert_eq!(ext[2].start, 1);
        // Its host copy complete only at 900: not before the second either.
        times.swap_ins[0].ready_ns = 900.0;
        let ext = reach_back(&requests, &Timed::new(&times, &keys), 1.0, 1.0).unwrap();
        assert_eq!(ext[2].start, 1);
        // Ready only at its read: nothing moves.
        times.swap_ins[0].ready_ns = 1000.0;
        assert!(reach_back(&requests, &Timed::new(&times, &keys), 1.0, 1.0).is_none());
    }
}
