//! The safetensors header: parsed and validated in one place, by the reference crate's rules; dtypes.
//!
//! The rules and their order follow safetensors 0.8 `SafeTensors::read_metadata`: an 8-byte
//! length, a length cap, the header within the file, UTF-8, JSON into the same serde shapes as the
//! reference (so serde's own messages match), offsets sorted and contiguous from 0, sizes from
//! checked arithmetic, and data ending exactly at the end of the file. Each broken rule has its own
//! [`FormatError`] variant; messages escape hostile names before they reach a terminal.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use std::io;

mod error;
pub mod index;
pub mod writer;
pub use error::FormatError;
use error::{write_escaped, Printable};

/// Size of the little-endian header-length prefix.
pub const N_LEN: u64 = 8;
/// Largest header the reference crate accepts (safetensors 0.8 `MAX_HEADER_SIZE`).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;

/// Longest JSON error message kept; serde quotes hostile input (e.g. unknown dtype names) verbatim.
const MAX_SHOWN_MESSAGE: usize = 400;

/// Element types, spelled exactly as in the JSON header, in the reference crate's enum order.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize)]
pub enum Dtype {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// Every dtype, in enum order.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Bits per element (4 for F4, 6 for the F6 types).
    pub fn bitsize(self) -> u64 {
        use Dtype::*;
        match self {
            F4 => 4,
            F6_E2M3 | F6_E3M2 => 6,
            BOOL | U8 | I8 | F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => 8,
            I16 | U16 | F16 | BF16 => 16,
            I32 | U32 | F32 => 32,
            C64 | F64 | I64 | U64 => 64,
        }
    }

    /// The JSON spelling (`"BF16"`).
    pub fn name(self) -> &'static str {
        // Same order as the enum; a unit test checks each entry against serde's spelling.
        const NAMES: [&str; 22] = [
            "BOOL",
            "F4",
            "F6_E2M3",
            "F6_E3M2",
            "U8",
            "I8",
            "F8_E5M2",
            "F8_E4M3",
            "F8_E8M0",
            "F8_E4M3FNUZ",
            "F8_E5M2FNUZ",
            "I16",
            "U16",
            "F16",
            "BF16",
            "I32",
            "U32",
            "F32",
            "C64",
            "F64",
            "I64",
            "U64",
        ];
        NAMES[self as usize]
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that is not the exact, case-sensitive JSON spelling of a dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDtype {
    /// The string that was given.
    pub name: String,
}

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown dtype `{}`", Printable(&self.name))
    }
}

impl std::error::Error for UnknownDtype {}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    /// Accepts only the exact JSON spelling (`"F32"`, not `"f32"`), like the header parser.
    fn from_str(s: &str) -> Result<Dtype, UnknownDtype> {
        Dtype::ALL.into_iter().find(|dtype| dtype.name() == s).ok_or_else(|| UnknownDtype { name: s.to_owned() })
    }
}

/// One tensor entry of the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name as written in the header (any string, possibly not a valid file name).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions; empty for a scalar.
    pub shape: Vec<u64>,
    /// `[begin, end)` relative to the start of the data section.
    pub data_offsets: (u64, u64),
}

impl TensorInfo {
    /// Byte length of the tensor's data (0 for a hand-built entry whose end precedes its start).
    pub fn byte_len(&self) -> u64 {
        self.data_offsets.1.saturating_sub(self.data_offsets.0)
    }
}

