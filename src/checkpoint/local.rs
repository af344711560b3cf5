//! Local checkpoints opened from the files they are: a directory's own `*.safetensors` entries
//! as shards ([`open_dir`]), and the shards a local `*.index.json` names ([`open_index`]); every
//! file opened by the folder's link rule ([`Confinement`]).

use std::path::Path;

use super::confined::Confinement;
use super::error::{OpenError, OpenProblem};
use super::index_file::{directory_index_files, read_index_file, MAX_DIRECTORY_INDEX_TOTAL, MAX_INDEX_SIZE};
use super::shard::{checked, file_name, open_all, open_confined, Checkpoint, RootFile};
use crate::format::index;

/// Every `*.safetensors` entry of `dir`, in name order, as one checkpoint; its
/// `*.safetensors.index.json` files come along (read whole, to be re-served, within
/// [`MAX_DIRECTORY_INDEX_TOTAL`] together), unchecked.
///
/// Each `*.safetensors` entry is opened whatever it is, so one that is not a readable regular file
/// (a dangling or looping link, a FIFO, a directory) or that resolves outside the folder `rule`
/// confines reading to is an error naming it, as a shard an index names is, never a checkpoint
/// served without its tensors. An index file that resolves outside is left out with a warning.
pub(super) fn open_dir(dir: &Path, rule: &Confinement) -> Result<Checkpoint, OpenError> {
    let name = dir.display().to_string();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .and_then(|listing| listing.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>())
        .map_err(|e| OpenError::new(&name, e))?;
    entries.sort();
    let files: Vec<_> = entries.iter().filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect();
    if files.is_empty() {
        return Err(OpenError::new(&name, OpenProblem::NoShardFiles));
    }
    let indexes: Vec<_> =
        entries.iter().filter(|p| p.to_str().is_some_and(|p| p.ends_with(".safetensors.index.json"))).collect();
    let index_files = directory_index_files(&indexes, MAX_DIRECTORY_INDEX_TOTAL, rule);
    let shards = open_all(&files, |f| open_confined(f, rule))?;
    checked(&name, shards, None, index_files)
}

/// The shards named by a local index file; the index and every shard are opened by `rule` (the
/// folder they must resolve inside), so either resolving outside is an error naming it.
pub(super) fn open_index(path: &Path, rule: &Confinement) -> Result<Checkpoint, OpenError> {
    let name = path.display().to_string();
    let index_file = read_index_file(path, MAX_INDEX_SIZE, rule).map_err(|e| OpenError::new(&name, e))?;
    let (bytes, local_mode) = (index_file.bytes, Some(index_file.mode));
    let mut index = index::parse_index(&bytes).map_err(|e| OpenError::new(&name, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    // One file named two ways (`a.safetensors`, `./a.safetensors`, a symbolic link to it) is one
    // shard: compared by canonical path, or, for a file that is not there, by its lexical one.
    index.merge_spellings(|f| {
        let lexical = std::path::absolute(dir.join(index::without_dot_segments(f))).unwrap_or_else(|_| dir.join(f));
        std::fs::canonicalize(&lexical).unwrap_or(lexical)
    });
    let files: Vec<_> = index.shards.iter().map(|f| dir.join(f)).collect();
    let opened = open_all(&files, |f| open_confined(f, rule))?;
    let index_files = file_name(&name).map(|name| RootFile { name, bytes, local_mode }).into_iter().collect();
    checked(&name, opened, Some(&index), index_files)
}
