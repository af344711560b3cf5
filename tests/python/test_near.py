"""stfs.load over a re-served checkpoint file the mount hands to the kernel (FUSE passthrough: root, a
local file) returns the same tensors, dtypes and shapes as over per-tensor files (a mount with
--no-passthrough), for NumPy and torch; the handed-over path is really taken (its counter moves) and, for
torch, returns views of one mapping of the shard (zero copy, as load_file)."""
import json
import os
import sys
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import ROOT, cold_files, wait_until

os.environ.setdefault("STFS_BIN", os.path.join(ROOT, "target", "debug", "stfs"))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package's source in this checkout
import stfs  # noqa: E402


def _counter(mp, key):
    with open(os.path.join(mp, ".stfs", "stats.json"), "rb") as f:
        return json.load(f)[key]


def _checkpoint(tmp_path):
    rng = np.random.default_rng(34)
    tensors = {
        "a": rng.standard_normal((300, 17)).astype(np.float32),
        "b": rng.integers(-100, 100, 5).astype(np.int8),
        "c": rng.standard_normal((3, 7)).astype(np.float16),
        "d": rng.integers(0, 1 << 40, 9).astype(np.int64),
        "e": np.zeros((0, 4), np.float32),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_load_over_a_handed_over_file_equals_load_over_tensor_files(tmp_path, framework):
    if os.geteuid() != 0:
        pytest.skip("FUSE passthrough needs root")
    if framework == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            assert os.environ.get("CI") not in ("true", "1"), "CI=true needs torch (tests/python/requirements-torch.txt)"
            pytest.skip("torch is not installed")
    path, want = _checkpoint(tmp_path)
    with stfs.mount(path) as on, stfs.mount(path, no_passthrough=True) as off:
        assert _counter(on, "passthrough_enabled") == 1
        shard = os.path.join(on, "model.safetensors")
        with open(shard, "rb") as held:
            assert os.getxattr(held.fileno(), "user.stfs.passthrough") == b"1"
        with open(os.path.join(off, "model.safetensors"), "rb") as held:
            assert os.getxattr(held.fileno(), "user.stfs.passthrough") == b"0"
        # The kernel sends a close's RELEASE after close(2) has returned: the daemon may hear of it
        # a little later, and says "1" until then.
        assert wait_until(lambda: os.getxattr(shard, "user.stfs.passthrough") == b"0", 10), "not open: nothing handed over"
        assert "user.stfs.passthrough" not in os.listxattr(shard)
        got_on = stfs.load(on, framework=framework)
        assert _counter(on, "passthrough_checkpoint_opens") >= 1
        assert _counter(on, "fuse_read_bytes") < os.path.getsize(path), "tensor bytes crossed the daemon"
        got_off = stfs.load(off, framework=framework)
        assert _counter(off, "passthrough_opens") == 0
        assert list(got_on) == list(got_off) and sorted(got_on) == sorted(want)
        for name, w in want.items():
            a, b = got_on[name], got_off[name]
            assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) == w.shape, name
            a = a.numpy() if framework == "torch" else a
            b = b.numpy() if framework == "torch" else b
            assert np.array_equal(a, w) and np.array_equal(b, w), name
        if framework == "torch":
            # Views of the one mapping of the shard file, not a copy per tensor.
            assert got_on["a"].untyped_storage().nbytes() == os.path.getsize(path)
        else:
            assert not got_on["a"].flags.writeable



def _read_ahead_threads():
    return [t for t in threading.enumerate() if t.name == "stfs-read-ahead"]


