//! Local index files read into memory: only a regular file inside the model's folder (its link
//! rule, [`Confinement`]), and never more than a bound, one by one and (`every_checkpoint`) for
//! those of one folder all together.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::confined::{Confinement, SmallFile};
use super::error::OpenProblem;

/// Largest index file read: real ones are well under 10 MB even for thousands of tensors.
pub(super) const MAX_INDEX_SIZE: usize = 64 << 20;

/// Most bytes of index files the checkpoints of one folder re-serve, all together (held in the
/// daemon's memory for the life of the mount): two of the largest read, as the small files beside
/// a checkpoint are bounded together too.
pub(super) const MAX_DIRECTORY_INDEX_TOTAL: usize = 128 << 20;

/// The local index file at `path`, if it is a regular file that resolves inside the folder `rule`
/// confines reading to ([`Confinement::open`]) and holds at most `limit` bytes: a FIFO, a device
/// or a directory is refused before it is read (as a shard is), and a file longer than `limit`,
/// by its length or by what a read finds (it may grow while it is read), is
/// [`OpenProblem::IndexTooLarge`]; never more than `limit + 1` bytes are read.
pub(super) fn read_index_file(path: &Path, limit: usize, rule: &Confinement) -> Result<SmallFile, OpenProblem> {
    let (file, meta) = rule.open(path)?;
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
    Ok(SmallFile { bytes, mode: meta.mode() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_up_to_the_limit_and_refused_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors.index.json");
        crate::util::test_support::write_new(&path, b"12345");
        let rule = Confinement::of(dir.path()).unwrap();
        assert_eq!(read_index_file(&path, 5, &rule).unwrap().bytes, b"12345");
        let too_large = read_index_file(&path, 4, &rule).unwrap_err();
        assert!(matches!(too_large, OpenProblem::IndexTooLarge { len: 5, limit: 4 }), "{too_large:?}");
    }
}
