#!/usr/bin/env python3
"""Writes tests/corpus/bad/: malformed safetensors files that each break exactly one rule.

Deterministic, standard library only. Run from anywhere: `python3 tests/corpus/make_corpus.py`.
Also writes expected.json (file name -> lowercase substring the error message must contain) and
README.md (file name -> the rule it breaks), both from the CASES table below so they cannot drift.
"""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
BAD = os.path.join(HERE, "bad")


def prefix(n):
    """The 8-byte little-endian header length."""
    return struct.pack("<Q", n)


def st(header, data=b""):
    """A file: correct length prefix, `header` (str or bytes) verbatim, then `data`."""
    if isinstance(header, str):
        header = header.encode("utf-8")
    return prefix(len(header)) + header + data


def ent(dtype, shape, begin, end, extra=""):
    """One tensor entry as compact JSON text (numbers written verbatim, so hostile ones fit)."""
    shape_text = ",".join(str(d) for d in shape)
    return '{%s"dtype":"%s","shape":[%s],"data_offsets":[%s,%s]}' % (
        extra, dtype, shape_text, begin, end)


def obj(*pairs):
    """A JSON object from (key, raw JSON value text) pairs, keeping order and duplicates."""
    return "{" + ",".join('"%s":%s' % (k, v) for k, v in pairs) + "}"


W = ent("F32", [2], 0, 8)
VALID = st(obj(("w", W)), bytes(range(8)))
NESTED = "[" * 10000 + "]" * 10000
LONG_NAME = "n" * 1000

