//! The reference crate's rules for a header (safetensors 0.8 `read_metadata` and
//! `Metadata::validate`), each broken one reported by its own [`FormatError`] variant.

use super::error::FormatError;
use super::header::{TensorInfo, MAX_HEADER_SIZE, N_LEN};

/// Checks a declared header length `declared` (N) against the limit, then against the file; returns
/// where the data section starts (`8 + N`). Both checks come before anything is allocated for it.
pub(super) fn check_header_len(declared: u64, file_len: u64) -> Result<u64, FormatError> {
    if declared > MAX_HEADER_SIZE {
        return Err(FormatError::HeaderTooLarge { declared, limit: MAX_HEADER_SIZE });
    }
    // declared <= MAX_HEADER_SIZE, so this cannot overflow.
    let data_start = N_LEN + declared;
    if data_start > file_len {
        return Err(FormatError::HeaderLengthPastEnd { declared, file_len });
    }
    Ok(data_start)
}

/// Checks tensors in offset order: contiguous from 0, and each exactly as long as its dtype and
/// shape imply. Returns the length of the data section they cover.
pub(super) fn validate_tensors(tensors: &[TensorInfo]) -> Result<u64, FormatError> {
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

/// Checks that the data the tensors cover ends exactly at the end of the file: no truncation, no
/// trailing bytes (which also rules out polyglot files).
pub(super) fn check_data_end(data_start: u64, data_len: u64, file_len: u64) -> Result<(), FormatError> {
    if data_start.checked_add(data_len) != Some(file_len) {
        return Err(FormatError::IncompleteData { data_start, data_len, file_len });
    }
    Ok(())
}
