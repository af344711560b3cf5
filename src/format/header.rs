//! The parsed header: [`Header`] and its [`TensorInfo`] entries, and the constants of the layout
//! (the 8-byte length prefix, the reference crate's header size limit).

use std::collections::BTreeMap;
use std::ops::Range;

use super::dtype::Dtype;

/// Size of the little-endian header-length prefix.
pub const N_LEN: u64 = 8;
/// Largest header the reference crate accepts (safetensors 0.8 `MAX_HEADER_SIZE`).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;

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
