//! The one rule that decides, from a folder's listing of names alone, which checkpoints the folder
//! holds ([`checkpoints_in`]): the main one (what a loader loads without `variant=`) and every
//! other one (variants, `consolidated.safetensors` beside shards, any other `*.safetensors`). The
//! root of a mount and each component's folder, local or listed (`hf://`, `s3://`, `gs://`), are
//! decided by it.
//!
//! Names, as transformers and diffusers write them (`_add_variant` puts the variant before the
//! last extension):
//! - a file `S.safetensors` is the checkpoint named `S`; a shard `S-00001-of-00002.safetensors`
//!   belongs to the checkpoint `S` (transformers' variant shards, `model.fp16-00001-of-00002`,
//!   to `model.fp16`), as does diffusers' older `S-00001-of-00002.V.safetensors` (to `S.V`);
//! - an index `S.safetensors.index.json` is the checkpoint `S`; `S.safetensors.index.V.json`
//!   (transformers and diffusers now) and `S.safetensors.V.index.json` (diffusers before) are the
//!   checkpoint `S.V`;
//! - a checkpoint `S.V` is the variant `V` of `S` when `S` is `model` or
//!   `diffusion_pytorch_model`, or the name of another checkpoint of the folder.
//!
//! The main checkpoint is `model` (its file first, then its index, then its shards: transformers'
//! order), else `diffusion_pytorch_model` (its index first: diffusers' order); else, among the
//! checkpoints that are no variant, the only index, else the only one, else every file of them as
//! the shards of one (a directory of shards, as a folder always was); several indexes and no
//! standard name are [`OpenProblem::Ambiguous`]. A folder holding only variants has the first of
//! them (in name order) as its main one. Shards whose checkpoint has an index are that index's
//! (it names them when it is read).
//!
//! A mount serves the main checkpoint's tensors in the folder, and each other checkpoint's in
//! [`OTHERS_DIR`]`/NAME/` below it: a name escaping never makes (in a tensor file's name a `%` is
//! followed only by `25`, `2F`, `00`, two upper-case hex digits, `~`, or nothing), and
//! a layout never looks into nor serves (`layout`, the small files' rule), so it is no tensor's,
//! no folder's and no file's of the repository.

use std::collections::BTreeMap;

use super::error::OpenProblem;
use crate::source::hub::{Choice, Sibling};

/// The folder, in a folder with other checkpoints than its main one, that holds each of them as
/// `NAME/`: its tensors, its own `metadata.json`. It has a dot, and nothing a variant's name starts
/// with after it: diffusers' `from_pretrained(variant=V)` reads every name of a component's folder
/// as `STEM.V...` (`p.split(".")[1].startswith(V)`), and fails on a name without a dot.
pub const OTHERS_DIR: &str = "%.checkpoints";

/// The names of the checkpoints loaders load without `variant=`, in the order they are looked for.
const STANDARD_NAMES: [&str; 2] = ["model", "diffusion_pytorch_model"];

/// One checkpoint of a folder: its name, its variant, and the files that make it (names in the
/// folder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The checkpoint's name: its file's without `.safetensors`, its index's with the variant put
    /// back (`model.fp16` for `model.safetensors.index.fp16.json`); among a folder's other
    /// checkpoints unique, and a file name other than `.` and `..` (else its first file's name).
    pub name: String,
    /// The variant (`fp16`), for a checkpoint named `S.V` whose `S` is a standard name or another
    /// checkpoint of the folder.
    pub variant: Option<String>,
    /// Its file, index or shards.
    pub files: Choice,
}

/// What a folder holds: its main checkpoint (none when it holds no `*.safetensors` file) and the
/// others, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFolder {
    /// The checkpoint a loader loads without `variant=`.
    pub main: Option<Found>,
    /// Every other checkpoint of the folder.
    pub others: Vec<Found>,
}

impl InFolder {
    /// The same checkpoints with every file name `prefix` + name (the folder's path and a `/`).
    pub fn joined(self, prefix: &str) -> InFolder {
        let join = |name: String| format!("{prefix}{name}");
        let found = |f: Found| Found {
            files: match f.files {
                Choice::Single(n) => Choice::Single(join(n)),
                Choice::Index(n) => Choice::Index(join(n)),
                Choice::Shards(names) => Choice::Shards(names.into_iter().map(join).collect()),
            },
            ..f
        };
        InFolder { main: self.main.map(found), others: self.others.into_iter().map(found).collect() }
    }
}

