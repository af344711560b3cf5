#!/usr/bin/env python3
"""Prints the .npy header test vectors frozen in src/npy.rs tests.

Run with numpy installed (checked with numpy 2.4.6):  python3 tests/data/make_npy_expected.py
Small cases are written by a real np.save of a zero array, so they are exactly what np.save writes.
Cases whose data would be too large to allocate go through numpy's own header writer, the function
np.save calls (`_write_array_header` with version=None); the script checks on the small cases that
both paths give the same bytes.
"""
import io

import numpy as np
from numpy.lib import _format_impl as fmt

# (safetensors dtype, descr stfs uses, npy shape)
CASES = [
    ("F32", "<f4", ()),
    ("F32", "<f4", (5,)),
    ("BF16", "<u2", (2, 3)),
    ("U8", "|u1", (2, 3, 4)),
    ("BOOL", "|b1", (0,)),
    ("I64", "<i8", (3, 0, 2)),
    ("F8_E4M3", "|u1", (16, 16)),
    ("F4", "|u1", (12,)),  # logical shape [4, 6]: 24 nibbles = 12 packed bytes
    ("C64", "<c8", (7, 1, 9)),
    ("I8", "|i1", (1,) * 30),
    ("F16", "<f2", (1 << 40,)),
    ("U64", "<u8", (2**64 - 1,)),
    ("C64", "<c8", (7, 1 << 33, 9)),
    ("F64", "<f8", (2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1)),
]


def header_via_numpy_writer(descr, shape):
    buf = io.BytesIO()
    fmt._write_array_header(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def header_via_np_save(descr, shape):
    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype=np.dtype(descr)))
    data_len = int(np.prod(shape)) * np.dtype(descr).itemsize
    raw = buf.getvalue()
    return raw[: len(raw) - data_len]


def rust_bytes(b):
    out = []
    for c in b:
        if c == 0x22 or c == 0x5C:
            out.append("\\" + chr(c))
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append("\\x%02x" % c)
    return 'b"' + "".join(out) + '"'


def rust_shape(shape):
    return "&[" + ", ".join(str(d) for d in shape) + "]"


for name, descr, shape in CASES:
    h = header_via_numpy_writer(descr, shape)
    if np.prod(shape, dtype=object) * np.dtype(descr).itemsize < 1 << 20:
        assert h == header_via_np_save(descr, shape), (name, shape)
    print(f"    ({rust_shape(shape)}, Dtype::{name}, {rust_bytes(h)}),")

# The padlen == 64 corner: numpy pads a full 64 bytes when the header is already aligned.
for n in range(1, 64):
    shape = (1,) * n
    body = fmt._write_array_header  # noqa: F841 (documentation of which function is mirrored)
    h = header_via_numpy_writer("|u1", shape)
    if h.endswith(b" " * 64 + b"\n"):
        print("full-64 padding case: ndim", n, rust_bytes(h))
        break

# Version 1.0 -> 2.0 boundary: largest all-ones shape that still fits a u16 header length.
last_v1 = None
for n in range(21800, 21900):
    h = header_via_numpy_writer("|u1", (1,) * n)
    if h[6] == 2:
        print("first v2 ndim", n, "len", len(h), "prefix", rust_bytes(h[:12]), "tail", rust_bytes(h[-70:]))
        print("last v1 ndim", last_v1[0], "len", len(last_v1[1]), "prefix", rust_bytes(last_v1[1][:10]))
        break
    last_v1 = (n, h)
