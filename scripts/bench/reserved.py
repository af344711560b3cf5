"""Scenario (g): the checkpoint re-served. The very loader of (c) (safetensors `safe_open`, numpy,
`get_tensor`, workers forked after the open and sharing its mmap) is pointed at the mount's own copy
of the checkpoint (`MNT/model.safetensors`) instead of the file on the slow mount: only the path
changes. (i) one process in file order, (ii) 4 forked workers, each loading every 4th tensor.

Kept apart from scenarios.py (and registered into its SCENARIOS on import) so that it merges
cleanly with edits to the other scenarios. It prepares its own checkpoint and slowfs if (c) did not.
"""

import os
import subprocess

import checkpoint
import interleave
import mounts
import scenarios
from report import Results

MODES = {"i": ("(i) file order", 1), "ii": ("(ii) 4 workers forked after safe_open", 4)}
TARGETS = {"i": 1.5, "ii": 10.0}


def _prepare(bench):
    """The (c) checkpoint and the slowfs binary, made here when scenario (c) is not part of the run."""
    args = bench.args
    if bench.slow_ckpt is None:
        slow_mb = args.slow_size_mb or args.size_mb
        print(f"preparing {slow_mb} MiB checkpoint for (g)", flush=True)
        bench.slow_ckpt = checkpoint.build(args.workdir, f"transformer-{slow_mb}M",
                                           checkpoint.transformer_layout(slow_mb << 20), with_squashfs=False)
    if not os.path.exists(bench.slowfs):
        print("building slowfs (cargo build --release --example slowfs)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "slowfs"], cwd=os.path.dirname(os.path.dirname(scenarios.HERE)), check=True,
                       timeout=1800)


def _run(bench, impl, mode, seed):
    """One safe_open load through a fresh slowfs mount, directly (`ref`) or through stfs's re-served file."""
    ckpt = bench.slow_ckpt
    workers = MODES[mode][1]
    out = {}
    with mounts.slowfs(bench.slowfs, ckpt["checkpoint_dir"], bench.args.slow_bandwidth_mbps,
                       bench.args.slow_latency_ms) as slow:
        name = os.path.basename(ckpt["checkpoint"])
        slow_file = os.path.join(slow.path, name)
        before = mounts.slowfs_stats(slow.path)
        if impl == "ref":
            out["wall"], _ = scenarios.run_load("ref", slow_file, ckpt["checkpoint"], workers=workers, seed=seed)
            out["total"] = out["wall"]
        else:
            with mounts.stfs(bench.stfs, slow_file) as m:
                served = os.path.join(m.path, name)
                out["mount"] = m.mount_seconds
                out["wall"], _ = scenarios.run_load("ref", served, ckpt["checkpoint"], workers=workers, seed=seed)
                out["total"] = out["mount"] + out["wall"]
        after = mounts.slowfs_stats(slow.path)
    out["slow_bytes"] = after["bytes"] - before["bytes"]
    out["slow_range_requests"] = after["range_requests"] - before["range_requests"]
    return out


def _verify(bench, res):
    """The re-served file hashes like the source (once per run of the scenario)."""
    ckpt = bench.slow_ckpt
    with mounts.stfs(bench.stfs, ckpt["checkpoint"]) as m:
        served = os.path.join(m.path, os.path.basename(ckpt["checkpoint"]))
        if checkpoint.file_sha256(served) != checkpoint.file_sha256(ckpt["checkpoint"]):
            raise RuntimeError("(g) the re-served checkpoint differs from the source")
    res.note("the re-served checkpoint's sha256 equals the source's")


def scenario_reserved(bench):
    """(g) safe_open on the mount's re-served model.safetensors vs safe_open on the slow mount directly."""
    _prepare(bench)
    ckpt = bench.slow_ckpt
    args = bench.args
    res = Results("g", f"checkpoint re-served, safe_open on MNT/model.safetensors (slowfs "
                       f"{args.slow_bandwidth_mbps:g} MB/s per handle, {args.slow_latency_ms:g} ms per range "
                       f"request), {ckpt['file_size'] / 2**20:.0f} MiB file")
    if not bench.stfs:
        res.note("stfs binary not found: not measured")
        return res
    mounts.warm_page_cache([ckpt["checkpoint"]])
    _verify(bench, res)
    for rep in range(bench.reps):
        for mode, (label, _) in MODES.items():
            for impl in interleave.balanced(["ref", "stfs"], rep):
                run = _run(bench, impl, mode, seed=2000 + rep)
                name = f"{'safe_open direct' if impl == 'ref' else 'safe_open re-served'} {label}"
                res.add(name, run["total"])
                res.add(f"{name} range requests", run["slow_range_requests"], "")
                res.add(f"{name} storage bytes / file size", run["slow_bytes"] / ckpt["file_size"], "")
    for mode, (label, _) in MODES.items():
        res.ratio_check(f"(g{mode}) re-served vs direct (speed-up)", f"safe_open direct {label}",
                        f"safe_open re-served {label}", TARGETS[mode])
        res.value_check(f"(g{mode}) re-served storage bytes / file size",
                        f"safe_open re-served {label} storage bytes / file size", "<=", 1.1)
    res.note("whole-process wall seconds of the loader; re-served rows add the stfs mount time")
    return res


scenarios.SCENARIOS["g"] = scenario_reserved
