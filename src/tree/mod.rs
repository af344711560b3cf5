//! The virtual tree a mount shows: inodes and what each file holds, file names, `metadata.json`.

pub mod metadata;
pub mod names;
pub mod namespace;