/// A validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// N, the JSON header's length in bytes (the data section starts at `8 + N`).
    pub header_len: u64,
    /// Tensors in data-offset order (ties, i.e. empty tensors at the same offset, by name).
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` map, if present and not null.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Total file length the header was validated against.
    pub file_len: u64,
}

impl Header {
    /// Absolute file offset where the data section starts.
    pub fn data_start(&self) -> u64 {
        N_LEN + self.header_len
    }

    /// Absolute byte range of `tensor` in the file. Validation guarantees it lies inside the file;
    /// for hand-built entries the ends saturate instead of overflowing.
    pub fn tensor_range(&self, tensor: &TensorInfo) -> Range<u64> {
        let start = self.data_start().saturating_add(tensor.data_offsets.0);
        let end = self.data_start().saturating_add(tensor.data_offsets.1);
        start..end.max(start)
    }
}

/// The header as the reference crate deserializes it. Field and type names match the reference
/// (serde names a flattened struct by its Rust name), so errors such as "duplicate field
/// `__metadata__`" or "expected struct HashMetadata" read the same.
#[derive(serde::Deserialize)]
struct HashMetadata {
    #[serde(rename = "__metadata__")]
    metadata: Option<BTreeMap<String, String>>,
    /// A repeated tensor name keeps its last entry, as serde's map does in the reference.
    #[serde(flatten)]
    tensors: BTreeMap<String, RawTensor>,
}

/// One tensor entry; unknown fields are ignored, as in the reference (no `deny_unknown_fields`).
#[derive(serde::Deserialize)]
#[serde(rename = "TensorInfo")]
struct RawTensor {
    dtype: Dtype,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// The accepting fast path: the same document as [`HashMetadata`], deserialized straight into maps.
/// serde's `flatten` (which the reference uses) first buffers the whole document as generic values,
/// costing tens of times a large header's size in memory; this visitor does not. It accepts exactly
/// what the reference accepts (unknown entry fields are read as JSON values, so the parser's nesting
/// limit applies to them as it does under `flatten`); on any error, [`parse_header`] parses again the
/// reference's way to report the reference's own message.
struct FastHeader {
    metadata: Option<BTreeMap<String, String>>,
    tensors: BTreeMap<String, RawTensor>,
}

impl<'de> serde::Deserialize<'de> for FastHeader {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FastHeader;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("struct HashMetadata")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<FastHeader, A::Error> {
                let (mut metadata, mut seen_metadata, mut tensors) = (None, false, BTreeMap::new());
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        if seen_metadata {
                            return Err(serde::de::Error::duplicate_field("__metadata__"));
                        }
                        seen_metadata = true;
                        metadata = map.next_value::<Option<BTreeMap<String, String>>>()?;
                    } else {
                        let entry = map.next_value::<FastTensor>()?;
                        tensors.insert(key, entry.0);
                    }
                }
                Ok(FastHeader { metadata, tensors })
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A tensor entry for [`FastHeader`]: the three known fields, anything else read and dropped.
struct FastTensor(RawTensor);

impl<'de> serde::Deserialize<'de> for FastTensor {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FastTensor;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("struct TensorInfo")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<FastTensor, A::Error> {
                use serde::de::Error;
                let (mut dtype, mut shape, mut offsets) = (None, None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "dtype" if dtype.is_none() => dtype = Some(map.next_value()?),
                        "shape" if shape.is_none() => shape = Some(map.next_value()?),
                        "data_offsets" if offsets.is_none() => offsets = Some(map.next_value()?),
                        "dtype" | "shape" | "data_offsets" => return Err(A::Error::custom("duplicate field")),
                        _ => drop(map.next_value::<serde_json::Value>()?),
                    }
                }
                Ok(FastTensor(RawTensor {
                    dtype: dtype.ok_or_else(|| A::Error::missing_field("dtype"))?,
                    shape: shape.ok_or_else(|| A::Error::missing_field("shape"))?,
                    data_offsets: offsets.ok_or_else(|| A::Error::missing_field("data_offsets"))?,
                }))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<FastTensor, A::Error> {
                use serde::de::Error;
                let missing = |n| A::Error::invalid_length(n, &"struct TensorInfo with 3 elements");
                let dtype = seq.next_element()?.ok_or_else(|| missing(0))?;
                let shape = seq.next_element()?.ok_or_else(|| missing(1))?;
                let data_offsets = seq.next_element()?.ok_or_else(|| missing(2))?;
                Ok(FastTensor(RawTensor { dtype, shape, data_offsets }))
            }
        }
        deserializer.deserialize_struct("TensorInfo", &["dtype", "shape", "data_offsets"], Visitor)
    }
}

/// Validates a header given its JSON bytes (exactly N bytes after the prefix) and the file length.
///
/// Checks, in the reference's order: N against the limit and the file, UTF-8, JSON shape, then
/// the tensors in `(begin, end, name)` order, then that the data ends exactly at `file_len`.
pub fn parse_header(json: &[u8], file_len: u64) -> Result<Header, FormatError> {
    // usize is at most 64 bits on every supported target, so this conversion is lossless.
    let header_len = json.len() as u64;
    if header_len > MAX_HEADER_SIZE {
        return Err(FormatError::HeaderTooLarge { declared: header_len, limit: MAX_HEADER_SIZE });
    }
    let data_start = N_LEN + header_len;
    if data_start > file_len {
        return Err(FormatError::HeaderLengthPastEnd { declared: header_len, file_len });
    }
    let text = std::str::from_utf8(json).map_err(|error| FormatError::InvalidUtf8 { error })?;
    let raw = match serde_json::from_str::<FastHeader>(text) {
        Ok(fast) => HashMetadata { metadata: fast.metadata, tensors: fast.tensors },
        // Rejected: parse the reference's way for the reference's message (the rare, costly path).
        Err(fast_error) => {
            match serde_json::from_str::<HashMetadata>(text) {
                // Both are meant to accept the same documents; should they ever differ, the
                // reference's way decides, so no file the reference reads is refused.
                Ok(reference) => reference,
                Err(error) => {
                    let _ = fast_error;
                    let mut message = String::new();
                    // Writing into a String cannot fail.
                    let _ = write_escaped(&mut message, &error.to_string(), MAX_SHOWN_MESSAGE);
                    return Err(FormatError::InvalidJson { message });
                }
            }
        }
    };
    let mut tensors: Vec<TensorInfo> = raw
        .tensors
        .into_iter()
        .map(|(name, raw)| TensorInfo { name, dtype: raw.dtype, shape: raw.shape, data_offsets: raw.data_offsets })
        .collect();
    tensors.sort_by(|a, b| (a.data_offsets, &a.name).cmp(&(b.data_offsets, &b.name)));
    let data_len = validate_tensors(&tensors)?;
    if data_start.checked_add(data_len) != Some(file_len) {
        return Err(FormatError::IncompleteData { data_start, data_len, file_len });
    }
    Ok(Header { header_len, tensors, metadata: raw.metadata, file_len })
}

/// Checks tensors in offset order: contiguous from 0, and each exactly as long as its dtype and
/// shape imply. Returns the length of the data section they cover.
fn validate_tensors(tensors: &[TensorInfo]) -> Result<u64, FormatError> {
    let mut expected_start = 0u64;
    for tensor in tensors {
        let (begin, end) = tensor.data_offsets;
        // The reference rejects both in one test (`s != start || e < s`); reporting reversal
        // first names the more specific fault when both hold.
        if end < begin {
            return Err(FormatError::OffsetReversed { tensor: tensor.name.clone(), begin, end });
        }
        if begin > expected_start {
            return Err(FormatError::OffsetGap { tensor: tensor.name.clone(), expected: expected_start, found: begin });
        }
        if begin < expected_start {
            return Err(FormatError::OffsetOverlap {
                tensor: tensor.name.clone(),
                expected: expected_start,
                found: begin,
            });
        }
        expected_start = end;
        let overflow = || FormatError::ShapeOverflow { tensor: tensor.name.clone() };
        // Folded left to right like the reference, so [2^40, 2^40, 0] overflows before the 0.
        let elements = tensor.shape.iter().try_fold(1u64, |acc, &dim| acc.checked_mul(dim));
        let bits = elements.and_then(|n| n.checked_mul(tensor.dtype.bitsize())).ok_or_else(overflow)?;
        if bits % 8 != 0 {
            return Err(FormatError::MisalignedBits { tensor: tensor.name.clone(), bits });
        }
        if end - begin != bits / 8 {
            return Err(FormatError::LengthMismatch {
                tensor: tensor.name.clone(),
                expected: bits / 8,
                found: end - begin,
            });
        }
    }
    Ok(expected_start)
}

/// Reads the prefix and JSON with `read_exact_at(buf, offset)` (fill `buf` from the file's byte
/// `offset`) and validates them against `file_len`.
///
/// Reads at most `8 + N` bytes, and allocates the N-byte buffer only after N passed the limit
/// and was found to fit in the file.
pub fn read_header(
    mut read_exact_at: impl FnMut(&mut [u8], u64) -> io::Result<()>,
    file_len: u64,
) -> Result<Header, FormatError> {
    if file_len < N_LEN {
        return Err(FormatError::HeaderTooSmall { file_len });
    }
    let mut prefix = [0u8; N_LEN as usize];
    read_exact_at(&mut prefix, 0).map_err(|error| FormatError::Io { offset: 0, len: N_LEN, error })?;
    let declared = u64::from_le_bytes(prefix);
    // Both checks come before the allocation, so a hostile prefix cannot make us reserve memory.
    if declared > MAX_HEADER_SIZE {
        return Err(FormatError::HeaderTooLarge { declared, limit: MAX_HEADER_SIZE });
    }
    if N_LEN + declared > file_len {
        return Err(FormatError::HeaderLengthPastEnd { declared, file_len });
    }
    // declared <= MAX_HEADER_SIZE, which fits in usize on every target.
    let mut json = vec![0u8; declared as usize];
    read_exact_at(&mut json, N_LEN).map_err(|error| FormatError::Io { offset: N_LEN, len: declared, error })?;
    parse_header(&json, file_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::writer::serialize;
    use proptest::prelude::*;
    use std::io;

    /// Reads from bytes in memory, so tests exercise `read_header` exactly as a file would.
    fn parse_file(bytes: &[u8]) -> Result<Header, FormatError> {
        let read_at = |buf: &mut [u8], offset: u64| {
            let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
            let end = start.checked_add(buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
            buf.copy_from_slice(bytes.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?);
            Ok(())
        };
        read_header(read_at, bytes.len() as u64)
    }

    /// Bytes of a file: the length prefix, `json` verbatim, then `data_len` data bytes.
    fn file(json: &[u8], data_len: usize) -> Vec<u8> {
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(json);
        out.resize(out.len() + data_len, 0xAB);
        out
    }

    fn parse(json: &str, data_len: usize) -> Result<Header, FormatError> {
        parse_file(&file(json.as_bytes(), data_len))
    }

    fn json_message(result: Result<Header, FormatError>) -> String {
        match result {
            Err(FormatError::InvalidJson { message }) => message,
            other => panic!("expected InvalidJson, got {other:?}"),
        }
    }

    fn names(header: &Header) -> Vec<&str> {
        header.tensors.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn dtype_bitsizes_match_the_reference_table() {
        let expected: [(Dtype, u64); 22] = [
            (Dtype::BOOL, 8),
            (Dtype::F4, 4),
            (Dtype::F6_E2M3, 6),
            (Dtype::F6_E3M2, 6),
            (Dtype::U8, 8),
            (Dtype::I8, 8),
            (Dtype::F8_E5M2, 8),
            (Dtype::F8_E4M3, 8),
            (Dtype::F8_E8M0, 8),
            (Dtype::F8_E4M3FNUZ, 8),
            (Dtype::F8_E5M2FNUZ, 8),
            (Dtype::I16, 16),
            (Dtype::U16, 16),
            (Dtype::F16, 16),
            (Dtype::BF16, 16),
            (Dtype::I32, 32),
            (Dtype::U32, 32),
            (Dtype::F32, 32),
            (Dtype::C64, 64),
            (Dtype::F64, 64),
            (Dtype::I64, 64),
            (Dtype::U64, 64),
        ];
        for (dtype, bits) in expected {
            assert_eq!(dtype.bitsize(), bits, "{dtype}");
        }
        assert_eq!(expected.map(|(d, _)| d), Dtype::ALL);
    }

    #[test]
    fn dtype_names_match_serde_and_parse_back() {
        for dtype in Dtype::ALL {
            assert_eq!(serde_json::to_string(&dtype).unwrap(), format!("\"{}\"", dtype.name()));
            assert_eq!(dtype.name().parse::<Dtype>(), Ok(dtype));
        }
        let err = "f32".parse::<Dtype>().unwrap_err();
        assert_eq!(err.name, "f32");
        assert_eq!(err.to_string(), "unknown dtype `f32`");
    }

    #[test]
    fn header_too_small() {
        for len in [0, 7] {
            match parse_file(&vec![0u8; len]) {
                Err(FormatError::HeaderTooSmall { file_len }) => assert_eq!(file_len, len as u64),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn header_too_large_is_checked_before_the_file_length() {
        for declared in [MAX_HEADER_SIZE + 1, u64::MAX] {
            let mut bytes = declared.to_le_bytes().to_vec();
            bytes.extend_from_slice(b"{}");
            match parse_file(&bytes) {
                Err(FormatError::HeaderTooLarge { declared: d, limit }) => {
                    assert_eq!((d, limit), (declared, MAX_HEADER_SIZE))
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn header_length_past_end() {
        let mut bytes = 100u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{\"a\":");
        match parse_file(&bytes) {
            Err(FormatError::HeaderLengthPastEnd { declared: 100, file_len: 13 }) => {}
            other => panic!("{other:?}"),
        }
        match parse_header(b"{}", 9) {
            Err(FormatError::HeaderLengthPastEnd { declared: 2, file_len: 9 }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn invalid_utf8() {
        match parse_file(&file(b"{\"a\xff\":1}", 0)) {
            Err(FormatError::InvalidUtf8 { error }) => assert_eq!(error.valid_up_to(), 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn invalid_json_keeps_serde_messages() {
        let cases = [
            (r#"{"__metadata__":{},"__metadata__":{}}"#, "duplicate field `__metadata__`"),
            (r#"{"__metadata__":{"x":1}}"#, "invalid type: integer `1`, expected a string"),
            (r#"{"__metadata__":["x"]}"#, "expected a map"),
            (r#"{"a":{"dtype":"f32","shape":[],"data_offsets":[0,4]}}"#, "unknown variant `f32`"),
            (r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#, "missing field `shape`"),
            (r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, "expected u64"),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#, "invalid length 3"),
            (r#"[]"#, "invalid type: sequence, expected struct HashMetadata"),
            ("{}\0\0", "trailing characters"),
        ];
        for (json, needle) in cases {
            let message = json_message(parse(json, 4));
            assert!(message.contains(needle), "{json}: {message}");
        }
    }

    #[test]
    fn invalid_json_message_escapes_hostile_dtype_names() {
        let json = r#"{"a":{"dtype":"\u001b[31m","shape":[],"data_offsets":[0,0]}}"#;
        let message = json_message(parse(json, 0));
        assert!(!message.contains('\u{1b}'), "{message}");
        assert!(message.contains("\\u{1b}[31m"), "{message}");
    }

    #[test]
    fn offset_reversed() {
        let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                       "b":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#;
        match parse(json, 4) {
            Err(FormatError::OffsetReversed { tensor, begin: 4, end: 0 }) => {
                assert_eq!(tensor, "b")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn offset_gap_at_start_and_between_tensors() {
        let first = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
        match parse(first, 8) {
            Err(FormatError::OffsetGap { tensor, expected: 0, found: 4 }) => {
                assert_eq!(tensor, "a")
            }
            other => panic!("{other:?}"),
        }
        let between = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                          "b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}"#;
        let err = parse(between, 10).unwrap_err();
        let gap = matches!(&err, FormatError::OffsetGap { tensor, expected: 4, found: 6 } if tensor == "b");
        assert!(gap, "{err:?}");
        assert_eq!(err.to_string(), "tensor `b` starts at 6, expected 4 (a hole of 2 bytes)");
    }

    /// A repeated key keeps its last entry (serde map semantics, as in the reference), so the
    /// first entry's bytes become a hole.
    #[test]
    fn duplicate_name_with_different_offsets_leaves_a_gap() {
        let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                       "a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
        match parse(json, 8) {
            Err(FormatError::OffsetGap { tensor, expected: 0, found: 4 }) => {
                assert_eq!(tensor, "a")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn offset_overlap() {
        let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                       "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        match parse(json, 8) {
            Err(FormatError::OffsetOverlap { tensor, expected: 8, found: 4 }) => {
                assert_eq!(tensor, "b")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shape_overflow_in_elements_and_in_bits() {
        let elements = r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}"#;
        let bits = r#"{"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#;
        for json in [elements, bits] {
            match parse(json, 0) {
                Err(FormatError::ShapeOverflow { tensor }) => assert_eq!(tensor, "a"),
                other => panic!("{json}: {other:?}"),
            }
        }
    }

    #[test]
    fn misaligned_bits() {
        let json = r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#;
        match parse(json, 2) {
            Err(FormatError::MisalignedBits { tensor, bits: 12 }) => assert_eq!(tensor, "a"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn length_mismatch() {
        let json = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#;
        match parse(json, 12) {
            Err(FormatError::LengthMismatch { tensor, expected: 16, found: 12 }) => {
                assert_eq!(tensor, "w")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn incomplete_data_truncated_and_trailing() {
        let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        let data_start = N_LEN + json.len() as u64;
        let err = parse(json, 3).unwrap_err();
        assert!(matches!(err, FormatError::IncompleteData { data_len: 4, .. }), "{err:?}");
        assert!(err.to_string().contains("truncated"), "{err}");
        let err = parse(json, 6).unwrap_err();
        match &err {
            FormatError::IncompleteData { data_start: s, data_len: 4, file_len } => {
                assert_eq!((*s, *file_len), (data_start, data_start + 6))
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().starts_with("2 trailing bytes"), "{err}");
        assert!(matches!(parse("{}", 4), Err(FormatError::IncompleteData { data_len: 0, .. })));
    }

    #[test]
    fn incomplete_data_message_survives_offsets_near_u64_max() {
        // Eight tensors of 2^61 - 1 bytes each end at 2^64 - 8, so `8 + N + end` overflows.
        let size = (1u64 << 61) - 1;
        let entries: Vec<String> = (0..8u64)
            .map(|i| {
                let (begin, end) = (i * size, (i + 1) * size);
                let entry = r#"{"dtype":"U8","shape":[SIZE],"data_offsets":[BEGIN,END]}"#;
                let entry = entry.replace("SIZE", &size.to_string());
                let entry = entry.replace("BEGIN", &begin.to_string());
                format!("\"t{i}\":{}", entry.replace("END", &end.to_string()))
            })
            .collect();
        let err = parse(&format!("{{{}}}", entries.join(",")), 0).unwrap_err();
        assert!(matches!(err, FormatError::IncompleteData { .. }), "{err:?}");
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn io_errors_carry_the_failed_read() {
        match read_header(|_, _| Err(io::Error::other("disk on fire")), 100) {
            Err(FormatError::Io { offset: 0, len: 8, error }) => {
                assert_eq!(error.to_string(), "disk on fire")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn messages_escape_control_characters_and_cut_long_names() {
        let err = FormatError::ShapeOverflow { tensor: "a\0b\u{1b}[2J\n".into() };
        assert_eq!(
            err.to_string(),
            "tensor `a\\0b\\u{1b}[2J\\n` has a shape whose element or bit count overflows 64 bits"
        );
        let long = "é".repeat(300);
        let shown = FormatError::ShapeOverflow { tensor: long }.to_string();
        assert!(shown.contains(&format!("{}…[400 more bytes]`", "é".repeat(100))), "{shown}");
    }

    /// Writers may pad before the JSON to align the data section (reference PR #686).
    #[test]
    fn leading_whitespace_is_accepted() {
        let header = parse(" \n\t{}", 0).unwrap();
        assert_eq!(header.header_len, 5);
        assert!(header.tensors.is_empty());
    }

    /// The reference writer pads with spaces; other JSON whitespace is accepted too.
    #[test]
    fn trailing_whitespace_padding_is_accepted() {
        let json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}} \r\n\t   ";
        let header = parse(json, 2).unwrap();
        assert_eq!(header.data_start(), N_LEN + json.len() as u64);
        let start = header.data_start();
        assert_eq!(header.tensor_range(&header.tensors[0]), start..start + 2);
    }

    /// serde's map keeps the last of two identical entries, as the reference does.
    #[test]
    fn identical_duplicate_keys_are_accepted() {
        let entry = r#"{"dtype":"U8","shape":[2],"data_offsets":[0,2]}"#;
        let header = parse(&format!("{{\"a\":{entry},\"a\":{entry}}}"), 2).unwrap();
        assert_eq!(names(&header), ["a"]);
    }

    /// The reference does not deny unknown fields, whatever the JSON schema says.
    #[test]
    fn extra_fields_in_entries_are_ignored() {
        let json = r#"{"a":{"foo":[1,{"x":null}],"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        assert_eq!(names(&parse(json, 1).unwrap()), ["a"]);
    }

    #[test]
    fn null_and_present_metadata() {
        assert_eq!(parse(r#"{"__metadata__":null}"#, 0).unwrap().metadata, None);
        let header = parse(r#"{"__metadata__":{"format":"pt","b":""}}"#, 0).unwrap();
        let expected = BTreeMap::from([("b".into(), String::new()), ("format".into(), "pt".into())]);
        assert_eq!(header.metadata, Some(expected));
    }

    #[test]
    fn zero_size_tensors_share_an_offset_and_sort_by_name() {
        let json = r#"{"z":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},
                       "b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                       "a":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]}}"#;
        let header = parse(json, 2).unwrap();
        assert_eq!(names(&header), ["a", "z", "b"]);
    }

    #[test]
    fn scalar_and_sub_byte_shapes() {
        let scalar = parse(r#"{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}"#, 8).unwrap();
        assert_eq!(scalar.tensors[0].shape, Vec::<u64>::new());
        let f4 = parse(r#"{"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}"#, 2).unwrap();
        assert_eq!(f4.tensors[0].byte_len(), 2);
        let f6 = parse(r#"{"q":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}"#, 3).unwrap();
        assert_eq!(f6.tensors[0].byte_len(), 3);
    }

    #[test]
    fn empty_object_with_no_data() {
        let header = parse("{}", 0).unwrap();
        assert_eq!((header.header_len, header.file_len), (2, 10));
        assert!(header.tensors.is_empty() && header.metadata.is_none());
    }

    type Tensors = BTreeMap<String, (Dtype, Vec<u64>, Vec<u8>)>;

    /// Valid tensors: small shapes, a dimension of 8 added where sub-byte dtypes need it.
    fn arb_tensors() -> impl Strategy<Value = Tensors> {
        let dtype = proptest::sample::select(Dtype::ALL.to_vec());
        let tensor = (dtype, prop::collection::vec(0u64..5, 0..4), any::<u8>()).prop_map(|(dtype, mut shape, seed)| {
            if shape.iter().product::<u64>() * dtype.bitsize() % 8 != 0 {
                shape.push(8);
            }
            let len = shape.iter().product::<u64>() * dtype.bitsize() / 8;
            let data = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            (dtype, shape, data)
        });
        let name = "[^\n]{0,12}".prop_filter("reserved key", |n| n != "__metadata__");
        prop::collection::btree_map(name, tensor, 0..6)
    }

    fn arb_metadata() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
        prop::option::of(prop::collection::btree_map("[^\n]{0,8}", "[^\n]{0,8}", 0..3))
    }

    fn write(tensors: &Tensors, metadata: Option<&BTreeMap<String, String>>) -> Vec<u8> {
        let list: Vec<_> = tensors
            .iter()
            .map(|(name, (dtype, shape, data))| (name.clone(), *dtype, shape.clone(), data.clone()))
            .collect();
        serialize(&list, metadata).unwrap()
    }

    /// Cases for the never-panic properties; CI raises it through `STFS_FUZZ_CASES`.
    fn fuzz_cases() -> u32 {
        std::env::var("STFS_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
    }

    /// Pieces of plausible and hostile headers, so random headers reach the validator often.
    const JSON_TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        " ",
        "null",
        "\"a\"",
        "\"b\"",
        "\"__metadata__\"",
        "\"dtype\"",
        "\"F32\"",
        "\"F4\"",
        "\"U8\"",
        "\"shape\"",
        "\"data_offsets\"",
        "0",
        "1",
        "2",
        "4",
        "8",
        "3",
        "-1",
        "1.5",
        "1e400",
        "18446744073709551615",
        "18446744073709551616",
        "\"\\u0000\"",
        "\"x\"",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn written_files_parse_back_to_the_same_tensors(
            tensors in arb_tensors(),
            metadata in arb_metadata(),
        ) {
            let bytes = write(&tensors, metadata.as_ref());
            let header = parse_file(&bytes).unwrap();
            prop_assert_eq!(header.data_start() % 8, 0);
            prop_assert_eq!(&header.metadata, &metadata);
            let mut parsed = Tensors::new();
            for t in &header.tensors {
                let range = header.tensor_range(t);
                let data = bytes[range.start as usize..range.end as usize].to_vec();
                parsed.insert(t.name.clone(), (t.dtype, t.shape.clone(), data));
            }
            prop_assert_eq!(parsed, tensors);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: fuzz_cases(),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_file(&bytes);
        }

        #[test]
        fn random_token_headers_never_panic(
            tokens in prop::collection::vec(proptest::sample::select(JSON_TOKENS), 0..64),
            data_len in 0usize..12,
        ) {
            let _ = parse_file(&file(tokens.concat().as_bytes(), data_len));
        }

        /// The fast deserializer and the reference-shaped one accept exactly the same documents.
        #[test]
        fn fast_and_reference_deserializers_agree(
            tokens in prop::collection::vec(proptest::sample::select(JSON_TOKENS), 0..64),
            tensors in arb_tensors(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut valid = write(&tensors, None);
            let n = 8 + u64::from_le_bytes(valid[..8].try_into().unwrap()) as usize;
            let at = 8 + at.index(n - 8);
            valid[at] = byte;
            for doc in [tokens.concat().into_bytes(), valid[8..n].to_vec()] {
                let Ok(text) = std::str::from_utf8(&doc) else { continue };
                let fast = serde_json::from_str::<FastHeader>(text).map(|h| (h.metadata, h.tensors.into_iter().map(|(k, t)| (k, t.dtype, t.shape, t.data_offsets)).collect::<Vec<_>>()));
                let reference = serde_json::from_str::<HashMetadata>(text).map(|h| (h.metadata, h.tensors.into_iter().map(|(k, t)| (k, t.dtype, t.shape, t.data_offsets)).collect::<Vec<_>>()));
                prop_assert_eq!(fast.ok(), reference.ok(), "{}", text);
            }
        }

        #[test]
        fn mutated_valid_files_never_panic(
            tensors in arb_tensors(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            truncate in any::<bool>(),
        ) {
            let mut bytes = write(&tensors, None);
            let at = at.index(bytes.len());
            if truncate {
                bytes.truncate(at);
            } else {
                bytes[at] = byte;
            }
            let _ = parse_file(&bytes);
        }
    }
}
