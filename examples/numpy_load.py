#!/usr/bin/env python3
"""Loading tensors from an stfs mount with NumPy, and checking three ways of reading agree.

    usage: examples/numpy_load.py MOUNTPOINT [TENSOR...]

- stfs.load: every tensor as a read-only np.memmap, dtype and shape from the mount's metadata.json
  (BF16 and F8 through `ml_dtypes`); pages are read on first touch, through the mount's block cache;
- np.fromfile: the raw file read into memory, with the dtype stfs.load chose;
- np.load of NAME.npy: the `--npy` view, a NumPy header then the same bytes (mount with --npy).

Prints one line per tensor: name, dtype, shape, the ways that agreed, sum.
"""
import json
import os
import sys

import numpy as np

try:
    import stfs
except ImportError:  # run from a checkout without `pip install .`: the package's source beside us
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import stfs


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mp = sys.argv[1]
    with open(os.path.join(mp, "metadata.json")) as f:
        meta = json.load(f)
    wanted = sys.argv[2:] or sorted(meta["tensors"])
    for name in wanted:
        if name not in meta["tensors"]:
            print(f"{name}: no such tensor in {mp}", file=sys.stderr)
            return 1
    tensors = stfs.load(mp)  # name -> np.memmap; nothing is read until it is touched
    for name in wanted:
        info = meta["tensors"][name]
        mapped = tensors[name]
        path = os.path.join(mp, info["path"])
        loaded = np.fromfile(path, dtype=mapped.dtype).reshape(mapped.shape)
        ways = ["memmap", "fromfile"]
        assert np.array_equal(loaded, mapped, equal_nan=True), f"{name}: fromfile differs from stfs.load"
        if "npy_path" in info:
            from_npy = np.load(os.path.join(mp, info["npy_path"]), mmap_mode="r")
            if from_npy.dtype != mapped.dtype and from_npy.dtype.itemsize == mapped.dtype.itemsize:
                # BF16 and F8 are stored as unsigned integers of their width (NumPy has no such
                # types); a view gives the real type back without a copy (see docs/npy.md).
                from_npy = from_npy.view(mapped.dtype)
            assert from_npy.dtype == mapped.dtype and from_npy.shape == mapped.shape, f"{name}: .npy header says {from_npy.dtype} {from_npy.shape}"
            assert np.array_equal(loaded, from_npy, equal_nan=True), f"{name}: np.load of .npy differs"
            ways.append("np.load(.npy)")
        total = float(mapped.astype(np.float64).sum())
        print(f"ok {name} {info['dtype']} {list(mapped.shape)} {'+'.join(ways)} sum={total!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
