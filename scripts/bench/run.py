#!/usr/bin/env python3
"""stfs benchmark driver: builds checkpoints, runs the scenarios side by side, prints medians and target ratios.

Scenarios (select with --only, e.g. --only a,c):
  a  fresh mount, read every tensor once (backing in page cache): stfs vs squashfuse vs local cat
  b  second read through the same mount (kernel page cache): stfs vs local cat
  c  slow storage (slowfs): safe_open reference vs stfs; (i) file order, (ii) 4 forked workers, (iii) shuffled
  d  memory: stream 4x the cache size through stfs; daemon VmHWM
  e  scale: 20,000-tensor checkpoint: stfs mount time and `ls -l`
  f  first-touch random 4 KiB reads, fresh mount: stfs vs squashfuse
  g  the checkpoint re-served: safe_open on MNT/model.safetensors vs on slowfs directly; (i) file order,
     (ii) 4 workers forked after safe_open (scripts/bench/reserved.py)
  h  tensor-parallel ranks: 2, 4 and 8 rank processes each get_slice their 1/N of every tensor, on
     MNT/model.safetensors vs on slowfs directly (scripts/bench/ranks.py)
(a) and (f) also measure the limit row: examples/limitfs, a FUSE server answering every read from one
pre-faulted buffer holding the checkpoint's bytes, with stfs's kernel settings (what the kernel's FUSE
path costs by itself for this data); (a) also the hot-buffer limit (every read from the same 16 MiB).
Needs root (mounts). Without an stfs binary the stfs rows are skipped and the references still run.
Method and targets: docs/notes/benchmarks.md.
"""

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
import checkpoint  # noqa: E402
import mounts  # noqa: E402
import report  # noqa: E402
import scenarios  # noqa: E402
import reserved  # noqa: E402,F401  (registers scenario g)
import ranks  # noqa: E402,F401  (registers scenario h)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="a,b,c,d,e,f,g,h", help="comma-separated scenarios (default: all)")
    p.add_argument("--reps", type=int, help="repetitions per variant (default 10; --quick: 2)")
    p.add_argument("--size-mb", type=int, help="main checkpoint size in MiB (default 1024; --quick: 16)")
    p.add_argument("--slow-size-mb", type=int, help="checkpoint size for (c) (default: --size-mb)")
    p.add_argument("--scale-tensors", type=int, help="tensors in the scale checkpoint (default 20000; --quick: 2000)")
    p.add_argument("--rand-count", type=int, help="random 4 KiB reads per run in (f) (default 2000; --quick: 200)")
    p.add_argument("--mem-cache-mb", type=int, help="stfs cache size in (d) (default: a quarter of the checkpoint)")
    p.add_argument("--slow-bandwidth-mbps", type=float, default=200.0, help="slowfs MB/s per handle")
    p.add_argument("--slow-latency-ms", type=float, default=10.0, help="slowfs cost per range request")
    p.add_argument("--quick", action="store_true", help="smoke mode: tiny sizes, 2 reps, about a minute")
    p.add_argument("--stfs-opts", default="", metavar="ARGS",
                   help="extra arguments for every `stfs mount`, e.g. \"--block-size 256K\" (for tuning runs)")
    p.add_argument("--stfs", default=cargo_paths.binary("stfs"), help="stfs binary")
    p.add_argument("--slowfs", default=cargo_paths.binary("slowfs", example=True),
                   help="slowfs binary (built with cargo if missing)")
    p.add_argument("--limitfs", default=cargo_paths.binary("limitfs", example=True),
                   help="limitfs binary for the limit row of (a) and (f) (built with cargo if missing; "
                        "the row is skipped if that fails)")
    p.add_argument("--limit-opts", default="", metavar="ARGS",
                   help="extra arguments for every limitfs mount, e.g. \"--threads 4\" (default: stfs's defaults)")
    p.add_argument("--no-limit", action="store_true", help="skip the limit row")
    p.add_argument("--mmap-row", action="store_true",
                   help="also measure limitfs --backing in (a) and (f): reads answered from an mmap of the "
                        "checkpoint (a prototype of replying straight from the backing file's page cache)")
    p.add_argument("--workdir", default="/var/tmp/stfs-bench", help="where checkpoints are built and cached")
    p.add_argument("--json", metavar="OUT", help="also write all raw figures as JSON")
    args = p.parse_args()
    defaults = {"reps": (10, 2), "size_mb": (1024, 16), "scale_tensors": (20000, 2000), "rand_count": (2000, 200)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.only = sorted({s.strip() for s in args.only.split(",") if s.strip()})
    unknown = set(args.only) - set(scenarios.SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return args


def ensure_tools(args):
    """Installs squashfuse/squashfs-tools with apt-get if needed and builds slowfs if missing."""
    if {"a", "b", "f"} & set(args.only) and not (shutil.which("squashfuse") and shutil.which("mksquashfs")):
        print("installing squashfuse and squashfs-tools with apt-get", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "squashfuse", "squashfs-tools"], check=True, env=env,
                       timeout=900, stdout=subprocess.DEVNULL)
    if "c" in args.only and not os.path.exists(args.slowfs):
        print("building slowfs (cargo build --release --example slowfs)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "slowfs"], cwd=REPO, check=True, timeout=1800)
    if {"a", "b", "f"} & set(args.only) and not args.no_limit and not os.path.exists(args.limitfs):
        print("building limitfs (cargo build --release --example limitfs)", flush=True)
        try:
            subprocess.run(["cargo", "build", "--release", "--example", "limitfs"], cwd=REPO, check=True,
                           timeout=1800)
        except (OSError, subprocess.SubprocessError) as err:
            print(f"limitfs not built ({err}): the limit row is skipped", flush=True)


class Bench:
    """Everything the scenarios need: arguments, tool paths and the prepared checkpoints."""

    def __init__(self, args):
        self.args = args
        self.reps = args.reps
        self.slowfs = args.slowfs
        self.stfs = args.stfs if os.access(args.stfs, os.X_OK) else None
        self.limitfs = None if args.no_limit or not os.access(args.limitfs, os.X_OK) else args.limitfs
        self.ckpt = None
        self.slow_ckpt = None
        self.scale_ckpt = None


def machine_info():
    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return None
    import numpy
    import safetensors
    return {
        "kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "numpy": numpy.__version__, "safetensors": safetensors.__version__,
        "squashfuse": version(["dpkg-query", "-W", "squashfuse"]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main():
    args = parse_args()
    if os.geteuid() != 0:
        sys.exit("run.py needs root (it mounts FUSE filesystems and squashfs images)")
    ensure_tools(args)
    mounts.STFS_EXTRA_ARGS = shlex.split(args.stfs_opts)
    mounts.LIMITFS_EXTRA_ARGS = shlex.split(args.limit_opts)
    report.JUDGED = not args.quick
    bench = Bench(args)
    print(f"stfs: {bench.stfs or 'not found at ' + args.stfs + ' (stfs rows skipped)'}", flush=True)
    if {"a", "b", "f"} & set(args.only):
        print(f"limitfs: {bench.limitfs or 'not used (limit row skipped)'}", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    needs_main = {"a", "b", "d", "f"} & set(args.only) or ("c" in args.only and not args.slow_size_mb)
    started = time.perf_counter()
    if needs_main:
        print(f"preparing {args.size_mb} MiB checkpoint in {args.workdir}", flush=True)
        bench.ckpt = checkpoint.build(args.workdir, f"transformer-{args.size_mb}M",
                                      checkpoint.transformer_layout(args.size_mb << 20),
                                      with_squashfs=bool({"a", "b", "f"} & set(args.only)))
    if "c" in args.only:
        slow_mb = args.slow_size_mb or args.size_mb
        if bench.ckpt is not None and slow_mb == args.size_mb:
            bench.slow_ckpt = bench.ckpt
        else:
            print(f"preparing {slow_mb} MiB checkpoint for (c)", flush=True)
            bench.slow_ckpt = checkpoint.build(args.workdir, f"transformer-{slow_mb}M",
                                               checkpoint.transformer_layout(slow_mb << 20), with_squashfs=False)
    if "e" in args.only:
        print(f"preparing {args.scale_tensors}-tensor checkpoint", flush=True)
        bench.scale_ckpt = checkpoint.build(args.workdir, f"small-{args.scale_tensors}",
                                            checkpoint.many_small_layout(args.scale_tensors), with_squashfs=False)
    print(f"checkpoints ready in {time.perf_counter() - started:.1f} s", flush=True)

    all_results, done = [], set()
    for key in args.only:
        runner = scenarios.SCENARIOS[key]
        if runner in done:  # a and b share one interleaved run
            continue
        done.add(runner)
        t0 = time.perf_counter()
        print(f"running scenario {key} ({args.reps} reps)...", flush=True)
        results = runner(bench)
        results.note(f"scenario took {time.perf_counter() - t0:.1f} s")
        report.print_results(results, sys.stdout)
        sys.stdout.flush()
        all_results.append(results)

    if args.quick:
        print("\nfigures not judged (a --quick smoke run: toy sizes; judge a full run)")
    else:
        failed = [c["label"] for r in all_results for c in r.checks if c["status"] == "FAIL"]
        print(f"\n{len(failed)} target(s) missed" + (": " + "; ".join(failed) if failed else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine_info(), "stfs": bench.stfs,
                       "scenarios": {r.key: r.to_json() for r in all_results}}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
