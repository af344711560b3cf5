//! Reading a header: the length prefix through a caller's read function, then the JSON into the
//! same serde shapes as the reference crate, by a fast path that accepts exactly what the reference
//! accepts and falls back to the reference's own shapes for its error messages.
//!
//! The rules themselves, and their order, are in [`super::validate`]; this file only calls them.

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use super::dtype::Dtype;
use super::error::FormatError;
use super::escape::write_escaped;
use super::foreign::PyTorchFormat;
use super::header::{Header, TensorInfo, N_LEN};
use super::validate::{check_data_end, check_header_len, validate_tensors};

/// Longest JSON error message kept; serde quotes hostile input (e.g. unknown dtype names) verbatim.
const MAX_SHOWN_MESSAGE: usize = 400;

/// The header as the reference crate deserializes it. Field and type names match the reference
/// (serde names a flattened struct by its Rust name), so errors such as "duplicate field
/// `__metadata__`" or "expected struct HashMetadata" read the same.
#[derive(serde::Deserialize)]
pub(super) struct HashMetadata {
    #[serde(rename = "__metadata__")]
    pub(super) metadata: Option<BTreeMap<String, String>>,
    /// A repeated tensor name keeps its last entry, as serde's map does in the reference.
    #[serde(flatten)]
    pub(super) tensors: BTreeMap<String, RawTensor>,
}

/// One tensor entry; unknown fields are ignored, as in the reference (no `deny_unknown_fields`).
#[derive(serde::Deserialize)]
#[serde(rename = "TensorInfo")]
pub(super) struct RawTensor {
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<u64>,
    pub(super) data_offsets: (u64, u64),
}

/// The accepting fast path: the same document as [`HashMetadata`], deserialized straight into maps.
/// serde's `flatten` (which the reference uses) first buffers the whole document as generic values,
/// costing tens of times a large header's size in memory; this visitor does not. It accepts exactly
/// what the reference accepts (unknown entry fields are read as JSON values, so the parser's nesting
/// limit applies to them as it does under `flatten`); on any error, [`parse_header`] parses again the
/// reference's way to report the reference's own message.
pub(super) struct FastHeader {
    pub(super) metadata: Option<BTreeMap<String, String>>,
    pub(super) tensors: BTreeMap<String, RawTensor>,
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
    let data_start = check_header_len(header_len, file_len)?;
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
    check_data_end(data_start, data_len, file_len)?;
    Ok(Header { header_len, tensors, metadata: raw.metadata, file_len })
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
    check_header_len(declared, file_len).map_err(|error| match PyTorchFormat::sniff(&prefix) {
        Some(format) => FormatError::PyTorch { format },
        None => error,
    })?;
    // declared <= MAX_HEADER_SIZE, which fits in usize on every target.
    let mut json = vec![0u8; declared as usize];
    read_exact_at(&mut json, N_LEN).map_err(|error| FormatError::Io { offset: N_LEN, len: declared, error })?;
    parse_header(&json, file_len)
}
