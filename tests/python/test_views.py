"""Views checked with the real consumers: np.load on the .npy view, ml_dtypes for the F32 view, and
a sharded checkpoint laid out the way huggingface_hub writes one."""
import json
import os

import ml_dtypes
import numpy as np
import safetensors
from safetensors.numpy import save_file

from conftest import mounted

rng = np.random.default_rng(77)


def spec(dtype_name, array):
    return safetensors.TensorSpec(dtype=dtype_name, shape=list(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes)


def special_values(ml_type):
    """Every bit pattern of an 8-bit type, or a spread of 16-bit patterns incl. NaN, inf, -0, subnormals."""
    if np.dtype(ml_type).itemsize == 1:
        return np.arange(256, dtype=np.uint8).view(ml_type)
    bits = np.concatenate([np.arange(0, 65536, 97, dtype=np.uint16),
                           np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x7f80, 0xff80, 0x7fc0, 0x7c00, 0xfc00, 0x7e00, 0x03ff], dtype=np.uint16)])
    return bits.view(ml_type)


def test_f32_view_matches_ml_dtypes_bit_for_bit(tmp_path):
    arrays = {
        "bf16": ("bfloat16", special_values(ml_dtypes.bfloat16)),
        "f16": ("float16", special_values(np.float16)),
        "e4m3": ("float8_e4m3fn", special_values(ml_dtypes.float8_e4m3fn)),
        "e5m2": ("float8_e5m2", special_values(ml_dtypes.float8_e5m2)),
        "e4m3fnuz": ("float8_e4m3fnuz", special_values(ml_dtypes.float8_e4m3fnuz)),
        "e5m2fnuz": ("float8_e5m2fnuz", special_values(ml_dtypes.float8_e5m2fnuz)),
        "f32": ("float32", rng.standard_normal(1000).astype(np.float32)),
    }
    ints = {"i16": rng.integers(-32768, 32767, 999, dtype=np.int16), "i64": np.arange(-5, 2**40, 2**37)}
    path = tmp_path / "views.safetensors"
    specs = {k: spec(d, a) for k, (d, a) in arrays.items()}
    specs.update({k: spec(str(a.dtype), a) for k, a in ints.items()})
    safetensors.serialize_file(specs, str(path))
    with mounted(path, "--as", "f32", "--block-size", "4K", "--cache-size", "16K") as mp:
        meta = json.load(open(os.path.join(mp, "metadata.json")))
        for name, (_, a) in arrays.items():
            served = np.fromfile(os.path.join(mp, name), dtype="<f4")
            want = a.astype(np.float32)
            assert served.view(np.uint32).tolist() == want.view(np.uint32).tolist(), name
            assert os.path.getsize(os.path.join(mp, name)) == 4 * a.size
            assert meta["tensors"][name]["served_dtype"] == "F32"
        # Integer tensors are not converted: raw bytes, own dtype, own size.
        for name, a in ints.items():
            assert open(os.path.join(mp, name), "rb").read() == a.tobytes(), name
            entry = meta["tensors"][name]
            assert (entry["dtype"], entry["served_dtype"]) == (entry["dtype"], entry["dtype"]), name
            assert entry["served_byte_len"] == a.nbytes == os.path.getsize(os.path.join(mp, name)), name


def test_npy_view_loads_with_numpy(tmp_path):
    tensors = {
        "w": rng.standard_normal((17, 33)).astype(np.float32),
        "scalar": np.asarray(np.float64(3.5)),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "mask": rng.integers(0, 2, (5, 5)).astype(bool),
        "c": (rng.standard_normal(6) + 1j).astype(np.complex64),
    }
    path = tmp_path / "n.safetensors"
    save_file(tensors, str(path))
    with mounted(path, "--npy") as mp:
        for name, a in tensors.items():
            p = os.path.join(mp, name + ".npy")
            loaded = np.load(p)
            assert loaded.dtype == a.dtype and loaded.shape == a.shape and np.array_equal(loaded, a), name
            mapped = np.load(p, mmap_mode="r")
            assert np.array_equal(np.asarray(mapped), a), name
            del mapped
            # fromfile-style tools skip the header (its length is stored at bytes 8-9).
            raw = open(p, "rb").read()
            hlen = 10 + int.from_bytes(raw[8:10], "little")
            assert hlen % 64 == 0 and raw[hlen:] == a.tobytes()


