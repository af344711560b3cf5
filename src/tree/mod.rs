//! The virtual tree a mount shows: inodes and what each file holds, file names, `metadata.json`.
//!
//! - [`namespace`]: the inode table, what each file holds, attributes, and the layout of tensors
//!   into files; pure data;
//! - [`names`]: the reversible escaping of tensor names into file names;
//! - [`metadata`]: the `metadata.json` document, rendered from a laid-out namespace;
//! - `build`: [`namespace::Namespace::build`], which lays out the tree, then renders its metadata.
//!
//! It knows shards only as validated headers and source ids: it does not import `checkpoint`.

mod build;
pub mod metadata;
pub mod names;
pub mod namespace;
#[cfg(test)]
mod tests;
