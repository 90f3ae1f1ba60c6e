//! [`PlannedArena`]: the caching allocator plus a planned arena for iterations
//! that repeat (MegTaiChi's "TMA", seed 003).
//!
//! The caller marks iteration boundaries with [`PlannedArena::begin_iteration`].
//! While *recording*, every request is served by the caching allocator and the
//! iteration's sequence of allocs and frees is kept. Once the last
//! [`ArenaConfig::record_iterations`] iterations were identical, the sequence is
//! planned ([`super::plan`]) and one arena of the planned size is allocated (once).
//! From then on each allocation that the pattern frees within its iteration is
//! served at its planned offset in the arena — no search, no split, no
//! fragmentation — and the others (allocations that outlive their iteration, or
//! live on another stream) still come from the caching allocator.
//!
//! When an iteration departs from the pattern (a dynamic model), the rest of that
//! iteration falls back to the caching allocator; allocations already served from
//! the arena stay valid, because nothing new is placed in the arena until the next
//! iteration, and an iteration only uses the arena when no arena allocation from
//! an earlier one is still alive. The divergence is counted, and when a new
//! pattern has been stable for `record_iterations` iterations it replaces the old
//! one (the arena is re-planned).
//!
//! ```
//! use remat_alloc::plan::{ArenaConfig, PlannedArena};
//! use remat_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
//!
//! # fn main() -> Result<(), remat_alloc::Error> {
//! let inner = CachingAllocator::new(SimulatedDevice::new(1 << 30), AllocatorConfig::default())?;
//! let arena = PlannedArena::new(inner, ArenaConfig::default())?;
//! for _ in 0..5 {
//!     arena.begin_iteration()?;
//!     let a = arena.malloc(3 << 20, StreamId::DEFAULT)?;
//!     let b = arena.malloc(5 << 20, StreamId::DEFAULT)?;
//!     arena.free(a)?;
//!     let c = arena.malloc(2 << 20, StreamId::DEFAULT)?;
//!     arena.free(b)?;
//!     arena.free(c)?;
//! }
//! let stats = arena.stats();
//! assert!(stats.planned_iterations >= 2);
//! assert_eq!(stats.arena_bytes, 8 << 20); // = the most bytes alive at once
//! # Ok(()) }
//! ```

use super::{plan, Algorithm, Plan, Request};
use crate::device::{Device, DevicePtr, StreamId};
use crate::error::Error;
use crate::snapshot::Snapshot;
use crate::sync::{lock, Mutex};
use crate::{Allocation, CachingAllocator, Result};

/// How [`PlannedArena`] records and plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Identical consecutive iterations needed before (re-)planning (≥ 2).
    pub record_iterations: usize,
    /// The planning algorithm; `None` (the default) runs every algorithm and
    /// keeps the smallest arena (planning happens once per pattern, and 5k
    /// requests plan in milliseconds).
    pub algorithm: Option<Algorithm>,
    /// Compact the chosen plan ([`compact`](super::compact)) before allocating
    /// the arena (default `true`): a smaller arena for a few hundred
    /// milliseconds once per pattern at 5k requests.
    pub compact: bool,
    /// Only allocations on this stream are planned.
    pub stream: StreamId,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            record_iterations: 2,
            algorithm: None,
            compact: true,
            stream: StreamId::DEFAULT,
        }
    }
}

/// Which mode the arena is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArenaMode {
    /// No stable pattern yet: everything comes from the caching allocator.
    #[default]
    Recording,
    /// A pattern is planned and the arena allocated.
    Planned,
}

/// Counters of a [`PlannedArena`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Current mode.
    pub mode: ArenaMode,
    /// Iterations begun.
    pub iterations: u64,
    /// Iterations that followed the planned pattern to the end.
    pub planned_iterations: u64,
    /// Iterations that departed from the pattern (or found arena memory still in use).
    pub divergences: u64,
    /// Plans made (the first one included).
    pub plans: u64,
    /// Bytes of the arena (0 while recording).
    pub arena_bytes: u64,
    /// The planned pattern's lower bound: the most planned bytes alive at once.
    pub max_live_bytes: u64,
    /// Allocations served at a planned offset.
    pub served_from_arena: u64,
    /// Allocations served by the caching allocator.
    pub served_from_cache: u64,
    /// Bytes of arena allocations alive now.
    pub live_arena_bytes: u64,
}

