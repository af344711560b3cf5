//! The `metadata.json` file: the header's `__metadata__`, and for every tensor its dtype, shape,
//! offsets and the path it is served under.
//!
//! Schema (version 1):
//! ```text
//! { "stfs_metadata_version": 1,
//!   "shards": [ { "source": PATH, "file_size": N, "header_len": N, "data_start": N,
//!                 "metadata": {..} } ],     // per-shard __metadata__, only when sharded
//!   "metadata": {..} | null,          // __metadata__ of the only shard (null when sharded)
//!   "tensors": { NAME: { "dtype": "BF16", "shape": [..], "byte_len": N,
//!                        "data_offsets": [BEGIN, END],  // relative to the shard's data section
//!                        "offset": N,                   // absolute offset in the shard file
//!                        "shard": I,                    // index into "shards"
//!                        "path": "escaped/file/name",
//!                        "served_dtype": "F32",         // the dtype the file at `path` serves
//!                        "served_byte_len": N,          // its size (the converted size under as=f32)
//!                        "npy_path": "name.npy" } },    // only under -o npy
//!   "files": { PATH: NAME },          // every served tensor path back to its tensor name
//!   "checkpoint_files": [ { "path": NAME, "size": N,      // the checkpoint's own files in the
//!                           "shard": I } ],               // root; "shard" absent for an index
//!   "repo_files": [ { "path": NAME, "size": N } ],        // small files beside the checkpoint
//!   "components": [ { "path": FOLDER, "tensors": N, "shards": N } ],  // root only; see below
//!   "checkpoints": [ { "path": ".", "name": NAME, "variant": V | null,  // only in a folder with
//!                      "tensors": N, "shards": N } ] }                // other checkpoints
//! ```
//!
//! A folder with other checkpoints than its main one (`model.fp16.safetensors` beside
//! `model.safetensors`, `consolidated.safetensors` beside shards) lists each in `checkpoints`,
//! its own main one first (`"path": "."`), the others at `%.checkpoints/NAME`, each of those a
//! folder with its own `metadata.json` of this schema (its `checkpoint_files` are in the main
//! one's folder: `../../model.fp16.safetensors`). Their files (shards, index files) are served in
//! the folder beside the main one's and listed in its `checkpoint_files` with the `checkpoint`
//! they are of (`"checkpoint": "model.fp16"`) and no `shard`: `files` still maps the folder's
//! tensor files only, and a `checkpoint_files` entry with `shard` is still a shard of `shards`.
//!
//! A mount of a model repository (a diffusers pipeline, a sentence-transformers model) has a
//! component in each folder that holds a checkpoint: that folder holds its own `metadata.json` of
//! this schema, every path in it relative to that folder. The root's lists every such folder in
//! `components` (absent when there is none, so a flat model's is as it always was); `repo_files`
//! lists the small files of the folders that are no component (`scheduler/scheduler_config.json`)
//! in the root's, by their path from the root.
//!
//! `checkpoint_files` and `repo_files` are empty under `-o no_checkpoint_file`, `repo_files` for
//! a single file or a URL of a file or index (`hf://` names, directories and local indexes bring
//! them; each is absent before it was added: readers should treat a missing one as empty).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::format::Dtype;
use crate::tree::namespace::{ComponentInfo, Namespace, ServedFile};

/// Version of the schema above; bumped on incompatible changes.
pub const METADATA_VERSION: u64 = 1;

#[derive(Serialize)]
struct Doc<'a> {
    stfs_metadata_version: u64,
    shards: Vec<ShardDoc<'a>>,
    metadata: Option<&'a BTreeMap<String, String>>,
    tensors: BTreeMap<&'a str, TensorDoc<'a>>,
    files: BTreeMap<&'a str, &'a str>,
    checkpoint_files: Vec<ServedDoc<'a>>,
    repo_files: Vec<ServedDoc<'a>>,
    components: Vec<ComponentDoc<'a>>,
    checkpoints: Vec<CheckpointDoc<'a>>,
}

#[derive(Serialize)]
struct CheckpointDoc<'a> {
    path: &'a str,
    name: &'a str,
    variant: Option<&'a str>,
    tensors: usize,
    shards: usize,
}

#[derive(Serialize)]
struct ComponentDoc<'a> {
    path: &'a str,
    tensors: usize,
    shards: usize,
}

#[derive(Serialize)]
struct ServedDoc<'a> {
    path: std::borrow::Cow<'a, str>,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint: Option<&'a str>,
}

