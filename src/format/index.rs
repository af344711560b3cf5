//! Sharded checkpoints: the `model.safetensors.index.json` format (transformers' `weight_map`) and
//! the rules that make several shards one namespace.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::hash::Hash;

use serde::Deserialize;

use super::escape::PrintablePath;
use super::header::Header;

/// A parsed index file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// Shard file names (relative to the index), in order of first appearance in the weight map.
    pub shards: Vec<String>,
    /// Tensor name to shard file name.
    pub weight_map: BTreeMap<String, String>,
    /// Other spellings the weight map uses for a file in `shards` (by position there), as
    /// [`Index::merge_spellings`] found them: `./a.safetensors` for `a.safetensors`.
    pub aliases: BTreeMap<String, usize>,
}

impl Index {
    /// Makes shard names that `file_of` maps to one file one shard: the first spelling (in sorted
    /// order) stays in `shards` and the others become its aliases. `file_of` gives the file a name
    /// stands for: its canonical path, or a URL without `./` segments.
    pub fn merge_spellings<K: Eq + Hash>(&mut self, file_of: impl Fn(&str) -> K) {
        let mut first: HashMap<K, usize> = HashMap::new();
        let mut kept = Vec::with_capacity(self.shards.len());
        for name in std::mem::take(&mut self.shards) {
            match first.entry(file_of(&name)) {
                Entry::Occupied(e) => {
                    self.aliases.insert(name, *e.get());
                }
                Entry::Vacant(e) => {
                    e.insert(kept.len());
                    kept.push(name);
                }
            }
        }
        self.shards = kept;
    }

    /// Every name the weight map calls a file in `shards` by (its name there and its aliases), to
    /// its position in `shards`: built once, so looking up every tensor's shard is linear overall.
    pub fn positions(&self) -> HashMap<&str, usize> {
        let names = self.shards.iter().enumerate().map(|(i, name)| (name.as_str(), i));
        names.chain(self.aliases.iter().map(|(name, &i)| (name.as_str(), i))).collect()
    }

    /// Every spelling of every shard, by position in `shards`: its name there, then its aliases.
    pub fn spellings(&self) -> Vec<Vec<&str>> {
        let mut spellings: Vec<Vec<&str>> = self.shards.iter().map(|name| vec![name.as_str()]).collect();
        for (alias, &i) in &self.aliases {
            if let Some(names) = spellings.get_mut(i) {
                names.push(alias);
            }
        }
        spellings
    }
}

/// A shard name with its `.` segments dropped (`./a/./b.safetensors` is `a/b.safetensors`): the
/// lexical part of telling two spellings of one file apart, which is all a URL allows.
pub fn without_dot_segments(name: &str) -> String {
    name.split('/').filter(|c| *c != ".").collect::<Vec<_>>().join("/")
}

#[derive(Deserialize)]
struct RawIndex {
    // `metadata` (with `total_size`, often wrong) is deliberately not read: nothing depends on it.
    weight_map: BTreeMap<String, String>,
}

/// Why an index file cannot be read.
#[derive(Debug)]
pub enum IndexError {
    /// The file is not JSON with a `weight_map` object of strings.
    InvalidJson {
        /// serde_json's description, with line and column.
        error: serde_json::Error,
    },
    /// The `weight_map` names no tensor at all.
    EmptyWeightMap,
    /// A shard name is absolute, empty, climbs out with `..`, or holds a NUL byte.
    ShardOutsideDirectory {
        /// The shard name as written in the index.
        shard: String,
    },
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::InvalidJson { error } => write!(f, "invalid index JSON: {error}"),
            IndexError::EmptyWeightMap => f.write_str("the index's weight_map is empty"),
            IndexError::ShardOutsideDirectory { shard } => {
                write!(f, "shard name {shard:?} is not a relative path inside the index's directory")
            }
        }
    }
}

impl std::error::Error for IndexError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IndexError::InvalidJson { error } => Some(error),
            IndexError::EmptyWeightMap | IndexError::ShardOutsideDirectory { .. } => None,
        }
    }
}

/// Why several shards do not make one checkpoint (shard names shown with [`PrintablePath`]: they
/// come from the index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardError {
    /// Two shards hold a tensor of the same name.
    DuplicateTensor {
        /// The tensor name.
        tensor: String,
        /// The shard that holds it first.
        first: String,
        /// The shard that holds it again.
        second: String,
    },
    /// The index puts a tensor in one shard, but another shard holds it.
    WrongShard {
        /// The tensor name.
        tensor: String,
        /// The shard the index names.
        listed: String,
        /// The shard that holds it.
        found: String,
    },
    /// The index puts a tensor in a shard that does not hold it.
    MissingTensor {
        /// The tensor name.
        tensor: String,
        /// The shard the index names.
        listed: String,
    },
}

