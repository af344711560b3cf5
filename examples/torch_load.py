#!/usr/bin/env python3
"""Loading tensors from an stfs mount with PyTorch, placed on an explicit device.

    usage: examples/torch_load.py MOUNTPOINT [--device auto|cpu|cuda|cuda:N|mps] [TENSOR...]

Each tensor file is raw little-endian bytes, so `torch.from_file` reads it directly given the element
count and dtype (both in metadata.json). The device is never left to a default: the tensor is created
with `device="cpu"` (from_file reads into host memory), then moved with `.to(device)` to the device
asked for (`auto`: CUDA if available, else MPS if available, else the CPU), and the script checks it
landed there. Code that relies on an implicit default device (`torch.set_default_device`, a device
picked up from the environment) ends up with tensors in the wrong place, silently.

Prints one line per tensor: name, dtype, shape, the device it is on, and the sum of its values.
Without PyTorch installed it prints a message and exits 0.
"""
import json
import os
import sys

try:
    import torch
except ImportError:
    torch = None

TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


def pick_device(asked):
    """The device asked for; `auto` picks an accelerator when one exists, else the CPU."""
    if asked != "auto":
        return torch.device(asked)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def load(path, dtype, shape):
    """The tensor in `path`, created on the CPU explicitly."""
    count = 1
    for d in shape:
        count *= d
    if count == 0:
        return torch.empty(shape, dtype=dtype, device="cpu")
    # shared=False maps the file MAP_PRIVATE: pages come from the mount when first touched, and a
    # write to the tensor stays private to this process (the file is read-only anyway).
    flat = torch.from_file(path, shared=False, size=count, dtype=dtype, device="cpu")
    return flat.reshape(shape)


def main(argv):
    if torch is None:
        print("skip: PyTorch is not installed (pip install torch); nothing to check")
        return 0
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mp, rest = argv[0], argv[1:]
    asked = "auto"
    if rest[:1] == ["--device"] and len(rest) >= 2:
        asked, rest = rest[1], rest[2:]
    device = pick_device(asked)
    with open(os.path.join(mp, "metadata.json")) as f:
        meta = json.load(f)
    for name in rest or sorted(meta["tensors"]):
        info = meta["tensors"].get(name)
        if info is None:
            print(f"{name}: no such tensor in {mp}", file=sys.stderr)
            return 1
        dtype = getattr(torch, TORCH_DTYPES.get(info["dtype"], ""), None)
        if not isinstance(dtype, torch.dtype):
            print(f"skip {name}: no torch dtype for {info['dtype']} in this PyTorch")
            continue
        on_cpu = load(os.path.join(mp, info["path"]), dtype, info["shape"])
        placed = on_cpu.to(device)
        same_place = placed.device.type == device.type and (device.index is None or placed.device.index == device.index)
        assert same_place, f"{name}: asked for {device}, landed on {placed.device}"
        assert torch.equal(placed.cpu(), on_cpu), f"{name}: changed on the way to {device}"
        total = float(on_cpu.to(torch.float64).sum())
        print(f"ok {name} {info['dtype']} {list(on_cpu.shape)} device={placed.device} sum={total!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
