//! The DTR-paper traces' storage lifetimes replayed through remat-alloc on the
//! real driver (`CudaDevice`) and on `SimulatedDevice`, for the GPU check kit
//! (`scripts/gpu-check`, issue 35). Feature `cuda`.
//!
//! ```text
//! cargo run --release -p remat-alloc --features cuda --example cuda_replay -- probe
//! cargo run --release -p remat-alloc --features cuda --example cuda_replay -- \
//!     [--json FILE] TRACE...
//! ```
//!
//! - `self-check TRACE...`: the comparison below without a GPU: a simulated
//!   device with descending addresses stands in for the driver.
//! - `probe`: opens GPU 0 the way every CUDA test does (`CudaDevice::new(0)`);
//!   prints `device: …` and exits 0, or `no CUDA device: <why>` and exits 2.
//! - `TRACE...`: each trace's storage lifetimes (default caching allocator
//!   config, one stream) are replayed on the real driver, then on a simulated
//!   device that hands out **the addresses the driver handed out**, in the
//!   same order (`Scripted`). Best fit breaks ties between equal-sized free
//!   blocks by address, as PyTorch's does, so the allocator's decisions are a
//!   function of the addresses it is given: with the same addresses they must
//!   be the same, exactly: the sequence of device calls (segment sizes
//!   allocated and freed), each allocation's block size and address, and the
//!   reserved bytes after every event. The replay on `SimulatedDevice`'s own
//!   ascending addresses is reported beside it, not asserted: there the
//!   ties break otherwise and the decisions may part (the first kit run, on
//!   an H200, saw lstm's block sizes and transformer's segment calls part
//!   that way; see docs/gpu.md). It reports the time of a malloc that took a `cuMemAlloc` against one
//!   served from the cache. Traces whose simulated peak does not fit in 90 %
//!   of the GPU's free memory are skipped (said so). Exit code 1 when the
//!   decisions differ, 0 otherwise; without a device it prints
//!   `no CUDA device: skipped (<why>)` and exits 0.

use remat_alloc::{
    AllocatorConfig, CachingAllocator, CudaDevice, Device, DeviceError, DevicePtr, EventId,
    MemInfo, SimulatedDevice, StreamId,
};
use remat_trace::{storage_events, StorageEvent, Trace};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const S: StreamId = StreamId::DEFAULT;

/// One call the allocator made to its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Allocate(usize),
    Free(usize),
}

/// A device that forwards to `inner` and logs the segment calls, with the
/// pointers (which differ between devices and are kept apart).
struct Recorder<D> {
    inner: D,
    log: Arc<Mutex<Log>>,
}

#[derive(Default)]
struct Log {
    calls: Vec<Call>,
    /// Each segment allocated, in order: (bytes, address).
    addresses: Vec<(usize, DevicePtr)>,
    /// Live segments: base -> (ordinal of creation, bytes).
    segments: BTreeMap<DevicePtr, (usize, usize)>,
    created: usize,
}

impl Log {
    /// `ptr` as (segment ordinal, offset).
    fn locate(&self, ptr: DevicePtr) -> Option<(usize, u64)> {
        let (&base, &(ordinal, bytes)) = self.segments.range(..=ptr).next_back()?;
        (ptr < base + bytes as u64).then_some((ordinal, ptr - base))
    }
}

impl<D: Device> Device for Recorder<D> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        let ptr = self.inner.allocate(bytes)?;
        let mut log = self.log.lock().unwrap();
        log.calls.push(Call::Allocate(bytes));
        log.addresses.push((bytes, ptr));
        let ordinal = log.created;
        log.created += 1;
        log.segments.insert(ptr, (ordinal, bytes));
        Ok(ptr)
    }
    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        self.inner.free(ptr, bytes)?;
        let mut log = self.log.lock().unwrap();
        log.calls.push(Call::Free(bytes));
        log.segments.remove(&ptr);
        Ok(())
    }
    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        self.inner.mem_info()
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.inner.record_event(stream)
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }
    fn destroy_event(&mut self, event: EventId) {
        self.inner.destroy_event(event)
    }
}

/// A simulated device that hands out a recorded sequence of segment
/// addresses (the real driver's), one per allocation, and fails an
/// allocation whose size is not the recorded one (the decisions parted).
/// Events come from a `SimulatedDevice`.
struct Scripted {
    script: std::collections::VecDeque<(usize, DevicePtr)>,
    live: BTreeMap<DevicePtr, usize>,
    used: usize,
    events: SimulatedDevice,
}

impl Scripted {
    fn new(script: &[(usize, DevicePtr)]) -> Self {
        Self {
            script: script.iter().copied().collect(),
            live: BTreeMap::new(),
            used: 0,
            events: SimulatedDevice::new(1 << 50),
        }
    }
}

