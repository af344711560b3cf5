"""The engine inside the Python process (the extension module stfs._native, src/python/): sources opened
and read with no mount, checked against the reference `safetensors` package, over real servers on
loopback (s3s-fs, nginx as the hub, a slow HTTP server of the test's own), in a process with no
/dev/fuse and no root, interrupted by Ctrl-C, and against the CLI's error lines on the hostile corpus.

scripts/test builds the extension (the crate's cdylib with `--features python`) into
target/python-native/stfs/ ($STFS_NATIVE_DIR); it is added to the package from python/ here."""
import concurrent.futures
import hashlib
import http.server
import io
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors.numpy import load_file, save_file

from conftest import ROOT, STFS, stop_process, tool_missing, wait_until
from test_hub import SHA, publish
from test_reference import numpy_checkpoint, raw_checkpoint, reference_bytes  # noqa: F401 (fixtures)
from test_remote import nginx  # noqa: F401 (a fixture)
from test_s3 import KEY_ID, SECRET, s3  # noqa: F401 (a fixture)

NATIVE_DIR = os.environ.get("STFS_NATIVE_DIR", os.path.join(ROOT, "target", "python-native"))
sys.path.insert(0, os.path.join(ROOT, "python"))
import stfs  # noqa: E402
import stfs._direct  # noqa: E402
import stfs._engine  # noqa: E402
import stfs._whole  # noqa: E402

TIMEOUT = 60


@pytest.fixture(autouse=True)
def native():
    """The extension module, from NATIVE_DIR unless the package has one of its own; taken away again
    after the test, so the other test files of the session (whose stfs.load mounts) are left as they were."""
    added = None
    if not stfs._engine.available():
        added = os.path.join(NATIVE_DIR, "stfs")
        stfs.__path__.append(added)
    try:
        if not stfs._engine.available():
            tool_missing("the stfs._native extension", f"scripts/test builds it into {NATIVE_DIR}")
        yield
    finally:
        if added is not None:
            stfs.__path__.remove(added)
            stfs._engine._native = None
            sys.modules.pop("stfs._native", None)
            if hasattr(stfs, "_native"):
                del stfs._native


def tensor_bytes(checkpoint, name):
    t = checkpoint.tensor(name)
    out = bytearray(t.byte_len)
    checkpoint.read([(t, 0, out)])
    return bytes(out)


def test_the_native_read_refuses_a_read_only_a_too_small_and_an_overlapping_buffer(tmp_path):
    """stfs._native.Opened.read_into takes buffer objects, never an address: it checks each itself
    (defect: it took raw `(address, length)` and wrote there, every check only in stfs._engine)."""
    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(64, dtype=np.float32), "b": np.arange(64, dtype=np.float32)}, str(path))
    with stfs._engine.Checkpoint(path) as checkpoint:
        a, b = checkpoint.tensor("a"), checkpoint.tensor("b")
        opened = checkpoint._opened
        with pytest.raises(ValueError, match="read-only"):
            opened.read_into([(a.index, 0, bytes(a.byte_len), a.byte_len)], 2)
        with pytest.raises(ValueError, match="holds 255 bytes, fewer than the 256 to read"):
            opened.read_into([(a.index, 0, bytearray(255), a.byte_len)], 2)
        shared = bytearray(a.byte_len)
        with pytest.raises(ValueError, match="two buffers of one read overlap"):
            opened.read_into([(a.index, 0, shared, a.byte_len), (b.index, 0, shared, b.byte_len)], 2)
        with pytest.raises(ValueError, match="overlap"):
            view = memoryview(bytearray(2 * a.byte_len))
            opened.read_into([(a.index, 0, view[: a.byte_len], a.byte_len), (b.index, 0, view[a.byte_len - 4:], 4)], 2)
        with pytest.raises(ValueError, match="not contiguous"):
            opened.read_into([(a.index, 0, memoryview(bytearray(2 * a.byte_len))[::2], a.byte_len)], 2)
        with pytest.raises(TypeError):
            opened.read_into([(a.index, 0, 12345, a.byte_len)], 2)
        # Two buffers side by side, and the engine's own read, still fill what they are given.
        both = memoryview(bytearray(2 * a.byte_len))
        opened.read_into([(a.index, 0, both[: a.byte_len], a.byte_len), (b.index, 0, both[a.byte_len:], b.byte_len)], 2)
        assert bytes(both) == np.arange(64, dtype=np.float32).tobytes() * 2
        assert tensor_bytes(checkpoint, "b") == np.arange(64, dtype=np.float32).tobytes()


# --- every dtype, against the reference ----------------------------------------------------------------