# (file stem, bytes, rule broken, expected lowercase substring of the error message)
CASES = [
    # --- the 8-byte length prefix ---
    ("empty", b"", "file shorter than the 8-byte length prefix (0 bytes)", "too small"),
    ("seven_bytes", b"\x02\0\0\0\0\0\0", "file shorter than the 8-byte length prefix (7 bytes)",
     "too small"),
    ("truncated_in_length_prefix", VALID[:5], "valid file cut inside the 8-byte length prefix",
     "too small"),
    ("header_len_u64_max", b"\xff" * 8 + b"{}", "header length u64::MAX, over the 100 MB limit",
     "over the limit of 100000000 bytes"),
    ("header_len_just_over_limit", prefix(100_000_001) + b"{}",
     "header length 100,000,001 (limit + 1) with a short file: the limit is checked first",
     "header length 100000001 is over the limit"),
    ("header_len_past_end", prefix(1000) + b"{}", "header length 1000 but only 2 header bytes",
     "runs past the end of the file"),
    ("truncated_in_header", VALID[:20], "valid file cut inside the JSON header",
     "runs past the end of the file"),
    ("header_len_zero", prefix(0), "header length 0: empty JSON", "while parsing a value"),
    # --- encoding ---
    ("invalid_utf8", st(b'{"w\xff":' + W.encode() + b"}", bytes(8)),
     "byte 0xff in a tensor name: header is not UTF-8", "invalid utf-8 sequence"),
    ("truncated_utf8", st(b'{"w":' + W.encode() + b"}\xe2\x82", bytes(8)),
     "header ends inside a multi-byte UTF-8 character", "incomplete utf-8 byte sequence"),
    ("utf8_bom", st(b"\xef\xbb\xbf" + obj(("w", W)).encode(), bytes(8)),
     "UTF-8 byte order mark before the JSON (not JSON whitespace)", "expected value"),
    ("nul_padding", st(obj(("w", W)) + "\0" * 6, bytes(8)),
     "header padded with NUL instead of spaces", "trailing characters"),
    # --- JSON syntax ---
    ("not_json", st("hello", b""), "header is not JSON", "expected value"),
    ("truncated_json", st('{"w":{"dtype":"F32"', b""), "JSON object never closed",
     "while parsing an object"),
    ("trailing_comma", st(obj(("w", W))[:-1] + ",}", bytes(8)), "trailing comma in the object",
     "trailing comma"),
    ("single_quoted_key", st("{'w':" + W + "}", bytes(8)), "key in single quotes",
     "key must be a string"),
    ("two_objects", st(obj(("w", W)) + "{}", bytes(8)), "a second JSON value after the object",
     "trailing characters"),
    ("deeply_nested_json", st(obj(("w", ent("F32", [2], 0, 8, '"x":%s,' % NESTED))), bytes(8)),
     "10,000 nested arrays in an unknown field of a tensor entry", "recursion limit exceeded"),
    ("deeply_nested_tensor_value", st(obj(("w", NESTED)), b""),
     "10,000 nested arrays as a tensor entry", "recursion limit exceeded"),
    # --- top-level shape ---
    ("top_level_array", st("[]", b""), "top-level JSON array", "invalid type: sequence"),
    ("top_level_string", st('"abc"', b""), "top-level JSON string", 'invalid type: string "abc"'),
    ("top_level_null", st("null", b""), "top-level JSON null", "invalid type: null"),
    # --- __metadata__ ---
    ("metadata_non_string_value", st(obj(("__metadata__", '{"x":1}')), b""),
     "__metadata__ value is a number, not a string",
     "invalid type: integer `1`, expected a string"),
    ("metadata_nested_object", st(obj(("__metadata__", '{"x":{"y":"z"}}')), b""),
     "__metadata__ value is an object", "invalid type: map, expected a string"),
    ("metadata_as_array", st(obj(("__metadata__", '["x"]')), b""), "__metadata__ is an array",
     "invalid type: sequence, expected a map"),
    ("metadata_as_string", st(obj(("__metadata__", '"x"')), b""), "__metadata__ is a string",
     'invalid type: string "x", expected a map'),
    ("metadata_duplicate", st(obj(("__metadata__", "{}"), ("__metadata__", "{}")), b""),
     "__metadata__ key given twice", "duplicate field `__metadata__`"),
    ("tensor_named_metadata", st(obj(("__metadata__", W)), bytes(8)),
     "a tensor entry under the reserved key __metadata__",
     "invalid type: sequence, expected a string"),
    # --- tensor entry fields ---
    ("tensor_entry_string", st(obj(("w", '"x"')), b""), "tensor entry is a string, not an object",
     'invalid type: string "x"'),
    ("missing_dtype", st(obj(("w", '{"shape":[2],"data_offsets":[0,8]}')), bytes(8)),
     "tensor entry without dtype", "missing field `dtype`"),
    ("missing_shape", st(obj(("w", '{"dtype":"F32","data_offsets":[0,8]}')), bytes(8)),
     "tensor entry without shape", "missing field `shape`"),
    ("missing_data_offsets", st(obj(("w", '{"dtype":"F32","shape":[2]}')), bytes(8)),
     "tensor entry without data_offsets", "missing field `data_offsets`"),
    ("unknown_dtype", st(obj(("w", ent("F128", [1], 0, 16))), bytes(16)),
     "dtype F128 does not exist", "unknown variant"),
    ("lowercase_dtype", st(obj(("w", ent("f32", [2], 0, 8))), bytes(8)),
     "dtype names are case-sensitive", "unknown variant `f32`"),
    ("dtype_not_string", st(obj(("w", '{"dtype":5,"shape":[2],"data_offsets":[0,8]}')), bytes(8)),
     "dtype is a number", "invalid type: integer `5`"),
    ("dtype_with_terminal_escape", st(obj(("w", ent("\\u001b[31m", [2], 0, 8))), bytes(8)),
     "dtype holding an ANSI escape; the message must show it escaped",
     "unknown variant `\\u{1b}[31m`"),
    ("shape_not_array", st(obj(("w", '{"dtype":"F32","shape":2,"data_offsets":[0,8]}')), bytes(8)),
     "shape is a number", "invalid type: integer `2`, expected a sequence"),
    ("negative_dim", st(obj(("w", ent("F32", [-2], 0, 8))), bytes(8)), "negative dimension",
     "invalid value: integer `-2`, expected u64"),
    ("fractional_dim", st(obj(("w", ent("F32", [1.5], 0, 8))), bytes(8)), "fractional dimension",
     "invalid type: floating point `1.5`, expected u64"),
    ("dim_past_u64", st(obj(("w", ent("U8", [2**64], 0, 8))), bytes(8)),
     "dimension 2^64, past u64 (serde_json reads it as a float)",
     "floating point `1.8446744073709552e+19`"),
    ("huge_number", st(obj(("w", ent("F32", ["1e400"], 0, 8))), bytes(8)),
     "dimension 1e400, out of range even for f64", "number out of range"),
    ("huge_integer_literal", st(obj(("w", ent("F32", [2], 0, "9" * 400))), bytes(8)),
     "a 400-digit end offset", "number out of range"),
    ("negative_offset", st(obj(("w", ent("F32", [2], -8, 0))), bytes(8)), "negative begin offset",
     "invalid value: integer `-8`, expected u64"),
    ("data_offsets_three_elements",
     st(obj(("w", '{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}')), bytes(8)),
     "data_offsets with 3 elements", "invalid length 3"),
    ("data_offsets_one_element",
     st(obj(("w", '{"dtype":"F32","shape":[2],"data_offsets":[8]}')), bytes(8)),
     "data_offsets with 1 element", "invalid length 1"),
    # --- sizes ---
    ("shape_product_overflow", st(obj(("w", ent("U8", [2**32, 2**32, 2**32], 0, 8))), bytes(8)),
     "element count 2^96 overflows u64", "overflows 64 bits"),
    ("shape_bits_overflow", st(obj(("w", ent("F64", [2**61], 0, 8))), bytes(8)),
     "element count fits but 64 * 2^61 bits overflows u64", "overflows 64 bits"),
    ("misaligned_f4", st(obj(("w", ent("F4", [3], 0, 2))), bytes(2)),
     "3 F4 elements = 12 bits, not whole bytes", "holds 12 bits, not a whole number of bytes"),
    ("misaligned_f6", st(obj(("w", ent("F6_E3M2", [3], 0, 3))), bytes(3)),
     "3 F6 elements = 18 bits, not whole bytes", "holds 18 bits, not a whole number of bytes"),
    ("length_mismatch_short", st(obj(("w", ent("F32", [2, 2], 0, 12))), bytes(12)),
     "F32 [2,2] needs 16 bytes, offsets cover 12", "covers 12 bytes, expected 16"),
    ("length_mismatch_long", st(obj(("w", ent("F32", [2], 0, 12))), bytes(12)),
     "F32 [2] needs 8 bytes, offsets cover 12", "covers 12 bytes, expected 8"),
    ("scalar_wrong_length", st(obj(("s", ent("F64", [], 0, 4))), bytes(4)),
     "scalar F64 needs 8 bytes, offsets cover 4", "covers 4 bytes, expected 8"),
    # --- offsets ---
    ("offset_gap_at_start", st(obj(("w", ent("F32", [2], 4, 12))), bytes(12)),
     "first tensor starts at 4, leaving a 4-byte hole", "starts at 4, expected 0"),
    ("offset_hole_between",
     st(obj(("a", ent("U8", [4], 0, 4)), ("b", ent("U8", [4], 6, 10))), bytes(10)),
     "2 unindexed bytes between two tensors", "a hole of 2 bytes"),
    ("offset_overlap",
     st(obj(("a", ent("F32", [2], 0, 8)), ("b", ent("F32", [1], 4, 8))), bytes(8)),
     "second tensor starts inside the first", "overlaps the previous tensor"),
    ("offset_reversed", st(obj(("a", ent("U8", [4], 0, 4)), ("b", ent("U8", [0], 4, 0))), bytes(4)),
     "end offset before begin offset", "ends at 0, before it begins at 4"),
    ("duplicate_name_different_offsets",
     st(obj(("a", ent("U8", [4], 0, 4)), ("a", ent("U8", [4], 4, 8))), bytes(8)),
     "same name twice with different offsets; the last entry wins, leaving a hole",
     "tensor `a` starts at 4, expected 0"),
    ("name_with_terminal_escape", st(obj(("evil\\u001b[0m", ent("U8", [4], 4, 8))), bytes(8)),
     "hole after a tensor whose name holds an ANSI escape; the message must show it escaped",
     "tensor `evil\\u{1b}[0m` starts at 4"),
    ("long_name", st(obj((LONG_NAME, ent("U8", [4], 4, 8))), bytes(8)),
     "hole after a tensor with a 1000-byte name; the message must cut the name",
     "…[800 more bytes]` starts at 4"),
    # --- data section vs file length ---
    ("truncated_in_data", VALID[:-3], "valid file missing its last 3 data bytes", "truncated"),
    ("data_offsets_past_end", st(obj(("w", ent("U8", [100], 0, 100))), bytes(8)),
     "tensor ends at 100 but only 8 data bytes exist", "truncated"),
    ("trailing_bytes", VALID + b"PK\x03\x04\x00", "5 unindexed bytes after the data (polyglot)",
     "5 trailing bytes"),
    ("empty_header_with_data", st("{}", bytes(4)), "no tensors, yet 4 data bytes",
     "4 trailing bytes"),
]


