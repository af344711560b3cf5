"""Scenario (h): tensor-parallel ranks, as an inference server (vLLM, SGLang, TGI) loads a checkpoint.
N rank processes (2, 4 and 8), each started on its own, `safe_open` the checkpoint and load their
1/N of every tensor with `get_slice`: a block of rows for even tensors, a block of columns (a piece
of every row) for odd ones. Directly on the slow store (slowfs) against the same ranks on the
checkpoint an stfs mount over the store re-serves (`MNT/model.safetensors`, mount time included),
and, as the floor, on the local file in the page cache.

The checkpoint is the one the issue measured: 32 F32 matrices written by the reference package
(`--tp-size-mb`, default 512). Each rank imports its libraries and waits for a go line first, so
interpreter start-up is not timed; the time is from the go to the last rank's last slice.
For diagnosis, every run records the store's range requests and bytes, and each stfs run the
daemon's counters (backing reads, cache misses, single-flight waits, prefetch, and the backing
request duration histogram).

Kept apart from scenarios.py (and registered into its SCENARIOS on import), like reserved.py.
Run as a script (`tp.py rank PATH RANK RANKS`) it is one rank.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_TIMEOUT_S = 900


def tp_layout(size_bytes, count=32):
    """`count` square F32 matrices of about `size_bytes` in all (sides a multiple of 64)."""
    import numpy as np

    side = max(64, int((size_bytes / count / 4) ** 0.5) // 64 * 64)
    return [(f"model.layers.{i}.weight", np.float32, (side, side)) for i in range(count)]


def rank_slices(names, rank, ranks):
    """(name, axis, start, stop) for each tensor this rank loads: rows for even, columns for odd."""
    out = []
    for i, (name, shape) in enumerate(names):
        axis = 0 if i % 2 == 0 else 1
        n = shape[axis]
        out.append((name, axis, n * rank // ranks, n * (rank + 1) // ranks))
    return out


def rank_main(path, rank, ranks):
    """One rank: opens the file, says ready, waits for `go`, loads its slices, prints one JSON line."""
    import numpy as np
    from safetensors import safe_open

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        sys.exit("no go")
    started = time.perf_counter()
    loaded = []
    with safe_open(path, framework="numpy") as f:
        names = [(name, f.get_slice(name).get_shape()) for name in f.keys()]
        names.sort(key=lambda item: int(item[0].split(".")[2]))
        for name, axis, start, stop in rank_slices(names, rank, ranks):
            sl = f.get_slice(name)
            loaded.append(sl[start:stop] if axis == 0 else sl[:, start:stop])
    seconds = time.perf_counter() - started
    # After the clock: a checksum of every element, compared with the local file's by the driver.
    checksum = sum(int(np.ascontiguousarray(a).view(np.uint32).sum(dtype=np.uint64)) for a in loaded)
    print(json.dumps({"rank": rank, "seconds": seconds, "checksum": checksum}), flush=True)


def expected_checksums(path, ranks):
    """Each rank's checksum from the local file, read without the slow store."""
    import numpy as np
    from safetensors import safe_open

    out = []
    with safe_open(path, framework="numpy") as f:
        names = sorted(((n, f.get_slice(n).get_shape()) for n in f.keys()), key=lambda it: int(it[0].split(".")[2]))
        for rank in range(ranks):
            total = 0
            for name, axis, start, stop in rank_slices(names, rank, ranks):
                t = f.get_slice(name)
                a = t[start:stop] if axis == 0 else t[:, start:stop]
                total += int(np.ascontiguousarray(a).view(np.uint32).sum(dtype=np.uint64))
            out.append(total)
    return out


