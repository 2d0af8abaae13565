#!/usr/bin/env python3
"""Whose tail is it? The STARVED rule turned both ways, pooled over bench results files.

For every case (an Experiment 1 size or an Experiment 2 reader) of every mode, counts
- dDiskQoS reads slower than 2 x the case's slowest Original read (the bench's STARVED rule), and
- Original reads slower than 2 x the case's slowest dDiskQoS read (the same rule, mirrored).
If the two counts are alike, a mode's slow reads are the device's (both arms draw from one heavy tail); if STARVED
is much the larger, the agent's weights lengthen the tail; if the mirror is, they shorten it.

usage: scripts/diag/tail-mirror.py RESULTS.json...
"""
import json
import sys
from collections import defaultdict


def reads(case, variant):
    for v in case["variants"]:
        if v["variant"] == variant:
            return [s["read_ms"] for s in v["samples"]]
    return None


def main(paths):
    if not paths:
        sys.exit(__doc__.strip().splitlines()[-1])
    # mode -> [runs, starved, mirrored, dDiskQoS reads, Original reads]
    pooled = defaultdict(lambda: [0, 0, 0, 0, 0])
    for path in paths:
        with open(path) as f:
            results = json.load(f)
        for mode in results["modes"]:
            row = pooled[mode["mode"]]
            row[0] += 1
            for case in mode.get("exp1", []) + mode.get("exp2", []):
                orig, ddq = reads(case, "original"), reads(case, "ddiskqos")
                if not orig or not ddq:
                    continue
                row[1] += sum(r > 2 * max(orig) for r in ddq)
                row[2] += sum(r > 2 * max(ddq) for r in orig)
                row[3] += len(ddq)
                row[4] += len(orig)
    print(f"{'mode':16} {'runs':>4} | {'STARVED (dDQ > 2x slowest Orig)':>32} | {'mirrored (Orig > 2x slowest dDQ)':>33}")
    for mode, (runs, starved, mirrored, n_ddq, n_orig) in sorted(pooled.items()):
        print(f"{mode:16} {runs:>4} | {starved:>20} of {n_ddq:<8} | {mirrored:>21} of {n_orig:<8}")


if __name__ == "__main__":
    main(sys.argv[1:])
