//! The `.npy` view's content logic: the NumPy header stfs synthesizes in front of a tensor's raw bytes.
//!
//! A `.npy` file is a header followed by the array data in C order. safetensors data is always
//! little-endian and C-ordered, so the view is `npy_header(..)` followed by the tensor's bytes,
//! unchanged. The header is byte-for-byte what `np.save` writes for an array of that dtype and shape
//! (numpy 2.x, `numpy/lib/_format_impl.py`): magic `\x93NUMPY`, version 1.0 with a `u16`
//! little-endian header length (2.0 with a `u32` only when the header does not fit in 65535 bytes),
//! then the Python repr of the dict `{'descr': .., 'fortran_order': False, 'shape': (..), }`,
//! numpy's spare "growth" spaces, space padding and a final `\n`, so that the data starts at a
//! multiple of 64 bytes.
//!
//! # dtype table
//!
//! | safetensors | `descr` | `.npy` shape | note |
//! |---|---|---|---|
//! | BOOL | `\|b1` | same | |
//! | U8 / I8 | `\|u1` / `\|i1` | same | |
//! | I16 / U16 / F16 | `<i2` / `<u2` / `<f2` | same | |
//! | BF16 | `<u2` | same | numpy has no bfloat16; the bits load as `uint16`, `.view(ml_dtypes.bfloat16)` restores the type |
//! | I32 / U32 / F32 | `<i4` / `<u4` / `<f4` | same | |
//! | C64 | `<c8` | same | complex64, two f32 parts |
//! | F64 / I64 / U64 | `<f8` / `<i8` / `<u8` | same | |
//! | F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ | `\|u1` | same | raw bits; `.view(ml_dtypes.float8_e5m2)` etc. (ml_dtypes' own descr for float8_e5m2, `<f1`, is one numpy cannot load) |
//! | F4, F6_E2M3, F6_E3M2 | `\|u1` | `(nbytes,)` | sub-byte, packed: the packed bytes as a flat 1-D array |
//!
//! Sub-byte types have no numpy equivalent with the same packing (ml_dtypes' `float4_e2m1fn` takes a
//! whole byte per element), so the view exposes the packed bytes untouched, flattened to one dimension
//! of `element_count * bits / 8` bytes. The logical shape and the true dtype are in the metadata file.
//! `docs/npy.md` holds the same table for users.

use std::fmt;

use crate::format::Dtype;

/// numpy aligns the start of the array data to this many bytes (`ARRAY_ALIGN`).
const ARRAY_ALIGN: usize = 64;
/// numpy leaves room for the first dimension to grow to this many digits (`GROWTH_AXIS_MAX_DIGITS`),
/// so that appending writers can rewrite the header in place; np.save always adds these spaces.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;
/// `\x93NUMPY`.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Why no `.npy` header can be built for a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NpyError {
    /// The packed byte count of a sub-byte tensor does not fit in a `u64`.
    ShapeOverflow,
    /// A sub-byte tensor's bit count is not a whole number of bytes (a valid header never has this).
    PartialByte {
        /// The tensor's total bit count.
        bits: u64,
    },
    /// The header would be longer than format 2.0's `u32` length field allows.
    HeaderTooLarge,
}

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NpyError::ShapeOverflow => f.write_str("packed byte count overflows u64"),
            NpyError::PartialByte { bits } => {
                write!(f, "{bits} bits is not a whole number of bytes")
            }
            NpyError::HeaderTooLarge => f.write_str("npy header longer than 4 GiB"),
        }
    }
}

impl std::error::Error for NpyError {}

/// The numpy `descr` string stfs writes for `dtype` (see the module table).
pub fn descr(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::BOOL => "|b1",
        Dtype::U8 => "|u1",
        Dtype::I8 => "|i1",
        Dtype::I16 => "<i2",
        Dtype::U16 => "<u2",
        Dtype::F16 => "<f2",
        // numpy has no bfloat16: keep the bits as uint16 so every numpy can load the file.
        Dtype::BF16 => "<u2",
        Dtype::I32 => "<i4",
        Dtype::U32 => "<u4",
        Dtype::F32 => "<f4",
        Dtype::C64 => "<c8",
        Dtype::F64 => "<f8",
        Dtype::I64 => "<i8",
        Dtype::U64 => "<u8",
        Dtype::F8_E5M2 | Dtype::F8_E4M3 | Dtype::F8_E8M0 | Dtype::F8_E4M3FNUZ | Dtype::F8_E5M2FNUZ => "|u1",
        Dtype::F4 | Dtype::F6_E2M3 | Dtype::F6_E3M2 => "|u1",
    }
}

/// Bits per element of the packed sub-byte types; `None` for types of one byte or more.
fn sub_byte_bits(dtype: Dtype) -> Option<u64> {
    match dtype {
        Dtype::F4 => Some(4),
        Dtype::F6_E2M3 | Dtype::F6_E3M2 => Some(6),
        _ => None,
    }
}

