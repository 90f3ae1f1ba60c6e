#!/usr/bin/env python3
"""The online-step goals (issue 32) and, with swap on, the host tier's (issue 33)
on any set of traces: one table, one line per goal, from `remat replay` runs.

    scripts/goal-table.py [options] [TRACE ...] [-- EXTRA ...]

TRACE is a trace file (DTR paper format) or a name: the trace in
REMAT_TRACES_DIR (default ../shared/traces/dtr-paper) or in the `torch`
folder beside it whose name (the file name up to its first '-') is TRACE,
else whose file name starts with TRACE. Without TRACEs: every `*.log` in
those two folders.
A trace logged from your own model (`scripts/log-torch-trace.py`, or a
recording written with `Recording::to_trace`) works the same way: this is
how the goals are checked on models that are not in the repository.

For each trace and ratio it runs, in parallel:
  remat replay T --ratio R --iterations N --json [EXTRA]          (first, steady)
  remat replay T --ratio R --policy dtr --budget-mode logical \\
      --conf sampling:off --json                                   (remat's h_DTR)
The reference of a cell is the lower of the two figures that finish (a
number of at most 2.0, the single-iteration replayer's stop): remat's
full-scan h_DTR above, and the authors' simulator's figure from the
README.md beside the trace, where it has a table with a `trace` column and
one column per ratio, and a row named like the trace.

Options:
  --remat BIN         the CLI to run (default: target/release/remat; build it
                      with `cargo build --release --bin remat`)
  --compare BIN       a second build: each cell shows its figures after the
                      first's ("a → b"); "steady vs reference" and the goal
                      lines are the second build's (the reference runs on
                      the first)
  --ratios LIST       comma-separated (default 0.5,0.4,0.3,0.25,0.2)
  --iterations N      (default 3)
  --jobs N            replays at once (default 2)
  --no-reference      skip remat's h_DTR runs (the READMEs' figures only)
  -- EXTRA ...        passed to every default-policy replay, e.g.
                      `-- --swap-bandwidth 24` or `-- --conf thrash_rescue:off`

With swap on in EXTRA (`--swap-bandwidth` above 0) the goal lines are issue
33's (finishes or names its op, steady <= 1.3x at 0.2, first <= 3x at 0.3);
otherwise issue 32's. The reference is always swap-off h_DTR. Figures are
overheads: (compute + replays + stalls) / compute.
"""
import concurrent.futures as cf
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP = 2.0  # the single-iteration replayer's thrash stop


def fail(msg):
    sys.exit(f"goal-table: {msg}")


def parse_args(argv):
    opts = {
        "remat": os.path.join(ROOT, "target", "release", "remat"),
        "compare": None,
        "ratios": ["0.5", "0.4", "0.3", "0.25", "0.2"],
        "iterations": "3",
        "jobs": 2,
        "reference": True,
        "extra": [],
        "traces": [],
    }
    if "--" in argv:
        i = argv.index("--")
        argv, opts["extra"] = argv[:i], argv[i + 1 :]
    it = iter(argv)
    for a in it:
        if a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        elif a in ("--remat", "--compare", "--ratios", "--iterations", "--jobs"):
            v = next(it, None)
            if v is None:
                fail(f"{a} needs a value")
            key = a[2:]
            if key == "ratios":
                v = [r for r in v.split(",") if r]
                for r in v:
                    x = as_number(r)
                    if x is None or not 0.0 < x <= 1.0:
                        fail(f"--ratios: '{r}' is not a ratio in (0, 1]")
            elif key in ("iterations", "jobs"):
                if not v.isdigit() or int(v) < 1:
                    fail(f"{a}: '{v}' is not a whole number of at least 1")
                v = int(v) if key == "jobs" else v
            opts[key] = v
        elif a == "--no-reference":
            opts["reference"] = False
        elif a.startswith("-"):
            fail(f"unknown option '{a}' (see --help)")
        else:
            opts["traces"].append(a)
    for key in ("remat", "compare"):
        b = opts[key]
        if b is not None and not os.access(b, os.X_OK):
            fail(f"--{key}: no executable at {b} (cargo build --release --bin remat)")
    if not opts["ratios"]:
        fail("--ratios: no ratio given")
    base = os.environ.get("REMAT_TRACES_DIR") or os.path.join(ROOT, "..", "shared", "traces", "dtr-paper")
    dirs = []
    for d in (base, os.path.join(os.path.dirname(os.path.normpath(base)), "torch")):
        if os.path.realpath(d) not in map(os.path.realpath, dirs):
            dirs.append(d)
    files = sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.log")))
    # A name becomes its file, so that the README beside it is found and the
    # row is named by the file; a name that matches no file is an error here,
    # before any replay runs.
    for i, t in enumerate(opts["traces"]):
        if os.path.isfile(t):
            continue
        found = [f for f in files if stem(f) == t] or [f for f in files if os.path.basename(f).startswith(t)]
        if not found:
            fail(f"trace '{t}': no such file, and no trace of that name in {' or '.join(dirs)} (set REMAT_TRACES_DIR)")
        opts["traces"][i] = found[0]
    if not opts["traces"]:
        opts["traces"] = files
        if not files:
            fail(f"no traces given and none in {' or '.join(dirs)} (set REMAT_TRACES_DIR)")
    return opts


