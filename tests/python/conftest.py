"""Fixtures for the Python cross-checks: the stfs binary and a mount context manager.

Every mount goes on a fresh temporary directory, `stfs mount` returns only once the mount answers
(so no waiting is needed), and the mount is always unmounted on exit, lazily if it must be.
"""
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STFS = os.environ.get("STFS_BIN", os.path.join(ROOT, "target", "debug", "stfs"))
TIMEOUT = 60


def wait_until(predicate, seconds=TIMEOUT):
    """Whether `predicate()` holds within `seconds` (asked every 50 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()



def cold_files(folder, names, size):
    """Files of `size` random bytes named `names` in `folder`, written out and dropped from the page
    cache (fsync, then POSIX_FADV_DONTNEED), as a cold read-ahead finds them; their paths as strings."""
    files = []
    for name in names:
        path = folder / name
        path.write_bytes(os.urandom(size))
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        files.append(str(path))
    return files

def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path for line in f)


@contextlib.contextmanager
def mounted(source, *args):
    """Mounts `source` with `stfs mount` and yields the mount point."""
    with tempfile.TemporaryDirectory(prefix="stfs-py-") as tmp:
        mp = os.path.join(tmp, "m")
        os.mkdir(mp)
        try:
            out = subprocess.run([STFS, "mount", str(source), mp, *args], capture_output=True, text=True, timeout=TIMEOUT)
            assert out.returncode == 0, out.stderr
            assert is_mounted(mp)
            yield mp
        finally:
            if is_mounted(mp):
                r = subprocess.run([STFS, "umount", mp], capture_output=True, timeout=TIMEOUT)
                if r.returncode != 0:
                    subprocess.run([STFS, "umount", "--lazy", mp], capture_output=True, timeout=TIMEOUT)


def stop_process(proc, seconds=30):
    """Ends `proc` (a subprocess.Popen): SIGTERM, then SIGKILL if it is still there after `seconds`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=seconds)


def wait_port(port, what, timeout=5):
    """Waits until something accepts connections on 127.0.0.1:`port`; fails naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.02)


def tool_missing(tool, install):
    """Skips a test whose tool is not installed; under CI=true (where the test command installs every
    tool) or STFS_REQUIRE_GPU=1 (scripts/test-gpu) fails it instead, so a missing tool never passes as
    a skip."""
    if os.environ.get("CI") in ("true", "1") or os.environ.get("STFS_REQUIRE_GPU") == "1":
        pytest.fail(f"{tool} is not installed, and CI=true or STFS_REQUIRE_GPU=1: the test command must install it ({install})")
    pytest.skip(f"{tool} is not installed ({install})")


def allowed_skips():
    """The tests STFS_ALLOWED_SKIPS names (comma-separated test function names, parameters left off):
    the only ones that may skip under no_skip()."""
    return {name.strip() for name in os.environ.get("STFS_ALLOWED_SKIPS", "").split(",") if name.strip()}


def no_skip():
    """Whether a skip fails the test: under STFS_REQUIRE_GPU=1 (scripts/test-gpu on a GPU machine) or
    STFS_NO_SKIP=1 (its rehearsal without one)."""
    return os.environ.get("STFS_REQUIRE_GPU") == "1" or os.environ.get("STFS_NO_SKIP") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under no_skip() a skip is a failure, whatever raised it (a skip marker, pytest.importorskip, a
    helper), unless the test is named in STFS_ALLOWED_SKIPS, or (STFS_ALLOW_NO_CUDA_SKIPS=1: the
    rehearsal on a machine without a GPU) it skipped for want of a CUDA device: every test selected
    must run."""
    outcome = yield
    report = outcome.get_result()
    if not (no_skip() and report.skipped and not hasattr(report, "wasxfail")):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if item.originalname in allowed_skips():
        return
    if os.environ.get("STFS_ALLOW_NO_CUDA_SKIPS") == "1" and reason.startswith("Skipped: no CUDA device"):
        return
    report.outcome = "failed"
    report.longrepr = (f"{reason}: a skip, and under STFS_REQUIRE_GPU=1 or STFS_NO_SKIP=1 only these tests may "
                       f"skip: {', '.join(sorted(allowed_skips())) or 'none'} (STFS_ALLOWED_SKIPS)")


@pytest.fixture
def stfs_bin():
    assert os.path.exists(STFS), f"build stfs first: {STFS}"
    return STFS
