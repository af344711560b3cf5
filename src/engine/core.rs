//! [`Engine`]: registers sources and answers reads of their byte ranges. It owns the threads (the
//! prefetch lanes' I/O pool, the warming thread, the sweep that closes idle sources' descriptors) and hands each read to its stream (`stream`) and
//! then to its on-demand loads (`demand`), or, for a read the kernel copies of a mapped source,
//! to the source's mapping ([`Engine::read_for_kernel`]).

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;

use super::cache::BlockCache;
use super::demand::Demand;
use super::descriptors::Budget;
use super::disk::{DiskCache, ObjectKey};
use super::error::ReadError;
use super::prefetch::{read_into_page_cache, Prefetcher};
use super::readahead::{Extent, ReadaheadConfig};
use super::shared::{Shared, SourceEntry};
use super::tuning::{
    mapped_resident_bytes, EngineConfig, IDLE_DESCRIPTORS_AFTER, IDLE_SWEEP_EVERY, MAX_BLOCK_SIZE, PREFETCH_CHUNK_BYTES,
};
use crate::source::{KernelBytes, Mapping, Source, SourceId};
use crate::stats::Stats;
use crate::util::{lock, read, write};

/// Serves byte ranges of registered sources from cached, aligned blocks.
pub struct Engine {
    pub(super) shared: Arc<Shared>,
    /// The readahead tuning each new source's streams get.
    readahead: ReadaheadConfig,
    /// The registered sources, by id (shared with the idle sweep).
    sources: Arc<RwLock<Vec<Arc<SourceEntry>>>>,
    prefetcher: Prefetcher,
    /// Keeps a few block buffers faulted in ahead of need ([`BlockCache::keep_warm`]); started
    /// with the first source whose reads use blocks (a mapped source's replies use none).
    warmer: Mutex<Option<JoinHandle<()>>>,
    /// Closes the descriptors of sources idle for [`IDLE_DESCRIPTORS_AFTER`], every
    /// [`IDLE_SWEEP_EVERY`] (`descriptors`); started with the first read, since only reads open
    /// them (an engine whose caller maps its files, as `stfs.load` of a cached file, starts none).
    sweeper: OnceLock<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Creates an engine that records its counters in `stats`. A block size of 0 is taken as 1 and
    /// one above 1 GiB as 1 GiB; with `io_threads == 0` nothing is prefetched.
    pub fn new(config: EngineConfig, stats: Arc<Stats>) -> Arc<Engine> {
        Engine::with_disk_cache(config, None, stats)
    }

    /// Like [`Engine::new`] with explicit readahead tuning (its block size is replaced by the
    /// engine's).
    pub fn with_readahead(config: EngineConfig, readahead: ReadaheadConfig, stats: Arc<Stats>) -> Arc<Engine> {
        Engine::build(config, readahead, None, stats)
    }

    /// Like [`Engine::new`], with a disk tier below the cache: every load of a source that has a
    /// [`Source::cache_identity`] reads the blocks `disk` holds from it and stores the others.
    pub fn with_disk_cache(config: EngineConfig, disk: Option<Arc<DiskCache>>, stats: Arc<Stats>) -> Arc<Engine> {
        let mut config = config;
        config.block_size = config.block_size.clamp(1, MAX_BLOCK_SIZE);
        let readahead = ReadaheadConfig::new(config.block_size, config.cache_size);
        Engine::build(config, readahead, disk, stats)
    }

    fn build(
        mut config: EngineConfig,
        mut readahead: ReadaheadConfig,
        disk: Option<Arc<DiskCache>>,
        stats: Arc<Stats>,
    ) -> Arc<Engine> {
        config.block_size = config.block_size.clamp(1, MAX_BLOCK_SIZE);
        readahead.block_size = config.block_size;
        if config.io_threads == 0 {
            readahead.max_window_blocks = 0;
            readahead.remote_max_window_blocks = 0;
        }
        let cache = BlockCache::new(config.cache_size, Arc::clone(&stats));
        let io_threads = config.io_threads;
        let descriptors = Budget::default();
        let shared = Arc::new(Shared { config, stats, cache, stopping: AtomicBool::new(false), disk, descriptors });
        let prefetcher = Prefetcher::start(&shared, io_threads);
        let warmer = Mutex::new(None);
        let sources = Arc::new(RwLock::new(Vec::new()));
        Arc::new(Engine { shared, readahead, sources, prefetcher, warmer, sweeper: OnceLock::new() })
    }