/// One event of an iteration's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// The k-th allocation of the iteration (k = its position among allocs).
    Alloc { size: usize, stream: StreamId },
    /// Free of the iteration's k-th allocation; `None` for one made earlier.
    Free { alloc: Option<usize> },
}

/// The planned pattern and its arena.
#[derive(Debug)]
struct Pattern {
    events: Vec<Event>,
    /// For each alloc of the pattern: its offset in the arena, or `None` when it
    /// is served by the caching allocator.
    offsets: Vec<Option<u64>>,
    arena: Allocation,
    plan: Plan,
    /// Bumped at each plan: handles of an older arena are rejected.
    generation: u64,
}

#[derive(Debug, Default)]
struct ArenaState {
    pattern: Option<Pattern>,
    /// Events of the iteration in progress.
    current: Vec<Event>,
    /// Allocs so far in the iteration in progress.
    allocs_this_iteration: usize,
    /// Serial of the iteration in progress (0 = before the first boundary).
    iteration: u64,
    /// Position in the pattern; `None` once this iteration diverged.
    cursor: Option<usize>,
    /// Recent complete iterations, newest last (at most `record_iterations`).
    history: Vec<Vec<Event>>,
    /// `live[k]`: the pattern's k-th alloc is handed out from the arena now.
    live: Vec<bool>,
    live_count: usize,
    generation: u64,
    stats: ArenaStats,
}

/// A live allocation of a [`PlannedArena`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArenaAllocation {
    ptr: DevicePtr,
    size: usize,
    requested: usize,
    iteration: u64,
    /// Position among the allocs of its iteration.
    index: usize,
    source: Source,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Source {
    Arena { generation: u64 },
    Cache(Allocation),
}

impl ArenaAllocation {
    /// Start address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// Bytes reserved for it (≥ [`ArenaAllocation::requested`]).
    pub fn size(&self) -> usize {
        self.size
    }
    /// Bytes asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }
    /// True when served at a planned offset of the arena.
    pub fn is_planned(&self) -> bool {
        matches!(self.source, Source::Arena { .. })
    }
}

/// One planned block, as [`PlannedArena::snapshot`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedBlock {
    /// Offset in the arena.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
    /// Handed out now.
    pub live: bool,
}

/// A snapshot of both modes: the caching allocator (which holds the arena as one
/// allocated block) and the arena's planned blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct ArenaSnapshot {
    /// The arena's counters.
    pub stats: ArenaStats,
    /// Address of the arena, when planned.
    pub arena_ptr: Option<DevicePtr>,
    /// The planned blocks of the pattern.
    pub planned: Vec<PlannedBlock>,
    /// The caching allocator underneath.
    pub allocator: Snapshot,
}

/// The caching allocator with a planned arena for repeating iterations.
pub struct PlannedArena<D: Device> {
    inner: CachingAllocator<D>,
    config: ArenaConfig,
    state: Mutex<ArenaState>,
}

/// Planned sizes and offsets are multiples of this (bytes): the caching
/// allocator's block granularity, so arena blocks are aligned like cached ones.
const ALIGN: usize = crate::size::MIN_BLOCK_SIZE;

impl<D: Device> PlannedArena<D> {
    /// Wraps `inner`. `config.record_iterations` must be at least 2 (a pattern
    /// must be seen to repeat before it is trusted).
    pub fn new(inner: CachingAllocator<D>, config: ArenaConfig) -> Result<Self> {
        if config.record_iterations < 2 {
            return Err(Error::InvalidArgument {
                what: "ArenaConfig::record_iterations",
                value: config.record_iterations.to_string(),
                allowed: "2 or more identical iterations",
            });
        }
        Ok(PlannedArena {
            inner,
            config,
            state: Mutex::new(ArenaState::default()),
        })
    }

    /// The caching allocator underneath (its stats include the arena as one block).
    pub fn allocator(&self) -> &CachingAllocator<D> {
        &self.inner
    }

    /// The arena's counters.
    pub fn stats(&self) -> ArenaStats {
        lock(&self.state).stats
    }

    /// Marks the start of an iteration (and the end of the previous one).
    pub fn begin_iteration(&self) -> Result<()> {
        let mut st = lock(&self.state);
        let finished = std::mem::take(&mut st.current);
        if st.iteration > 0 {
            self.end_iteration(&mut st, finished)?;
        }
        st.iteration += 1;
        st.stats.iterations += 1;
        st.allocs_this_iteration = 0;
        // The arena is only used when nothing of an earlier iteration lives in it.
        st.cursor = match &st.pattern {
            Some(_) if st.live_count == 0 => Some(0),
            Some(_) => {
                st.stats.divergences += 1;
                None
            }
            None => None,
        };
        Ok(())
    }

