//! The virtual tree a mount shows: inodes and what each file holds, file names, `metadata.json`.
//!
//! - [`namespace`]: the inode table, what each file holds, attributes; pure data;
//! - `lay_out`: how a mount's components, their files and their tensors are laid out into it;
//! - [`names`]: the reversible escaping of tensor names into file names;
//! - [`metadata`]: the `metadata.json` document, rendered from a laid-out namespace;
//! - `build`: [`namespace::Namespace::build`], which lays out the tree, then renders its metadata.
//!
//! It knows shards only as validated headers and source ids: it does not import `checkpoint`.

mod build;
mod lay_out;
pub mod metadata;
pub mod names;
pub mod namespace;
#[cfg(test)]
mod tests;
