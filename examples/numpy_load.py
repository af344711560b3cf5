#!/usr/bin/env python3
"""Loading tensors from an stfs mount with NumPy, three ways, and checking they agree.

    usage: examples/numpy_load.py MOUNTPOINT [TENSOR...]

- np.fromfile: reads the raw file into memory (dtype and shape from metadata.json);
- np.memmap: maps the file; pages are read on first touch, through the mount's block cache;
- np.load of NAME.npy: the `--npy` view, a NumPy header then the same bytes (mount with --npy).

BF16 and F8 tensors need the `ml_dtypes` package (NumPy has no such dtypes); without it they are
skipped with a message. Prints one line per tensor: name, dtype, shape, the ways that agreed, sum.
"""
import json
import os
import sys

import numpy as np

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

NUMPY_DTYPES = {
    "BOOL": "bool", "U8": "<u1", "I8": "<i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
    "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8",
}
EXTENSION_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def numpy_dtype(name):
    if name in NUMPY_DTYPES:
        return np.dtype(NUMPY_DTYPES[name])
    if name in EXTENSION_DTYPES and ml_dtypes is not None:
        return np.dtype(getattr(ml_dtypes, EXTENSION_DTYPES[name]))
    return None


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mp = sys.argv[1]
    with open(os.path.join(mp, "metadata.json")) as f:
        meta = json.load(f)
    wanted = sys.argv[2:] or sorted(meta["tensors"])
    npy_files = {name: path for path, name in meta["files"].items() if path != meta["tensors"][name]["path"]}
    for name in wanted:
        if name not in meta["tensors"]:
            print(f"{name}: no such tensor in {mp}", file=sys.stderr)
            return 1
        info = meta["tensors"][name]
        dtype = numpy_dtype(info["dtype"])
        if dtype is None:
            print(f"skip {name}: no NumPy dtype for {info['dtype']} (install ml_dtypes)")
            continue
        path = os.path.join(mp, info["path"])
        shape = tuple(info["shape"])
        loaded = np.fromfile(path, dtype=dtype).reshape(shape)
        mapped = np.memmap(path, dtype=dtype, mode="r", shape=shape) if loaded.size else loaded
        ways = ["fromfile", "memmap"]
        assert np.array_equal(loaded, mapped, equal_nan=True), f"{name}: memmap differs from fromfile"
        if name in npy_files:
            from_npy = np.load(os.path.join(mp, npy_files[name]), mmap_mode="r")
            if from_npy.dtype != dtype and from_npy.dtype.itemsize == dtype.itemsize:
                # BF16 and F8 are stored as unsigned integers of their width (NumPy has no such
                # types); a view gives the real type back without a copy (see docs/npy.md).
                from_npy = from_npy.view(dtype)
            assert from_npy.dtype == dtype and from_npy.shape == shape, f"{name}: .npy header says {from_npy.dtype} {from_npy.shape}"
            assert np.array_equal(loaded, from_npy, equal_nan=True), f"{name}: np.load of .npy differs"
            ways.append("np.load(.npy)")
        total = float(loaded.astype(np.float64).sum())
        print(f"ok {name} {info['dtype']} {list(shape)} {'+'.join(ways)} sum={total!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
