"""stfs.load over the re-served checkpoint files: where the mount hands a shard's file to the kernel
(FUSE passthrough: root, a local file), each such shard is mapped once and its tensors are views of that
mapping (zero copy, as safetensors' load_file), since reading the mapping then runs at the local file's
speed. Only raw tensors qualify (a view such as ``as_="f32"`` serves other bytes); the caller loads the
rest its usual way.

From a cold page cache such a mapping would be read by its page faults, a little at a time; for torch
(whose stfs.load reads every byte anyway where nothing is handed over) read_ahead has threads read the
mapped shards into the page cache, while the caller goes on using the tensors; from a warm one
fault_in_ahead has a thread take a mapping's pages into the page tables before the caller's touches do."""
from __future__ import annotations

import _thread
import atexit
import json
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ._mapping import pages_cached

#: read_ahead's threads each read this much per pread(2), into a buffer of their own: as fast as 2 MiB
#: and the kernel's readahead keeps ahead of it, so the file is left in large folios (2 MiB reads
#: outran it and left a tenth of a 2 GiB file in 4 KiB pages; docs/notes/benchmarks.md).
READ_AHEAD_STEP = 512 << 10
#: read_ahead runs at most this many threads, each on its own stretch of the files: a disk answers
#: more reads at once the more streams ask (on the test VM's virtio disk 16 streams kept about 25
#: reads in flight and filled 2 GiB in 1.8-2.5 s, 64 kept about 140 and took 1.0 s; Run:ai keeps
#: about 100 in flight with O_DIRECT; docs/notes/benchmarks.md)...
READ_AHEAD_THREADS = 64
#: ...of at least this many bytes, so a small load starts few threads (32 MiB stretches beat 16 and
#: 64 MiB ones on a 512 MiB file).
READ_AHEAD_SPAN = 32 << 20
#: read_ahead reads at most this share of the memory available (memory_available: the kernel's
#: MemAvailable, or less where the process's memory cgroup leaves it less): the caller uses the tensors
#: in file order, so of a checkpoint larger than memory only the head is read ahead (the rest comes in
#: by the caller's page faults), where reading it all would evict the head before the caller got to it.
READ_AHEAD_MEMORY_SHARE = 0.5
#: How long stop() waits, in all, for read_ahead's threads to end (each ends after its current
#: READ_AHEAD_STEP read: milliseconds, unless the mount is stuck).
READ_AHEAD_STOP_SECONDS = 5.0
#: read_ahead takes a file whose steps at this many places are cached as cached, and reads none of it.
CACHED_SAMPLES = 64

#: fault_in_ahead touches one byte per this many bytes: the kernel's default fault-around window
#: (fault_around_bytes), so over a file cached in small folios each touch maps a window the one before
#: did not; a 2 MiB folio is mapped whole by its first touch.
FAULT_STRIDE = 64 << 10

#: fault_in_ahead starts no thread for fewer mapped bytes than this: a thread's start cost more than
#: the faults of a small file cost the caller (measured with Thread.start, which waits until the thread
#: runs: a 4 MiB load and light use took 1.55 ms with the thread, 1.23 ms without; 32 MiB 3.2 ms and
#: 3.4 ms; 2026-12-02); _Started does not wait (0.13 ms), the threshold is kept.
FAULT_MIN_BYTES = 16 << 20

#: How long the interpreter's exit waits, in all, for fault_in_ahead's threads to stop.
FAULT_STOP_SECONDS = 1.0

#: The extended attribute an stfs file carries: "1" while its opens are handed to the kernel.
PASSTHROUGH_XATTR = "user.stfs.passthrough"


def handed_over(root: str) -> Dict[int, Any]:
    """shard index -> (path, size) of each re-served file the mount hands to the kernel: asked of the
    file itself while it is open (its PASSTHROUGH_XATTR is "1"), so no other process's opens can be
    taken for it. Empty where nothing is (not root, a remote source, --no-passthrough, an older
    stfs without the attribute)."""
    with open(os.path.join(root, "metadata.json"), "rb") as f:
        meta = json.load(f)
    files = [f for f in meta.get("checkpoint_files", []) if "shard" in f and f.get("size")]
    out: Dict[int, Any] = {}
    try:
        for f in files:
            path = os.path.join(root, f["path"])
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.getxattr(fd, PASSTHROUGH_XATTR) == b"1":
                    out[int(f["shard"])] = (path, int(f["size"]))
            finally:
                os.close(fd)
    except (OSError, ValueError, KeyError):
        return {}
    if out:
        out["tensors"] = meta["tensors"]
    return out


