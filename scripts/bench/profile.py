#!/usr/bin/env python3
"""Profiles one FUSE daemon (stfs, squashfuse or the limit row's limitfs) during scenario (a) or (f).

Each run: make the backing file resident, mount fresh, attach the tool to the daemon, run the
workload once ((a): `cat` of every tensor file in file order; (f): load.py's first-touch random
4 KiB preads), detach, unmount. Tools (--tool):
  stat    `perf stat -p PID`: task-clock, page-faults, context switches, migrations of the daemon,
          and (system-wide, separately) the same for everything
  record  `perf record -a -g -e cpu-clock` (no hardware PMU on this VM), then `perf report` top
          symbols of the daemon's pid, of the reader (`cat`/python) and of everything
  strace  `strace -c -f -p PID`: syscall counts of the daemon's threads (futex waits = lock waits
          and hand-offs; readv/read/writev on /dev/fuse = requests and replies). Slows the daemon
          down: use it for counts, not times.
  none    just the timing (and stfs's stats.json / limitfs's counters)
Output: a directory per run under --out with the raw files and a summary.json; the text reports
are printed. Needs root. Uses the checkpoint that run.py builds (same --workdir, --size-mb).

Examples:
  python3 scripts/bench/profile.py --variant stfs --scenario a --tool record
  python3 scripts/bench/profile.py --variant squashfuse --scenario f --tool stat --reps 3
  python3 scripts/bench/profile.py --variant stfs --scenario a --tool stat --stfs-opts "--threads 2"
"""

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import checkpoint  # noqa: E402
import mounts  # noqa: E402
import scenarios  # noqa: E402

EVENTS = "task-clock,page-faults,minor-faults,major-faults,context-switches,cpu-migrations"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=["stfs", "squashfuse", "limit"], required=True)
    p.add_argument("--scenario", choices=["a", "f"], required=True)
    p.add_argument("--tool", choices=["stat", "record", "strace", "none"], default="stat")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--rand-count", type=int, default=2000)
    p.add_argument("--stfs", default=os.path.join(REPO, "target", "release", "stfs"))
    p.add_argument("--stfs-opts", default="", metavar="ARGS")
    p.add_argument("--limitfs", default=os.path.join(REPO, "target", "release", "examples", "limitfs"))
    p.add_argument("--limit-opts", default="", metavar="ARGS")
    p.add_argument("--workdir", default="/var/tmp/stfs-bench")
    p.add_argument("--out", default="/var/tmp/stfs-prof")
    p.add_argument("--freq", type=int, default=2000, help="perf record sampling frequency (cpu-clock)")
    p.add_argument("--top", type=int, default=25, help="symbols per perf report")
    return p.parse_args()


@contextlib.contextmanager
def mounted(args, ckpt):
    if args.variant == "stfs":
        mounts.warm_page_cache([ckpt["checkpoint"]])
        with mounts.stfs(args.stfs, ckpt["checkpoint"]) as m:
            yield m
    elif args.variant == "squashfuse":
        mounts.warm_page_cache([ckpt["squashfs"]])
        with mounts.squashfuse(ckpt["squashfs"]) as m:
            yield m
    else:
        with mounts.limitfs(args.limitfs, ckpt["checkpoint"]) as m:
            yield m


def workload(args, ckpt, mnt, rep):
    """Runs the scenario's reader once; returns its time (s for (a), µs per read for (f))."""
    if args.scenario == "a":
        return scenarios.cat_files(scenarios.tensor_paths(mnt, ckpt))
    _, seconds = scenarios.run_load("rand", mnt, ckpt["checkpoint"], count=args.rand_count, seed=42 + rep)
    return seconds / args.rand_count * 1e6