/// What one name of a listing is, by its name alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Single,
    Shard,
    Index,
}

/// Whether `name` (a file name, no folder) is an index of safetensors shards by the names
/// transformers and diffusers write (see the module doc).
pub fn is_index_name(name: &str) -> bool {
    matches!(role_of(name), Some((_, Role::Index)))
}

/// The checkpoint `name` belongs to, and what it is to it; `None` for a file that is no
/// safetensors file nor index.
fn role_of(name: &str) -> Option<(String, Role)> {
    if let Some(base) = name.strip_suffix(".json") {
        if let Some(stem) = base.strip_suffix(".safetensors.index") {
            return (!stem.is_empty()).then(|| (stem.to_string(), Role::Index));
        }
        let (before, last) = base.rsplit_once('.')?;
        let (stem, variant) = if let Some(stem) = before.strip_suffix(".safetensors.index") {
            (stem, last)
        } else if last == "index" {
            let (stem, variant) = before.rsplit_once('.')?;
            (stem.strip_suffix(".safetensors")?, variant)
        } else {
            return None;
        };
        return (!stem.is_empty() && !variant.is_empty()).then(|| (format!("{stem}.{variant}"), Role::Index));
    }
    let stem = name.strip_suffix(".safetensors")?;
    if let Some(shard_of) = shard_stem(stem) {
        return Some((shard_of, Role::Shard));
    }
    Some((stem.to_string(), Role::Single))
}

/// The checkpoint a shard's stem names (`model` for `model-00001-of-00002`, `x.fp16` for
/// `x-00001-of-00002.fp16`); `None` if `stem` is no shard's.
fn shard_stem(stem: &str) -> Option<String> {
    let numbered = |s: &str| -> Option<String> {
        let (rest, total) = s.rsplit_once("-of-")?;
        let (base, number) = rest.rsplit_once('-')?;
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        (digits(total) && digits(number) && !base.is_empty()).then(|| base.to_string())
    };
    if let Some(base) = numbered(stem) {
        return Some(base);
    }
    let (numbered_part, variant) = stem.rsplit_once('.')?;
    Some(format!("{}.{variant}", numbered(numbered_part)?)).filter(|_| !variant.is_empty())
}

/// A checkpoint of a folder by its name, with its files.
type Named = (String, Choice);

/// Whether a checkpoint's files are of one kind (a file, an index, shards).
type Kind = fn(&Choice) -> bool;

/// The files of one checkpoint name in a folder.
#[derive(Debug, Default)]
struct Group<'a> {
    single: Option<&'a str>,
    shards: Vec<&'a str>,
    indexes: Vec<&'a str>,
}