impl Device for Scripted {
    fn kind(&self) -> &'static str {
        "scripted"
    }
    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        match self.script.pop_front() {
            Some((b, ptr)) if b == bytes => {
                self.live.insert(ptr, bytes);
                self.used += bytes;
                Ok(ptr)
            }
            other => Err(DeviceError::Other(format!(
                "decisions parted: a segment of {bytes} B asked for where the driver was asked \
                 for {other:?}"
            ))),
        }
    }
    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        match self.live.remove(&ptr) {
            Some(b) if b == bytes => {
                self.used -= bytes;
                Ok(())
            }
            _ => Err(DeviceError::InvalidPointer { ptr }),
        }
    }
    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        Ok(MemInfo {
            free: (1usize << 50) - self.used,
            total: 1 << 50,
        })
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.events.record_event(stream)
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.events.query_event(event)
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.events.synchronize_event(event)
    }
    fn destroy_event(&mut self, event: EventId) {
        self.events.destroy_event(event)
    }
}

/// Where a block sits: (segment in order of creation, offset in it).
type Place = Option<(usize, u64)>;

/// What one replay decided, and how long its mallocs took.
#[derive(Default)]
struct Outcome {
    calls: Vec<Call>,
    /// The segments' addresses in order of allocation, with their sizes.
    addresses: Vec<(usize, DevicePtr)>,
    /// Per malloc: block size, (segment ordinal, offset), address.
    blocks: Vec<(usize, Place, DevicePtr)>,
    /// Reserved bytes after every event.
    reserved: Vec<i64>,
    peak_reserved: i64,
    /// Nanoseconds of the mallocs that allocated a segment / hit the cache.
    segment_ns: Vec<u64>,
    cached_ns: Vec<u64>,
    total_s: f64,
}

fn replay<D: Device>(
    device: D,
    events: &[StorageEvent],
    storages: usize,
) -> Result<Outcome, String> {
    let log = Arc::new(Mutex::new(Log::default()));
    let dev = Recorder {
        inner: device,
        log: Arc::clone(&log),
    };
    let err = |e: remat_alloc::Error| e.to_string();
    let a = CachingAllocator::new(dev, AllocatorConfig::default()).map_err(err)?;
    let mut live = vec![None; storages];
    let mut out = Outcome::default();
    let start = Instant::now();
    for e in events {
        match *e {
            StorageEvent::Alloc { storage, bytes, .. } if bytes > 0 => {
                let before = log.lock().unwrap().calls.len();
                let t = Instant::now();
                let x = a.malloc(bytes as usize, S).map_err(err)?;
                let ns = t.elapsed().as_nanos() as u64;
                let log = log.lock().unwrap();
                if log.calls.len() > before {
                    out.segment_ns.push(ns);
                } else {
                    out.cached_ns.push(ns);
                }
                out.blocks.push((x.size(), log.locate(x.ptr()), x.ptr()));
                live[storage] = Some(x);
            }
            StorageEvent::Free { storage, .. } => {
                if let Some(x) = live[storage].take() {
                    a.free(x).map_err(err)?;
                }
            }
            _ => continue,
        }
        out.reserved.push(a.stats().reserved_bytes.all.current);
    }
    for x in live.into_iter().flatten() {
        a.free(x).map_err(err)?;
    }
    a.empty_cache().map_err(err)?;
    out.total_s = start.elapsed().as_secs_f64();
    out.peak_reserved = a.stats().reserved_bytes.all.peak;
    let reserved_after = a.stats().reserved_bytes.all.current;
    if reserved_after != 0 {
        return Err(format!(
            "{reserved_after} B still reserved after empty_cache"
        ));
    }
    let mut log = log.lock().unwrap();
    out.calls = std::mem::take(&mut log.calls);
    out.addresses = std::mem::take(&mut log.addresses);
    Ok(out)
}

/// Replays `events` on a [`Scripted`] device handing out `real`'s segment
/// addresses: whether every decision is `real`'s, and the first malloc that
/// parted.
fn same_given_addresses(
    real: &Outcome,
    events: &[StorageEvent],
    storages: usize,
) -> Result<(bool, Option<usize>), String> {
    let scripted = replay(Scripted::new(&real.addresses), events, storages)
        .map_err(|e| format!("on the driver's addresses: {e}"))?;
    let exact = scripted.calls == real.calls
        && scripted.reserved == real.reserved
        && scripted.blocks.len() == real.blocks.len()
        && scripted
            .blocks
            .iter()
            .zip(&real.blocks)
            .all(|(s, r)| s.0 == r.0 && s.2 == r.2);
    let first_parting = scripted
        .blocks
        .iter()
        .zip(&real.blocks)
        .position(|(s, r)| s.0 != r.0 || s.2 != r.2);
    Ok((exact, first_parting))
}

