#!/usr/bin/env python3
"""Tabulates run.py --json outputs of (a) and (f) as one markdown table, one row per file.

  python3 scripts/bench/tabulate.py out1.json out2.json ...

Columns: the run's --stfs-opts, then for (a) and (f) the medians of stfs, squashfuse and the limit
row, and the medians [min-max] of the paired ratios (within each file's interleaved repetitions;
ratios across files are not paired, since the machine drifts between runs). A ratio is the other
variant's time over stfs's: above 1, stfs was faster ("stfs vs limit" is the fraction of the
limit's speed that stfs reached).
"""

import json
import statistics
import sys


def paired(series, slower, faster):
    a, b = series.get(slower, {}).get("values", []), series.get(faster, {}).get("values", [])
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def median(series, name, fmt):
    s = series.get(name)
    return fmt.format(s["median"]) if s else "-"


def main():
    print("| --stfs-opts | reps | (a) stfs s | squashfuse s | limit s | stfs vs squashfuse | stfs vs limit "
          "| (f) stfs µs | squashfuse µs | limit µs | stfs vs squashfuse |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        with open(path) as f:
            doc = json.load(f)
        opts = doc["args"].get("stfs_opts") or "(defaults)"
        a = doc["scenarios"].get("a+b", {}).get("series", {})
        f_ = doc["scenarios"].get("f", {}).get("series", {})
        print(f"| `{opts}` | {doc['args']['reps']} "
              f"| {median(a, 'stfs fresh', '{:.3f}')} | {median(a, 'squashfuse fresh', '{:.3f}')} "
              f"| {median(a, 'limit fresh', '{:.3f}')} "
              f"| {paired(a, 'squashfuse fresh', 'stfs fresh')} | {paired(a, 'limit fresh', 'stfs fresh')} "
              f"| {median(f_, 'stfs fresh', '{:.0f}')} | {median(f_, 'squashfuse fresh', '{:.0f}')} "
              f"| {median(f_, 'limit fresh', '{:.0f}')} | {paired(f_, 'squashfuse fresh', 'stfs fresh')} |")


if __name__ == "__main__":
    main()