def stem(trace):
    """The trace's name, as `Trace::name_of` gives it: the file name without
    its extension, up to its first '-'."""
    return os.path.splitext(os.path.basename(trace))[0].split("-")[0]


def as_number(text):
    """`text` as a number (a ratio, a figure, a bandwidth), or None."""
    try:
        return float(text)
    except ValueError:
        return None


def readme_figures(trace, ratios):
    """The authors' simulator's figure per ratio from the README beside the
    trace: a float, or None where it lists a failure; {} if it lists none."""
    path = os.path.join(os.path.dirname(trace), "README.md") if os.path.isfile(trace) else None
    if not path or not os.path.isfile(path):
        return {}
    header = None
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if not cells:
            header = None
            continue
        if cells[0] == "trace" and any(as_number(c) in map(float, ratios) for c in cells):
            header = [as_number(c) for c in cells]
        elif header and cells[0].strip("`") == stem(trace) and len(cells) == len(header):
            out = {}
            for r in ratios:
                if float(r) in header:
                    out[r] = as_number(cells[header.index(float(r))])
            return out
    return {}


def swap_on(extra):
    """Whether EXTRA turns swap on: `--swap-bandwidth X` or `--swap-bandwidth=X`
    with X above 0 (0 is off, as for `remat replay`)."""
    for i, a in enumerate(extra):
        v = None
        if a == "--swap-bandwidth" and i + 1 < len(extra):
            v = extra[i + 1]
        elif a.startswith("--swap-bandwidth="):
            v = a.split("=", 1)[1]
        if v is not None:
            # Not a number: `remat replay` rejects it with a typed error.
            return (as_number(v) or 0.0) > 0
    return False


def replay(binary, args):
    p = subprocess.run([binary, "replay", *args, "--json"], capture_output=True, text=True)
    try:
        d = json.loads(p.stdout)
    except ValueError:
        return {"status": "error", "error": (p.stderr.strip() or p.stdout.strip())[:300], "its": [], "its_status": []}
    return {
        "status": d.get("status"),
        "error": d.get("error"),
        "its": [it["overhead"] for it in d.get("iterations", [])],
        "its_status": [it.get("status") for it in d.get("iterations", [])],
    }