    fn end_iteration(&self, st: &mut ArenaState, finished: Vec<Event>) -> Result<()> {
        let followed = match (&st.pattern, st.cursor) {
            (Some(p), Some(pos)) => pos == p.events.len(),
            _ => false,
        };
        if st.pattern.is_some() {
            if followed {
                st.stats.planned_iterations += 1;
                st.history.clear();
                return Ok(());
            }
            if st.cursor.is_some() {
                st.stats.divergences += 1; // ended before the pattern did
            }
        }
        st.history.push(finished);
        let n = self.config.record_iterations;
        if st.history.len() > n {
            st.history.remove(0);
        }
        let stable = st.history.len() == n && st.history.windows(2).all(|w| w[0] == w[1]);
        if stable && st.live_count == 0 {
            let events = st.history.last().cloned().unwrap_or_default();
            if st.pattern.as_ref().is_none_or(|p| p.events != events) {
                self.replan(st, events)?;
            }
            st.history.clear();
        }
        Ok(())
    }

    /// Plans `events` and (re)allocates the arena.
    #[cold]
    fn replan(&self, st: &mut ArenaState, events: Vec<Event>) -> Result<()> {
        // Requests, in allocation order: allocs on the planned stream that the
        // pattern frees within the iteration, alive from their alloc to their free.
        let mut allocs = Vec::new(); // (time, size, stream, free time)
        for (t, e) in events.iter().enumerate() {
            match *e {
                Event::Alloc { size, stream } => allocs.push((t, size, stream, None)),
                Event::Free { alloc: Some(k) } => {
                    if let Some(a) = allocs.get_mut(k) {
                        a.3 = Some(t);
                    }
                }
                Event::Free { alloc: None } => {}
            }
        }
        let mut requests = Vec::new();
        let mut request_of = Vec::with_capacity(allocs.len()); // alloc k -> request index
        for &(start, size, stream, end) in &allocs {
            match end {
                Some(end) if stream == self.config.stream => {
                    request_of.push(Some(requests.len()));
                    requests.push(Request::new(
                        size.div_ceil(ALIGN).saturating_mul(ALIGN) as u64,
                        start,
                        end,
                    ));
                }
                _ => request_of.push(None),
            }
        }
        let algorithms = match self.config.algorithm {
            Some(a) => vec![a],
            None => Algorithm::ALL.to_vec(),
        };
        let mut best: Option<Plan> = None;
        for algo in algorithms {
            let p = plan(&requests, algo).map_err(|e| {
                Error::Internal(format!(
                    "planning a recorded pattern with {algo} failed: {e}"
                ))
            })?;
            if best.as_ref().is_none_or(|b| p.arena_bytes < b.arena_bytes) {
                best = Some(p);
            }
        }
        let mut planned =
            best.ok_or_else(|| Error::Internal("no planning algorithm ran".into()))?;
        if self.config.compact {
            planned = super::compact(&requests, &planned).map_err(|e| {
                Error::Internal(format!("compacting a recorded pattern's plan failed: {e}"))
            })?;
        }
        let offsets: Vec<Option<u64>> = request_of
            .iter()
            .map(|r| r.map(|i| planned.offsets[i]))
            .collect();
        if let Some(old) = st.pattern.take() {
            self.inner.free(old.arena)?;
        }
        // The arena replaces the cached blocks the recording phase left behind:
        // give them back first, so the arena fits where they were.
        self.inner.empty_cache()?;
        st.stats.arena_bytes = 0;
        st.stats.max_live_bytes = 0;
        if planned.arena_bytes == 0 {
            return Ok(()); // nothing worth planning: stay recording
        }
        let arena = self
            .inner
            .malloc(planned.arena_bytes as usize, self.config.stream)?;
        st.generation += 1;
        st.live = vec![false; offsets.len()];
        st.stats.mode = ArenaMode::Planned;
        st.stats.plans += 1;
        st.stats.arena_bytes = planned.arena_bytes;
        st.stats.max_live_bytes = planned.max_live_bytes;
        st.pattern = Some(Pattern {
            events,
            offsets,
            arena,
            plan: planned,
            generation: st.generation,
        });
        Ok(())
    }

