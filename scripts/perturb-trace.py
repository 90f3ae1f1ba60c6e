#!/usr/bin/env python3
"""Write a perturbed copy of a DTR-paper trace (JSON Lines), for checking that
remat's settings are not fitted to the five shared traces
(docs/history/dtr-experiments.md, "Session 15: an earlier thrash rescue").

    scripts/perturb-trace.py IN OUT MODE SEED

MODE is `cost` (each CALL/MUTATE TIME times a factor drawn from [0.3, 3]),
`size` (each MEMORY times 0.37 for an odd SEED, 2.3 for an even one, plus 0-6
bytes, so sizes are no longer multiples of anything) or `both`. The program
(names, arguments, releases) is unchanged. Write the copies outside the
repository: the traces are never copied into it.
"""
import json
import random
import sys


def main():
    if len(sys.argv) != 5 or sys.argv[3] not in ("cost", "size", "both"):
        sys.exit(__doc__)
    src, out, mode, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rng = random.Random(seed)
    factor = 0.37 if seed % 2 == 1 else 2.3
    with open(src) as f, open(out, "w") as g:
        for line in f:
            d = json.loads(line)
            ins = d["INSTRUCTION"]
            if mode in ("cost", "both") and ins in ("CALL", "MUTATE"):
                d["TIME"] = str(max(1, int(int(d["TIME"]) * rng.uniform(0.3, 3.0))))
            if mode in ("size", "both") and ins == "MEMORY":
                m = int(d["MEMORY"])
                if m > 0:
                    d["MEMORY"] = str(max(1, int(m * factor) + rng.randrange(0, 7)))
            g.write(json.dumps(d, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
