//! The small files beside a local checkpoint (`config.json`, `generation_config.json`, tokenizer
//! files): read once at mount time from the checkpoint's directory, by the same rule that picks an
//! `hf://` repository's, so `from_pretrained(MOUNT)` finds what it finds in the directory itself.

use std::io::Read;
use std::path::Path;

use super::shard::RootFile;
use crate::source::hub::{small_files, Sibling, SMALL_FILE_LIMIT};

/// The small files directly in `dir` that a loader wants beside the checkpoint (the rule of
/// [`small_files`]: no weights, no dotfiles, no index, each up to [`SMALL_FILE_LIMIT`], all together
/// bounded), with the bytes they hold now. A file that vanishes, grows past the limit or cannot be
/// read between the listing and the read is left out with a warning: these files are served, never
/// interpreted, so none of them can make the mount fail.
pub fn small_files_beside(dir: &Path) -> Vec<RootFile> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    // Links are followed, as for the shards: a Hugging Face cache snapshot is a folder of links.
    let siblings: Vec<Sibling> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let path = entry.file_name().into_string().ok()?;
            let meta = std::fs::metadata(entry.path()).ok().filter(|m| m.is_file())?;
            Some(Sibling { path, size: Some(meta.len()) })
        })
        .collect();
    small_files(&siblings, None)
        .into_iter()
        .filter_map(|(_, name)| match read_bounded(&dir.join(&name)) {
            Ok(bytes) => Some(RootFile { name, bytes }),
            Err(error) => {
                log::warn!("{}: not served beside the checkpoint: {error}", dir.join(&name).display());
                None
            }
        })
        .collect()
}

/// The bytes of `path`, refused past [`SMALL_FILE_LIMIT`] (it may have grown since it was listed).
pub(super) fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(SMALL_FILE_LIMIT + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > SMALL_FILE_LIMIT {
        return Err(std::io::Error::other(format!("over {SMALL_FILE_LIMIT} bytes")));
    }
    Ok(bytes)
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
        let files = small_files_beside(dir.path());
        let names: Vec<_> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["config.json", "generation_config.json", "tokenizer.model"]);
        assert_eq!(files[0].bytes, b"{\"model_type\": \"llama\"}");
        assert_eq!(files[1].bytes, files[0].bytes);
    }
}
