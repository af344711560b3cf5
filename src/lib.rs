//! stfs: a read-only FUSE filesystem that shows each tensor of a safetensors file as a file.
//!
//! The crate is laid out in layers, each a folder, and a module imports only from layers below it
//! (`tests/layers.rs` holds it to that). From the bottom:
//!
//! - [`util`], [`stats`]: locking, error wording, sizes; the shared counters.
//! - [`format`]: the safetensors header, index files and the writer; pure bytes, no I/O.
//! - [`views`]: the `.npy` and F32 views of a tensor's bytes.
//! - [`source`]: where bytes come from: a local file, an HTTP(S) object.
//! - [`engine`]: aligned blocks through a bounded cache, readahead and prefetch lanes.
//! - [`checkpoint`]: what the user named, opened and validated into shards.
//! - [`tree`]: the virtual tree of files, their names and `metadata.json`.
//! - [`fs`]: filesystem operations on plain values, with `FsError`.
//! - [`fuse`]: the fuser adapter. [`mount`]: a mount's lifetime. [`csi`]: the Kubernetes node
//!   plugin. [`cli`]: the commands.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod checkpoint;
pub mod cli;
pub mod csi;
pub mod engine;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod mount;
pub mod source;
pub mod stats;
pub mod tree;
pub mod util;
pub mod views;