def main():
    o = parse_args(sys.argv[1:])
    swap = swap_on(o["extra"])
    builds = [o["remat"]] + ([o["compare"]] if o["compare"] else [])
    jobs = {}
    with cf.ThreadPoolExecutor(max_workers=o["jobs"]) as pool:
        for t in o["traces"]:
            for r in o["ratios"]:
                for k, b in enumerate(builds):
                    args = [t, "--ratio", r, "--iterations", o["iterations"], *o["extra"]]
                    jobs[(t, r, k)] = pool.submit(replay, b, args)
                if o["reference"]:
                    args = [t, "--ratio", r, "--policy", "dtr", "--budget-mode", "logical", "--conf", "sampling:off"]
                    jobs[(t, r, "ref")] = pool.submit(replay, o["remat"], args)
        done = {k: f.result() for k, f in jobs.items()}

    def first_ok(c):
        # The first step's own status: a run whose later step thrashes has
        # a first step that finished.
        return bool(c["its_status"]) and c["its_status"][0] == "ok"

    def first(c):
        return c["its"][0] if c["its"] else None

    def steady(c):
        return c["its"][-1] if c["status"] == "ok" and c["its"] else None

    def show(c, f):
        v = f(c)
        if f is first:
            return f"{v:.4f}" if first_ok(c) else (c["its_status"][0] if c["its_status"] else c["status"])
        return f"{v:.4f}" if v is not None else "–"

    print("| trace | ratio | reference: simulator / remat h_DTR | first | steady | steady vs reference |")
    print("|---|---|---|---|---|---|")
    last = len(builds) - 1
    g = {"ref": 0, "fin": [], "f3": [], "f3n": 0, "neither": [], "st": [], "st1": 0}
    g.update({"sw_fin": [], "sw_oom": [], "sw_st": [], "sw_st_n": 0, "sw_f3": [], "sw_f3_n": 0})
    errors = []
    for t in o["traces"]:
        sim = readme_figures(t, o["ratios"])
        for r in o["ratios"]:
            cells = [done[(t, r, k)] for k in range(len(builds))]
            for c in cells:
                if c["status"] not in ("ok", "thrash", "oom"):
                    errors.append(f"{stem(t)} {r}: {c['status']}: {c['error']}")
            ref = done.get((t, r, "ref"))
            mine = ref["its"][0] if ref and ref["status"] == "ok" and ref["its"] else None
            finishing = [v for v in (sim.get(r), mine) if v is not None and v <= STOP]
            reference = min(finishing) if finishing else None
            c = cells[last]
            name = f"{stem(t)} {r}"
            vs = ""
            if c["status"] == "error":
                pass  # listed under the replays that gave no figure
            elif reference is not None:
                g["ref"] += 1
                if not first_ok(c):
                    g["fin"].append(name)
                if steady(c) is None:
                    g["st"].append(f"{name} (no steady state: {c['status']})")
                else:
                    d = steady(c) / reference - 1
                    vs = f"{d * 100:+.1f} %"
                    if d > 1e-9:
                        g["st"].append(f"{name} ({steady(c):.4f} against {reference:.3f})")
                    if d <= -0.01:
                        g["st1"] += 1
            elif c["status"] == "ok" and (ref is not None or r in sim):
                vs = "finishes (reference fails)"
            if float(r) in (0.5, 0.4) and c["status"] != "error":
                # A cell where neither the step nor the reference finishes
                # asks nothing of the first step.
                if first_ok(c) or reference is not None:
                    g["f3n"] += 1
                    if not first_ok(c) or first(c) > 3.0:
                        g["f3"].append(f"{name} ({show(c, first)})")
                else:
                    g["neither"].append(name)
            if swap and c["status"] != "error":
                # `oom` is the typed impossible budget naming the op whose
                # working set exceeds it: the goals' one exception.
                if c["status"] == "oom":
                    g["sw_oom"].append(name)
                elif c["status"] != "ok":
                    g["sw_fin"].append(f"{name} ({c['status']})")
                if float(r) == 0.2 and c["status"] != "oom":
                    g["sw_st_n"] += 1
                    if steady(c) is None or steady(c) > 1.3:
                        g["sw_st"].append(f"{name} ({show(c, steady) if steady(c) else c['status']})")
                if float(r) == 0.3 and c["status"] != "oom":
                    g["sw_f3_n"] += 1
                    if not first_ok(c) or first(c) > 3.0:
                        g["sw_f3"].append(f"{name} ({show(c, first)})")
            simv = "–" if r not in sim else ("fails" if sim[r] is None else f"{sim[r]:.3f}")
            minev = f"{mine:.3f}" if mine is not None else (ref["status"] if ref else "–")
            fs = " → ".join(show(x, first) for x in cells)
            ss = " → ".join(show(x, steady) for x in cells)
            print(f"| {stem(t)} | {r} | {simv} / {minev} | {fs} | {ss} | {vs} |")
    print()
    n = g["ref"]
    label = "this build" if len(builds) == 1 else "the second build"
    which = "the host tier's (issue 33), swap on" if swap else "the online steps' (issue 32)"
    print(f"Goals: {which}; {label}, {len(o['traces'])} traces, ratios {', '.join(o['ratios'])}:")
    asked = set(map(float, o["ratios"]))

    def line(text, misses):
        print(f"- {text}" + (f"; not: {', '.join(misses)}" if misses else ""))

    if swap:
        cells = len(o["traces"]) * len(o["ratios"])
        line(f"finishes, or names the op whose working set exceeds the budget: {cells - len(g['sw_fin'])} of {cells}", g["sw_fin"])
        if g["sw_oom"]:
            print(f"  (an impossible budget naming its op: {', '.join(g['sw_oom'])}; left out below)")
        if 0.2 in asked:
            line(f"steady <= 1.3x at 0.2: {g['sw_st_n'] - len(g['sw_st'])} of {g['sw_st_n']}", g["sw_st"])
        if 0.3 in asked:
            line(f"first <= 3x at 0.3: {g['sw_f3_n'] - len(g['sw_f3'])} of {g['sw_f3_n']}", g["sw_f3"])
    else:
        line(f"the first step finishes wherever the reference finishes: {n - len(g['fin'])} of {n}", g["fin"])
        if asked & {0.5, 0.4}:
            line(f"the first step <= 3x at 0.5 and 0.4: {g['f3n'] - len(g['f3'])} of {g['f3n']}", g["f3"])
        if g["neither"]:
            print(f"  (neither the step nor the reference finishes, left out: {', '.join(g['neither'])})")
        line(f"the steady state <= the reference wherever it finishes: {n - len(g['st'])} of {n}", g["st"])
        print(f"- ... and >= 1 % lower: {g['st1']} of {n}")
    if errors:
        print("\nReplays that gave no figure:\n" + "\n".join(f"- {e}" for e in errors))
        sys.exit(1)


if __name__ == "__main__":
    main()
