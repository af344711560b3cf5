"""The Python package (python/stfs, `pip install .`): stfs.mount and stfs.load on real mounts, checked
against the reference `safetensors` package.

scripts/test_python_package runs this file with the python of a fresh virtualenv the wheel was installed
in (STFS_EXPECT_INSTALLED=1, no STFS_BIN): `import stfs` and the `stfs` binary then come from the wheel,
and test_the_installed_package_is_used proves it. Run by plain pytest from a checkout, the package is
imported from python/ and runs $STFS_BIN (the conftest's binary)."""
import contextlib
import gc
import json
import mmap
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors.numpy import load_file, save_file

from conftest import ROOT, wait_until

INSTALLED = os.environ.get("STFS_EXPECT_INSTALLED") == "1"
if not INSTALLED:
    os.environ.setdefault("STFS_BIN", os.path.join(ROOT, "target", "debug", "stfs"))
    sys.path.insert(0, os.path.join(ROOT, "python"))  # the package's source in this checkout
import stfs  # noqa: E402
import stfs._load  # noqa: E402
import stfs._engine  # noqa: E402

SAMPLE = os.path.join(ROOT, "examples", "sample.safetensors")
TIMEOUT = 60
rng = np.random.default_rng(18)


# --- helpers -----------------------------------------------------------------------------------------

def mounted_paths():
    """Every mount point, by /proc/self/mountinfo (its own parser, not the package's)."""
    with open("/proc/self/mountinfo", "rb") as f:  # bytes: a mount point need not be UTF-8
        return {os.fsdecode(line.split(b" ")[4].replace(b"\\040", b" ").replace(b"\\134", b"\\")) for line in f}


def is_mounted(path):
    return os.path.realpath(path) in mounted_paths()


def daemons_of(source):
    """PIDs of `stfs mount` processes whose command line names `source` (the daemon is a fork of the
    command, so it keeps its argv)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and os.fsencode(str(source)) in argv:
            pids.append(int(pid))
    return pids


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """Temporary mount points go to a directory of the test's own, so that what is left there is
    exactly what the package left (other users of /tmp come and go)."""
    private = tmp_path / "tempdir"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    return private


def stfs_temp_dirs():
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("stfs-")}


def random_array(dtype, shape):
    """A fresh C-contiguous array (0-d for shape ())."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        values = rng.integers(0, 2, size=shape)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    elif dtype.kind == "c":
        values = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    else:
        values = np.asarray(rng.standard_normal(shape), dtype=np.float32)
    return np.array(values, dtype=dtype, order="C")


def write_specs(path, arrays, metadata=None):
    """Writes {name: (safetensors numpy dtype name, shape, array)} with the reference serializer."""
    specs = {name: safetensors.TensorSpec(dtype=d, shape=list(shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, (d, shape, a) in arrays.items()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def write_raw(path, tensors):
    """A safetensors file by hand, for dtypes the reference serializer cannot write (F6):
    {name: (dtype, shape, bytes)}."""
    header, data, offset = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + data)


SHAPES = [(), (0,), (1,), (3, 5), (67, 129), (2, 0, 3), (2, 3, 4, 5)]
# NumPy's own dtypes and BF16: the reference numpy loader (safetensors.numpy.load_file) reads these.
LOADABLE = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32", "complex64",
            "float64", "int64", "uint64", "bfloat16"]
# The rest of what ml_dtypes can make that safetensors stores (its numpy loader has no type for them).
ML_ONLY = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ",
           "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0"}


@pytest.fixture(scope="module")
def loadable_checkpoint(tmp_path_factory):
    arrays = {}
    for dt in LOADABLE:
        np_dt = np.dtype(getattr(ml_dtypes, dt) if dt == "bfloat16" else dt)
        for j, shape in enumerate(SHAPES):
            a = random_array(np_dt, shape)
            arrays[f"{dt}.{j}"] = (dt, shape, a)
    path = tmp_path_factory.mktemp("pkg") / "loadable.safetensors"
    write_specs(path, arrays, metadata={"format": "np"})
    return path


