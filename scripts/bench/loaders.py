#!/usr/bin/env python3
"""Loader peers, side by side (issue 24, item 2): every tensor of a checkpoint into CPU torch tensors,
every element touched, by stfs and by the loaders people pick instead.

Peers, each run in a fresh process that has imported torch and every loader's module before the clock
starts (it says "ready", then waits for the driver's "go": the clock runs from the go until the last
tensor is touched; a touch is a sum of the tensor's bytes, so every element is read, and the sums
together must equal the checkpoint's, so a fast wrong load fails the run):

  runai        Run:ai Model Streamer: SafetensorsStreamer().stream_file(SRC), every yielded tensor
  fastsafe     fastsafetensors: fastsafe_open(SRC, device="cpu"), get_tensor of every key
  load_file    safetensors.torch.load_file(SRC) (the reference)
  stfs.load    stfs.load(SRC, framework="torch") with no mount (issue 47, the default for a source): the
               engine in the worker's process (the extension module stfs._native, --native), each
               local shard mapped (zero copy) with a parallel read-ahead, a remote one read straight
               into the tensors' memory; the worker fails if the extension cannot be imported, so
               this row is never a mount's. Labelled "stfs.load (no mount)" in the docs
  stfs.load mounted  stfs.load(SRC, framework="torch", mount=True): mounts SRC (timed), a private
               mapping per tensor file or of the re-served file (the row "stfs.load" was before issue 47)
  stfs+open    stfs mount SRC (timed), then safe_open(MOUNT/model.safetensors, framework="pt") and
               get_tensor of every tensor: the re-served checkpoint under the reference reader
  stfs premounted  safe_open(MOUNT/model.safetensors, framework="pt") and get_tensor of every tensor on a
               mount of SRC made before the go (a fresh one per run, by the driver): a long-lived mount
  safe_open    safe_open(SRC, framework="pt") and get_tensor of every tensor on the local file: not a
               peer (never the best), the reader of the "stfs premounted" row without stfs, so a gap
               between that row and load_file that this one shows too is the reader's, not the mount's
  stfs first   stfs.open(SRC, framework="torch") (no mount: the engine in the process), then
               get_tensor of the first tensor in file order, touched: the time until the first
               tensor is usable. The streamer's counterpart is the time its runai run took to yield
               (and touch) its first tensor.
  stfs ranks   (s3 only, --use sum or full) 8 tensor-parallel ranks, each its own stfs.open(SRC) (its
               own engine: nothing shared between them, as between rank processes) on a thread of one
               worker, each get_slice-ing its 1/8 of every tensor (rows of the even tensors, columns
               of the odd ones, as ranks.py); every byte touched once over the 8. Beside its time,
               the origin's bytes: what the latency proxy relayed from the S3 server during the run
               (its --count), over the file's size
  ceiling      (s3 only) no loader: the object pulled through the same proxy by 16 parallel ranged
               GETs of a presigned URL (curl to /dev/null), s3.py's transfer ceiling, run by the
               driver in the same repetitions as the peers

The use of every tensor (--use): "sum" (the default, issue 24): every element summed as int64, as
above; "light" (issue 34): one byte of every 4 KiB page of the tensor summed, so a lazy mapping pays for
its faults and little else; "full" (issue 34): every byte copied once into one buffer of the
checkpoint's size that the worker allocated and faulted in before "ready" (as a GPU upload stages it),
its byte sum checked after the clock. Under "full" the workers start one at a time (each holds that
buffer) unless three times their buffers fit in the memory available. --layout f32 builds issue 34's
checkpoint (64 equal F32 tensors) instead of the transformer.

--unprivileged (issue 47): every worker that needs no mount (runai, fastsafe, load_file, stfs.load,
stfs first, stfs ranks, the floors) runs in a mount namespace of its own whose /dev is a tmpfs holding
null, zero, random, urandom and shm (no /dev/fuse), as the user nobody with no new privileges (setpriv),
/root replaced in it by a tmpfs holding only .pyenv and .cache, so that nobody can run the torch
virtualenv. Not from slowfs: its mount, made per run after the workers started, is not in their
namespaces (and a root's FUSE mount, not allow_other, is not readable by nobody): those run as root, as
without the option. Needs root (to make the namespace), unshare and setpriv. The mounted rows (stfs.load mounted, stfs+open,
stfs premounted) run as before.

Memory: each worker resets its peak RSS at "ready" (/proc/self/clear_refs) and reports VmHWM at the
end: "PEER: MiB peak RSS added", the memory its load took (the returned tensors, mapped pages
included, and whatever else it held at once). For stfs.load it is judged against the returned
tensors plus the engine's cache_size (512 MiB by default): issue 47's memory row.

--before DIR --before-stfs BIN: the same stfs rows (stfs.load, stfs premounted) again, as "... before",
with an earlier stfs: its Python package from DIR/python (a `git archive` of an earlier commit) and its
binary BIN (built there, e.g. `scripts/cargo_bin --release --bin stfs` run in DIR), to show what a
change did, paired in the same run.

Floors (page and cold only; not loaders, so never the "best peer", but measured in the same runs, by
the same worker protocol, their sums checked the same way): what no loader can beat, so a target
below one is out of reach whatever stfs does.

  touch floor  every tensor already in the worker's memory before "ready" (load_file'd, then cloned
               into anonymous memory that is faulted in); timed: only the touch of every tensor
  touch floor mapped  the same, every tensor left where load_file put it (a mapping of the file in the
               page cache), every page of it faulted in before "ready"; timed: only the touch. The
               touch of a repetition is the faster of the two: no loader's tensors can be in memory
               more readily than one of these
  read floor   the file's data read with 16 MiB preads (os.preadv) into one torch buffer allocated
               before "ready" (not faulted: its first-write faults are in the time, as for any loader
               reading into new memory), the header parsed before "ready"; then every tensor (a view
               of the buffer) touched. From cold, after the same POSIX_FADV_DONTNEED as the loaders
  read floor x16  the same, the 16 MiB preads spread over 16 threads started before "ready" (as
               fastsafetensors' pread path does with its default max_threads=16)

Sources (--only):

  page    the checkpoint, a local file in the page cache (re-read before every run)
  cold    the same file not in the page cache (POSIX_FADV_DONTNEED on it before every run)
  slow    the slow-storage model of docs/notes/benchmarks.md: slowfs (--slow-bandwidth-mbps per handle,
          --slow-latency-ms per range request) over the checkpoint's folder, a fresh mount per run
  s3      s3://bench/model.safetensors on the S3 bench server (scripts/bench/s3server, built by s3.py's
          server_command) behind its latency proxy (--latency-ms per request, --conn-mib-s per
          connection), as s3.py runs them. stfs mounts it with --endpoint-url; the streamer reads it with
          its own S3 client (runai-model-streamer-s3), given AWS_ENDPOINT_URL, the bench's keys and
          RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0 (a loopback endpoint has no bucket host names), and
          its per-request timeout raised, RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS (--runai-s3-request-timeout-ms;
          the issue found its default, 1000 ms, failing on this loaded 2-core machine). That is the
          variable 0.17.0 reads for it (its debug log: "S3 request timeout is set to N ms");
          RUNAI_STREAMER_S3_TIMEOUT, which the issue named, is another setting, the window in seconds in
          which failed requests are retried ("object storage retry timeout N seconds", default 0), left
          at its default. fastsafetensors and load_file read local files only: not run
          from s3. The object is uploaded with one PUT, as s3.py does: for a file merely copied into the
          server's store directory, s3s-fs has no stored ETag and computes the MD5 of the whole object
          on every GET and HEAD before the first byte, and the streamer's many ranged GETs then stall
          (docs/notes/benchmarks.md, "Loader peers"); that, not a missing S3 feature, was the issue's hang.

Every repetition runs every peer once, in a balanced order (interleave.py: over as many repetitions as
peers, twice that for an odd count, each peer runs right after every other equally often, since on
this VM a run can leave a cost to the next; docs/notes/benchmarks.md, "The peer before"); the workers
of a repetition start together and import while nothing is timed, then go one at a time. Ratios are
paired by repetition (peer time / stfs time: above 1, stfs is faster) and shown as median [min-max]. Targets (issue 47, for
stfs.load with no mount): >= 1.0x the best peer on page and cold, >= 3x on slow, >= 1.5x the best peer
(Run:ai, the only one) from s3; from s3 also the whole model at >= 0.85x the transfer ceiling's speed
(ceiling), the 8 ranks' origin bytes <= 1.1x the file, and stfs's first tensor (stfs first) in <= 0.1x
the time the streamer takes to yield its first; everywhere, stfs.load's peak RSS added <= the returned
tensors plus cache_size. Under --use light or full, against load_file (the reference) and the best
peer: page light and full, stfs.load >= 1.0x load_file; cold light and full, stfs.load >= 1.0x the best
peer; and issue 34's for the mounted rows: page light, stfs premounted >= 0.9x load_file; page full,
>= 0.95x; cold light, >= 1.0x load_file. Under page and cold the judge also prints the
bound: the time the target asks for (the best peer's median over the target) beside the floors' times,
and the best peer's time over the floor's, paired: the most any loader could reach over it (from the
page cache the floor is the faster touch floor; cold, max(that, the faster read floor's reads
alone), per repetition, since a loader must read the file and touch it, at best overlapped). A peer, or a
floor, whose run fails or passes --run-timeout is reported with its error and left out of the rest of
that source; after every figure is printed, the script exits non-zero if any run failed or a peer could
not be installed.

Peers at their defaults, except: fastsafetensors with nogds=True when its default (GDS) cannot run here
(checked at start and said); the streamer's S3 settings above. Needs root for slow and s3 (slowfs, the S3
server); page and cold run as any user who may mount with fusermount3 (no passthrough then, 1 MiB
requests), with --no-install. Needs the torch virtualenv
(scripts/torch_venv: torch, safetensors, runai-model-streamer); runai-model-streamer-s3 and
fastsafetensors are pip installed when missing (unless --no-install), rclone with apt-get (s3.py's
need_tools) for the upload to the S3 server.

  $(scripts/torch_venv) scripts/bench/loaders.py --stfs "$(scripts/cargo_bin --release --bin stfs)"              # 256 MiB, 5 reps
  $(scripts/torch_venv) scripts/bench/loaders.py --stfs "$(scripts/cargo_bin --release --bin stfs)" --quick      # smoke, < 90 s
  $(scripts/torch_venv) scripts/bench/loaders.py --stfs ... --layout f32 --size-mb 2048 --only page,cold --use light  # issue 34
"""
import argparse
import contextlib
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
import interleave  # noqa: E402

