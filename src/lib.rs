//! stfs: a read-only FUSE filesystem that shows each tensor of a safetensors file as a file.
#![deny(missing_docs)]

pub mod engine;
pub mod format;
pub mod http;
pub mod source;
pub mod stats;