@pytest.fixture(scope="module")
def ml_checkpoint(tmp_path_factory):
    """The F8 family and packed F4, which only ml_dtypes gives NumPy."""
    arrays = {}
    for dt in ML_ONLY:
        for j, shape in enumerate(SHAPES):
            if dt == "float8_e8m0fnu":
                a = rng.integers(0, 255, size=shape, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
            else:
                a = random_array(getattr(ml_dtypes, dt), shape)
            arrays[f"{dt}.{j}"] = (dt, shape, a)
    # F4: the reference serializer takes the packed form (two per byte); metadata shows elements.
    arrays["f4.pairs"] = ("float4_e2m1fn_x2", (8, 24), rng.integers(0, 256, (8, 24), dtype=np.uint8))
    arrays["f4.flat"] = ("float4_e2m1fn_x2", (5,), np.array([0x10, 0x32, 0x54, 0x76, 0xF8], dtype=np.uint8))
    path = tmp_path_factory.mktemp("pkg") / "ml.safetensors"
    write_specs(path, arrays)
    return path


def reference_bytes(path):
    with open(path, "rb") as f:
        return {name: (v["dtype"], list(v["shape"]), bytes(v["data"])) for name, v in safetensors.deserialize(f.read())}


def unpack_f4(raw):
    b = np.frombuffer(raw, dtype=np.uint8)
    out = np.empty(2 * b.size, dtype=np.uint8)
    out[0::2], out[1::2] = b & 0xF, b >> 4
    return out.view(ml_dtypes.float4_e2m1fn)


# --- the installed package ---------------------------------------------------------------------------

@pytest.mark.skipif(not INSTALLED, reason="run by scripts/test_python_package, in the virtualenv the wheel went into")
def test_the_installed_package_is_used():
    prefix = os.path.realpath(sys.prefix)
    assert sys.prefix != sys.base_prefix, "not in a virtualenv"
    assert os.path.realpath(stfs.__file__).startswith(prefix + os.sep), stfs.__file__
    assert not os.path.realpath(stfs.__file__).startswith(os.path.join(ROOT, "python")), stfs.__file__
    assert "STFS_BIN" not in os.environ
    binary = os.path.join(prefix, "bin", "stfs")
    assert os.path.realpath(stfs.find_binary()) == binary
    assert os.path.realpath(shutil.which("stfs")) == binary
    out = subprocess.run(["stfs", "--version"], capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert out.stdout.split()[-1] == stfs.__version__, (out.stdout, stfs.__version__)
    # One build, both faces: the extension module is the wheel's, and the `stfs` command is the console
    # script that runs the CLI inside it (pyproject.toml says why).
    from stfs import _engine

    assert _engine.available()
    assert os.path.realpath(_engine._module().__file__).startswith(prefix + os.sep)
    with open(binary, "rb") as f:
        script = f.read()
    assert script.startswith(b"#!") and b"stfs._command" in script, script[:200]


# --- mount -------------------------------------------------------------------------------------------

def test_mount_yields_a_temporary_mount_and_removes_it():
    with stfs.mount(SAMPLE) as mp:
        assert isinstance(mp, Path) and is_mounted(mp)
        assert os.path.basename(mp).startswith("stfs-")
        meta = json.loads((mp / "metadata.json").read_text())
        assert meta["shards"][0]["source"] == os.path.realpath(SAMPLE)
        assert (mp / "lm_head.weight").read_bytes() == load_file(SAMPLE)["lm_head.weight"].tobytes()
    assert not is_mounted(mp)
    assert not mp.exists()
    assert not stfs_temp_dirs()


def test_mount_unmounts_when_the_block_raises():
    with pytest.raises(KeyError, match="boom"):
        with stfs.mount(SAMPLE) as mp:
            assert is_mounted(mp)
            pids = daemons_of(SAMPLE)
            with open(mp / "lm_head.weight", "rb") as f:
                f.read(100)
            raise KeyError("boom")
    assert not is_mounted(mp)
    assert not mp.exists()
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 20), "the daemon outlived its mount"


def test_a_child_forked_inside_the_block_leaves_the_mount_to_its_parent():
    """A child forked inside `with stfs.mount(...)` that leaves the block (returns, sys.exit, an
    exception) must not unmount the parent's mount, nor remove its mount point."""
    parent = os.getpid()
    try:
        for how in ("end", "raise"):
            with stfs.mount(SAMPLE) as mp:
                child = os.fork()
                if child == 0 and how == "raise":
                    raise SystemExit(0)
                if child != 0:
                    deadline = time.monotonic() + TIMEOUT
                    while os.waitpid(child, os.WNOHANG) == (0, 0):
                        assert time.monotonic() < deadline, "the child did not exit"
                        time.sleep(0.02)
                    assert is_mounted(mp), how
                    assert (mp / "lm_head.weight").read_bytes() == load_file(SAMPLE)["lm_head.weight"].tobytes(), how
            if os.getpid() != parent:
                os._exit(0)  # the child, out of the block
            assert not is_mounted(mp) and not mp.exists(), how
    except SystemExit:
        if os.getpid() == parent:
            raise
    finally:
        if os.getpid() != parent:
            os._exit(0)


@contextlib.contextmanager
def tmpfs_at(path):
    """A tmpfs mounted at `path` (bytes allowed) for the block."""
    os.mkdir(path)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", path], check=True, capture_output=True, timeout=TIMEOUT)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=TIMEOUT)


def test_is_mounted_reads_a_mount_table_holding_a_mount_point_that_is_not_utf8(tmp_path):
    """Another mount whose mount point is not UTF-8 (a latin-1 name: anyone's USB stick) is in
    /proc/self/mountinfo: is_mounted still answers, for it and for an stfs mount. (The stfs binary
    itself cannot mount or unmount while such a mount exists, so the stfs mount is made before it
    and the tmpfs is gone before the stfs mount is released.)"""
    latin1 = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9")
    with stfs.mount(SAMPLE) as mp:
        with tmpfs_at(latin1):
            assert stfs.is_mounted(mp) and stfs.is_mount_dir(mp)
            assert stfs.is_mounted(os.fsdecode(latin1)) and stfs.is_mounted(latin1)
            assert not stfs.is_mounted(tmp_path)
    assert not is_mounted(mp)


def test_unmounting_a_busy_mount_while_a_file_that_is_not_utf8_is_mapped(tmp_path):
    """An unmount that finds the mount busy looks at what this process maps (/proc/self/maps): a
    mapped file whose name is not UTF-8 does not stop it; the mount is detached lazily."""
    mapped = os.path.join(os.fsencode(str(tmp_path)), b"mapped-\xff")
    with open(mapped, "xb") as f:
        f.write(b"x" * 4096)
    with open(mapped, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[:1] == b"x"
        with stfs.mount(SAMPLE) as mp:
            # Another process holds a file of the mount open, so `stfs umount` says busy.
            with open(mp / "lm_head.weight", "rb") as held:
                holder = subprocess.Popen(["sleep", "60"], stdin=held)
            try:
                stfs.unmount(mp)
                assert not is_mounted(mp)
            finally:
                holder.kill()
                holder.wait(TIMEOUT)


def test_mount_on_a_given_directory_keeps_it(tmp_path):
    mp = tmp_path / "m"
    mp.mkdir()
    with stfs.mount(SAMPLE, mp) as got:
        assert got == mp and is_mounted(mp)
        assert (mp / "metadata.json").is_file()
    assert not is_mounted(mp) and mp.is_dir() and not any(mp.iterdir())


def test_a_relative_mount_point_is_unmounted_after_a_chdir_in_the_block(tmp_path, monkeypatch):
    """A relative mount point names the directory it named when mounted: the block may change the
    working directory, and the mount is still unmounted at its end (it was left mounted, the
    unmount looking for it under the new directory)."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        with stfs.mount(SAMPLE, "m") as mp:
            assert is_mounted(tmp_path / "m")
            os.chdir(elsewhere)
        assert not is_mounted(tmp_path / "m")
        assert mp == tmp_path / "m"  # yielded absolute
    finally:
        if is_mounted(tmp_path / "m"):
            subprocess.run([stfs.find_binary(), "umount", "--lazy", tmp_path / "m"], capture_output=True, timeout=TIMEOUT)


def test_keyword_options_become_mount_flags(tmp_path):
    assert stfs.mount_flags({"cache_size": "1G", "npy": True, "allow_other": False, "log_file": tmp_path / "l",
                             "header": ["A: 1", "B: 2"], "as_": "f32", "o": "threads=2"}) == [
        "--cache-size", "1G", "--npy", "--log-file", str(tmp_path / "l"), "--header", "A: 1", "--header", "B: 2",
        "--as", "f32", "-o", "threads=2"]
    with stfs.mount(SAMPLE, npy=True, layout="tree", cache_size="1M", block_size="4K", log_file=tmp_path / "log") as mp:
        meta = json.loads((mp / "metadata.json").read_text())
        assert (mp / "lm_head" / "weight").is_file()
        assert (mp / meta["tensors"]["lm_head.weight"]["npy_path"]).is_file()
        assert np.array_equal(np.load(mp / meta["tensors"]["lm_head.weight"]["npy_path"]), load_file(SAMPLE)["lm_head.weight"])
        assert os.stat(mp / "lm_head" / "weight").st_blksize == 4096  # st_blksize is the block size
    assert (tmp_path / "log").exists()


def test_a_failing_mount_raises_the_one_line_message(tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(stfs.StfsError) as e:
        with stfs.mount(missing):
            pytest.fail("the block ran")
    assert e.value.returncode == 1
    assert str(e.value).startswith("stfs: ") and str(missing) in str(e.value) and "\n" not in str(e.value)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10" + b"\0" * 7 + b"not json")
    with pytest.raises(stfs.StfsError, match=r"^stfs: .*bad\.safetensors") as e:
        with stfs.mount(bad):
            pass
    assert "\n" not in str(e.value)
    # Usage errors (exit 2) carry clap's first line, naming the flag.
    with pytest.raises(stfs.StfsError, match="--no-such-flag") as e:
        with stfs.mount(SAMPLE, no_such_flag=True):
            pass
    assert e.value.returncode == 2 and "\n" not in str(e.value)
    with pytest.raises(stfs.StfsError, match="--cache-size"):
        with stfs.mount(SAMPLE, cache_size="lots"):
            pass
    # A mount point already in use is refused, and the mount there is left alone.
    with stfs.mount(SAMPLE) as mp:
        with pytest.raises(stfs.StfsError, match="already mounted"):
            with stfs.mount(SAMPLE, mp):
                pass
        assert is_mounted(mp) and (mp / "metadata.json").is_file()
    with pytest.raises(ValueError, match="foreground"):
        with stfs.mount(SAMPLE, foreground=True):
            pass
    assert not stfs_temp_dirs(), "a failed mount left its temporary directory"


def test_open_files_at_the_end_detach_the_mount_lazily():
    reference = load_file(SAMPLE)
    with stfs.mount(SAMPLE) as mp:
        f = open(mp / "lm_head.weight", "rb")
        arrays = stfs.load(mp)
        pids = daemons_of(SAMPLE)
        assert pids
    try:
        assert not is_mounted(mp) and not mp.exists()
        # Detached, not gone: the open file and the memmaps are still served by its daemon.
        assert f.read() == reference["lm_head.weight"].tobytes()
        for name, want in reference.items():
            assert_same(arrays[name], want, name)
    finally:
        f.close()
    assert all(os.path.exists(f"/proc/{p}") for p in pids), "the daemon left while its files were mapped"
    del arrays
    gc.collect()
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 20), "daemon outlived its last file"


def test_arrays_of_a_cli_mount_outlive_stfs_unmount_but_stfs_umount_says_busy(tmp_path):
    """The lifetime load's docstring gives for a mount made with the CLI: while arrays map its files
    `stfs umount` says busy and leaves it, stfs.unmount detaches it lazily, and the arrays stay
    readable either way."""
    binary = stfs.find_binary()
    reference = load_file(SAMPLE)
    mp = tmp_path / "mp"
    mp.mkdir()
    subprocess.run([binary, "mount", SAMPLE, mp], check=True, capture_output=True, timeout=TIMEOUT)
    try:
        arrays = stfs.load(mp)
        out = subprocess.run([binary, "umount", mp], capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode == 1 and "busy" in out.stderr, out.stderr
        assert is_mounted(mp)
        stfs.unmount(mp)
        assert not is_mounted(mp)
        for name, want in reference.items():
            assert_same(arrays[name], want, name)
        del arrays
    finally:
        if is_mounted(mp):
            subprocess.run([binary, "umount", "--lazy", mp], capture_output=True, timeout=TIMEOUT)


def test_stfs_bin_overrides_the_binary(tmp_path, monkeypatch):
    real = stfs.find_binary()
    log = tmp_path / "calls"
    wrapper = tmp_path / "stfs-wrapper"
    wrapper.write_text(f"#!/bin/sh\necho \"$1\" >> '{log}'\nexec '{real}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("STFS_BIN", str(wrapper))
    assert stfs.find_binary() == str(wrapper)
    with stfs.mount(SAMPLE) as mp:
        assert is_mounted(mp)
    assert log.read_text().split() == ["mount", "umount"]
    monkeypatch.setenv("STFS_BIN", str(tmp_path / "nothing"))
    with pytest.raises(stfs.StfsError, match="STFS_BIN"):
        stfs.find_binary()


def test_every_wait_on_the_binary_is_bounded(tmp_path, monkeypatch):
    hung = tmp_path / "stfs-hangs"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    monkeypatch.setenv("STFS_BIN", str(hung))
    started = time.monotonic()
    with pytest.raises(stfs.StfsError, match="did not finish within 0.5 s"):
        with stfs.mount(SAMPLE, timeout=0.5):
            pytest.fail("the block ran")
    assert time.monotonic() - started < 10
    assert not stfs_temp_dirs()


def write_script(path, text):
    """An executable script, created exclusively (never through a link planted at `path`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def processes_naming(path):
    """PIDs of processes with `path` as one of their arguments."""
    want = os.fsencode(str(path))
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if want in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def test_a_mount_given_up_on_does_not_come_up_later(tmp_path, monkeypatch):
    """`stfs mount` forks the daemon, which mounts on its own: a command killed because it timed out,
    or because KeyboardInterrupt came during the wait, leaves that daemon mounting. This binary's
    `mount` does the same, slowly: it forks a process that runs the real `stfs mount` 0.5 s later,
    and waits 30 s itself. Neither a mount point given nor a temporary one may end up mounted."""
    real = stfs.find_binary()
    late = tmp_path / "stfs-mounts-late"
    write_script(late, f"#!/bin/sh\nif [ \"$1\" = mount ]; then (sleep 0.5; exec '{real}' \"$@\") & sleep 30; exit 1; fi\n"
                       f"exec '{real}' \"$@\"\n")
    monkeypatch.setenv("STFS_BIN", str(late))
    mp = tmp_path / "mp"
    mp.mkdir()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        with pytest.raises(stfs.StfsError, match="did not finish within 0.5 s"):
            with stfs.mount(SAMPLE, mp, timeout=0.5):
                pytest.fail("the block ran")
        assert not wait_until(lambda: is_mounted(mp), 2), "the timed-out mount came up afterwards"
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            with pytest.raises(KeyboardInterrupt):
                with stfs.mount(SAMPLE, mp, timeout=20):
                    pytest.fail("the block ran")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert not wait_until(lambda: is_mounted(mp), 2), "the interrupted mount came up afterwards"
        assert not processes_naming(mp), "a process of the mount given up on is still there"
        with pytest.raises(stfs.StfsError, match="did not finish within 0.5 s"):
            stfs.load(SAMPLE, timeout=0.5, mount=True)
        assert not wait_until(lambda: any("stfs-" in os.path.basename(p) for p in mounted_paths()
                                          if p.startswith(tempfile.gettempdir())), 2), "load's mount came up afterwards"
        assert not stfs_temp_dirs()
    finally:
        for path in [mp] + [p for p in mounted_paths() if p.startswith(tempfile.gettempdir() + os.sep)]:
            if is_mounted(path):
                subprocess.run([real, "umount", "--lazy", "--", path], capture_output=True, timeout=TIMEOUT)


def test_a_failing_unmount_does_not_hide_why_load_failed(tmp_path, monkeypatch):
    """When load fails after mounting (here: device="cuda" for NumPy) and then its unmount fails too
    (a binary whose `umount` hangs past `timeout`), the error raised is load's own, not the
    unmount's timeout."""
    real = stfs.find_binary()
    hangs = tmp_path / "stfs-umount-hangs"
    write_script(hangs, f"#!/bin/sh\nif [ \"$1\" = umount ]; then exec sleep 30; fi\nexec '{real}' \"$@\"\n")
    monkeypatch.setenv("STFS_BIN", str(hangs))
    before = mounted_paths()
    try:
        with pytest.raises(ValueError, match="NumPy arrays live on the CPU"):
            stfs.load(SAMPLE, device="cuda", timeout=3)
    finally:
        for path in mounted_paths() - before:
            subprocess.run([real, "umount", "--lazy", "--", path], capture_output=True, timeout=TIMEOUT)


# --- load with NumPy ---------------------------------------------------------------------------------

def assert_same(got, want, name):
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), name


def test_load_numpy_matches_load_file(loadable_checkpoint):
    reference = load_file(str(loadable_checkpoint))
    with stfs.mount(loadable_checkpoint) as mp:
        loaded = stfs.load(mp)
        assert sorted(loaded) == sorted(reference)
        for name, want in reference.items():
            got = loaded[name]
            assert_same(got, want, name)
            assert not got.flags.writeable, name
            if got.size:
                assert isinstance(got, np.memmap), name
            with pytest.raises(ValueError):
                got[...] = 0
        # Checkpoint order, as the file holds the tensors.
        meta = json.loads((mp / "metadata.json").read_text())
        assert list(loaded) == sorted(meta["tensors"], key=lambda n: meta["tensors"][n]["offset"])
        del loaded, got


def test_load_numpy_every_ml_dtype(ml_checkpoint):
    """Every dtype ml_dtypes gives NumPy (BF16 is in the previous test, where load_file reads it): the
    reference numpy loader has no type for these, so the reference is its deserializer's bytes."""
    with pytest.raises(Exception):
        load_file(str(ml_checkpoint))  # if this starts working, compare with it instead
    ref = reference_bytes(ml_checkpoint)
    with stfs.mount(ml_checkpoint) as mp:
        loaded = stfs.load(mp)
        assert sorted(loaded) == sorted(ref)
        for name, (dtype, shape, raw) in ref.items():
            got = loaded[name]
            if dtype == "F4":
                # Unpacked, one element per byte (NumPy has nothing smaller), low nibble first.
                assert got.dtype == ml_dtypes.float4_e2m1fn and list(got.shape) == shape, name
                assert got.tobytes() == unpack_f4(raw).tobytes(), name
                continue
            np_dtype = np.dtype(getattr(ml_dtypes, name.split(".")[0]))
            assert_same(got, np.frombuffer(raw, dtype=np_dtype).reshape(shape), name)
            assert not got.flags.writeable and (isinstance(got, np.memmap) or got.size == 0), name
        assert [float(x) for x in loaded["f4.flat"]] == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -6]
        del loaded, got
    # stfs's own F32 view converts F4 and F8 in Rust; load() of it agrees with ml_dtypes' conversion.
    with stfs.mount(ml_checkpoint, as_="f32") as mp:
        as_f32 = stfs.load(mp)
        for name, (dtype, shape, raw) in ref.items():
            want = unpack_f4(raw) if dtype == "F4" else np.frombuffer(raw, dtype=getattr(ml_dtypes, name.split(".")[0]))
            got = as_f32[name]
            assert got.dtype == np.float32 and list(got.shape) == shape, name
            assert np.array_equal(got.reshape(-1), want.astype(np.float32), equal_nan=True), name
        del as_f32, got


@pytest.mark.parametrize("missing", ["float8_e8m0fnu", "float4_e2m1fn"])
def test_an_ml_dtypes_without_a_type_is_one_clear_error(ml_checkpoint, monkeypatch, missing):
    """An ml_dtypes older than 0.5 (another package's pin) lacks float8_e8m0fnu and float4_e2m1fn:
    loading such a tensor says which type, which version, and what to install, not an
    AttributeError; the mount load made is gone."""
    monkeypatch.delattr(ml_dtypes, missing)
    before = mounted_paths()
    with pytest.raises(ImportError, match=rf"^stfs\.load: tensor .* needs ml_dtypes\.{missing}, and ml_dtypes .* lacks it: pip install") as e:
        stfs.load(ml_checkpoint)
    assert "\n" not in str(e.value)
    gc.collect()
    assert wait_until(lambda: mounted_paths() <= before, 20)
    assert not stfs_temp_dirs()


def test_load_numpy_f6_comes_back_as_raw_bytes(tmp_path):
    path = tmp_path / "f6.safetensors"
    tensors = {"a": ("F6_E2M3", [2, 4], bytes(range(6))), "b": ("F6_E3M2", [4], b"\xff\x00\x81"), "c": ("F32", [2], b"\0" * 8)}
    write_raw(path, tensors)
    with stfs.mount(path) as mp:
        with pytest.warns(UserWarning, match=r"2 tensor\(s\).*raw bytes.*a, b"):
            loaded = stfs.load(mp)
        assert loaded["a"].dtype == np.uint8 and loaded["a"].shape == (6,) and loaded["a"].tobytes() == bytes(range(6))
        assert loaded["b"].tobytes() == b"\xff\x00\x81" and loaded["c"].dtype == np.float32
        del loaded


def test_load_a_source_mounts_it_for_as_long_as_the_arrays_live(tmp_path):
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(SAMPLE, ckpt)
    reference = load_file(str(ckpt))
    loaded = stfs.load(ckpt, cache_size="1M", mount=True)
    # Nothing is left in the filesystem: the mount was detached and its directory removed...
    assert not any(str(ckpt) in p or "stfs-" in os.path.basename(p) for p in mounted_paths() if p.startswith(tempfile.gettempdir()))
    assert not stfs_temp_dirs()
    # ...but the arrays still read through it: its daemon lives while they map its files.
    pids = daemons_of(ckpt)
    assert len(pids) == 1, pids
    for name, want in reference.items():
        assert_same(loaded[name], want, name)
    del loaded, want
    gc.collect()
    assert wait_until(lambda: not os.path.exists(f"/proc/{pids[0]}"), 20), "the daemon outlived the arrays"


def test_load_a_directory_of_shards(tmp_path):
    """A directory of shards is a source, not a mount: load mounts it (one namespace, shard order)."""
    shards = tmp_path / "shards"
    shards.mkdir()
    first = {"a.0": random_array("float32", (4, 5)), "a.1": random_array("int8", (7,))}
    second = {"b.0": random_array("float16", (3,)), "b.1": random_array("uint64", (2, 2))}
    save_file(first, str(shards / "model-00001-of-00002.safetensors"))
    save_file(second, str(shards / "model-00002-of-00002.safetensors"))
    loaded = stfs.load(shards)
    assert set(list(loaded)[:2]) == set(first) and set(list(loaded)[2:]) == set(second)  # shard by shard
    for name, want in {**first, **second}.items():
        assert_same(loaded[name], want, name)
    del loaded


def test_a_plain_directory_holding_a_mounts_metadata_json_is_a_source_not_a_mount(tmp_path):
    """A metadata.json copied out of a mount into a directory of shards does not make the directory a
    mount: only a mount point with stfs's control directory is read as one; this one is mounted and
    its shard's bytes come back, not those of whatever file the copied metadata.json names."""
    shards = tmp_path / "shards"
    shards.mkdir()
    tensors = {"w": np.frombuffer(b"REAL", dtype=np.uint8)}
    save_file(tensors, str(shards / "model.safetensors"))
    with stfs.mount(shards / "model.safetensors") as mp:
        assert stfs.is_mount_dir(mp)
        (shards / "metadata.json").write_bytes((mp / "metadata.json").read_bytes())
    assert not stfs.is_mount_dir(shards)
    assert bytes(stfs.load(shards)["w"]) == b"REAL"


def test_another_filesystems_mount_holding_a_mounts_files_is_a_source_not_a_mount(tmp_path):
    """The root of a tmpfs (a volume, /dev/shm) holding a copy of a mount's metadata.json and
    `.stfs` is a mount point with stfs's files, but not an stfs mount: it is mounted and its shard
    read, not taken for a mount whose tensor files it would then read."""
    with tmpfs_at(str(tmp_path / "volume")) as volume:
        save_file({"w": np.frombuffer(b"REAL", dtype=np.uint8)}, os.path.join(volume, "model.safetensors"))
        with stfs.mount(os.path.join(volume, "model.safetensors")) as mp:
            assert stfs.is_mount_dir(mp)
            (Path(volume) / "metadata.json").write_bytes((mp / "metadata.json").read_bytes())
        os.mkdir(os.path.join(volume, ".stfs"))
        with open(os.path.join(volume, "w"), "xb") as f:
            f.write(b"FAKE")
        assert os.path.ismount(volume)
        assert not stfs.is_mount_dir(volume)
        loaded = stfs.load(volume)
        assert bytes(loaded["w"]) == b"REAL"
        del loaded


def test_a_source_whose_name_begins_with_a_dash_is_a_path_not_a_flag(tmp_path, monkeypatch):
    """The binary is called with `--` before its positional arguments: a relative path that begins
    with "-" is mounted, not parsed as flags."""
    monkeypatch.chdir(tmp_path)
    save_file({"w": np.frombuffer(b"REAL", dtype=np.uint8)}, "-dash.safetensors")
    assert bytes(stfs.load("-dash.safetensors")["w"]) == b"REAL"
    os.mkdir("-mp")
    with stfs.mount("-dash.safetensors", "-mp") as mp:
        assert is_mounted(mp) and bytes(stfs.load(mp)["w"]) == b"REAL"
    assert not is_mounted("-mp")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_load_in_an_ascii_locale(tmp_path, framework):
    """Under a locale whose encoding is not UTF-8 (LC_ALL=C without Python's UTF-8 mode), tensor
    names that are not ASCII still load: metadata.json is read as the UTF-8 it is, the tensor files
    are found by their UTF-8 names, and the binary's error line for a path that is not ASCII is one
    StfsError, not a UnicodeDecodeError."""
    if framework == "torch":
        import_torch()
    tensors = {"poids.\u00e9": np.arange(3, dtype=np.int32), "\u00df/x": np.ones(2, dtype=np.uint8), "\u6f22": np.zeros(1, np.float32)}
    ckpt = tmp_path / "uni.safetensors"
    save_file(tensors, str(ckpt))
    script = tmp_path / "load.py"
    with open(script, "x") as f:
        f.write("import json, os, sys\nimport stfs\n"
                "got = {k: v.tolist() for k, v in stfs.load(sys.argv[1], framework=sys.argv[3]).items()}\n"
                "try:\n    stfs.load(os.fsdecode(os.fsencode(sys.argv[2]) + b'/mod\\xc3\\xa8le.safetensors'))\n"
                "except stfs.StfsError as e:\n    error = str(e)\n"
                "print(json.dumps({'tensors': got, 'error': error}))\n")
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    if not INSTALLED:
        env["PYTHONPATH"] = os.path.join(ROOT, "python")
    out = subprocess.run([sys.executable, str(script), str(ckpt), str(tmp_path), framework], capture_output=True, env=env, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    result = json.loads(out.stdout)
    assert result["tensors"] == {name: a.tolist() for name, a in tensors.items()}
    missing = os.fsdecode(os.path.join(os.fsencode(str(tmp_path)), b"mod\xc3\xa8le.safetensors"))
    assert result["error"].startswith("stfs: ") and "no such file" in result["error"], result["error"]
    assert "mod\u00e8le.safetensors" in result["error"] and "\n" not in result["error"], (result["error"], missing)


def test_paths_may_be_bytes_and_one_that_is_not_utf8_is_one_clear_error(tmp_path):
    """Paths as bytes (os.fsencode, os.listdir(bytes)) work wherever a str does. The binary takes
    only UTF-8 arguments: a source or mount point that is not UTF-8 (or holds a NUL) is one
    StfsError naming it, before anything runs, and leaves no temporary directory."""
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(SAMPLE, ckpt)
    reference = load_file(SAMPLE)
    loaded = stfs.load(os.fsencode(str(ckpt)))
    assert sorted(loaded) == sorted(reference)
    del loaded
    mp = tmp_path / "mp"
    mp.mkdir()
    with stfs.mount(os.fsencode(str(ckpt)), os.fsencode(str(mp))) as got:
        assert got == mp and stfs.is_mounted(os.fsencode(str(mp))) and stfs.is_mount_dir(os.fsencode(str(mp)))
        assert [e.name for e in stfs.entries(os.fsencode(str(mp)))] == [e.name for e in stfs.entries(mp)]
        assert_same(stfs.load(os.fsencode(str(mp)))["lm_head.weight"], reference["lm_head.weight"], "lm_head.weight")
        stfs.unmount(os.fsencode(str(mp)))
        assert not is_mounted(mp)
    latin1 = os.path.join(os.fsencode(str(tmp_path)), b"mod\xe8le.safetensors")
    shutil.copyfile(SAMPLE, latin1)
    for source in (latin1, os.fsdecode(latin1)):
        with pytest.raises(stfs.StfsError, match=r"^stfs: .*/mod\\xe8le\.safetensors: the path is not UTF-8") as e:
            stfs.load(source)
        assert "\n" not in str(e.value)
    bad_mp = os.path.join(os.fsencode(str(tmp_path)), b"mp\xe8")
    os.mkdir(bad_mp)
    with pytest.raises(stfs.StfsError, match=r"^stfs: .*/mp\\xe8: the path is not UTF-8"):
        with stfs.mount(ckpt, bad_mp):
            pytest.fail("the block ran")
    with pytest.raises(stfs.StfsError, match="NUL"):
        stfs.load(str(ckpt) + "\0x")
    assert not stfs_temp_dirs()


def test_an_option_value_that_begins_with_a_dash_is_a_value_not_a_flag(tmp_path, monkeypatch):
    """A relative path given as an option's value may begin with "-": the binary gets it attached
    (`--log-file=-dash.log`), not as a word of its own that clap takes for a flag."""
    monkeypatch.chdir(tmp_path)
    assert stfs.mount_flags({"log_file": "-dash.log", "o": "-x", "cache_size": "1M"}) == [
        "--log-file=-dash.log", "-o=-x", "--cache-size", "1M"]
    with stfs.mount(SAMPLE, log_file="-dash.log", cache_size="1M") as mp:
        assert is_mounted(mp)
    assert (tmp_path / "-dash.log").is_file()
    with stfs.mount(SAMPLE, log_file=Path("-other.log")) as mp:
        assert is_mounted(mp)
    assert (tmp_path / "-other.log").is_file()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_load_numpy_of_many_tensors_keeps_no_descriptor_and_the_limit_as_it_was(tmp_path):
    """300 tensors load as np.memmap's under a soft limit of 200 open files, which the load leaves as it
    was: each mapping keeps no descriptor open, and is unmapped when its last array is freed."""
    import gc
    import resource

    tensors = {f"t.{i}": np.full((3,), i, dtype=np.int32) for i in range(300)}
    ckpt = tmp_path / "many.safetensors"
    save_file(tensors, str(ckpt))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    try:
        # Per-tensor files (as root, passthrough would make the shard one mapping: tests/python/test_near.py).
        with stfs.mount(ckpt, no_passthrough=True) as mp:
            before = _open_descriptors()
            loaded = stfs.load(mp)
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (200, hard)
            assert _open_descriptors() <= before
            assert all(isinstance(loaded[n], np.memmap) for n in tensors)
            view = loaded["t.7"][1:]
            assert all(loaded[n].tolist() == [i] * 3 for i, n in enumerate(tensors))
            with open("/proc/self/maps") as f:
                assert sum(str(mp) in line for line in f) == 300
            del loaded
            gc.collect()
            with open("/proc/self/maps") as f:
                assert sum(str(mp) in line for line in f) == 1, "a view keeps its mapping, the rest are unmapped"
            assert view.tolist() == [7, 7] and not view.flags.writeable
            del view
            gc.collect()
            with open("/proc/self/maps") as f:
                assert not any(str(mp) in line for line in f)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_arrays_stay_readable_in_atexit_handlers(tmp_path):
    """A loaded array read by an atexit handler registered before the load (handlers run last-registered
    first, after the mapping's finalizer would have run) reads its bytes: the mapping is not unmapped at
    interpreter exit."""
    ckpt = tmp_path / "m.safetensors"
    save_file({"w": np.arange(1000, dtype=np.float32)}, str(ckpt))
    script = tmp_path / "late_read.py"
    with open(script, "x") as f:
        f.write("import atexit, sys, stfs\n"
                "holder = {}\n"
                "atexit.register(lambda: print('sum', float(holder['w'].sum()), flush=True))\n"
                "with stfs.mount(sys.argv[1]) as mp:\n"
                "    holder['w'] = stfs.load(mp)['w']\n"
                "    print('loaded', flush=True)\n")
    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = os.path.join(ROOT, "python")
    out = subprocess.run([sys.executable, str(script), str(ckpt)], capture_output=True, text=True, env=env,
                         timeout=TIMEOUT)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.splitlines() == ["loaded", "sum 499500.0"], out.stdout


MAPPINGS_NEAR_THE_LIMIT = """
import ctypes, importlib, sys
import stfs
importlib.import_module("numpy" if sys.argv[2] == "numpy" else "torch")  # its libraries need mappings too
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
limit = int(open("/proc/sys/vm/max_map_count").read())
used = sum(1 for _ in open("/proc/self/maps", "rb"))
# Pages of alternating protection, so the kernel cannot merge neighbours into one mapping.
for i in range(limit - used - 200):
    if libc.mmap(None, 4096, i % 2, 0x22, -1, 0) in (None, ctypes.c_void_p(-1).value):
        sys.exit("mmap failed after %d mappings" % i)
try:
    loaded = stfs.load(sys.argv[1], framework=sys.argv[2], device=sys.argv[3])
    print("loaded %d" % len(loaded))
except OSError as e:
    print(str(e))
"""


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_more_tensors_than_the_mapping_limit_allows_is_one_clear_error(tmp_path, framework):
    """Every tensor mapped is a memory mapping, and vm.max_map_count bounds a process's (65530 by
    default; a large mixture of experts has more tensors): a load that would pass it says so, with
    what to change, before mapping anything, instead of mmap's bare ENOMEM halfway. A child process
    fills its mappings to 200 short of the limit, then loads 300 tensors: over per-tensor files
    (--no-passthrough) each needs a mapping, for NumPy and for torch on the CPU; a shard handed to
    the kernel (passthrough, as root) is one mapping, and torch onto another device maps nothing
    for long: both load."""
    if framework == "torch":
        import_torch()
    tensors = {f"t.{i}": np.full((3,), i, dtype=np.int32) for i in range(300)}
    ckpt = tmp_path / "many.safetensors"
    save_file(tensors, str(ckpt))
    script = tmp_path / "near_the_limit.py"
    with open(script, "x") as f:
        f.write(MAPPINGS_NEAR_THE_LIMIT)
    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = os.path.join(ROOT, "python")
    with stfs.mount(ckpt, no_passthrough=True) as mp, stfs.mount(ckpt) as whole:
        out = subprocess.run([sys.executable, str(script), str(mp), framework, "cpu"], capture_output=True, text=True,
                             env=env, timeout=TIMEOUT)
        assert out.returncode == 0, out.stderr[-2000:]
        assert re.match(r"^stfs\.load: 300 tensors mapped with .* need 300 memory mappings, and this process has \d+ "
                        r"of the \d+ vm\.max_map_count allows: raise it", out.stdout), out.stdout
        if framework == "torch":
            # Onto another device each mapping goes as soon as its tensor is copied: no limit to check.
            out = subprocess.run([sys.executable, str(script), str(mp), framework, "meta"], capture_output=True,
                                 text=True, env=env, timeout=TIMEOUT)
            assert out.returncode == 0 and out.stdout == "loaded 300\n", (out.stdout, out.stderr[-2000:])
        if os.geteuid() == 0:
            out = subprocess.run([sys.executable, str(script), str(whole), framework, "cpu"], capture_output=True,
                                 text=True, env=env, timeout=TIMEOUT)
            assert out.returncode == 0 and out.stdout == "loaded 300\n", (out.stdout, out.stderr[-2000:])


def test_loads_in_two_threads_at_once_under_a_low_descriptor_limit(tmp_path):
    """Two threads load 300 tensors each at once under a soft limit of 200 open files: both succeed, and
    the limit is left as it was."""
    import resource
    import threading

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ckpts = []
    for k in range(2):
        ckpts.append(tmp_path / f"many{k}.safetensors")
        save_file({f"t.{i}": np.full((3,), i, dtype=np.int32) for i in range(300)}, str(ckpts[-1]))
    results, errors = {}, []
    start = threading.Barrier(2, timeout=TIMEOUT)

    def load(mp, k):
        try:
            start.wait()
            results[k] = stfs.load(mp)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    try:
        with stfs.mount(ckpts[0]) as a, stfs.mount(ckpts[1]) as b:
            threads = [threading.Thread(target=load, args=(mp, k)) for k, mp in enumerate((a, b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            assert not any(t.is_alive() for t in threads)
            assert not errors, errors
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (200, hard)
            assert all(results[k][f"t.{i}"].tolist() == [i] * 3 for k in range(2) for i in range(300))
            results.clear()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_load_refuses_what_it_cannot_do(tmp_path):
    with stfs.mount(SAMPLE) as mp:
        with pytest.raises(ValueError, match="framework"):
            stfs.load(mp, framework="jax")
        with pytest.raises(ValueError, match="device"):
            stfs.load(mp, device="cuda")
        with pytest.raises(TypeError, match="already a mount"):
            stfs.load(mp, cache_size="1G")
    with pytest.raises(stfs.StfsError, match=r"^stfs: .*nothing\.safetensors"):
        stfs.load(tmp_path / "nothing.safetensors")


def test_a_device_that_is_not_there_is_refused_before_mounting(tmp_path, monkeypatch):
    """A device NumPy cannot hold, a string torch does not take, or a CUDA device past the last one
    is one clear error before the binary is run at all: no mount to make (of a remote source,
    seconds) and none to take down."""
    real = stfs.find_binary()
    log = tmp_path / "calls"
    wrapper = tmp_path / "stfs-logged"
    write_script(wrapper, f"#!/bin/sh\necho \"$1\" >> '{log}'\nexec '{real}' \"$@\"\n")
    monkeypatch.setenv("STFS_BIN", str(wrapper))
    with pytest.raises(ValueError, match=r"^stfs\.load: NumPy arrays live on the CPU"):
        stfs.load(SAMPLE, device="cuda")
    torch = import_torch()
    with pytest.raises(ValueError, match=r"^stfs\.load: device='gpu' is not a torch device") as e:
        stfs.load(SAMPLE, framework="torch", device="gpu")
    assert "\n" not in str(e.value)
    with pytest.raises(stfs.StfsError, match=r"^stfs\.load: device='cuda:\d+', but"):
        stfs.load(SAMPLE, framework="torch", device=f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    assert not log.exists(), log.read_text()
    assert not stfs_temp_dirs()


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_framework_that_cannot_be_imported_is_one_clear_error(tmp_path, monkeypatch, framework):
    """load(framework=...) without that framework installed says what to install, before the
    binary runs (before: torch's bare ModuleNotFoundError, after mounting)."""
    real = stfs.find_binary()
    log = tmp_path / "calls"
    wrapper = tmp_path / "stfs-logged"
    write_script(wrapper, f"#!/bin/sh\necho \"$1\" >> '{log}'\nexec '{real}' \"$@\"\n")
    monkeypatch.setenv("STFS_BIN", str(wrapper))
    monkeypatch.setitem(sys.modules, framework, None)  # import fails, as when it is not installed
    with pytest.raises(ImportError, match=rf"^stfs\.load: framework='{framework}' needs .*: pip install {framework} "
                                          rf"\(or pip install 'stfs\[{framework}\]'\)$"):
        stfs.load(SAMPLE, framework=framework)
    assert not log.exists(), log.read_text()


# --- load with torch ---------------------------------------------------------------------------------

def import_torch():
    try:
        import torch
    except ImportError:
        requirements = Path(ROOT, "tests", "python", "requirements.txt").read_text()
        if os.environ.get("STFS_REQUIRE_GPU") == "1":
            pytest.fail("torch cannot be imported, and STFS_REQUIRE_GPU=1 (scripts/test-gpu) needs it")
        if os.environ.get("CI") == "true" and any(line.split("=")[0].split(">")[0].strip() == "torch" for line in requirements.splitlines()):
            pytest.fail("torch is in tests/python/requirements.txt but cannot be imported")
        pytest.skip("PyTorch is not installed: stfs.load(framework='torch') is not tested (pip install torch to run it)")
    return torch


@pytest.fixture
def torch_meta_default():
    """torch with torch.set_default_device("meta") in force for the test."""
    torch = import_torch()
    torch.set_default_device("meta")
    assert torch.empty(1).device.type == "meta"
    try:
        yield torch
    finally:
        torch.set_default_device("cpu")


def torch_bytes(t):
    import torch

    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_load_torch_on_cpu_despite_a_meta_default_device(torch_meta_default, loadable_checkpoint, ml_checkpoint):
    torch = torch_meta_default
    for ckpt in (loadable_checkpoint, ml_checkpoint):
        ref = reference_bytes(ckpt)
        with stfs.mount(ckpt) as mp:
            loaded = stfs.load(mp, framework="torch", device="cpu")
            assert sorted(loaded) == sorted(ref)
            for name, (dtype, shape, raw) in ref.items():
                t = loaded[name]
                assert t.device == torch.device("cpu"), (name, t.device)
                assert torch_bytes(t) == raw, name
                if dtype != "F4":
                    assert list(t.shape) == shape, name
            del loaded, t


def test_load_torch_of_a_source_onto_the_device_asked_for(torch_meta_default, tmp_path):
    torch = torch_meta_default
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(SAMPLE, ckpt)
    reference = load_file(SAMPLE)
    # mount=True: this is the mounted path's lifetime. Where the extension module is there (the wheel
    # has it), a source is otherwise loaded in process, which the next lines check starts no daemon.
    if stfs._engine.available():
        in_process = stfs.load(ckpt, framework="torch")
        assert all(t.device == torch.device("cpu") for t in in_process.values())
        assert daemons_of(ckpt) == [], "a load without mount=True started a daemon"
        for name, want in reference.items():
            assert torch_bytes(in_process[name]) == want.tobytes(), name
        del in_process
    loaded = stfs.load(ckpt, framework="torch", mount=True)  # device defaults to "cpu", not to the default device
    assert all(t.device == torch.device("cpu") for t in loaded.values())
    pids = daemons_of(ckpt)
    assert len(pids) == 1, pids  # detached, alive while the tensors map its files
    for name, want in reference.items():
        assert torch_bytes(loaded[name]) == want.tobytes(), name
    del loaded
    gc.collect()
    assert wait_until(lambda: not os.path.exists(f"/proc/{pids[0]}"), 20), "the daemon outlived the tensors"
    # Moved only where asked: explicitly "meta" gives meta tensors of the right dtype and shape.
    with stfs.mount(SAMPLE) as mp:
        on_meta = stfs.load(mp, framework="torch", device="meta")
        assert all(t.device.type == "meta" for t in on_meta.values())
        assert {n: list(t.shape) for n, t in on_meta.items()} == {n: list(a.shape) for n, a in reference.items()}
        if torch.cuda.is_available():
            on_gpu = stfs.load(mp, framework="torch", device="cuda:0")
            for name, want in reference.items():
                assert on_gpu[name].device == torch.device("cuda", 0), name
                assert torch_bytes(on_gpu[name]) == want.tobytes(), name
            del on_gpu


def test_a_cuda_load_of_a_source_starts_no_daemon(torch_meta_default, tmp_path):
    """stfs.load(source, device="cuda:0") with no mount (the wheel has the extension module): the engine
    reads every tensor into the pinned ring in this process and each piece is copied to the GPU; no
    `stfs mount` daemon is started, and the bytes are load_file's. Needs a GPU (scripts/test-gpu);
    elsewhere it skips saying so, or fails under STFS_REQUIRE_GPU=1."""
    torch = torch_meta_default
    if not torch.cuda.is_available():
        why = f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__})"
        if os.environ.get("STFS_REQUIRE_GPU") == "1":
            pytest.fail(f"{why}, and STFS_REQUIRE_GPU=1 (scripts/test-gpu) requires a GPU")
        pytest.skip(f"{why}; scripts/test-gpu runs it on a GPU")
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(SAMPLE, ckpt)
    reference = load_file(SAMPLE)
    on_gpu = stfs.load(ckpt, framework="torch", device="cuda:0")
    assert daemons_of(ckpt) == [], "a CUDA load of a source started a daemon"
    assert set(on_gpu) == set(reference)
    for name, want in reference.items():
        assert on_gpu[name].device == torch.device("cuda", 0), name
        assert torch_bytes(on_gpu[name]) == want.tobytes(), name


def test_the_pinned_memory_read_fills_a_cpu_tensor(torch_meta_default):
    """The CUDA path reads each file into a pinned host tensor (_read_into) before a non-blocking copy;
    no GPU here, so the read itself is checked into an ordinary CPU tensor."""
    torch = torch_meta_default
    from stfs._load import _read_into

    with stfs.mount(SAMPLE) as mp:
        for e in stfs.entries(mp):
            host = torch.empty(e.byte_len, dtype=torch.uint8, device="cpu")
            _read_into(e.path, host)
            assert host.numpy().tobytes() == (mp / os.path.relpath(e.path, mp)).read_bytes(), e.name
