//! The `as=f32` view's content logic: tensor elements converted to little-endian f32, bit-exact with
//! numpy / ml_dtypes `astype(np.float32)`.
//!
//! The converted file has 4 bytes per element, in element order. A read of any byte range of it maps
//! to a range of whole source elements ([`source_range_for`], then [`source_byte_range`]); the caller
//! fetches those source bytes, converts them with [`convert_to_f32`], and slices out the bytes asked
//! for (the first `out_offset - 4 * first_element` converted bytes are before the request).
//!
//! # What converts, and how
//!
//! Every conversion into f32 here is exact except F64, I32, U32, I64 and U64, which round to nearest,
//! ties to even, like numpy's cast. Special values follow what numpy 2.4 and ml_dtypes 0.6 produce;
//! `tests/data/make_convert_expected.py` froze their outputs, and the tests compare every value of
//! every 8- and 16-bit type against them.
//!
//! | dtype | rule |
//! |---|---|
//! | F32 | identity |
//! | BF16 | the 16 bits become the top half of the f32 (payloads and signalling NaNs kept) |
//! | F16 | exact; NaN keeps sign and payload (`mantissa << 13`) without setting the quiet bit, as numpy does |
//! | F8_E5M2 | IEEE-like (bias 15): inf kept; every NaN becomes the quiet NaN `0x7fc00000` with the source sign |
//! | F8_E4M3 (e4m3fn, bias 7) | no inf; `0x7f`/`0xff` are NaN, giving `0x7fc00000`/`0xffc00000` |
//! | F8_E4M3FNUZ / F8_E5M2FNUZ (bias 8 / 16) | no inf, no -0; `0x80` is the only NaN and gives `0xffc00000` (ml_dtypes keeps its sign bit) |
//! | F8_E8M0 | `2^(e-127)`: `0x00` is the f32 subnormal `2^-127` (`0x00400000`), `0xff` is NaN `0x7fc00000` |
//! | F4 (e2m1, bias 1) | exact; two per byte, the **first element in the low nibble** (torch `float4_e2m1fn_x2`: "val1 : val0" from MSB to LSB); values as ml_dtypes `float4_e2m1fn` |
//! | F64 | round to nearest even, overflow to inf; NaN gets the quiet bit and keeps sign and the top 22 payload bits, as the x86 cast numpy uses does |
//! | BOOL | any nonzero byte is 1.0 (numpy reads nonzero bytes as True) |
//! | U8, I8, U16, I16, U32, I32, U64, I64 | the integer's value, rounded to nearest even above 2^24 |
//!
//! The F16 NaN rule is numpy's software half-to-float path, which is what numpy 2.4.6 used on the
//! x86_64 machine that froze the expectations (a signalling NaN stays signalling); builds that convert
//! with F16C hardware would quiet it. Only F16 NaNs with a clear quiet bit are affected.
//!
//! Not convertible: C64 (complex has no f32 value) and F6_E2M3 / F6_E3M2 (no torch or numpy packing to
//! check the bit order of four 6-bit values across three bytes against).

use std::fmt;

use crate::format::Dtype;

/// Bytes per converted element.
const F32_BYTES: u64 = 4;
/// The quiet NaN ml_dtypes produces for every 8-bit float NaN (the sign is OR-ed in).
const QUIET_NAN: u32 = 0x7fc0_0000;

/// The dtype has no `as=f32` view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unconvertible {
    /// The dtype that was asked for.
    pub dtype: Dtype,
}

impl fmt::Display for Unconvertible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} cannot be converted to F32", self.dtype)
    }
}

impl std::error::Error for Unconvertible {}

/// Bits per source element for the convertible dtypes, `None` for the others.
fn source_bits(dtype: Dtype) -> Option<u64> {
    match dtype {
        Dtype::F4 => Some(4),
        Dtype::BOOL
        | Dtype::U8
        | Dtype::I8
        | Dtype::F8_E5M2
        | Dtype::F8_E4M3
        | Dtype::F8_E8M0
        | Dtype::F8_E4M3FNUZ
        | Dtype::F8_E5M2FNUZ => Some(8),
        Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => Some(16),
        Dtype::I32 | Dtype::U32 | Dtype::F32 => Some(32),
        Dtype::F64 | Dtype::I64 | Dtype::U64 => Some(64),
        Dtype::F6_E2M3 | Dtype::F6_E3M2 | Dtype::C64 => None,
    }
}

