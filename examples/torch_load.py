#!/usr/bin/env python3
"""Loading tensors from an stfs mount with PyTorch, placed on an explicit device.

    usage: examples/torch_load.py MOUNTPOINT [--device auto|cpu|cuda|cuda:N|mps] [TENSOR...]

`stfs.load(MOUNTPOINT, framework="torch", device=D)` takes dtype and shape from the mount's
metadata.json, creates every tensor explicitly where it goes (on the CPU a private mapping of its file;
for CUDA allocated on the device and filled through a small ring of pinned buffers) and places it only
on the device asked for (`auto`: CUDA if available, else MPS if available, else the CPU). The script checks each tensor landed there and holds
exactly its file's bytes. Code that relies on an implicit default device (`torch.set_default_device`, a
device picked up from the environment) ends up with tensors in the wrong place, silently; this does not.

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

try:
    import stfs
except ImportError:  # run from a checkout without `pip install .`: the package's source beside us
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import stfs


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
    for name in rest:
        if name not in meta["tensors"]:
            print(f"{name}: no such tensor in {mp}", file=sys.stderr)
            return 1
    tensors = stfs.load(mp, framework="torch", device=device)
    for name in rest or sorted(meta["tensors"]):
        info = meta["tensors"][name]
        placed = tensors[name]
        same_place = placed.device.type == device.type and (device.index is None or placed.device.index == device.index)
        assert same_place, f"{name}: asked for {device}, landed on {placed.device}"
        on_cpu = placed.to("cpu")
        with open(os.path.join(mp, info["path"]), "rb") as f:
            raw = f.read()
        assert on_cpu.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() == raw, f"{name}: changed on the way to {device}"
        total = float(on_cpu.to(torch.float64).sum())
        print(f"ok {name} {info['dtype']} {list(placed.shape)} device={placed.device} sum={total!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
