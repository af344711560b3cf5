//! Writes safetensors files the way the reference writer lays them out (for tests and samples).
//!
//! Layout as in safetensors 0.8 `serialize`: tensors ordered by dtype, largest enum value first
//! (the reference's "descending alignment"), then by name; data packed back to back with no
//! padding; compact JSON with `__metadata__` first and tensors in offset order; the header padded
//! with spaces to a multiple of 8 so that the data section starts 8-byte aligned. The result is
//! checked with [`parse_header`], so the writer and the reader enforce the same rules.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::dtype::Dtype;
use super::error::FormatError;
use super::header::N_LEN;
use super::parse::parse_header;

/// Why a set of tensors cannot be written.
#[derive(Debug)]
pub enum WriteError {
    /// Two tensors share a name; JSON keys must be unique.
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// The file would break a format rule (for example data not matching dtype and shape).
    Invalid {
        /// The rule the reader would report.
        error: FormatError,
    },
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::DuplicateName { name } => {
                write!(f, "tensor name {name:?} is given more than once")
            }
            WriteError::Invalid { error } => write!(f, "would write an invalid file: {error}"),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WriteError::Invalid { error } => Some(error),
            WriteError::DuplicateName { .. } => None,
        }
    }
}

/// One header entry, with the reference's field order.
#[derive(serde::Serialize)]
struct Entry<'a> {
    dtype: Dtype,
    shape: &'a [u64],
    data_offsets: (u64, u64),
}

/// Serializes `(name, dtype, shape, little-endian data)` tensors and optional metadata into the
/// bytes of a complete safetensors file.
pub fn serialize(
    tensors: &[(String, Dtype, Vec<u64>, Vec<u8>)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>, WriteError> {
    let mut seen = BTreeSet::new();
    for (name, ..) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(WriteError::DuplicateName { name: name.clone() });
        }
    }
    let mut order: Vec<&(String, Dtype, Vec<u64>, Vec<u8>)> = tensors.iter().collect();
    order.sort_by_key(|(name, dtype, ..)| (Reverse(*dtype), name.as_str()));

    let mut json = String::from("{");
    if let Some(metadata) = metadata {
        json.push_str("\"__metadata__\":");
        json.push_str(&to_json(metadata));
    }
    // The buffers are in memory, so their total length fits in usize and hence in u64.
    let mut offset = 0u64;
    for (name, dtype, shape, data) in &order {
        let end = offset + data.len() as u64;
        if json.len() > 1 {
            json.push(',');
        }
        json.push_str(&to_json(name));
        json.push(':');
        json.push_str(&to_json(&Entry { dtype: *dtype, shape, data_offsets: (offset, end) }));
        offset = end;
    }
    json.push('}');
    let padded_len = json.len().next_multiple_of(N_LEN as usize);
    let mut header = json.into_bytes();
    header.resize(padded_len, b' ');

    let file_len = N_LEN + header.len() as u64 + offset;
    parse_header(&header, file_len).map_err(|error| WriteError::Invalid { error })?;

    let mut out = Vec::with_capacity(file_len as usize);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for (.., data) in &order {
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// Compact JSON for values whose serialization cannot fail (string keys, plain fields).
fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("maps with string keys and plain structs always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    type Tensor = (String, Dtype, Vec<u64>, Vec<u8>);

    fn tensor(name: &str, dtype: Dtype, shape: &[u64], data: &[u8]) -> Tensor {
        (name.to_owned(), dtype, shape.to_vec(), data.to_vec())
    }

    fn header_text(bytes: &[u8]) -> &str {
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        std::str::from_utf8(&bytes[8..8 + len]).unwrap()
    }

    /// The reference's `test_empty`: `{}` padded with six spaces.
    #[test]
    fn empty_file_matches_the_reference_bytes() {
        let bytes = serialize(&[], None).unwrap();
        assert_eq!(bytes, b"\x08\0\0\0\0\0\0\0{}      ");
    }

    #[test]
    fn orders_by_descending_dtype_then_name_with_metadata_first() {
        let tensors = [
            tensor("b", Dtype::U8, &[3], &[1, 2, 3]),
            tensor("a", Dtype::U8, &[1], &[4]),
            tensor("w", Dtype::F32, &[], &[5, 6, 7, 8]),
        ];
        let metadata = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
        let bytes = serialize(&tensors, Some(&metadata)).unwrap();
        let text = header_text(&bytes);
        let expected = concat!(
            r#"{"__metadata__":{"format":"pt"},"#,
            r#""w":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"#,
            r#""a":{"dtype":"U8","shape":[1],"data_offsets":[4,5]},"#,
            r#""b":{"dtype":"U8","shape":[3],"data_offsets":[5,8]}}"#,
        );
        assert_eq!(text.trim_end(), expected);
        assert_eq!(text.len() % 8, 0);
        assert_eq!(&bytes[8 + text.len()..], [5, 6, 7, 8, 4, 1, 2, 3]);
        let header = crate::format::parse_header(text.as_bytes(), bytes.len() as u64).unwrap();
        let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["w", "a", "b"]);
    }

    #[test]
    fn rejects_duplicate_names() {
        let tensors = [tensor("x", Dtype::U8, &[1], &[0]), tensor("x", Dtype::I8, &[1], &[0])];
        match serialize(&tensors, None) {
            Err(WriteError::DuplicateName { name }) => assert_eq!(name, "x"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_data_that_does_not_match_dtype_and_shape() {
        let short = [tensor("w", Dtype::F32, &[2], &[0; 7])];
        match serialize(&short, None) {
            Err(WriteError::Invalid { error: FormatError::LengthMismatch { tensor, expected: 8, found: 7 } }) => {
                assert_eq!(tensor, "w")
            }
            other => panic!("{other:?}"),
        }
        let odd_nibbles = [tensor("q", Dtype::F4, &[3], &[0; 2])];
        assert!(matches!(
            serialize(&odd_nibbles, None),
            Err(WriteError::Invalid { error: FormatError::MisalignedBits { bits: 12, .. } })
        ));
    }
}
