//! `remat demo`: replays a small training-like allocation pattern through the
//! caching allocator on a simulated device and prints what it did.

use clap::Args;
use remat_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Simulated device capacity in MiB.
    #[arg(long, default_value_t = 2048)]
    capacity_mb: usize,
    /// Number of training-like iterations to replay.
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// Also record the alloc/free history and write a snapshot here: a pickle
    /// (open it on PyTorch's memory_viz page), or JSON if the name ends in `.json`.
    #[arg(long)]
    snapshot: Option<std::path::PathBuf>,
}

pub fn run(args: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = AllocatorConfig::from_env()?;
    let alloc = CachingAllocator::new(SimulatedDevice::new(args.capacity_mb << 20), config)?;
    let s = StreamId::DEFAULT;
    if args.snapshot.is_some() {
        alloc.record_history(Some(remat_alloc::snapshot::HistoryConfig::default()))?;
    }
    // Parameters: kept for the whole run.
    let params: Vec<_> = [4usize << 20, 4 << 20, 1 << 20, 16 << 10]
        .iter()
        .map(|&n| alloc.malloc(n, s))
        .collect::<Result<_, _>>()?;
    for it in 0..args.iterations {
        // Forward: activations grow with depth (batch varies slightly per step).
        let batch = 30 + it;
        let mut acts = Vec::new();
        for layer in 0..8 {
            acts.push(alloc.malloc((batch * (layer + 1) * 96) << 10, s)?);
            let tmp = alloc.malloc(300 << 10, s)?; // a small scratch buffer
            alloc.free(tmp)?;
        }
        // Backward: gradients, freeing activations in reverse.
        while let Some(a) = acts.pop() {
            let g = alloc.malloc(a.requested(), s)?;
            alloc.free(a)?;
            alloc.free(g)?;
        }
    }
    let stats = alloc.stats();
    println!(
        "replayed {} iterations: peak allocated {:.1} MiB, peak reserved {:.1} MiB, {} device allocations, {} cache hits",
        args.iterations,
        stats.allocated_bytes.all.peak as f64 / (1 << 20) as f64,
        stats.reserved_bytes.all.peak as f64 / (1 << 20) as f64,
        stats.num_device_alloc,
        stats.allocation.all.allocated - stats.num_device_alloc,
    );
    println!("{}", alloc.memory_summary());
    if let Some(path) = &args.snapshot {
        let snap = alloc.snapshot();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::write(path, snap.to_json())?;
        } else {
            std::fs::write(path, snap.to_pickle()?)?;
        }
        println!(
            "snapshot ({} segments, {} trace entries) written to {}",
            snap.segments.len(),
            snap.device_traces.len(),
            path.display()
        );
    }
    for p in params {
        alloc.free(p)?;
    }
    Ok(())
}
