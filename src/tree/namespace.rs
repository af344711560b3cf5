//! The virtual tree: inodes, names, attributes and contents of every file a mount shows. Pure
//! data; `lay_out` lays tensors and files out into it, `build` adds metadata.json.
//!
//! Inode numbers are assigned in a fixed order (root, reserved files, the checkpoint's own files,
//! the repository's small files, then tensors in shard and offset order; then the same for each
//! component folder, in path order), so the same checkpoint gets the same numbers on every mount.
//!
//! A mount is one or more components ([`Component`]): the root, and each folder of a model
//! repository that holds a checkpoint of its own (`unet/`, `2_Dense/`). Each is laid out in its
//! folder as a flat mount lays out its root: its own `metadata.json`, its checkpoint's files, its
//! small files and a file per tensor. A folder's name (a component's, or one a small file is in)
//! is reserved in the directory it is in, as `config.json` is: a tensor named like it is escaped.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use crate::format::{Dtype, Header};
use crate::source::SourceId;

/// An inode number.
pub type Ino = u64;
/// The root directory's inode (FUSE requires 1).
pub const ROOT_INO: Ino = 1;
/// Name of the metadata file in the root.
pub const METADATA_NAME: &str = "metadata.json";
/// Name of the hidden control directory in the root.
pub const CONTROL_DIR: &str = ".stfs";
/// Name of the live counters file inside [`CONTROL_DIR`].
pub const STATS_NAME: &str = "stats.json";
/// Names no tensor file may take in the root (nor may the checkpoint's own files and the
/// repository's small files, which take the next places: a tensor file never takes theirs either).
pub const RESERVED: &[&str] = &[METADATA_NAME, CONTROL_DIR];
/// In tree layout, the file name a tensor takes inside the directory of the same name.
pub const SELF_NAME: &str = "%self";

/// How tensor names become paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Every tensor is a file in the root, named by [`names::escape`].
    #[default]
    Flat,
    /// Names are split on `.` into directories (`model.layers.0.w` is `model/layers/0/w`).
    Tree,
}

/// Which extra representations of each tensor the mount shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Views {
    /// Also show `NAME.npy`: a NumPy header followed by the tensor's bytes.
    pub npy: bool,
    /// Serve float tensors (BF16, F16, F8, F4, F64) converted to little-endian F32; integer and
    /// bool tensors keep their bytes ([`crate::views::f32::served_as_f32`]).
    pub as_f32: bool,
}

/// One shard of a checkpoint: a registered source and its validated header.
#[derive(Debug, Clone)]
pub struct Shard {
    /// The engine's id for the backing source.
    pub source: SourceId,
    /// The path or URL, as shown in metadata.json.
    pub name: String,
    /// The validated header.
    pub header: Header,
    /// The name the shard file itself is re-served under in the root, if it is.
    pub file: Option<String>,
}

/// A small file served in a component's folder as it was read at open.
#[derive(Debug, Clone)]
pub struct RootFile {
    /// Its path relative to the component's folder: a name, or `FOLDER/NAME` for a file of a
    /// folder that is not a component itself (`scheduler/scheduler_config.json`).
    pub name: String,
    /// Its bytes.
    pub bytes: Arc<[u8]>,
    /// What it is.
    pub kind: RootKind,
}

/// What a [`RootFile`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootKind {
    /// An `*.index.json` of the checkpoint (listed in metadata.json's `checkpoint_files`).
    Index,
    /// A small file of the repository beside the checkpoint, `config.json`, tokenizer files
    /// (listed in metadata.json's `repo_files`).
    Repo,
}

/// What one component of a mount holds: laid out in `folder` as a flat mount lays out its root.
#[derive(Debug, Clone, Default)]
pub struct Component {
    /// Its folder relative to the mount root (`unet`, `a/b`); empty for the root itself.
    pub folder: String,
    /// Its shards (tensor names unique among them; checked by the caller).
    pub shards: Vec<Shard>,
    /// Its small files: index files, then the repository's files.
    pub files: Vec<RootFile>,
    /// Which checkpoint of its folder it is.
    pub checkpoint: Which,
}

/// Which checkpoint of a folder a component is: the main one (whose tensors are files in the
/// folder), or another one, laid out in a folder of the main one's folder (`unet/%.checkpoints/
/// diffusion_pytorch_model.fp16`) with its checkpoint's own files (shards, index files) served
/// in the main one's folder beside the main's, where loaders look for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Which {
    /// For another checkpoint, the folder of the main one (the mount root's: `""`).
    pub other_of: Option<String>,
    /// The checkpoint's name (`model.fp16`; may be empty for a main one).
    pub name: String,
    /// Its variant (`fp16`).
    pub variant: Option<String>,
}

