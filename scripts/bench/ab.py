#!/usr/bin/env python3
"""Two stfs builds side by side on scenario (a)'s read: mount, read every tensor file once in 1 MiB
reads (backing file in the page cache), unmount; the builds alternate each repetition (ABBA order), so
both see the same machine, and the median of the paired ratios says whether a change cost anything.

  python3 scripts/bench/ab.py --before OLD/stfs --after "$(scripts/cargo_bin --release --bin stfs)" --reps 20

--before-opts/--after-opts add mount arguments to one side, so one build can be measured against
itself on two transports (FUSE over io_uring needs the fuse module's enable_uring on):

  python3 scripts/bench/ab.py --before "$B" --after "$B" --after-opts=--io-uring --reps 10
  python3 scripts/bench/ab.py --before "$B" --after "$B" --after-opts=--io-uring --random 2000 --reps 10

--random N measures scenario (f)'s read instead: N first-touch random 4 KiB reads (distinct pages,
same offsets on both sides), on a fresh mount each time.

Needs root (mounts). The checkpoint is scenario (a)'s (checkpoint.py), built once under --workdir.
"""

import argparse
import json
import os
import random
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


def random_reads(mnt, offsets):
    """Reads 4 KiB at each (tensor path, offset); returns the bytes read."""
    total = 0
    fds = {}
    try:
        for name, at in offsets:
            if name not in fds:
                fds[name] = os.open(os.path.join(mnt, name), os.O_RDONLY)
            total += len(os.pread(fds[name], 4096, at))
    finally:
        for fd in fds.values():
            os.close(fd)
    return total


def one_run(binary, path, want_bytes, opts, offsets=None):
    """Seconds from `stfs mount` (the command that returns once the mount answers) to the last byte;
    with `offsets`, seconds of the random reads alone, on the fresh mount."""
    saved = list(mounts.STFS_EXTRA_ARGS)
    mounts.STFS_EXTRA_ARGS[:] = saved + opts
    try:
        started = time.perf_counter()
        with mounts.stfs(binary, path, foreground=False) as m:
            if offsets:
                started = time.perf_counter()
                got = random_reads(m.path, offsets)
            else:
                got = read_every_tensor(m.path)
            seconds = time.perf_counter() - started
    finally:
        mounts.STFS_EXTRA_ARGS[:] = saved
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
    p.add_argument("--before-opts", default="", help="extra `stfs mount` arguments for --before")
    p.add_argument("--after-opts", default="", help="extra `stfs mount` arguments for --after, e.g. --io-uring")
    p.add_argument("--random", type=int, default=0, metavar="N", help="N first-touch random 4 KiB reads instead")
    args = p.parse_args()

    ck = checkpoint.build(args.workdir, f"transformer-{args.size_mb}M",
                          checkpoint.transformer_layout(args.size_mb << 20), with_squashfs=False)
    tensors = checkpoint.read_header(ck["checkpoint"])
    want = sum(end - start for _, _, _, start, end in tensors)
    mounts.warm_page_cache([ck["checkpoint"]])
    offsets = None
    if args.random:
        with mounts.stfs(args.before, ck["checkpoint"], foreground=False) as m:
            with open(os.path.join(m.path, "metadata.json")) as f:
                infos = [(i["path"], os.path.getsize(os.path.join(m.path, i["path"])))
                         for i in json.load(f)["tensors"].values()]
        pages = [(p, k * 4096) for p, size in infos for k in range(size // 4096)]
        offsets = random.Random(42).sample(pages, min(args.random, len(pages)))
        want = 4096 * len(offsets)
    times = {"before": [], "after": []}
    builds = [("before", args.before, args.before_opts.split()), ("after", args.after, args.after_opts.split())]
    for rep in range(args.reps):
        for name, binary, opts in (builds if rep % 2 == 0 else builds[::-1]):
            times[name].append(one_run(binary, ck["checkpoint"], want, opts, offsets))
    print(f"os.getloadavg() at the end: {os.getloadavg()[0]:.2f}; {len(tensors)} tensors, {want / 2**20:.0f} MiB")
    for name, binary, opts in builds:
        v = times[name]
        print(f"{name:7} {binary} {' '.join(opts)}: median {statistics.median(v):.3f} s  [{min(v):.3f} - {max(v):.3f}]")
    ratios = [b / a for b, a in zip(times["before"], times["after"])]
    print(f"before / after, median of {len(ratios)} paired ratios: {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f} - {max(ratios):.3f}] (above 1: the change is faster)")


if __name__ == "__main__":
    main()