    /// Allocates `size` bytes on `stream`: from the arena when the iteration
    /// follows the planned pattern, else from the caching allocator.
    pub fn malloc(&self, size: usize, stream: StreamId) -> Result<ArenaAllocation> {
        let mut st = lock(&self.state);
        let index = st.allocs_this_iteration;
        st.allocs_this_iteration += 1;
        st.current.push(Event::Alloc { size, stream });
        let iteration = st.iteration;
        let expected = Event::Alloc { size, stream };
        let mut planned_at = None;
        if let (Some(p), Some(pos)) = (&st.pattern, st.cursor) {
            if p.events.get(pos) == Some(&expected) {
                planned_at = Some(
                    p.offsets
                        .get(index)
                        .copied()
                        .flatten()
                        .map(|o| (p.arena.ptr() + o, p.generation)),
                );
            }
        }
        // planned_at: None = departs from the pattern; Some(None) = follows it and
        // is served by the cache; Some(Some(..)) = follows it, served from the arena.
        match planned_at {
            Some(_) => st.cursor = st.cursor.map(|c| c + 1),
            None if st.cursor.is_some() => {
                st.cursor = None;
                st.stats.divergences += 1;
            }
            None => {}
        }
        if let Some(Some((ptr, generation))) = planned_at {
            let rounded = size.div_ceil(ALIGN) * ALIGN;
            st.live[index] = true;
            st.live_count += 1;
            st.stats.served_from_arena += 1;
            st.stats.live_arena_bytes += rounded as u64;
            return Ok(ArenaAllocation {
                ptr,
                size: rounded,
                requested: size,
                iteration,
                index,
                source: Source::Arena { generation },
            });
        }
        let a = self.inner.malloc(size, stream)?;
        st.stats.served_from_cache += 1;
        Ok(ArenaAllocation {
            ptr: a.ptr(),
            size: a.size(),
            requested: size,
            iteration,
            index,
            source: Source::Cache(a),
        })
    }

    /// Frees an allocation of this arena.
    pub fn free(&self, a: ArenaAllocation) -> Result<()> {
        let mut st = lock(&self.state);
        match &a.source {
            Source::Arena { generation } => {
                let live = st
                    .pattern
                    .as_ref()
                    .is_some_and(|p| p.generation == *generation)
                    && st.live.get(a.index).copied().unwrap_or(false);
                if !live {
                    return Err(Error::InvalidHandle {
                        ptr: a.ptr,
                        reason: "not a live arena allocation (already freed?)",
                    });
                }
                st.live[a.index] = false;
                st.live_count -= 1;
                st.stats.live_arena_bytes -= a.size as u64;
            }
            Source::Cache(inner) => self.inner.free(inner.clone())?,
        }
        let alloc = (a.iteration == st.iteration).then_some(a.index);
        let event = Event::Free { alloc };
        st.current.push(event);
        if let (Some(p), Some(pos)) = (&st.pattern, st.cursor) {
            if p.events.get(pos) == Some(&event) {
                st.cursor = Some(pos + 1);
            } else {
                st.cursor = None;
                st.stats.divergences += 1;
            }
        }
        Ok(())
    }