    /// Registers a source; blocks are keyed by (source, block index).
    pub fn add_source(&self, source: Arc<dyn Source>) -> SourceId {
        // Poisoning is ignored, as `crate::util::lock` does: the table is only ever appended to.
        let mut sources = write(&self.sources);
        let id = sources.len();
        let bs = self.shared.config.block_size;
        let disk_key = self.shared.disk.as_ref().and(source.cache_identity()).map(|i| ObjectKey::new(&i, bs));
        // A source cached on disk takes the block path: its blocks are what the disk tier holds.
        let map = self.shared.config.map_files && disk_key.is_none();
        let entry = SourceEntry::new(id, source, self.readahead.clone(), disk_key, map);
        if !entry.mapped {
            self.start_warmer();
        }
        sources.push(Arc::new(entry));
        id
    }

    /// Whether any source is served from its mapping (a local file): its replies to the kernel can
    /// then be spliced from the file ([`Engine::read_for_kernel`]).
    pub fn serves_mapped(&self) -> bool {
        read(&self.sources).iter().any(|e| e.mapped)
    }

    /// Starts the thread that keeps spare block buffers warm, once.
    fn start_warmer(&self) {
        let mut warmer = lock(&self.warmer);
        if warmer.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        *warmer = std::thread::Builder::new()
            .name("stfs-warm".into())
            .spawn(move || shared.cache.keep_warm(shared.config.block_size, &shared.stopping))
            .map_err(|e| log::warn!("no thread to keep spare buffers warm: {e}"))
            .ok();
    }

    /// Reads `len` bytes at absolute `offset` of `source`, clipped at its end (empty past it).
    pub fn read(&self, source: SourceId, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        self.read_with(source, offset, len, <[u8]>::to_vec)
    }

