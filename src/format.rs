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

use crate::source::SourceStream;

mod error;
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
    BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
    I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
}

impl Dtype {
    /// Every dtype, in enum order.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL, Dtype::F4, Dtype::F6_E2M3, Dtype::F6_E3M2, Dtype::U8, Dtype::I8, Dtype::F8_E5M2,
        Dtype::F8_E4M3, Dtype::F8_E8M0, Dtype::F8_E4M3FNUZ, Dtype::F8_E5M2FNUZ, Dtype::I16,
        Dtype::U16, Dtype::F16, Dtype::BF16, Dtype::I32, Dtype::U32, Dtype::F32, Dtype::C64,
        Dtype::F64, Dtype::I64, Dtype::U64,
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
            "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
            "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
            "F64", "I64", "U64",
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
        Dtype::ALL
            .into_iter()
            .find(|dtype| dtype.name() == s)
            .ok_or_else(|| UnknownDtype { name: s.to_owned() })
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

/// The header as the reference crate deserializes it (`HashMetadata`); the serde names match it,
/// so errors such as "duplicate field `__metadata__`" read the same.
#[derive(serde::Deserialize)]
#[serde(rename = "HashMetadata")]
struct RawHeader {
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

/// Validates a header given its JSON bytes (exactly N bytes after the prefix) and the file length.
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
    let raw: RawHeader = serde_json::from_str(text).map_err(|error| {
        let mut message = String::new();
        // Writing into a String cannot fail.
        let _ = write_escaped(&mut message, &error.to_string(), MAX_SHOWN_MESSAGE);
        FormatError::InvalidJson { message }
    })?;
    let mut tensors: Vec<TensorInfo> = raw
        .tensors
        .into_iter()
        .map(|(name, raw)| TensorInfo {
            name,
            dtype: raw.dtype,
            shape: raw.shape,
            data_offsets: raw.data_offsets,
        })
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
            return Err(FormatError::OffsetGap {
                tensor: tensor.name.clone(),
                expected: expected_start,
                found: begin,
            });
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
        let bits =
            elements.and_then(|n| n.checked_mul(tensor.dtype.bitsize())).ok_or_else(overflow)?;
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

/// Reads the prefix and JSON through `stream` and validates them against `file_len`.
pub fn read_header(stream: &mut dyn SourceStream, file_len: u64) -> Result<Header, FormatError> {
    if file_len < N_LEN {
        return Err(FormatError::HeaderTooSmall { file_len });
    }
    let mut prefix = [0u8; N_LEN as usize];
    stream
        .read_exact_at(&mut prefix, 0)
        .map_err(|error| FormatError::Io { offset: 0, len: N_LEN, error })?;
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
    stream
        .read_exact_at(&mut json, N_LEN)
        .map_err(|error| FormatError::Io { offset: N_LEN, len: declared, error })?;
    parse_header(&json, file_len)
}