/// The checkpoints the folder whose files are `names` (file names, no folders) holds, by the rule
/// of the module doc. A folder with no `*.safetensors` file holds none; several indexes with no
/// standard name and no other way to choose is [`OpenProblem::Ambiguous`] naming them.
pub fn checkpoints_in(names: &[&str]) -> Result<InFolder, OpenProblem> {
    let mut groups: BTreeMap<String, Group<'_>> = BTreeMap::new();
    let mut sorted: Vec<&str> = names.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for name in sorted {
        let Some((key, role)) = role_of(name) else { continue };
        let group = groups.entry(key).or_default();
        match role {
            Role::Single => group.single = Some(name),
            Role::Shard => group.shards.push(name),
            Role::Index => group.indexes.push(name),
        }
    }
    // Every checkpoint of the folder, by name: an index each, the file, the shards no index takes.
    let mut all: Vec<Named> = Vec::new();
    for (key, group) in &groups {
        all.extend(group.indexes.iter().map(|i| (key.clone(), Choice::Index(i.to_string()))));
        all.extend(group.single.map(|f| (key.clone(), Choice::Single(f.to_string()))));
        match group.shards.as_slice() {
            _ if !group.indexes.is_empty() => {}
            [] => {}
            [one] => all.push((key.clone(), Choice::Single(one.to_string()))),
            many => all.push((key.clone(), Choice::Shards(many.iter().map(|s| s.to_string()).collect()))),
        }
    }
    let variant_of = |key: &str| -> Option<String> {
        let (base, variant) = key.rsplit_once('.')?;
        (STANDARD_NAMES.contains(&base) || groups.contains_key(base)).then(|| variant.to_string())
    };
    let main_at = main_position(&all, &variant_of)?;
    let (main, rest): (Option<Named>, Vec<Named>) = match main_at {
        Main::At(at) => {
            let main = all.remove(at);
            (Some(main), all)
        }
        Main::AllShards(keys) => {
            let (taken, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|(k, _)| keys.contains(k));
            let mut files: Vec<String> = taken.into_iter().flat_map(|(_, choice)| files_of(choice)).collect();
            files.sort_unstable();
            (Some((String::new(), Choice::Shards(files))), rest)
        }
        Main::None => (None, all),
    };
    let found = |(name, files): Named| Found { variant: variant_of(&name), name, files };
    let mut others: Vec<Found> = rest.into_iter().map(found).collect();
    // Each other checkpoint gets a name of its own, a plain file name: else its first file's.
    let mut taken: Vec<String> = Vec::new();
    for other in &mut others {
        if matches!(other.name.as_str(), "" | "." | "..") || taken.contains(&other.name) {
            other.name = files_of(other.files.clone()).into_iter().next().unwrap_or_default();
        }
        taken.push(other.name.clone());
    }
    Ok(InFolder { main: main.map(found), others })
}

/// [`checkpoints_in`] the folder `folder` (`""`: the root) of a listing of paths (a local walk, a
/// repository's or a prefix's files), every file named by its path in the listing (so is each
/// index an [`OpenProblem::Ambiguous`] names).
pub fn checkpoints_of(listing: &[Sibling], folder: &str) -> Result<InFolder, OpenProblem> {
    let prefix = if folder.is_empty() { String::new() } else { format!("{folder}/") };
    let names: Vec<&str> = listing
        .iter()
        .filter_map(|s| s.path.strip_prefix(prefix.as_str()))
        .filter(|name| !name.contains('/'))
        .collect();
    match checkpoints_in(&names) {
        Ok(found) => Ok(found.joined(&prefix)),
        Err(OpenProblem::Ambiguous(names)) => {
            Err(OpenProblem::Ambiguous(names.into_iter().map(|n| format!("{prefix}{n}")).collect()))
        }
        Err(other) => Err(other),
    }
}

/// Which of a folder's checkpoints is the main one.
enum Main {
    /// The one at this place of the list.
    At(usize),
    /// Every file of the checkpoints of these names, as the shards of one.
    AllShards(Vec<String>),
    /// None: the folder holds no checkpoint.
    None,
}

/// The main checkpoint among `all` (name and files, in name order), by the rule of the module doc.
fn main_position(all: &[Named], variant_of: &dyn Fn(&str) -> Option<String>) -> Result<Main, OpenProblem> {
    let find = |key: &str, pick: Kind| all.iter().position(|(k, c)| k == key && pick(c));
    let single: Kind = |c| matches!(c, Choice::Single(_));
    let index: Kind = |c| matches!(c, Choice::Index(_));
    let shards: Kind = |c| matches!(c, Choice::Shards(_));
    // transformers looks for its file first, diffusers for its index.
    let orders: [(&str, [Kind; 3]); 2] =
        [("model", [single, index, shards]), ("diffusion_pytorch_model", [index, single, shards])];
    for (key, order) in orders {
        if let Some(at) = order.iter().find_map(|pick| find(key, *pick)) {
            return Ok(Main::At(at));
        }
    }
    let plain: Vec<usize> = (0..all.len()).filter(|&i| variant_of(&all[i].0).is_none()).collect();
    if plain.is_empty() {
        return Ok(if all.is_empty() { Main::None } else { Main::At(0) });
    }
    let indexes: Vec<usize> = plain.iter().copied().filter(|&i| index(&all[i].1)).collect();
    match (indexes.as_slice(), plain.as_slice()) {
        ([one], _) => Ok(Main::At(*one)),
        ([_, _, ..], _) => {
            Err(OpenProblem::Ambiguous(indexes.iter().flat_map(|&i| files_of(all[i].1.clone())).collect()))
        }
        (_, [one]) => Ok(Main::At(*one)),
        (_, many) => Ok(Main::AllShards(many.iter().map(|&i| all[i].0.clone()).collect())),
    }
}

