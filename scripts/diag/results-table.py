#!/usr/bin/env python3
"""One Markdown table row per mode and case from bench result files (`ddiskqos-bench run --out DIR`: DIR's
results.json, or the dated copies in crates/bench/results): mean read times of every variant, dDiskQoS against
Original and against static best by the three rules (median of per-repetition ratios, ratio of means, slowest over
slowest), STARVED reads (slower than twice the slowest Original read of the case), the background's rate with the
agent over Original's, and the agent's reaction. For the README's tables, so that each figure comes from its file.

    results-table.py RESULTS.json [RESULTS.json ...]
"""
import json
import statistics
import sys

VARIANTS = ["alone", "original", "ddiskqos", "static-best"]


def fmt_ms(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def with_unit(v):
    return fmt_ms(v) if v >= 1000 else f"{fmt_ms(v)} ms"


def by_round(variant):
    return {s["round"]: s["read_ms"] for s in variant["samples"]}


def rules(num, den):
    """median of per-round ratios / ratio of means / max over max, or None where a side is missing."""
    rounds = sorted(set(num) & set(den))
    if not rounds:
        return None
    per = [num[r] / den[r] for r in rounds]
    return (
        statistics.median(per),
        statistics.mean(num.values()) / statistics.mean(den.values()),
        max(num.values()) / max(den.values()),
    )


def fmt_rules(r):
    return "-" if r is None else " / ".join(f"{x:.2f}" for x in r)


def main(paths):
    print("| file | mode | case | Alone / Original / dDiskQoS / static best (mean ms) | dDQ/Orig | dDQ/SB "
          "| STARVED | bg dDQ/Orig | reaction median / p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        name = path.rsplit("/", 1)[-1].removesuffix("-results.json").removesuffix("results.json") or path
        for mode in run["modes"]:
            blocks = mode.get("background_blocks") or {}
            bg = "-"
            if blocks.get("original", {}).get("mib_per_s") and "ddiskqos" in blocks:
                bg = f"{100 * blocks['ddiskqos']['mib_per_s'] / blocks['original']['mib_per_s']:.0f} %"
            waits = [s["weight"]["waited_ms"] for row in mode["exp1"] + mode["exp2"] for v in row["variants"]
                     if v["variant"] == "ddiskqos" for s in v["samples"]
                     if s.get("weight") and s["weight"].get("reached")]
            waits.sort()
            reaction = "-"
            if waits:
                p99 = waits[min(len(waits) - 1, max(0, -(-99 * len(waits) // 100) - 1))]
                reaction = f"{with_unit(statistics.median(waits))} / {with_unit(p99)}"
            for row in mode["exp1"] + mode["exp2"]:
                v = {x["variant"]: x for x in row["variants"]}
                if "ddiskqos" not in v or not v["ddiskqos"]["samples"]:
                    continue
                means = []
                for name_v in VARIANTS:
                    samples = v.get(name_v, {}).get("samples") or []
                    means.append(fmt_ms(statistics.mean(s["read_ms"] for s in samples)) if samples else "-")
                d = by_round(v["ddiskqos"])
                o = by_round(v["original"]) if "original" in v else {}
                sb = by_round(v["static-best"]) if "static-best" in v and v["static-best"]["samples"] else {}
                starved = sum(1 for x in d.values() if o and x > 2 * max(o.values()))
                print(f"| {name} | {mode['mode']} | {row['label']} | {' / '.join(means)} | {fmt_rules(rules(d, o))} "
                      f"| {fmt_rules(rules(d, sb))} | {starved}/{len(d)} | {bg} | {reaction} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
