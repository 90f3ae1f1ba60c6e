//! Differential test (issue 14): the allocator against the pre-rewrite
//! implementation kept verbatim in `allocator::tests::reference`, driven with the same
//! generated operations (on the new allocator partly through
//! [`crate::AllocatorBatch`], on the reference always through its public methods). Every result (addresses, sizes, errors with their
//! messages, adjacent-free figures), the full statistics after every operation,
//! and the block list, snapshot (trace included) and memory summary at a fixed
//! cadence and after every slow-path operation must be identical.
//!
//! The short form runs with the unit tests. The full form (≥ 1 M operations per
//! configuration) is ignored by default:
//!
//! ```sh
//! cargo test -p remat-alloc --release --lib differential_full -- --ignored --nocapture
//! ```

use super::reference as old;
use super::MB;
use crate::device::SimOp;
use crate::snapshot::{HistoryConfig, Snapshot, TraceAction};
use crate::{
    Allocation, AllocatorConfig, CachingAllocator, DeviceError, Error, SimulatedDevice, StreamId,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// splitmix64: a tiny deterministic generator, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo)
    }
    fn chance(&mut self, per_mille: usize) -> bool {
        self.below(1000) < per_mille
    }
}

/// One configuration: the initial settings, the device capacity, whether the
/// device has virtual memory.
struct Setup {
    settings: &'static str,
    capacity: usize,
    vmm: bool,
}

const SETUPS: [Setup; 8] = [
    Setup {
        settings: "",
        capacity: 2048 * MB,
        vmm: true,
    },
    Setup {
        settings: "max_split_size_mb:40",
        capacity: 2048 * MB,
        vmm: true,
    },
    Setup {
        settings: "max_split_size_mb:40,max_non_split_rounding_mb:64",
        capacity: 1024 * MB,
        vmm: false,
    },
    Setup {
        settings: "roundup_power2_divisions:4",
        capacity: 2048 * MB,
        vmm: true,
    },
    Setup {
        settings: "expandable_segments:True",
        capacity: 2048 * MB,
        vmm: true,
    },
    Setup {
        settings: "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
        capacity: 2048 * MB,
        vmm: true,
    },
    Setup {
        settings:
            "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:[2:4,>:2]",
        capacity: 1024 * MB,
        vmm: true,
    },
    Setup {
        settings: "release_lock_on_cudamalloc:True,throw_on_cudamalloc_oom:True",
        capacity: 768 * MB,
        vmm: false,
    },
];

/// Settings applied at run time (`set_settings`).
const RUNTIME_SETTINGS: [&str; 6] = [
    "",
    "max_split_size_mb:40",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
    "expandable_segments:False,garbage_collection_threshold:0.6",
    "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:[2:4,>:2]",
];

/// Sizes drawn often, so that many free blocks tie on size and the lowest
/// address must win.
const MENU: [usize; 16] = [
    512,
    1000,
    4096,
    8192,
    65536,
    512 * 1024,
    MB,
    MB + 1,
    2 * MB,
    4 * MB,
    8 * MB,
    10 * MB,
    20 * MB,
    24 * MB,
    40 * MB,
    64 * MB,
];

fn size(rng: &mut Rng) -> usize {
    if rng.chance(450) {
        return MENU[rng.below(MENU.len())];
    }
    match rng.below(100) {
        0..=34 => rng.range(1, 4096),
        35..=64 => rng.range(4096, MB + 1),
        65..=91 => rng.range(MB + 1, 10 * MB),
        _ => rng.range(10 * MB, 90 * MB),
    }
}

fn stream(rng: &mut Rng) -> StreamId {
    StreamId(if rng.chance(700) {
        0
    } else {
        rng.range(1, 3) as u64
    })
}

/// A result as the test compares it: the value, or the error's full message.
fn outcome<T: PartialEq + std::fmt::Debug>(r: &Result<T, Error>) -> Result<&T, String> {
    r.as_ref().map_err(|e| e.to_string())
}

/// The snapshot with trace times cleared (they read the clock).
fn untimed(mut s: Snapshot) -> Snapshot {
    for e in &mut s.device_traces {
        e.time_us = 0;
    }
    s
}