#[derive(Serialize)]
struct ShardDoc<'a> {
    source: &'a str,
    file_size: u64,
    header_len: u64,
    data_start: u64,
    /// Only for sharded checkpoints; a single shard's is the top-level `metadata`, not repeated.
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a BTreeMap<String, String>>,
}

#[derive(Serialize)]
struct TensorDoc<'a> {
    dtype: Dtype,
    shape: &'a [u64],
    byte_len: u64,
    data_offsets: [u64; 2],
    offset: u64,
    shard: usize,
    path: &'a str,
    served_dtype: Dtype,
    served_byte_len: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    npy_path: Option<&'a str>,
}

/// Renders the root's metadata.json for a built namespace: one line per shard, tensor and file.
pub fn render(ns: &Namespace) -> Vec<u8> {
    render_component(ns, 0)
}

/// Renders component `index`'s metadata.json (0: the root's): its shards, its tensors with paths
/// relative to its folder, its files; for the root, the other components.
pub fn render_component(ns: &Namespace, index: usize) -> Vec<u8> {
    let Some(c) = ns.components().get(index) else { return render_empty() };
    let own = &ns.shards()[c.shards.clone()];
    let sharded = own.len() > 1;
    let shards = own
        .iter()
        .map(|s| ShardDoc {
            source: &s.name,
            file_size: s.header.file_len,
            header_len: s.header.header_len,
            data_start: s.header.data_start(),
            metadata: if sharded { s.header.metadata.as_ref() } else { None },
        })
        .collect();
    let mut tensors = BTreeMap::new();
    let mut files = BTreeMap::new();
    for t in &ns.tensors()[c.tensors.clone()] {
        let relative = t.start - ns.shards()[t.shard].header.data_start();
        let path = c.relative(&t.path);
        tensors.insert(
            t.name.as_str(),
            TensorDoc {
                dtype: t.dtype,
                shape: &t.shape,
                byte_len: t.len,
                data_offsets: [relative, relative + t.len],
                offset: t.start,
                shard: t.shard - c.shards.start,
                path,
                served_dtype: t.served_dtype,
                served_byte_len: t.served_len,
                npy_path: t.npy_path.as_deref().map(|p| c.relative(p)),
            },
        );
        files.insert(path, t.name.as_str());
        if let Some(npy) = &t.npy_path {
            files.insert(c.relative(npy), t.name.as_str());
        }
    }
    let metadata = match own {
        [only] => only.header.metadata.as_ref(),
        _ => None,
    };
    let (mut checkpoint_files, repo_files) = (served(&c.served, ""), served(&c.repo_served, ""));
    if let Some(owner) = &c.checkpoint.other_of {
        // Its files are in its main one's folder: paths from its own go up to it.
        let up = "../".repeat(relative_to(owner, &c.folder).split('/').count());
        checkpoint_files = served(&c.served, &up);
    }
    let others: Vec<&ComponentInfo> = if c.checkpoint.other_of.is_some() {
        Vec::new()
    } else {
        ns.components().iter().filter(|o| o.checkpoint.other_of.as_deref() == Some(c.folder.as_str())).collect()
    };
    let mut checkpoints = Vec::new();
    for other in &others {
        let name = other.checkpoint.name.as_str();
        checkpoint_files.extend(served(&other.served, "").into_iter().map(|f| ServedDoc {
            shard: None,
            checkpoint: Some(name),
            ..f
        }));
    }
    if !others.is_empty() {
        checkpoints.push(checkpoint_doc(c, "."));
        checkpoints.extend(others.iter().map(|o| checkpoint_doc(o, relative_to(&c.folder, &o.folder))));
    }
    let components = if index == 0 {
        ns.components()[1..].iter().filter(|c| c.checkpoint.other_of.is_none()).map(component_doc).collect()
    } else {
        Vec::new()
    };
    let doc = Doc {
        stfs_metadata_version: METADATA_VERSION,
        shards,
        metadata,
        tensors,
        files,
        checkpoint_files,
        repo_files,
        components,
        checkpoints,
    };
    write_one_entry_per_line(&doc)
}

/// `path` (below `folder`, or the root's when it is `""`) relative to `folder`.
fn relative_to<'a>(folder: &str, path: &'a str) -> &'a str {
    if folder.is_empty() {
        return path;
    }
    path.strip_prefix(folder).and_then(|p| p.strip_prefix('/')).unwrap_or(path)
}

fn checkpoint_doc<'a>(c: &'a ComponentInfo, path: &'a str) -> CheckpointDoc<'a> {
    CheckpointDoc {
        path,
        name: &c.checkpoint.name,
        variant: c.checkpoint.variant.as_deref(),
        tensors: c.tensors.len(),
        shards: c.shards.len(),
    }
}

