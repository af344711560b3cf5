"""stfs.load's read-ahead (issue 44, item 6) stays within the memory the process's cgroup leaves it, not
only the host's MemAvailable (cgroup v2 and v1, limits on a parent included: fake cgroup files under a
temporary root, and a real cgroup with a memory limit that a child process is moved into), and ends
with a load that fails: a load interrupted (KeyboardInterrupt) after its read-ahead started leaves no
read-ahead thread, no descriptor or mapping of the mount, and its daemon exits."""
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import ROOT, cold_files, tool_missing, wait_until

os.environ.setdefault("STFS_BIN", os.path.join(ROOT, "target", "debug", "stfs"))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package's source in this checkout
import stfs  # noqa: E402
from stfs import _load, _whole  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20


def _write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


def _fake(root, cgroup, mountinfo, files, meminfo_kib=64 << 20):
    """A fake / under `root`: /proc/self/cgroup, /proc/self/mountinfo, /proc/meminfo (64 GiB available)
    and the cgroup files {path: text}."""
    _write(root, "proc/self/cgroup", cgroup)
    _write(root, "proc/self/mountinfo", mountinfo)
    _write(root, "proc/meminfo", f"MemTotal: {meminfo_kib * 2} kB\nMemAvailable: {meminfo_kib} kB\n")
    for path, text in files.items():
        _write(root, path, text)


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroup_v2_bounds_by_the_least_room_over_the_cgroup_and_its_parents(tmp_path):
    """v2: the process's cgroup (no limit: "max") sits in a parent limited to 4 GiB of which 1 GiB is used,
    256 MiB of that inactive page cache: 3.25 GiB left, the least over the two; the host's 64 GiB lose."""
    root = str(tmp_path)
    _fake(root, "0::/pod/app\n", "22 1 0:20 / / rw - ext4 /dev/vda1 rw\n" + V2_MOUNT, {
        "sys/fs/cgroup/pod/app/memory.max": "max\n",
        "sys/fs/cgroup/pod/app/memory.current": f"{100 * MiB}\n",
        "sys/fs/cgroup/pod/memory.max": f"{4 * GiB}\n",
        "sys/fs/cgroup/pod/memory.current": f"{GiB}\n",
        "sys/fs/cgroup/pod/memory.stat": f"anon 1000\nfile {512 * MiB}\ninactive_file {256 * MiB}\n",
    })
    assert _whole.cgroup_memory_left(root) == 4 * GiB - (GiB - 256 * MiB)
    assert _whole.memory_available(root) == 4 * GiB - (GiB - 256 * MiB)
    # The process's own cgroup tighter than its parent: it wins.
    _write(root, "sys/fs/cgroup/pod/app/memory.max", f"{300 * MiB}\n")
    assert _whole.memory_available(root) == 200 * MiB
    # Used past its limit (charged before it was lowered): nothing left, none read ahead.
    _write(root, "sys/fs/cgroup/pod/app/memory.current", f"{400 * MiB}\n")
    assert _whole.memory_available(root) == 0


def test_no_cgroup_limit_leaves_mem_available(tmp_path):
    """"max" everywhere (v2), or v1's "unlimited" (2^63 rounded down to a page), or no cgroup files at
    all: MemAvailable alone."""
    root = str(tmp_path / "v2")
    _fake(root, "0::/\n", V2_MOUNT, {"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "5\n"})
    assert _whole.cgroup_memory_left(root) is None
    assert _whole.memory_available(root) == 64 * GiB
    root = str(tmp_path / "v1")
    _fake(root, "4:memory:/\n0::/\n", "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GiB}\n",
    })
    assert _whole.memory_available(root) == 64 * GiB
    root = str(tmp_path / "none")
    _fake(root, "0::/\n", "22 1 0:20 / / rw - ext4 /dev/vda1 rw\n", {})
    assert _whole.memory_available(root) == 64 * GiB


def test_cgroup_v1_memory_controller_bounds_it(tmp_path):
    """v1 (a hybrid host: the memory controller on its own hierarchy, cgroup2 beside it with no memory
    files): the memory line's cgroup under its mount, whose root is the container's cgroup (Docker
    without a cgroup namespace): 2 GiB limit, 1.5 GiB used of which 512 MiB inactive cache."""
    root = str(tmp_path)
    mountinfo = ("35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
                 "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    _fake(root, "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n", mountinfo, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{2 * GiB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{3 * GiB // 2}\n",
        "sys/fs/cgroup/memory/memory.stat": f"cache 1\ninactive_file 7\ntotal_inactive_file {512 * MiB}\n",
    })
    assert _whole.memory_available(root) == GiB


