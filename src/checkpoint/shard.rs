//! Opened shards: a source with its validated header, opened one by one or several at once, and the
//! check that several of them make one [`Checkpoint`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::error::{OpenError, OpenProblem};
use crate::format::index::{check_shards, Index};
use crate::format::{self, Header};
use crate::source::{LocalFile, Source};
use crate::util::lock;

/// One opened shard: its source and its header.
pub struct OpenedShard {
    /// The backing source, pinned.
    pub source: Arc<dyn Source>,
    /// The validated header.
    pub header: Header,
}

/// A checkpoint ready to mount: one or more shards with unique tensor names.
pub struct Checkpoint {
    /// Shards in the order their tensors appear.
    pub shards: Vec<OpenedShard>,
}

/// Opens and validates a single safetensors file.
///
/// Messages name the path as given; the source itself is opened by its absolute path, so the daemon
/// can leave the working directory and metadata.json says where the data lives.
pub fn open_file(path: &Path) -> Result<OpenedShard, OpenError> {
    let name = path.display().to_string();
    let absolute = std::path::absolute(path).map_err(|e| OpenError::new(&name, e))?;
    let file = LocalFile::open(&absolute).map_err(|e| OpenError::new(&name, e))?;
    let source: Arc<dyn Source> = Arc::new(file);
    open_source_named(source, &name)
}

/// Reads and validates the header of an already opened source.
pub fn open_source(source: Arc<dyn Source>) -> Result<OpenedShard, OpenError> {
    let name = source.name().to_string();
    open_source_named(source, &name)
}

/// [`open_source`], naming the source `name` in messages.
fn open_source_named(source: Arc<dyn Source>, name: &str) -> Result<OpenedShard, OpenError> {
    let mut reader = source.open_reader().map_err(|e| OpenError::new(name, e))?;
    let header = format::read_header(|buf, offset| reader.read_exact_at(buf, offset), source.len())
        .map_err(|e| OpenError::new(name, e))?;
    Ok(OpenedShard { source, header })
}

/// Shards opened at once, at most: opening one is a round trip on a network store (two behind a
/// hub's redirect, one or more on an NFS or gcsfuse mount), so a checkpoint of dozens of shards
/// mounts in a few round trips, not dozens.
const PARALLEL_SHARD_OPENS: usize = 8;

/// Opens every shard with `open` on up to [`PARALLEL_SHARD_OPENS`] threads, keeping their order.
/// On failure, the error of the first failing shard (in that order) among those tried; no new
/// shard is started after a failure.
pub(super) fn open_all<T: Sync>(
    shards: &[T],
    open: impl Fn(&T) -> Result<OpenedShard, OpenError> + Sync,
) -> Result<Vec<OpenedShard>, OpenError> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<Mutex<Option<Result<OpenedShard, OpenError>>>> = shards.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_SHARD_OPENS.min(shards.len()) {
            scope.spawn(|| {
                while !failed.load(Relaxed) {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(shard) = shards.get(i) else { break };
                    let result = open(shard);
                    failed.fetch_or(result.is_err(), Relaxed);
                    *lock(&results[i]) = Some(result);
                }
            });
        }
    });
    // Shards are claimed in order and every claimed one finishes, so one left untried comes after
    // a failed one, and collecting in order stops at the first failure before reaching it.
    (1..)
        .zip(results)
        .map(|(n, r)| {
            lock(&r).take().unwrap_or_else(|| Err(OpenError::new(format!("shard {n}"), OpenProblem::NotOpened)))
        })
        .collect()
}

/// The opened shards as one checkpoint, once their tensor names are unique and, for an index, each
/// tensor is where the index says; `name` (the directory or index) is named in messages.
pub(super) fn checked(name: &str, opened: Vec<OpenedShard>, index: Option<&Index>) -> Result<Checkpoint, OpenError> {
    let names: Vec<String> = opened.iter().map(|s| s.source.name().to_string()).collect();
    let headers: Vec<&Header> = opened.iter().map(|s| &s.header).collect();
    check_shards(&names, &headers, index).map_err(|e| OpenError::new(name, e))?;
    Ok(Checkpoint { shards: opened })
}
