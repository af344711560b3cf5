"""Mount helpers for the benchmark: stfs, slowfs and squashfuse, each a context manager that always unmounts.

Every mount point is a fresh temporary directory; every wait has a deadline; unmounting tries the
filesystem's own command, then `umount`, then `umount -l`, and finally kills a daemon we started.
"""

import contextlib
import json
import os
import subprocess
import tempfile
import time

MOUNT_TIMEOUT_S = 30
UMOUNT_TIMEOUT_S = 30


def _unescape(field):
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def is_mounted(path):
    """True if `path` (made absolute and resolved) is a mount point listed in /proc/self/mountinfo."""
    path = os.path.realpath(path)
    # Another mount's point may not be UTF-8 (a test's Latin-1 name): compared as the bytes it is.
    with open("/proc/self/mountinfo", errors="surrogateescape") as f:
        return any(_unescape(line.split(" ")[4]) == path for line in f)


def wait_mounted(path, proc=None, timeout=MOUNT_TIMEOUT_S):
    """Polls until `path` is mounted; fails early if `proc` (the daemon) exits first."""
    deadline = time.monotonic() + timeout
    while not is_mounted(path):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode} before {path} was mounted")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not mounted after {timeout} s")
        time.sleep(0.002)


def _wait_unmounted(path, timeout):
    deadline = time.monotonic() + timeout
    while is_mounted(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def force_unmount(path, first_cmd=None):
    """Unmounts `path` by every means available; never raises."""
    commands = ([first_cmd] if first_cmd else []) + [["umount", path], ["umount", "-l", path]]
    for cmd in commands:
        if not is_mounted(path):
            return
        try:
            subprocess.run(cmd, timeout=UMOUNT_TIMEOUT_S, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _wait_unmounted(path, 5)


def _stop_process(proc, timeout=UMOUNT_TIMEOUT_S):
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def temp_mountpoint(tag):
    path = tempfile.mkdtemp(prefix=f"stfs-bench-{tag}-")
    try:
        yield path
    finally:
        force_unmount(path)
        with contextlib.suppress(OSError):
            os.rmdir(path)


class Mounted:
    """What a mount context yields: the mount point, the daemon pid if known, and the mount time."""

    def __init__(self, path, pid, mount_seconds):
        self.path = path
        self.pid = pid
        self.mount_seconds = mount_seconds
        self.stats = None


@contextlib.contextmanager
def squashfuse(image):
    with temp_mountpoint("sqfs") as mnt:
        started = time.perf_counter()
        # Foreground mode so we own the daemon; it reports readiness only through the mount table.
        proc = subprocess.Popen(["squashfuse", "-f", image, mnt], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            wait_mounted(mnt, proc)
            yield Mounted(mnt, proc.pid, time.perf_counter() - started)
        finally:
            force_unmount(mnt)
            _stop_process(proc)


@contextlib.contextmanager
def slowfs(binary, src_dir, bandwidth_mbps, latency_ms, at=None):
    """slowfs serving src_dir on a fresh temporary mount point, or on the empty folder `at`."""
    with (contextlib.nullcontext(at) if at else temp_mountpoint("slow")) as mnt:
        cmd = [binary, src_dir, mnt, "--bandwidth-mbps", str(bandwidth_mbps), "--latency-ms", str(latency_ms)]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = _read_line_with_timeout(proc, MOUNT_TIMEOUT_S)
            if line.strip() != "ready":
                raise RuntimeError(f"slowfs did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}")
            yield Mounted(mnt, proc.pid, time.perf_counter() - started)
        finally:
            if proc.poll() is None:
                proc.terminate()  # slowfs unmounts itself on SIGTERM
            _stop_process(proc)
            force_unmount(mnt)


# Extra arguments for every limitfs mount (run.py --limit-opts).
LIMITFS_EXTRA_ARGS = []


@contextlib.contextmanager
def limitfs(binary, checkpoint, extra_args=()):
    """Mounts examples/limitfs presenting the tensor files of `checkpoint` (names and sizes; every
    read answered from one pre-faulted buffer, stfs's kernel settings): the limit row. With
    extra_args ["--backing"], reads are answered from an mmap of `checkpoint` instead.

    The yielded Mounted gets `.stats` (the server's READ counters) once the context has exited.
    """
    with temp_mountpoint("limit") as mnt:
        stats_file = mnt.rstrip("/") + ".stats.json"
        cmd = [binary, mnt, "--like", checkpoint, "--stats-file", stats_file] + list(extra_args) + LIMITFS_EXTRA_ARGS
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        mounted = None
        try:
            line = _read_line_with_timeout(proc, MOUNT_TIMEOUT_S)
            if line.strip() != "ready":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
                raise RuntimeError(f"limitfs did not start: {line!r} "
                                   f"{proc.stderr.read().strip() if proc.poll() is not None else ''}")
            mounted = Mounted(mnt, proc.pid, time.perf_counter() - started)
            yield mounted
        finally:
            if proc.poll() is None:
                proc.terminate()  # limitfs unmounts itself on SIGTERM
            _stop_process(proc)
            force_unmount(mnt)
            with contextlib.suppress(OSError, ValueError):
                with open(stats_file) as f:
                    if mounted is not None:
                        mounted.stats = json.load(f)
            with contextlib.suppress(OSError):
                os.unlink(stats_file)


def _read_line_with_timeout(proc, timeout):
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise TimeoutError("no readiness line from daemon")
    return proc.stdout.readline()


def slowfs_stats(mnt):
    with open(os.path.join(mnt, ".slowfs_stats")) as f:
        return json.load(f)


# Extra arguments for every stfs mount (run.py --stfs-opts), for tuning runs.
STFS_EXTRA_ARGS = []


@contextlib.contextmanager
def stfs(binary, checkpoint, cache_size=None, block_size=None, foreground=True):
    """Mounts `checkpoint` with stfs.

    foreground=True runs `stfs mount ... -f` as our child (pid known, for VmHWM) and waits for the
    mount table; foreground=False runs the documented `stfs mount` that returns once ready, and the
    mount time is that command's wall time.
    """
    with temp_mountpoint("stfs") as mnt:
        cmd = [binary, "mount", checkpoint, mnt]
        if cache_size:
            cmd += ["--cache-size", cache_size]
        if block_size:
            cmd += ["--block-size", block_size]
        cmd += STFS_EXTRA_ARGS
        proc = None
        started = time.perf_counter()
        try:
            if foreground:
                proc = subprocess.Popen(cmd + ["-f"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                wait_mounted(mnt, proc)
            else:
                subprocess.run(cmd, check=True, timeout=MOUNT_TIMEOUT_S, stdout=subprocess.DEVNULL)
                if not is_mounted(mnt):
                    raise RuntimeError("`stfs mount` returned but the mount is not in the mount table")
            mount_seconds = time.perf_counter() - started
            yield Mounted(mnt, proc.pid if proc else None, mount_seconds)
        finally:
            force_unmount(mnt, [binary, "umount", mnt])
            _stop_process(proc)


def stfs_stats(mnt):
    with open(os.path.join(mnt, ".stfs", "stats.json")) as f:
        return json.load(f)


def peak_rss_bytes(pid):
    """VmHWM of `pid` in bytes (peak resident set size)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


MAX_PAGES_LIMIT = "/proc/sys/fs/fuse/max_pages_limit"  # the kernel's cap on a FUSE request, in pages


@contextlib.contextmanager
def max_pages_limit():
    """Yields a setter of fs.fuse.max_pages_limit (pages: 256 is 1 MiB requests); restores the value
    found on the way out. stfs never changes it itself: benchmarks of the request size do."""
    with open(MAX_PAGES_LIMIT) as f:
        old = f.read().strip()

    def set_limit(pages):
        with open(MAX_PAGES_LIMIT, "w") as f:
            f.write(str(pages))
    try:
        yield set_limit
    finally:
        set_limit(old)


def resident_fraction(path):
    """The share of `path`'s pages in the page cache (mincore(2) of a mapping of it, no page touched);
    None for a file the caller may not write: mincore then says every page is cached (Linux 5.2+)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if not os.access(path, os.W_OK):
        return None
    if not size:
        return 0.0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(address, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def drop_page_cache(path, settle=10.0):
    """Drops the clean cached pages of one file (posix_fadvise DONTNEED); works on FUSE files too.
    DONTNEED leaves pages being read in (a readahead still in flight, a mount's own warm-up) and
    pages some process maps: it is repeated until under 1% of a local file's pages are cached, for up
    to `settle` seconds; returns the share left."""
    deadline = time.monotonic() + settle
    while True:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        try:
            left = resident_fraction(path)
        except OSError:
            return None
        if left is None or left < 0.01 or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def warm_page_cache(paths):
    """Reads files so they are resident in the page cache (this VM trims unpinned pages over time)."""
    buf = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
