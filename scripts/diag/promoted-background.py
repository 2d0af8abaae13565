#!/usr/bin/env python3
"""dDiskQoS reads split by the background's weight read back when each began: at the engine's bottom (10) or above
it (promoted while the bench had it frozen, or boosted). Each read is divided by the median Original read of its case
in the same file; prints, per file and pooled, how many reads met each and their median and mean ratio.

    promoted-background.py RESULTS.json [RESULTS.json ...] [--bottom 10]
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--bottom", type=int, default=10)
    a = ap.parse_args()
    pooled = {"bottom": [], "above": []}
    for path in a.results:
        with open(path) as f:
            run = json.load(f)
        split = {"bottom": [], "above": []}
        for mode in run["modes"]:
            for case in mode["exp1"] + mode["exp2"]:
                v = {x["variant"]: x for x in case["variants"]}
                if not v.get("original", {}).get("samples") or not v.get("ddiskqos", {}).get("samples"):
                    continue
                base = statistics.median(s["read_ms"] for s in v["original"]["samples"])
                for s in v["ddiskqos"]["samples"]:
                    key = "above" if s["bg_weight"] > a.bottom else "bottom"
                    split[key].append(s["read_ms"] / base)
        print(f"{path.rsplit('/', 1)[-1]}: {line(split)}")
        for k in pooled:
            pooled[k] += split[k]
    if len(a.results) > 1:
        print(f"pooled over {len(a.results)} files: {line(pooled)}")


def line(split):
    def part(name, xs):
        if not xs:
            return f"{name} 0 reads"
        return f"{name} {len(xs)} reads, median {statistics.median(xs):.2f}, mean {statistics.mean(xs):.2f}"
    return f"{part('background above the bottom:', split['above'])} | {part('at the bottom:', split['bottom'])}"


if __name__ == "__main__":
    main()