/// Whether `-o as=f32` serves a tensor of `dtype` converted: the float dtypes other than F32 (BF16,
/// F16, the F8 family, F4, F64). Integer and BOOL tensors keep their raw bytes and dtype: their
/// values are not floats, an I64 or U32 above 2^24 would not survive the trip, and code reading an
/// index or a mask expects its own dtype. (They still convert with [`convert_to_f32`].)
pub fn served_as_f32(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::BF16
            | Dtype::F16
            | Dtype::F64
            | Dtype::F4
            | Dtype::F8_E5M2
            | Dtype::F8_E4M3
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E5M2FNUZ
    )
}

/// Whether `dtype` has an `as=f32` view (see the module table).
pub fn f32_convertible(dtype: Dtype) -> bool {
    source_bits(dtype).is_some()
}

/// Byte length of the converted file for a tensor of `elements` elements: `4 * elements`.
/// `None` if `dtype` is not convertible or the length overflows `u64`.
pub fn converted_len(dtype: Dtype, elements: u64) -> Option<u64> {
    source_bits(dtype)?;
    elements.checked_mul(F32_BYTES)
}

/// The source elements `(first_element, element_count)` whose conversion covers the converted bytes
/// `[out_offset, out_offset + out_len)`.
///
/// For F4 the range is widened to whole source bytes (even first element, even count), which never
/// passes the end of a valid tensor since F4 tensors hold an even number of elements. The caller
/// clamps the range to the tensor's element count for reads past its end.
pub fn source_range_for(dtype: Dtype, out_offset: u64, out_len: u64) -> (u64, u64) {
    let mut first = out_offset / F32_BYTES;
    if out_len == 0 {
        return (first, 0);
    }
    let out_end = out_offset.saturating_add(out_len);
    let mut end = out_end / F32_BYTES + u64::from(out_end % F32_BYTES != 0);
    if dtype == Dtype::F4 {
        first -= first % 2;
        end = end.saturating_add(end % 2);
    }
    (first, end - first)
}

/// Byte range `(offset, len)` within the tensor's data holding elements
/// `[first_element, first_element + element_count)`; `None` if `dtype` is not convertible or the
/// numbers overflow. For F4, pass an even first element (as [`source_range_for`] returns); an odd
/// count is rounded up to the whole byte.
pub fn source_byte_range(dtype: Dtype, first_element: u64, element_count: u64) -> Option<(u64, u64)> {
    let bits = source_bits(dtype)?;
    let start_bits = first_element.checked_mul(bits)?;
    let len_bits = element_count.checked_mul(bits)?;
    Some((start_bits / 8, len_bits.div_ceil(8)))
}