def test_bf16_npy_view_is_u2_for_ml_dtypes(tmp_path):
    x = rng.standard_normal((8, 3)).astype(ml_dtypes.bfloat16)
    path = tmp_path / "b.safetensors"
    safetensors.serialize_file({"x": spec("bfloat16", x)}, str(path))
    with mounted(path, "--npy") as mp:
        loaded = np.load(os.path.join(mp, "x.npy"))
        assert loaded.dtype == np.dtype("<u2")
        assert np.array_equal(loaded.view(ml_dtypes.bfloat16), x)


def test_npy_view_under_as_f32_is_the_conversion(tmp_path):
    """With --npy and --as f32 together, NAME.npy loads as what NAME serves: float32 values, bit for
    bit ml_dtypes' conversion, for every float dtype, and the raw bytes for integers."""
    floats = {
        "bf16": ("bfloat16", rng.standard_normal((8, 3)).astype(ml_dtypes.bfloat16)),
        "f16": ("float16", special_values(np.float16)),
        "e4m3": ("float8_e4m3fn", special_values(ml_dtypes.float8_e4m3fn).reshape(16, 16)),
        "f64": ("float64", rng.standard_normal((3, 5, 7))),
        "empty": ("bfloat16", np.zeros((0, 4), dtype=ml_dtypes.bfloat16)),
    }
    ints = {"i16": rng.integers(-32768, 32767, (9, 11), dtype=np.int16)}
    path = tmp_path / "nf.safetensors"
    specs = {k: spec(d, a) for k, (d, a) in floats.items()}
    specs.update({k: spec(str(a.dtype), a) for k, a in ints.items()})
    safetensors.serialize_file(specs, str(path))
    with mounted(path, "--npy", "--as", "f32", "--block-size", "4K", "--cache-size", "16K") as mp:
        for name, (_, a) in floats.items():
            p = os.path.join(mp, name + ".npy")
            want = a.astype(np.float32)
            for loaded in (np.load(p), np.asarray(np.load(p, mmap_mode="r"))):
                assert loaded.dtype == np.dtype("<f4") and loaded.shape == a.shape, name
                assert loaded.view(np.uint32).tolist() == want.view(np.uint32).tolist(), name
            raw = open(p, "rb").read()
            hlen = 10 + int.from_bytes(raw[8:10], "little")
            assert raw[hlen:] == open(os.path.join(mp, name), "rb").read(), name
        for name, a in ints.items():
            loaded = np.load(os.path.join(mp, name + ".npy"))
            assert loaded.dtype == a.dtype and np.array_equal(loaded, a), name


def test_hub_style_shards_mount_as_one(tmp_path):
    """Shards and index named and laid out as huggingface_hub's save_torch_state_dict writes them."""
    weight_map, shards = {}, {}
    for i in range(3):
        shard = {f"model.layers.{i}.{k}": rng.standard_normal((64, 16)).astype(np.float32) for k in ("q", "k", "v")}
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file(shard, str(tmp_path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        shards.update(shard)
    index = {"metadata": {"total_size": sum(a.nbytes for a in shards.values())}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    with mounted(tmp_path / "model.safetensors.index.json", "--layout", "tree") as mp:
        meta = json.load(open(os.path.join(mp, "metadata.json")))
        assert len(meta["shards"]) == 3
        for name, a in shards.items():
            path = os.path.join(mp, *name.split("."))
            assert np.array_equal(np.fromfile(path, dtype="<f4").reshape(a.shape), a), name
            assert meta["files"][meta["tensors"][name]["path"]] == name
