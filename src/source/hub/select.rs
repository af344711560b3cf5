//! Which files of a repository make its checkpoint ([`choose_checkpoint`]), and which small files
//! (configs, tokenizers) a loader wants beside it ([`small_files`]).

use super::api::Sibling;
use super::error::HubError;

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

/// The names of the index transformers and diffusers write, in the order they are preferred.
const STANDARD_INDEXES: [&str; 2] = ["model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json"];
/// The names of the single file transformers and diffusers write (a folder that holds one beside
/// variants such as `diffusion_pytorch_model.fp16.safetensors` is that one file).
const STANDARD_FILES: [&str; 2] = ["model.safetensors", "diffusion_pytorch_model.safetensors"];

/// The checkpoint at `path` (a file, or a folder; the repository's root when `None`). In a folder,
/// among its own files (not its subfolders'): `model.safetensors.index.json` (or diffusers'
/// `diffusion_pytorch_model.safetensors.index.json`), else `model.safetensors` (or
/// `diffusion_pytorch_model.safetensors`), else the only `*.safetensors.index.json`, else the only
/// `*.safetensors` file, else every `*.safetensors` file as shards.
pub fn choose_checkpoint(siblings: &[Sibling], path: Option<&str>, sha: &str) -> Result<Choice, HubError> {
    if let Some(path) = path {
        if siblings.iter().any(|s| s.path == path) {
            return Ok(if path.ends_with(".json") {
                Choice::Index(path.to_string())
            } else {
                Choice::Single(path.to_string())
            });
        }
        let prefix = format!("{path}/");
        if !siblings.iter().any(|s| s.path.starts_with(&prefix)) {
            return Err(HubError::NoSuchPath { path: path.to_string(), sha: sha.to_string() });
        }
    }
    let names = children(siblings, path);
    let joined = |name: &str| path.map_or(name.to_string(), |p| format!("{p}/{name}"));
    let indexes: Vec<&str> = names.iter().copied().filter(|n| n.ends_with(".safetensors.index.json")).collect();
    let mut files: Vec<&str> = names.iter().copied().filter(|n| n.ends_with(".safetensors")).collect();
    files.sort_unstable();
    if let Some(index) = STANDARD_INDEXES.iter().find(|i| indexes.contains(i)) {
        return Ok(Choice::Index(joined(index)));
    }
    if let Some(file) = STANDARD_FILES.iter().find(|f| files.contains(f)) {
        return Ok(Choice::Single(joined(file)));
    }
    match (indexes.as_slice(), files.as_slice()) {
        ([index], _) => Ok(Choice::Index(joined(index))),
        ([_, _, ..], _) => Err(HubError::Ambiguous(indexes.iter().map(|i| joined(i)).collect())),
        (_, []) => Err(HubError::NoSafetensors { folder: path.map(str::to_string) }),
        (_, [file]) => Ok(Choice::Single(joined(file))),
        (_, files) => Ok(Choice::Shards(files.iter().map(|f| joined(f)).collect())),
    }
}

/// The names of the files directly in `folder` (the root when `None`), without the folder.
fn children<'a>(siblings: &'a [Sibling], folder: Option<&str>) -> Vec<&'a str> {
    let prefix = folder.map_or(String::new(), |f| format!("{f}/"));
    siblings.iter().filter_map(|s| s.path.strip_prefix(prefix.as_str())).filter(|rest| !rest.contains('/')).collect()
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

    fn choose(files: &[&str], path: Option<&str>) -> Result<Choice, HubError> {
        choose_checkpoint(&repo(files), path, "abc")
    }

    #[test]
    fn the_checkpoint_is_chosen_by_the_documented_order() {
        let single = |s: &str| Ok::<_, ()>(Choice::Single(s.to_string()));
        let index = |s: &str| Ok::<_, ()>(Choice::Index(s.to_string()));
        let sharded = ["config.json", "model.safetensors.index.json", "model-1.safetensors", "model-2.safetensors"];
        assert_eq!(choose(&sharded, None).map_err(|_| ()), index("model.safetensors.index.json"));
        assert_eq!(choose(&["model.safetensors", "x.safetensors"], None).map_err(|_| ()), single("model.safetensors"));
        assert_eq!(choose(&["a.safetensors", "README.md"], None).map_err(|_| ()), single("a.safetensors"));
        assert_eq!(
            choose(&["b.safetensors", "a.safetensors"], None).map_err(|_| ()),
            Ok(Choice::Shards(vec!["a.safetensors".into(), "b.safetensors".into()]))
        );
        let diffusers = ["unet/config.json", "unet/diffusion_pytorch_model.safetensors", "vae/x.safetensors"];
        assert_eq!(
            choose(&diffusers, Some("unet")).map_err(|_| ()),
            single("unet/diffusion_pytorch_model.safetensors")
        );
        assert_eq!(choose(&diffusers, Some("vae/x.safetensors")).map_err(|_| ()), single("vae/x.safetensors"));
        assert!(matches!(choose(&diffusers, None), Err(HubError::NoSafetensors { folder: None })));
        assert!(matches!(choose(&diffusers, Some("text")), Err(HubError::NoSuchPath { .. })));
        // diffusers' own names win over its variants beside them.
        let variants = ["unet/diffusion_pytorch_model.fp16.safetensors", "unet/diffusion_pytorch_model.safetensors"];
        assert_eq!(choose(&variants, Some("unet")).map_err(|_| ()), single("unet/diffusion_pytorch_model.safetensors"));
        let sharded = ["diffusion_pytorch_model.safetensors.index.json", "a.safetensors.index.json"];
        assert_eq!(choose(&sharded, None).map_err(|_| ()), index("diffusion_pytorch_model.safetensors.index.json"));
        let two = ["a.safetensors.index.json", "b.safetensors.index.json"];
        assert!(matches!(choose(&two, None), Err(HubError::Ambiguous(v)) if v.len() == 2));
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