/// A `SimulatedDevice` whose addresses descend (mirrored): a stand-in for a
/// driver whose addresses do not ascend, for `self-check` on a machine
/// without a GPU.
struct Mirrored(SimulatedDevice);

const MIRROR: u64 = 1 << 52;

impl Device for Mirrored {
    fn kind(&self) -> &'static str {
        "mirrored"
    }
    fn allocate(&mut self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        Ok(MIRROR - self.0.allocate(bytes)? - bytes as u64)
    }
    fn free(&mut self, ptr: DevicePtr, bytes: usize) -> Result<(), DeviceError> {
        self.0.free(MIRROR - ptr - bytes as u64, bytes)
    }
    fn mem_info(&mut self) -> Result<MemInfo, DeviceError> {
        self.0.mem_info()
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.0.record_event(stream)
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.0.query_event(event)
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.0.synchronize_event(event)
    }
    fn destroy_event(&mut self, event: EventId) {
        self.0.destroy_event(event)
    }
}

/// `self-check TRACE...`: the comparison without a GPU. Each trace is
/// replayed on mirrored (descending) simulated addresses, then on a
/// `Scripted` device given those addresses: the decisions must be the same.
/// The ascending replay is compared too, to show that the addresses matter.
fn self_check(paths: &[String]) -> ExitCode {
    let mut failed = false;
    for path in paths {
        let result = (|| -> Result<String, String> {
            let trace = Trace::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
            let events = storage_events(&trace).map_err(|e| e.to_string())?;
            let storages = events
                .iter()
                .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
                .count();
            let mirrored = replay(Mirrored(SimulatedDevice::new(1 << 50)), &events, storages)?;
            let ascending = replay(SimulatedDevice::new(1 << 50), &events, storages)?;
            let (exact, parting) = same_given_addresses(&mirrored, &events, storages)?;
            failed |= !exact;
            let sizes_differ = (ascending.blocks.iter().zip(&mirrored.blocks))
                .filter(|(a, m)| a.0 != m.0)
                .count();
            Ok(format!(
                "same decisions given the addresses: {exact} (first parting {parting:?}); \
                 ascending against descending addresses: {sizes_differ} block sizes differ"
            ))
        })();
        match result {
            Ok(line) => println!("{path}: {line}"),
            Err(e) => {
                failed = true;
                println!("{path}: error: {e}");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// (median, mean) in microseconds.
fn summary(ns: &[u64]) -> (f64, f64) {
    if ns.is_empty() {
        return (0.0, 0.0);
    }
    let mut v = ns.to_vec();
    v.sort_unstable();
    let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
    (v[v.len() / 2] as f64 / 1e3, mean / 1e3)
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Replays one trace on both devices; a JSON object for the report.
fn check(path: &str, failed: &mut bool) -> Result<String, String> {
    let name = std::path::Path::new(path)
        .file_name()
        .map_or(path.into(), |n| n.to_string_lossy().into_owned());
    let trace = Trace::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let events = storage_events(&trace).map_err(|e| e.to_string())?;
    let storages = events
        .iter()
        .filter(|e| matches!(e, StorageEvent::Alloc { .. }))
        .count();
    let sim = replay(SimulatedDevice::new(1 << 50), &events, storages)?;

    let mut probe = CudaDevice::new(0).map_err(|e| e.to_string())?;
    let free = probe.mem_info().map_err(|e| e.to_string())?.free;
    drop(probe);
    if sim.peak_reserved as f64 > 0.9 * free as f64 {
        println!(
            "{name}: skipped, simulated peak {} MiB > 90 % of the GPU's {} MiB free",
            sim.peak_reserved >> 20,
            free >> 20
        );
        return Ok(format!(
            "{{\"trace\":{},\"skipped\":\"simulated peak {} B over 90 % of {} B free\"}}",
            json_str(&name),
            sim.peak_reserved,
            free
        ));
    }
    let dev = CudaDevice::new(0).map_err(|e| e.to_string())?;
    let real = replay(dev, &events, storages)?;
    // The same allocator on the driver's own addresses: every decision the same.
    let (exact, first_parting) = same_given_addresses(&real, &events, storages)?;

    // On the simulator's ascending addresses: reported, not asserted.
    let same_calls = sim.calls == real.calls;
    let same_sizes = sim.blocks.len() == real.blocks.len()
        && sim.blocks.iter().zip(&real.blocks).all(|(s, r)| s.0 == r.0);
    let same_reserved = sim.reserved == real.reserved;
    let placement_diffs = sim
        .blocks
        .iter()
        .zip(&real.blocks)
        .filter(|(s, r)| s.1 != r.1)
        .count();
    let same = exact;
    *failed |= !same;
    let (seg_med, seg_mean) = summary(&real.segment_ns);
    let (hit_med, hit_mean) = summary(&real.cached_ns);
    let (sim_hit_med, _) = summary(&sim.cached_ns);
    println!(
        "{name}: on the driver's addresses, the same decisions: {exact} (first parting: \
         {first_parting:?})"
    );
    println!(
        "{name}: {} mallocs, {} segments, peak reserved {} MiB; on the simulator's own addresses \
         (not asserted): same device calls: {same_calls}, same block sizes: {same_sizes}, same \
         reserved bytes: {same_reserved}, placements that differ: {placement_diffs}",
        real.blocks.len(),
        real.segment_ns.len(),
        real.peak_reserved >> 20,
    );
    println!(
        "{name}: malloc with cuMemAlloc median {seg_med:.1} us (mean {seg_mean:.1}), cached hit \
         median {hit_med:.2} us (mean {hit_mean:.2}; simulated {sim_hit_med:.2}); replay {:.3} s \
         real, {:.3} s simulated",
        real.total_s, sim.total_s
    );
    if !same_calls {
        let first = sim.calls.iter().zip(&real.calls).position(|(s, r)| s != r);
        println!(
            "{name}: device calls differ (simulated {}, real {}), first at {first:?}",
            sim.calls.len(),
            real.calls.len()
        );
    }
    Ok(format!(
        "{{\"trace\":{},\"same\":{same},\"same_on_driver_addresses\":{exact},\"same_device_calls\":{same_calls},\
         \"same_block_sizes\":{same_sizes},\"same_reserved\":{same_reserved},\
         \"placement_diffs\":{placement_diffs},\"mallocs\":{},\"segment_mallocs\":{},\
         \"peak_reserved\":{},\"segment_malloc_us_median\":{seg_med:.3},\
         \"segment_malloc_us_mean\":{seg_mean:.3},\"cached_malloc_us_median\":{hit_med:.3},\
         \"cached_malloc_us_mean\":{hit_mean:.3},\"simulated_cached_malloc_us_median\":{sim_hit_med:.3},\
         \"replay_s\":{:.4},\"simulated_replay_s\":{:.4}}}",
        json_str(&name),
        real.blocks.len(),
        real.segment_ns.len(),
        real.peak_reserved,
        real.total_s,
        sim.total_s
    ))
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("probe") {
        return match CudaDevice::new(0) {
            Ok(mut dev) => {
                let info = dev.mem_info().unwrap_or_default();
                println!(
                    "device: CUDA 0, {} MiB free of {} MiB, VMM granularity {:?}",
                    info.free >> 20,
                    info.total >> 20,
                    dev.vmm_granularity()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("no CUDA device: {e}");
                ExitCode::from(2)
            }
        };
    }
    if args.first().map(String::as_str) == Some("self-check") {
        return self_check(&args[1..]);
    }
    let mut json_path = None;
    if let Some(i) = args.iter().position(|a| a == "--json") {
        if i + 1 >= args.len() {
            eprintln!("--json needs a file");
            return ExitCode::FAILURE;
        }
        json_path = Some(args.remove(i + 1));
        args.remove(i);
    }
    if args.is_empty() {
        eprintln!(
            "usage: cuda_replay probe | cuda_replay [--json FILE] TRACE... | cuda_replay \
             self-check TRACE..."
        );
        return ExitCode::FAILURE;
    }
    if let Err(e) = CudaDevice::new(0) {
        println!("no CUDA device: skipped ({e})");
        return ExitCode::SUCCESS;
    }
    let mut failed = false;
    let mut results = Vec::new();
    for path in &args {
        match check(path, &mut failed) {
            Ok(j) => results.push(j),
            Err(e) => {
                println!("{path}: error: {e}");
                failed = true;
                results.push(format!(
                    "{{\"trace\":{},\"error\":{}}}",
                    json_str(path),
                    json_str(&e)
                ));
            }
        }
    }
    if let Some(p) = json_path {
        let body = format!("[{}]\n", results.join(",\n"));
        if let Err(e) = std::fs::write(&p, body) {
            eprintln!("{p}: {e}");
            failed = true;
        }
    }
    if failed {
        println!("decisions differ on the driver's addresses (or a replay failed)");
        ExitCode::FAILURE
    } else {
        println!("same decisions on the real device and on the simulator given its addresses");
        ExitCode::SUCCESS
    }
}