def start_tool(args, pid, run_dir):
    """Starts the measuring processes; returns them (to be stopped with SIGINT)."""
    procs = []
    if args.tool == "stat":
        procs.append(subprocess.Popen(["perf", "stat", "-e", EVENTS, "-p", str(pid), "-o",
                                       os.path.join(run_dir, "stat-daemon.txt")], stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["perf", "stat", "-a", "-e", EVENTS, "-o",
                                       os.path.join(run_dir, "stat-system.txt")], stderr=subprocess.DEVNULL))
    elif args.tool == "record":
        procs.append(subprocess.Popen(["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", str(args.freq),
                                       "-o", os.path.join(run_dir, "perf.data")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    elif args.tool == "strace":
        procs.append(subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o",
                                       os.path.join(run_dir, "strace.txt")], stderr=subprocess.DEVNULL))
    time.sleep(0.5 if procs else 0)  # let them attach
    return procs


def stop_tool(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def report(args, run_dir, pid):
    """perf report text files for the daemon, the readers and everything."""
    data = os.path.join(run_dir, "perf.data")
    out = {}
    common = ["perf", "report", "-i", data, "--stdio", "--no-children", "--percent-limit", "0.3"]
    jobs = {
        "daemon-symbols": ["--pid", str(pid), "--sort", "sym"],
        "daemon-threads": ["--pid", str(pid), "--sort", "comm", "-g", "none"],
        "all-comm": ["--sort", "comm,dso", "-g", "none"],
        "all-symbols": ["--sort", "comm,sym", "-g", "none"],
        "daemon-callers": ["--pid", str(pid), "--sort", "sym", "-g", "graph,0.5,callee,function,percent",
                           "--max-stack", "12"],
    }
    for name, extra in jobs.items():
        text = subprocess.run(common + extra + (["-g", "none"] if name == "daemon-symbols" else []),
                              capture_output=True, text=True, timeout=600).stdout
        with open(os.path.join(run_dir, f"report-{name}.txt"), "w") as f:
            f.write(text)
        out[name] = text
    return out


def top_lines(text, n):
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return "\n".join(lines[:n])


def main():
    args = parse_args()
    if os.geteuid() != 0:
        sys.exit("profile.py needs root")
    mounts.STFS_EXTRA_ARGS = shlex.split(args.stfs_opts)
    mounts.LIMITFS_EXTRA_ARGS = shlex.split(args.limit_opts)
    ckpt = checkpoint.build(args.workdir, f"transformer-{args.size_mb}M",
                            checkpoint.transformer_layout(args.size_mb << 20), with_squashfs=True)
    tag = "-".join(filter(None, [args.variant, args.scenario, args.tool,
                                 args.stfs_opts.replace(" ", "").replace("--", "_") if args.variant == "stfs" else ""]))
    summaries = []
    for rep in range(args.reps):
        run_dir = os.path.join(args.out, f"{tag}-{time.strftime('%H%M%S')}-{rep}")
        os.makedirs(run_dir, exist_ok=True)
        summary = {"variant": args.variant, "scenario": args.scenario, "tool": args.tool, "rep": rep,
                   "stfs_opts": args.stfs_opts, "loadavg_before": open("/proc/loadavg").read().split()[:3]}
        with mounted(args, ckpt) as m:
            summary["threads"] = len(os.listdir(f"/proc/{m.pid}/task"))
            procs = start_tool(args, m.pid, run_dir)
            try:
                summary["time"] = workload(args, ckpt, m.path, rep)
            finally:
                stop_tool(procs)
            if args.variant == "stfs":
                summary["stfs_stats"] = mounts.stfs_stats(m.path)
            pid = m.pid
        if m.stats:
            summary["limit_stats"] = m.stats
        summary["unit"] = "s" if args.scenario == "a" else "us/read"
        print(f"== {run_dir}: {summary['time']:.3f} {summary['unit']} ({summary['threads']} daemon threads, "
              f"load {' '.join(summary['loadavg_before'])})")
        for name in ("stat-daemon.txt", "stat-system.txt", "strace.txt"):
            path = os.path.join(run_dir, name)
            if os.path.exists(path):
                text = open(path).read()
                summary[name] = text
                print(f"-- {name}\n{text.strip()}")
        if args.tool == "record":
            reports = report(args, run_dir, pid)
            for name in ("daemon-symbols", "all-comm", "all-symbols"):
                print(f"-- {name}\n{top_lines(reports[name], args.top)}")
        if "stfs_stats" in summary:
            s = summary["stfs_stats"]
            print("-- stfs stats: " + ", ".join(f"{k}={s.get(k)}" for k in (
                "fuse_reads", "fuse_read_bytes", "backing_reads", "backing_read_bytes", "cache_hits",
                "cache_misses", "single_flight_waits", "prefetched_bytes", "peak_resident_bytes")))
        if "limit_stats" in summary:
            print(f"-- limitfs counters: {json.dumps(summary['limit_stats'])}")
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        summaries.append(summary)


if __name__ == "__main__":
    main()
