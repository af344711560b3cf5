//! What the engine's jobs share, passed to them by reference: [`Shared`], the engine-wide state
//! that the reading threads, the prefetch lanes and the warming thread all use, and
//! [`SourceEntry`], one registered source with its streams and spare descriptors (all of which
//! [`SourceEntry::close_descriptors`] closes when the descriptor budget says so).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use super::cache::BlockCache;
use super::delivered::Delivered;
use super::descriptors::{Activity, Budget};
use super::disk::{DiskCache, ObjectKey};
use super::error::ReadError;
use super::faults::FaultWalk;
use super::readahead::ReadaheadConfig;
use super::spares::Spares;
use super::stream::Streams;
use super::tuning::EngineConfig;
use crate::source::{Mapping, Source, SourceId};
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
    /// How many sources hold descriptors, and which were read last (`descriptors`).
    pub(crate) descriptors: Budget,
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
    /// Whether the kernel's reads are served from the source's mapping (`EngineConfig::map_files`
    /// and the source has one); its prefetch lanes then advise instead of loading blocks.
    pub(crate) mapped: bool,
    /// Reply bytes copied from the mapping (not spliced) since its page-table entries were last
    /// dropped.
    pub(crate) mapped_since_release: AtomicU64,
    /// Its part of the descriptor budget: when it was last read, whether it may hold descriptors.
    pub(crate) activity: Activity,
    /// What the kernel was given of its re-served checkpoint file (block path only).
    pub(crate) delivered: Delivered,
    /// Where its tensors start, if it is a checkpoint, and a loader's faults walking them.
    pub(crate) faults: FaultWalk,
}

impl SourceEntry {
    /// Registers `source` as `id`, with streams tuned by `readahead` (its remote window for a
    /// remote source), its blocks stored on disk under `disk_key` if given, served from its
    /// mapping if `map` and it has one.
    pub(crate) fn new(
        id: SourceId,
        source: Arc<dyn Source>,
        mut readahead: ReadaheadConfig,
        disk_key: Option<ObjectKey>,
        map: bool,
    ) -> SourceEntry {
        let len = source.len();
        // Not mapped yet: a source maps (and opens) itself at its first reply.
        let mapped = map && source.mappable();
        if source.remote() {
            readahead.max_window_blocks = readahead.remote_max_window_blocks;
            readahead.lanes = readahead.remote_lanes;
        }
        SourceEntry {
            id,
            source,
            len,
            streams: Streams::new(readahead, id, len),
            spares: Spares::default(),
            disk_key,
            mapped,
            mapped_since_release: AtomicU64::new(0),
            activity: Activity::default(),
            delivered: Delivered::default(),
            faults: FaultWalk::default(),
        }
    }

    /// The mapping the kernel's reads are served from, if they are (mapped now if it was not).
    pub(crate) fn mapping(&self) -> Option<Arc<Mapping>> {
        if self.mapped {
            self.source.mapping().filter(|m| m.len() == self.len)
        } else {
            None
        }
    }

    /// Closes every descriptor this source holds (its streams', its spares, its mapping's) but
    /// those in use by a load right now; false if some were. Each reopens at its next use.
    pub(crate) fn close_descriptors(&self) -> bool {
        let all = self.streams.close_descriptors();
        self.spares.clear();
        self.source.close_idle();
        all
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