    /// Like [`Engine::read`], but hands the bytes to `consume` instead of returning a copy: a range
    /// inside one block is passed straight from the cache, a longer one joined in a reused
    /// per-thread buffer. `consume` runs on the calling thread with no lock held.
    pub fn read_with<R>(
        &self,
        source: SourceId,
        offset: u64,
        len: usize,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ReadError> {
        self.read_in(source, 0..u64::MAX, offset, len, consume)
    }

    /// [`Engine::read_with`] for a read of a file that spans `extent` within the source (a tensor):
    /// readahead stops at its end until the reader goes on into the next file, so reading one
    /// tensor transfers no more than the blocks it overlaps; a read from its first byte starts the
    /// readahead at once.
    pub fn read_in<R>(
        &self,
        source: SourceId,
        extent: impl Into<Extent>,
        offset: u64,
        len: usize,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ReadError> {
        let entry = self.entry(source).ok_or_else(|| ReadError {
            source_name: format!("source #{source}"),
            offset,
            error: io::Error::new(io::ErrorKind::NotFound, "no such source"),
        })?;
        let end = offset.saturating_add(len as u64).min(entry.len);
        if offset >= end {
            return Ok(consume(&[]));
        }
        self.on_read(&entry);
        let extent = Into::<Extent>::into(extent).clipped(entry.len);
        let shared = &*self.shared;
        // A fault of a loader walking the tensor starts that no stream's reader is near goes to
        // no stream: the walk fetches the next faults' bytes, and a stream would take the faults
        // (a few MiB apart) as a sequential reader and run its window on into the tensors between
        // them. A loader reading the file in order takes in every start too, but its reads
        // continue its stream (`faults`).
        let mut fault_of_walk = false;
        if extent.in_checkpoint_file && !entry.mapped {
            entry.delivered.read(offset..end);
            fault_of_walk = self.fetch_faults_ahead(&entry, offset..end) && !entry.streams.reader_near(offset);
        }
        // A mapped source's stream reads ahead into the page cache, not the block cache: this read
        // loads its own run of cold blocks in one backing read, as a read outside any stream does.
        // A source whose mapping failed is served as any block source: its lanes load blocks,
        // this read waits for theirs, and its stream drops the blocks it has passed.
        let stream = match entry.mapping() {
            Some(mapping) => {
                self.read_ahead_mapped(&entry, &mapping, offset..end, extent);
                None
            }
            None if fault_of_walk => None,
            None => {
                entry.streams.on_read(offset..end, extent, &shared.cache, &entry.spares, &shared.stats, |io, lane| {
                    self.prefetcher.submit(&entry, io, lane)
                })
            }
        };
        // A read inside the bytes the source's opening request fetched (a remote object's first
        // 64 KiB: the header and, in most checkpoints, a first few small tensors) is answered from
        // them: the first tensor of a fresh mount costs no request, instead of the request and
        // transfer of a whole block. Its stream has seen it above. A source cached on disk keeps
        // the block path: its blocks are what the disk tier holds.
        if entry.disk_key.is_none() {
            let opening = entry.source.opening_bytes();
            let range = usize::try_from(offset).ok().zip(usize::try_from(end).ok());
            if let Some(bytes) = range.and_then(|(from, to)| opening.get(from..to)) {
                Stats::add(&shared.stats.opening_reads, 1);
                Stats::add(&shared.stats.opening_read_bytes, bytes.len() as u64);
                return Ok(consume(bytes));
            }
        }
        Demand { shared, entry: &entry, stream: stream.as_deref() }.serve(offset, end, consume)
    }

    /// A read of `range` of `entry`'s re-served checkpoint file: whether it is one of a loader's
    /// faults walking the tensor starts (`faults`). At each step of the walk the read-around of
    /// the next faults is fetched now, one job per run of blocks; a run the queue has no room for
    /// is left to the faults.
    fn fetch_faults_ahead(&self, entry: &Arc<SourceEntry>, range: Range<u64>) -> bool {
        let bs = self.shared.config.block_size;
        let Some(regions) = entry.faults.read(range, entry.len) else {
            return false;
        };
        for region in regions {
            let blocks = region.start / bs..region.end.div_ceil(bs);
            if !self.prefetcher.submit_fetch(entry, blocks) {
                break;
            }
        }
        true
    }

    /// Tells the engine where the tensors of `source` (a checkpoint file) start, in source
    /// offsets: a loader faulting in the mapped file at each of them, in order, has its next
    /// faults' bytes fetched ahead (`faults`).
    pub fn set_tensor_starts(&self, source: SourceId, starts: Vec<u64>) {
        if let Some(entry) = self.entry(source) {
            entry.faults.set_starts(starts);
        }
    }

    /// [`Engine::read_in`] for a reply the kernel copies: `to_kernel` must pass the bytes to a
    /// system call (`writev` or `splice` to the FUSE device) and never read them itself. For a
    /// source served from its mapping (a local file, unless `map_files` is off) they are then a
    /// range of the file, as a slice of the mapping and as the file and offset
    /// ([`KernelBytes`]), handed over after the source's pin check: no block, no copy in user
    /// space, and a file truncated under the mapping makes the kernel's copy fail (EIO for the
    /// reader), never SIGBUS here. The read still goes to its stream, which asks for its window
    /// ahead in whole aligned chunks of 8 MiB, each read into the page cache through the mapping
    /// on an I/O thread (`prefetch`). Only replies copied from the mapping (not spliced) count
    /// towards dropping its page-table entries. Other sources go through [`Engine::read_in`].
    pub fn read_for_kernel<R>(
        &self,
        source: SourceId,
        extent: impl Into<Extent>,
        offset: u64,
        len: usize,
        to_kernel: impl FnOnce(KernelBytes<'_>) -> R,
    ) -> Result<R, ReadError> {
        let Some(entry) = self.entry(source).filter(|e| e.mapped) else {
            return self.read_in(source, extent, offset, len, |bytes| to_kernel(bytes.into()));
        };
        let Some(mapping) = entry.mapping() else {
            return self.read_in(source, extent, offset, len, |bytes| to_kernel(bytes.into()));
        };
        let end = offset.saturating_add(len as u64).min(entry.len);
        if offset >= end {
            return Ok(to_kernel(KernelBytes::default()));
        }
        self.on_read(&entry);
        let extent = Into::<Extent>::into(extent).clipped(entry.len);
        let shared = &*self.shared;
        self.read_ahead_mapped(&entry, &mapping, offset..end, extent);
        let stats = &shared.stats;
        // Counted before the bytes go to the kernel: the reply wakes the reader, which may read
        // `.stfs/stats.json` (on another thread) before this one runs again.
        let (reply, sliced) = mapping
            .to_kernel(offset..end, |bytes| {
                Stats::add(&stats.mapped_reads, 1);
                Stats::add(&stats.mapped_read_bytes, end - offset);
                to_kernel(bytes)
            })
            .map_err(|e| {
                Stats::add(&stats.backing_errors, 1);
                entry.error(offset, e)
            })?;
        if !sliced {
            return Ok(reply);
        }
        let since = entry.mapped_since_release.fetch_add(end - offset, Relaxed) + (end - offset);
        if since >= mapped_resident_bytes(shared.config.cache_size) {
            entry.mapped_since_release.store(0, Relaxed);
            mapping.release();
            Stats::add(&stats.mapping_releases, 1);
        }
        Ok(reply)
    }

    /// The read of `range` of a source served from `mapping`, a file spanning `extent`, goes to its
    /// stream, which may ask for its window ahead (`Streams::on_mapped_read`): one job per whole
    /// chunk, so the chunks are read into the page cache at once on several I/O threads. A chunk
    /// the queue has no room for is only advised from this thread (the reads start, nothing waits
    /// for them), so a read never waits for bytes ahead of its reader.
    fn read_ahead_mapped(&self, entry: &Arc<SourceEntry>, mapping: &Mapping, range: Range<u64>, extent: Extent) {
        let shared = &*self.shared;
        let Some((stream, blocks)) = entry.streams.on_mapped_read(range, extent, &entry.spares, &shared.stats) else {
            return;
        };
        let chunk_blocks = (PREFETCH_CHUNK_BYTES / shared.config.block_size).max(1);
        let mut at = blocks.start;
        while at < blocks.end {
            let chunk = at..(at / chunk_blocks + 1).saturating_mul(chunk_blocks).min(blocks.end);
            if !self.prefetcher.submit_read_ahead(entry, &stream, chunk.clone()) {
                read_into_page_cache(shared, entry, mapping, chunk.clone(), false);
            }
            at = chunk.end;
        }
    }

    /// Turns on extent files (whole tensor files on disk, for FUSE passthrough) in the disk tier;
    /// false if there is no disk tier or they are forbidden (`--no-passthrough`).
    pub fn enable_extent_files(&self) -> bool {
        self.shared.disk.as_ref().is_some_and(|d| d.enable_extents())
    }

    /// A file spanning `extent` of `source` is opened: a verified disk-tier file holding exactly
    /// those bytes (offset N of the file is byte `extent.start + N`) if one is ready at once
    /// (extent files on, the source cached on disk); otherwise the disk tier queues what would
    /// make one ready (its full check, or its assembly) off the calling thread.
    pub fn extent_opened(&self, source: SourceId, extent: Range<u64>) -> Option<std::fs::File> {
        let entry = self.entry(source)?;
        let (disk, key) = (self.shared.disk.as_ref()?, entry.disk_key.as_ref()?);
        let range = extent.start..extent.end.min(entry.len);
        disk.extent_opened(key, self.shared.config.block_size, entry.len, range)
    }

    /// Whether `source` is a file on a local filesystem ([`crate::source::Source::mappable`]),
    /// whose whole file [`Engine::pinned_file`] may hand to the kernel.
    pub fn source_is_local_file(&self, source: SourceId) -> bool {
        self.entry(source).is_some_and(|e| e.source.mappable())
    }

    /// A new descriptor on `source`'s own file, checked against its pin now, if it is a local
    /// file of `len` bytes ([`crate::source::Source::pinned_file`]).
    pub fn pinned_file(&self, source: SourceId, len: u64) -> Option<std::fs::File> {
        let entry = self.entry(source).filter(|e| e.len == len)?;
        entry.source.pinned_file()
    }

    /// A file spanning `extent` of `source` was closed: once every block it covers is on disk,
    /// its extent file is assembled by the disk tier's writer.
    pub fn extent_closed(&self, source: SourceId, extent: Range<u64>) {
        let Some(entry) = self.entry(source) else { return };
        if let (Some(disk), Some(key)) = (self.shared.disk.as_ref(), entry.disk_key.as_ref()) {
            let range = extent.start..extent.end.min(entry.len);
            disk.extent_closed(key, self.shared.config.block_size, entry.len, range);
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// The counters this engine updates.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.shared.stats
    }

    /// Length of a registered source (0 for an unknown id).
    pub fn source_len(&self, source: SourceId) -> u64 {
        self.entry(source).map_or(0, |e| e.len)
    }

    /// Counts a read of `entry` in the descriptor budget, closing the descriptors of the least
    /// recently read sources when too many hold some (`descriptors`); the first read starts the
    /// idle sweep.
    fn on_read(&self, entry: &SourceEntry) {
        self.sweeper.get_or_init(|| start_sweeper(&self.shared, &self.sources));
        if self.shared.descriptors.on_read(&entry.activity) {
            let sources = read(&self.sources);
            self.shared.descriptors.close_least_recent(&sources, |e| &e.activity, |e| e.close_descriptors());
        }
    }

    /// What the idle sweep does, now, with `idle` for [`IDLE_DESCRIPTORS_AFTER`].
    #[cfg(test)]
    pub(crate) fn close_idle_sources(&self, idle: std::time::Duration) {
        close_idle(&self.shared, &self.sources, idle);
    }

    pub(super) fn entry(&self, source: SourceId) -> Option<Arc<SourceEntry>> {
        // Poisoning is ignored, as `crate::util::lock` does.
        let sources = read(&self.sources);
        sources.get(source).cloned()
    }
}

impl Drop for Engine {
    /// Stops prefetching, closes the job queue and joins the I/O threads.
    fn drop(&mut self) {
        // Queued jobs end at their next block; the pool then joins its threads as it is dropped.
        self.shared.stopping.store(true, Relaxed);
        if let Some(disk) = &self.shared.disk {
            disk.close_lanes();
        }
        self.shared.cache.wake_warmer();
        if let Some(warmer) = lock(&self.warmer).take() {
            let _ = warmer.join();
        }
        if let Some(sweeper) = self.sweeper.take().flatten() {
            sweeper.thread().unpark();
            let _ = sweeper.join();
        }
    }
}

/// Starts the thread that closes the descriptors of sources no one has read for
/// [`IDLE_DESCRIPTORS_AFTER`]; it looks every [`IDLE_SWEEP_EVERY`] and ends once the engine stops
/// (woken by [`Engine`]'s drop).
fn start_sweeper(shared: &Arc<Shared>, sources: &Arc<RwLock<Vec<Arc<SourceEntry>>>>) -> Option<JoinHandle<()>> {
    let (shared, sources) = (Arc::clone(shared), Arc::clone(sources));
    std::thread::Builder::new()
        .name("stfs-idle".into())
        .spawn(move || loop {
            std::thread::park_timeout(IDLE_SWEEP_EVERY);
            if shared.stopping.load(Relaxed) {
                return;
            }
            close_idle(&shared, &sources, IDLE_DESCRIPTORS_AFTER);
        })
        .map_err(|e| log::warn!("no thread to close idle sources' descriptors: {e}"))
        .ok()
}

/// Closes the descriptors of each of `sources` not read for `idle` (`descriptors`).
fn close_idle(shared: &Shared, sources: &RwLock<Vec<Arc<SourceEntry>>>, idle: std::time::Duration) {
    let sources = read(sources).clone();
    shared.descriptors.close_idle(&sources, |e| &e.activity, |e| e.close_descriptors(), idle);
}
