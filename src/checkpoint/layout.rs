//! A model repository as it is laid out in folders: which folders are components (hold a
//! checkpoint of their own), which folders' small files a mount serves, and the limits of one
//! mount. Works on a list of files (a local walk, or an `hf://` repository's listing), so a local
//! folder and a repository by name are laid out by the same rule.
//!
//! - A folder that directly holds a `*.safetensors` file is a component (`unet/`, `2_Dense/`).
//! - The small files served are those directly in the root, in a component's folder, or in a
//!   folder the root's manifest names: `model_index.json` (diffusers: `scheduler/`, `tokenizer/`)
//!   or `modules.json` (sentence-transformers: `1_Pooling/`). Other folders (`onnx/`, `docs/`)
//!   are left out.
//! - Folders whose name starts with `.` or is [`OTHERS_DIR`] are never looked into; nor are folders more than
//!   [`MAX_DEPTH`] levels down.

use std::path::Path;

use super::error::{OpenError, OpenProblem};
use super::in_folder::{is_index_name, OTHERS_DIR};
use crate::source::hub::Sibling;

/// How many folder levels below the mounted folder a mount looks into (`a/b/c/d` is 4).
pub const MAX_DEPTH: usize = 4;

/// Most components (folders with a checkpoint, the root's own included) one mount takes.
pub const MAX_COMPONENTS: usize = 64;

/// Most entries (files and folders) a walk of a local folder reads: a mount of a home directory
/// by mistake is refused in a moment, not after reading every file under it.
pub const MAX_WALKED_ENTRIES: usize = 100_000;

/// The root files that name folders a loader reads: diffusers' and sentence-transformers'.
pub const MANIFESTS: [&str; 2] = ["model_index.json", "modules.json"];

/// The folder a path of the listing is in (`""`: the root).
pub fn folder_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(folder, _)| folder)
}

/// How many levels down `folder` is (`""`: 0).
fn depth(folder: &str) -> usize {
    if folder.is_empty() {
        0
    } else {
        folder.split('/').count()
    }
}

/// Whether the root's own files hold a `*.safetensors` entry.
pub fn root_has_checkpoint(files: &[Sibling]) -> bool {
    files.iter().any(|s| !s.path.contains('/') && s.path.ends_with(".safetensors"))
}

/// The folders below the root that directly hold a `*.safetensors` file, in path order, within
/// [`MAX_DEPTH`] and not under a dot-folder; more than [`MAX_COMPONENTS`] (with the root's own, if
/// `root` has one) is [`OpenProblem::TooManyComponents`].
pub fn component_folders(files: &[Sibling], root_counts: bool) -> Result<Vec<String>, OpenProblem> {
    let mut folders: Vec<String> = files
        .iter()
        .filter(|s| s.path.ends_with(".safetensors"))
        .map(|s| folder_of(&s.path))
        .filter(|f| !f.is_empty() && looked_into(f))
        .map(str::to_string)
        .collect();
    folders.sort_unstable();
    folders.dedup();
    let count = folders.len() + usize::from(root_counts);
    if count > MAX_COMPONENTS {
        return Err(OpenProblem::TooManyComponents { count, limit: MAX_COMPONENTS });
    }
    Ok(folders)
}

/// Whether a mount looks into `folder`: within [`MAX_DEPTH`], no part of it hidden (`.git`) nor
/// named [`OTHERS_DIR`] (a mount's own).
fn looked_into(folder: &str) -> bool {
    depth(folder) <= MAX_DEPTH
        && folder.split('/').all(|part| !part.is_empty() && !part.starts_with('.') && part != OTHERS_DIR)
}

/// Whether a small file the rule of [`hub::small_files_in`](crate::source::hub::small_files_in)
/// picks is served as one: not an index of shards by `in_folder`'s names
/// (`model.safetensors.index.fp16.json` is a checkpoint's, served with it), not named
/// [`OTHERS_DIR`].
pub fn served_as_small(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name != OTHERS_DIR && !is_index_name(name)
}

