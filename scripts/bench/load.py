"""Workloads run as a separate process by the benchmark driver; each prints one JSON line of results.

Modes:
  ref   CHECKPOINT      safetensors.safe_open(framework="numpy") + get_tensor (mmap of the file)
  files DIR             np.fromfile of each tensor file DIR/<name> (an stfs mount or a plain dir)
  rand  DIR             random 4 KiB preads inside the tensor files DIR/<name>, first touch
Tensor names, dtypes and shapes always come from --header (a local copy of the checkpoint), so
the slow mount is never touched except by the measured loads. With --wait-go the process starts,
imports numpy, reads the header, prints "ready", and loads only once a line arrives on its standard
input: a driver can then time the load without the interpreter's start. Everything else, the import
of safetensors in `ref` mode included, stays in the timed part, as in a process started cold (with
safetensors imported before "ready", s3fs's 1 GiB load in s3.py took 14.1 s against 9.4 s, twice).
"""

import argparse
import json
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint import NUMPY_DTYPES, read_header  # noqa: E402


def ordered_names(header, order, seed):
    names = [t[0] for t in header]  # file-offset order
    if order == "shuffled":
        random.Random(seed).shuffle(names)
    return names


def run_workers(workers, job):
    """Runs job(worker_index) in `workers` forked children (or inline for 1); fails if any child fails."""
    if workers == 1:
        job(0)
        return
    children = []
    for index in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                job(index)
            except BaseException as err:  # report, then exit without running the parent's cleanup
                print(f"worker {index}: {err!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        children.append(pid)
    failed = [pid for pid in children if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} worker(s) failed")


def load_ref(args, header):
    from safetensors import safe_open

    names = ordered_names(header, args.order, args.seed)
    started = time.perf_counter()
    # Opened before the fork: the workers share this open file (and its mmap), like a DataLoader
    # or multi-process loader that inherits an already opened checkpoint.
    with safe_open(args.target, framework="numpy") as f:
        def job(index):
            for name in names[index::args.workers]:
                f.get_tensor(name)
        run_workers(args.workers, job)
    return time.perf_counter() - started


def load_files(args, header):
    info = {t[0]: t for t in header}
    names = ordered_names(header, args.order, args.seed)
    started = time.perf_counter()

    def job(index):
        for name in names[index::args.workers]:
            _, dtype, shape, start, end = info[name]
            array = np.fromfile(os.path.join(args.target, name), dtype=NUMPY_DTYPES[dtype])
            if array.nbytes != end - start:
                raise RuntimeError(f"{name}: read {array.nbytes} bytes, expected {end - start}")
            array.reshape(shape)
    run_workers(args.workers, job)
    return time.perf_counter() - started


def load_rand(args, header):
    rng = random.Random(args.seed)
    sizes = [(t[0], t[4] - t[3]) for t in header if t[4] - t[3] >= 4096]
    fds = {name: os.open(os.path.join(args.target, name), os.O_RDONLY) for name, _ in sizes}
    reads = []
    for _ in range(args.count):
        name, size = rng.choice(sizes)
        reads.append((fds[name], rng.randrange(0, size - 4096 + 1)))
    try:
        started = time.perf_counter()
        for fd, offset in reads:
            if len(os.pread(fd, 4096, offset)) != 4096:
                raise RuntimeError("short read")
        return time.perf_counter() - started
    finally:
        for fd in fds.values():
            os.close(fd)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["ref", "files", "rand"])
    parser.add_argument("target")
    parser.add_argument("--header", required=True, help="local checkpoint to take names and shapes from")
    parser.add_argument("--order", choices=["file", "shuffled"], default="file")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--count", type=int, default=2000, help="reads in rand mode")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--wait-go", action="store_true",
                        help='say "ready" once set up, then load when a line arrives on standard input')
    args = parser.parse_args()
    header = read_header(args.header)
    if args.wait_go:
        print("ready", flush=True)
        if not sys.stdin.readline():
            raise SystemExit("no go: standard input closed")
    seconds = {"ref": load_ref, "files": load_files, "rand": load_rand}[args.mode](args, header)
    print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    main()
