"""Scenario (h): tensor-parallel ranks. N rank processes (2, 4, 8), started together, each
`safe_open` the checkpoint (framework numpy) and load their 1/N of every tensor with `get_slice`,
as an inference server's tensor-parallel workers do: a block of rows for the even tensors, a block
of columns (a piece of every row) for the odd ones. Directly on the slow store (slowfs) against the
same ranks on the checkpoint an stfs mount over the store re-serves (`MNT/model.safetensors`),
beside two rows saying what bounds stfs: stfs over a store that costs nothing, and the ranks on the
local file in the page cache. The checkpoint: 32 F32 matrices written by safetensors' own `save_file` (checkpoint.py).

Kept apart from scenarios.py (and registered into its SCENARIOS on import) so that it merges
cleanly with edits to the other scenarios. Run as a script, this file is one rank:
`ranks.py CHECKPOINT RANK WORLD` prints one JSON line.
"""

import json
import os
import subprocess
import sys
import time

import checkpoint
import interleave
import mounts
import scenarios
from report import Results

WORLDS = (2, 4, 8)
TENSORS = 32
TARGET_SPEEDUP = 4.0  # at 8 ranks
TARGET_STORE_BYTES = 1.1  # store bytes / file size
LABELS = {"direct": "direct", "stfs": "re-served", "local": "local file in page cache (floor)",
          "instant": "re-served, instant store"}


