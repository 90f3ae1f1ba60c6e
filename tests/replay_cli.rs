//! `remat replay` (and `remat plan --compact`) from the command line, on a small
//! trace written here: the `--json` object carries the fields the replayer
//! promises, `--oracle` and `--alloc-conf` take effect, and bad values are errors
//! that say what is allowed.

use std::path::PathBuf;
use std::process::{Command, Output};

use remat_trace::TraceBuilder;

/// A chain of 8 ops on 600 KiB tensors, each read by the next, then released,
/// written to a file.
fn write_trace() -> PathBuf {
    let mut t = forward_chain("chain", 8);
    for i in 0..7 {
        t = t.release(&format!("y{i}"));
    }
    write(&t.build().expect("the chain replays"), "chain")
}

/// Size of every tensor of the traces written here (600 KiB).
const KIB600: u64 = 600 << 10;

/// A trace named `name` whose input `x` feeds a chain of `n` ops `f`, each
/// making `y{i}` of [`KIB600`] from the one before in 1 µs.
fn forward_chain(name: &str, n: usize) -> TraceBuilder {
    let mut t = TraceBuilder::new(name).constant("x", KIB600);
    let mut prev = "x".to_string();
    for i in 0..n {
        let out = format!("y{i}");
        t = t.call("f", &[&prev], &out, KIB600, 1000);
        prev = out;
    }
    t
}

/// Write `trace` to a fresh file named after `stem` in this process's
/// directory.
fn write(trace: &remat_trace::Trace, stem: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remat-replay-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One file per call: the tests run in parallel threads of one process.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{stem}-{n}.log"));
    std::fs::write(&path, trace.to_jsonl()).unwrap();
    path
}

