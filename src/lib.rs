//! stfs: a read-only FUSE filesystem that shows each tensor of a safetensors file as a file.
#![deny(missing_docs)]

pub mod cache;
pub mod engine;
pub mod format;
mod prefetch;
pub mod readahead;
pub mod source;
pub mod stats;