/// Appends the little-endian f32 bytes of every whole element of `src` to `out`.
///
/// `src` must start at an element boundary (for F4, at a byte, i.e. an even element); trailing
/// bytes that do not form a whole element are ignored.
pub fn convert_to_f32(dtype: Dtype, src: &[u8], out: &mut Vec<u8>) -> Result<(), Unconvertible> {
    let bits = source_bits(dtype).ok_or(Unconvertible { dtype })?;
    let elements = src.len().saturating_mul(8) / bits as usize;
    out.reserve(elements.saturating_mul(F32_BYTES as usize));
    let mut push = |bits: u32| out.extend_from_slice(&bits.to_le_bytes());
    match dtype {
        Dtype::F4 => {
            for &byte in src {
                push(minifloat_to_f32(u32::from(byte & 0x0f), &E2M1));
                push(minifloat_to_f32(u32::from(byte >> 4), &E2M1));
            }
        }
        Dtype::BOOL => src.iter().for_each(|&b| push(if b != 0 { 1f32.to_bits() } else { 0 })),
        Dtype::U8 => src.iter().for_each(|&b| push(f32::from(b).to_bits())),
        Dtype::I8 => src.iter().for_each(|&b| push(f32::from(b as i8).to_bits())),
        Dtype::F8_E5M2 => src.iter().for_each(|&b| push(minifloat_to_f32(b.into(), &E5M2))),
        Dtype::F8_E4M3 => src.iter().for_each(|&b| push(minifloat_to_f32(b.into(), &E4M3FN))),
        Dtype::F8_E4M3FNUZ => src.iter().for_each(|&b| push(minifloat_to_f32(b.into(), &E4M3FNUZ))),
        Dtype::F8_E5M2FNUZ => src.iter().for_each(|&b| push(minifloat_to_f32(b.into(), &E5M2FNUZ))),
        Dtype::F8_E8M0 => src.iter().for_each(|&b| push(e8m0_to_f32(b))),
        Dtype::I16 => le_elements::<2>(src).for_each(|e| push(f32::from(i16::from_le_bytes(e)).to_bits())),
        Dtype::U16 => le_elements::<2>(src).for_each(|e| push(f32::from(u16::from_le_bytes(e)).to_bits())),
        Dtype::F16 => {
            le_elements::<2>(src).for_each(|e| push(minifloat_to_f32(u16::from_le_bytes(e).into(), &BINARY16)))
        }
        Dtype::BF16 => le_elements::<2>(src).for_each(|e| push(u32::from(u16::from_le_bytes(e)) << 16)),
        Dtype::I32 => le_elements::<4>(src).for_each(|e| push((i32::from_le_bytes(e) as f32).to_bits())),
        Dtype::U32 => le_elements::<4>(src).for_each(|e| push((u32::from_le_bytes(e) as f32).to_bits())),
        Dtype::F32 => le_elements::<4>(src).for_each(|e| push(u32::from_le_bytes(e))),
        Dtype::F64 => le_elements::<8>(src).for_each(|e| push(f64_to_f32(u64::from_le_bytes(e)))),
        Dtype::I64 => le_elements::<8>(src).for_each(|e| push((i64::from_le_bytes(e) as f32).to_bits())),
        Dtype::U64 => le_elements::<8>(src).for_each(|e| push((u64::from_le_bytes(e) as f32).to_bits())),
        Dtype::F6_E2M3 | Dtype::F6_E3M2 | Dtype::C64 => return Err(Unconvertible { dtype }),
    }
    Ok(())
}

/// The whole `N`-byte elements of `src`, as arrays ready for `from_le_bytes`.
fn le_elements<const N: usize>(src: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    src.chunks_exact(N).filter_map(|chunk| chunk.try_into().ok())
}

/// How a small float format spends its top exponent and its bit patterns on inf and NaN.
enum Specials {
    /// IEEE: top exponent is inf (mantissa 0) or NaN; NaN keeps its payload (numpy's float16).
    IeeeKeepPayload,
    /// IEEE layout, but every NaN becomes the quiet NaN with the source sign (ml_dtypes float8_e5m2).
    IeeeQuietNan,
    /// No inf; only all-ones exponent and mantissa is NaN (the "fn" formats).
    AllOnesNan,
    /// No inf and no -0: the negative-zero pattern is the single NaN (the "fnuz" formats).
    NegativeZeroNan,
    /// Every pattern is a finite number (e2m1).
    None,
}

/// A sign / exponent / mantissa float narrower than f32.
struct Minifloat {
    exponent_bits: u32,
    mantissa_bits: u32,
    bias: i32,
    specials: Specials,
}

const BINARY16: Minifloat =
    Minifloat { exponent_bits: 5, mantissa_bits: 10, bias: 15, specials: Specials::IeeeKeepPayload };
const E5M2: Minifloat = Minifloat { exponent_bits: 5, mantissa_bits: 2, bias: 15, specials: Specials::IeeeQuietNan };
const E4M3FN: Minifloat = Minifloat { exponent_bits: 4, mantissa_bits: 3, bias: 7, specials: Specials::AllOnesNan };
const E4M3FNUZ: Minifloat =
    Minifloat { exponent_bits: 4, mantissa_bits: 3, bias: 8, specials: Specials::NegativeZeroNan };