/// The folders a root manifest names: the pipeline's parts in `model_index.json` (each key not
/// starting with `_` whose value is a `[library, class]` pair), the modules' `path`s in
/// `modules.json`. A manifest that does not parse, and a name that is not a plain relative folder
/// within [`MAX_DEPTH`], name nothing: the manifest is served as it is, never interpreted further.
pub fn manifest_folders(name: &str, bytes: &[u8]) -> Vec<String> {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Vec::new() };
    let named: Vec<&str> = match name {
        "model_index.json" => doc
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(key, value)| !key.starts_with('_') && value.as_array().is_some_and(|v| v.len() == 2))
            .map(|(key, _)| key.as_str())
            .collect(),
        "modules.json" => doc
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|module| module.get("path")?.as_str())
            .map(|path| path.trim_end_matches('/'))
            .collect(),
        _ => Vec::new(),
    };
    let mut folders: Vec<String> = named
        .into_iter()
        .filter(|f| !f.is_empty() && f.split('/').all(|p| p != "..") && looked_into(f))
        .map(str::to_string)
        .collect();
    folders.sort_unstable();
    folders.dedup();
    folders
}

/// Every file under `dir` (links to files followed to list them, as in a Hugging Face cache
/// snapshot: where they lead is checked when they are read, by `confined`'s rule; links to folders
/// and folders starting with `.` not looked into), as paths relative to it, with their sizes (`None` for an entry that is not a regular file: a `*.safetensors` one is still listed,
/// so opening it names what is wrong with it). Folders more than [`MAX_DEPTH`] levels down are not
/// read (logged once); more than [`MAX_WALKED_ENTRIES`] entries is an error naming `dir`.
pub fn walk(dir: &Path) -> Result<(Vec<Sibling>, bool), OpenError> {
    let shown = dir.display().to_string();
    let mut files = Vec::new();
    let mut has_folders = false;
    let mut entries = 0usize;
    let mut pending: Vec<String> = vec![String::new()];
    let mut too_deep: Option<String> = None;
    while let Some(folder) = pending.pop() {
        let path = if folder.is_empty() { dir.to_path_buf() } else { dir.join(&folder) };
        let listing = match std::fs::read_dir(&path) {
            Ok(listing) => listing,
            // The mounted folder must be readable; a folder below that is not is left out.
            Err(e) if folder.is_empty() => return Err(OpenError::new(&shown, e)),
            Err(e) => {
                log::warn!("{}: not looked into: {}", path.display(), crate::util::describe_io(&e));
                continue;
            }
        };
        for entry in listing {
            let Ok(entry) = entry else { continue };
            entries += 1;
            if entries > MAX_WALKED_ENTRIES {
                return Err(OpenError::new(&shown, OpenProblem::TooManyEntries { limit: MAX_WALKED_ENTRIES }));
            }
            // A name that is not UTF-8 could be neither served nor named in metadata.json.
            let Ok(name) = entry.file_name().into_string() else { continue };
            let relative = if folder.is_empty() { name.clone() } else { format!("{folder}/{name}") };
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                has_folders = true;
                if name.starts_with('.') {
                    continue;
                }
                if depth(&relative) > MAX_DEPTH {
                    too_deep.get_or_insert(relative);
                } else {
                    pending.push(relative);
                }
                continue;
            }
            let size = match std::fs::metadata(entry.path()) {
                Ok(meta) => meta.is_file().then_some(meta.len()),
                // A dangling or looping link: a shard's is named by the error opening it, another
                // is left out, and said so.
                Err(e) => {
                    if !name.ends_with(".safetensors") {
                        log::warn!("{}: not served: {}", entry.path().display(), crate::util::describe_io(&e));
                    }
                    None
                }
            };
            files.push(Sibling { path: relative, size });
        }
    }
    if let Some(folder) = too_deep {
        log::warn!("{}/{folder}: not looked into: more than {MAX_DEPTH} folders down", dir.display());
    }
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok((files, has_folders))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(paths: &[&str]) -> Vec<Sibling> {
        paths.iter().map(|p| Sibling { path: p.to_string(), size: Some(1) }).collect()
    }

    #[test]
    fn folders_with_safetensors_are_components_within_the_depth() {
        let files = listing(&[
            "model_index.json",
            "unet/diffusion_pytorch_model.safetensors",
            "unet/config.json",
            "vae/a.safetensors",
            "vae/b.safetensors",
            "scheduler/scheduler_config.json",
            ".git/x.safetensors",
            "a/.hidden/x.safetensors",
            "a/b/c/d/x.safetensors",
            "a/b/c/d/e/x.safetensors",
        ]);
        assert_eq!(component_folders(&files, false).unwrap(), ["a/b/c/d", "unet", "vae"]);
        assert!(!root_has_checkpoint(&files));
        assert!(root_has_checkpoint(&listing(&["m.safetensors", "unet/x.safetensors"])));
    }

    #[test]
    fn more_components_than_the_limit_are_refused() {
        let paths: Vec<String> = (0..MAX_COMPONENTS).map(|i| format!("c{i}/m.safetensors")).collect();
        let files: Vec<Sibling> = paths.iter().map(|p| Sibling { path: p.clone(), size: Some(1) }).collect();
        assert_eq!(component_folders(&files, false).unwrap().len(), MAX_COMPONENTS);
        let err = component_folders(&files, true).unwrap_err();
        assert_eq!(err.to_string(), format!("holds {} folders with a checkpoint (the root's own included), over the limit of {MAX_COMPONENTS} for one mount: mount a folder of it", MAX_COMPONENTS + 1));
    }

    #[test]
    fn manifests_name_folders_and_nothing_outside() {
        let index = br#"{"_class_name": "DDPMPipeline", "_diffusers_version": "0.42.1",
            "scheduler": ["diffusers", "DDPMScheduler"], "unet": ["diffusers", "UNet2DModel"],
            "safety_checker": [null, null], "requires_safety_checker": true, "../up": ["a", "b"]}"#;
        assert_eq!(manifest_folders("model_index.json", index), ["safety_checker", "scheduler", "unet"]);
        let modules = br#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense/", "type": "sentence_transformers.models.Dense"},
            {"idx": 3, "path": "/etc"}, {"idx": 4, "path": ".git"}, {"idx": 5, "path": "a/../../b"}]"#;
        assert_eq!(manifest_folders("modules.json", modules), ["1_Pooling", "2_Dense"]);
        assert!(manifest_folders("modules.json", b"not json").is_empty());
        assert!(manifest_folders("config.json", index).is_empty());
    }

    #[test]
    fn a_walk_lists_files_follows_file_links_and_skips_hidden_and_deep_folders() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in ["unet", ".git", "a/b/c/d/e"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        for file in ["config.json", "unet/x.safetensors", ".git/y.safetensors", "a/b/c/d/e/z.safetensors"] {
            std::fs::write(root.join(file), b"12").unwrap();
        }
        std::os::unix::fs::symlink(root.join("config.json"), root.join("unet/config.json")).unwrap();
        std::os::unix::fs::symlink(root.join("unet"), root.join("linked")).unwrap();
        std::os::unix::fs::symlink(root.join("gone"), root.join("unet/broken.safetensors")).unwrap();
        let (files, has_folders) = walk(root).unwrap();
        let listed: Vec<(&str, Option<u64>)> = files.iter().map(|s| (s.path.as_str(), s.size)).collect();
        assert!(has_folders);
        assert_eq!(
            listed,
            [
                ("config.json", Some(2)),
                ("linked", None),
                ("unet/broken.safetensors", None),
                ("unet/config.json", Some(2)),
                ("unet/x.safetensors", Some(2)),
            ]
        );
    }
}
