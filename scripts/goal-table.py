#!/usr/bin/env python3
"""The online-step goals (issue 32) and, with swap on, the host tier's (issue 33)
on any set of traces: one table, one line per goal, from `remat replay` runs.

    scripts/goal-table.py [options] [TRACE ...]

TRACE is a trace file (DTR paper format) or a name `remat replay` resolves
through REMAT_TRACES_DIR. Without TRACEs: every `*.log` in REMAT_TRACES_DIR
(default ../shared/traces/dtr-paper) and in the `torch` folder beside it.
A trace logged from your own model (`scripts/log-torch-trace.py`, or a
recording written with `Recording::to_trace`) works the same way: this is
how the goals are checked on models that are not in the repository.

For each trace and ratio it runs, in parallel:
  remat replay T --ratio R --iterations N --json [EXTRA]          (first, steady)
  remat replay T --ratio R --policy dtr --budget-mode logical \\
      --conf sampling:off --json                                   (remat's h_DTR)
The reference of a cell is the lower finishing figure of remat's full-scan
h_DTR under a logical budget and the authors' simulator, read from the
README.md beside the trace where it lists one (a row named like the trace
file up to its first '-', one column per ratio). A figure finishes when it
is a number of at most 2.0 (the single-iteration replayer's stop).

Options:
  --remat BIN         the CLI to run (default: target/release/remat; build it
                      with `cargo build --release --bin remat`)
  --compare BIN       a second build: each cell shows this build's figures
                      after the first's ("a → b"), and the goal lines count
                      this build's
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
import re
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
                    try:
                        ok = 0.0 < float(r) <= 1.0
                    except ValueError:
                        ok = False
                    if not ok:
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
    base = os.environ.get("REMAT_TRACES_DIR") or os.path.join(ROOT, "..", "shared", "traces", "dtr-paper")
    dirs = [base, os.path.join(os.path.dirname(os.path.normpath(base)), "torch")]
    # A name is resolved as `remat replay` resolves it, so that the README
    # beside the file is found too; an unknown name is passed on unchanged
    # (its replay then says what is wrong).
    for i, t in enumerate(opts["traces"]):
        if not os.path.isfile(t):
            found = [f for d in dirs for f in glob.glob(os.path.join(d, f"{t}-*.log")) + glob.glob(os.path.join(d, f"{t}.log"))]
            if len(found) == 1:
                opts["traces"][i] = found[0]
    if not opts["traces"]:
        opts["traces"] = sorted(t for d in dirs for t in glob.glob(os.path.join(d, "*.log")))
        if not opts["traces"]:
            fail(f"no traces given and none in {dirs[0]} or {dirs[1]} (set REMAT_TRACES_DIR)")
    return opts


def stem(trace):
    return os.path.basename(trace).split("-")[0]


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
        if cells[0] == "trace" and any(c in ratios for c in cells):
            header = cells
        elif header and cells[0].strip("`") == stem(trace) and len(cells) == len(header):
            out = {}
            for r in ratios:
                if r in header:
                    v = cells[header.index(r)]
                    try:
                        out[r] = float(v)
                    except ValueError:
                        out[r] = None
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
            try:
                return float(v) > 0
            except ValueError:
                return False  # `remat replay` rejects it with a typed error
    return False


def replay(binary, args):
    p = subprocess.run([binary, "replay", *args, "--json"], capture_output=True, text=True)
    try:
        d = json.loads(p.stdout)
    except ValueError:
        return {"status": "error", "error": (p.stderr.strip() or p.stdout.strip())[:300], "its": []}
    return {
        "status": d.get("status"),
        "error": d.get("error"),
        "its": [it["overhead"] for it in d.get("iterations", [])],
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

    def first(c):
        return c["its"][0] if c["its"] else None

    def steady(c):
        return c["its"][-1] if c["status"] == "ok" and c["its"] else None

    def show(c, f):
        v = f(c)
        if c["status"] == "ok" and v is not None:
            return f"{v:.4f}"
        return c["status"] if f is first else "–"

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
            if reference is not None:
                g["ref"] += 1
                if c["status"] != "ok":
                    g["fin"].append(name)
                else:
                    d = steady(c) / reference - 1
                    vs = f"{d * 100:+.1f} %"
                    if d > 1e-9:
                        g["st"].append(f"{name} ({steady(c):.4f} against {reference:.3f})")
                    if d <= -0.01:
                        g["st1"] += 1
            elif c["status"] == "ok" and (ref is not None or r in sim):
                vs = "finishes (reference fails)"
            if float(r) in (0.5, 0.4):
                # A cell where neither the step nor the reference finishes
                # asks nothing of the first step.
                if c["status"] == "ok" or reference is not None:
                    g["f3n"] += 1
                    if c["status"] != "ok" or first(c) > 3.0:
                        g["f3"].append(f"{name} ({show(c, first)})")
                else:
                    g["neither"].append(name)
            if swap:
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
                    if c["status"] != "ok" or first(c) > 3.0:
                        g["sw_f3"].append(f"{name} ({show(c, first)})")
            simv = "–" if r not in sim else ("fails" if sim[r] is None else f"{sim[r]:.3f}")
            minev = f"{mine:.3f}" if mine is not None else (ref["status"] if ref else "–")
            fs = " → ".join(show(x, first) for x in cells)
            ss = " → ".join(show(x, steady) for x in cells)
            print(f"| {stem(t)} | {r} | {simv} / {minev} | {fs} | {ss} | {vs} |")
    print()
    n = g["ref"]
    label = "this build" if len(builds) == 1 else "the second build"
    print(f"Goals ({label}, {len(o['traces'])} traces, ratios {', '.join(o['ratios'])}):")

    def line(text, misses):
        print(f"- {text}" + (f"; not: {', '.join(misses)}" if misses else ""))

    if swap:
        cells = len(o["traces"]) * len(o["ratios"])
        line(f"finishes, or names the op whose working set exceeds the budget: {cells - len(g['sw_fin'])} of {cells}", g["sw_fin"])
        if g["sw_oom"]:
            print(f"  (an impossible budget naming its op: {', '.join(g['sw_oom'])}; left out below)")
        line(f"steady <= 1.3x at 0.2: {g['sw_st_n'] - len(g['sw_st'])} of {g['sw_st_n']}", g["sw_st"])
        line(f"first <= 3x at 0.3: {g['sw_f3_n'] - len(g['sw_f3'])} of {g['sw_f3_n']}", g["sw_f3"])
    else:
        line(f"the first step finishes wherever the reference finishes: {n - len(g['fin'])} of {n}", g["fin"])
        line(f"the first step <= 3x at 0.5 and 0.4: {g['f3n'] - len(g['f3'])} of {g['f3n']}", g["f3"])
        if g["neither"]:
            print(f"  (neither the step nor the reference finishes, left out: {', '.join(g['neither'])})")
        line(f"the steady state <= the reference wherever it finishes: {n - len(g['fin']) - len(g['st'])} of {n}", g["fin"] + g["st"])
        print(f"- ... and >= 1 % lower: {g['st1']} of {n}")
    if errors:
        print("\nReplays that gave no figure:\n" + "\n".join(f"- {e}" for e in errors))
        sys.exit(1)


if __name__ == "__main__":
    main()