def views(root: str, items: List[Any], map_shard: Callable[[str, int], Any], view: Callable[[Any, Any], Any],
          mapped: Optional[Callable[[List[str]], None]] = None) -> Dict[str, Any]:
    """name -> view(flat bytes of the tensor, entry) for every raw tensor of a handed-over shard:
    `map_shard(path, size)` maps a shard once (a 1-D uint8 array or tensor), `view` types a slice of
    it; `mapped`, if given, is handed the path of every shard mapped, in shard order, once all are
    made. The rest are left out, for the caller to load."""
    shards = handed_over(root)
    if not shards:
        return {}
    tensors = shards.pop("tensors")
    maps: Dict[int, Any] = {}
    out: Dict[str, Any] = {}
    for e in items:
        info = tensors.get(e.name, {})
        shard = info.get("shard")
        raw = info.get("served_dtype", info.get("dtype")) == info.get("dtype") and info.get("served_byte_len", e.byte_len) == info.get("byte_len")
        if shard not in shards or not raw or not e.byte_len:
            continue
        if shard not in maps:
            maps[shard] = map_shard(*shards[shard])
        start = int(info["offset"])
        out[e.name] = view(maps[shard][start:start + e.byte_len], e)
    if mapped is not None and maps:
        mapped([shards[k][0] for k in sorted(maps)])
    return out