def test_read_ahead_reads_no_more_than_the_cgroup_leaves(tmp_path, monkeypatch):
    """read_ahead asks memory_available (the cgroup included) for its bound: with 12 MiB left, half of
    it, 6 MiB of two 5 MiB files, is read."""
    monkeypatch.setattr(_whole, "READ_AHEAD_STEP", 1 << 20)
    monkeypatch.setattr(_whole, "READ_AHEAD_SPAN", 2 << 20)
    monkeypatch.setattr(_whole, "cgroup_memory_left", lambda root="/": 12 << 20)
    files = cold_files(tmp_path, ("a", "b"), 5 << 20)
    reads = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, at, *a: reads.append(at) or preadv(fd, bufs, at, *a))
    _whole.read_ahead(files)
    for t in _read_ahead_threads():
        t.join(30)
    assert not _read_ahead_threads()
    assert len(reads) == 6, reads


def _memory_cgroup_parent():
    """A directory where this root process may make a memory-limited child cgroup, with its kind ("v2"
    or "v1"); None where there is none (not root, no memory controller mounted or enabled)."""
    if os.geteuid() != 0:
        return None
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ", 1) for line in f if " - " in line]
    for before, after in mounts:
        point, kind, options = before.split()[4], after.split()[0], after.split()[2].split(",")
        if kind == "cgroup2" and os.path.isfile(os.path.join(point, "cgroup.controllers")):
            with open(os.path.join(point, "cgroup.controllers")) as f:
                if "memory" not in f.read().split():
                    continue
            try:
                with open(os.path.join(point, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            except OSError:
                continue
            return point, "v2"
    for before, after in mounts:
        point, kind, options = before.split()[4], after.split()[0], after.split()[2].split(",")
        if kind == "cgroup" and "memory" in options and os.access(point, os.W_OK):
            return point, "v1"
    return None


def test_a_real_memory_cgroup_bounds_a_process_in_it():
    """A child cgroup limited to 256 MiB (v2 memory.max, or v1 memory.limit_in_bytes), a process moved
    into it: its memory_available is at most 256 MiB (the host's MemAvailable is more) and close to it."""
    found = _memory_cgroup_parent()
    if found is None:
        assert os.environ.get("CI") not in ("true", "1") or os.geteuid() == 0, "CI=true runs as root"
        pytest.skip("no memory cgroup this process may make a child of (not root, or no memory controller)")
    parent, kind = found
    group = os.path.join(parent, f"stfs-test-{os.getpid()}")
    os.mkdir(group)
    child = None
    try:
        limit = 256 * MiB
        with open(os.path.join(group, "memory.max" if kind == "v2" else "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from stfs import _whole; sys.stdin.readline(); "
                "print(_whole.memory_available(), _whole.mem_available(), flush=True)")
        child = subprocess.Popen([sys.executable, "-c", code, os.path.join(ROOT, "python")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        out, _ = child.communicate("go\n", timeout=60)
        available, host = (int(n) for n in out.split())
        assert host > limit, f"the host has only {host} bytes available: the test shows nothing"
        assert limit - 64 * MiB < available <= limit, f"{kind}: {available} bytes, limit {limit}"
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)
        # An emptied cgroup can be removed (its last process gone: wait, bounded).
        assert wait_until(lambda: _rmdir(group), 10), f"{group} could not be removed"


def _rmdir(path):
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _read_ahead_threads():
    return [t for t in threading.enumerate() if t.name == "stfs-read-ahead"]


def _on_device(dev):
    """Descriptors and mappings of this process on device `dev` (the mount's)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{fd}").st_dev == dev:
                held.append(f"fd {fd}: {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    with open("/proc/self/maps") as f:
        held += [line.strip() for line in f if line.split()[3] == want]
    return held


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_load_interrupted_stops_its_read_ahead_and_lets_the_mount_go(tmp_path, monkeypatch):
    """stfs.load(file, framework="torch") as root maps the re-served file the mount hands to the kernel
    and starts read_ahead's threads on it; a Ctrl-C (KeyboardInterrupt, raised here where load checks
    its first tensor, after the read-ahead started) ends the load. Its threads are stopped and joined
    before load raises: none is left, no descriptor or mapping of the mount, and the daemon of load's
    own mount (detached lazily) exits. Each read here takes 0.2 s, so a read-ahead left running
    (before: nothing stopped it) would read for seconds more."""
    if os.geteuid() != 0:
        assert os.environ.get("CI") not in ("true", "1"), "CI=true runs as root"
        pytest.skip("FUSE passthrough, which read_ahead serves, needs root")
    try:
        import torch  # noqa: F401
    except ImportError:
        assert os.environ.get("CI") not in ("true", "1"), "CI=true needs torch (tests/python/requirements-torch.txt)"
        pytest.skip("torch is not installed")
    path = tmp_path / "model.safetensors"
    save_file({"a": np.arange(16 << 20, dtype=np.float32), "b": np.ones(1000, np.float32)}, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    preadv = os.preadv

    def slow_preadv(fd, bufs, at, *rest):
        if threading.current_thread().name == "stfs-read-ahead":
            time.sleep(0.2)
        return preadv(fd, bufs, at, *rest)

    monkeypatch.setattr(os, "preadv", slow_preadv)
    seen = {}
    check_size = _load._check_size

    def interrupted(entry, count, itemsize):
        if not seen:
            seen["threads"] = len(_read_ahead_threads())
            seen["dev"] = os.stat(entry.path).st_dev
            mountpoint = os.path.dirname(entry.path)
            seen["daemons"] = [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, mountpoint)]
            raise KeyboardInterrupt
        return check_size(entry, count, itemsize)

    monkeypatch.setattr(_load, "_check_size", interrupted)
    with pytest.raises(KeyboardInterrupt) as raised:
        stfs.load(path, framework="torch")
    del raised  # its traceback holds load's frames, and with them the mapping of the shard
    gc.collect()
    assert seen.get("threads", 0) > 0, f"no read-ahead was running when the load was interrupted: {seen}"
    assert seen["daemons"], "the daemon of load's mount was not found"
    assert not _read_ahead_threads(), "read-ahead threads outlived the load"
    assert not _on_device(seen["dev"]), _on_device(seen["dev"])
    assert wait_until(lambda: not any(_alive(p) for p in seen["daemons"]), 20), "the mount's daemon is still alive"


def _cmdline_has(pid, text):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.fsencode(text) in f.read().split(b"\0")
    except OSError:
        return False


SAMPLED = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from stfs._whole import sampled_cached
fd = os.open(sys.argv[2], os.O_RDONLY)
print(json.dumps(sampled_cached(fd, os.fstat(fd).st_size)))
"""


def test_a_shared_read_only_file_is_seen_cold_or_cached_as_it_is_by_a_user_who_may_not_write_it():
    """mincore(2) reports every page of a file the caller neither owns nor may write as resident (Linux
    5.2 on), so for a user loading a model others own (a shared, read-only models folder) a cold file
    looked cached: no read-ahead, no O_DIRECT read, the slow path. Such a file is asked with RWF_NOWAIT
    reads instead: cold after a drop, cached once read."""
    python = "/usr/bin/python3"
    if shutil.which("setpriv") is None:
        tool_missing("setpriv", "apt-get install util-linux")
    if not os.path.exists(python):
        tool_missing(python, "apt-get install python3 (a Python outside /root, which `nobody` can run)")
    if os.geteuid() != 0:
        tool_missing("root", "run the test command as root: the file must be one `nobody` may not write")
    shared = tempfile.mkdtemp(prefix="stfs-sampled-", dir="/tmp")  # where `nobody` can read
    try:
        os.chmod(shared, 0o755)
        shutil.copytree(os.path.join(ROOT, "python", "stfs"), os.path.join(shared, "stfs"),
                        ignore=shutil.ignore_patterns("__pycache__", "_native*"))
        model = os.path.join(shared, "model.safetensors")
        with open(model, "wb") as f:
            f.write(os.urandom(16 << 20))
            f.flush()
            os.fsync(f.fileno())
        subprocess.run(["chmod", "-R", "a+rX,go-w", shared], check=True)

        def seen_cached():
            out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, "-c",
                                  SAMPLED, shared, model], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        with open(model, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert seen_cached() is False, "a cold file the user may not write looked cached"
        with open(model, "rb") as f:
            while f.read(1 << 20):
                pass
        assert seen_cached() is True, "a cached file the user may not write looked cold"
    finally:
        shutil.rmtree(shared, ignore_errors=True)
