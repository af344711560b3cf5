"""Builds benchmark checkpoints: a safetensors file, the same tensors as raw files, and a squashfs image.

Checkpoints are cached in the work directory under a name derived from their parameters, so
repeated runs reuse them; a `done` marker is written last, so a half-built set is rebuilt.
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess

import numpy as np

def file_sha256(path):
    """The sha256 of a file's bytes, read in 8 MiB pieces (a re-served checkpoint against its source)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# numpy dtype for each safetensors dtype the loaders may meet.
NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_,
}


def read_header(path):
    """Returns [(name, dtype, shape, start, end)] sorted by file offset; start/end are absolute."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data_start = 8 + header_len
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors.append((name, info["dtype"], tuple(info["shape"]), data_start + begin, data_start + end))
    tensors.sort(key=lambda t: t[3])
    return tensors


def transformer_layout(size_bytes):
    """Tensor names and shapes of a small decoder-only transformer of roughly `size_bytes` (fp16 weights).

    The hidden size grows with the target so that a layer stays a small fraction of the total,
    which keeps a realistic mix: large embedding/MLP matrices, medium attention ones, tiny norms.
    """
    hidden = 256
    while hidden < 2048 and 12 * (4 * hidden * hidden + 3 * hidden * 4 * hidden) * 2 < size_bytes:
        hidden *= 2
    inter = hidden * 11 // 4
    vocab = 8 * hidden
    per_layer = (4 * hidden * hidden + 3 * hidden * inter) * 2 + 2 * hidden * 4
    fixed = 2 * vocab * hidden * 2 + hidden * 4
    layers = max(1, round((size_bytes - fixed) / per_layer))
    layout = [("model.embed_tokens.weight", np.float16, (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        layout += [
            (p + "input_layernorm.weight", np.float32, (hidden,)),
            (p + "self_attn.q_proj.weight", np.float16, (hidden, hidden)),
            (p + "self_attn.k_proj.weight", np.float16, (hidden, hidden)),
            (p + "self_attn.v_proj.weight", np.float16, (hidden, hidden)),
            (p + "self_attn.o_proj.weight", np.float16, (hidden, hidden)),
            (p + "post_attention_layernorm.weight", np.float32, (hidden,)),
            (p + "mlp.gate_proj.weight", np.float16, (inter, hidden)),
            (p + "mlp.up_proj.weight", np.float16, (inter, hidden)),
            (p + "mlp.down_proj.weight", np.float16, (hidden, inter)),
        ]
    layout += [("model.norm.weight", np.float32, (hidden,)), ("lm_head.weight", np.float16, (vocab, hidden))]
    return layout


def f32_layout(size_bytes, count=64):
    """`count` equal F32 matrices of 4096 columns, about `size_bytes` in all (issue 34's 2 GiB checkpoint:
    64 tensors of 32 MiB)."""
    rows = max(1, size_bytes // count // (4096 * 4))
    return [(f"layer.{i}.weight", np.float32, (rows, 4096)) for i in range(count)]


def many_small_layout(count):
    """`count` small tensors (1 KiB each, float32 16x16), for the mount-scale scenario."""
    return [(f"model.layers.{i // 10}.block.{i % 10}.weight", np.float32, (16, 16)) for i in range(count)]


def _random_array(rng, dtype, shape):
    # Uniform random bits reinterpreted: fast, and incompressible like real weights.
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(rng.bytes(nbytes), dtype=dtype).reshape(shape).copy()


def build(workdir, key, layout, with_squashfs, seed=12345):
    """Creates (or reuses) `workdir/key/` holding model.safetensors, tensors/ and optionally tensors.sqfs.

    Returns a dict with the paths, the header list and the file size.
    """
    from safetensors.numpy import save_file

    root = os.path.join(workdir, key)
    paths = {
        "root": root,
        "checkpoint_dir": os.path.join(root, "ckpt"),
        "checkpoint": os.path.join(root, "ckpt", "model.safetensors"),
        "tensors_dir": os.path.join(root, "tensors"),
        "squashfs": os.path.join(root, "tensors.sqfs") if with_squashfs else None,
    }
    done = os.path.join(root, "done")
    if not os.path.exists(done):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(paths["checkpoint_dir"])
        os.makedirs(paths["tensors_dir"])
        rng = np.random.default_rng(seed)
        save_file({name: _random_array(rng, dtype, shape) for name, dtype, shape in layout}, paths["checkpoint"])
        _split_into_files(paths["checkpoint"], paths["tensors_dir"])
        with open(done, "w") as f:
            f.write("ok\n")
    if with_squashfs and not os.path.exists(paths["squashfs"]):
        # Nothing compressed (data, inodes, ids, xattrs), no fragments: the same bytes as plain files.
        partial = paths["squashfs"] + ".partial"
        subprocess.run(
            ["mksquashfs", paths["tensors_dir"], partial, "-noI", "-noId", "-noD", "-noF",
             "-noX", "-no-fragments", "-no-xattrs", "-quiet", "-noappend"],
            check=True, stdout=subprocess.DEVNULL, timeout=1800)
        os.rename(partial, paths["squashfs"])
    header = read_header(paths["checkpoint"])
    paths["header"] = header
    paths["file_size"] = os.path.getsize(paths["checkpoint"])
    paths["data_bytes"] = sum(end - start for _, _, _, start, end in header)
    return paths


def _split_into_files(checkpoint, tensors_dir):
    """Writes each tensor's byte range as its own file, so the copies are byte-identical by construction."""
    with open(checkpoint, "rb") as src:
        for name, _, _, start, end in read_header(checkpoint):
            src.seek(start)
            with open(os.path.join(tensors_dir, name), "wb") as dst:
                remaining = end - start
                while remaining:
                    chunk = src.read(min(remaining, 16 << 20))
                    dst.write(chunk)
                    remaining -= len(chunk)