/// The shape written in the `.npy` header for a tensor of `dtype` and safetensors `shape`.
///
/// The same shape for whole-byte types; for the packed sub-byte types (F4, F6_*) the 1-D packed byte
/// count `(element_count * bits / 8,)`, matching the `|u1` descr.
pub fn npy_shape(dtype: Dtype, shape: &[u64]) -> Result<Vec<u64>, NpyError> {
    let Some(bits_per_element) = sub_byte_bits(dtype) else {
        return Ok(shape.to_vec());
    };
    let elements = shape.iter().try_fold(1u64, |acc, &dim| acc.checked_mul(dim)).ok_or(NpyError::ShapeOverflow)?;
    let bits = elements.checked_mul(bits_per_element).ok_or(NpyError::ShapeOverflow)?;
    if bits % 8 != 0 {
        return Err(NpyError::PartialByte { bits });
    }
    Ok(vec![bits / 8])
}

/// Python's repr of a tuple of ints: `()`, `(5,)`, `(2, 3)`.
fn python_tuple_repr(dims: &[u64]) -> String {
    match dims {
        [] => "()".to_string(),
        [only] => format!("({only},)"),
        _ => {
            let items: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("({})", items.join(", "))
        }
    }
}

/// The complete `.npy` header (magic through the final `\n`) for a tensor of `dtype` and safetensors
/// `shape`; the tensor's raw bytes follow it unchanged.
///
/// Identical to the bytes np.save writes for an array with `descr(dtype)` and
/// `npy_shape(dtype, shape)`; its length is a multiple of 64.
pub fn npy_header(dtype: Dtype, shape: &[u64]) -> Result<Vec<u8>, NpyError> {
    let dims = npy_shape(dtype, shape)?;
    let mut dict =
        format!("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr(dtype), python_tuple_repr(&dims));
    if let Some(first) = dims.first() {
        let digits = first.to_string().len();
        dict.push_str(&" ".repeat(GROWTH_AXIS_MAX_DIGITS.saturating_sub(digits)));
    }
    // numpy counts the final newline in the header length before padding.
    let dict_and_newline = dict.len() + 1;

    // Version 1.0 has a u16 length after the 8-byte magic+version; 2.0 a u32. numpy tries 1.0 first.
    let (version, length_field_len) = {
        let v1_len = padded_len(MAGIC.len() + 2 + 2, dict_and_newline);
        if v1_len <= usize::from(u16::MAX) {
            (1u8, 2usize)
        } else {
            (2u8, 4usize)
        }
    };
    let prefix_len = MAGIC.len() + 2 + length_field_len;
    let header_len = padded_len(prefix_len, dict_and_newline);
    let pad = header_len - dict_and_newline;

    let mut out = Vec::with_capacity(prefix_len + header_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        let len = u16::try_from(header_len).map_err(|_| NpyError::HeaderTooLarge)?;
        out.extend_from_slice(&len.to_le_bytes());
    } else {
        let len = u32::try_from(header_len).map_err(|_| NpyError::HeaderTooLarge)?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + pad, b' ');
    out.push(b'\n');
    Ok(out)
}

/// The HEADER_LEN numpy writes: the dict plus newline, padded so prefix + header is a multiple of
/// 64. numpy adds a full 64 bytes of padding when the sum is already aligned, and so do we.
fn padded_len(prefix_len: usize, dict_and_newline: usize) -> usize {
    let pad = ARRAY_ALIGN - (prefix_len + dict_and_newline) % ARRAY_ALIGN;
    dict_and_newline + pad
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Headers written by numpy 2.4.6, frozen here; regenerate with `tests/data/make_npy_expected.py`
    /// (np.save of zero arrays where they fit in memory, numpy's own header writer otherwise).
    /// Columns: safetensors shape given to `npy_header`, dtype, expected bytes.
    const NUMPY_HEADERS: &[(&[u64], Dtype, &[u8])] = &[
        (&[], Dtype::F32, b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (), }                                                              \n"),
        (&[5], Dtype::F32, b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }                                                            \n"),
        (&[2, 3], Dtype::BF16, b"\x93NUMPY\x01\x00v\x00{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }                                                          \n"),
        (&[2, 3, 4], Dtype::U8, b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 4), }                                                       \n"),
        (&[0], Dtype::BOOL, b"\x93NUMPY\x01\x00v\x00{'descr': '|b1', 'fortran_order': False, 'shape': (0,), }                                                            \n"),
        (&[3, 0, 2], Dtype::I64, b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (3, 0, 2), }                                                       \n"),
        (&[16, 16], Dtype::F8_E4M3, b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (16, 16), }                                                        \n"),
        // F4 [4, 6]: 24 nibbles packed into 12 bytes, exposed as (12,) uint8.
        (&[4, 6], Dtype::F4, b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (12,), }                                                           \n"),
        (&[7, 1, 9], Dtype::C64, b"\x93NUMPY\x01\x00v\x00{'descr': '<c8', 'fortran_order': False, 'shape': (7, 1, 9), }                                                       \n"),
        (&[1; 30], Dtype::I8, b"\x93NUMPY\x01\x00\xb6\x00{'descr': '|i1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }                                      \n"),
        (&[1 << 40], Dtype::F16, b"\x93NUMPY\x01\x00v\x00{'descr': '<f2', 'fortran_order': False, 'shape': (1099511627776,), }                                                \n"),
        (&[u64::MAX], Dtype::U64, b"\x93NUMPY\x01\x00v\x00{'descr': '<u8', 'fortran_order': False, 'shape': (18446744073709551615,), }                                         \n"),
        (&[7, 1 << 33, 9], Dtype::C64, b"\x93NUMPY\x01\x00v\x00{'descr': '<c8', 'fortran_order': False, 'shape': (7, 8589934592, 9), }                                              \n"),
        (&[u64::MAX; 5], Dtype::F64, b"\x93NUMPY\x01\x00\xb6\x00{'descr': '<f8', 'fortran_order': False, 'shape': (18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615), }                  \n"),
        // 10 + dict + newline is already a multiple of 64 here; numpy then pads a full 64 bytes.
        (&[1; 15], Dtype::U8, b"\x93NUMPY\x01\x00\xb6\x00{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }                                                                                   \n"),
    ];

    #[test]
    fn headers_match_numpy_byte_for_byte() {
        for (shape, dtype, expected) in NUMPY_HEADERS {
            let got = npy_header(*dtype, shape).unwrap();
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(expected), "{dtype:?} {shape:?}");
            assert_eq!(&got, expected, "{dtype:?} {shape:?}");
            assert_eq!(got.len() % 64, 0);
        }
    }

    /// numpy switches to format 2.0 between 21817 and 21818 unit dimensions (u8 data): the padded
    /// header first exceeds 65535 bytes there. Lengths and prefixes frozen from numpy 2.4.6.
    #[test]
    fn version_two_only_when_version_one_length_overflows() {
        let last_v1 = npy_header(Dtype::U8, &[1; 21817]).unwrap();
        assert_eq!(last_v1.len(), 65536);
        assert_eq!(&last_v1[..10], b"\x93NUMPY\x01\x00\xf6\xff");

        let first_v2 = npy_header(Dtype::U8, &[1; 21818]).unwrap();
        assert_eq!(first_v2.len(), 65600);
        assert_eq!(&first_v2[..12], b"\x93NUMPY\x02\x004\x00\x01\x00");
        assert!(first_v2[12..].starts_with(b"{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, "));
        // numpy 2.4.6 ends this header with "1), }", 80 spaces (growth + padding) and the newline.
        let tail = format!("1), }}{}\n", " ".repeat(80));
        assert!(first_v2.ends_with(tail.as_bytes()));
    }

    #[test]
    fn every_dtype_has_a_loadable_descr_and_a_header() {
        for dtype in Dtype::ALL {
            let d = descr(dtype);
            assert_eq!(d.len(), 3, "{dtype:?}");
            // '|' only for one-byte items, '<' for wider ones, as numpy writes them.
            let itemsize: u32 = d[2..].parse().unwrap();
            assert_eq!(d.starts_with('|'), itemsize == 1, "{dtype:?}");
            let header = npy_header(dtype, &[2, 4]).unwrap();
            assert_eq!(header.len(), 128, "{dtype:?}");
        }
    }

    #[test]
    fn sub_byte_types_become_flat_packed_bytes() {
        assert_eq!(npy_shape(Dtype::F4, &[4, 6]), Ok(vec![12]));
        assert_eq!(npy_shape(Dtype::F4, &[]), Err(NpyError::PartialByte { bits: 4 }));
        assert_eq!(npy_shape(Dtype::F6_E2M3, &[4]), Ok(vec![3]));
        assert_eq!(npy_shape(Dtype::F6_E3M2, &[2, 0, 8]), Ok(vec![0]));
        assert_eq!(npy_shape(Dtype::F6_E3M2, &[3]), Err(NpyError::PartialByte { bits: 18 }));
        assert_eq!(npy_shape(Dtype::F4, &[u64::MAX, 2]), Err(NpyError::ShapeOverflow));
        assert_eq!(npy_shape(Dtype::F4, &[u64::MAX / 2]), Err(NpyError::ShapeOverflow));
        assert_eq!(npy_shape(Dtype::BF16, &[3, 5]), Ok(vec![3, 5]));
        assert_eq!(npy_shape(Dtype::U8, &[]), Ok(vec![]));
    }

    #[test]
    fn tuple_repr_follows_python() {
        assert_eq!(python_tuple_repr(&[]), "()");
        assert_eq!(python_tuple_repr(&[5]), "(5,)");
        assert_eq!(python_tuple_repr(&[2, 3]), "(2, 3)");
    }
}
