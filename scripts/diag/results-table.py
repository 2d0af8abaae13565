#!/usr/bin/env python3
"""One Markdown table row per mode and case from bench result files (`ddiskqos-bench run --out DIR`: DIR's
results.json, or the dated copies in crates/bench/results): mean read times of every variant, dDiskQoS against
Original and against static best by the three rules (median of per-repetition ratios, ratio of means, slowest over
slowest), STARVED reads (slower than twice the slowest Original read of the case), the background's rate with the
agent over Original's, and the agent's reaction. For the README's tables, so that each figure comes from its file.

    results-table.py RESULTS.json [RESULTS.json ...]
    results-table.py --summary RESULTS.json [...]   one row per mode (the README's v2 table): 1 MiB means, 1 and
                                                    10 MiB against Original, 1 MiB against static best, Experiment
                                                    2's readers by median and by means, STARVED reads of all cases, background
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


def variant_means(v):
    """Mean read time of each of VARIANTS in a case (variants by name), formatted, "-" for one that did not run."""
    return [fmt_ms(statistics.mean(s["read_ms"] for s in v[n]["samples"])) if v.get(n, {}).get("samples") else "-"
            for n in VARIANTS]


def starved_reads(v):
    """The dDiskQoS reads of a case slower than twice its slowest Original read (none without both)."""
    if not v.get("ddiskqos", {}).get("samples") or not v.get("original", {}).get("samples"):
        return []
    slow = max(s["read_ms"] for s in v["original"]["samples"])
    return [s["read_ms"] for s in v["ddiskqos"]["samples"] if s["read_ms"] > 2 * slow]


def fmt_rules(r):
    return "-" if r is None else " / ".join(f"{x:.2f}" for x in r)


def mode_rows(path):
    """(file name, mode, {label: variants by name}, background %) for every mode of a results file."""
    with open(path) as f:
        run = json.load(f)
    name = path.rsplit("/", 1)[-1].removesuffix("-results.json").removesuffix("results.json") or path
    for mode in run["modes"]:
        blocks = mode.get("background_blocks") or {}
        bg = "-"
        if blocks.get("original", {}).get("mib_per_s") and "ddiskqos" in blocks:
            bg = f"{100 * blocks['ddiskqos']['mib_per_s'] / blocks['original']['mib_per_s']:.0f} %"
        cases = {row["label"]: {x["variant"]: x for x in row["variants"]} for row in mode["exp1"] + mode["exp2"]}
        yield name, mode, cases, bg, [row["label"] for row in mode["exp2"]]


def summary(paths):
    print("| file | mode | 1 MiB Alone / Original / dDiskQoS / static best (mean ms) | 1 MiB dDQ/Orig "
          "| 10 MiB dDQ/Orig | dDQ/static best, 1 MiB | Experiment 2, by median / by means | STARVED (all cases) | background |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for name, mode, cases, bg, exp2 in mode_rows(path):
            def ratio(label, against):
                v = cases.get(label, {})
                if "ddiskqos" not in v or not v.get(against, {}).get("samples"):
                    return None
                return rules(by_round(v["ddiskqos"]), by_round(v[against]))

            means = " / ".join(variant_means(cases.get("1MiB", {})))
            sb = ratio("1MiB", "static-best")
            e2 = [r for r in (ratio(label, "original") for label in exp2) if r]
            e2s = " / ".join(f"{min(r[i] for r in e2):.2f}-{max(r[i] for r in e2):.2f}" for i in (0, 1)) if e2 else "-"
            starved = [f"{label} {with_unit(ms)}" for label, v in cases.items() for ms in starved_reads(v)]
            total = sum(len(v["ddiskqos"]["samples"]) for v in cases.values()
                        if v.get("ddiskqos", {}).get("samples") and v.get("original", {}).get("samples"))
            st = f"{len(starved)} of {total}" + (f" ({', '.join(starved)})" if starved else "")
            print(f"| {name} | {mode['mode']} | {means} | {fmt_rules(ratio('1MiB', 'original'))} "
                  f"| {fmt_rules(ratio('10MiB', 'original'))} | {'-' if sb is None else f'{sb[0]:.2f} / {sb[1]:.2f}'} "
                  f"| {e2s} | {st} | {bg} |")


def main(paths):
    print("| file | mode | case | Alone / Original / dDiskQoS / static best (mean ms) | dDQ/Orig | dDQ/SB "
          "| STARVED | bg dDQ/Orig | reaction median / p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for name, mode, _, bg, _ in mode_rows(path):
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
                means = variant_means(v)
                d = by_round(v["ddiskqos"])
                o = by_round(v["original"]) if "original" in v else {}
                sb = by_round(v["static-best"]) if "static-best" in v and v["static-best"]["samples"] else {}
                starved = len(starved_reads(v))
                print(f"| {name} | {mode['mode']} | {row['label']} | {' / '.join(means)} | {fmt_rules(rules(d, o))} "
                      f"| {fmt_rules(rules(d, sb))} | {starved}/{len(d)} | {bg} | {reaction} |")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1:] == ["--summary"]:
        sys.exit(__doc__)
    if sys.argv[1] == "--summary":
        summary(sys.argv[2:])
    else:
        main(sys.argv[1:])