/// A component as laid out: where it is and which shards, tensors and files are its.
#[derive(Debug, Clone)]
pub struct ComponentInfo {
    /// Its folder relative to the mount root; empty for the root.
    pub folder: String,
    /// Its directory's inode.
    pub dir: Ino,
    /// The inode of its `metadata.json`.
    pub metadata: Ino,
    /// Its range of [`Namespace::shards`].
    pub shards: Range<usize>,
    /// Its range of [`Namespace::tensors`].
    pub tensors: Range<usize>,
    /// The checkpoint's own files served in its folder, shards first.
    pub served: Vec<ServedFile>,
    /// The repository's small files served in (or below) its folder, in name order.
    pub repo_served: Vec<ServedFile>,
    /// Which checkpoint of its folder it is.
    pub checkpoint: Which,
}

impl ComponentInfo {
    /// `path` (from the mount root) relative to this component's folder.
    pub fn relative<'a>(&self, path: &'a str) -> &'a str {
        if self.folder.is_empty() {
            return path;
        }
        path.strip_prefix(self.folder.as_str()).and_then(|p| p.strip_prefix('/')).unwrap_or(path)
    }
}

/// A checkpoint or repository file served in a component's folder (another checkpoint's: in its
/// main one's folder), for metadata.json.
#[derive(Debug, Clone)]
pub struct ServedFile {
    /// Its path relative to the component's folder.
    pub name: String,
    /// The shard it is (an index into the component's shards), or `None` for an index file.
    pub shard: Option<usize>,
    /// Its size.
    pub size: u64,
}

/// One tensor, resolved to its bytes in a backing source.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Name as written in the header.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Index into the namespace's shard list.
    pub shard: usize,
    /// The engine's id for the backing source.
    pub source: SourceId,
    /// Absolute offset of the first byte in the source.
    pub start: u64,
    /// Byte length.
    pub len: u64,
    /// Path of its file, relative to the mount root (its component's metadata.json gives it
    /// relative to the component's folder).
    pub path: String,
    /// The dtype its file serves: `dtype`, or F32 under `-o as=f32` for float types.
    pub served_dtype: Dtype,
    /// The size of its file: `len`, or the converted size.
    pub served_len: u64,
    /// Path of its `.npy` view, when shown.
    pub npy_path: Option<String>,
}

/// What a regular file holds.
#[derive(Debug, Clone)]
pub enum Content {
    /// The raw bytes of tensor `i`.
    Tensor(usize),
    /// A NumPy header (`.npy` view) followed by the bytes tensor `tensor`'s own file serves: its
    /// raw bytes, or its F32 conversion under `-o as=f32` (the header then says `<f4`).
    Npy {
        /// Index of the tensor.
        tensor: usize,
        /// The synthesized header.
        header: Arc<[u8]>,
        /// The bytes after the header are the F32 conversion, not the raw bytes.
        converted: bool,
    },
    /// Tensor `i` converted element by element to little-endian F32 (`-o as=f32`).
    F32(usize),
    /// The whole file of shard `i`, byte for byte.
    Checkpoint(usize),
    /// Fixed bytes built at mount time (metadata.json).
    Bytes(Arc<[u8]>),
    /// The live counters, rendered when the file is opened.
    Stats,
}

/// A directory's entries, sorted by name for readdir, indexed for lookup.
#[derive(Debug, Default, Clone)]
pub struct Dir {
    entries: Vec<(String, Ino)>,
    index: HashMap<String, Ino>,
    subdirs: u32,
}

impl Dir {
    /// Entries sorted by name.
    pub fn entries(&self) -> &[(String, Ino)] {
        &self.entries
    }
    /// The inode of `name`, if present.
    pub fn get(&self, name: &str) -> Option<Ino> {
        self.index.get(name).copied()
    }
    /// Number of subdirectories (a directory's link count is this plus 2).
    pub fn subdirs(&self) -> u32 {
        self.subdirs
    }
}

/// What a node is.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// A directory.
    Dir(Dir),
    /// A regular file of `size` bytes.
    File {
        /// What it holds.
        content: Content,
        /// Its length in bytes (0 for [`Content::Stats`], which is read until EOF).
        size: u64,
    },
}

/// One inode.
#[derive(Debug, Clone)]
pub struct Node {
    /// Parent directory (the root is its own parent).
    pub parent: Ino,
    /// What it is.
    pub kind: NodeKind,
}

/// Two tensors, or a tensor and a reserved name, that would need the same path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameClash {
    /// The path both would take.
    pub path: String,
    /// The tensor that came second.
    pub tensor: String,
}

impl fmt::Display for NameClash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor {:?} maps to path `{}`, which is already taken", self.tensor, self.path)
    }
}

impl std::error::Error for NameClash {}

/// The whole virtual tree of a mount.
#[derive(Debug)]
pub struct Namespace {
    pub(super) nodes: Vec<Node>,
    pub(super) tensors: Vec<Tensor>,
    pub(super) shards: Vec<Shard>,
    /// For each shard, the range of [`Namespace::tensors`] it holds.
    pub(super) shard_tensors: Vec<Range<usize>>,
    /// The components, the root first, then in folder order.
    pub(super) components: Vec<ComponentInfo>,
}

impl Namespace {
    /// Sets the contents of component `component`'s `metadata.json` (0: the root's).
    pub(super) fn set_metadata(&mut self, component: usize, json: Vec<u8>) {
        let Some(ino) = self.components.get(component).map(|c| c.metadata) else { return };
        let size = json.len() as u64;
        self.nodes[(ino - 1) as usize].kind = NodeKind::File { content: Content::Bytes(json.into()), size };
    }

