//! [`FormatError`]: one variant per broken header rule, each message quoting the tensor it concerns
//! (escaped by [`super::escape`], so hostile names stay printable).

use std::fmt;
use std::io;

use super::escape::Printable;
use super::foreign::PyTorchFormat;
use super::header::N_LEN;

/// Every way a file can fail to be a valid safetensors file; one variant per rule.
#[derive(Debug)]
pub enum FormatError {
    /// The file is shorter than the 8-byte header-length prefix.
    HeaderTooSmall {
        /// Length of the file in bytes.
        file_len: u64,
    },
    /// The declared header length is over [`MAX_HEADER_SIZE`](super::header::MAX_HEADER_SIZE), checked
    /// before anything is allocated.
    HeaderTooLarge {
        /// Header length the prefix declares.
        declared: u64,
        /// The limit it exceeds.
        limit: u64,
    },
    /// The declared header length reaches past the end of the file.
    HeaderLengthPastEnd {
        /// Header length the prefix declares.
        declared: u64,
        /// Length of the file in bytes.
        file_len: u64,
    },
    /// The file is not a safetensors file but a PyTorch checkpoint: its first bytes, which make no
    /// header length, are those of a `torch.save` zip archive or pickle.
    PyTorch {
        /// Which kind of PyTorch file.
        format: PyTorchFormat,
    },
    /// The header bytes are not UTF-8.
    InvalidUtf8 {
        /// Where in the header the bad sequence starts, and how long it is.
        error: std::str::Utf8Error,
    },
    /// The header is not JSON of the expected shape (serde's message, non-printables escaped).
    InvalidJson {
        /// serde_json's description, including line and column.
        message: String,
    },
    /// A tensor's end offset is before its begin offset.
    OffsetReversed {
        /// Name of the tensor.
        tensor: String,
        /// Its begin offset.
        begin: u64,
        /// Its end offset, smaller than `begin`.
        end: u64,
    },
    /// A tensor starts after the previous one ends (or after 0 for the first): a hole in the data.
    OffsetGap {
        /// Name of the tensor.
        tensor: String,
        /// Where it had to start: the end of the previous tensor, or 0.
        expected: u64,
        /// Where it starts.
        found: u64,
    },
    /// A tensor starts before the previous one ends.
    OffsetOverlap {
        /// Name of the tensor.
        tensor: String,
        /// Where it had to start: the end of the previous tensor.
        expected: u64,
        /// Where it starts.
        found: u64,
    },
    /// The element count or bit count of a tensor's shape overflows 64 bits.
    ShapeOverflow {
        /// Name of the tensor.
        tensor: String,
    },
    /// A tensor of a sub-byte dtype does not fill a whole number of bytes.
    MisalignedBits {
        /// Name of the tensor.
        tensor: String,
        /// Bits its shape and dtype add up to.
        bits: u64,
    },
    /// A tensor's byte range does not match the size its dtype and shape imply.
    LengthMismatch {
        /// Name of the tensor.
        tensor: String,
        /// Bytes implied by dtype and shape.
        expected: u64,
        /// Bytes its data offsets cover.
        found: u64,
    },
    /// The tensor data does not end exactly at the end of the file (truncated, or trailing bytes).
    IncompleteData {
        /// Absolute offset of the data section (`8 + N`).
        data_start: u64,
        /// Bytes the tensors cover, from `data_start`.
        data_len: u64,
        /// Length of the file in bytes.
        file_len: u64,
    },
    /// Reading the prefix or the header failed.
    Io {
        /// Absolute offset of the failed read.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The underlying error.
        error: io::Error,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use FormatError::*;
        match self {
            HeaderTooSmall { file_len } => {
                write!(
                    f,
                    "not a safetensors file: it is {file_len} bytes, too small for the {N_LEN}-byte header length"
                )
            }
            HeaderTooLarge { declared, limit } => {
                write!(f, "not a safetensors file: header length {declared} is over the limit of {limit} bytes")
            }
            HeaderLengthPastEnd { declared, file_len } => write!(
                f,
                "not a safetensors file, or a truncated one: header length {declared} runs past the end of the \
                 file ({file_len} bytes)"
            ),
            PyTorch { format } => write!(
                f,
                "not a safetensors file: it looks like a PyTorch checkpoint ({format}); convert it with \
                 safetensors' conversion tools, e.g. `safetensors.torch.save_file(torch.load(path, \
                 weights_only=True), \"model.safetensors\")`"
            ),
            InvalidUtf8 { error } => write!(f, "invalid UTF-8 in header: {error}"),
            InvalidJson { message } => write!(f, "invalid JSON in header: {message}"),
            OffsetReversed { tensor, begin, end } => {
                write!(f, "tensor `{}` ends at {end}, before it begins at {begin}", Printable(tensor))
            }
            OffsetGap { tensor, expected, found } => write!(
                f,
                "tensor `{}` starts at {found}, expected {expected} (a hole of {} bytes)",
                Printable(tensor),
                found.saturating_sub(*expected)
            ),
            OffsetOverlap { tensor, expected, found } => write!(
                f,
                "tensor `{}` starts at {found}, expected {expected} (overlaps the previous tensor)",
                Printable(tensor)
            ),
            ShapeOverflow { tensor } => {
                write!(f, "tensor `{}` has a shape whose element or bit count overflows 64 bits", Printable(tensor))
            }
            MisalignedBits { tensor, bits } => {
                write!(f, "tensor `{}` holds {bits} bits, not a whole number of bytes", Printable(tensor))
            }
            LengthMismatch { tensor, expected, found } => write!(
                f,
                "tensor `{}` covers {found} bytes, expected {expected} from its dtype and shape",
                Printable(tensor)
            ),
            IncompleteData { data_start, data_len, file_len } => {
                // u128 so that a hostile end offset cannot overflow the message itself.
                let data_end = u128::from(*data_start) + u128::from(*data_len);
                let file_len = u128::from(*file_len);
                if data_end > file_len {
                    write!(
                        f,
                        "tensor data ends at {data_end} but the file has only {file_len} bytes \
                         (truncated)"
                    )
                } else {
                    write!(f, "{} trailing bytes after the tensor data, which ends at {data_end}", file_len - data_end)
                }
            }
            Io { offset, len, error } => {
                write!(f, "reading {len} header bytes at offset {offset} failed: {error}")
            }
        }
    }
}

impl std::error::Error for FormatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FormatError::InvalidUtf8 { error } => Some(error),
            FormatError::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}
