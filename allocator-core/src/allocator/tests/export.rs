//! The snapshot pickle at GPU sizes, checked opcode by opcode: by the in-repo
//! walker, by serde-pickle, and by CPython's `pickle`/`pickletools` when
//! `python3` is installed (required under `CI=true`).

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{sim, GB};
use crate::pickle::walker::{untuple, walk};
use crate::StreamId;

const S0: StreamId = StreamId::DEFAULT;

/// Run by `python3 - <pickle> <json>`: every integer opcode must be the bytes
/// CPython writes for that integer; `pickletools.dis` must accept the stream;
/// `pickle.loads` must give the JSON export's structure, with tuples for
/// `segment_pool_id`; and CPython's own protocol-4 pickle of the loaded object
/// (memo off, as remat writes none) must be the same bytes.
const CPYTHON_CHECK: &str = r#"
import io, json, pickle, pickletools, sys

data = open(sys.argv[1], "rb").read()
with open(sys.argv[2]) as f:
    exported = json.load(f)

ints = longs = 0
for op, arg, pos in pickletools.genops(data):
    if op.name in ("BININT1", "BININT2", "BININT", "LONG1", "LONG4"):
        cpython = pickle.dumps(arg, 2)[2:-1]
        mine = data[pos:pos + len(cpython)]
        assert mine == cpython, f"{arg} at {pos}: {mine.hex()}, CPython writes {cpython.hex()}"
        ints += 1
    if op.name == "LONG1":
        assert data[pos + 1] <= 8, f"LONG1 of {data[pos + 1]} bytes at {pos}"
        longs += 1
pickletools.dis(data, out=io.StringIO())

obj = pickle.loads(data)
for seg in obj["segments"]:
    assert type(seg["segment_pool_id"]) is tuple, seg["segment_pool_id"]

def plain(x):
    if isinstance(x, (list, tuple)):
        return [plain(i) for i in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x

assert json.dumps(plain(obj), sort_keys=True) == json.dumps(exported, sort_keys=True)

out = io.BytesIO()
pickler = pickle.Pickler(out, 4)
pickler.fast = True
pickler.dump(obj)
assert out.getvalue() == data, "CPython pickles the loaded object differently"
print(f"python3: {ints} integers ({longs} LONG1) as CPython writes them, same structure as the JSON")
"#;

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Every integer the walker saw, by opcode.
fn ints_with(ops: &[crate::pickle::walker::Op], code: u8) -> Vec<i128> {
    ops.iter()
        .filter(|o| o.code == code)
        .filter_map(|o| o.int)
        .collect()
}

#[test]
fn snapshot_pickle_at_gpu_sizes() {
    let before = unix_us();
    let a = sim(64 * GB, "");
    a.record_history(Some(Default::default())).unwrap();
    let three = a.malloc(3 * GB, S0).unwrap();
    let five = a.malloc(5 * GB, S0).unwrap();
    let small = a.malloc(4096, S0).unwrap();
    let freed = a.malloc(6 * GB, S0).unwrap();
    a.free(freed).unwrap(); // an inactive 6 GiB segment stays cached
    let oom = a.malloc(200 * GB, S0).unwrap_err();
    assert!(oom.is_out_of_memory());
    let snap = a.snapshot();
    let after = unix_us();

    // time_us: Unix-epoch microseconds, in order.
    let times: Vec<u64> = snap.device_traces.iter().map(|t| t.time_us).collect();
    assert!(!times.is_empty());
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(
        times.iter().all(|t| (before..=after).contains(t)),
        "{times:?} not within [{before}, {after}]"
    );

    let pickle = snap.to_pickle().unwrap();
    let json = snap.to_value();

    // The in-repo walker: shortest integers, well-formed frames, same structure.
    let w = walk(&pickle).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.protocol, 4);
    assert_eq!(untuple(&w.value), json);
    let segments = w.value["segments"].as_array().expect("segments");
    assert!(!segments.is_empty());
    for seg in segments {
        assert_eq!(
            seg["segment_pool_id"],
            serde_json::json!({ "__tuple__": [0, 0] })
        );
    }
    // The sizes above 4 GiB, the addresses and the OOM's free bytes are LONG1s
    // of at most 8 bytes: numbers, not BigInts, on the memory_viz page.
    let longs = ints_with(&w.ops, 0x8a);
    for size in [3 * GB, 5 * GB, 6 * GB] {
        assert!(longs.contains(&(size as i128)), "{size} not in {longs:?}");
    }
    let device_free = json["device_traces"][0]
        .as_array()
        .and_then(|t| t.iter().find(|e| e["action"] == "oom"))
        .and_then(|e| e["device_free"].as_u64())
        .expect("an oom entry");
    assert!(device_free > 4 * GB as u64);
    assert!(longs.contains(&i128::from(device_free)));
    for o in w.ops.iter().filter(|o| o.code == 0x8a) {
        let len = pickle[o.pos + 1];
        assert!((5..=8).contains(&len), "LONG1 of {len} bytes at {}", o.pos);
    }
    assert!(ints_with(&w.ops, b'K').contains(&0));

    // serde-pickle, a reader written by others, sees the same structure.
    let back: Value = serde_pickle::from_slice(&pickle, Default::default()).unwrap();
    assert_eq!(back, json);

    match Command::new("python3").arg("--version").output() {
        Ok(_) => {
            let dir = std::env::temp_dir().join(format!(
                "remat-snapshot-pickle-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let (pkl, js) = (dir.join("snapshot.pickle"), dir.join("snapshot.json"));
            std::fs::write(&pkl, &pickle).unwrap();
            std::fs::write(&js, snap.to_json()).unwrap();
            let out = Command::new("python3")
                .arg("-c")
                .arg(CPYTHON_CHECK)
                .arg(&pkl)
                .arg(&js)
                .output()
                .unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "python3 check failed:\n{stdout}{stderr}"
            );
            println!("{stdout}");
        }
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            println!("skipping the CPython check: python3 not found ({e})");
        }
        Err(e) => panic!("python3 is required under CI=true: {e}"),
    }

    for h in [three, five, small] {
        a.free(h).unwrap();
    }
}
