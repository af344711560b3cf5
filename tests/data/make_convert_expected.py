#!/usr/bin/env python3
"""Writes the frozen expectations for src/convert.rs: what numpy/ml_dtypes `astype(np.float32)` gives.

Run from the repository root (checked with numpy 2.4.6, ml_dtypes 0.6.0):
    python3 tests/data/make_convert_expected.py

For each dtype NAME, tests/data/convert_expected/ gets:
  NAME.f32  the expected float32 results as little-endian u32 bit patterns, one per element;
  NAME.src  the source elements (little-endian), only for dtypes that are not tested exhaustively.
Exhaustive dtypes (every 8-bit float type, BOOL, U8, I8, F16, BF16) have no .src file: the source is
every bit pattern in increasing order (0, 1, ..., 2^bits - 1). F4 is packed two elements per byte:
its .f32 holds the 512 results of the 256 bytes 0..=255, low nibble first.
"""
import os

import ml_dtypes
import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert_expected")
rng = np.random.default_rng(20240615)


def write(name, f32, src=None):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name + ".f32"), "wb") as f:
        f.write(np.asarray(f32, dtype=np.float32).view("<u4").tobytes())
    if src is not None:
        with open(os.path.join(OUT, name + ".src"), "wb") as f:
            f.write(np.asarray(src).astype(np.asarray(src).dtype.newbyteorder("<")).tobytes())


def exhaustive(name, dtype, bits):
    raw = np.arange(1 << bits, dtype=np.uint32).astype(np.uint8 if bits == 8 else "<u2")
    write(name, raw.view(dtype).astype(np.float32))


with np.errstate(all="ignore"):
    for name, dtype in [
        ("F8_E4M3", ml_dtypes.float8_e4m3fn),
        ("F8_E5M2", ml_dtypes.float8_e5m2),
        ("F8_E4M3FNUZ", ml_dtypes.float8_e4m3fnuz),
        ("F8_E5M2FNUZ", ml_dtypes.float8_e5m2fnuz),
        ("F8_E8M0", ml_dtypes.float8_e8m0fnu),
        ("U8", np.uint8),
        ("I8", np.int8),
        ("BOOL", np.bool_),  # numpy reads any nonzero byte as True
    ]:
        exhaustive(name, dtype, 8)
    exhaustive("F16", np.float16, 16)
    exhaustive("BF16", ml_dtypes.bfloat16, 16)

    # F4: ml_dtypes stores float4_e2m1fn unpacked (one per byte); unpack the torch packing by hand.
    nibble_value = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    packed = np.arange(256, dtype=np.uint32)
    write("F4", np.stack([nibble_value[packed & 0xF], nibble_value[packed >> 4]], axis=1).reshape(-1))

    def int_cases(dtype, n=4096):
        info = np.iinfo(dtype)
        edges = [info.min, info.max, 0, 1, -1 if info.min < 0 else 2]
        # Around every power of two the float32 rounding changes step: probe p-2..p+2 and midpoints.
        for k in range(1, info.bits):
            p = 1 << k
            for delta in (-2, -1, 0, 1, 2, (p >> 24) // 2 if k > 24 else 0, (p >> 24) if k > 24 else 0):
                for sign in (1, -1):
                    v = sign * p + delta
                    if info.min <= v <= info.max:
                        edges.append(v)
        rand = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
        # Random values with the low 40 bits varied above 2^24 hit ties and near-ties.
        return np.concatenate([np.array(edges, dtype=dtype), rand])

    for name, dtype in [("I16", np.int16), ("U16", np.uint16), ("I32", np.int32), ("U32", np.uint32),
                        ("I64", np.int64), ("U64", np.uint64)]:
        src = int_cases(dtype)
        write(name, src.astype(np.float32), src)

    # F64: specials, NaN payloads, f32 boundaries (overflow, subnormal, underflow), exact ties, random.
    special = np.array([
        0, 1 << 63, 0x7FF0000000000000, 0xFFF0000000000000,  # +-0, +-inf
        0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFF0000000000001,
        0x7FF4000000000000, 0x7FFFFFFFFFFFFFFF, 0x7FF8000020000000, 0x7FF80000E0000000,
        0x7FF0000020000000, 0xFFF7FFFFFFFFFFFF, 0x0000000000000001, 0x000FFFFFFFFFFFFF,
    ], dtype=np.uint64)
    f32_edges = np.array([3.4028234663852886e38, 3.4028235677973366e38, 3.4028235677973362e38,
                          1.401298464324817e-45, 7.006492321624085e-46, 7.006492321624087e-46,
                          1.1754942106924411e-38, 1.1754943508222875e-38, 1e-50, 1e50],
                         dtype=np.float64)
    f32_edges = np.concatenate([f32_edges, -f32_edges]).view(np.uint64)
    # Exact ties and near-ties: a random float32 plus half its ulp, plus or minus one f64 ulp.
    base = rng.integers(0, 0x7F800000, size=2048, dtype=np.uint32).view(np.float32).astype(np.float64)
    half_ulp = (np.nextafter(base.astype(np.float32), np.float32(np.inf)).astype(np.float64) - base) / 2
    ties = (base + half_ulp).view(np.uint64)
    near = np.concatenate([ties - 1, ties + 1])
    # Random exponents around the float32 range, random mantissas and signs (includes f32 subnormals).
    exps = rng.integers(1023 - 160, 1023 + 140, size=8192, dtype=np.uint64)
    mants = rng.integers(0, 1 << 52, size=8192, dtype=np.uint64)
    signs = rng.integers(0, 2, size=8192, dtype=np.uint64)
    rand = (signs << np.uint64(63)) | (exps << np.uint64(52)) | mants
    nan_payloads = (np.uint64(0x7FF0000000000000) | rng.integers(1, 1 << 52, size=512, dtype=np.uint64))
    src = np.concatenate([special, f32_edges, ties, near, rand, nan_payloads, nan_payloads | (np.uint64(1) << np.uint64(63))])
    write("F64", src.view(np.float64).astype(np.float32), src.view(np.float64))