const E5M2FNUZ: Minifloat =
    Minifloat { exponent_bits: 5, mantissa_bits: 2, bias: 16, specials: Specials::NegativeZeroNan };
const E2M1: Minifloat = Minifloat { exponent_bits: 2, mantissa_bits: 1, bias: 1, specials: Specials::None };

/// f32 bits of the value of `bits` (in the low `1 + exponent_bits + mantissa_bits` bits) in `format`.
/// All these formats have fewer exponent and mantissa bits than f32, so every value is exact.
fn minifloat_to_f32(bits: u32, format: &Minifloat) -> u32 {
    let m = format.mantissa_bits;
    let exponent_max = (1u32 << format.exponent_bits) - 1;
    let sign_shift = format.exponent_bits + m;
    let sign = ((bits >> sign_shift) & 1) << 31;
    let exponent = (bits >> m) & exponent_max;
    let mantissa = bits & ((1u32 << m) - 1);
    let nan = sign | QUIET_NAN;
    match format.specials {
        Specials::IeeeKeepPayload if exponent == exponent_max => {
            return sign | 0x7f80_0000 | (mantissa << (23 - m));
        }
        Specials::IeeeQuietNan if exponent == exponent_max => {
            return if mantissa == 0 { sign | 0x7f80_0000 } else { nan };
        }
        Specials::AllOnesNan if exponent == exponent_max && mantissa == (1 << m) - 1 => return nan,
        Specials::NegativeZeroNan if sign != 0 && exponent == 0 && mantissa == 0 => return nan,
        _ => {}
    }
    if exponent == 0 {
        if mantissa == 0 {
            return sign;
        }
        // Subnormal: mantissa * 2^(1 - bias - m). Its top set bit becomes the f32's implicit one.
        let top = 31 - mantissa.leading_zeros();
        let f32_exponent = (1 - format.bias - m as i32 + top as i32 + 127) as u32;
        let fraction = (mantissa ^ (1 << top)) << (23 - top);
        return sign | (f32_exponent << 23) | fraction;
    }
    let f32_exponent = (exponent as i32 - format.bias + 127) as u32;
    sign | (f32_exponent << 23) | (mantissa << (23 - m))
}

/// f32 bits of an E8M0 scale: `2^(e - 127)`, with `0xff` as NaN.
fn e8m0_to_f32(e: u8) -> u32 {
    match e {
        // 2^-127 is below f32's smallest normal: the subnormal with only the top fraction bit.
        0 => 0x0040_0000,
        0xff => QUIET_NAN,
        _ => u32::from(e) << 23,
    }
}

