//! `remat advise` from the command line, on a small trace written here: the
//! `--json` object has the promised shape (rows from the peak down to the
//! floor), `--svg` writes a chart, the table prints, and bad values are
//! errors that say what is allowed.

use std::path::PathBuf;
use std::process::{Command, Output};

use remat_trace::TraceBuilder;

/// A chain of 8 ops on 600 KiB tensors, each read by the next and all held
/// to the end (so a budget below the peak replays some), written to a file.
fn write_trace(tag: &str) -> PathBuf {
    let kib = 600 << 10;
    let mut t = TraceBuilder::new("chain").constant("x", kib);
    let mut prev = "x".to_string();
    for i in 0..8 {
        let out = format!("y{i}");
        t = t.call("f", &[&prev], &out, kib, 1000 + i);
        prev = out;
    }
    for i in 0..7 {
        t = t.release(&format!("y{i}"));
    }
    let trace = t.build().expect("the chain replays");
    let dir = std::env::temp_dir().join(format!("remat-advise-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("chain-{tag}.log"));
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

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn json_rows_run_from_the_peak_down_to_the_floor() {
    for mode in ["physical", "logical"] {
        let path = write_trace(mode);
        let svg = path.with_extension("svg");
        let out = remat(&[
            "advise",
            path.to_str().unwrap(),
            "--points",
            "5",
            "--budget-mode",
            mode,
            "--threads",
            "2",
            "--json",
            "--svg",
            svg.to_str().unwrap(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&ok(&out)).expect("one JSON object");
        let floor = v["floor_bytes"].as_u64().expect("a floor");
        let peak = v["peak_bytes"].as_u64().unwrap();
        assert_eq!(peak, 9 * (600 << 10));
        assert_eq!(v["budget_mode"], mode);
        let rows = v["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 5, "{mode}: {rows:?}");
        for r in rows {
            for key in [
                "ratio",
                "budget_bytes",
                "first_overhead",
                "steady_overhead",
                "status",
            ] {
                assert!(r.get(key).is_some(), "{mode}: row without {key}: {r}");
            }
            let b = r["budget_bytes"].as_u64().unwrap();
            let ratio = r["ratio"].as_f64().unwrap();
            assert!((ratio - b as f64 / peak as f64).abs() < 1e-12);
            assert!(b >= floor && b <= peak);
            assert!(["ok", "oom", "thrash"].contains(&r["status"].as_str().unwrap()));
        }
        // The peak first, the floor last, budgets falling.
        assert_eq!(rows[0]["budget_bytes"].as_u64(), Some(peak));
        assert_eq!(rows[0]["ratio"].as_f64(), Some(1.0));
        assert_eq!(rows[4]["budget_bytes"].as_u64(), Some(floor));
        assert!(rows
            .windows(2)
            .all(|w| w[0]["budget_bytes"].as_u64() > w[1]["budget_bytes"].as_u64()));
        // At the floor the step trains within 2x; below the peak it replays.
        let last = &rows[4];
        assert_eq!(last["status"], "ok", "{mode}: {last}");
        assert!(last["steady_overhead"].as_f64().unwrap() <= 2.0);
        assert!(floor < peak, "{mode}: the chain fits below its peak");
        assert!(last["evictions"].as_u64().unwrap() > 0, "{mode}: {last}");
        let chart = std::fs::read_to_string(&svg).expect("the chart");
        assert!(chart.starts_with("<svg") && chart.contains("steady step"));
    }
}

#[test]
fn the_table_prints_and_bad_values_say_what_is_allowed() {
    let path = write_trace("table");
    let p = path.to_str().unwrap();
    let text = ok(&remat(&["advise", p, "--points", "3"]));
    assert!(text.contains("| budget | bytes | of peak | first step | steady | status |"));
    assert!(text.contains("floor"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.ends_with("| ok |")).count(),
        3,
        "{text}"
    );
    for (args, says) in [
        (&["--points", "1"][..], "--points"),
        (&["--iterations", "1"][..], "--iterations"),
        (&["--max-overhead", "0.5"][..], "finite number ≥ 1.0"),
        (&["--budget-mode", "both"][..], "both"),
        (&["--policy", "random"][..], "random"),
        (&["--swap-bandwidth=-1"][..], "GB/s per direction"),
    ] {
        let out = remat(&[&["advise", p], args].concat());
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = remat(&["advise", "/no/such/trace.log"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

#[test]
fn swap_adds_the_stalls_and_the_bytes_copied_and_lowers_the_floor() {
    let path = write_trace("swap");
    let p = path.to_str().unwrap();
    let json = |extra: &[&str]| -> serde_json::Value {
        let out = remat(&[&["advise", p, "--points", "3", "--json"], extra].concat());
        serde_json::from_str(&ok(&out)).expect("one JSON object")
    };
    let off = json(&[]);
    let on = json(&["--swap-bandwidth", "24"]);
    for r in off["rows"].as_array().unwrap() {
        assert!(r["steady_stall"].is_null(), "swap off: {r}");
    }
    let rows = on["rows"].as_array().unwrap();
    for r in rows.iter().filter(|r| r["status"] == "ok") {
        assert!(r["steady_stall"].as_f64().is_some(), "{r}");
        assert!(r["steady_swapped_out_bytes"].as_u64().is_some(), "{r}");
    }
    // The constant can leave the device: the floor is no higher with swap.
    assert!(
        on["floor_bytes"].as_u64() <= off["floor_bytes"].as_u64(),
        "{on} / {off}"
    );
    let text = ok(&remat(&[
        "advise",
        p,
        "--points",
        "3",
        "--swap-bandwidth",
        "24",
    ]));
    assert!(text.contains("| of it, stalls | swapped out |"), "{text}");
}
