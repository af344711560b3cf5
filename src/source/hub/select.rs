//! What a file of a repository named by its path is ([`file_choice`]), and which small files
//! (configs, tokenizers) a loader wants beside a checkpoint ([`small_files`]).

use super::api::Sibling;

/// What a repository (or a folder of it) holds as its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// One `.safetensors` file.
    Single(String),
    /// A `*.safetensors.index.json` naming shards beside it.
    Index(String),
    /// Several `.safetensors` files and no index: shards in name order, like a directory.
    Shards(Vec<String>),
}

/// The checkpoint a file of the repository named by its path is: an index (`*.json`) or one
/// `.safetensors` file. A folder's checkpoints are chosen by `checkpoint::in_folder`'s rule.
pub fn file_choice(path: &str) -> Choice {
    if path.ends_with(".json") {
        Choice::Index(path.to_string())
    } else {
        Choice::Single(path.to_string())
    }
}

/// Largest file served beside the tensors (configs and tokenizers are well under it; tokenizer.json
/// of a 250k-token vocabulary is about 17 MB, hence some room).
pub const SMALL_FILE_LIMIT: u64 = 32 << 20;

/// Most bytes of small files fetched at mount time, all together.
pub const SMALL_FILES_TOTAL: u64 = 128 << 20;

/// Extensions of weights in formats other than safetensors, never fetched.
const WEIGHT_EXTENSIONS: [&str; 15] = [
    "bin",
    "pt",
    "pth",
    "ckpt",
    "h5",
    "msgpack",
    "onnx",
    "onnx_data",
    "gguf",
    "tflite",
    "ot",
    "pb",
    "npz",
    "pkl",
    "safetensors",
];

/// Longest file name Linux accepts (NAME_MAX): a longer one could not be served.
const NAME_MAX: usize = 255;

/// The small files of `folder` (the root when `None`) a loader wants beside the checkpoint: its own
/// files (not its subfolders') of known size up to [`SMALL_FILE_LIMIT`], no weights (any format),
/// no dotfiles (`.gitattributes`), no index of shards (the checkpoint brings its own), names within
/// NAME_MAX, and not more than [`SMALL_FILES_TOTAL`] bytes together (smallest first).
/// Returns `(path in the repository, name in the folder)` pairs in name order.
pub fn small_files(siblings: &[Sibling], folder: Option<&str>) -> Vec<(String, String)> {
    let folder = folder.unwrap_or("");
    let skip = if folder.is_empty() { 0 } else { folder.len() + 1 };
    small_files_in(siblings, &[folder]).into_iter().map(|path| (path.clone(), path[skip..].to_string())).collect()
}

/// The small files directly in any of `folders` (`""` is the root), by the rule of
/// [`small_files`], bounded by [`SMALL_FILES_TOTAL`] all together (smallest first): their paths
/// in the repository, in path order.
pub fn small_files_in(siblings: &[Sibling], folders: &[&str]) -> Vec<String> {
    let mut picked: Vec<(u64, &str)> = siblings
        .iter()
        .filter_map(|s| {
            let (folder, name) = s.path.rsplit_once('/').unwrap_or(("", s.path.as_str()));
            let size = s.size?;
            let extension = name.rsplit_once('.').map_or("", |(_, e)| e);
            let wanted = folders.contains(&folder)
                && !name.is_empty()
                && !name.starts_with('.')
                && name.len() <= NAME_MAX
                && size <= SMALL_FILE_LIMIT
                && !WEIGHT_EXTENSIONS.contains(&extension)
                && !name.ends_with(".safetensors.index.json");
            wanted.then_some((size, s.path.as_str()))
        })
        .collect();
    picked.sort_unstable();
    let mut total = 0;
    picked.retain(|(size, ..)| {
        total += size;
        total <= SMALL_FILES_TOTAL
    });
    let mut out: Vec<String> = picked.into_iter().map(|(_, p)| p.to_string()).collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(files: &[&str]) -> Vec<Sibling> {
        files.iter().map(|f| Sibling { path: f.to_string(), size: Some(10) }).collect()
    }

    #[test]
    fn a_file_named_is_an_index_or_a_single_file() {
        assert_eq!(
            file_choice("m/model.safetensors.index.json"),
            Choice::Index("m/model.safetensors.index.json".into())
        );
        assert_eq!(file_choice("vae/x.safetensors"), Choice::Single("vae/x.safetensors".into()));
    }

    #[test]
    fn small_files_skip_weights_big_files_and_subfolders() {
        let mut siblings = repo(&[
            "config.json",
            "tokenizer.json",
            ".gitattributes",
            "pytorch_model.bin",
            "model.safetensors",
            "model.safetensors.index.json",
            "sub/config.json",
        ]);
        siblings.push(Sibling { path: "huge.txt".into(), size: Some(SMALL_FILE_LIMIT + 1) });
        siblings.push(Sibling { path: "unknown.json".into(), size: None });
        siblings.push(Sibling { path: format!("{}.json", "x".repeat(NAME_MAX)), size: Some(1) });
        let names: Vec<String> = small_files(&siblings, None).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["config.json", "tokenizer.json"]);
        assert_eq!(small_files(&siblings, Some("sub")), [("sub/config.json".to_string(), "config.json".to_string())]);
        assert_eq!(small_files_in(&siblings, &["", "sub"]), ["config.json", "sub/config.json", "tokenizer.json"]);
    }

    /// The total is over every folder asked for together, the largest left out first.
    #[test]
    fn small_files_of_several_folders_share_one_total() {
        // Four of 30 MiB and one byte fit in 128 MiB; a fifth file, of 31 MiB, does not.
        let (mib, files) = (1 << 20, ["a/x.json", "b/x.json", "c/x.json", "d/x.json", "e/big.txt", "z.json"]);
        let sizes = [30 * mib, 30 * mib, 30 * mib, 30 * mib, 31 * mib, 1];
        let siblings: Vec<Sibling> =
            files.iter().zip(sizes).map(|(p, size)| Sibling { path: p.to_string(), size: Some(size) }).collect();
        assert!(4 * 30 * mib < SMALL_FILES_TOTAL && 4 * 30 * mib + 31 * mib > SMALL_FILES_TOTAL);
        let all = ["", "a", "b", "c", "d", "e"];
        assert_eq!(small_files_in(&siblings, &all), ["a/x.json", "b/x.json", "c/x.json", "d/x.json", "z.json"]);
        // Only the folders asked for.
        assert_eq!(small_files_in(&siblings, &["e"]), ["e/big.txt"]);
    }
}