def _page_cache(path, folios=False):
    """(pages of `path` in the page cache, pages of it, and with `folios` the share of the cached ones
    in folios of more than one page), by mincore(2) over a mapping of it; the folios as root:
    /proc/self/pagemap gives each mapped page's frame, /proc/kpageflags its compound bits."""
    import ctypes
    import mmap
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as f:  # private and writable only so that ctypes may take its address
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        pages = (len(m) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        keep = ctypes.c_char.from_buffer(m)
        base = ctypes.addressof(keep)
        assert libc.mincore(base, len(m), vec) == 0, ctypes.get_errno()
        cached = [i for i in range(pages) if vec[i] & 1]
        if not folios:
            del keep
            return len(cached), pages, None
        mapped = large = 0
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
        kflags = os.open("/proc/kpageflags", os.O_RDONLY)
        try:
            for page in cached:
                m[page * mmap.PAGESIZE]  # map the cached page (a read: the private mapping stays shared)
                # pread, unbuffered: a buffered read would keep entries read before their pages were mapped
                entry = struct.unpack("<Q", os.pread(pagemap, 8, (base // mmap.PAGESIZE + page) * 8))[0]
                if not entry >> 63:
                    continue
                flags = struct.unpack("<Q", os.pread(kflags, 8, (entry & ((1 << 55) - 1)) * 8))[0]
                mapped += 1
                large += bool(flags & (1 << 15 | 1 << 16))  # KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL
        finally:
            os.close(pagemap)
            os.close(kflags)
        del keep
        return mapped, pages, large / max(mapped, 1)
    finally:
        m.close()


def _resident_pages(path):
    """(pages of `path` in the page cache, pages of it)."""
    return _page_cache(path)[:2]


def test_read_ahead_reads_every_file_in_and_ends(tmp_path, monkeypatch):
    """read_ahead's threads read every file given into the page cache, in steps, each its stretch
    (here two, the first ending inside the second file), and end; a path that cannot be opened ends
    the list there, quietly."""
    from stfs import _whole

    monkeypatch.setattr(_whole, "READ_AHEAD_STEP", 1 << 20)
    monkeypatch.setattr(_whole, "READ_AHEAD_SPAN", 4 << 20)
    files = []
    for name in ("a", "b"):
        path = tmp_path / name
        path.write_bytes(os.urandom((5 << 20) + 100))
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        files.append(str(path))
    assert _resident_pages(files[0])[0] < _resident_pages(files[0])[1], "the test file was not dropped"
    _whole.read_ahead(files + [str(tmp_path / "missing"), str(tmp_path / "never")])
    for t in _read_ahead_threads():
        t.join(10)
    assert not _read_ahead_threads()
    for path in files:
        resident, pages = _resident_pages(path)
        assert resident == pages, f"{path}: {resident} of {pages} pages in the page cache"
    _whole.read_ahead([str(tmp_path / "missing")])  # nothing to read: the thread ends at once
    for t in _read_ahead_threads():
        t.join(10)
    assert not _read_ahead_threads()


def test_read_ahead_reads_nothing_of_a_cached_file(tmp_path, monkeypatch):
    """A file already in the page cache is not read again (from the page cache, a load through
    stfs.load then costs what load_file's does); the same file dropped is read, by four threads."""
    from stfs import _whole

    monkeypatch.setattr(_whole, "READ_AHEAD_SPAN", 4 << 20)
    path = tmp_path / "f"
    path.write_bytes(os.urandom(16 << 20))
    reads = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv",
                        lambda fd, bufs, at, *a: reads.append(threading.current_thread()) or preadv(fd, bufs, at, *a))

    def read_ahead():
        reads.clear()
        _whole.read_ahead([str(path)])
        for t in _read_ahead_threads():
            t.join(10)
        assert not _read_ahead_threads()
        return reads[:]

    path.read_bytes()
    assert _resident_pages(path)[0] == _resident_pages(path)[1]
    assert not read_ahead(), "a cached file was read again"
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert _resident_pages(path)[0] < _resident_pages(path)[1], "the test file was not dropped"
    assert len(set(read_ahead())) == 4, "16 MiB in stretches of 4 MiB: four threads"
    assert _resident_pages(path)[0] == _resident_pages(path)[1]


def test_read_ahead_runs_at_most_its_thread_count(tmp_path, monkeypatch):
    """However many stretches the files would make, at most READ_AHEAD_THREADS threads read them
    (each a sequential stream to the kernel), and every byte is still read."""
    from stfs import _whole

    monkeypatch.setattr(_whole, "READ_AHEAD_STEP", 64 << 10)
    monkeypatch.setattr(_whole, "READ_AHEAD_SPAN", 64 << 10)
    path = tmp_path / "f"
    path.write_bytes(os.urandom(_whole.READ_AHEAD_THREADS * (256 << 10)))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    reads = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv",
                        lambda fd, bufs, at, *a: reads.append(threading.current_thread()) or preadv(fd, bufs, at, *a))
    _whole.read_ahead([str(path)])
    for t in _read_ahead_threads():
        t.join(10)
    assert not _read_ahead_threads()
    assert len(set(reads)) == _whole.READ_AHEAD_THREADS, "four times as many stretches as threads"
    assert len(reads) == 4 * _whole.READ_AHEAD_THREADS, "every step read once"
    assert _resident_pages(path)[0] == _resident_pages(path)[1]


def test_read_ahead_reads_only_what_memory_can_hold(tmp_path, monkeypatch):
    """Of files larger than READ_AHEAD_MEMORY_SHARE of the memory available, only their head is read
    ahead (the rest would evict it before the caller got there): here 6 MiB of two 5 MiB files."""
    from stfs import _whole

    monkeypatch.setattr(_whole, "READ_AHEAD_STEP", 1 << 20)
    monkeypatch.setattr(_whole, "READ_AHEAD_SPAN", 2 << 20)
    assert _whole.memory_available() > 0, "MemAvailable read from /proc/meminfo"
    monkeypatch.setattr(_whole, "memory_available", lambda: 12 << 20)
    files = cold_files(tmp_path, ("a", "b"), 5 << 20)
    reads = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, at, *a: reads.append((os.readlink(f"/proc/self/fd/{fd}"), at))
                        or preadv(fd, bufs, at, *a))
    _whole.read_ahead(files)
    for t in _read_ahead_threads():
        t.join(10)
    assert not _read_ahead_threads()
    assert sorted(reads) == [(files[0], at << 20) for at in range(5)] + [(files[1], 0)]
    assert _resident_pages(files[0])[0] == _resident_pages(files[0])[1]


def test_read_ahead_leaves_large_folios_as_a_plain_read_does(tmp_path, monkeypatch):
    """What read_ahead's threads (three here) leave in the page cache is what a plain sequential
    read leaves: large folios, so later loads of the file from the page cache run at full speed
    (MADV_WILLNEED left 4 KiB pages, and such loads ran 1.5-8x slower)."""
    from stfs import _whole

    monkeypatch.setattr(_whole, "READ_AHEAD_SPAN", 32 << 20)

    if os.geteuid() != 0:
        assert os.environ.get("CI") != "true", "not root, and CI=true: the test command runs as root"
        pytest.skip("needs root: page frame flags from /proc/kpageflags")
    path = tmp_path / "f"
    path.write_bytes(os.urandom(96 << 20))

    def drop():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    drop()
    with open(path, "rb") as f:
        while f.read(128 << 10):
            pass
    cached, pages, plain = _page_cache(path, folios=True)
    assert cached == pages
    drop()
    assert _resident_pages(path)[0] < pages, "the test file was not dropped"
    _whole.read_ahead([str(path)])
    for t in _read_ahead_threads():
        t.join(30)
    cached, pages, share = _page_cache(path, folios=True)
    assert cached == pages, f"{cached} of {pages} pages cached"
    if plain >= 0.5:
        assert share >= plain - 0.2, f"plain read {plain:.2f}, read_ahead {share:.2f}"
