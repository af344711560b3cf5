"""Cross-check: files written by the official `safetensors` package, mounted by stfs, compared byte for
byte with what the reference library reads, and loaded the ways users load them (np.fromfile, memmap)."""
import json
import os
import random

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors.numpy import save_file
from safetensors import safe_open

from conftest import mounted

rng = np.random.default_rng(1234)

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32",
                "complex64", "float64", "int64", "uint64"]


def random_array(dtype, shape):
    return np.ascontiguousarray(np.asarray(_random(dtype, shape)))


def _random(dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def served_name(name):
    # The escaping rules of docs/usage.md, for the names used here (no reserved names).
    return name.replace("%", "%25").replace("/", "%2F")


@pytest.fixture(scope="module")
def numpy_checkpoint(tmp_path_factory):
    """Every dtype numpy can write, with awkward shapes and names, via safetensors.numpy.save_file."""
    tensors = {}
    shapes = [(), (0,), (1,), (3, 5), (257, 129), (2, 3, 4, 5)]
    for i, dt in enumerate(NUMPY_DTYPES):
        for j, shape in enumerate(shapes):
            tensors[f"layer.{i}.{dt}.{j}"] = random_array(dt, shape)
    tensors["big.weight"] = random_array("float32", (1024, 1031))  # several MiB, crosses blocks
    tensors["odd/name with spaces%"] = random_array("int16", (77,))
    path = tmp_path_factory.mktemp("ref") / "numpy.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "written by safetensors.numpy"})
    return path


@pytest.fixture(scope="module")
def raw_checkpoint(tmp_path_factory):
    """Types numpy lacks (BF16, the F8 family, packed F4), via the reference package's TensorSpec
    serializer. (It cannot write F6; the project's own writer covers F6 in the Rust tests.)"""
    x = rng.standard_normal((33, 65)).astype(np.float32)
    arrays = {
        "bf16": ("bfloat16", [33, 65], x.astype(ml_dtypes.bfloat16)),
        "f8_e4m3": ("float8_e4m3fn", [33, 65], x.astype(ml_dtypes.float8_e4m3fn)),
        "f8_e5m2": ("float8_e5m2", [33, 65], x.astype(ml_dtypes.float8_e5m2)),
        "f8_e4m3fnuz": ("float8_e4m3fnuz", [33, 65], x.astype(ml_dtypes.float8_e4m3fnuz)),
        "f8_e5m2fnuz": ("float8_e5m2fnuz", [33, 65], x.astype(ml_dtypes.float8_e5m2fnuz)),
        "f8_e8m0": ("float8_e8m0fnu", [97], rng.integers(0, 255, 97, dtype=np.uint8)),
        # Two F4 values per byte: 48 storage bytes are 96 logical elements.
        "f4": ("float4_e2m1fn_x2", [48], rng.integers(0, 256, 48, dtype=np.uint8)),
    }
    specs = {name: safetensors.TensorSpec(dtype=d, shape=shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, (d, shape, a) in arrays.items()}
    path = tmp_path_factory.mktemp("raw") / "raw.safetensors"
    safetensors.serialize_file(specs, str(path), metadata={"format": "raw"})
    del arrays  # the specs were consumed; the buffers could go now
    return path


def reference_bytes(path):
    """name -> (dtype, shape, bytes) as the reference library deserializes the file."""
    with open(path, "rb") as f:
        return {name: (v["dtype"], list(v["shape"]), bytes(v["data"])) for name, v in safetensors.deserialize(f.read())}


def test_numpy_checkpoint_matches_reference(numpy_checkpoint):
    ref = reference_bytes(numpy_checkpoint)
    with mounted(numpy_checkpoint) as mp:
        with safe_open(str(numpy_checkpoint), framework="numpy") as f:
            for name in f.keys():
                served = open(os.path.join(mp, served_name(name)), "rb").read()
                assert served == ref[name][2], name
                assert served == f.get_tensor(name).tobytes(), name
        meta = json.load(open(os.path.join(mp, "metadata.json")))
        assert meta["metadata"] == {"format": "np", "note": "written by safetensors.numpy"}
        for name, (dtype, shape, data) in ref.items():
            assert meta["tensors"][name]["dtype"] == dtype
            assert meta["tensors"][name]["shape"] == shape
            assert meta["tensors"][name]["byte_len"] == len(data)


def test_raw_dtypes_match_reference(raw_checkpoint):
    ref = reference_bytes(raw_checkpoint)
    with mounted(raw_checkpoint, "--block-size", "4K", "--cache-size", "16K") as mp:
        meta = json.load(open(os.path.join(mp, "metadata.json")))
        assert meta["tensors"]["f4"]["dtype"] == "F4" and meta["tensors"]["f4"]["shape"] == [96]
        assert meta["tensors"]["f8_e8m0"]["dtype"] == "F8_E8M0"
        for name, (dtype, shape, data) in ref.items():
            assert open(os.path.join(mp, name), "rb").read() == data, name
        bf16 = np.fromfile(os.path.join(mp, "bf16"), dtype=ml_dtypes.bfloat16).reshape(33, 65)
        assert bf16.tobytes() == ref["bf16"][2]


def test_numpy_fromfile_and_memmap(numpy_checkpoint):
    with mounted(numpy_checkpoint, "--block-size", "64K", "--cache-size", "512K") as mp:
        with safe_open(str(numpy_checkpoint), framework="numpy") as f:
            expected = f.get_tensor("big.weight")
        path = os.path.join(mp, "big.weight")
        a = np.fromfile(path, dtype="<f4").reshape(1024, 1031)
        assert np.array_equal(a, expected)
        m = np.memmap(path, dtype="<f4", mode="r", shape=(1024, 1031))
        rows = list(range(1024))
        random.Random(7).shuffle(rows)
        for r in rows[:200]:  # scattered page faults
            assert np.array_equal(m[r], expected[r])
        assert np.array_equal(np.asarray(m), expected)
        del m


def test_offset_reads_match_reference(numpy_checkpoint):
    ref = reference_bytes(numpy_checkpoint)
    data = ref["big.weight"][2]
    r = random.Random(99)
    with mounted(numpy_checkpoint, "--block-size", "16K", "--cache-size", "64K") as mp:
        fd = os.open(os.path.join(mp, "big.weight"), os.O_RDONLY)
        try:
            for _ in range(300):
                off = r.randrange(0, len(data) + 100)
                size = r.choice([1, 7, 4096, 5000, 65536, 200000])
                assert os.pread(fd, size, off) == data[off:off + size], (off, size)
        finally:
            os.close(fd)
