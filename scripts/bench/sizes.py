#!/usr/bin/env python3
"""The FUSE request size on another benchmark (issue 34, item 4): runs a benchmark command once per
fs.fuse.max_pages_limit value (256, 1024, 4096 pages: requests of 1, 4 and 16 MiB), in an order rotated per repetition, and prints
every series of the JSON the command wrote (`--json PATH` is appended to it) per limit: the median
over repetitions of each run's median, and the paired ratio of the 256-page run's to each (above 1:
faster than 1 MiB requests). Every stfs mount of the command asks for requests of that size
(`-o max_request_kb`, through the STFS_OPTIONS_ environment: stfs asks for 1 MiB by default). The
limit found is restored at the end. stfs itself never changes it. Needs root (the sysctl).

  python3 scripts/bench/sizes.py --reps 3 -- python3 scripts/bench/remote.py --size-mb 256 --reps 1 --no-disk-cache --stfs BIN
  python3 scripts/bench/sizes.py --reps 3 --series h -- python3 scripts/bench/run.py --only h --reps 1 --stfs BIN
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounts  # noqa: E402 - beside this script

LIMITS = (256, 1024, 4096)


def series_of(doc, prefix=""):
    """{name: [values]} of every "series" object anywhere in a benchmark's JSON, names prefixed with
    the keys that lead to it (run.py's scenario, loaders.py's source)."""
    found = {}
    if isinstance(doc, dict):
        for name, v in (doc.get("series") or {}).items():
            values = v["values"] if isinstance(v, dict) else v
            if values and all(isinstance(x, (int, float)) for x in values):
                found[prefix + name] = values
        for key, v in doc.items():
            if key != "series" and isinstance(v, dict):
                found.update(series_of(v, f"{prefix}{key}: " if key not in ("sources", "scenarios") else prefix))
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="runs of the command per limit (default 3)")
    p.add_argument("--series", default="", help="only series whose name contains this")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the benchmark command")
    a = p.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or os.geteuid() != 0:
        p.error("needs root and a command after --")
    runs = {}  # limit -> [{series: median of that run}]
    with mounts.max_pages_limit() as set_limit, tempfile.TemporaryDirectory(prefix="stfs-sizes-") as tmp:
        for rep in range(a.reps):
            for pages in LIMITS[rep % 3:] + LIMITS[:rep % 3]:
                set_limit(pages)
                out = os.path.join(tmp, f"{rep}-{pages}.json")
                print(f"rep {rep + 1}/{a.reps}, max_pages_limit {pages}: {' '.join(cmd)}", flush=True)
                env = dict(os.environ, STFS_OPTIONS_BENCH_REQUEST_SIZE=f"max_request_kb={pages * 4}")
                done = subprocess.run(cmd + ["--json", out], capture_output=True, text=True, env=env)
                if done.returncode != 0 or not os.path.exists(out):
                    sys.exit(f"the command failed (exit {done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
                with open(out) as f:
                    found = series_of(json.load(f))
                runs.setdefault(pages, []).append({k: statistics.median(v) for k, v in found.items() if a.series in k})
    names = sorted(set().union(*(r.keys() for rs in runs.values() for r in rs)))
    print(f"\n{'series':48} " + " ".join(f"{f'{p} pages ({p // 256} MiB)':>26}" for p in LIMITS))
    for name in names:
        cells = []
        for pages in LIMITS:
            vals = [r[name] for r in runs[pages] if name in r]
            base = [r[name] for r in runs[256] if name in r]
            ratio = statistics.median(b / v for b, v in zip(base, vals) if v) if vals and base else None
            cells.append(f"{statistics.median(vals):9.3f} ({ratio:.2f}x)" if vals and ratio else "-")
        print(f"{name[:48]:48} " + " ".join(f"{c:>26}" for c in cells))
    print("(x: the 256-page run's value over this one's, paired by repetition; above 1: lower than with 1 MiB requests)")


if __name__ == "__main__":
    sys.exit(main())