def main():
    os.makedirs(BAD, exist_ok=True)
    for name in os.listdir(BAD):
        if name.endswith(".safetensors"):
            os.remove(os.path.join(BAD, name))
    expected = {}
    for stem, data, rule, needle in CASES:
        file_name = stem + ".safetensors"
        assert file_name not in expected, file_name
        assert needle == needle.lower(), needle
        with open(os.path.join(BAD, file_name), "wb") as f:
            f.write(data)
        expected[file_name] = needle
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")
    write_readme()
    print("wrote %d files to %s" % (len(CASES), BAD))


def write_readme():
    lines = [
        "# Hostile-input corpus",
        "",
        "Each file in `bad/` breaks exactly one rule of the safetensors format as the reference",
        "crate (safetensors 0.8 `read_metadata`) enforces it; stfs must refuse every one of them",
        "with a non-zero exit and an error naming the problem. The files are generated by",
        "`make_corpus.py` (python3, standard library only, deterministic) and committed; rerun it",
        "after changing the table there, which also rewrites this README and `expected.json`.",
        "",
        "`expected.json` maps each file name to a lowercase substring that the error message must",
        "contain verbatim (case-sensitive). `tests/corpus_parse.rs` checks them against",
        "`stfs::format::read_header`; the CLI tests run `stfs inspect` and `stfs mount` on them.",
        "",
        "Not files, so not committed; the CLI integration tests create them at test time:",
        "a directory, a FIFO, an unreadable file (mode 000, when not running as root), and a",
        "path that does not exist.",
        "",
        "| file | rule broken | message contains |",
        "|---|---|---|",
    ]
    for stem, _, rule, needle in CASES:
        # A double-backtick code span can hold the single backticks that serde messages use.
        shown = needle.replace("|", "\\|")
        lines.append("| `%s.safetensors` | %s | `` %s `` |" % (stem, rule.replace("|", "\\|"), shown))
    with open(os.path.join(HERE, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
