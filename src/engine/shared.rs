//! What the engine's jobs share, passed to them by reference: [`Shared`], the engine-wide state
//! that the reading threads, the prefetch lanes and the warming thread all use, and
//! [`SourceEntry`], one registered source with its streams and spare descriptors.

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::cache::BlockCache;
use super::disk::{DiskCache, ObjectKey};
use super::error::ReadError;
use super::readahead::ReadaheadConfig;
use super::spares::Spares;
use super::stream::Streams;
use super::tuning::EngineConfig;
use crate::source::{Source, SourceId};
use crate::stats::Stats;

/// The state every job of the engine uses.
pub(crate) struct Shared {
    /// The configuration in force (block size already clamped to `1..=MAX_BLOCK_SIZE`).
    pub(crate) config: EngineConfig,
    /// The counters the engine updates.
    pub(crate) stats: Arc<Stats>,
    /// The blocks, loaded and loading, of every source.
    pub(crate) cache: BlockCache,
    /// Set when the engine is dropped: prefetch jobs end at their next block, the warming thread
    /// at its next wake-up.
    pub(crate) stopping: AtomicBool,
    /// The disk tier below the cache (`--cache-dir`), if any.
    pub(crate) disk: Option<Arc<DiskCache>>,
}

/// One registered source as the engine holds it.
pub(crate) struct SourceEntry {
    /// Its id: blocks are keyed by (id, block index) in the cache.
    pub(crate) id: SourceId,
    /// Where its bytes come from.
    pub(crate) source: Arc<dyn Source>,
    /// Its length in bytes, as pinned when it was registered.
    pub(crate) len: u64,
    /// Its sequential streams: readahead state, descriptors and pending prefetch of each.
    pub(crate) streams: Streams,
    /// Its idle descriptors, for reads outside a confirmed stream.
    pub(crate) spares: Spares,
    /// What its blocks are stored under in the disk tier; `None`: not cached on disk.
    pub(crate) disk_key: Option<ObjectKey>,
}

impl SourceEntry {
    /// Registers `source` as `id`, with streams tuned by `readahead`, its blocks stored on disk
    /// under `disk_key` if given.
    pub(crate) fn new(
        id: SourceId,
        source: Arc<dyn Source>,
        readahead: ReadaheadConfig,
        disk_key: Option<ObjectKey>,
    ) -> SourceEntry {
        let len = source.len();
        let streams = Streams::new(readahead, id, len);
        SourceEntry { id, source, len, streams, spares: Spares::default(), disk_key }
    }

    /// Length of block `block`: a whole block, except the last one of the source.
    pub(crate) fn block_len(&self, block: u64, block_size: u64) -> u64 {
        let start = block.saturating_mul(block_size);
        self.len.saturating_sub(start).min(block_size)
    }

    /// A failed read of this source at `offset`.
    pub(crate) fn error(&self, offset: u64, error: io::Error) -> ReadError {
        ReadError { source_name: self.source.name().to_string(), offset, error }
    }
}
