//! A local folder opened as the model repository it is ([`open_folder`]): its own checkpoint (as
//! a directory of shards always was), the checkpoint of each folder below that holds one, and the
//! small files of the folders a mount serves, all laid out by the rule of `layout` and every file
//! opened by the folder's link rule (`confined`).

use std::path::{Path, PathBuf};

use super::confined::Confinement;
use super::error::{OpenError, OpenProblem};
use super::every_checkpoint::open_every;
use super::in_folder;
use super::layout::{self, MAX_DEPTH};
use super::local::open_index;
use super::shard::{checked, open_all, open_confined, Checkpoint, Component};
use crate::source::hub::{self, Choice, Sibling, SMALL_FILE_LIMIT};
use crate::util::describe_io;

/// Opens the folder `dir`: the checkpoints of its own files (`in_folder`'s rule: the main one and
/// every other one), and each folder below that holds one as a component, its checkpoints by the
/// same rule. A folder that holds none, in it or below, is one line: [`OpenProblem::NoShardFiles`]
/// without folders, [`OpenProblem::NothingLoadable`] with.
/// With `repo_files`, the small files come along ([`super::OpenOptions::repo_files`]).
pub(super) fn open_folder(dir: &Path, repo_files: bool) -> Result<Checkpoint, OpenError> {
    let name = dir.display().to_string();
    let rule = Confinement::of(dir).map_err(|e| OpenError::new(&name, e))?;
    let (files, has_folders) = layout::walk(dir)?;
    let root_has = layout::root_has_checkpoint(&files);
    let folders = layout::component_folders(&files, root_has).map_err(|e| OpenError::new(&name, e))?;
    if !root_has && folders.is_empty() {
        let problem =
            if has_folders { OpenProblem::NothingLoadable { depth: MAX_DEPTH } } else { OpenProblem::NoShardFiles };
        return Err(OpenError::new(&name, problem));
    }
    let mut checkpoint = if root_has { open_checkpoints(dir, &files, "", &rule)? } else { Checkpoint::of(Vec::new()) };
    for folder in &folders {
        let component = open_checkpoints(dir, &files, folder, &rule)?;
        checkpoint.components.push(Component { folder: folder.clone(), checkpoint: component });
    }
    if repo_files {
        add_small_files(dir, &files, &mut checkpoint, &rule);
    }
    Ok(checkpoint)
}

/// The checkpoints of `folder` (relative to `dir`; `""`: `dir` itself), chosen among its own
/// files by `in_folder`'s rule, as in an `hf://` repository's folder.
fn open_checkpoints(dir: &Path, files: &[Sibling], folder: &str, rule: &Confinement) -> Result<Checkpoint, OpenError> {
    let shown = if folder.is_empty() { dir.display().to_string() } else { dir.join(folder).display().to_string() };
    let found = in_folder::checkpoints_of(files, folder).map_err(|e| OpenError::new(&shown, e))?;
    open_every(found, &shown, |choice, limit| match choice {
        Choice::Single(path) => Ok(Checkpoint::of(vec![open_confined(&dir.join(path), rule)?])),
        Choice::Index(path) => open_index(&dir.join(path), rule, limit),
        Choice::Shards(paths) => {
            let paths: Vec<PathBuf> = paths.iter().map(|p| dir.join(p)).collect();
            let opened = open_all(&paths, |p| open_confined(p, rule))?;
            checked(&shown, opened, None, Vec::new())
        }
    })
}

/// The small files of the folders a mount serves (the root, the components' folders, those the
/// root's manifest names), picked by [`hub::small_files_in`]'s rule and read once by the folder's
/// link rule ([`Confinement::read_small`]): a component's own go to it by name, the others to the
/// root by their path from it. One that cannot be read (resolves outside the folder, a loop, not a
/// regular file, not readable) is left out with a warning: these files are served, never
/// interpreted.
fn add_small_files(dir: &Path, files: &[Sibling], checkpoint: &mut Checkpoint, rule: &Confinement) {
    let mut folders: Vec<String> = vec![String::new()];
    folders.extend(checkpoint.components.iter().map(|c| c.folder.clone()));
    for manifest in layout::MANIFESTS {
        if files.iter().any(|s| s.path == manifest && s.size.is_some()) {
            match rule.read_small(&dir.join(manifest), SMALL_FILE_LIMIT) {
                Ok(file) => folders.extend(layout::manifest_folders(manifest, &file.bytes)),
                Err(error) => log::warn!("{}: not read: {}", dir.join(manifest).display(), describe_io(&error)),
            }
        }
    }
    let folders: Vec<&str> = folders.iter().map(String::as_str).collect();
    for path in hub::small_files_in(files, &folders).into_iter().filter(|p| layout::served_as_small(p)) {
        match rule.read_small(&dir.join(&path), SMALL_FILE_LIMIT) {
            Ok(file) => checkpoint.add_repo_file(path, file.bytes, Some(file.mode)),
            Err(error) => {
                log::warn!("{}: not served: {}", dir.join(&path).display(), describe_io(&error))
            }
        }
    }
}