    /// Both modes at once: counters, planned blocks, and the caching allocator.
    pub fn snapshot(&self) -> ArenaSnapshot {
        let st = lock(&self.state);
        let planned = st
            .pattern
            .as_ref()
            .map(|p| {
                let mut sizes = Vec::new();
                for e in &p.events {
                    if let Event::Alloc { size, .. } = e {
                        sizes.push(size.div_ceil(ALIGN) * ALIGN);
                    }
                }
                p.offsets
                    .iter()
                    .enumerate()
                    .filter_map(|(k, o)| {
                        o.map(|offset| PlannedBlock {
                            offset,
                            size: sizes[k] as u64,
                            live: st.live[k],
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        ArenaSnapshot {
            stats: st.stats,
            arena_ptr: st.pattern.as_ref().map(|p| p.arena.ptr()),
            planned,
            allocator: self.inner.snapshot(),
        }
    }

    /// The current plan, when one is in force.
    pub fn plan(&self) -> Option<Plan> {
        lock(&self.state).pattern.as_ref().map(|p| p.plan.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocatorConfig, HostDevice, SimulatedDevice};

    const MB: usize = 1 << 20;
    const S: StreamId = StreamId::DEFAULT;

    fn arena() -> PlannedArena<SimulatedDevice> {
        let inner =
            CachingAllocator::new(SimulatedDevice::new(1 << 30), AllocatorConfig::default())
                .unwrap();
        PlannedArena::new(inner, ArenaConfig::default()).unwrap()
    }

    /// One training-like iteration: activations alive through "backward", a
    /// scratch buffer, and one output kept into the next iteration.
    fn iteration<D: Device>(a: &PlannedArena<D>, kept: &mut Option<ArenaAllocation>) {
        a.begin_iteration().unwrap();
        iteration_body(a, kept);
    }

    #[test]
    fn identical_iterations_are_served_from_one_arena() {
        let a = arena();
        let mut kept = None;
        for _ in 0..3 {
            iteration(&a, &mut kept);
        }
        a.begin_iteration().unwrap(); // closes the 3rd: planned after two identical ones
        let s = a.stats();
        assert_eq!(s.mode, ArenaMode::Planned);
        assert_eq!(s.plans, 1);
        let device_allocs = a.allocator().stats().num_device_alloc;
        let from_arena = s.served_from_arena;
        // The iteration just begun and four more: all served by the plan.
        let mut kept2 = kept.take();
        for _ in 0..4 {
            // `iteration` begins its own iteration: roll back the one we opened.
            iteration_body(&a, &mut kept2);
            a.begin_iteration().unwrap();
        }
        let s = a.stats();
        assert_eq!(s.planned_iterations, 4, "{s:?}");
        assert_eq!(s.divergences, 0);
        assert_eq!(
            s.served_from_arena - from_arena,
            4 * 9,
            "every in-iteration allocation is planned"
        );
        assert_eq!(
            a.allocator().stats().num_device_alloc,
            device_allocs,
            "zero device allocations after planning"
        );
        let plan = a.plan().unwrap();
        assert_eq!(plan.arena_bytes, s.arena_bytes);
        assert_eq!(
            s.arena_bytes, plan.max_live_bytes,
            "greedy-by-size packs this pattern exactly"
        );
        if let Some(k) = kept2 {
            a.free(k).unwrap();
        }
    }

    /// The body of `iteration` without its `begin_iteration`.
    fn iteration_body<D: Device>(a: &PlannedArena<D>, kept: &mut Option<ArenaAllocation>) {
        let acts: Vec<_> = [3 * MB, 5 * MB, 700 << 10, 9 * MB]
            .iter()
            .map(|&n| a.malloc(n, S).unwrap())
            .collect();
        let scratch = a.malloc(2 * MB, S).unwrap();
        a.free(scratch).unwrap();
        for x in acts.into_iter().rev() {
            let g = a.malloc(x.requested(), S).unwrap();
            a.free(x).unwrap();
            a.free(g).unwrap();
        }
        if let Some(old) = kept.take() {
            a.free(old).unwrap();
        }
        *kept = Some(a.malloc(MB, S).unwrap());
    }

    #[test]
    fn divergence_falls_back_without_corrupting_and_replans() {
        let inner =
            CachingAllocator::new(HostDevice::new(1 << 30), AllocatorConfig::default()).unwrap();
        let a = PlannedArena::new(inner, ArenaConfig::default()).unwrap();
        let pattern = |a: &PlannedArena<HostDevice>, sizes: &[usize]| {
            a.begin_iteration().unwrap();
            let xs: Vec<_> = sizes.iter().map(|&n| a.malloc(n, S).unwrap()).collect();
            for x in xs {
                a.free(x).unwrap();
            }
        };
        for _ in 0..3 {
            pattern(&a, &[4 * MB, 6 * MB, 2 * MB]);
        }
        a.begin_iteration().unwrap();
        assert_eq!(a.stats().mode, ArenaMode::Planned);
        // This iteration starts like the pattern, writes into its arena blocks, then diverges.
        let x = a.malloc(4 * MB, S).unwrap();
        let y = a.malloc(6 * MB, S).unwrap();
        assert!(x.is_planned() && y.is_planned());
        a.allocator()
            .with_device(|d| d.write_bytes(x.ptr(), &[0xAA; 4096]))
            .unwrap();
        a.allocator()
            .with_device(|d| d.write_bytes(y.ptr(), &[0xBB; 4096]))
            .unwrap();
        let z = a.malloc(7 * MB, S).unwrap(); // not in the pattern
        assert!(!z.is_planned());
        let w = a.malloc(2 * MB, S).unwrap(); // in the pattern's place, but after divergence
        assert!(
            !w.is_planned(),
            "nothing new goes into the arena after a divergence"
        );
        for q in [&z, &w] {
            a.allocator()
                .with_device(|d| d.write_bytes(q.ptr(), &vec![0xCC; q.requested()]))
                .unwrap();
        }
        assert_eq!(
            a.allocator()
                .with_device(|d| d.read_bytes(x.ptr(), 4096))
                .unwrap(),
            vec![0xAA; 4096]
        );
        assert_eq!(
            a.allocator()
                .with_device(|d| d.read_bytes(y.ptr(), 4096))
                .unwrap(),
            vec![0xBB; 4096]
        );
        for q in [x, y, z, w] {
            a.free(q).unwrap();
        }
        assert_eq!(a.stats().divergences, 1);
        // A new pattern, stable for two iterations, replaces the old one.
        for _ in 0..2 {
            pattern(&a, &[4 * MB, 6 * MB, 7 * MB, 2 * MB]);
        }
        a.begin_iteration().unwrap();
        let s = a.stats();
        assert_eq!(s.plans, 2, "{s:?}");
        assert_eq!(s.arena_bytes, (19 * MB) as u64);
        let xs: Vec<_> = [4 * MB, 6 * MB, 7 * MB, 2 * MB]
            .iter()
            .map(|&n| a.malloc(n, S).unwrap())
            .collect();
        assert!(xs.iter().all(ArenaAllocation::is_planned));
        for x in xs {
            a.free(x).unwrap();
        }
        a.begin_iteration().unwrap();
        // Planned: iteration 3 (after two identical ones); then 4 diverged — its
        // sequence is the new pattern's, so the pattern was stable after 5 and
        // iterations 6 and 7 followed it.
        let s = a.stats();
        assert_eq!(
            (s.planned_iterations, s.divergences, s.plans),
            (3, 2, 2),
            "{s:?}"
        );
        a.allocator().check_invariants().unwrap();
    }

    #[test]
    fn arena_memory_still_in_use_sends_the_iteration_to_the_cache() {
        let a = arena();
        for _ in 0..3 {
            a.begin_iteration().unwrap();
            let x = a.malloc(4 * MB, S).unwrap();
            a.free(x).unwrap();
        }
        a.begin_iteration().unwrap();
        let leaked = a.malloc(4 * MB, S).unwrap();
        assert!(leaked.is_planned());
        a.begin_iteration().unwrap(); // `leaked` is still alive in the arena
        let x = a.malloc(4 * MB, S).unwrap();
        assert!(!x.is_planned(), "would overlap the live arena block");
        assert_ne!(x.ptr(), leaked.ptr());
        a.free(leaked).unwrap();
        a.free(x).unwrap();
        assert!(a.stats().divergences >= 1);
    }

    #[test]
    fn misuse_is_a_typed_error() {
        let inner =
            CachingAllocator::new(SimulatedDevice::new(1 << 30), AllocatorConfig::default())
                .unwrap();
        let bad = ArenaConfig {
            record_iterations: 1,
            ..ArenaConfig::default()
        };
        assert!(matches!(
            PlannedArena::new(inner, bad),
            Err(Error::InvalidArgument { .. })
        ));
        let a = arena();
        for _ in 0..3 {
            a.begin_iteration().unwrap();
            let x = a.malloc(4 * MB, S).unwrap();
            a.free(x).unwrap();
        }
        a.begin_iteration().unwrap();
        let x = a.malloc(4 * MB, S).unwrap();
        a.free(x.clone()).unwrap();
        assert!(matches!(a.free(x), Err(Error::InvalidHandle { .. })));
    }

    #[test]
    fn snapshot_covers_both_modes() {
        let a = arena();
        let mut kept = None;
        for _ in 0..3 {
            iteration(&a, &mut kept);
        }
        a.begin_iteration().unwrap();
        let snap = a.snapshot();
        assert_eq!(snap.stats.mode, ArenaMode::Planned);
        assert_eq!(snap.planned.len(), 9);
        assert!(snap.planned.iter().all(|b| !b.live));
        let arena_ptr = snap.arena_ptr.unwrap();
        let arena_block = snap
            .allocator
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .find(|b| b.address == arena_ptr)
            .unwrap();
        assert_eq!(
            arena_block.size as u64,
            snap.stats.arena_bytes.div_ceil(512) * 512
        );
        if let Some(k) = kept {
            a.free(k).unwrap();
        }
    }
}
