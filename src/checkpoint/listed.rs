//! A model repository known by a listing of its files ([`Repository`]: an `hf://` repository at a
//! commit, an object store's prefix), laid out by the rule of `layout` ([`lay_out`]): its own
//! checkpoints (`in_folder`), each folder below with one as a component, the small files of the folders a mount
//! serves fetched whole. The source kinds differ only in how a file is opened and fetched.

use std::collections::HashMap;

use super::error::OpenError;
use super::every_checkpoint::open_every;
use super::in_folder;
use super::layout;
use super::shard::{checked, in_parallel, open_all, Checkpoint, Component, OpenedShard, RootFile};
use crate::format::index;
use crate::source::hub::{self, Choice, Sibling};

/// Small files fetched at once, at most.
const PARALLEL_FETCHES: usize = 4;

/// A repository's files, each named by its path from the repository's root.
pub(super) trait Repository: Sync {
    /// How the repository is named in messages (`hf://org/repo`, `s3://bucket/prefix/`).
    fn shown(&self) -> String;
    /// The file at `path` opened as a shard, its header read, its opening ended.
    fn open_shard(&self, path: &str) -> Result<OpenedShard, OpenError>;
    /// The bytes of the index at `path`, refused past `limit` bytes (at most any index's bound).
    fn fetch_index(&self, path: &str, limit: usize) -> Result<Vec<u8>, OpenError>;
    /// The bytes of the small file at `path` (within [`hub::SMALL_FILE_LIMIT`]).
    fn fetch_small(&self, path: &str) -> Result<Vec<u8>, OpenError>;
}

/// The checkpoint `choice` names, every shard opened (an index's shards beside it).
pub(super) fn open_choice(repo: &dyn Repository, choice: Choice, index_limit: usize) -> Result<Checkpoint, OpenError> {
    let shown = repo.shown();
    let open_one = |path: &String| repo.open_shard(path);
    match choice {
        Choice::Single(path) => Ok(Checkpoint::of(vec![open_one(&path)?])),
        Choice::Shards(paths) => {
            let opened = open_all(&paths, open_one)?;
            checked(&shown, opened, None, Vec::new())
        }
        Choice::Index(path) => {
            let bytes = repo.fetch_index(&path, index_limit)?;
            let mut index = index::parse_index(&bytes).map_err(|e| OpenError::new(format!("{shown}/{path}"), e))?;
            index.merge_spellings(index::without_dot_segments);
            let folder = folder_of(&path);
            let paths: Vec<String> =
                index.shards.iter().map(|f| folder.map_or(f.clone(), |d| format!("{d}/{f}"))).collect();
            let opened = open_all(&paths, open_one)?;
            let index_file = super::shard::file_name(&path).map(|name| RootFile::remote(name, bytes));
            checked(&shown, opened, Some(&index), index_file.into_iter().collect())
        }
    }
}

/// The repository below `prefix` (a folder of it with its `/`, or `""`), whose files `scoped`
/// lists without that prefix, laid out as it is: its own checkpoints when it holds one, each
/// folder with one a component, the checkpoints of each chosen among its own files by
/// `in_folder`'s rule, and with `repo_files` the small files of the folders a mount serves. One
/// that holds none, in it or below, is `nothing()`.
pub(super) fn lay_out(
    repo: &dyn Repository,
    prefix: &str,
    scoped: &[Sibling],
    nothing: impl Fn() -> OpenError,
    repo_files: bool,
) -> Result<Checkpoint, OpenError> {
    let shown = repo.shown();
    let root_has = layout::root_has_checkpoint(scoped);
    let folders = layout::component_folders(scoped, root_has).map_err(|e| OpenError::new(&shown, e))?;
    if !root_has && folders.is_empty() {
        return Err(nothing());
    }
    let open_folder = |folder: &str| -> Result<Checkpoint, OpenError> {
        let found = in_folder::checkpoints_of(scoped, folder).map_err(|e| OpenError::new(&shown, e))?.joined(prefix);
        log::info!("{shown}: folder {folder:?}: checkpoints {found:?}");
        open_every(found, &shown, |choice, limit| open_choice(repo, choice.clone(), limit))
    };
    let mut checkpoint = if root_has { open_folder("")? } else { Checkpoint::of(Vec::new()) };
    for folder in &folders {
        let component = open_folder(folder)?;
        checkpoint.components.push(Component { folder: folder.clone(), checkpoint: component });
    }
    if repo_files {
        fetch_layout_files(repo, prefix, scoped, &mut checkpoint)?;
    }
    Ok(checkpoint)
}

/// The small files of a repository laid out in folders (those of the root, of each component's
/// folder and of the folders the root's manifest names: `layout`), fetched whole, a few at once,
/// and given to the component whose folder holds each (the others to the root, by their path).
/// `scoped` lists the files below `prefix`, without it. One that cannot be fetched fails the open,
/// as in a flat repository.
fn fetch_layout_files(
    repo: &dyn Repository,
    prefix: &str,
    scoped: &[Sibling],
    checkpoint: &mut Checkpoint,
) -> Result<(), OpenError> {
    let fetch = |path: &String| repo.fetch_small(&format!("{prefix}{path}"));
    let mut folders: Vec<String> = vec![String::new()];
    folders.extend(checkpoint.components.iter().map(|c| c.folder.clone()));
    let mut fetched: HashMap<String, Vec<u8>> = HashMap::new();
    for manifest in layout::MANIFESTS {
        let listed = scoped.iter().any(|s| s.path == manifest && s.size.is_some_and(|n| n <= hub::SMALL_FILE_LIMIT));
        if listed {
            let bytes = fetch(&manifest.to_string())?;
            folders.extend(layout::manifest_folders(manifest, &bytes));
            fetched.insert(manifest.to_string(), bytes);
        }
    }
    let folders: Vec<&str> = folders.iter().map(String::as_str).collect();
    let wanted: Vec<String> =
        hub::small_files_in(scoped, &folders).into_iter().filter(|p| layout::served_as_small(p)).collect();
    log::debug!("{}: fetching {} small files", repo.shown(), wanted.len());
    let missing: Vec<String> = wanted.iter().filter(|p| !fetched.contains_key(*p)).cloned().collect();
    let bytes = in_parallel(&missing, PARALLEL_FETCHES, fetch)?;
    fetched.extend(missing.into_iter().zip(bytes));
    for path in wanted {
        if let Some(bytes) = fetched.remove(&path) {
            checkpoint.add_repo_file(path, bytes, None);
        }
    }
    Ok(())
}

/// The folder a file of the repository is in (`None`: the root).
pub(super) fn folder_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(folder, _)| folder)
}