def layout(size_bytes):
    """32 square-ish F32 matrices of about `size_bytes` in all (rows and columns multiples of 8)."""
    import numpy as np

    per = size_bytes // TENSORS // 4
    cols = max(64, int(per ** 0.5) // 64 * 64)
    rows = max(8, per // cols // 8 * 8)
    return [(f"model.layers.{i // 4}.w{i % 4}.weight", np.float32, (rows, cols)) for i in range(TENSORS)]


def _rank_main(path, rank, world):
    """One rank: its slice of every tensor (rows for even tensors, columns for odd), in file order,
    after saying "ready" (imports done) and reading the parent's "go" on stdin."""
    from safetensors import safe_open

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit("no go from the driver")
    started = time.perf_counter()
    loaded = 0
    with safe_open(path, framework="numpy") as f:
        for i, name in enumerate(f.keys()):
            part = f.get_slice(name)
            rows, cols = part.get_shape()
            if i % 2 == 0:
                block = part[rank * rows // world:(rank + 1) * rows // world]
            else:
                block = part[:, rank * cols // world:(rank + 1) * cols // world]
            loaded += block.nbytes  # get_slice copies the block out of the mapping: every element read
    print(json.dumps({"seconds": time.perf_counter() - started, "bytes": loaded}), flush=True)


def run_ranks(path, world, timeout=scenarios.STEP_TIMEOUT_S):
    """Starts `world` rank processes on `path`, waits until every one has its modules imported
    (interpreter start-up is no part of the load, and on a loaded machine it would dominate), then
    lets them all go at once. Returns (seconds from the go until the last rank ends, bytes the
    ranks loaded). Fails if a rank fails; every wait is bounded by `timeout`."""
    import selectors

    cmd = [sys.executable, os.path.abspath(__file__), path]
    deadline = time.monotonic() + timeout
    procs = [subprocess.Popen(cmd + [str(rank), str(world)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(world)]
    try:
        for proc in procs:
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.1, deadline - time.monotonic())) or proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a rank did not start: {proc.poll()}")
        started = time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            if proc.returncode != 0:
                raise RuntimeError(f"rank failed ({proc.returncode}): {err.strip()[-500:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        seconds = time.perf_counter() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return seconds, sum(o["bytes"] for o in outs)


def _prepare(bench):
    args = bench.args
    size_mb = 16 if args.quick else 512
    if getattr(bench, "ranks_ckpt", None) is None:
        print(f"preparing {size_mb} MiB checkpoint of {TENSORS} F32 tensors for (h)", flush=True)
        bench.ranks_ckpt = checkpoint.build(args.workdir, f"ranks-{size_mb}M", layout(size_mb << 20),
                                            with_squashfs=False)
    if not os.path.exists(bench.slowfs):
        print("building slowfs (cargo build --release --example slowfs)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "slowfs"],
                       cwd=os.path.dirname(os.path.dirname(scenarios.HERE)), check=True, timeout=1800)


def _run(bench, impl, world):
    """The ranks through a fresh slowfs mount, directly (`direct`) or on stfs's re-served file
    (`stfs`; `instant`: over a slowfs with no latency and no bandwidth limit, what the store costs),
    or on the local checkpoint in the page cache (`local`: no store, no FUSE, the floor)."""
    ckpt = bench.ranks_ckpt
    out = {}
    if impl == "local":
        out["total"], out["loaded"] = run_ranks(ckpt["checkpoint"], world)
        return out
    bandwidth, latency = bench.args.slow_bandwidth_mbps, bench.args.slow_latency_ms
    if impl == "instant":
        bandwidth, latency = 1e6, 0.0
    with mounts.slowfs(bench.slowfs, ckpt["checkpoint_dir"], bandwidth, latency) as slow:
        name = os.path.basename(ckpt["checkpoint"])
        slow_file = os.path.join(slow.path, name)
        before = mounts.slowfs_stats(slow.path)
        if impl == "direct":
            out["total"], out["loaded"] = run_ranks(slow_file, world)
        else:
            with mounts.stfs(bench.stfs, slow_file) as m:
                out["total"], out["loaded"] = run_ranks(os.path.join(m.path, name), world)
                out["total"] += m.mount_seconds
                out["stfs"] = mounts.stfs_stats(m.path)
        after = mounts.slowfs_stats(slow.path)
    out["slow_bytes"] = after["bytes"] - before["bytes"]
    out["slow_range_requests"] = after["range_requests"] - before["range_requests"]
    return out


def scenario_ranks(bench):
    """(h) 2, 4 and 8 tensor-parallel ranks slicing every tensor: re-served file vs slowfs directly."""
    _prepare(bench)
    ckpt = bench.ranks_ckpt
    args = bench.args
    res = Results("h", f"tensor-parallel ranks, get_slice of every tensor (slowfs {args.slow_bandwidth_mbps:g} "
                       f"MB/s per handle, {args.slow_latency_ms:g} ms per range request), "
                       f"{ckpt['file_size'] / 2**20:.0f} MiB file of {TENSORS} F32 tensors")
    if not bench.stfs:
        res.note("stfs binary not found: not measured")
        return res
    mounts.warm_page_cache([ckpt["checkpoint"]])
    worlds = (2, 8) if args.quick else WORLDS
    counters = {}
    for rep in range(bench.reps):
        for world in worlds:
            for impl in interleave.balanced(["direct", "stfs", "local", "instant"], rep):
                run = _run(bench, impl, world)
                if run["loaded"] != ckpt["data_bytes"]:
                    raise RuntimeError(f"(h) {world} ranks loaded {run['loaded']} bytes, not {ckpt['data_bytes']}")
                label = f"{world} ranks {LABELS[impl]}"
                res.add(label, run["total"])
                if impl in ("local", "instant"):
                    continue
                res.add(f"{label} range requests", run["slow_range_requests"], "")
                res.add(f"{label} storage bytes / file size", run["slow_bytes"] / ckpt["file_size"], "")
                if impl == "stfs":
                    counters[world] = run["stfs"]
    for world in worlds:
        target = TARGET_SPEEDUP if world == 8 else 0.0
        res.ratio_check(f"(h{world}) re-served vs direct (speed-up)", f"{world} ranks direct",
                        f"{world} ranks re-served", target)
        res.value_check(f"(h{world}) re-served storage bytes / file size",
                        f"{world} ranks re-served storage bytes / file size", "<=", TARGET_STORE_BYTES)
        for other in ("local", "instant"):
            scenarios.ratio_note(res, f"(h{world}) re-served time over the {LABELS[other]} row's",
                                 f"{world} ranks re-served", f"{world} ranks {LABELS[other]}")
    for world, stats in counters.items():
        keys = ("fuse_reads", "backing_reads", "backing_read_bytes", "prefetched_bytes", "prefetch_unused_bytes",
                "single_flight_waits", "cache_misses", "evictions", "streams")
        res.note(f"last {world}-rank stfs run: " + ", ".join(f"{k} {stats[k]}" for k in keys if k in stats))
    res.note("seconds from letting the ranks go (each started, modules imported) until the last ends; "
             "re-served rows add the stfs mount time; "
             "targets: 8 ranks >= 4x (2 and 4 ranks reported), store bytes <= 1.1x the file")
    return res


scenarios.SCENARIOS["h"] = scenario_ranks

if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