/// The document of a namespace with no such component (never asked for by `build`).
fn render_empty() -> Vec<u8> {
    let doc = Doc {
        stfs_metadata_version: METADATA_VERSION,
        shards: Vec::new(),
        metadata: None,
        tensors: BTreeMap::new(),
        files: BTreeMap::new(),
        checkpoint_files: Vec::new(),
        repo_files: Vec::new(),
        components: Vec::new(),
        checkpoints: Vec::new(),
    };
    write_one_entry_per_line(&doc)
}

fn component_doc(c: &ComponentInfo) -> ComponentDoc<'_> {
    ComponentDoc { path: &c.folder, tensors: c.tensors.len(), shards: c.shards.len() }
}

/// metadata.json's entries for files served in a component's folder, each path after `up`
/// (`../../` for another checkpoint's files, in its main one's folder).
fn served<'a>(files: &'a [ServedFile], up: &str) -> Vec<ServedDoc<'a>> {
    let path = |name: &'a str| if up.is_empty() { name.into() } else { format!("{up}{name}").into() };
    files.iter().map(|f| ServedDoc { path: path(&f.name), size: f.size, shard: f.shard, checkpoint: None }).collect()
}

/// Writes the document with one line per shard, tensor and file (each entry compact): readable
/// with `cat` and `grep`, and without the one-number-per-line blow-up of fully pretty JSON.
fn write_one_entry_per_line(doc: &Doc<'_>) -> Vec<u8> {
    use std::io::Write;
    // Writing JSON of strings and numbers into a Vec cannot fail.
    fn compact<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
        let _ = value.serialize(&mut serde_json::Serializer::with_formatter(&mut *out, Escaping));
    }
    fn map<K: Serialize, V: Serialize>(out: &mut Vec<u8>, entries: &BTreeMap<K, V>) {
        out.extend_from_slice(b"{");
        for (i, (k, v)) in entries.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
            compact(out, k);
            out.extend_from_slice(b": ");
            compact(out, v);
        }
        out.extend_from_slice(if entries.is_empty() { b"}" } else { b"\n  }" });
    }
    let mut out = Vec::new();
    let _ = write!(out, "{{\n  \"stfs_metadata_version\": {},\n  \"shards\": [", doc.stfs_metadata_version);
    for (i, shard) in doc.shards.iter().enumerate() {
        out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
        compact(&mut out, shard);
    }
    out.extend_from_slice(if doc.shards.is_empty() { b"],\n  \"metadata\": " } else { b"\n  ],\n  \"metadata\": " });
    compact(&mut out, &doc.metadata);
    out.extend_from_slice(b",\n  \"tensors\": ");
    map(&mut out, &doc.tensors);
    out.extend_from_slice(b",\n  \"files\": ");
    map(&mut out, &doc.files);
    for (key, list) in [("checkpoint_files", &doc.checkpoint_files), ("repo_files", &doc.repo_files)] {
        let _ = write!(out, ",\n  \"{key}\": [");
        for (i, file) in list.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
            compact(&mut out, file);
        }
        out.extend_from_slice(if list.is_empty() { b"]" } else { b"\n  ]" });
    }
    // Only when there are components: a flat model's document is as it always was.
    if !doc.components.is_empty() {
        out.extend_from_slice(b",\n  \"components\": [");
        for (i, component) in doc.components.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
            compact(&mut out, component);
        }
        out.extend_from_slice(b"\n  ]");
    }
    // Only in a folder with other checkpoints than its main one.
    if !doc.checkpoints.is_empty() {
        out.extend_from_slice(b",\n  \"checkpoints\": [");
        for (i, checkpoint) in doc.checkpoints.iter().enumerate() {
            out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
            compact(&mut out, checkpoint);
        }
        out.extend_from_slice(b"\n  ]");
    }
    out.extend_from_slice(b"\n}\n");
    out
}

/// serde_json's compact formatter, except that a character that does not print as itself is
/// written as a `\uXXXX` escape (a surrogate pair above U+FFFF) rather than as it is. serde_json
/// escapes only U+0000 to U+001F; tensor names and `__metadata__` come from the checkpoint and may
/// hold DEL, C1 controls (U+009B is CSI to a terminal), line separators or bidirectional overrides,
/// which `cat metadata.json` or `stfs inspect --json` would otherwise hand to the terminal. The JSON
/// means the same strings either way.
struct Escaping;

impl serde_json::ser::Formatter for Escaping {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if fragment.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return writer.write_all(fragment.as_bytes());
        }
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| !crate::format::prints_as_itself(c)) {
            writer.write_all(&rest.as_bytes()[..at])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}