def test_every_dtype_read_through_the_module_equals_the_reference(numpy_checkpoint, raw_checkpoint):  # noqa: F811
    for path in (numpy_checkpoint, raw_checkpoint):
        ref = reference_bytes(path)
        # Small blocks and cache: tensors cross blocks, and the cache turns over.
        with stfs.Checkpoint(path, block_size="4K", cache_size="16K") as checkpoint:
            assert {t.name for t in checkpoint.tensors} == set(ref)
            for t in checkpoint.tensors:
                dtype, shape, data = ref[t.name]
                assert (t.dtype, t.shape, t.byte_len) == (dtype, shape, len(data)), t.name
                assert tensor_bytes(checkpoint, t.name) == data, t.name
            # A byte range into a NumPy array of another dtype, and many at once on several threads.
            big = checkpoint.tensor("big.weight") if "big.weight" in ref else checkpoint.tensors[0]
            part = np.zeros(1000, dtype=np.float32)[: big.byte_len // 4 - 1]
            checkpoint.read([(big, 4, part)])
            assert part.tobytes() == ref[big.name][2][4:4 + part.nbytes]
            outs = [(t, 0, bytearray(t.byte_len)) for t in checkpoint.tensors]
            checkpoint.read(outs, threads=8)
            assert all(bytes(b) == ref[t.name][2] for t, _, b in outs)


def test_load_without_a_mount_equals_load_file_on_every_dtype(numpy_checkpoint, raw_checkpoint, monkeypatch):  # noqa: F811
    # No mount may be made: the binary is not there.
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    expected = load_file(str(numpy_checkpoint))
    got = stfs.load(numpy_checkpoint)
    assert set(got) == set(expected)
    for name, a in expected.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert got[name].tobytes() == a.tobytes(), name
        assert not got[name].flags.writeable, name
    raw = reference_bytes(raw_checkpoint)
    got = stfs.load(raw_checkpoint)
    types = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
             "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
             "F8_E8M0": ml_dtypes.float8_e8m0fnu}
    for name, (dtype, shape, data) in raw.items():
        if dtype == "F4":
            packed = np.frombuffer(data, np.uint8)
            nibbles = np.empty(2 * len(data), np.uint8)
            nibbles[0::2], nibbles[1::2] = packed & 0xF, packed >> 4
            assert got[name].dtype == ml_dtypes.float4_e2m1fn and got[name].tobytes() == nibbles.tobytes()
            continue
        assert got[name].dtype == np.dtype(types[dtype]) and list(got[name].shape) == shape, name
        assert got[name].tobytes() == data, name
    # A served view (as_="f32") is read by the engine, not mapped: the same numbers as F32.
    got = stfs.load(raw_checkpoint, as_="f32")
    assert got["bf16"].dtype == np.float32
    assert np.array_equal(got["bf16"], np.frombuffer(raw["bf16"][2], ml_dtypes.bfloat16).astype(np.float32).reshape(33, 65))