/// The names a choice holds.
fn files_of(choice: Choice) -> Vec<String> {
    match choice {
        Choice::Single(name) | Choice::Index(name) => vec![name],
        Choice::Shards(names) => names,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(name: &str) -> Choice {
        Choice::Single(name.to_string())
    }

    fn index(name: &str) -> Choice {
        Choice::Index(name.to_string())
    }

    fn shards(names: &[&str]) -> Choice {
        Choice::Shards(names.iter().map(|n| n.to_string()).collect())
    }

    /// Another checkpoint's name, variant and files.
    type Other = (String, Option<String>, Choice);

    /// The main checkpoint's files and, for each other one, its name, variant and files.
    fn decided(names: &[&str]) -> (Option<Choice>, Vec<Other>) {
        let found = checkpoints_in(names).unwrap();
        let others = found.others.into_iter().map(|f| (f.name, f.variant, f.files)).collect();
        (found.main.map(|m| m.files), others)
    }

    fn other(name: &str, variant: Option<&str>, files: Choice) -> Other {
        (name.to_string(), variant.map(str::to_string), files)
    }

    #[test]
    fn names_are_read_as_transformers_and_diffusers_write_them() {
        let role = role_of;
        assert_eq!(role("model.safetensors"), Some(("model".into(), Role::Single)));
        assert_eq!(role("model.fp16.safetensors"), Some(("model.fp16".into(), Role::Single)));
        assert_eq!(role("model-00001-of-00002.safetensors"), Some(("model".into(), Role::Shard)));
        assert_eq!(role("model.fp16-00001-of-00002.safetensors"), Some(("model.fp16".into(), Role::Shard)));
        assert_eq!(role("unet-00002-of-00002.fp16.safetensors"), Some(("unet.fp16".into(), Role::Shard)));
        assert_eq!(role("model.safetensors.index.json"), Some(("model".into(), Role::Index)));
        assert_eq!(role("model.safetensors.index.fp16.json"), Some(("model.fp16".into(), Role::Index)));
        assert_eq!(role("d.safetensors.fp16.index.json"), Some(("d.fp16".into(), Role::Index)));
        assert_eq!(role("model.fp16.safetensors.index.json"), Some(("model.fp16".into(), Role::Index)));
        for no in ["config.json", "x.index.json", ".safetensors.index.json", "a.bin", "model.safetensors.json"] {
            assert_eq!(role(no), None, "{no}");
        }
        assert!(is_index_name("model.safetensors.index.bf16.json") && !is_index_name("model.safetensors"));
    }

    #[test]
    fn a_variant_beside_the_standard_file_is_another_checkpoint() {
        let (main, others) = decided(&["config.json", "model.fp16.safetensors", "model.safetensors"]);
        assert_eq!(main, Some(single("model.safetensors")));
        assert_eq!(others, [other("model.fp16", Some("fp16"), single("model.fp16.safetensors"))]);
        let unet = ["diffusion_pytorch_model.fp16.safetensors", "diffusion_pytorch_model.safetensors"];
        let (main, others) = decided(&unet);
        assert_eq!(main, Some(single("diffusion_pytorch_model.safetensors")));
        assert_eq!(others, [other("diffusion_pytorch_model.fp16", Some("fp16"), single(unet[0]))]);
    }

    #[test]
    fn sharded_variants_are_their_index_in_every_spelling() {
        let names = [
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.fp16.json",
            "model.fp16-00001-of-00002.safetensors",
            "model.fp16-00002-of-00002.safetensors",
            "diffusion_pytorch_model.safetensors.bf16.index.json",
            "diffusion_pytorch_model-00001-of-00002.bf16.safetensors",
        ];
        let (main, others) = decided(&names);
        assert_eq!(main, Some(index("model.safetensors.index.json")));
        assert_eq!(
            others,
            [
                other("diffusion_pytorch_model.bf16", Some("bf16"), index(names[6])),
                other("model.fp16", Some("fp16"), index("model.safetensors.index.fp16.json")),
            ]
        );
    }

    #[test]
    fn consolidated_beside_shards_is_served_too() {
        let names =
            ["consolidated.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
        let (main, others) = decided(&names);
        assert_eq!(main, Some(shards(&names[1..])));
        assert_eq!(others, [other("consolidated", None, single("consolidated.safetensors"))]);
        let (main, others) = decided(&[names[0], names[1], "model.safetensors.index.json"]);
        assert_eq!(main, Some(index("model.safetensors.index.json")));
        assert_eq!(others, [other("consolidated", None, single("consolidated.safetensors"))]);
    }

    /// transformers looks for `model.safetensors` before its index, diffusers for its index first.
    #[test]
    fn the_standard_names_are_looked_for_in_the_loaders_order() {
        let (main, others) = decided(&["model.safetensors", "model.safetensors.index.json"]);
        assert_eq!(main, Some(single("model.safetensors")));
        assert_eq!(others, [other("model", None, index("model.safetensors.index.json"))]);
        let d = ["diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"];
        let (main, others) = decided(&d);
        assert_eq!(main, Some(index(d[1])));
        assert_eq!(others, [other("diffusion_pytorch_model", None, single(d[0]))]);
        let (main, others) = decided(&["model.safetensors", "diffusion_pytorch_model.safetensors"]);
        assert_eq!(main, Some(single("model.safetensors")));
        assert_eq!(others.len(), 1);
    }

    /// Without a standard name: the only index, else the only file, else every file as shards (a
    /// directory of shards, as a folder always was); variants of them stay other checkpoints.
    #[test]
    fn without_a_standard_name_the_folder_is_what_it_always_was() {
        assert_eq!(decided(&["a.safetensors", "README.md"]), (Some(single("a.safetensors")), vec![]));
        assert_eq!(
            decided(&["b.safetensors", "a.safetensors"]),
            (Some(shards(&["a.safetensors", "b.safetensors"])), vec![])
        );
        let (main, others) = decided(&["a.safetensors", "b.safetensors", "a.fp16.safetensors"]);
        assert_eq!(main, Some(shards(&["a.safetensors", "b.safetensors"])));
        assert_eq!(others, [other("a.fp16", Some("fp16"), single("a.fp16.safetensors"))]);
        let (main, others) = decided(&["w.safetensors.index.json", "part1.safetensors", "part2.safetensors"]);
        assert_eq!(main, Some(index("w.safetensors.index.json")));
        assert_eq!(others.len(), 2);
        let two = ["a.safetensors.index.json", "b.safetensors.index.json"];
        assert!(matches!(checkpoints_in(&two), Err(OpenProblem::Ambiguous(v)) if v == two));
        assert_eq!(checkpoints_in(&["config.json"]).unwrap(), InFolder::default());
    }

    /// A folder of variants alone (`save_pretrained(dir, variant="fp16")` only) has its first as
    /// the main one: served as it always was, never refused.
    #[test]
    fn a_folder_of_variants_alone_has_the_first_as_its_main_checkpoint() {
        let (main, others) = decided(&["model.fp16.safetensors", "model.bf16.safetensors"]);
        assert_eq!(main, Some(single("model.bf16.safetensors")));
        assert_eq!(others, [other("model.fp16", Some("fp16"), single("model.fp16.safetensors"))]);
    }

    #[test]
    fn other_checkpoints_have_distinct_plain_names() {
        // A file and an index of one name: the second takes its file's name.
        let (_, others) = decided(&["x.safetensors", "x.safetensors.index.json", "model.safetensors"]);
        let names: Vec<&str> = others.iter().map(|(n, ..)| n.as_str()).collect();
        assert_eq!(names, ["x", "x.safetensors"]);
        let (_, others) = decided(&["..safetensors", "model.safetensors"]);
        assert_eq!(others[0].0, "..safetensors");
    }
}
