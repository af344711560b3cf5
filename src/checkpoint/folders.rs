//! A local folder opened as the model repository it is ([`open_folder`]): its own checkpoint (as
//! a directory of shards always was), the checkpoint of each folder below that holds one, and the
//! small files of the folders a mount serves, all laid out by the rule of `layout`.

use std::path::{Path, PathBuf};

use super::beside::read_bounded;
use super::error::{OpenError, OpenProblem};
use super::layout::{self, MAX_DEPTH};
use super::local::{open_dir, open_index};
use super::shard::{checked, open_all, open_file, Checkpoint, Component};
use crate::source::hub::{self, Choice, HubError, Sibling};

/// Opens the folder `dir`: the checkpoint of its own files (every `*.safetensors` entry, as a
/// directory of shards), and each folder below that holds one as a component. A folder that holds
/// none, in it or below, is one line: [`OpenProblem::NoShardFiles`] without folders,
/// [`OpenProblem::NothingLoadable`] with.
/// With `repo_files`, the small files come along ([`super::OpenOptions::repo_files`]).
pub(super) fn open_folder(dir: &Path, repo_files: bool) -> Result<Checkpoint, OpenError> {
    let name = dir.display().to_string();
    let (files, has_folders) = layout::walk(dir)?;
    let root_has = layout::root_has_checkpoint(&files);
    let folders = layout::component_folders(&files, root_has).map_err(|e| OpenError::new(&name, e))?;
    if !root_has && folders.is_empty() {
        let problem =
            if has_folders { OpenProblem::NothingLoadable { depth: MAX_DEPTH } } else { OpenProblem::NoShardFiles };
        return Err(OpenError::new(&name, problem));
    }
    let mut checkpoint = if root_has { open_dir(dir)? } else { Checkpoint::of(Vec::new()) };
    for folder in &folders {
        let component = open_component(dir, &files, folder)?;
        checkpoint.components.push(Component { folder: folder.clone(), checkpoint: component });
    }
    if repo_files {
        add_small_files(dir, &files, &mut checkpoint);
    }
    Ok(checkpoint)
}

/// The checkpoint of `folder` (relative to `dir`), chosen among its own files as in an `hf://`
/// repository's folder ([`hub::choose_checkpoint`]: the standard index, else the standard file,
/// else the only index, the only file, or every file as shards).
fn open_component(dir: &Path, files: &[Sibling], folder: &str) -> Result<Checkpoint, OpenError> {
    let shown = dir.join(folder).display().to_string();
    match hub::choose_checkpoint(files, Some(folder), "") {
        Ok(Choice::Single(path)) => Ok(Checkpoint::of(vec![open_file(&dir.join(path))?])),
        Ok(Choice::Index(path)) => open_index(&dir.join(path)),
        Ok(Choice::Shards(paths)) => {
            let paths: Vec<PathBuf> = paths.iter().map(|p| dir.join(p)).collect();
            let opened = open_all(&paths, |p| open_file(p))?;
            checked(&shown, opened, None, Vec::new())
        }
        Err(HubError::Ambiguous(indexes)) => Err(OpenError::new(shown, OpenProblem::Ambiguous(indexes))),
        Err(e) => Err(OpenError::new(shown, e)),
    }
}

/// The small files of the folders a mount serves (the root, the components' folders, those the
/// root's manifest names), picked by [`hub::small_files_in`]'s rule and read once: a component's
/// own go to it by name, the others to the root by their path from it. One that cannot be read is
/// left out with a warning: these files are served, never interpreted.
fn add_small_files(dir: &Path, files: &[Sibling], checkpoint: &mut Checkpoint) {
    let mut folders: Vec<String> = vec![String::new()];
    folders.extend(checkpoint.components.iter().map(|c| c.folder.clone()));
    for manifest in layout::MANIFESTS {
        if files.iter().any(|s| s.path == manifest && s.size.is_some()) {
            match read_bounded(&dir.join(manifest)) {
                Ok(bytes) => folders.extend(layout::manifest_folders(manifest, &bytes)),
                Err(error) => log::warn!("{}: not read: {error}", dir.join(manifest).display()),
            }
        }
    }
    let folders: Vec<&str> = folders.iter().map(String::as_str).collect();
    for path in hub::small_files_in(files, &folders) {
        let bytes = match read_bounded(&dir.join(&path)) {
            Ok(bytes) => bytes,
            Err(error) => {
                log::warn!("{}: not served beside the checkpoint: {error}", dir.join(&path).display());
                continue;
            }
        };
        checkpoint.add_repo_file(path, bytes);
    }
}
