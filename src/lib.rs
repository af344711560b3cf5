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
//! - [`fuse`]: the fuser adapter. [`mount`]: a mount's lifetime. [`cli`]: the commands.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod checkpoint;
pub mod cli;
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

/// Sets up env_logger: `RUST_LOG`, by default `info` into a log file (mount, unmount, final
/// counters, read failures) and `warn` on a terminal; to `log_file` if given, else to stderr.
pub fn init_logging(log_file: Option<&std::path::Path>) {
    let default = if log_file.is_some() { "stfs=info,warn" } else { "warn" };
    let mut builder = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    if log_file.is_some() {
        // The daemon's stderr already points at the log file (see daemon::daemonize).
        builder.format_timestamp_millis();
    }
    let _ = builder.try_init();
}
