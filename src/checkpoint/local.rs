//! Local checkpoints opened from the index they are: the shards a local `*.index.json` names
//! ([`open_index`]), every file opened by the folder's link rule ([`Confinement`]).

use std::path::Path;

use super::confined::Confinement;
use super::error::OpenError;
use super::index_file::{read_index_file, MAX_INDEX_SIZE};
use super::shard::{checked, file_name, open_all, open_confined, Checkpoint, RootFile};
use crate::format::index;

/// The shards named by a local index file; the index and every shard are opened by `rule` (the
/// folder they must resolve inside), so either resolving outside is an error naming it; an index
/// past `limit` bytes is refused before it is read.
pub(super) fn open_index(path: &Path, rule: &Confinement, limit: usize) -> Result<Checkpoint, OpenError> {
    let name = path.display().to_string();
    let index_file = read_index_file(path, limit.min(MAX_INDEX_SIZE), rule).map_err(|e| OpenError::new(&name, e))?;
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