    /// The byte range within shard `shard`'s file that a read of `range` of the re-served file is
    /// in, as the engine's readahead wants it (`extent` of [`crate::engine::Engine::read_in`]): the
    /// tensor the read is in, or the header before the first tensor. A read that takes in a
    /// tensor's first byte reads that tensor from its start, as a reader of its tensor file does
    /// at offset 0: its range then starts where the read does (the last such tensor, if several).
    pub fn checkpoint_extent(&self, shard: usize, range: Range<u64>) -> Range<u64> {
        let (Some(s), Some(indices)) = (self.shards.get(shard), self.shard_tensors.get(shard)) else {
            return 0..u64::MAX;
        };
        let tensors = &self.tensors[indices.clone()];
        let data_start = s.header.data_start();
        // The last non-empty tensor starting before the read's end.
        let mut i = tensors.partition_point(|t| t.start < range.end);
        while i > 0 && tensors[i - 1].len == 0 {
            i -= 1;
        }
        let Some(t) = i.checked_sub(1).map(|i| &tensors[i]) else {
            return 0..data_start;
        };
        let end = t.start + t.len;
        if t.start >= range.start {
            range.start..end
        } else if range.start < end {
            t.start..end
        } else {
            end..s.header.file_len.max(end)
        }
    }

    /// The root's checkpoint files served, shards first.
    pub fn served_files(&self) -> &[ServedFile] {
        self.components.first().map_or(&[], |c| &c.served)
    }

    /// The repository's small files served in the root, in name order.
    pub fn repo_files(&self) -> &[ServedFile] {
        self.components.first().map_or(&[], |c| &c.repo_served)
    }

    /// The components, the root first, then in folder order.
    pub fn components(&self) -> &[ComponentInfo] {
        &self.components
    }

    pub(super) fn add_dir(&mut self, parent: Ino, name: String) -> Ino {
        self.nodes.push(Node { parent, kind: NodeKind::Dir(Dir::default()) });
        let ino = self.nodes.len() as Ino;
        self.insert_entry(parent, name, ino);
        if let Some(NodeKind::Dir(d)) = self.nodes.get_mut((parent - 1) as usize).map(|n| &mut n.kind) {
            d.subdirs += 1;
        }
        ino
    }

    pub(super) fn add_file(&mut self, parent: Ino, name: String, content: Content, size: u64) -> Ino {
        self.nodes.push(Node { parent, kind: NodeKind::File { content, size } });
        let ino = self.nodes.len() as Ino;
        self.insert_entry(parent, name, ino);
        ino
    }

    pub(super) fn insert_entry(&mut self, dir: Ino, name: String, ino: Ino) {
        if let Some(NodeKind::Dir(d)) = self.nodes.get_mut((dir - 1) as usize).map(|n| &mut n.kind) {
            // Sorted once in `build` when everything is in: inserting in order here would be quadratic.
            d.entries.push((name.clone(), ino));
            d.index.insert(name, ino);
        }
    }

    pub(super) fn remove_entry(&mut self, dir: Ino, name: &str) {
        if let Some(NodeKind::Dir(d)) = self.nodes.get_mut((dir - 1) as usize).map(|n| &mut n.kind) {
            d.entries.retain(|(n, _)| n != name);
            d.index.remove(name);
        }
    }

    /// Sorts every directory's entries by name (once everything is in: inserting in order would
    /// be quadratic).
    pub(super) fn sort_entries(&mut self) {
        for node in &mut self.nodes {
            if let NodeKind::Dir(d) = &mut node.kind {
                d.entries.sort_unstable();
            }
        }
    }

    /// The node with inode `ino`.
    pub fn node(&self, ino: Ino) -> Option<&Node> {
        let index = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(index)
    }

    /// The directory with inode `ino`, if it is one.
    pub fn dir(&self, ino: Ino) -> Option<&Dir> {
        match &self.node(ino)?.kind {
            NodeKind::Dir(d) => Some(d),
            NodeKind::File { .. } => None,
        }
    }

    /// Every tensor, in shard and offset order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The shards the namespace was built from.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Number of inodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree is empty (never: the root always exists).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Attributes shared by every node: owner, times and permission masks.
#[derive(Debug, Clone, Copy)]
pub struct AttrBase {
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Modification time of the backing file.
    pub mtime: SystemTime,
    /// Permission bits for regular files (0444 masked by the backing file's read bits).
    pub file_perm: u16,
    /// Permission bits for directories (read bits plus matching execute bits).
    pub dir_perm: u16,
    /// `st_blksize`: the block size of the engine.
    pub blksize: u32,
}

impl AttrBase {
    /// Permissions derived from the backing file's mode: read bits kept, write bits never given.
    pub fn perms_from_mode(mode: u32) -> (u16, u16) {
        let read = (mode & 0o444) as u16;
        let dir = read | (read >> 2);
        (read, dir)
    }
}