impl fmt::Display for ShardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardError::DuplicateTensor { tensor, first, second } => {
                write!(f, "tensor {tensor:?} is in two shards: {} and {}", PrintablePath(first), PrintablePath(second))
            }
            ShardError::WrongShard { tensor, listed, found } => {
                let (listed, found) = (PrintablePath(listed), PrintablePath(found));
                write!(f, "the index puts tensor {tensor:?} in {listed}, but it is in {found}")
            }
            ShardError::MissingTensor { tensor, listed } => {
                let listed = PrintablePath(listed);
                write!(f, "the index names tensor {tensor:?} in {listed}, which does not hold it")
            }
        }
    }
}

impl std::error::Error for ShardError {}

/// Parses an index file. Shard names must be relative paths that stay inside the index's directory.
pub fn parse_index(bytes: &[u8]) -> Result<Index, IndexError> {
    let raw: RawIndex = serde_json::from_slice(bytes).map_err(|error| IndexError::InvalidJson { error })?;
    if raw.weight_map.is_empty() {
        return Err(IndexError::EmptyWeightMap);
    }
    let mut shards: Vec<String> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for file in raw.weight_map.values() {
        if file.is_empty()
            || file.starts_with('/')
            || file.split('/').any(|c| c == ".." || c.is_empty())
            || file.contains('\0')
        {
            return Err(IndexError::ShardOutsideDirectory { shard: file.clone() });
        }
        if seen.insert(file) {
            shards.push(file.clone());
        }
    }
    shards.sort();
    Ok(Index { shards, weight_map: raw.weight_map, aliases: BTreeMap::new() })
}