fn remat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_remat"))
        .args(args)
        .env_remove("REMAT_DTR_CONF")
        .env_remove("REMAT_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .output()
        .expect("remat runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// `remat replay <path> --ratio 0.5 --json <extra…>`, parsed.
fn replay_json(path: &str, extra: &[&str]) -> serde_json::Value {
    let args = [&["replay", path, "--ratio", "0.5", "--json"], extra].concat();
    json(&remat(&args))
}

#[test]
fn json_object_has_the_promised_fields_and_flags_take_effect() {
    let trace = write_trace();
    let path = trace.to_str().unwrap();
    let r = replay_json(path, &[]);
    for key in [
        "trace",
        "policy",
        "ratio",
        "budget_mode",
        "budget_bytes",
        "status",
        "overhead",
        "baseline_compute_ns",
        "total_compute_ns",
        "peak_live_bytes",
        "peak_reserved_bytes",
        "evictions",
        "rematerializations",
        "decision_ns_median",
        "segment_releases",
        "mean_free_at_eviction_by_pool",
        "allocator_conf",
        "defrag_bytes",
        "defrag_ns",
        "move_bandwidth_gbps",
    ] {
        assert!(r.get(key).is_some(), "missing {key}: {r}");
    }
    assert_eq!(r["move_bandwidth_gbps"], 1500.0, "moves charged by default");
    let free = replay_json(path, &["--move-bandwidth", "0"]);
    assert!(free["move_bandwidth_gbps"].is_null(), "{free}");
    assert_eq!(free["defrag_ns"], 0);
    let set = replay_json(path, &["--conf", "move_bandwidth:700"]);
    assert_eq!(set["move_bandwidth_gbps"], 700.0);
    assert_eq!(r["policy"], "remat");
    assert_eq!(r["budget_mode"], "physical");
    assert_eq!(r["status"], "ok");
    assert_eq!(r["allocator_conf"], "", "PyTorch's defaults print as empty");
    assert!(
        r["evictions"].as_u64().unwrap() > 0,
        "the budget must bind: {r}"
    );

    let r = replay_json(path, &["--oracle", "next-use"]);
    assert_eq!(r["policy"], "oracle:next-use");
    let r = replay_json(path, &["--alloc-conf", "max_split_size_mb:40"]);
    assert_eq!(r["allocator_conf"], "max_split_size_mb:40");
    let r = replay_json(path, &["--budget-mode", "logical"]);
    assert!(
        r["allocator_conf"].is_null(),
        "logical budgets have no allocator"
    );
}

#[test]
fn bad_values_are_errors_that_say_what_is_allowed() {
    let trace = write_trace();
    let path = trace.to_str().unwrap();
    for (args, says) in [
        (
            vec!["replay", path, "--oracle", "belady"],
            "expected next-use | dead | dead-after-backward",
        ),
        (
            vec!["replay", path, "--oracle", "next-use,dead"],
            "one oracle for a single run",
        ),
        (
            vec!["replay", path, "--alloc-conf", "max_split_size_mb:8"],
            "must be >= 20",
        ),
        (vec!["replay", path, "--policy", "fifo"], "remat | dtr"),
        (
            vec!["replay", path, "--swap-bandwidth=-3"],
            "a bandwidth in GB/s per direction",
        ),
        (
            vec!["replay", path, "--conf", "swap_bandwidth:0"],
            "a bandwidth in GB/s per direction",
        ),
        (
            vec!["replay", path, "--conf", "host_budget:lots"],
            "percentage of the device budget",
        ),
        (
            vec!["replay", path, "--move-bandwidth=-1"],
            "a device memory bandwidth in GB/s",
        ),
        (
            vec!["replay", path, "--conf", "move_bandwidth:0"],
            "a device memory bandwidth in GB/s",
        ),
    ] {
        let out = remat(&args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn swap_bandwidth_moves_bytes_to_the_host_tier_and_reports_them() {
    let trace = write_trace();
    let path = trace.to_str().unwrap();
    // The constant input is not recomputable: without swap it stays; with
    // swap it may leave, and every copy is reported.
    let run = |extra: &[&str]| json(&remat(&[&["replay", path, "--json"], extra].concat()));
    let off = run(&["--ratio", "0.3"]);
    let on = run(&[
        "--ratio",
        "0.3",
        "--swap-bandwidth",
        "24",
        "--iterations",
        "2",
    ]);
    assert_eq!(off["swap_bandwidth_gbps"], serde_json::Value::Null);
    assert_eq!(off["swapped_out_bytes"], 0);
    assert_eq!(on["swap_bandwidth_gbps"], 24.0);
    for key in [
        "stall_ns",
        "swapped_out_bytes",
        "swapped_in_bytes",
        "peak_host_bytes",
    ] {
        assert!(on.get(key).is_some(), "missing {key}: {on}");
        assert!(
            on["iterations"][0].get(key).is_some() || key == "peak_host_bytes",
            "{key}: {on}"
        );
    }
    assert_eq!(on["status"], "ok", "{on}");
    let out = on["swapped_out_bytes"].as_u64().unwrap();
    let back = on["swapped_in_bytes"].as_u64().unwrap();
    assert!(out > 0, "the constant leaves the device: {on}");
    // The host tier holds only what was copied out; a clean copy (trace
    // values change only by MUTATE) comes back again without a new copy out,
    // so more may come in than went out.
    assert!(back > 0, "{on}");
    assert!(on["peak_host_bytes"].as_u64().unwrap() <= out, "{on}");
    // Stalls count in the overhead: (compute + recompute + stalls) / compute.
    let total = on["total_compute_ns"].as_u64().unwrap() as f64;
    let base = on["baseline_compute_ns"].as_u64().unwrap() as f64;
    assert!(
        total >= base + on["stall_ns"].as_u64().unwrap() as f64 - 1.0,
        "{on}"
    );
    // Off by 0.
    let zero = replay_json(path, &["--swap-bandwidth", "0"]);
    assert_eq!(zero["swap_bandwidth_gbps"], serde_json::Value::Null);
}

#[test]
fn iterations_report_each_iteration_and_plan_the_repeats() {
    let trace = write_trace();
    let path = trace.to_str().unwrap();
    let one = replay_json(path, &["--budget-mode", "logical"]);
    let r = replay_json(path, &["--budget-mode", "logical", "--iterations", "3"]);
    let its = r["iterations"].as_array().expect("an iterations array");
    assert_eq!(its.len(), 3, "{r}");
    for (k, it) in its.iter().enumerate() {
        assert_eq!(it["index"], k as u64);
        assert_eq!(it["status"], "ok", "{r}");
        for key in [
            "overhead",
            "evictions",
            "rematerializations",
            "segment_releases",
            "planned",
            "divergences",
            "arena_bytes",
        ] {
            assert!(it.get(key).is_some(), "missing {key}: {it}");
        }
    }
    // The first iteration starts from nothing, the second from the constant:
    // the first plan is made at the second boundary.
    assert_eq!(its[0]["planned"], false);
    assert_eq!(its[2]["planned"], true, "{r}");
    assert_eq!(its[2]["divergences"], 0, "{r}");
    assert!(its[2]["arena_bytes"].as_u64().unwrap() <= r["budget_bytes"].as_u64().unwrap());
    assert_eq!(r["steady_overhead"], its[2]["overhead"]);
    assert_eq!(r["status"], "ok");
    // One iteration reports itself and no plan.
    assert_eq!(one["iterations"].as_array().map(Vec::len), Some(1));
    assert_eq!(one["iterations"][0]["planned"], false);
}

#[test]
fn sweeps_replay_each_cell_as_iterations() {
    let trace = write_trace();
    let path = trace.to_str().unwrap();
    let out = trace.with_extension("sweep");
    let sweep = |iterations: &str| {
        let run = remat(&[
            "replay",
            "--sweep",
            "--traces",
            path,
            "--ratios",
            "0.5,0.4",
            "--policies",
            "remat",
            "--modes",
            "logical",
            "--iterations",
            iterations,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("sweep.jsonl"))
            .expect("sweep.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert!(out.join("sweep.md").is_file());
        rows
    };
    let rows = sweep("3");
    assert_eq!(rows.len(), 2, "one row per ratio");
    for r in &rows {
        let its = r["iterations"].as_array().expect("an iterations array");
        assert_eq!(its.len(), 3, "{r}");
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(its[2]["planned"], true, "{r}");
        assert_eq!(its[2]["divergences"], 0, "{r}");
        assert_eq!(r["steady_overhead"], its[2]["overhead"], "{r}");
    }
    // The same cells as one iteration each: one row per cell, no plan.
    let rows = sweep("1");
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r["iterations"].as_array().map(Vec::len), Some(1), "{r}");
        assert_eq!(r["iterations"][0]["planned"], false, "{r}");
    }
    // The charts: well-formed SVG documents that draw the policy and the run.
    let chart = std::fs::read_to_string(out.join("chain-logical.svg")).expect("chart");
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    for text in ["overhead vs budget", "budget / unbounded peak", "remat"] {
        assert!(chart.contains(text), "the chart says {text:?}");
    }
    assert!(chart.contains("<circle"), "the finished cells are drawn");
    let timeline = std::fs::read_to_string(out.join("timeline.svg")).expect("timeline");
    assert!(timeline.starts_with("<svg") && timeline.trim_end().ends_with("</svg>"));
    for text in ["memory over compute time", "live", "reserved", "budget"] {
        assert!(timeline.contains(text), "the timeline says {text:?}");
    }
    assert!(
        timeline.contains("<polyline"),
        "the timeline draws its series"
    );
}

/// A forward chain of 12 ops on 600 KiB tensors, then a backward reading
/// them in reverse, written to a file: under a small budget each backward
/// read regenerates a chain.
fn write_forward_backward() -> PathBuf {
    let mut t = forward_chain("fwd-bwd", 12);
    for i in (0..12).rev() {
        let (y, g) = (format!("y{i}"), format!("g{i}"));
        t = t.call("b", &[&y], &g, KIB600, 1000).release(&y).release(&g);
    }
    write(&t.build().expect("the step replays"), "fwd-bwd")
}

/// `--thrash-limit` moves the replayer's stop: a run stopped as thrash at
/// the default 2× finishes under a larger limit, past 2×; bad limits and a
/// limit on a sweep are errors.
#[test]
fn the_thrash_limit_moves_the_replayers_stop() {
    let trace = write_forward_backward();
    let path = trace.to_str().unwrap();
    let args = ["--ratio", "0.25", "--conf", "thrash_rescue:off"];
    let stopped = json(&remat(&[&["replay", path, "--json"], &args[..]].concat()));
    assert_eq!(stopped["status"], "thrash", "{stopped}");
    let run = json(&remat(
        &[
            &["replay", path, "--json", "--thrash-limit", "1000"],
            &args[..],
        ]
        .concat(),
    ));
    assert_eq!(run["status"], "ok", "{run}");
    assert!(run["overhead"].as_f64().unwrap() > 2.0, "{run}");
    for (flag, says) in [
        ("--thrash-limit=0.5", "at least 1"),
        ("--thrash-limit=NaN", "at least 1"),
        ("--thrash-limit=inf", "at least 1"),
    ] {
        let out = remat(&["replay", path, flag]);
        assert!(!out.status.success(), "{flag} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{flag}: {err}");
    }
    let out = remat(&["replay", "--sweep", "--thrash-limit", "3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("single run"), "{err}");
}

#[test]
fn iteration_options_that_do_not_go_together_are_errors() {
    let trace = write_trace();
    let path = trace.to_str().unwrap();
    let out = remat(&["replay", path, "--iterations", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("iterations"));
    let out = remat(&["replay", path, "--oracle", "next-use", "--iterations", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--oracle") && err.contains("one iteration"),
        "{err}"
    );
}

#[test]
fn plan_compact_adds_a_verified_row_per_algorithm_never_larger() {
    let path = write_trace();
    let out = remat(&[
        "plan",
        path.to_str().unwrap(),
        "--no-caching",
        "--compact",
        "--json",
    ]);
    let rows = json(&out);
    let rows = rows.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 6, "three algorithms, each plain and compacted");
    for pair in rows.chunks(2) {
        let (plain, compacted) = (&pair[0], &pair[1]);
        let name = plain["algo"].as_str().unwrap();
        assert_eq!(compacted["algo"], format!("{name}+compact"));
        assert_eq!(compacted["verified"], true);
        assert!(compacted["arena_bytes"].as_u64() <= plain["arena_bytes"].as_u64());
        assert!(compacted["arena_bytes"].as_u64() >= compacted["max_live_bytes"].as_u64());
    }
}
