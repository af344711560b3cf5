"""The checkpoint re-served in a mount, checked with the real loader: safe_open (numpy) on the mount's
copy of the file gives every tensor equal to safe_open on the source, for a single file and for a
sharded checkpoint (its shards and index json), and the files hash the same."""
import hashlib
import json
import os

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from conftest import mounted

rng = np.random.default_rng(18)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensors(prefix, n):
    out = {}
    for i in range(n):
        dtype = [np.float32, np.float16, np.int64, np.uint8][i % 4]
        shape = (int(rng.integers(1, 300)), int(rng.integers(1, 200)))
        out[f"{prefix}.{i}.weight"] = (rng.standard_normal(shape) * 100).astype(dtype)
    out[f"{prefix}.scalar"] = np.array(3.5, dtype=np.float64)
    out[f"{prefix}.empty"] = np.zeros((0, 4), dtype=np.int32)
    return out


def assert_same_tensors(served, source):
    with safe_open(source, framework="numpy") as want, safe_open(served, framework="numpy") as got:
        assert sorted(got.keys()) == sorted(want.keys())
        assert got.metadata() == want.metadata()
        for name in want.keys():
            a, b = want.get_tensor(name), got.get_tensor(name)
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert np.array_equal(a, b), name


def test_single_file_loads_through_the_mount(tmp_path):
    source = tmp_path / "model.safetensors"
    data = tensors("model", 24)
    data["model.safetensors"] = np.arange(7, dtype=np.int16)  # collides with the file: escaped
    save_file(data, str(source), metadata={"format": "np"})
    with mounted(source) as mp:
        served = os.path.join(mp, "model.safetensors")
        assert sha256(served) == sha256(source)
        assert_same_tensors(served, str(source))
        with open(os.path.join(mp, "metadata.json")) as f:
            meta = json.load(f)
        assert meta["checkpoint_files"] == [{"path": "model.safetensors", "size": os.path.getsize(source), "shard": 0}]
        escaped = meta["tensors"]["model.safetensors"]["path"]
        assert escaped == "%6Dodel.safetensors"
        assert np.array_equal(np.fromfile(os.path.join(mp, escaped), dtype=np.int16), data["model.safetensors"])


def test_sharded_checkpoint_loads_through_the_mount(tmp_path):
    shards = {"model-00001-of-00002.safetensors": tensors("a", 10), "model-00002-of-00002.safetensors": tensors("b", 9)}
    weight_map = {}
    for name, data in shards.items():
        save_file(data, str(tmp_path / name))
        weight_map.update({t: name for t in data})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    for source in (index, tmp_path):
        with mounted(source) as mp:
            for name in [*shards, index.name]:
                assert sha256(os.path.join(mp, name)) == sha256(tmp_path / name), name
            for name in shards:
                assert_same_tensors(os.path.join(mp, name), str(tmp_path / name))
            # A loader that follows the index from the mount finds every tensor.
            with open(os.path.join(mp, index.name)) as f:
                served_map = json.load(f)["weight_map"]
            assert served_map == weight_map


def test_hidden_with_the_option(tmp_path):
    source = tmp_path / "model.safetensors"
    save_file(tensors("m", 2), str(source))
    with mounted(source, "-o", "no_checkpoint_file") as mp:
        assert not os.path.exists(os.path.join(mp, "model.safetensors"))
