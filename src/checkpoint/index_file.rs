//! Local index files read into memory: only a regular file, and never more than a bound.

use std::io::Read;
use std::path::Path;

use super::error::OpenProblem;
use crate::source::open_regular;

/// Largest index file read: real ones are well under 10 MB even for thousands of tensors.
pub(super) const MAX_INDEX_SIZE: usize = 64 << 20;

/// The bytes of the local index file at `path`, if it is a regular file (links followed) of at
/// most `limit` bytes: a FIFO, a device or a directory is refused before it is read (as a shard
/// is), and a file longer than `limit`, by its length or by what a read finds (it may grow while
/// it is read), is [`OpenProblem::IndexTooLarge`]; never more than `limit + 1` bytes are read.
pub(super) fn read_index_file(path: &Path, limit: usize) -> Result<Vec<u8>, OpenProblem> {
    let (file, meta) = open_regular(path)?;
    let too_large = |len: u64| OpenProblem::IndexTooLarge { len: usize::try_from(len).unwrap_or(usize::MAX), limit };
    if meta.len() > limit as u64 {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&file).take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        // It grew while it was read: its length now, or at least what was read.
        let now = file.metadata().map_or(0, |m| m.len());
        return Err(too_large(now.max(bytes.len() as u64)));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_up_to_the_limit_and_refused_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors.index.json");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_index_file(&path, 5).unwrap(), b"12345");
        let too_large = read_index_file(&path, 4).unwrap_err();
        assert!(matches!(too_large, OpenProblem::IndexTooLarge { len: 5, limit: 4 }), "{too_large:?}");
    }
}
