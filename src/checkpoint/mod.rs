//! Opening a checkpoint: resolves what the user named to backing sources and validated headers.
//!
//! Everything that can be wrong with the input is found here, before anything is mounted, and
//! reported as an [`OpenError`] naming the file or URL it is in.
//!
//! - `open`: [`open`], from a file, an index, a directory or a URL to shards; [`OpenOptions`];
//! - `shard`: [`OpenedShard`] and [`Checkpoint`], opening shards (several at once) and the check
//!   that they make one checkpoint;
//! - `index_file`: a local `*.index.json` read into memory (a regular file, bounded), and those a
//!   directory of shards re-serves (bounded together);
//! - `local`: a directory's own shards, and the shards a local index names;
//! - `confined`: the link rule of a local folder (a file is read only if it resolves inside it, or
//!   in a Hugging Face cache snapshot's `blobs/`), and the one reader of its small files;
//! - `beside`: the small files (configs, tokenizers) beside a local index;
//! - `in_folder`: the one rule deciding, from a folder's names, its main checkpoint and every
//!   other one (variants, `consolidated.safetensors`, any other file);
//! - `every_checkpoint`: a folder's checkpoints, as `in_folder` decides them, opened;
//! - `layout`: which folders of a model repository are components and whose small files a mount
//!   serves, and the limits of one mount (depth, components, entries walked);
//! - `folders`: a local folder opened as the model repository it is (its components, its small
//!   files);
//! - `listed`: a repository known by a listing of its files (an `hf://` repository, an object
//!   store's prefix), laid out by `layout`, its files opened the source's way;
//! - `hub`: `hf://` names, through the hub's API, to shards at a pinned commit;
//! - `prefix`: `s3://BUCKET/PREFIX/` and `gs://BUCKET/PREFIX/`, listed once, objects at the
//!   versions listed;
//! - `error`: [`OpenError`] and its [`OpenProblem`].
//!
//! It does not import `tree`: the caller turns a [`Checkpoint`] into a namespace.

mod beside;
mod confined;
mod error;
mod every_checkpoint;
mod folders;
mod hub;
mod in_folder;
mod index_file;
pub mod layout;
mod listed;
mod local;
mod open;
mod prefix;
mod shard;

pub use error::{OpenError, OpenProblem};
pub use hub::{open_hub_with, HubRepo};
pub use in_folder::OTHERS_DIR;
pub use open::{is_url, open, OpenOptions};
pub use shard::{file_name, open_file, open_source, Checkpoint, Component, OpenedShard, OtherCheckpoint, RootFile};