def children_cpu():
    """User + system CPU seconds of this process's waited-for children so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid):
    """User + system CPU seconds of a running process (/proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run_ranks(path, ranks, expected):
    """Starts `ranks` rank processes on `path`, releases them at once; returns the wall seconds from
    the go to the last rank done, and the CPU seconds the ranks used in all (start-up included).
    A wrong checksum or a failed rank aborts the run."""
    cpu_before = children_cpu()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank", path, str(r), str(ranks)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a rank did not start")
        started = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a rank failed (exit {p.wait(timeout=STEP_TIMEOUT_S)})")
            results.append(json.loads(line))
        wall = time.perf_counter() - started
        for p in procs:
            if p.wait(timeout=STEP_TIMEOUT_S) != 0:
                raise RuntimeError("a rank failed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in results:
        if r["checksum"] != expected[r["rank"]]:
            raise RuntimeError(f"rank {r['rank']} of {ranks} loaded other bytes than the local file holds")
    return wall, children_cpu() - cpu_before


def _p50_ms(histogram):
    """Median of a stats.json microsecond histogram, as the upper bound of its bucket, in ms."""
    total = sum(histogram.values())
    if not total:
        return None
    seen = 0
    for key, count in histogram.items():
        seen += count
        if seen * 2 >= total:
            return float("inf") if key.startswith(">=") else int(key[1:]) / 1000
    return None


def _run(bench, impl, ranks, expected):
    import mounts

    ckpt = bench.tp_ckpt
    args = bench.args
    out = {}
    if impl == "local":
        # The floor: the same ranks on the local file in the page cache, no FUSE, no store.
        mounts.warm_page_cache([ckpt["checkpoint"]])
        out["total"], out["rank_cpu"] = run_ranks(ckpt["checkpoint"], ranks, expected)
        return out
    with mounts.slowfs(bench.slowfs, ckpt["checkpoint_dir"], args.slow_bandwidth_mbps, args.slow_latency_ms) as slow:
        name = os.path.basename(ckpt["checkpoint"])
        slow_file = os.path.join(slow.path, name)
        before = mounts.slowfs_stats(slow.path)
        store_cpu = process_cpu(slow.pid)
        if impl == "direct":
            out["total"], out["rank_cpu"] = run_ranks(slow_file, ranks, expected)
        else:
            with mounts.stfs(bench.stfs, slow_file) as m:
                wall, out["rank_cpu"] = run_ranks(os.path.join(m.path, name), ranks, expected)
                out["mount"] = m.mount_seconds
                out["total"] = m.mount_seconds + wall
                out["stats"] = mounts.stfs_stats(m.path)
                out["daemon_cpu"] = process_cpu(m.pid) if m.pid else None
        after = mounts.slowfs_stats(slow.path)
        if store_cpu is not None and process_cpu(slow.pid) is not None:
            out["store_cpu"] = process_cpu(slow.pid) - store_cpu
    out["slow_bytes"] = after["bytes"] - before["bytes"]
    out["slow_range_requests"] = after["range_requests"] - before["range_requests"]
    return out


def _prepare(bench):
    import checkpoint

    args = bench.args
    size_mb = args.tp_size_mb or (16 if args.quick else 512)
    if getattr(bench, "tp_ckpt", None) is None:
        print(f"preparing {size_mb} MiB checkpoint of 32 F32 matrices for (h)", flush=True)
        bench.tp_ckpt = checkpoint.build(args.workdir, f"tp-f32x32-{size_mb}M", tp_layout(size_mb << 20),
                                         with_squashfs=False)
    if not os.path.exists(bench.slowfs):
        print("building slowfs (cargo build --release --example slowfs)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "slowfs"],
                       cwd=os.path.dirname(os.path.dirname(HERE)), check=True, timeout=1800)


def scenario_tp(bench):
    """(h) N tensor-parallel ranks slicing every tensor: directly on slowfs vs on stfs's re-served file."""
    import mounts
    import scenarios
    from report import Results

    _prepare(bench)
    ckpt = bench.tp_ckpt
    args = bench.args
    rank_counts = [int(n) for n in (args.tp_ranks or ("2,8" if args.quick else "2,4,8")).split(",") if n.strip()]
    res = Results("h", f"tensor-parallel ranks slicing every tensor with get_slice (slowfs "
                       f"{args.slow_bandwidth_mbps:g} MB/s per handle, {args.slow_latency_ms:g} ms per range "
                       f"request), {ckpt['file_size'] / 2**20:.0f} MiB file of {len(ckpt['header'])} F32 matrices")
    if not bench.stfs:
        res.note("stfs binary not found: not measured")
        return res
    mounts.warm_page_cache([ckpt["checkpoint"]])
    expected = {n: expected_checksums(ckpt["checkpoint"], n) for n in rank_counts}
    res.note("each rank's slices are checked (a checksum of every element) against the local file's")
    for rep in range(bench.reps):
        for ranks in rank_counts:
            for impl in scenarios.rotated(["direct", "stfs", "local"], rep):
                run = _run(bench, impl, ranks, expected[ranks])
                label = f"{impl} {ranks} ranks"
                res.add(label, run["total"])
                if impl != "local":
                    res.add(f"{label} range requests", run["slow_range_requests"], "")
                    res.add(f"{label} storage bytes / file size", run["slow_bytes"] / ckpt["file_size"], "")
                res.add(f"{label} CPU of the ranks", run["rank_cpu"])
                if run.get("store_cpu") is not None:
                    res.add(f"{label} CPU of the store (slowfs)", run["store_cpu"])
                if run.get("daemon_cpu") is not None:
                    res.add(f"{label} CPU of the stfs daemon", run["daemon_cpu"])
                if run.get("mount") is not None:
                    res.add(f"{label} stfs mount time", run["mount"])
                stats = run.get("stats")
                if stats:
                    for key in ("backing_reads", "cache_misses", "single_flight_waits", "fuse_reads"):
                        res.add(f"{label} stfs {key}", stats.get(key, 0), "")
                    for key in ("prefetched_bytes", "prefetch_unused_bytes"):
                        res.add(f"{label} stfs {key}", stats.get(key, 0), "B")
                    p50 = _p50_ms(stats.get("backing_read_latency_us", {}))
                    if p50 is not None:
                        res.add(f"{label} stfs backing request p50 bucket (ms)", p50, "")
    for ranks in rank_counts:
        faster, slower = f"stfs {ranks} ranks", f"direct {ranks} ranks"
        if ranks == 8:
            res.ratio_check("(h) 8 ranks: stfs re-served vs direct (speed-up)", slower, faster, 4.0)
            res.value_check("(h) 8 ranks: stfs storage bytes / file size",
                            f"stfs {ranks} ranks storage bytes / file size", "<=", 1.1)
        else:
            scenarios.ratio_note(res, f"{ranks} ranks: stfs re-served vs direct (speed-up)", slower, faster)
        scenarios.ratio_note(res, f"{ranks} ranks: local page-cache floor vs stfs (how far stfs is from it)",
                             faster, f"local {ranks} ranks")
    res.note("wall seconds from releasing the ranks to the last rank done; stfs rows add the stfs mount time; "
             "local: the same ranks on the local file in the page cache (no FUSE, no store), the floor of "
             "this machine for the ranks' own work")
    return res


def register():
    """Adds (h) and its options to the driver."""
    import scenarios

    scenarios.SCENARIOS["h"] = scenario_tp


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "rank":
    rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
elif __name__ != "__main__":
    register()