class ReadAhead:
    """read_ahead's threads: stop() ends them between two reads (a failed load must not go on
    reading, nor hold the mount it detached lazily, and its daemon, alive)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.threads: List[Any] = []  # threading.Thread and _Started: join, is_alive
        self.flags: List[Any] = []  # stfs._native.StopFlag's of threads in native code, set by stop()

    def stop(self, timeout: float = READ_AHEAD_STOP_SECONDS) -> bool:
        """Tells the threads to stop and waits for them, `timeout` seconds in all; whether all ended
        (each closes its own descriptors as it ends). A thread stuck in a read of a hung mount is left
        behind: it is a daemon thread, and ends with the read."""
        self.stopping.set()
        for flag in self.flags:
            flag.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)


def read_ahead(paths: Sequence[str], ahead: Optional[ReadAhead] = None) -> ReadAhead:
    """Starts daemon threads that read the files into the page cache, and returns them (`ahead`, or a
    new ReadAhead, to stop them with; a caller that passes its own can stop threads started before an
    exception, Ctrl-C included, left this function): the files, taken as one run of bytes in order, are cut into up to
    READ_AHEAD_THREADS stretches of at least READ_AHEAD_SPAN bytes, and each thread reads its stretch
    front to back with READ_AHEAD_STEP preads into a buffer of its own, on a descriptor of its own
    (so the kernel sees one sequential stream per thread and reads each ahead in large folios),
    looking between two reads whether it is to stop (ReadAhead.stop). Many streams keep the disk busy, where one stream
    through the kernel's readahead left it half idle; and the copy makes the CPU touch every page
    as it arrives, which a virtual machine's first touch of a page frame makes cost (a fill that
    never touched the bytes, sendfile(2) to /dev/null or MADV_POPULATE_READ, left up to a second per
    2 GiB for the caller's own first touch; docs/notes/benchmarks.md). A file found cached at
    CACHED_SAMPLES places (_mapping.pages_cached) is not read at all: from the page cache a load then costs
    what load_file's does. (A stretch cannot skip its cached steps: a reader that jumps ahead is
    no sequential stream to the kernel, which then reads the rest in 4 KiB pages.) A file that
    cannot be opened ends the list there. Only as many bytes as READ_AHEAD_MEMORY_SHARE of the
    memory available (memory_available: the cgroup's bound included) are read (of a checkpoint larger
    than memory, its head). The files are opened here, before load detaches its mount, and each thread
    closes its own. Best effort: an error ends that thread's stretch quietly."""
    ahead = ReadAhead() if ahead is None else ahead
    files: List[Any] = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            break
        try:
            size = os.fstat(fd).st_size
            if not sampled_cached(fd, size):
                files.append((path, size))
        except OSError:
            break
        finally:
            os.close(fd)
    total = sum(size for _, size in files)
    if total <= 0:  # every file cached (a load from the page cache): no need to look at the memory (2 ms)
        return ahead
    available = memory_available()
    if available is not None:
        total = min(total, int(available * READ_AHEAD_MEMORY_SHARE))
    if total <= 0:
        return ahead
    threads = max(1, min(READ_AHEAD_THREADS, total // READ_AHEAD_SPAN))
    cuts = [total * k // threads for k in range(threads + 1)]
    stretches: List[List[Any]] = [[] for _ in range(threads)]
    start = 0  # where the file below starts in the run of all the files' bytes
    for path, size in files:
        for k in range(threads):
            lo, hi = max(cuts[k], start), min(cuts[k + 1], start + size)
            if lo < hi:
                stretches[k].append((path, lo - start, hi - start))
        start += size
    # Each thread gets its own descriptors (the kernel keeps readahead state per open file).
    opened: List[List[Any]] = []
    try:
        for stretch in stretches:
            opened.append([])
            for path, lo, hi in stretch:
                opened[-1].append((os.open(path, os.O_RDONLY | os.O_CLOEXEC), lo, hi))
    except OSError:
        pass
    except BaseException:  # Ctrl-C while opening: no thread owns these yet
        for pieces in opened:
            for fd, _, _ in pieces:
                os.close(fd)
        raise
    stopping = ahead.stopping

    def run(pieces: List[Any]) -> None:
        buf = memoryview(bytearray(READ_AHEAD_STEP))
        try:
            for fd, at, end in pieces:
                while at < end and not stopping.is_set():
                    n = os.preadv(fd, [buf[:min(READ_AHEAD_STEP, end - at)]], at)
                    if not n:
                        break
                    at += n
        except OSError:
            pass
        finally:
            for fd, _, _ in pieces:
                os.close(fd)

    for k, pieces in enumerate(opened):
        if stopping.is_set():  # stopped meanwhile: the descriptors no thread took are closed here
            for rest in opened[k:]:
                for fd, _, _ in rest:
                    os.close(fd)
            break
        t = threading.Thread(target=run, args=(pieces,), name="stfs-read-ahead", daemon=True)
        ahead.threads.append(t)
        t.start()
    return ahead


def fault_in_ahead(maps: Sequence[Any], native: Any, ahead: ReadAhead) -> None:
    """Starts a daemon thread (one of `ahead`'s) that maps the pages of each of `maps` (private
    mappings of files found in the page cache, in order) into this process's page tables, by one
    call of `native`.fault_in_idle (stfs._native: one read every FAULT_STRIDE bytes, the GIL released
    throughout), while the caller starts on the tensors: the caller's own first touches then find
    their pages mapped. A light use of 2 GiB (one byte a page) after the load was 1.41x load_file's
    in loaders.py, 1.7-1.9x in one process (2026-12-02, docs/performance.md). The walk runs at
    SCHED_IDLE, only on a CPU nothing else wants: at a plain priority it took a CPU from a caller
    copying every byte on all of them (0.84-0.94x load_file's time); and nothing at that priority
    ever holds or asks for the GIL: the walk is a native thread of fault_in_idle's own, which this
    thread waits for with the GIL released at its own policy (a thread that took the GIL back at
    SCHED_IDLE kept the caller waiting for it: between 64 MiB stretches, 0.96x against 1.0x without
    the thread; once at the end, an unprivileged load beside two CPU-bound processes 2 s instead of
    0.1 s, 2026-12-03: tests/python/test_engine.py). Where that policy
    cannot be set it ends at once, and where the process may run on one CPU only, or the mappings
    hold fewer than FAULT_MIN_BYTES, none is started. ahead.stop() and the interpreter's exit stop it
    through a native flag it looks at every 2 MiB. Faults, not MADV_POPULATE_READ: that holds the
    process's memory-map lock through each call, and a thread of the caller's that mapped memory
    meanwhile waited 3-10 ms for it. Best effort: the mappings' bytes are the same either way."""
    if sum(len(m) for m in maps) < FAULT_MIN_BYTES or ahead.stopping.is_set():
        return
    try:
        if len(os.sched_getaffinity(0)) < 2:
            return
    except (AttributeError, OSError):  # not Linux
        return
    flag = native.StopFlag()
    buffers = [(m, len(m)) for m in maps]

    def run() -> None:
        try:
            native.fault_in_idle(buffers, FAULT_STRIDE, flag)
        except (OSError, ValueError):
            pass
        finally:
            with _FAULTING_LOCK:
                _FAULTING.discard(entry)

    t = _Started(run)
    entry = (flag, t)
    with _FAULTING_LOCK:
        _FAULTING.add(entry)
    ahead.flags.append(flag)
    try:
        t.start()
    except RuntimeError:  # no thread to be had: the caller's touches fault the pages in themselves
        with _FAULTING_LOCK:
            _FAULTING.discard(entry)
        return
    ahead.threads.append(t)


class _Started:
    """A daemon thread started with _thread.start_new_thread, which returns at once, where
    threading.Thread.start waits until the new thread runs: on 2 CPUs 0.3-0.5 ms of the caller's
    load (a third of a 2 GiB load from the page cache, 2026-12-03). join and is_alive as a Thread's,
    from an event the thread sets as its target returns."""

    def __init__(self, target: Callable[[], None]) -> None:
        self._target: Optional[Callable[[], None]] = target
        self._done = threading.Event()

    def start(self) -> None:
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        try:
            if self._target is not None:
                self._target()
        finally:
            self._target = None  # what it held (the mappings) goes with it, as a Thread's does
            self._done.set()

    def join(self, timeout: Optional[float] = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


#: fault_in_ahead's running threads, each with the event that stops it (each takes itself out as it ends).
_FAULTING: Set[Tuple[Any, "_Started"]] = set()
_FAULTING_LOCK = threading.Lock()


def fault_ins_running() -> int:
    """How many of fault_in_ahead's threads are running."""
    with _FAULTING_LOCK:
        return len(_FAULTING)


@atexit.register
def _stop_faulting() -> None:
    """Stops fault_in_ahead's threads before the interpreter ends: a daemon thread still in
    stfs._native.fault_in_idle then would be ended by the interpreter as it takes the GIL back, an
    unwind through the extension's frames that aborts the process (SIGABRT: "FATAL: exception not
    rethrown" or a fatal Python error). Each stops within 2 MiB of touches; atexit runs before the
    interpreter ends such threads."""
    with _FAULTING_LOCK:
        running = list(_FAULTING)
    for flag, _ in running:
        flag.set()
    deadline = time.monotonic() + FAULT_STOP_SECONDS
    for _, thread in running:
        thread.join(max(0.0, deadline - time.monotonic()))


def sampled_cached(fd: int, size: int) -> bool:
    """Whether the file open as `fd` (`size` bytes) is taken as in the page cache: the first and last
    pages of READ_AHEAD_STEP steps at CACHED_SAMPLES places spread over it (and its last step) are
    (_mapping.pages_cached). The kernel reads a file in and drops it in folios of up to 2 MiB, so a
    step's ends stand for it; each check costs a few µs, every page would cost 30 ms per 2 GiB."""
    steps = max(1, -(-size // READ_AHEAD_STEP))
    picks = sorted({steps * k // CACHED_SAMPLES for k in range(CACHED_SAMPLES)} | {steps - 1})
    ends = (at for i in picks for at in (i * READ_AHEAD_STEP, min((i + 1) * READ_AHEAD_STEP, size) - 1))
    return pages_cached(fd, size, ends)


def memory_available(root: str = "/") -> Optional[int]:
    """Bytes of memory this process may still fill: the kernel's MemAvailable (/proc/meminfo), or what
    its memory cgroup leaves it (cgroup_memory_left) where that is less; None where neither is known.
    `root` stands for / (a test's fake /proc and /sys)."""
    known = [n for n in (mem_available(root), cgroup_memory_left(root)) if n is not None]
    return min(known) if known else None


def mem_available(root: str = "/") -> Optional[int]:
    """Bytes of memory the kernel reports available (/proc/meminfo MemAvailable): the host's, whatever
    the process's cgroup allows; None where unknown."""
    try:
        with open(os.path.join(root, "proc/meminfo"), "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_memory_left(root: str = "/") -> Optional[int]:
    """Bytes this process's memory cgroups still let it fill: over its own cgroup and each parent up
    to the top of the hierarchy as mounted here, the least of the limit less the usage (a container's
    bound is often set on a parent), the usage less the inactive page cache the kernel reclaims first
    (as MemAvailable counts it available). cgroup v2 (/proc/self/cgroup's ``0::`` line, a ``cgroup2``
    mount): memory.max ("max": none), memory.current, memory.stat's inactive_file; v1 (the
    ``memory`` controller's line and mount): memory.limit_in_bytes (a page-rounded 2^63: none),
    memory.usage_in_bytes, memory.stat's total_inactive_file. None where no limit is set or nothing
    can be read. `root` stands for / (a test's fake /proc and /sys)."""
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        with open(os.path.join(root, "proc/self/mountinfo"), encoding="utf-8", errors="replace") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    v2 = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    v1 = next((line.split(":", 2)[2] for line in lines
               if len(line.split(":", 2)) == 3 and "memory" in line.split(":", 2)[1].split(",")), None)
    for path, fstype, files in ((v1, "cgroup", _V1_FILES), (v2, "cgroup2", _V2_FILES)):
        if path is None:
            continue
        top = _cgroup_mount(mounts, fstype, path)
        if top is None:
            continue
        mount_point, mount_root = top
        left = _least_left(root, mount_point, mount_root, path, files)
        if left is not None:
            return left
    return None


#: (limit, usage, the memory.stat key of the inactive page cache) of cgroup v1 and v2.
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
_V2_FILES = ("memory.max", "memory.current", "inactive_file")
#: A v1 limit at or above this is none (the kernel's "unlimited" is 2^63 rounded down to a page).
_V1_UNLIMITED = 1 << 62


def _cgroup_mount(mounts: List[str], fstype: str, path: str) -> Optional[Any]:
    """(mount point, the cgroup it shows as its root) of the `fstype` hierarchy holding `path`, from
    /proc/self/mountinfo lines (for v1, the one with the memory controller); None if not mounted."""
    for line in mounts:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if not after or after[0] != fstype:
            continue
        if fstype == "cgroup" and "memory" not in (after[2].split(",") if len(after) > 2 else []):
            continue
        mount_root, mount_point = fields[3], fields[4].replace("\\040", " ")
        if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
            return mount_point, mount_root
    return None


def _least_left(root: str, mount_point: str, mount_root: str, path: str, files: Any) -> Optional[int]:
    """The least room left over the cgroup at `path` and its parents up to `mount_root` (see
    cgroup_memory_left); None if none of them has a limit."""
    limit_file, usage_file, inactive_key = files
    relative = path[len(mount_root.rstrip("/")):].strip("/")
    parts = relative.split("/") if relative else []
    least: Optional[int] = None
    for depth in range(len(parts), -1, -1):
        directory = os.path.join(root, mount_point.lstrip("/"), *parts[:depth])
        try:
            with open(os.path.join(directory, limit_file)) as f:
                text = f.read().strip()
            if text == "max" or int(text) >= _V1_UNLIMITED:
                continue
            with open(os.path.join(directory, usage_file)) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        used -= min(used, _stat(directory, inactive_key))
        left = max(0, int(text) - used)
        least = left if least is None else min(least, left)
    return least


def _stat(directory: str, key: str) -> int:
    """`key`'s value in the cgroup's memory.stat, 0 if not there."""
    try:
        with open(os.path.join(directory, "memory.stat")) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def torch_view(flat, dtype, shape):
    """The bytes `flat` (a slice of a shard's mapping, 1-D, of uint8 or already of `dtype`) as a tensor
    of `dtype` and `shape`: a view, or a copy where the offset is not aligned to the element size (a
    view cannot start there)."""
    if flat.dtype == dtype:
        return flat.reshape(shape)
    try:
        return flat.view(dtype).reshape(shape)
    except RuntimeError:
        return flat.clone().view(dtype).reshape(shape)
