//! The small files beside a local index (`config.json`, `generation_config.json`, tokenizer
//! files): read once at mount time from the index's folder, by the same rule that picks an
//! `hf://` repository's, so `from_pretrained(MOUNT)` finds what it finds in the folder itself.

use std::path::Path;

use super::confined::Confinement;
use super::shard::RootFile;
use crate::source::hub::{small_files, Sibling, SMALL_FILE_LIMIT};
use crate::util::describe_io;

/// The small files directly in the folder of `rule` that a loader wants beside the checkpoint (the
/// rule of [`small_files`]: no weights, no dotfiles, no index, each up to [`SMALL_FILE_LIMIT`],
/// all together bounded), with the bytes they hold now, each read by the folder's link rule
/// ([`Confinement::read_small`]). A file that resolves outside the folder, vanishes, grows past the
/// limit or cannot be read between the listing and the read is left out with a warning: these
/// files are served, never interpreted, so none of them can make the mount fail.
pub fn small_files_beside(rule: &Confinement, shown: &Path) -> Vec<RootFile> {
    let Ok(entries) = std::fs::read_dir(rule.folder()) else { return Vec::new() };
    // Links are followed to list them (a Hugging Face cache snapshot is a folder of them); where
    // they lead is the reader's to check.
    let siblings: Vec<Sibling> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let path = entry.file_name().into_string().ok()?;
            let meta = match std::fs::metadata(entry.path()) {
                Ok(meta) => meta,
                // A dangling or looping link (a shard's is the index's to name).
                Err(error) => {
                    if !path.ends_with(".safetensors") {
                        log::warn!("{}: not served: {}", shown.join(&path).display(), describe_io(&error));
                    }
                    return None;
                }
            };
            meta.is_file().then_some(Sibling { path, size: Some(meta.len()) })
        })
        .collect();
    small_files(&siblings, None)
        .into_iter()
        .filter_map(|(_, name)| match rule.read_small(&rule.folder().join(&name), SMALL_FILE_LIMIT) {
            Ok(file) => Some(RootFile { name, bytes: file.bytes, local_mode: Some(file.mode) }),
            Err(error) => {
                log::warn!("{}: not served: {}", shown.join(&name).display(), describe_io(&error));
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_and_tokenizers_come_along_and_weights_dotfiles_and_indexes_do_not() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [
            ("config.json", &b"{\"model_type\": \"llama\"}"[..]),
            ("tokenizer.model", b"tok"),
            ("model.safetensors", b"x"),
            ("model.safetensors.index.json", b"{}"),
            ("pytorch_model.bin", b"x"),
            (".gitattributes", b"x"),
        ] {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/config.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(dir.path().join("config.json"), dir.path().join("generation_config.json")).unwrap();
        let files = small_files_beside(&Confinement::of(dir.path()).unwrap(), dir.path());
        let names: Vec<_> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["config.json", "generation_config.json", "tokenizer.model"]);
        assert_eq!(files[0].bytes, b"{\"model_type\": \"llama\"}");
        assert_eq!(files[1].bytes, files[0].bytes);
    }
}
