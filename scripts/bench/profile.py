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
  faults  `perf record -e page-faults -c 1 -g -p PID`: every page fault of the daemon, by thread
          group and by the code that touched the page (a kernel copy into a user buffer, or the
          user-space function)
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
import re
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
import checkpoint  # noqa: E402
import mounts  # noqa: E402
import scenarios  # noqa: E402

EVENTS = "task-clock,page-faults,minor-faults,major-faults,context-switches,cpu-migrations"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=["stfs", "squashfuse", "limit", "mmap-reply"], required=True)
    p.add_argument("--scenario", choices=["a", "f"], required=True)
    p.add_argument("--tool", choices=["stat", "record", "faults", "strace", "none"], default="stat")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--rand-count", type=int, default=2000)
    p.add_argument("--stfs", default=cargo_paths.binary("stfs", profile="profiling"))
    p.add_argument("--stfs-opts", default="", metavar="ARGS")
    p.add_argument("--limitfs", default=cargo_paths.binary("limitfs", profile="profiling", example=True))
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
    elif args.variant == "limit":
        with mounts.limitfs(args.limitfs, ckpt["checkpoint"]) as m:
            yield m
    else:
        mounts.warm_page_cache([ckpt["checkpoint"]])
        with mounts.limitfs(args.limitfs, ckpt["checkpoint"], ["--backing"]) as m:
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
    elif args.tool == "faults":
        procs.append(subprocess.Popen(["perf", "record", "-e", "page-faults", "-c", "1", "-g", "-p", str(pid),
                                       "-o", os.path.join(run_dir, "faults.data")],
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


SAMPLE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")

# Rough classes of leaf symbols, to say where a daemon's CPU goes (first match wins).
CLASSES = [
    ("copy: kernel memcpy (reply into page cache / pipe)", ("__pi_memcpy", "memcpy_orig", "fuse_copy", "copy_page")),
    ("copy: pread/preadv into user buffers", ("_copy_to_iter", "copy_user", "rep_movs", "filemap_read",
                                              "filemap_get_read_batch", "copy_page_to_iter")),
    ("copy: user-space memcpy/memmove", ("__memmove", "__memcpy", "memcpy", "memmove")),
    ("pinning reply pages (get_user_pages)", ("gup_", "__iov_iter_get_pages", "iov_iter_extract", "follow_page",
                                              "try_grab", "pin_user")),
    ("fresh memory: faults, clearing, charging, page alloc", (
        "clear_page", "do_anonymous_page", "__handle_mm_fault", "handle_mm_fault", "exc_page_fault",
        "memcg", "charge", "__alloc", "alloc_pages", "get_page_from_freelist", "rmqueue", "prep_new_page",
        "folio_add_new_anon", "lru", "__mod_", "count_memcg", "___pte", "pte_", "do_user_addr_fault",
        "free_", "folios_put", "release_pages", "zap_", "unmap", "madvise", "mmap", "munmap")),
    ("scheduling, wake-ups, futex", ("finish_task_switch", "schedule", "futex", "try_to_wake_up", "wake_up",
                                     "__wake", "enqueue", "dequeue", "select_task", "pick_next", "update_",
                                     "ttwu", "raw_spin", "_raw_", "pv_queued", "native_queued", "syscall",
                                     "lock_contended", "__lll", "pthread_cond", "sched_")),
]


def classify(sym, dso):
    for name, prefixes in CLASSES:
        if any(p in sym for p in prefixes):
            return name
    if dso.endswith(("stfs", "limitfs", "squashfuse")) or "libsquashfuse" in dso or "libfuse" in dso:
        return "the daemon's own code (" + os.path.basename(dso) + ")"
    return "other kernel" if "kernel" in dso else "other user space (" + os.path.basename(dso) + ")"


def aggregate(data, pid, reader_comm, freq):
    """Leaf-symbol samples from `perf script`: the daemon's (by pid), the reader's (by comm) and per
    process. (perf report's --pid/--comm filters drop samples when the sort key has no thread.)"""
    text = subprocess.run(["perf", "script", "-i", data, "-G", "-F", "comm,pid,tid,ip,sym,dso"],
                          capture_output=True, text=True, timeout=900).stdout
    daemon, reader, threads, classes, procs = {}, {}, {}, {}, {}
    total = 0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        comm, spid, _tid, _ip, sym, dso = m.groups()
        total += 1
        kind = "[k]" if "kernel" in dso else "[.]"
        key = f"{kind} {sym or '[unknown]'}"
        procs[comm.rstrip("-0123456789 ") or comm] = procs.get(comm.rstrip("-0123456789 ") or comm, 0) + 1
        if int(spid) == pid:
            daemon[key] = daemon.get(key, 0) + 1
            group = comm.rstrip("-0123456789") or comm
            threads[group] = threads.get(group, 0) + 1
            cls = classify(sym, dso)
            classes[cls] = classes.get(cls, 0) + 1
        elif comm == reader_comm:
            reader[key] = reader.get(key, 0) + 1
    ms = 1000 / freq
    srt = lambda d: sorted(d.items(), key=lambda kv: -kv[1])  # noqa: E731
    return {
        "samples_total": total, "sample_ms": ms,
        "daemon_samples": sum(daemon.values()), "reader_samples": sum(reader.values()),
        "daemon_symbols": srt(daemon), "reader_symbols": srt(reader),
        "daemon_threads": srt(threads), "daemon_classes": srt(classes), "processes": srt(procs),
    }


FAULT_PLUMBING = ("asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "handle_mm_fault",
                  "__handle_mm_fault", "handle_pte_fault", "do_anonymous_page", "do_pte_missing", "do_fault",
                  "lock_mm_and_find_vma", "do_read_fault", "filemap_map_pages", "do_wp_page")


def fault_sites(data):
    """Page faults by (thread group, site): the first frame above the fault handling."""
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,ip,sym,dso"],
                          capture_output=True, text=True, timeout=900).stdout
    sites, total = {}, 0
    for record in text.split("\n\n"):
        lines = [line for line in record.splitlines() if line.strip()]
        if not lines:
            continue
        group = lines[0].split()[0].rstrip("-0123456789") or lines[0].split()[0]
        frames = []
        for line in lines[1:]:
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                frames.append(parts[1].rsplit(" (", 1)[0])
        above = [f for f in frames if not f.startswith(FAULT_PLUMBING)]
        site = " <- ".join(above[:2]) if above else "?"
        total += 1
        sites[(group, site)] = sites.get((group, site), 0) + 1
    return total, sorted(sites.items(), key=lambda kv: -kv[1])


def format_table(pairs, total, ms, n):
    rows = [f"  {100 * c / total:6.2f}%  {c * ms:8.1f} ms  {name}" for name, c in pairs[:n]] if total else []
    return "\n".join(rows)


def report(args, run_dir, pid):
    """Aggregates the perf.data of this run; writes report.txt."""
    agg = aggregate(os.path.join(run_dir, "perf.data"), pid, "cat" if args.scenario == "a" else "python3",
                    args.freq)
    d, r, ms = agg["daemon_samples"], agg["reader_samples"], agg["sample_ms"]
    text = "\n".join([
        f"daemon CPU: {d * ms:.0f} ms ({d} cpu-clock samples at {args.freq} Hz); reader CPU: {r * ms:.0f} ms",
        "-- daemon by thread group", format_table(agg["daemon_threads"], d, ms, 20),
        "-- daemon by class of leaf symbol (approximate)", format_table(agg["daemon_classes"], d, ms, 20),
        f"-- daemon top {args.top} symbols (self)", format_table(agg["daemon_symbols"], d, ms, args.top),
        f"-- reader top {min(args.top, 12)} symbols (self)", format_table(agg["reader_symbols"], r, ms, min(args.top, 12)),
        "-- whole machine by process (other engineers' jobs included)",
        format_table(agg["processes"], agg["samples_total"], ms, 8),
    ])
    with open(os.path.join(run_dir, "report.txt"), "w") as f:
        f.write(text + "\n")
    return agg, text


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
        if args.tool == "faults":
            total, sites = fault_sites(os.path.join(run_dir, "faults.data"))
            summary["fault_sites"] = [[g, site, n] for (g, site), n in sites[:40]]
            print(f"-- daemon page faults: {total} ({total * 4 / 1024:.0f} MiB of 4 KiB pages)")
            for (g, site), n in sites[:args.top]:
                print(f"  {n:8d}  {100 * n / max(total, 1):5.1f}%  {g}: {site}")
        if args.tool == "record":
            agg, text = report(args, run_dir, pid)
            summary["profile"] = {k: v for k, v in agg.items()}
            print(text)
        if "stfs_stats" in summary:
            s = summary["stfs_stats"]
            print("-- stfs stats: " + ", ".join(f"{k}={s.get(k)}" for k in (
                "fuse_reads", "fuse_read_bytes", "backing_reads", "backing_read_bytes", "cache_hits",
                "cache_misses", "single_flight_waits", "prefetched_bytes", "peak_resident_bytes",
                "mapped_reads", "mapped_read_bytes", "mapping_releases")))
        if "limit_stats" in summary:
            print(f"-- limitfs counters: {json.dumps(summary['limit_stats'])}")
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        summaries.append(summary)


if __name__ == "__main__":
    main()