FLOORS = ["touch floor", "touch floor mapped", "read floor", "read floor x16"]
TOUCH_FLOORS = ["touch floor", "touch floor mapped"]
PEERS = ["runai", "fastsafe", "load_file", "stfs.load", "stfs.load mounted", "stfs+open", "stfs premounted",
         "stfs first", "stfs ranks", "ceiling", "safe_open", *FLOORS]
# The default --peers: all but "stfs.load mounted" (asked for by name), so that the smoke runs of
# scripts/test keep the peer count they had before it, and their time limits.
DEFAULT_PEERS = [p for p in PEERS if p != "stfs.load mounted"]
MOUNTED = {"stfs.load mounted", "stfs+open", "stfs premounted"}  # rows that mount (never --unprivileged)
S3_ONLY = {"stfs ranks", "ceiling"}
RANKS = 8  # the ranks of "stfs ranks"
CEILING_GETS = 16  # the ceiling's parallel ranged GETs, as s3.py's
BEFORE = " before"  # the suffix of a row measured with --before's stfs
BEFORE_ROWS = ["stfs.load", "stfs premounted"]
FLOOR_SOURCES = {"page", "cold"}  # sources the floors run on (the bound of the local targets)
READ_CHUNK = 16 << 20  # the read floor's pread size
PAGE = 4096  # the stride of a light use
USES = ["sum", "light", "full"]
STFS_ROWS = ["stfs.load"]  # the judged row (issue 47: the load with no mount)
NEAR_ROWS = ["stfs.load", "stfs.load mounted", "stfs+open", "stfs premounted"]  # every whole-load stfs row, for the notes
OTHERS = ["runai", "fastsafe", "load_file"]
LOCAL_ONLY = {"fastsafe", "load_file", "safe_open"}
FIRSTS = ("runai", "stfs.load", "stfs first")  # peers whose time to their first touched tensor is a row
SOURCES = ["page", "cold", "slow", "s3"]
TARGETS = {"page": 1.0, "cold": 1.0, "slow": 3.0, "s3": 1.5}  # issue 47: stfs.load over the best peer (s3: Run:ai)
FIRST_TARGET = 10.0  # the streamer's first tensor time over stfs's: stfs <= 0.1x
CEILING_TARGET = 0.85  # issue 47: the whole model from s3 at >= 0.85x the transfer ceiling's speed
RANKS_TARGET = 1.1  # issue 47: the 8 ranks' origin bytes <= 1.1x the file
CACHE_SIZE_MIB = 512  # the engine's default --cache-size, in the memory row's bound
NEAR_TARGETS = {  # (source, use) -> [(stfs row, reference, target)]; "best": the best peer. stfs.load's
    # are issue 47's (no mount), the premounted ones issue 34's
    ("page", "light"): [("stfs.load", "load_file", 1.0), ("stfs premounted", "load_file", 0.9)],
    ("page", "full"): [("stfs.load", "load_file", 1.0), ("stfs premounted", "load_file", 0.95)],
    ("cold", "light"): [("stfs.load", "best", 1.0), ("stfs premounted", "load_file", 1.0)],
    ("cold", "full"): [("stfs.load", "best", 1.0)],
    # The whole model from S3 delivered and touched (light), as the transfer ceiling delivers it to
    # /dev/null: the sum of every byte (--use sum) adds the same CPU time to every loader.
    ("s3", "light"): [("stfs.load", "best", TARGETS["s3"])],
    ("slow", "light"): [("stfs.load", "best", TARGETS["slow"])],
}
S3_KEY = "model.safetensors"
PIP = {"runai-s3": "runai-model-streamer-s3", "fastsafe": "fastsafetensors"}
TITLES = {
    "page": "local file in the page cache",
    "cold": "local file not in the page cache (POSIX_FADV_DONTNEED before each run)",
    "slow": "slow storage (slowfs {bw:g} MB/s per handle, {lat:g} ms per range request, fresh mount per run)",
    "s3": "s3:// on the S3 bench server through its latency proxy ({s3lat:g} ms per request, {rate:g} MiB/s per "
          "connection)",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stfs", default=cargo_paths.binary("stfs"), help="stfs binary")
    p.add_argument("--slowfs", default=cargo_paths.binary("slowfs", example=True),
                   help="slowfs binary (built with cargo if missing)")
    p.add_argument("--size-mb", type=int, help="checkpoint size in MiB (default 256; --quick: 16)")
    p.add_argument("--reps", type=int, help="repetitions (default 5; --quick: 1)")
    p.add_argument("--only", default=",".join(SOURCES), help=f"sources (default {','.join(SOURCES)})")
    p.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                   help=f"peers (default {','.join(DEFAULT_PEERS)}; also: stfs.load mounted)")
    p.add_argument("--slow-bandwidth-mbps", type=float, default=200.0, help="slowfs MB/s per handle (default 200)")
    p.add_argument("--slow-latency-ms", type=float, default=10.0, help="slowfs cost per range request (default 10)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="S3 proxy latency per request (default 20)")
    p.add_argument("--conn-mib-s", type=float, default=100.0, help="S3 proxy pace per connection (default 100)")
    p.add_argument("--runai-s3-request-timeout-ms", type=int, default=600000,
                   help="RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS, the streamer's per-request S3 timeout (default "
                        "600000; its own, 1000, failed on a loaded 2-core machine). Not "
                        "RUNAI_STREAMER_S3_TIMEOUT: 0.17.0 reads that as its retry window in seconds (default 0)")
    p.add_argument("--run-timeout", type=float, help="bound on one run in seconds (default 300; --quick: 60)")
    p.add_argument("--workdir", default="/var/tmp/stfs-bench", help="where checkpoints are built once and reused")
    p.add_argument("--no-install", action="store_true", help="do not pip install missing peers")
    p.add_argument("--use", choices=USES, default="sum", help="what is done with every tensor in the clock (default sum)")
    p.add_argument("--layout", choices=["transformer", "f32"], default="transformer",
                   help="the checkpoint: a transformer's tensors (default) or 64 equal F32 ones (the near-bytes runs)")
    p.add_argument("--native", help="the extension module stfs._native the stfs.load/first/ranks rows import (a "
                   "cdylib built with --features python; default: the newer of <target>/release/libstfs.so, where "
                   "it is one, and scripts/test's debug build, <target>/python-native/stfs/_native.abi3.so)")
    p.add_argument("--unprivileged", action="store_true",
                   help="workers that need no mount run as nobody with no /dev/fuse (see above; needs root)")
    p.add_argument("--before", help="a tree of an earlier stfs (its python/): its rows beside, with --before-stfs")
    p.add_argument("--before-stfs", help="the earlier stfs's binary (with --before)")
    p.add_argument("--quick", action="store_true", help="smoke run: 16 MiB checkpoint, 1 repetition, bounded")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prep", help=argparse.SUPPRESS)  # a floor worker's setup before "ready" (JSON)
    args = p.parse_args(argv)
    for name, full, quick in (("size_mb", 256, 16), ("reps", 5, 1), ("run_timeout", 300.0, 60.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


# --- the measured process --------------------------------------------------------------------------

def floor_setup(prep):
    """What a floor worker does before "ready": (state for floor_run)."""
    import torch
    import safetensors.torch

    if prep["floor"] == "touch floor":
        loaded = safetensors.torch.load_file(prep["path"])
        held = [(name, t.clone()) for name, t in loaded.items()]  # anonymous memory, every page written
        del loaded
        return {"tensors": held}
    if prep["floor"] == "touch floor mapped":
        held = list(safetensors.torch.load_file(prep["path"]).items())  # mappings of the cached file
        for _, t in held:
            flat = t.reshape(-1).view(torch.uint8)
            if flat.numel():
                int(flat[::4096].sum())  # a byte of every page: each page faulted in, mapped
        return {"tensors": held}
    import checkpoint

    absolute = checkpoint.read_header(prep["path"])  # file order, offsets from the file's start
    base = min((start for *_, start, _ in absolute), default=0)  # where the data begins
    tensors = [(name, dtype, shape, start - base, end - base) for name, dtype, shape, start, end in absolute]
    size = max((end for *_, end in tensors), default=0)
    state = {"base": base, "tensors": tensors, "buf": torch.empty(size, dtype=torch.uint8, device="cpu")}
    if prep.get("threads", 1) > 1:
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(prep["threads"])
        list(pool.map(lambda _: None, range(prep["threads"])))  # every thread started
        state["pool"] = pool
    return state


def floor_run(state, src, touch, started):
    """A floor's timed part: (the reads and) the touch of every tensor; returns the seconds from
    `started` to the end of the reads (None for the touch floor)."""
    if "buf" not in state:
        for name, t in state["tensors"]:
            touch(name, t)
        return None
    buf, base = state["buf"], state["base"]
    n = buf.numel()
    view = memoryview(buf.numpy()) if n else memoryview(b"")
    fd = os.open(src, os.O_RDONLY)
    try:
        def read(at):
            end = min(at + READ_CHUNK, n)
            while at < end:
                got = os.preadv(fd, [view[at:end]], base + at)
                if not got:
                    raise SystemExit(f"{src}: ended at byte {base + at}")
                at += got
        chunks = range(0, n, READ_CHUNK)
        if "pool" in state:
            list(state["pool"].map(read, chunks))
        else:
            for at in chunks:
                read(at)
    finally:
        os.close(fd)
    read_seconds = time.perf_counter() - started
    for name, _, _, start, end in state["tensors"]:
        touch(name, buf[start:end])
    return read_seconds


def worker(prep=None):
    """One run: imports everything (a floor: its setup too; a full use: its buffer), says "ready", reads
    one JSON job line (the go), runs it, prints JSON."""
    import torch
    import safetensors.torch  # noqa: F401
    from safetensors import safe_open

    prep = json.loads(prep) if prep else {}
    sys.path.insert(0, prep.get("stfs_python") or os.path.join(REPO, "python"))
    import stfs
    import stfs._engine
    if prep.get("native"):  # a folder holding stfs/_native.abi3.so: the extension, beside the package
        stfs.__path__.append(os.path.join(prep["native"], "stfs"))
        stfs._engine.available()  # imported before the clock, as every loader's module is
    with contextlib.suppress(ImportError):
        import runai_model_streamer  # noqa: F401
    with contextlib.suppress(ImportError):
        import fastsafetensors  # noqa: F401
    state = floor_setup(prep) if "floor" in prep else None
    use, out = prep.get("use", "sum"), None
    if use == "full":
        out = torch.empty(prep["out_bytes"], dtype=torch.uint8, device="cpu")
        out[::PAGE] = 0  # every page faulted in: the copy, not the allocation, is timed

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM: the peak from here on is the load's
    rss_ready = status_kib("VmRSS")
    print("ready", flush=True)
    job = json.loads(sys.stdin.readline())
    peer, src, opts = job["peer"], job["source"], job.get("mount", {})
    done = {"bytes": 0, "tensors": 0, "checksum": 0, "read_seconds": None}
    first = {}

    def touch(name, t):
        flat = t.reshape(-1)
        n = flat.numel() * flat.element_size()
        if n and use == "full":
            out[done["bytes"]:done["bytes"] + n].copy_(flat.view(torch.uint8))  # summed after the clock
        elif n:
            done["checksum"] += int(flat.view(torch.uint8)[::PAGE if use == "light" else 1].sum(dtype=torch.int64))
        done["bytes"] += n
        done["tensors"] += 1
        if not first:
            first.update(seconds=time.perf_counter() - started, name=name, bytes=n)

    started = time.perf_counter()
    if peer == "runai":
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(src)
            for name, t in streamer.get_tensors():
                touch(name, t)
    elif peer == "fastsafe":
        from fastsafetensors import fastsafe_open
        with fastsafe_open(src, device="cpu", **job.get("fastsafe", {})) as f:
            for name in f.keys():
                touch(name, f.get_tensor(name))
    elif peer in FLOORS:
        done["read_seconds"] = floor_run(state, src, touch, started)
    elif peer == "load_file":
        for name, t in safetensors.torch.load_file(src).items():
            touch(name, t)
    elif peer == "stfs.load":
        if not stfs._engine.available():
            raise SystemExit("stfs.load (no mount): the extension module stfs._native cannot be imported (--native)")
        for name, t in stfs.load(src, framework="torch", **opts).items():
            touch(name, t)
    elif peer == "stfs.load mounted":
        for name, t in stfs.load(src, framework="torch", mount=True, **opts).items():
            touch(name, t)
    elif peer == "stfs first":
        if not stfs._engine.available():
            raise SystemExit("stfs first: the extension module stfs._native cannot be imported (--native)")
        with stfs.open(src, framework="torch", **opts) as f:
            name = f.keys()[0]  # file order
            touch(name, f.get_tensor(name))
    elif peer == "stfs ranks":
        if not stfs._engine.available():
            raise SystemExit("stfs ranks: the extension module stfs._native cannot be imported (--native)")
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(RANKS) as pool:
            parts = list(pool.map(lambda rank: rank_slices(stfs, src, opts, rank), range(RANKS)))
        for rank_parts in parts:
            for name, t in rank_parts:
                touch(name, t)
    elif peer in ("stfs premounted", "safe_open"):  # premounted: src is the re-served file on the driver's mount
        with safe_open(src, framework="pt") as f:
            for name in f.keys():
                touch(name, f.get_tensor(name))
    elif peer == "stfs+open":
        with stfs.mount(src, **opts) as mp:
            with safe_open(os.path.join(mp, os.path.basename(src)), framework="pt") as f:
                for name in f.keys():
                    touch(name, f.get_tensor(name))
            seconds = time.perf_counter() - started  # the unmount is not what the caller waits for
    else:
        raise SystemExit(f"unknown peer {peer!r}")
    if peer != "stfs+open":
        seconds = time.perf_counter() - started
    done["peak_rss_mib"] = (status_kib("VmHWM") - rss_ready) / 1024
    if use == "full":  # in 64 MiB pieces: a sum to int64 makes an int64 copy of what it sums
        done["checksum"] = sum(int(out[at:min(at + (64 << 20), done["bytes"])].sum(dtype=torch.int64))
                               for at in range(0, done["bytes"], 64 << 20))
    print(json.dumps({"seconds": seconds, **done, "first": first}), flush=True)


def status_kib(field):
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def rank_slices(stfs, src, opts, rank):
    """Rank `rank` of RANKS: its own stfs.open of `src`, and its 1/RANKS of every tensor with get_slice
    (rows of the even tensors, columns of the odd 2-D ones, as ranks.py; a scalar wholly rank 0's)."""
    out = []
    with stfs.open(src, framework="torch", **opts) as f:
        for i, name in enumerate(f.keys()):
            part = f.get_slice(name)
            shape = part.get_shape()
            if not shape:
                if rank == 0:
                    out.append((name, part[...]))
                continue
            dim = 1 if i % 2 and len(shape) >= 2 else 0
            n = shape[dim]
            out.append((name, part[(slice(None),) * dim + (slice(rank * n // RANKS, (rank + 1) * n // RANKS),)]))
    return out


# --- the driver ------------------------------------------------------------------------------------

def ensure(module, package, install):
    """Whether `module` imports in this python, pip installing `package` first when missing."""
    check = [sys.executable, "-c", f"import {module}"]
    if subprocess.run(check, capture_output=True, timeout=300).returncode == 0:
        return True, None
    if not install:
        return False, f"{package} is not installed (--no-install)"
    print(f"pip install {package}", flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--root-user-action=ignore", package], capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or subprocess.run(check, capture_output=True, timeout=300).returncode != 0:
        return False, f"pip install {package} failed: {done.stderr.strip()[-500:]}"
    return True, None


def version(package):
    from importlib.metadata import PackageNotFoundError, version as v
    try:
        return v(package)
    except PackageNotFoundError:
        return "?"


class Worker:
    """One fresh process of `worker()`; start() returns at once, ready() waits for its imports."""

    def __init__(self, env, prep=None, wrap=None):
        argv = [sys.executable, os.path.abspath(__file__), "--worker"] + (["--prep", json.dumps(prep)] if prep else [])
        argv = (wrap or []) + argv
        self.proc = subprocess.Popen(argv, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ready(self, timeout):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout) or self.proc.stdout.readline().strip() != "ready":
            self.kill()
            raise RuntimeError(f"the worker did not start within {timeout:g} s: {self.proc.stderr.read()[-1000:]}")

    def run(self, job, timeout):
        """Sends the job (the go) and returns its JSON result; raises with the error's tail on failure
        or when it passes `timeout` (then the process is killed)."""
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise RuntimeError(f"timed out after {timeout:g} s" + (f"; its log ends: {tail(err)}" if err.strip() else ""))
        if self.proc.returncode != 0:
            raise RuntimeError(f"exit {self.proc.returncode}: {tail(err)}")
        results = [line for line in out.splitlines() if line.startswith("{")]  # the streamer may log to stdout
        if not results:
            raise RuntimeError(f"no result line: {tail(out + err)}")
        return json.loads(results[-1])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def tail(text, lines=6):
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def expected_sums(ckpt, use):
    """(sum of every tensor byte, (name, length, byte sum) of the first tensor in file order); under a
    light use, of one byte per page of every tensor."""
    import numpy as np

    data = np.memmap(ckpt["checkpoint"], dtype=np.uint8, mode="r")

    def byte_sum(start, end):
        return int(data[start:end:PAGE if use == "light" else 1].sum(dtype=np.int64))

    total = sum(byte_sum(start, end) for _, _, _, start, end in ckpt["header"])
    name, _, _, start, end = ckpt["header"][0]
    return total, (name, end - start, byte_sum(start, end))


def check(peer, result, ckpt, sums):
    total, (name, length, first_sum) = sums
    if peer == "stfs ranks":  # every tensor in RANKS parts: the bytes and their sum, not the count
        if (result["bytes"], result["checksum"]) != (ckpt["data_bytes"], total):
            raise RuntimeError(f"the ranks loaded {result['bytes']} bytes, byte sum {result['checksum']}; the "
                               f"checkpoint has {ckpt['data_bytes']}, {total}")
    elif peer == "stfs first":
        if result["bytes"] != length or result["checksum"] != first_sum or result["first"]["name"] != name:
            raise RuntimeError(f"first tensor: got {result['first']} ({result['checksum']}), want {name} "
                               f"({length} bytes, sum {first_sum})")
    elif (result["tensors"], result["bytes"], result["checksum"]) != (len(ckpt["header"]), ckpt["data_bytes"], total):
        raise RuntimeError(f"loaded {result['tensors']} tensors, {result['bytes']} bytes, byte sum {result['checksum']}; "
                           f"the checkpoint has {len(ckpt['header'])}, {ckpt['data_bytes']}, {total}")


@contextlib.contextmanager
def s3_endpoint(args, ckpt, workdir):
    """The S3 bench server holding the checkpoint as s3://bench/model.safetensors, behind s3.py's Rust
    latency proxy (counting the bytes it relays); yields (the proxy's endpoint URL, the proxy). Both
    are stopped on the way out."""
    import s3
    from remote import free_port, wait_port

    s3.need_tools()
    server = s3.server_command("bench")
    root = os.path.join(workdir, "store")
    os.makedirs(os.path.join(root, s3.BUCKET))
    port, proxy = free_port(), None
    srv = subprocess.Popen([*server, "--port", str(port), "--access-key", s3.KEY_ID, "--secret-key", s3.SECRET, root],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        # One PUT straight to the server, as s3.py uploads (s3s-fs then keeps the object's ETag).
        subprocess.run(["rclone", "copyto", ckpt["checkpoint"], f"b:{s3.BUCKET}/{S3_KEY}", "--s3-upload-cutoff", "5G"],
                       check=True, env=s3.rclone_env(f"http://127.0.0.1:{port}"), stderr=subprocess.DEVNULL,
                       timeout=600)
        proxy = s3.RustProxy(port, args.latency_ms / 1000, args.conn_mib_s * 2**20, count=True)
        yield f"http://127.0.0.1:{proxy.port}", proxy
    finally:
        if proxy is not None:
            proxy.stop()
        srv.terminate()
        srv.wait(timeout=30)


def worker_env(args, endpoint):
    import s3

    env = s3.env() if endpoint else dict(os.environ)  # s3.env(): the bench's keys, no proxies, no AWS_ settings
    env["STFS_BIN"] = os.path.abspath(args.stfs)
    env.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")
    if endpoint:
        env.update(AWS_ENDPOINT_URL=endpoint, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
                   RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS=str(args.runai_s3_request_timeout_ms))
    return env


def unprivileged_argv(user):
    """The command a worker is run under with --unprivileged: a mount namespace of its own whose /dev
    is a tmpfs without fuse, and /root a tmpfs holding only .pyenv and .cache (the torch virtualenv and
    its Python, so that nobody can run them), then `user` with no new privileges."""
    setup = ("set -e; mount -t tmpfs -o mode=755 none /mnt; mkdir /mnt/root; mount --bind /root /mnt/root; "
             "mount -t tmpfs -o mode=755 none /root; for d in .pyenv .cache; do [ -d /mnt/root/$d ] || continue; "
             "mkdir /root/$d; mount --bind /mnt/root/$d /root/$d; done; umount -l /mnt; "
             "mount -t tmpfs -o mode=755 none /dev; mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; "
             "mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mkdir -m 1777 /dev/shm; "
             f'exec setpriv --reuid={user} --regid={"nogroup" if user == "nobody" else "root"} --clear-groups '
             '--no-new-privs env HOME=/tmp "$0" "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup]


def ceiling_run(endpoint, size, presigned):
    """s3.py's transfer ceiling: the object through the proxy by CEILING_GETS parallel ranged GETs of a
    presigned URL (curl to /dev/null), timed here; no loader."""
    part = -(-size // CEILING_GETS)
    started = time.perf_counter()
    curls = [subprocess.Popen(["curl", "-sf", "-o", "/dev/null", "-r", f"{i * part}-{min(size, (i + 1) * part) - 1}",
                               presigned]) for i in range(CEILING_GETS)]
    if any(c.wait() != 0 for c in curls):
        raise RuntimeError("a ranged GET of the presigned URL failed")
    return {"seconds": time.perf_counter() - started}


def run_source(args, source, ckpt, peers, sums, endpoint, fastsafe_opts, failures, proxy=None):
    """Every peer once per repetition, in a balanced order (interleave.py); returns report.Results with
    one series per peer."""
    import mounts
    from report import Results

    title = TITLES[source].format(bw=args.slow_bandwidth_mbps, lat=args.slow_latency_ms, s3lat=args.latency_ms,
                                  rate=args.conn_mib_s)
    res = Results(source, f"{ckpt['file_size'] / 2**20:.0f} MiB, {len(ckpt['header'])} tensors, {title}")
    peers = [p for p in peers if not (source == "s3" and p in LOCAL_ONLY)
             and not (source != "s3" and p in S3_ONLY) and not (p == "stfs ranks" and args.use == "light")
             and not ((p in FLOORS or p.removesuffix(BEFORE) == "stfs premounted") and source not in FLOOR_SOURCES)]
    presigned = None
    if "ceiling" in peers:
        import s3
        presigned = subprocess.run(["rclone", "link", f"b:{s3.BUCKET}/{S3_KEY}", "--expire", "1h"], check=True,
                                   env=s3.rclone_env(endpoint), capture_output=True, text=True,
                                   timeout=120).stdout.strip()
    env = worker_env(args, endpoint)
    mount_opts = {"endpoint_url": endpoint} if endpoint else {}
    # A full use holds a buffer of the checkpoint's size per worker: all started together only where
    # three times their buffers fit in the memory available, else one at a time (then runs lie further
    # apart, and pair less well on a noisy machine).
    together = args.use != "full" or 3 * len(peers) * ckpt["data_bytes"] < available_memory()

    def late(peer):
        # Started at its turn, not with the others: under a full use every worker; from cold, the
        # mapped touch floor, whose faulted-in mapping would keep the file's pages in the page cache
        # (POSIX_FADV_DONTNEED leaves mapped pages) through every other peer's run.
        return not together or (source == "cold" and peer == "touch floor mapped")

    def start(peer):
        if peer == "ceiling":
            return None  # run by the driver
        wrap = None
        # Not from slowfs: its mount is made per run, after the worker's namespace was made, so it
        # is not in there (and, a root's FUSE mount without allow_other, not readable by nobody).
        if args.unprivileged and peer.removesuffix(BEFORE) not in MOUNTED and source != "slow":
            wrap = unprivileged_argv("nobody")
        return Worker(dict(env, STFS_BIN=stfs_binary(args, peer)), prep(args, peer, ckpt), wrap)

    for rep in range(args.reps):
        order = [p for p in interleave.balanced(peers, rep) if (source, p) not in failures]
        workers = {p: start(p) for p in order if not late(p)}  # imports in parallel, before any clock
        try:
            for w in workers.values():
                if w is not None:
                    w.ready(args.run_timeout)
            for peer in order:
                job = {"peer": peer.removesuffix(BEFORE), "mount": mount_opts, "fastsafe": fastsafe_opts}
                try:
                    if late(peer) and peer != "ceiling":
                        workers[peer] = start(peer)
                        workers[peer].ready(args.run_timeout)
                    with prepared(args, source, ckpt, mounts, peer) as (path, slow):
                        job["source"] = f"s3://bench/{S3_KEY}" if source == "s3" else path
                        before = mounts.slowfs_stats(slow) if slow else None
                        disk = kib_read_in() if source == "cold" else None
                        relayed = proxy.relayed() if proxy else None
                        if peer == "ceiling":
                            result = ceiling_run(endpoint, ckpt["file_size"], presigned)
                        else:
                            result = workers[peer].run(job, args.run_timeout)
                        if relayed is not None:
                            res.add(f"{peer}: origin bytes / file", (proxy.relayed() - relayed) / ckpt["file_size"], "")
                        if disk is not None:  # the whole machine's: a check that the run read the file
                            res.add(f"{peer}: MiB read from disk", (kib_read_in() - disk) / 1024, "MiB")
                        if slow:
                            after = mounts.slowfs_stats(slow)
                            res.add(f"{peer} store bytes / file", (after["bytes"] - before["bytes"]) / ckpt["file_size"], "")
                    if peer != "ceiling":
                        check(job["peer"], result, ckpt, sums)
                except (RuntimeError, OSError) as err:
                    failures[(source, peer)] = f"rep {rep + 1}: {err}"
                    print(f"  {source} rep {rep + 1}/{args.reps} {peer:10} FAILED: {err}", flush=True)
                    continue
                res.add(peer, result["seconds"])
                if result.get("peak_rss_mib") is not None:
                    res.add(f"{peer}: MiB peak RSS added", result["peak_rss_mib"], "MiB")
                if result.get("read_seconds") is not None:
                    res.add(f"{peer}, reads only", result["read_seconds"])
                if peer in ("runai", "stfs.load") and result["first"]:
                    res.add(f"{peer} first", result["first"]["seconds"])
                print(f"  {source} rep {rep + 1}/{args.reps} {peer:10} {result['seconds']:8.3f} s"
                      + (f"  (first tensor {result['first']['seconds']:.3f} s: {result['first']['name']}, "
                         f"{result['first']['bytes'] / 2**20:.1f} MiB)" if peer in FIRSTS else "")
                      + (f"  (reads alone {result['read_seconds']:.3f} s)" if result.get("read_seconds") is not None else ""),
                      flush=True)
        finally:
            for w in workers.values():
                if w is not None:
                    w.kill()
    judge(res, source, peers, failures, args.use)
    judge_issue47(res, source, ckpt)
    return res


def judge_issue47(res, source, ckpt):
    """Issue 47's rows beyond the time ratios: the whole model from s3 against the transfer ceiling, the
    8 ranks' origin bytes, and stfs.load's memory against the returned tensors plus cache_size."""
    if "ceiling" in res.series and "stfs.load" in res.series:
        res.ratio_check(f"{source}: whole model, the transfer ceiling's time / stfs.load's (>= {CEILING_TARGET:g}x)",
                        "ceiling", "stfs.load", CEILING_TARGET)
    if "stfs ranks: origin bytes / file" in res.series:
        res.value_check(f"{source}: {RANKS} ranks' get_slice, origin bytes / file (<= {RANKS_TARGET:g})",
                        "stfs ranks: origin bytes / file", "<=", RANKS_TARGET)
    rss = "stfs.load: MiB peak RSS added"
    if rss in res.series:
        bound = ckpt["data_bytes"] / 2**20 + CACHE_SIZE_MIB
        res.value_check(f"{source}: stfs.load's peak RSS added <= the returned tensors + cache_size "
                        f"({ckpt['data_bytes'] / 2**20:.0f} + {CACHE_SIZE_MIB} MiB)", rss, "<=", bound, " MiB")


def kib_read_in():
    """KiB the kernel has read from block devices since boot (/proc/vmstat pgpgin)."""
    with open("/proc/vmstat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("pgpgin "))


def available_memory():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))


def prep(args, peer, ckpt):
    """A worker's setup before "ready": the use, a floor's, the earlier stfs's Python package."""
    out = {"use": args.use, "out_bytes": ckpt["data_bytes"], "native": args.native_dir}
    if peer in FLOORS:
        out.update(floor=peer, path=ckpt["checkpoint"], threads=16 if peer == "read floor x16" else 1)
    if peer.endswith(BEFORE):
        out["stfs_python"] = os.path.join(args.before, "python")
    return out


def stfs_binary(args, peer):
    return os.path.abspath(args.before_stfs if peer.endswith(BEFORE) else args.stfs)


@contextlib.contextmanager
def prepared(args, source, ckpt, mounts, peer):
    """The source's path for one run, its cache state set: (path, slowfs mount point or None). For
    "stfs premounted" the path is the re-served file on a fresh mount of the checkpoint, made here."""
    if peer.removesuffix(BEFORE) == "stfs premounted" and source in ("page", "cold"):
        with mounts.stfs(stfs_binary(args, peer), ckpt["checkpoint"]) as m:
            with prepared(args, source, ckpt, mounts, "") as (_, slow):
                yield os.path.join(m.path, os.path.basename(ckpt["checkpoint"])), slow
        return
    path = ckpt["checkpoint"]
    if source == "page":
        mounts.warm_page_cache([path])
    elif source == "cold" and peer not in TOUCH_FLOORS:  # a touch floor's tensors are in memory already
        left = mounts.drop_page_cache(path)
        if left and left >= 0.01:
            print(f"  cold: {left:.0%} of the file still in the page cache after dropping it for 10 s", flush=True)
    elif source == "slow":
        mounts.warm_page_cache([path])  # the local file behind slowfs: only slowfs's costs count
        with mounts.slowfs(args.slowfs, ckpt["checkpoint_dir"], args.slow_bandwidth_mbps, args.slow_latency_ms) as slow:
            yield os.path.join(slow.path, os.path.basename(path)), slow.path
        return
    yield path, None


def judge(res, source, peers, failures, use):
    """The targets: under --use sum (issue 24) each stfs row against the best other peer (least median
    time), and the first tensor; under light or full, issue 34's (NEAR_TARGETS)."""
    others = [p for p in OTHERS if p in peers and p in res.series]
    if others:
        best = min(others, key=lambda p: statistics.median(res.series[p]))
        judged = STFS_ROWS if use == "sum" else []
        for row in judged:
            if row in res.series:
                res.ratio_check(f"{source}: {row} vs the best peer ({best}), time ratio", best, row, TARGETS[source])
        for row, ref, target in NEAR_TARGETS.get((source, use), []) if use != "sum" else []:
            ref = best if ref == "best" else ref
            if row in res.series and ref in res.series:
                res.ratio_check(f"{source}, {use} use: {row} vs {ref}{' (the best peer)' if ref == best else ''}, "
                                f"time ratio (near-bytes target)", ref, row, target)
        for other in others:
            for row in NEAR_ROWS:
                ratios = res.paired_ratios(other, row)
                if ratios and not (other == best and row in judged):
                    res.note(f"{other} time / {row} time: {statistics.median(ratios):.2f}x "
                             f"[{min(ratios):.2f}-{max(ratios):.2f}]")
        for row in BEFORE_ROWS:
            ratios = res.paired_ratios(row + BEFORE, row)
            if ratios:
                res.note(f"{row}{BEFORE} (--before) time / {row} time: {statistics.median(ratios):.2f}x "
                         f"[{min(ratios):.2f}-{max(ratios):.2f}] (above 1: faster now)")
        for ref in ("load_file", "safe_open"):
            ratios = res.paired_ratios(ref, "safe_open") if ref == "load_file" else res.paired_ratios("safe_open", "stfs premounted")
            if ratios:
                res.note((f"load_file time / safe_open (on the local file) time: " if ref == "load_file" else
                          "safe_open on the local file / on the premounted re-served file: ")
                         + f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
        floors = [f for f in FLOORS if f in res.series]
        if floors:
            bound(res, source, best, floors, TARGETS[source] if use == "sum" else 1.0)
    if "runai first" in res.series and "stfs first" in res.series:
        res.ratio_check(f"{source}: first tensor, the streamer's time / stfs's (stfs <= 0.1x)", "runai first",
                        "stfs first", FIRST_TARGET)
    for (src, peer), why in failures.items():
        if src == source:
            res.note(f"{peer}: not measured past {why}")


def bound(res, source, best, floors, target):
    """The floors against the target: the time the target asks for (the best peer's median over the
    target), each floor's, and the most any loader could reach over the best peer (its time over the
    floor's, paired by repetition). The touch of a repetition is the faster touch floor (of anonymous
    memory, or of the cached file's mappings). From the page cache a loader need read nothing: the
    floor is that touch. Otherwise it must read the file and touch it, at best overlapped: the floor
    of a repetition is max(touch, the fastest read floor's reads alone)."""
    touches = [f for f in TOUCH_FLOORS if f in res.series]
    if not touches:
        return
    floor = touch = touches[0]
    if len(touches) > 1:
        floor = touch = "touch: the faster touch floor"
        for rep in range(min(len(res.series[f]) for f in touches)):
            res.add(touch, min(res.series[f][rep] for f in touches))
    reads = [f"{f}, reads only" for f in floors if f not in TOUCH_FLOORS and f"{f}, reads only" in res.series]
    if source != "page" and reads:
        floor = "floor: max(touch, reads)"
        for rep, touched in enumerate(res.series[touch]):
            fastest = [res.series[r][rep] for r in reads if rep < len(res.series[r])]
            if fastest:
                res.add(floor, max(touched, min(fastest)))
    if floor not in res.series:
        return
    need = statistics.median(res.series[best]) / target
    ceiling = res.paired_ratios(best, floor)
    text = (f"bound: {target:g}x of {best} = {need:.3f} s; "
            + "; ".join(f"{f} {statistics.median(res.series[f]):.3f} s" for f in [*floors, *reads] if f != floor)
            + f"; {floor} {statistics.median(res.series[floor]):.3f} s")
    if ceiling:
        top = statistics.median(ceiling)
        text += (f"; {best} / {floor}, paired: {top:.2f}x [{min(ceiling):.2f}-{max(ceiling):.2f}], the most any "
                 f"loader could reach over {best}"
                 + (f": below the {target:g}x target, out of reach" if top < target else ""))
    res.note(text)
    for row in NEAR_ROWS:
        share = res.paired_ratios(floor, row)
        if share:
            res.note(f"{floor} / {row}: {statistics.median(share):.2f}x [{min(share):.2f}-{max(share):.2f}] "
                     f"(1.00x: {row} at the floor)")


NATIVE_ROWS = {"stfs.load", "stfs first", "stfs ranks"}


def native_folder(args, tmp):
    """A folder readable by every user holding stfs/_native.abi3.so, the extension the no-mount rows
    import: --native, else the newer of the release cdylib (where it is one: built with --features
    python) and scripts/test's debug build; none found is one line and exit."""
    target = cargo_paths.target_dir()
    release = os.path.join(target, "release", "libstfs.so")
    debug = os.path.join(target, "python-native", "stfs", "_native.abi3.so")
    native = args.native
    if native is None:
        built = []
        for path in (release, debug):
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    if b"PyInit__native" in f.read():  # a cdylib built with --features python
                        built.append(path)
        native = max(built, key=os.path.getmtime, default=None)  # the newer: never a stale one over a fresh
        if native == debug:
            print(f"note: the extension module is scripts/test's debug build ({debug}): the no-mount rows' "
                  "figures are not a release's", flush=True)
    if native is None or not os.path.isfile(native):
        sys.exit("scripts/bench/loaders.py: no extension module for the no-mount rows (--native): build it with "
                 "cargo rustc --release --lib --features python --crate-type cdylib")
    os.chmod(tmp, 0o755)
    os.makedirs(os.path.join(tmp, "stfs"), mode=0o755)
    shutil.copy(native, os.path.join(tmp, "stfs", "_native.abi3.so"))
    os.chmod(os.path.join(tmp, "stfs", "_native.abi3.so"), 0o755)
    print(f"extension module: {native}", flush=True)
    return tmp


def fastsafe_settings(args, ckpt, sums):
    """fastsafetensors' options: {} (its defaults) if they run here, else nogds=True if that runs; None
    and the reason if neither does. Tried once on the checkpoint in the page cache."""
    tried = []
    for opts in ({}, {"nogds": True}):
        w = Worker(dict(os.environ), prep(args, "fastsafe", ckpt))
        try:
            w.ready(args.run_timeout)
            check("fastsafe", w.run({"peer": "fastsafe", "source": ckpt["checkpoint"], "fastsafe": opts},
                                    args.run_timeout), ckpt, sums)
            return opts, tried
        except RuntimeError as err:
            tried.append(f"fastsafe_open(device='cpu'{', nogds=True' if opts else ''}) fails: {err}")
        finally:
            w.kill()
    return None, tried


def main():
    args = parse_args()
    if args.worker:
        return worker(args.prep)
    # `timeout` (scripts/test) stops the run with SIGTERM: exit through the contexts, which unmount.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sources = [s for s in args.only.split(",") if s]
    peers = [p for p in args.peers.split(",") if p]
    if os.geteuid() != 0 and not set(sources) <= FLOOR_SOURCES:
        sys.exit("scripts/bench/loaders.py: slow and s3 need root (slowfs, the S3 server); page and cold run as any user")
    if args.before:
        if not args.before_stfs or not os.access(args.before_stfs, os.X_OK):
            sys.exit("scripts/bench/loaders.py: --before needs --before-stfs, the earlier stfs binary")
        peers += [row + BEFORE for row in BEFORE_ROWS if row in peers]
    unknown = [s for s in sources if s not in SOURCES] + [p for p in peers if p.removesuffix(BEFORE) not in PEERS]
    if unknown:
        sys.exit(f"scripts/bench/loaders.py: unknown --only or --peers value(s): {', '.join(unknown)}")
    if any(p.startswith("stfs") for p in peers) and not os.access(args.stfs, os.X_OK):
        sys.exit(f"scripts/bench/loaders.py: {args.stfs}: no stfs binary (cargo build --release)")
    import checkpoint
    import mounts  # noqa: F401
    import report
    report.JUDGED = not args.quick
    if args.unprivileged and (os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv"))):
        sys.exit("scripts/bench/loaders.py: --unprivileged needs root, unshare and setpriv (apt-get install util-linux)")
    native_tmp = tempfile.TemporaryDirectory(prefix="stfs-bench-native-")
    args.native_dir = native_folder(args, native_tmp.name) if any(p in NATIVE_ROWS for p in peers) else None

    notes = []
    requested = list(peers)
    if "runai" in peers:
        ok, why = ensure("runai_model_streamer", "runai-model-streamer", not args.no_install)
        if ok and "s3" in sources:
            # The S3 backend of the same release: a newer one would pull a newer streamer in.
            ok_s3, why_s3 = ensure("runai_model_streamer_s3", f"{PIP['runai-s3']}=={version('runai-model-streamer')}",
                                   not args.no_install)
            if not ok_s3:
                notes.append(f"runai from s3: {why_s3}")
        if not ok:
            peers.remove("runai")
            notes.append(f"runai: {why}")
    if "slow" in sources and not os.access(args.slowfs, os.X_OK):
        print("building slowfs (cargo build --release --example slowfs)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "slowfs"], cwd=REPO, check=True, timeout=1800)

    print(f"preparing a {args.size_mb} MiB checkpoint in {args.workdir}", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    layout = (checkpoint.f32_layout if args.layout == "f32" else checkpoint.transformer_layout)(args.size_mb << 20)
    ckpt = checkpoint.build(args.workdir, f"{args.layout}-{args.size_mb}M", layout, with_squashfs=False)
    sums = expected_sums(ckpt, args.use)
    if args.unprivileged:  # the writer leaves it 0600: nobody's workers read it
        os.chmod(ckpt["checkpoint"], 0o644)
    fastsafe_opts = {}
    if "fastsafe" in peers:
        ok, why = ensure("fastsafetensors", PIP["fastsafe"], not args.no_install)
        fastsafe_opts, tried = fastsafe_settings(args, ckpt, sums) if ok else (None, [why])
        notes += [f"fastsafetensors: {t}" for t in tried]
        if fastsafe_opts is None:
            peers.remove("fastsafe")
            notes.append("fastsafetensors: not runnable here (see above)")
        elif not fastsafe_opts:
            notes.append("fastsafetensors: ran at its defaults, fastsafe_open(SRC, device='cpu'), with no CUDA device")
        else:
            notes.append("fastsafetensors: measured with nogds=True (its pread path into host memory), since its "
                         "default copier (GDS, cuFile) cannot run here")
    machine = (f"python {sys.version.split()[0]}, torch {version('torch')}, safetensors {version('safetensors')}, "
               f"runai-model-streamer {version('runai-model-streamer')}, runai-model-streamer-s3 "
               f"{version('runai-model-streamer-s3')}, fastsafetensors {version('fastsafetensors')}; "
               f"{os.cpu_count()} CPUs, load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(machine, flush=True)
    for note in notes:
        print(f"note: {note}", flush=True)

    dropped = [p for p in requested if p not in peers] + [n for n in notes if n.startswith("runai from s3")]
    failures, results = {}, []
    for source in sources:
        print(f"source {source} ({args.reps} rep(s))...", flush=True)
        if source == "s3":
            with tempfile.TemporaryDirectory(prefix="stfs-bench-loaders-", dir=args.workdir) as workdir:
                with s3_endpoint(args, ckpt, workdir) as (endpoint, proxy):
                    res = run_source(args, source, ckpt, peers, sums, endpoint, fastsafe_opts, failures, proxy)
            res.note(f"the streamer ran with RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS={args.runai_s3_request_timeout_ms} "
                     "(raised: its 1000 ms default failed on a loaded 2-core machine; "
                     "RUNAI_STREAMER_S3_TIMEOUT, its retry window in seconds, at its default) and "
                     "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0 "
                     "(a loopback endpoint); fastsafetensors and load_file read local files only")
        else:
            res = run_source(args, source, ckpt, peers, sums, None, fastsafe_opts, failures)
        report.print_results(res, sys.stdout)
        sys.stdout.flush()
        results.append(res)
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.quick:
        print("figures not judged (a --quick smoke run: toy sizes; judge a full run)")
    else:
        missed = [c["label"] for r in results for c in r.checks if c["status"] == "FAIL"]
        print(f"{len(missed)} target(s) missed" + (": " + "; ".join(missed) if missed else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "notes": notes,
                       "failures": {f"{s} {p}": why for (s, p), why in failures.items()},
                       "sources": {r.key: r.to_json() for r in results}}, f, indent=1)
    # Every figure is printed first; then a run that failed, or a peer that could not be installed, is an
    # error (the smoke in scripts/test must not pass with a loader silently missing).
    if failures or dropped:
        sys.exit(f"scripts/bench/loaders.py: {len(failures)} run(s) failed"
                 + "".join(f"; {s} {p}: {why}" for (s, p), why in failures.items())
                 + (f"; not measured: {', '.join(dropped)}" if dropped else ""))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
