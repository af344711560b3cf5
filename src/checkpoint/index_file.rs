//! Local index files read into memory: only a regular file inside the model's folder (its link
//! rule, [`Confinement`]), and never more than a bound, one by one and, for those a directory of
//! shards re-serves, all together.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::confined::{Confinement, SmallFile};
use super::error::OpenProblem;
use super::shard::{file_name, RootFile};
use crate::format::PrintablePath;

/// Largest index file read: real ones are well under 10 MB even for thousands of tensors.
pub(super) const MAX_INDEX_SIZE: usize = 64 << 20;

/// Most bytes of index files a directory of shards re-serves, all together (held in the daemon's
/// memory for the life of the mount): two of the largest read, as the small files beside a
/// checkpoint are bounded together too.
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

/// The index files at `paths` (a directory's `*.safetensors.index.json`), read to be re-served, in
/// name order: each as [`read_index_file`] reads it, taken smallest first while together they stay
/// within `total` bytes. They are served, never interpreted, so one that cannot be read or does not
/// fit is left out with a warning naming it, never an error.
pub(super) fn directory_index_files(paths: &[&PathBuf], total: usize, rule: &Confinement) -> Vec<RootFile> {
    let mut by_size: Vec<(u64, &Path)> =
        paths.iter().map(|p| (std::fs::metadata(p).map_or(0, |m| m.len()), p.as_path())).collect();
    by_size.sort();
    let mut files = Vec::new();
    let mut left = total;
    for (_, path) in by_size {
        let shown = path.display().to_string();
        match read_index_file(path, MAX_INDEX_SIZE.min(left), rule) {
            Ok(SmallFile { bytes, mode }) => {
                left -= bytes.len();
                files.extend(file_name(&shown).map(|name| RootFile { name, bytes, local_mode: Some(mode) }));
            }
            Err(OpenProblem::IndexTooLarge { len, .. }) if len <= MAX_INDEX_SIZE => log::warn!(
                "{}: not re-served: the directory's index files would take over {total} bytes together",
                PrintablePath(&shown)
            ),
            Err(problem) => log::warn!("{}: not re-served: {problem}", PrintablePath(&shown)),
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
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

    /// Index files are held in memory for the life of a mount: those of a directory are bounded
    /// together, smallest first, and one that cannot be read is left out.
    #[test]
    fn a_directory_re_serves_index_files_within_a_total() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> =
            ["a", "b", "c", "d", "e"].iter().map(|n| dir.path().join(format!("{n}.safetensors.index.json"))).collect();
        for (path, len) in paths.iter().zip([40, 30, 20, 10]) {
            crate::util::test_support::write_new(path, vec![b' '; len]);
        }
        std::os::unix::fs::symlink("/dev/zero", &paths[4]).unwrap();
        let paths: Vec<&PathBuf> = paths.iter().collect();
        let rule = Confinement::of(dir.path()).unwrap();
        let files = directory_index_files(&paths, 65, &rule);
        let names: Vec<(&str, usize)> = files.iter().map(|f| (f.name.as_str(), f.bytes.len())).collect();
        assert_eq!(
            names,
            [("b.safetensors.index.json", 30), ("c.safetensors.index.json", 20), ("d.safetensors.index.json", 10)]
        );
        assert_eq!(directory_index_files(&paths, 100, &rule).len(), 4);
    }
}
