#!/usr/bin/env python3
"""Two stfs builds side by side on scenario (a)'s read: mount, read every tensor file once in 1 MiB
reads (backing file in the page cache), unmount; the builds alternate each repetition (ABBA order), so
both see the same machine, and the median of the paired ratios says whether a change cost anything.

  python3 scripts/bench/ab.py --before OLD/stfs --after "$(scripts/cargo_bin --release --bin stfs)" --reps 20

Needs root (mounts). The checkpoint is scenario (a)'s (checkpoint.py), built once under --workdir.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checkpoint  # noqa: E402
import mounts  # noqa: E402

READ_BYTES = 1 << 20


def read_every_tensor(mnt):
    """Reads every tensor file of the mount once (found through metadata.json); returns the bytes read."""
    with open(os.path.join(mnt, "metadata.json")) as f:
        tensors = json.load(f)["tensors"]
    total = 0
    for info in tensors.values():
        with open(os.path.join(mnt, info["path"]), "rb", buffering=0) as f:
            while chunk := f.read(READ_BYTES):
                total += len(chunk)
    return total


def one_run(binary, path, want_bytes):
    """Seconds from `stfs mount` (the command that returns once the mount answers) to the last byte."""
    started = time.perf_counter()
    with mounts.stfs(binary, path, foreground=False) as m:
        got = read_every_tensor(m.path)
        seconds = time.perf_counter() - started
    if got != want_bytes:
        raise RuntimeError(f"{binary}: read {got} bytes, expected {want_bytes}")
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the stfs binary before the change")
    p.add_argument("--after", required=True, help="the stfs binary after the change")
    p.add_argument("--reps", type=int, default=20, help="repetitions of each build (default 20)")
    p.add_argument("--size-mb", type=int, default=1024, help="checkpoint size in MiB (default 1024)")
    p.add_argument("--workdir", default="/var/tmp/stfs-bench", help="where the checkpoint is built and cached")
    args = p.parse_args()

    ck = checkpoint.build(args.workdir, f"transformer-{args.size_mb}M",
                          checkpoint.transformer_layout(args.size_mb << 20), with_squashfs=False)
    tensors = checkpoint.read_header(ck["checkpoint"])
    want = sum(end - start for _, _, _, start, end in tensors)
    mounts.warm_page_cache([ck["checkpoint"]])
    times = {"before": [], "after": []}
    builds = [("before", args.before), ("after", args.after)]
    for rep in range(args.reps):
        for name, binary in (builds if rep % 2 == 0 else builds[::-1]):
            times[name].append(one_run(binary, ck["checkpoint"], want))
    print(f"os.getloadavg() at the end: {os.getloadavg()[0]:.2f}; {len(tensors)} tensors, {want / 2**20:.0f} MiB")
    for name, binary in builds:
        v = times[name]
        print(f"{name:7} {binary}: median {statistics.median(v):.3f} s  [{min(v):.3f} - {max(v):.3f}]")
    ratios = [b / a for b, a in zip(times["before"], times["after"])]
    print(f"before / after, median of {len(ratios)} paired ratios: {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f} - {max(ratios):.3f}] (above 1: the change is faster)")


if __name__ == "__main__":
    main()
