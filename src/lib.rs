//! stfs: a read-only FUSE filesystem that shows each tensor of a safetensors file as a file.
//!
//! The core is pure and testable without a mount: [`format`] validates headers, [`namespace`]
//! builds the tree, [`engine`] serves aligned cached blocks, [`fs`] implements the operations.
//! [`fuse`] adapts them to fuser; [`serve`], [`daemon`] and [`cli`] run a mount.
#![deny(missing_docs)]

pub mod cache;
pub mod checkpoint;
pub mod cli;
pub mod convert;
pub mod daemon;
pub mod engine;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod http;
pub mod metadata;
pub mod mountpoint;
pub mod names;
pub mod namespace;
pub mod npy;
pub mod readahead;
pub mod serve;
pub mod shards;
pub mod size;
pub mod source;
pub mod stats;
pub mod writer;
mod prefetch;
#[cfg(test)]
mod test_support;

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