/// f32 bits of an f64, rounding to nearest even. Rust's `as` already rounds that way, but leaves NaN
/// payloads unspecified, so NaN is built by hand the way the x86 conversion numpy uses does it.
fn f64_to_f32(bits: u64) -> u32 {
    let value = f64::from_bits(bits);
    if value.is_nan() {
        let sign = ((bits >> 63) as u32) << 31;
        let payload_top = ((bits >> 29) & 0x007f_ffff) as u32;
        return sign | QUIET_NAN | payload_top;
    }
    (value as f32).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPECTED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/convert_expected");

    fn read_expected(name: &str, suffix: &str) -> Vec<u8> {
        let path = format!("{EXPECTED_DIR}/{name}.{suffix}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Compares our conversion of `src` with the f32 bits ml_dtypes/numpy produced, value by value.
    fn assert_matches_expected(dtype: Dtype, src: &[u8]) {
        let expected = read_expected(dtype.name_for_tests(), "f32");
        let mut got = Vec::new();
        convert_to_f32(dtype, src, &mut got).unwrap();
        assert_eq!(got.len(), expected.len(), "{dtype:?}");
        let mut mismatches = 0;
        for (i, (g, e)) in got.chunks_exact(4).zip(expected.chunks_exact(4)).enumerate() {
            if g != e {
                mismatches += 1;
                if mismatches <= 5 {
                    eprintln!(
                        "{dtype:?} element {i}: got {:#010x}, numpy {:#010x}",
                        u32::from_le_bytes(g.try_into().unwrap()),
                        u32::from_le_bytes(e.try_into().unwrap())
                    );
                }
            }
        }
        assert_eq!(mismatches, 0, "{dtype:?}: {mismatches} values differ from numpy");
    }

    /// Test-local spelling of the names the data files use, so the tests do not depend on
    /// `Dtype::name` (owned by the format module).
    trait TestName {
        fn name_for_tests(self) -> &'static str;
    }

    impl TestName for Dtype {
        fn name_for_tests(self) -> &'static str {
            match self {
                Dtype::BOOL => "BOOL",
                Dtype::F4 => "F4",
                Dtype::U8 => "U8",
                Dtype::I8 => "I8",
                Dtype::F8_E5M2 => "F8_E5M2",
                Dtype::F8_E4M3 => "F8_E4M3",
                Dtype::F8_E8M0 => "F8_E8M0",
                Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
                Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
                Dtype::I16 => "I16",
                Dtype::U16 => "U16",
                Dtype::F16 => "F16",
                Dtype::BF16 => "BF16",
                Dtype::I32 => "I32",
                Dtype::U32 => "U32",
                Dtype::F64 => "F64",
                Dtype::I64 => "I64",
                Dtype::U64 => "U64",
                other => panic!("no expectation file for {other:?}"),
            }
        }
    }

    #[test]
    fn every_8_bit_pattern_matches_ml_dtypes() {
        let all_bytes: Vec<u8> = (0..=255).collect();
        for dtype in [
            Dtype::F8_E4M3,
            Dtype::F8_E5M2,
            Dtype::F8_E4M3FNUZ,
            Dtype::F8_E5M2FNUZ,
            Dtype::F8_E8M0,
            Dtype::U8,
            Dtype::I8,
            Dtype::BOOL,
            // 256 packed bytes = every pair of nibbles, low nibble first.
            Dtype::F4,
        ] {
            assert_matches_expected(dtype, &all_bytes);
        }
    }

    #[test]
    fn every_16_bit_pattern_matches_numpy() {
        let all_patterns: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        assert_matches_expected(Dtype::F16, &all_patterns);
        assert_matches_expected(Dtype::BF16, &all_patterns);
    }

    #[test]
    fn sampled_wide_types_match_numpy() {
        for dtype in [Dtype::I16, Dtype::U16, Dtype::I32, Dtype::U32, Dtype::I64, Dtype::U64, Dtype::F64] {
            assert_matches_expected(dtype, &read_expected(dtype.name_for_tests(), "src"));
        }
    }

    #[test]
    fn f32_is_identity_including_nan_payloads() {
        let patterns = [0u32, 0x8000_0000, 0x7f80_0001, 0xffc0_1234, 0x0000_0001, 0x3f80_0000];
        let src: Vec<u8> = patterns.iter().flat_map(|p| p.to_le_bytes()).collect();
        let mut out = Vec::new();
        convert_to_f32(Dtype::F32, &src, &mut out).unwrap();
        assert_eq!(out, src);
    }

    #[test]
    fn only_floats_are_served_converted() {
        for dtype in Dtype::ALL {
            let name = dtype.name();
            let float = name.starts_with("BF") || (name.starts_with('F') && dtype != Dtype::F32);
            let unpacked = !matches!(dtype, Dtype::F6_E2M3 | Dtype::F6_E3M2);
            assert_eq!(served_as_f32(dtype), float && unpacked, "{dtype:?}");
            assert!(!served_as_f32(dtype) || f32_convertible(dtype), "{dtype:?}");
        }
    }

    #[test]
    fn unconvertible_dtypes_are_refused() {
        for dtype in Dtype::ALL {
            let expect_convertible = !matches!(dtype, Dtype::C64 | Dtype::F6_E2M3 | Dtype::F6_E3M2);
            assert_eq!(f32_convertible(dtype), expect_convertible, "{dtype:?}");
            let mut out = Vec::new();
            assert_eq!(convert_to_f32(dtype, &[0; 8], &mut out).is_ok(), expect_convertible, "{dtype:?}");
            assert_eq!(converted_len(dtype, 3).is_some(), expect_convertible, "{dtype:?}");
        }
        assert_eq!(convert_to_f32(Dtype::C64, &[0; 8], &mut Vec::new()), Err(Unconvertible { dtype: Dtype::C64 }));
    }

    #[test]
    fn appends_and_ignores_partial_trailing_element() {
        let mut out = vec![0xaa];
        // 0x3c00 is 1.0 in f16; the trailing odd byte is not an element.
        convert_to_f32(Dtype::F16, &[0x00, 0x3c, 0x00, 0xc0, 0x7f], &mut out).unwrap();
        let mut expected = vec![0xaa];
        expected.extend_from_slice(&1f32.to_le_bytes());
        expected.extend_from_slice(&(-2f32).to_le_bytes());
        assert_eq!(out, expected);
    }

    #[test]
    fn converted_len_is_four_bytes_per_element() {
        assert_eq!(converted_len(Dtype::BF16, 0), Some(0));
        assert_eq!(converted_len(Dtype::F4, 10), Some(40));
        assert_eq!(converted_len(Dtype::F64, 7), Some(28));
        assert_eq!(converted_len(Dtype::U8, u64::MAX / 4 + 1), None);
    }

    #[test]
    fn source_range_covers_exactly_the_touched_elements() {
        assert_eq!(source_range_for(Dtype::BF16, 0, 4), (0, 1));
        assert_eq!(source_range_for(Dtype::BF16, 0, 5), (0, 2));
        assert_eq!(source_range_for(Dtype::BF16, 3, 2), (0, 2));
        assert_eq!(source_range_for(Dtype::BF16, 8, 8), (2, 2));
        assert_eq!(source_range_for(Dtype::BF16, 9, 0), (2, 0));
        assert_eq!(source_range_for(Dtype::F4, 4, 4), (0, 2));
        assert_eq!(source_range_for(Dtype::F4, 13, 1), (2, 2));
        assert_eq!(source_range_for(Dtype::U8, u64::MAX - 1, 10), (u64::MAX / 4, 1));
    }

    #[test]
    fn source_byte_range_maps_elements_to_tensor_bytes() {
        assert_eq!(source_byte_range(Dtype::BF16, 3, 2), Some((6, 4)));
        assert_eq!(source_byte_range(Dtype::F4, 4, 2), Some((2, 1)));
        assert_eq!(source_byte_range(Dtype::F4, 4, 3), Some((2, 2)));
        assert_eq!(source_byte_range(Dtype::F64, u64::MAX / 4, 1), None);
        assert_eq!(source_byte_range(Dtype::C64, 0, 1), None);
    }

    /// Any read of the converted file, served by converting the source range and slicing, equals the
    /// same bytes of the whole converted file.
    #[test]
    fn reads_at_any_offset_equal_slices_of_the_whole_conversion() {
        for dtype in [Dtype::F4, Dtype::BF16, Dtype::F8_E4M3, Dtype::F64, Dtype::I32] {
            let elements: u64 = 10;
            let bits = source_bits(dtype).unwrap();
            let src: Vec<u8> = (0..elements * bits / 8).map(|i| (i * 37 + 11) as u8).collect();
            let mut whole = Vec::new();
            convert_to_f32(dtype, &src, &mut whole).unwrap();
            let total = converted_len(dtype, elements).unwrap();
            assert_eq!(whole.len() as u64, total);
            for offset in 0..total {
                for len in 1..=(total - offset) {
                    let (first, count) = source_range_for(dtype, offset, len);
                    let count = count.min(elements - first.min(elements));
                    let (byte_off, byte_len) = source_byte_range(dtype, first, count).unwrap();
                    let slice = &src[byte_off as usize..(byte_off + byte_len) as usize];
                    let mut part = Vec::new();
                    convert_to_f32(dtype, slice, &mut part).unwrap();
                    let skip = (offset - first * 4) as usize;
                    assert_eq!(
                        &part[skip..skip + len as usize],
                        &whole[offset as usize..(offset + len) as usize],
                        "{dtype:?} offset {offset} len {len}"
                    );
                }
            }
        }
    }
}
