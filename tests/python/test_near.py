"""stfs.load over a re-served checkpoint file the mount hands to the kernel (FUSE passthrough: root, a
local file) returns the same tensors, dtypes and shapes as over per-tensor files (a mount with
--no-passthrough), for NumPy and torch; the handed-over path is really taken (its counter moves) and, for
torch, returns views of one mapping of the shard (zero copy, as load_file)."""
import json
import os
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import ROOT

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
        assert os.getxattr(shard, "user.stfs.passthrough") == b"0", "not open: nothing handed over"
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
    import threading
    return [t for t in threading.enumerate() if t.name == "stfs-read-ahead"]


def _address(m):
    """The address of an mmap.mmap's mapping (the array taking it is dropped at once)."""
    a = np.frombuffer(m, np.uint8)
    try:
        return a.ctypes.data
    finally:
        del a


def test_read_ahead_advises_every_range_and_ends(tmp_path, monkeypatch):
    """read_ahead's threads advise every chunk of every range and end; a refused advice (a range
    nothing maps any more) ends them quietly."""
    import mmap

    from stfs import _whole

    monkeypatch.setattr(_whole, "READ_AHEAD_CHUNK", 1 << 20)
    path = tmp_path / "f"
    path.write_bytes(os.urandom(5 << 20))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    _whole.read_ahead([(_address(m) + 100, len(m) - 100, m), (_address(m), 0, None)])
    for t in _read_ahead_threads():
        t.join(10)
    assert not _read_ahead_threads()
    m.close()
    gone = mmap.mmap(-1, 4 << 20)
    address = _address(gone)
    gone.close()  # unmapped: madvise says ENOMEM
    _whole.read_ahead([(address, 4 << 20, None)])
    for t in _read_ahead_threads():
        t.join(10)
    assert not _read_ahead_threads()