struct Pair {
    new: Arc<CachingAllocator<SimulatedDevice>>,
    old: Arc<old::CachingAllocator<SimulatedDevice>>,
    /// Live allocations, the same in both at the same index.
    live: Vec<(Allocation, old::Allocation)>,
    /// Freed handles, for double frees (bounded).
    stale: Vec<(Allocation, old::Allocation)>,
    /// Allocations handed to the free-memory callbacks, which free one per call.
    donated_new: Arc<Mutex<Vec<Allocation>>>,
    donated_old: Arc<Mutex<Vec<old::Allocation>>>,
    ooms_new: Arc<AtomicUsize>,
    ooms_old: Arc<AtomicUsize>,
}

fn device(setup: &Setup) -> SimulatedDevice {
    SimulatedDevice::builder(setup.capacity)
        .virtual_memory(setup.vmm)
        .build()
}

impl Pair {
    fn new(setup: &Setup) -> Pair {
        let cfg = AllocatorConfig::parse(setup.settings).expect("valid settings");
        let new = Arc::new(CachingAllocator::new(device(setup), cfg.clone()).unwrap());
        let old = Arc::new(old::CachingAllocator::new(device(setup), cfg).unwrap());
        let pair = Pair {
            new,
            old,
            live: Vec::new(),
            stale: Vec::new(),
            donated_new: Arc::default(),
            donated_old: Arc::default(),
            ooms_new: Arc::default(),
            ooms_old: Arc::default(),
        };
        let (weak, donated) = (Arc::downgrade(&pair.new), pair.donated_new.clone());
        pair.new.add_free_memory_callback(move || {
            free_donated(&weak, &donated, |a, x| a.free(x).is_ok())
        });
        let (weak, donated) = (Arc::downgrade(&pair.old), pair.donated_old.clone());
        pair.old.add_free_memory_callback(move || {
            free_donated(&weak, &donated, |a, x| a.free(x).is_ok())
        });
        let n = pair.ooms_new.clone();
        pair.new.add_oom_observer(move |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        let n = pair.ooms_old.clone();
        pair.old.add_oom_observer(move |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        pair
    }

    /// Compares everything observable. `full` adds the block list, snapshot and
    /// summary.
    #[track_caller]
    fn compare(&self, step: usize, what: &str, full: bool) {
        let (sn, so) = (self.new.stats(), self.old.stats());
        assert_eq!(sn, so, "step {step} ({what}): stats differ");
        if full {
            assert_eq!(
                self.new.blocks(),
                self.old.blocks(),
                "step {step} ({what}): blocks differ"
            );
            assert_eq!(
                untimed(self.new.snapshot()),
                untimed(self.old.snapshot()),
                "step {step} ({what}): snapshots differ"
            );
            assert_eq!(
                self.new.memory_summary(),
                self.old.memory_summary(),
                "step {step} ({what}): summaries differ"
            );
            assert_eq!(
                self.ooms_new.load(Ordering::Relaxed),
                self.ooms_old.load(Ordering::Relaxed),
                "step {step}: OOM observer calls differ"
            );
            assert_eq!(self.new.config(), self.old.config(), "step {step}: config");
            assert_eq!(
                self.new.memory_fraction().to_bits(),
                self.old.memory_fraction().to_bits(),
                "step {step}: memory fraction"
            );
            self.new.check_invariants().unwrap();
        }
    }

    /// One generated operation on both; returns its name and whether it was a
    /// slow-path operation (after which everything is compared).
    fn step(&mut self, step: usize, rng: &mut Rng) -> (&'static str, bool) {
        let crowded = self.live.len() > 300;
        let r = rng.below(1040);
        match r {
            0..=399 if !crowded => {
                let (size, stream) = (size(rng), stream(rng));
                let (n, o) = (self.new.malloc(size, stream), self.old.malloc(size, stream));
                let key = |x: &Allocation| (x.ptr(), x.size(), x.requested(), x.stream());
                let okey = |x: &old::Allocation| (x.ptr(), x.size(), x.requested(), x.stream());
                assert_eq!(
                    n.as_ref().map(key).map_err(|e| e.to_string()),
                    o.as_ref().map(okey).map_err(|e| e.to_string()),
                    "step {step}: malloc({size}, {stream:?})"
                );
                let slow = n.is_err();
                if let (Ok(n), Ok(o)) = (n, o) {
                    self.live.push((n, o));
                }
                ("malloc", slow)
            }
            0..=719 => {
                if self.live.is_empty() {
                    return ("free (none live)", false);
                }
                let (n, o) = self.live.swap_remove(rng.below(self.live.len()));
                if self.stale.len() < 64 {
                    self.stale.push((n.clone(), o.clone()));
                }
                let (rn, ro) = (self.new.free(n), self.old.free(o));
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: free");
                ("free", false)
            }
            720..=799 => {
                if self.live.is_empty() {
                    return ("adjacent (none live)", false);
                }
                let (n, o) = &self.live[rng.below(self.live.len())];
                let (rn, ro) = if rng.chance(500) {
                    (
                        self.new.adjacent_free_size(n),
                        self.old.adjacent_free_size(o),
                    )
                } else {
                    (
                        self.new.inspect(|v| v.adjacent_free_size(n)),
                        self.old.inspect(|v| v.adjacent_free_size(o)),
                    )
                };
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: adjacent");
                ("adjacent_free_size", false)
            }
            800..=839 => {
                if self.live.is_empty() {
                    return ("record_stream (none live)", false);
                }
                let (n, o) = &self.live[rng.below(self.live.len())];
                let s = stream(rng);
                let (rn, ro) = (self.new.record_stream(n, s), self.old.record_stream(o, s));
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: record_stream");
                ("record_stream", false)
            }
            840..=879 => {
                let s = stream(rng);
                self.new.with_device(|d| d.enqueue_work(s));
                self.old.with_device(|d| d.enqueue_work(s));
                ("enqueue_work", false)
            }
            880..=929 => {
                let s = stream(rng);
                self.new.with_device(|d| d.complete_stream(s));
                self.old.with_device(|d| d.complete_stream(s));
                ("complete_stream", false)
            }
            930..=944 => {
                if self.stale.is_empty() {
                    return ("double free (none stale)", false);
                }
                let (n, o) = self.stale.swap_remove(rng.below(self.stale.len()));
                let (rn, ro) = if rng.chance(500) {
                    (self.new.free(n), self.old.free(o))
                } else {
                    (
                        self.new.adjacent_free_size(&n).map(|_| ()),
                        self.old.adjacent_free_size(&o).map(|_| ()),
                    )
                };
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: stale handle");
                ("stale handle", false)
            }
            945..=954 => {
                if !self.live.is_empty() {
                    let (n, o) = self.live.swap_remove(rng.below(self.live.len()));
                    self.donated_new.lock().unwrap().push(n);
                    self.donated_old.lock().unwrap().push(o);
                }
                ("donate", false)
            }
            955..=964 => {
                let (rn, ro) = (self.new.empty_cache(), self.old.empty_cache());
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: empty_cache");
                ("empty_cache", true)
            }
            965..=969 => {
                let s = RUNTIME_SETTINGS[rng.below(RUNTIME_SETTINGS.len())];
                let (rn, ro) = (self.new.set_settings(s), self.old.set_settings(s));
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: set_settings({s})");
                ("set_settings", true)
            }
            970..=974 => {
                let f = [1.0, 0.75, 0.5, 0.25][rng.below(4)];
                let (rn, ro) = (
                    self.new.set_memory_fraction(f),
                    self.old.set_memory_fraction(f),
                );
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: fraction {f}");
                ("set_memory_fraction", true)
            }
            975..=979 => {
                self.new.reset_peak_stats();
                self.old.reset_peak_stats();
                ("reset_peak_stats", false)
            }
            980..=982 => {
                self.new.reset_accumulated_stats();
                self.old.reset_accumulated_stats();
                ("reset_accumulated_stats", false)
            }
            983..=986 => {
                let h = match rng.below(3) {
                    0 => None,
                    1 => Some(HistoryConfig {
                        max_entries: 50,
                        skip_actions: Vec::new(),
                    }),
                    _ => Some(HistoryConfig {
                        max_entries: 20,
                        skip_actions: vec![TraceAction::FreeRequested, TraceAction::Snapshot],
                    }),
                };
                let (rn, ro) = (
                    self.new.record_history(h.clone()),
                    self.old.record_history(h),
                );
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}: record_history");
                ("record_history", true)
            }
            987..=994 => {
                let (op, err) = match rng.below(3) {
                    0 => (SimOp::Allocate, DeviceError::OutOfMemory { requested: 0 }),
                    1 => (SimOp::Allocate, DeviceError::Other("injected".into())),
                    _ => (SimOp::RecordEvent, DeviceError::Other("injected".into())),
                };
                let e2 = err.clone();
                self.new.with_device(|d| d.inject_failure_on(op, err));
                self.old.with_device(|d| d.inject_failure_on(op, e2));
                ("inject_failure", false)
            }
            995..=999 => ("compare", true),
            _ => {
                self.batch(step, rng);
                ("batch", false)
            }
        }
    }

    /// A run of hot-path operations through one [`crate::AllocatorBatch`] on the
    /// new allocator, the public methods on the reference.
    fn batch(&mut self, step: usize, rng: &mut Rng) {
        let mut g = self.new.batch();
        for k in 0..rng.range(1, 40) {
            let r = rng.below(100);
            if r < 45 && self.live.len() <= 300 {
                let (size, stream) = (size(rng), stream(rng));
                let (n, o) = (g.malloc(size, stream), self.old.malloc(size, stream));
                let key = |x: &Allocation| (x.ptr(), x.size(), x.requested(), x.stream());
                let okey = |x: &old::Allocation| (x.ptr(), x.size(), x.requested(), x.stream());
                assert_eq!(
                    n.as_ref().map(key).map_err(|e| e.to_string()),
                    o.as_ref().map(okey).map_err(|e| e.to_string()),
                    "step {step}.{k}: batch malloc({size}, {stream:?})"
                );
                if let (Ok(n), Ok(o)) = (n, o) {
                    self.live.push((n, o));
                }
            } else if self.live.is_empty() {
                continue;
            } else if r < 80 {
                let (n, o) = self.live.swap_remove(rng.below(self.live.len()));
                let (rn, ro) = (g.free(n), self.old.free(o));
                assert_eq!(outcome(&rn), outcome(&ro), "step {step}.{k}: batch free");
            } else if r < 95 {
                let (n, o) = &self.live[rng.below(self.live.len())];
                let (rn, ro) = (g.adjacent_free_size(n), self.old.adjacent_free_size(o));
                assert_eq!(
                    outcome(&rn),
                    outcome(&ro),
                    "step {step}.{k}: batch adjacent"
                );
            } else {
                let (n, o) = &self.live[rng.below(self.live.len())];
                let s = stream(rng);
                let (rn, ro) = (g.record_stream(n, s), self.old.record_stream(o, s));
                assert_eq!(
                    outcome(&rn),
                    outcome(&ro),
                    "step {step}.{k}: batch record_stream"
                );
            }
            assert_eq!(
                g.view().stats(),
                &self.old.stats(),
                "step {step}.{k}: batch stats differ"
            );
        }
    }
}

/// Frees one donated allocation through `alloc` (if it is still alive).
fn free_donated<A, X>(
    alloc: &Weak<A>,
    donated: &Mutex<Vec<X>>,
    free: impl Fn(&A, X) -> bool,
) -> bool {
    let Some(a) = alloc.upgrade() else {
        return false;
    };
    let x = donated.lock().unwrap().pop();
    x.is_some_and(|x| free(&a, x))
}

/// Runs `ops` generated operations from `seed` under `setup`, comparing after
/// each; full comparisons every `cadence` operations and after slow paths.
fn run(setup: &Setup, seed: u64, ops: usize, cadence: usize) {
    let mut rng = Rng(seed);
    let mut pair = Pair::new(setup);
    for step in 0..ops {
        let (what, slow) = pair.step(step, &mut rng);
        pair.compare(step, what, slow || step % cadence == 0);
    }
    // Drain: free everything, settle streams, release the cache.
    for (n, o) in std::mem::take(&mut pair.live) {
        assert_eq!(outcome(&pair.new.free(n)), outcome(&pair.old.free(o)));
    }
    pair.new.with_device(|d| d.complete_all());
    pair.old.with_device(|d| d.complete_all());
    assert_eq!(
        outcome(&pair.new.empty_cache()),
        outcome(&pair.old.empty_cache())
    );
    pair.compare(ops, "drain", true);
}

#[test]
fn differential_short() {
    for (i, setup) in SETUPS.iter().enumerate() {
        run(setup, 0x5eed_0000 + i as u64, 6_000, 50);
    }
}

#[test]
#[ignore = "long: ≥ 1 M operations per configuration; run in release (see the module doc)"]
fn differential_full() {
    for (i, setup) in SETUPS.iter().enumerate() {
        let started = std::time::Instant::now();
        run(setup, 0xf011_0000 + i as u64, 1_000_000, 64);
        println!(
            "differential_full: {:?}: 1000000 ops equal in {:.1?}",
            setup.settings,
            started.elapsed()
        );
    }
}
