#!/usr/bin/env python3
"""The weight timeline of dDiskQoS reads: for each dDiskQoS read of a bench run slower than FACTOR x the slowest
Original read of its case (default 2: the bench's STARVED), or the N slowest with --slowest N, prints the reader's and
every other container's weight (read back) and read rate while it ran, and the agent's weight decisions from the
bench's log (RUST_LOG=info on stderr).

    starved-reads.py RESULTS.json TIMELINE (from weight-timeline.py) BENCH-STDERR [--slowest N] [--factor F]
"""
import argparse
import datetime
import json
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("timeline")
    ap.add_argument("log")
    ap.add_argument("--slowest", type=int, default=0)
    ap.add_argument("--factor", type=float, default=2.0)
    a = ap.parse_args()
    run = json.load(open(a.results))
    polls = [line.split() for line in open(a.timeline) if not line.startswith("#")]
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    decisions = []
    for line in open(a.log):
        m = re.match(r"(\S+Z)\s+INFO (\S+): (.*weight decision.*)", ansi.sub("", line))
        if m:
            t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            decisions.append((t, re.sub(r"container=(\w+) name=\S+", r"\1", m.group(3))))
    picked = []
    for mode in run["modes"]:
        for case in mode["exp1"] + mode["exp2"]:
            orig = [s["read_ms"] for v in case["variants"] if v["variant"] == "original" for s in v["samples"]]
            for v in case["variants"]:
                if v["variant"] != "ddiskqos":
                    continue
                for s in v["samples"]:
                    starved = bool(orig) and s["read_ms"] > a.factor * max(orig)
                    picked.append((s["read_ms"], starved, mode["mode"], case["label"], s))
    picked.sort(key=lambda p: -p[0])
    chosen = [p for p in picked if p[1]] + ([p for p in picked if not p[1]][: a.slowest] if a.slowest else [])
    for read_ms, starved, mode, label, s in chosen:
        rid = s["id"][:12]
        rows = [p for p in polls if p[1] == rid]
        if not rows:
            print(f"\n{mode} {label} round {s['round']}: {read_ms:.0f} ms, id {rid}: not in the timeline")
            continue
        t0, t1 = float(rows[0][0]), float(rows[-1][0])
        tag = "STARVED" if starved else "slow"
        print(f"\n=== {tag}: {mode} {label} round {s['round']}: {read_ms:.0f} ms, id {rid}, cgroup seen {t1 - t0:.2f} s")
        last = {}
        for p in polls:
            t = float(p[0])
            if t0 <= t <= t1 + 0.1:
                weight, rb = p[2], int(p[3][3:])
                prev = last.get(p[1])
                if prev is None or prev[0] != weight or t - prev[2] >= 0.5:
                    rate = (rb - prev[1]) / (t - prev[2]) / 2**20 if prev else 0.0
                    print(f"  {t - t0:+8.3f} {p[1]} {weight:7} read {rb / 2**20:10.1f} MiB {rate:8.1f} MiB/s")
                    last[p[1]] = (weight, rb, t)
        for t, msg in decisions:
            if t0 <= t <= t1 + 0.1:
                print(f"  {t - t0:+8.3f} agent: {msg[:150]}")


if __name__ == "__main__":
    main()
