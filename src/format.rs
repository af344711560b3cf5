//! The safetensors header: parsed and validated in one place, by the reference crate's rules; dtypes.
//! (API fixed by the lead; the body is being written by the format helper.)

use std::collections::BTreeMap;
use std::fmt;

use crate::source::SourceStream;

/// Size of the little-endian header-length prefix.
pub const N_LEN: u64 = 8;
/// Largest header the reference crate accepts (safetensors 0.8 `MAX_HEADER_SIZE`).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;

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
        todo!()
    }

    /// The JSON spelling (`"BF16"`).
    pub fn name(self) -> &'static str {
        todo!()
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    /// Byte length of the tensor's data.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
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
}

/// Every way a file can fail to be a valid safetensors file; one variant per rule.
#[derive(Debug)]
pub enum FormatError {
    /// Placeholder until the format helper lands the real variants.
    Todo,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for FormatError {}

/// Validates a header given its JSON bytes (exactly N bytes after the prefix) and the file length.
pub fn parse_header(json: &[u8], file_len: u64) -> Result<Header, FormatError> {
    let _ = (json, file_len);
    todo!()
}

/// Reads the prefix and JSON through `stream` and validates them against `file_len`.
pub fn read_header(stream: &mut dyn SourceStream, file_len: u64) -> Result<Header, FormatError> {
    let _ = (stream, file_len);
    todo!()
}