/// Checks that tensor names are unique across shards and, for an index, that every tensor it names
/// is in the shard it names (by any of its spellings). `names[i]` is how shard `i` is called in
/// messages.
pub fn check_shards(names: &[String], headers: &[&Header], index: Option<&Index>) -> Result<(), ShardError> {
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for (i, h) in headers.iter().enumerate() {
        for t in &h.tensors {
            if let Some(&j) = owner.get(t.name.as_str()) {
                return Err(ShardError::DuplicateTensor {
                    tensor: t.name.clone(),
                    first: names[j].clone(),
                    second: names[i].clone(),
                });
            }
            owner.insert(&t.name, i);
        }
    }
    if let Some(index) = index {
        let positions = index.positions();
        for (tensor, file) in &index.weight_map {
            let Some(&shard) = positions.get(file.as_str()) else { continue };
            match owner.get(tensor.as_str()) {
                Some(&i) if i == shard => {}
                Some(&i) => {
                    return Err(ShardError::WrongShard {
                        tensor: tensor.clone(),
                        listed: file.clone(),
                        found: names[i].clone(),
                    })
                }
                None => return Err(ShardError::MissingTensor { tensor: tensor.clone(), listed: file.clone() }),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Dtype, TensorInfo};

    fn header(names: &[&str]) -> Header {
        let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> =
            names.iter().map(|n| (n.to_string(), Dtype::U8, vec![1], vec![1])).collect();
        let bytes = crate::format::writer::serialize(&tensors, None).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        crate::format::parse_header(&bytes[8..8 + n], bytes.len() as u64).unwrap()
    }

    #[test]
    fn index_parses_and_ignores_total_size() {
        let idx = parse_index(br#"{"metadata":{"total_size":"wrong"},"weight_map":{"b":"s2.safetensors","a":"s1.safetensors","c":"s1.safetensors"}}"#).unwrap();
        assert_eq!(idx.shards, ["s1.safetensors", "s2.safetensors"]);
        assert_eq!(idx.weight_map["b"], "s2.safetensors");
    }

    #[test]
    fn bad_indexes_are_refused() {
        for (text, needle) in [
            (&br#"{"weight_map":{}}"#[..], "empty"),
            (&br#"{"weight_map":{"a":"../x.safetensors"}}"#[..], "relative path"),
            (&br#"{"weight_map":{"a":"/etc/x"}}"#[..], "relative path"),
            (&br#"{"weight_map":{"a":1}}"#[..], "invalid index JSON"),
            (&br#"[1]"#[..], "invalid index JSON"),
        ] {
            assert!(parse_index(text).unwrap_err().to_string().contains(needle), "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn shard_consistency() {
        let names = vec!["s1".to_string(), "s2".to_string()];
        let (h1, h2) = (header(&["a", "b"]), header(&["c"]));
        assert_eq!(check_shards(&names, &[&h1, &h2], None), Ok(()));
        let dup = header(&["b"]);
        let err = check_shards(&names, &[&h1, &dup], None).unwrap_err();
        assert_eq!(err.to_string(), r#"tensor "b" is in two shards: s1 and s2"#);
        let idx = |map: &str| parse_index(format!(r#"{{"weight_map":{map}}}"#).as_bytes()).unwrap();
        let good = idx(r#"{"a":"s1","b":"s1","c":"s2"}"#);
        assert_eq!(check_shards(&names, &[&h1, &h2], Some(&good)), Ok(()));
        let wrong = idx(r#"{"a":"s2","c":"s1"}"#);
        let err = check_shards(&names, &[&h1, &h2], Some(&wrong)).unwrap_err();
        assert_eq!(err.to_string(), r#"the index puts tensor "a" in s2, but it is in s1"#);
        let missing = idx(r#"{"zzz":"s1","c":"s2"}"#);
        let err = check_shards(&names, &[&h1, &h2], Some(&missing)).unwrap_err();
        assert_eq!(err, ShardError::MissingTensor { tensor: "zzz".into(), listed: "s1".into() });
        assert_eq!(err.to_string(), r#"the index names tensor "zzz" in s1, which does not hold it"#);
    }

    /// Shard names come from the index: shown escaped, one cannot forge a line or a terminal escape.
    #[test]
    fn shard_names_in_messages_are_escaped() {
        let (hostile, tensor) = ("s\n\x1b[2J".to_string(), "t".to_string());
        let err =
            ShardError::DuplicateTensor { tensor: tensor.clone(), first: hostile.clone(), second: "b\u{2028}".into() };
        assert_eq!(err.to_string(), r#"tensor "t" is in two shards: s\n\u{1b}[2J and b\u{2028}"#);
        let err = ShardError::WrongShard { tensor: tensor.clone(), listed: hostile.clone(), found: "b".into() };
        assert_eq!(err.to_string(), r#"the index puts tensor "t" in s\n\u{1b}[2J, but it is in b"#);
        let err = ShardError::MissingTensor { tensor, listed: hostile };
        assert_eq!(err.to_string(), r#"the index names tensor "t" in s\n\u{1b}[2J, which does not hold it"#);
    }

    #[test]
    fn one_file_under_two_spellings_is_one_shard() {
        let map =
            r#"{"weight_map":{"w":"a.safetensors","v":"./a.safetensors","u":"b.safetensors","x":"./b.safetensors"}}"#;
        let mut idx = parse_index(map.as_bytes()).unwrap();
        assert_eq!(idx.shards, ["./a.safetensors", "./b.safetensors", "a.safetensors", "b.safetensors"]);
        idx.merge_spellings(without_dot_segments);
        assert_eq!(idx.shards, ["./a.safetensors", "./b.safetensors"]);
        let positions = idx.positions();
        assert_eq!((positions.get("a.safetensors"), positions.get("./b.safetensors")), (Some(&0), Some(&1)));
        assert_eq!(idx.spellings(), [["./a.safetensors", "a.safetensors"], ["./b.safetensors", "b.safetensors"]]);
        assert_eq!(positions.get("c.safetensors"), None);
        assert_eq!(without_dot_segments("./x/./y.safetensors"), "x/y.safetensors");
        let names = vec!["A".to_string(), "B".to_string()];
        let (a, b) = (header(&["w", "v"]), header(&["u", "x"]));
        assert_eq!(check_shards(&names, &[&a, &b], Some(&idx)), Ok(()));
    }

    /// 200,000 shard names (100,000 files, each spelled two ways): parsing, merging and checking
    /// are linear. Each was quadratic (a Vec::contains per weight-map entry, a linear search per
    /// tensor): 19 s for 100,000 names in a release build, minutes here.
    #[test]
    fn an_index_of_many_shards_is_read_in_linear_time() {
        let n = 100_000;
        let mut map = serde_json::Map::new();
        for i in 0..n {
            map.insert(format!("t{i}"), format!("s{i}.safetensors").into());
            map.insert(format!("u{i}"), format!("./s{i}.safetensors").into());
        }
        let started = std::time::Instant::now();
        let mut idx = parse_index(&serde_json::to_vec(&serde_json::json!({ "weight_map": map })).unwrap()).unwrap();
        assert_eq!(idx.shards.len(), 2 * n);
        idx.merge_spellings(without_dot_segments);
        assert_eq!((idx.shards.len(), idx.aliases.len()), (n, n));
        let tensor = |name: String| TensorInfo { name, dtype: Dtype::U8, shape: vec![0], data_offsets: (0, 0) };
        let spellings = idx.spellings();
        let (names, headers): (Vec<String>, Vec<Header>) = spellings
            .iter()
            .map(|names| {
                let i = &names[0]["./s".len()..names[0].len() - ".safetensors".len()];
                let tensors = vec![tensor(format!("t{i}")), tensor(format!("u{i}"))];
                (names.join(" and "), Header { header_len: 0, tensors, metadata: None, file_len: 0 })
            })
            .unzip();
        let headers: Vec<&Header> = headers.iter().collect();
        assert_eq!(check_shards(&names, &headers, Some(&idx)), Ok(()));
        // About 2 s in a debug build on a loaded machine; the bound only tells linear from quadratic.
        let elapsed = started.elapsed();
        assert!(elapsed < std::time::Duration::from_secs(60), "{} shard names took {elapsed:?}", 2 * n);
    }
}