def _cold_copy(source, folder):
    """A copy of `source` in `folder`, written out and dropped from the page cache (fsync, then
    POSIX_FADV_DONTNEED), as a cold load finds it; refused where the drop did not take (a folder on
    tmpfs keeps every file in memory: TMPDIR must name a disk)."""
    path = folder / os.path.basename(str(source))
    shutil.copyfile(source, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not stfs._whole.sampled_cached(fd, os.fstat(fd).st_size), f"{folder} keeps its files in memory"
    finally:
        os.close(fd)
    return path


def _sampled_cached(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return stfs._whole.sampled_cached(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def test_a_cold_local_file_is_read_with_o_direct_and_equals_the_reference(numpy_checkpoint, raw_checkpoint,  # noqa: F811
                                                                          tmp_path, monkeypatch):
    """stfs.load of a local file not in the page cache reads it with O_DIRECT into memory of its own
    (stfs._direct.read_direct): every dtype's bytes equal the reference's, for NumPy and torch, the
    whole file read once that way (stfs._direct.counts), and the page cache left without the file
    (a mapping, or a read through it, would have filled it); a sharded checkpoint's shards all so.
    From the page cache, the same file is mapped as before: no O_DIRECT read."""
    try:
        import torch
    except ImportError:
        tool_missing("torch", "scripts/torch_venv (scripts/test runs pytest with its python)")
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    counts = stfs._direct.counts
    for source in (numpy_checkpoint, raw_checkpoint):
        ref = reference_bytes(source)
        for framework in ("numpy", "torch"):
            path = _cold_copy(source, tmp_path)
            before = dict(counts)
            got = stfs.load(path, framework=framework)
            assert counts["shards"] == before["shards"] + 1, (counts, before)
            assert counts["bytes"] == before["bytes"] + os.path.getsize(path), (counts, before)
            assert not _sampled_cached(path), "the O_DIRECT load left the file in the page cache"
            for name, (dtype, shape, data) in ref.items():
                if dtype == "F4" and framework == "numpy":  # unpacked, one byte per element (see above)
                    continue
                t = got[name]
                if framework == "torch":
                    t = t.contiguous().view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
                    assert list(got[name].shape) == (shape[:-1] + [shape[-1] // 2] if dtype == "F4" else shape), name
                else:
                    assert list(t.shape) == shape, name
                assert t.tobytes() == data, (framework, name)
            del got
            os.unlink(path)
    # A sharded checkpoint (a folder with its index): every shard read so, all of them in one pool.
    folder = tmp_path / "sharded"
    folder.mkdir()
    rng = np.random.default_rng(5)
    weight_map, tensors = {}, {}
    for part in range(3):
        shard = f"model-{part + 1:05d}-of-00003.safetensors"
        some = {f"layers.{part}.{i}": rng.standard_normal((100 + i, 37)).astype([np.float32, np.float16, np.int64][i % 3])
                for i in range(4)}
        save_file(some, str(tmp_path / shard))
        _cold_copy(tmp_path / shard, folder)
        weight_map.update({name: shard for name in some})
        tensors.update(some)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    monkeypatch.setenv("STFS_BIN", STFS)  # a folder is asked whether it is a mount (by the binary)
    before = dict(counts)
    got = stfs.load(folder)
    assert counts["shards"] == before["shards"] + 3, (counts, before)
    assert set(got) == set(tensors) and all(np.array_equal(got[k], a) for k, a in tensors.items())
    del got
    # In the page cache (read once through it): mapped, as before.
    path = _cold_copy(numpy_checkpoint, tmp_path)
    with open(path, "rb") as f:
        f.read()
    before = dict(counts)
    got = stfs.load(path)
    assert counts == before
    assert all(got[name].tobytes() == data for name, (_, _, data) in reference_bytes(numpy_checkpoint).items())


def test_where_o_direct_is_refused_or_fails_the_file_is_mapped_instead(numpy_checkpoint, tmp_path, monkeypatch):  # noqa: F811
    """Where the filesystem has no direct I/O the kernel refuses O_DIRECT (sysfs here, as ramfs or an
    older tmpfs): read_direct leaves the file out, for the load to map. A cold file whose O_DIRECT
    reads fail (EINVAL, as for a device whose blocks are larger than a page) is mapped instead: the
    load's tensors equal the reference's all the same. A file on tmpfs (/dev/shm) is in memory, so
    mapped, never read with O_DIRECT."""
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    counts = stfs._direct.counts
    refusing = "/sys/kernel/mm/transparent_hugepage/enabled"  # a sysfs attribute: st_size 4096
    fd = os.open(refusing if os.path.exists(refusing) else "/sys/kernel/profiling", os.O_RDONLY)
    try:
        before = dict(counts)
        assert stfs._direct.read_direct({0: (fd, os.fstat(fd).st_size)}) == {}
        assert counts["refused"] == before["refused"] + 1 and counts["shards"] == before["shards"]
    finally:
        os.close(fd)

    ref = reference_bytes(numpy_checkpoint)
    path = _cold_copy(numpy_checkpoint, tmp_path)
    preadv = os.preadv

    def refused(fd, buffers, at, *rest):
        if threading.current_thread().name == "stfs-direct-read":
            raise OSError(22, "Invalid argument")
        return preadv(fd, buffers, at, *rest)

    monkeypatch.setattr(os, "preadv", refused)
    before = dict(counts)
    got = stfs.load(path)
    assert counts["refused"] == before["refused"] + 1 and counts["shards"] == before["shards"], counts
    assert all(got[name].tobytes() == data for name, (_, _, data) in ref.items())
    del got
    monkeypatch.undo()

    shm = tempfile.mkdtemp(dir="/dev/shm")
    try:
        path = os.path.join(shm, "m.safetensors")
        shutil.copyfile(numpy_checkpoint, path)
        before = dict(counts)
        got = stfs.load(path)
        assert counts == before
        assert all(got[name].tobytes() == data for name, (_, _, data) in ref.items())
        del got
    finally:
        shutil.rmtree(shm)


def _mapped_kib(path, smaps=None):
    """KiB of this process's mappings of `path` that are in its page tables (smaps' Rss); of another
    process's where `smaps` is the text of its /proc/PID/smaps."""
    total, ours = 0, False
    with open("/proc/self/smaps") if smaps is None else io.StringIO(smaps) as f:
        for line in f:
            head = line.split(maxsplit=5)
            if "-" in head[0] and ":" not in head[0]:  # a mapping's first line: address range ... path
                ours = line.rstrip("\n").endswith(" " + str(path))
            elif ours and head[0] == "Rss:":
                total += int(head[1])
    return total


def _fault_in_threads():
    return stfs._whole.fault_ins_running()


def test_a_cached_files_mapping_is_faulted_in_behind_the_caller(tmp_path, monkeypatch):
    """A load of a file in the page cache maps it (zero copy) and has a thread of its own, at
    SCHED_IDLE, take the mapping's pages into the page tables while the caller goes on, so that the
    caller's first touches take no faults: once that thread ends, the whole file is mapped (smaps' Rss)
    though nothing here touched a byte, and the tensors equal the reference's. Where the process may
    run on one CPU only (it would compete with the caller), or for a file under FAULT_MIN_BYTES, no
    such thread is started."""
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")  # no mount: the engine in this process
    rng = np.random.default_rng(5)
    tensors = {f"t.{i}": rng.standard_normal((1024, 1024)).astype(np.float32) for i in range(8)}  # 32 MiB
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass
    assert _sampled_cached(path)
    got = stfs.load(path)
    several = len(os.sched_getaffinity(0)) > 1
    assert several or not _fault_in_threads()
    assert wait_until(lambda: not _fault_in_threads(), TIMEOUT), "the fault-in thread did not end"
    if several:
        assert _mapped_kib(path) >= os.path.getsize(path) // 1024 * 0.95, _mapped_kib(path)
    assert all(np.array_equal(got[name], value) for name, value in tensors.items())
    del got
    assert _mapped_kib(path) == 0  # unmapped with the last array

    # A small file's faults cost the caller less than a thread's start: none is started for it.
    fd = os.open(path, os.O_RDONLY)
    try:
        whole, small = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY), mmap.mmap(fd, 1 << 20, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    ahead = stfs._whole.ReadAhead()
    stfs._whole.fault_in_ahead([small], stfs._native, ahead)
    assert ahead.threads == []
    stfs._whole.fault_in_ahead([whole], stfs._native, ahead)
    assert len(ahead.threads) == (1 if several else 0)
    assert ahead.stop()
    assert all(flag.is_set() for flag in ahead.flags)
    with pytest.raises(ValueError, match="the mapping to fault in is read-only"):
        stfs._native.fault_in_idle([(bytes(4096), 4096)], 1024, stfs._native.StopFlag())


#: A child that exits while stfs.load's fault-in thread is inside stfs._native.fault_in_idle (a byte
#: at a time: 0.2 s per 32 MiB in a debug build), and whose interpreter then sleeps as it ends (a
#: global's __del__), so that without the atexit hook the call would return while the interpreter is
#: ending.
EXIT_WHILE_FAULTING = r"""
import sys, time
sys.path[:0] = sys.argv[1:2]
import stfs, stfs._engine, stfs._whole
if not stfs._engine.available():
    stfs.__path__.append(sys.argv[2])
stfs._whole.FAULT_STRIDE, stfs._whole.FAULT_STOP_SECONDS = 1, 30.0
class SlowEnd:
    def __del__(self):
        time.sleep(3)
slow_end = SlowEnd()
got = stfs.load(sys.argv[3])
assert stfs._whole.fault_ins_running()
print("exiting", flush=True)
"""


def test_the_interpreter_exiting_while_a_fault_in_thread_runs_ends_cleanly(tmp_path):
    """The interpreter ends a daemon thread that takes the GIL back during its finalization by
    unwinding it (or stopping it), and that through the extension's frames aborts the process (SIGABRT,
    "FATAL: exception not rethrown" or a fatal Python error: seen with a caller whose copy kept every
    CPU busy, starving the SCHED_IDLE thread, and here without the hook); an atexit hook stops the
    fault-in threads first, so the exit is clean."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no fault-in thread is started")
    path = tmp_path / "m.safetensors"
    save_file({f"t.{i}": np.ones((1024, 1024), np.float32) for i in range(16)}, str(path))  # 64 MiB
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass
    child = subprocess.run([sys.executable, "-c", EXIT_WHILE_FAULTING, os.path.join(ROOT, "python"),
                            os.path.join(NATIVE_DIR, "stfs"), str(path)],
                           capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ, STFS_BIN="/nonexistent"))
    assert child.returncode == 0 and child.stdout == "exiting\n", (child.returncode, child.stdout, child.stderr)
    assert "FATAL" not in child.stderr, child.stderr


FAULT_IN_UNPRIVILEGED = r"""
import json, mmap, os, sys
sys.path.insert(0, sys.argv[1])
from stfs import _native
assert os.geteuid() != 0 and "NoNewPrivs:\t1" in open("/proc/self/status").read()
fd = os.open(sys.argv[2], os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
os.close(fd)
before = os.sched_getscheduler(0)
ran = _native.fault_in_idle([(m, len(m))], 4096, _native.StopFlag())
after = os.sched_getscheduler(0)
smaps = open("/proc/self/smaps").read()
print(json.dumps({"ran": ran, "before": before, "after": after, "smaps": smaps}))
"""


def test_the_fault_in_leaves_its_unprivileged_caller_at_its_own_policy_with_the_pages_mapped(tmp_path):
    """stfs._native.fault_in_idle walks on a thread of its own at SCHED_IDLE: its caller, the thread
    that takes the GIL back, keeps its policy, even where it could not leave SCHED_IDLE again (not
    root: defect, the caller itself went idle, took the GIL back so, and a load beside two
    CPU-bound processes waited 2 s for it); the mapping's pages are in the page tables after."""
    python = "/usr/bin/python3"
    if shutil.which("setpriv") is None:
        tool_missing("setpriv", "apt-get install util-linux")
    if not os.path.exists(python):
        tool_missing(python, "apt-get install python3 (a Python outside /root, which `nobody` can run)")
    shared = tempfile.mkdtemp(prefix="stfs-idle-", dir="/tmp")
    try:
        os.chmod(shared, 0o755)
        shutil.copytree(os.path.join(ROOT, "python", "stfs"), os.path.join(shared, "stfs"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        native = stfs._engine._module().__file__
        shutil.copy(native, os.path.join(shared, "stfs", os.path.basename(native)))
        path = os.path.join(shared, "pages.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(8 << 20))
        subprocess.run(["chmod", "-R", "a+rX", shared], check=True)
        out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--no-new-privs",
                              python, "-c", FAULT_IN_UNPRIVILEGED, shared, path],
                             capture_output=True, text=True, timeout=TIMEOUT, env={"PATH": os.environ["PATH"]})
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        smaps = got.pop("smaps")
        assert got["ran"] and got["before"] == os.SCHED_OTHER, got
        assert got["after"] == got["before"], got
        assert _mapped_kib(path, smaps) >= (8 << 20) // 1024, _mapped_kib(path, smaps)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_file_on_a_fuse_filesystem_is_read_through_the_engine_each_byte_once(tmp_path, monkeypatch):
    """A local file on a network or FUSE filesystem (here slowfs, which drops the file's pages at every
    open, as GCSFuse does) is not mapped: the reads ahead of a mapping's faults would land in a page
    cache its faults do not find, and every byte would be fetched twice (2.02x measured). Read through
    the engine, the store serves the file once."""
    slowfs = os.path.join(os.path.dirname(STFS), "examples", "slowfs")
    if not os.access(slowfs, os.X_OK):
        tool_missing("examples/slowfs", "cargo build --all-targets")
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    store.mkdir()
    mnt.mkdir()
    rng = np.random.default_rng(7)
    tensors = {f"t{i}": rng.standard_normal((512, 1024)).astype(np.float32) for i in range(8)}  # 16 MiB
    save_file(tensors, str(store / "model.safetensors"))
    size = os.path.getsize(store / "model.safetensors")
    server = subprocess.Popen([slowfs, str(store), str(mnt), "--latency-ms", "1", "--bandwidth-mbps", "2000"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()

        def served():
            with open(mnt / ".slowfs_stats") as f:
                return json.load(f)["bytes"]

        before = served()
        got = stfs.load(mnt / "model.safetensors")
        for name, a in tensors.items():
            assert np.array_equal(got[name], a), name
        fetched = served() - before
        assert fetched <= 1.1 * size, f"the store served {fetched / size:.2f}x the file"
        del got
    finally:
        stop_process(server)
        # slowfs unmounts on SIGTERM, but not a mount still busy (a failed run's arrays): detach it.
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)


def test_a_failing_source_is_the_clis_line(tmp_path, monkeypatch):
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    missing = tmp_path / "gone.safetensors"
    with pytest.raises(stfs.StfsError) as e:
        stfs.load(missing)
    assert str(e.value) == f"stfs: {missing}: no such file or directory"
    with pytest.raises(stfs.StfsError, match="^error: unexpected argument '--nope' found$"):
        stfs.Checkpoint(missing, nope=True)


def test_the_module_and_the_cli_agree_on_every_corpus_error(tmp_path):
    """Every file of the hostile-input corpus: the module raises exactly the line `stfs mount` prints."""
    corpus = os.path.join(ROOT, "tests", "corpus", "bad")
    names = sorted(os.listdir(corpus))
    assert len(names) >= 45
    mp = tmp_path / "mp"
    mp.mkdir()
    for name in names:
        path = os.path.join(corpus, name)
        out = subprocess.run([STFS, "mount", path, str(mp)], capture_output=True, text=True, timeout=TIMEOUT)
        if out.returncode == 0:  # never expected: take it down before failing
            subprocess.run([STFS, "umount", "--lazy", str(mp)], timeout=TIMEOUT)
        assert out.returncode == 1, (name, out.stderr)
        line = out.stderr.strip().splitlines()[0]
        with pytest.raises(stfs.StfsError) as e:
            stfs.Checkpoint(path)
        assert str(e.value) == line, name


# --- stfs.open ---------------------------------------------------------------------------------------

INDEXES = [(slice(1, 3),), (slice(None), slice(2, 40)), (slice(None, None, 3), slice(5, None, 4)), (7,),
           (-1, slice(1, 5)), (Ellipsis, 1), (slice(5, 2),), (), (slice(None), -1), (3, 4)]


def test_open_is_shaped_as_safe_open_and_slices_equal_numpys(tmp_path):
    rng = np.random.default_rng(47)
    tensors = {"w": rng.standard_normal((64, 96)).astype(np.float32),
               "b": rng.integers(-9, 9, (5, 6, 7), dtype=np.int16), "s": np.array(2.5, np.float64)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    with safetensors.safe_open(str(path), framework="numpy") as ref, stfs.open(path, block_size="4K") as f:
        assert f.keys() == sorted(ref.keys(), key=f.keys().index) and set(f.keys()) == set(ref.keys())
        assert f.metadata() == ref.metadata() == {"format": "np"}
        for name in ref.keys():
            assert np.array_equal(f.get_tensor(name), ref.get_tensor(name)), name
            assert f.get_slice(name).get_shape() == list(tensors[name].shape)
        for index in INDEXES:
            assert np.array_equal(f.get_slice("w")[index], tensors["w"][index]), index
            assert f.get_slice("w")[index].shape == tensors["w"][index].shape, index
        assert np.array_equal(f.get_slice("b")[1:3, :, 2:5], tensors["b"][1:3, :, 2:5])
        assert f.get_slice("s")[()] == 2.5


def test_get_slice_reads_no_more_than_its_bytes_and_one_block_per_boundary(tmp_path):
    rng = np.random.default_rng(8)
    w = rng.standard_normal((1024, 1031)).astype(np.float32)  # 4 MiB, rows not aligned to blocks
    path = tmp_path / "m.safetensors"
    save_file({"w": w}, str(path))
    block = 64 << 10
    with stfs.open(path, block_size="64K", no_map=True) as f:
        for lo, hi in [(0, 128), (300, 429), (896, 1024)]:
            before = f.stats()["backing_read_bytes"]
            part = f.get_slice("w")[lo:hi]
            read = f.stats()["backing_read_bytes"] - before
            assert np.array_equal(part, w[lo:hi])
            assert part.nbytes <= read <= part.nbytes + 2 * block, (lo, hi, read)


def test_a_whole_load_from_s3_reads_each_tensor_byte_once_in_a_request_per_share(s3):  # noqa: F811
    """Every tensor of a remote checkpoint read at once goes straight from the store into the caller's
    memory: exactly the tensors' bytes, in about one request per thread's share (not a request per
    block), past the block cache; equal to the reference."""
    rng = np.random.default_rng(9)
    tensors = {f"t.{i}": rng.standard_normal((256, 1024 + i)).astype(np.float32) for i in range(12)}  # ~12 MiB
    tensors["tiny"] = np.arange(3, dtype=np.int16)
    save_file(tensors, str(s3 / "model.safetensors"))
    with stfs.Checkpoint("s3://models/model.safetensors", block_size="64K") as c:
        bufs = [(t, 0, bytearray(t.byte_len)) for t in c.tensors]
        before = c.stats()
        c.read(bufs, threads=4)
        after = c.stats()
        for t, _, b in bufs:
            assert bytes(b) == tensors[t.name].tobytes(), t.name
        want = sum(t.byte_len for t in c.tensors)
        assert after["backing_read_bytes"] - before["backing_read_bytes"] == want
        # 12 MiB over 4 threads: pieces of at least 4 MiB (the smallest direct piece), so 3 or 4 requests,
        # where 64 KiB blocks would have taken about 190.
        assert after["backing_reads"] - before["backing_reads"] <= 4, after
        assert after["http_requests"] - before["http_requests"] <= 4, after


def test_a_load_with_a_disk_cache_fills_it_and_the_next_load_reads_it_from_disk(s3, tmp_path):  # noqa: F811
    """With cache_dir the whole load takes the block path, not direct reads, so that its blocks land on
    disk: the next load, in another engine, fetches nothing from the store."""
    rng = np.random.default_rng(10)
    tensors = {f"t.{i}": rng.standard_normal((256, 1024)).astype(np.float32) for i in range(6)}
    save_file(tensors, str(s3 / "model.safetensors"))
    cache = tmp_path / "cache"
    fetched = []
    for _ in range(2):
        with stfs.Checkpoint("s3://models/model.safetensors", block_size="64K", cache_dir=str(cache)) as c:
            bufs = [(t, 0, bytearray(t.byte_len)) for t in c.tensors]
            c.read(bufs)
            for t, _, b in bufs:
                assert bytes(b) == tensors[t.name].tobytes(), t.name
            fetched.append(c.stats()["http_bytes"])
    size = (s3 / "model.safetensors").stat().st_size
    assert fetched[0] >= sum(a.nbytes for a in tensors.values()), fetched
    # The second engine's opening request (the header, 64 KiB) and nothing more.
    assert fetched[1] <= 64 << 10, f"the second load fetched {fetched[1]} bytes of {size}: the disk cache was not used"


def test_eight_ranks_slicing_every_tensor_from_s3_fetch_the_file_about_once(s3):  # noqa: F811
    rng = np.random.default_rng(5)
    # Tensors of 8 MiB, so a rank's eighth (1 MiB) is large beside the 64 KiB block at each of its ends.
    tensors = {f"layer.{i}.weight": rng.standard_normal((2048, 1024 + i)).astype(np.float32) for i in range(4)}
    save_file(tensors, str(s3 / "model.safetensors"))
    size = (s3 / "model.safetensors").stat().st_size
    fetched = 0
    for rank in range(8):
        with stfs.open("s3://models/model.safetensors", block_size="64K") as f:
            for name, w in tensors.items():
                rows = w.shape[0] // 8
                assert np.array_equal(f.get_slice(name)[rank * rows:(rank + 1) * rows], w[rank * rows:(rank + 1) * rows])
            fetched += f.stats()["http_bytes"]
    assert fetched <= 1.1 * size, (fetched, size)


def test_ranks_in_threads_slicing_columns_share_one_engine_and_fetch_the_file_about_once(s3):  # noqa: F811
    """Ranks as threads of one process, each with its own stfs.open of the same source, taking columns
    (a short run of every row, so every rank touches every block): their handles share one engine, so
    each block is fetched once, not once per rank."""
    rng = np.random.default_rng(6)
    tensors = {f"layer.{i}.weight": rng.standard_normal((512, 1024 + 8 * i)).astype(np.float32) for i in range(4)}
    save_file(tensors, str(s3 / "model.safetensors"))
    size = (s3 / "model.safetensors").stat().st_size
    ranks, opened = 8, threading.Barrier(8)

    def rank(r):
        with stfs.open("s3://models/model.safetensors", block_size="64K") as f:
            opened.wait(timeout=TIMEOUT)  # all eight open at once
            for name, w in tensors.items():
                cols = w.shape[1] // ranks
                got = f.get_slice(name)[:, r * cols:(r + 1) * cols]
                assert np.array_equal(got, w[:, r * cols:(r + 1) * cols]), (r, name)
            opened.wait(timeout=TIMEOUT)  # none closes before all have read
            # The engine's counters, and which engine they are (its handle in this process).
            return id(f._checkpoint._opened), f.stats()["http_bytes"]

    with concurrent.futures.ThreadPoolExecutor(ranks) as pool:
        by_engine = dict(pool.map(rank, range(ranks)))
    fetched = sum(by_engine.values())  # what every engine the ranks used fetched
    assert fetched <= 1.1 * size, f"{fetched / size:.2f}x the file by {len(by_engine)} engine(s)"


# --- no mount, no /dev/fuse, no root -----------------------------------------------------------------

CHILD = r"""
import hashlib, json, os, sys
sys.path.insert(0, sys.argv[1])
import stfs
assert os.geteuid() != 0 and not os.path.exists("/dev/fuse")
assert "NoNewPrivs:\t1" in open("/proc/self/status").read()
out = {}
for source in sys.argv[2:]:
    with stfs.Checkpoint(source, block_size="64K") as c:
        bufs = [(t, 0, bytearray(t.byte_len)) for t in c.tensors]
        c.read(bufs)
        out[source] = {t.name: hashlib.sha256(b).hexdigest() for t, _, b in bufs}
print(json.dumps(out))
"""


def test_a_process_with_no_dev_fuse_and_no_root_loads_from_s3_and_the_hub(s3, nginx, monkeypatch):  # noqa: F811
    python = "/usr/bin/python3"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            tool_missing(tool, "apt-get install util-linux")
    if not os.path.exists(python):
        tool_missing(python, "apt-get install python3 (a Python outside /root, which `nobody` can run)")
    root, base, _ = nginx
    monkeypatch.setenv("HF_ENDPOINT", base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    rng = np.random.default_rng(3)
    group = {f"t.{i}": rng.standard_normal((33 + i, 65)).astype(np.float32) for i in range(4)}
    save_file(group, str(s3 / "model.safetensors"))
    repo = publish(root, "org/nofuse", {"model.safetensors": lambda p: save_file(group, str(p))})
    expected = {name: hashlib.sha256(data).hexdigest() for name, (_, _, data) in reference_bytes(repo / "model.safetensors").items()}
    # The package and the extension where `nobody` can read them (not under /root or pytest's 0700 dirs).
    shared = tempfile.mkdtemp(prefix="stfs-nofuse-", dir="/tmp")
    try:
        os.chmod(shared, 0o755)
        shutil.copytree(os.path.join(ROOT, "python", "stfs"), os.path.join(shared, "stfs"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        native = [f for f in os.listdir(os.path.dirname(stfs._engine._module().__file__)) if f.startswith("_native")]
        shutil.copy(stfs._engine._module().__file__, os.path.join(shared, "stfs", native[0]))
        subprocess.run(["chmod", "-R", "a+rX", shared], check=True)
        monkeypatch.setenv("HOME", shared)
        # A mount namespace of its own whose /dev is a tmpfs holding null, zero and urandom: no /dev/fuse.
        setup = ("mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/zero c 1 5 "
                 "&& mknod -m 666 /dev/urandom c 1 9 && exec setpriv --reuid=nobody --regid=nogroup --clear-groups "
                 f"--no-new-privs {python} -c \"$0\" \"$@\"")
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, CHILD, shared,
                              "s3://models/model.safetensors", "hf://org/nofuse"],
                             capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got == {"s3://models/model.safetensors": expected, "hf://org/nofuse": expected}
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# --- Ctrl-C in the middle of a load ------------------------------------------------------------------

class SlowRanges(http.server.BaseHTTPRequestHandler):
    """Serves one file with ranged GETs, 64 KiB at a time with a pause between: a load takes seconds."""
    path_served = None

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(self.path_served)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):
        size = os.path.getsize(self.path_served)
        lo, hi = 0, size - 1
        if self.headers.get("Range", "").startswith("bytes="):
            a, b = self.headers["Range"][6:].split("-")
            lo, hi = int(a), min(int(b) if b else size - 1, size - 1)
        self.send_response(206 if "Range" in self.headers else 200)
        self.send_header("Content-Length", str(hi - lo + 1))
        self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with open(self.path_served, "rb") as f:
            f.seek(lo)
            left = hi - lo + 1
            try:
                while left > 0:
                    chunk = f.read(min(64 << 10, left))
                    self.wfile.write(chunk)
                    left -= len(chunk)
                    if lo > 0:
                        time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass


INTERRUPTED = r"""
import json, os, signal, sys, time
# Ctrl-C raises KeyboardInterrupt here even where this process was started with SIGINT ignored (a
# test run started in the background by a shell without job control: its children inherit that).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path[:0] = sys.argv[1:3]
import numpy  # before the counts: its BLAS starts threads of its own when imported
import stfs, stfs._engine
if not stfs._engine.available():
    stfs.__path__.append(sys.argv[3])
def counts():
    names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return names, sorted(os.listdir("/proc/self/fd"))
before = counts()
print("loading", flush=True)
try:
    stfs.load(sys.argv[4], block_size="64K")
    print("finished")
except KeyboardInterrupt:
    # A thread that is ending may still be listed for a moment: waited for, 5 s at most.
    deadline = time.monotonic() + 5
    while counts() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    after = counts()
    print("interrupted " + json.dumps({"before": before, "after": after}), flush=True)
"""


def interrupted_load(script, source, after):
    """Runs `script` (INTERRUPTED, after any setup of its own) on `source` in a child, sends it SIGINT
    `after` seconds into its load, and returns what it counted: {"before", "after"}, each its
    [thread names, descriptors]."""
    child = subprocess.Popen([sys.executable, "-c", script, os.path.join(ROOT, "python"), os.path.dirname(__file__),
                              os.path.join(NATIVE_DIR, "stfs"), source],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "loading"
        time.sleep(after)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out.startswith("interrupted "), (out, err)
    return json.loads(out[len("interrupted "):])


def test_ctrl_c_in_the_middle_of_a_load_leaves_no_thread_reading_and_no_descriptor_open(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "m.safetensors"
    save_file({f"t.{i}": rng.standard_normal((1024, 1024)).astype(np.float32) for i in range(8)}, str(path))
    SlowRanges.path_served = str(path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowRanges)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/m.safetensors"
        # After 2 s the header is in and the tensors are being read.
        counts = interrupted_load(INTERRUPTED, url, after=2)
        assert counts["after"] == counts["before"], counts  # [thread names, descriptors]
    finally:
        server.shutdown()
        server.server_close()


class RangesThenGone(SlowRanges):
    """Serves the file's first request (the opening read of its header) at full speed, then answers
    every later GET with 404, as a store whose object was deleted after it was opened."""
    served = 0

    def do_GET(self):
        type(self).served += 1
        if type(self).served > 1:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = os.path.getsize(self.path_served)
        a, b = self.headers["Range"][6:].split("-")
        lo, hi = int(a), min(int(b) if b else size - 1, size - 1)
        self.send_response(206)
        self.send_header("Content-Length", str(hi - lo + 1))
        self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        self.end_headers()
        with open(self.path_served, "rb") as f:
            f.seek(lo)
            self.wfile.write(f.read(hi - lo + 1))


def test_a_read_failing_in_the_middle_of_a_load_is_one_line_naming_the_tensor_and_the_store(tmp_path, monkeypatch):
    """A store failing once the load has started: StfsError with one line naming a tensor, the URL and
    the store's answer (the direct pieces and the block path alike), and no partial result."""
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    rng = np.random.default_rng(4)
    path = tmp_path / "m.safetensors"
    save_file({f"t.{i}": rng.standard_normal((512, 1024)).astype(np.float32) for i in range(4)}, str(path))
    RangesThenGone.path_served, RangesThenGone.served = str(path), 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangesThenGone)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/m.safetensors"
        for block_size in ("64K", "64M"):  # direct pieces; blocks larger than every run
            RangesThenGone.served = 0
            with pytest.raises(stfs.StfsError) as e:
                stfs.load(url, block_size=block_size, timeout=10)
            line = str(e.value)
            assert "\n" not in line and line.startswith("stfs: t."), line
            assert url in line and "404" in line, line
    finally:
        server.shutdown()
        server.server_close()


#: Before INTERRUPTED, for a cold local file: stfs._direct's 16 threads read 256 KiB at a time, each
#: read taking 0.5 s more, so the load's O_DIRECT reads (128 of them for 32 MiB) last 4 s or more.
SLOW_DIRECT_READS = r"""
import os, sys, threading, time
sys.path[:0] = sys.argv[1:3]
import stfs._direct
stfs._direct.DIRECT_STEP = 256 << 10
stfs._direct.DIRECT_THREADS = 16
preadv = os.preadv
def slow_preadv(fd, buffers, at, *rest):
    if threading.current_thread().name == "stfs-direct-read":
        time.sleep(0.5)
    return preadv(fd, buffers, at, *rest)
os.preadv = slow_preadv
"""


def test_ctrl_c_in_the_middle_of_a_cold_local_load_stops_its_o_direct_reads(tmp_path):
    """A Ctrl-C while stfs.load reads a cold local file with O_DIRECT raises KeyboardInterrupt once
    every reading thread has ended (each after its current read): none is left, nor a descriptor."""
    rng = np.random.default_rng(3)
    source = tmp_path / "source" / "m.safetensors"
    source.parent.mkdir()
    save_file({f"t.{i}": rng.standard_normal((1024, 1024)).astype(np.float32) for i in range(8)}, str(source))
    path = _cold_copy(source, tmp_path)
    # After 1.5 s the header is in and the O_DIRECT reads are under way.
    counts = interrupted_load(SLOW_DIRECT_READS + INTERRUPTED, str(path), after=1.5)
    assert counts["after"] == counts["before"], counts  # [thread names, descriptors]


def test_load_and_open_for_torch_without_a_mount(tmp_path, monkeypatch):
    try:
        import torch
        from safetensors.torch import load_file as torch_load_file, save_file as torch_save_file
    except ImportError:
        tool_missing("torch", "scripts/torch_venv (scripts/test runs pytest with its python)")
    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")
    path = tmp_path / "m.safetensors"
    torch_save_file({"a": torch.randn(33, 65).to(torch.bfloat16), "b": torch.arange(10), "c": torch.randn(7).half(),
                     "e": torch.zeros(0, 3)}, str(path))
    ref = torch_load_file(str(path))
    got = stfs.load(path, framework="torch")
    for name, want in ref.items():
        assert got[name].dtype == want.dtype and got[name].device.type == "cpu" and torch.equal(got[name], want), name
    assert torch.equal(stfs.load(path, framework="torch", as_="f32")["a"], ref["a"].float())
    with stfs.open(path, framework="torch") as f:
        assert torch.equal(f.get_slice("a")[3:9, 2:5], ref["a"][3:9, 2:5])
    buffer = torch.empty(33 * 65, dtype=torch.bfloat16)  # a torch tensor's memory, read into
    with stfs.Checkpoint(path) as checkpoint:
        checkpoint.read([(checkpoint.tensor("a"), 0, buffer)])
    assert torch.equal(buffer.reshape(33, 65), ref["a"])


def test_the_pinned_ring_fed_by_the_engine_fills_cpu_tensors(numpy_checkpoint, raw_checkpoint, monkeypatch):  # noqa: F811
    """stfs.load(source, device="cuda") with no mount: the engine reads each tensor into the pinned ring's
    buffers (_engine_pieces), each piece then copied out. No GPU here, so the ring's buffers are
    ordinary CPU tensors and the copies land in CPU tensors: every dtype's bytes equal the reference's,
    through a ring much smaller than the tensors (each read in several pieces, from offsets inside it,
    the buffers reused many times), with no mount made (the binary is not there)."""
    try:
        import torch
    except ImportError:
        tool_missing("torch", "scripts/torch_venv (scripts/test runs pytest with its python)")
    from stfs._load import Entry, StagingRing, _engine_pieces, _load_staged

    monkeypatch.setenv("STFS_BIN", "/nonexistent/stfs")

    class Event:  # the copies below are synchronous: nothing is pending when the ring waits
        def record(self):
            pass

        def synchronize(self):
            pass

    for path in (numpy_checkpoint, raw_checkpoint):
        ref = reference_bytes(path)
        with stfs.Checkpoint(path, block_size="4K", cache_size="16K") as checkpoint:
            items = [Entry(t.name, t.dtype, t.shape, t.byte_len, t.path) for t in checkpoint.tensors]
            ring = StagingRing(2, 1000, lambda n: torch.full((n,), 0xA5, dtype=torch.uint8), Event)
            got = _load_staged(torch, items, torch.device("cpu"), ring, lambda dst, src: dst.copy_(src), [],
                               pieces=_engine_pieces(checkpoint))
            ring.finish()
        assert set(got) == set(ref)
        for name, (_, _, data) in ref.items():
            assert got[name].contiguous().view(torch.uint8).numpy().tobytes() == data, name
        assert ring.allocated_bytes == 2 * 1000 and ring.waits > 0, ring.waits
