//! The block engine: aligned block reads through a byte-bounded LRU cache with readahead.
//!
//! [`Engine::read_with`] clips the range to the source, lets the source's `stream::Streams` classify
//! it, queues any prefetch, and then gathers the answer block by block: a ready block is used as
//! is, a block another thread is loading is waited for, and a missing block is loaded by the
//! calling thread itself (only the blocks it needs, never the prefetch). A range inside one block
//! is handed to the caller straight from the cached block, so each byte is copied once on its way
//! to the kernel. Every backing read covers whole aligned blocks `[k*B, (k+1)*B)`, clipped only at
//! the end of the source: one block on demand, a run of neighbouring blocks (up to a chunk of
//! [`PREFETCH_CHUNK_BYTES`]) in one scatter read for the prefetch. Every constant is in [`tuning`].
//!
//! Descriptors: a confirmed sequential stream owns one `SourceReader` for its on-demand loads and
//! one per prefetch lane (`tuning::LANES`): the lanes load the stream's window chunk by
//! chunk in parallel, each lane's chunks in increasing order, so every descriptor reads forward in
//! big steps. Reads outside any confirmed stream borrow a descriptor from a small per-source pool of
//! spares, so random readers do not open a file per read.
//!
//! Prefetch runs on `io_threads` background threads fed by a bounded queue holding at most one job
//! per stream lane. When the queue is full or the cache has no room that is not holding unread
//! data, the prefetch is dropped (never waited for). Blocks a stream has moved past are recycled
//! (drop-behind, see [`BlockCache::recycle`]), so streaming reuses the same few buffers.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use crate::source::{Source, SourceId};
use crate::stats::Stats;
use cache::{BlockCache, BlockData};
use pool::IoPool;
use readahead::ReadaheadConfig;
use spares::Spares;
use stream::{StreamIo, Streams};
use tuning::{JOB_QUEUE_LEN, MAX_BLOCK_SIZE};

pub mod cache;
mod error;
mod load;
mod pool;
pub mod readahead;
mod spares;
mod stream;
pub mod tuning;

pub use error::ReadError;
pub use tuning::{EngineConfig, MIN_PREFETCH_CHUNK_BYTES, PREFETCH_CHUNK_BYTES};

thread_local! {
    /// Where a read spanning several blocks is joined, reused by each FUSE thread so that joining
    /// costs one copy and no allocation.
    static JOIN_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Serves byte ranges of registered sources from cached, aligned blocks.
pub struct Engine {
    shared: Arc<Shared>,
    prefetcher: IoPool<Job>,
    /// Keeps a few block buffers faulted in ahead of need ([`BlockCache::keep_warm`]).
    warmer: Option<std::thread::JoinHandle<()>>,
}

/// What the engine and its I/O threads share.
struct Shared {
    config: EngineConfig,
    readahead: ReadaheadConfig,
    stats: Arc<Stats>,
    cache: BlockCache,
    sources: RwLock<Vec<Arc<SourceEntry>>>,
    stopping: AtomicBool,
}

struct SourceEntry {
    id: SourceId,
    source: Arc<dyn Source>,
    len: u64,
    streams: Streams,
    spares: Spares,
}

struct Job {
    source: Arc<SourceEntry>,
    stream: Arc<StreamIo>,
    lane: usize,
}

impl Engine {
    /// Creates an engine that records its counters in `stats`. A block size of 0 is taken as 1 and
    /// one above 1 GiB as 1 GiB; with `io_threads == 0` nothing is prefetched.
    pub fn new(config: EngineConfig, stats: Arc<Stats>) -> Arc<Engine> {
        let mut config = config;
        config.block_size = config.block_size.clamp(1, MAX_BLOCK_SIZE);
        let readahead = ReadaheadConfig::new(config.block_size, config.cache_size);
        Engine::with_readahead(config, readahead, stats)
    }

    /// Like [`Engine::new`] with explicit readahead tuning (its block size is replaced by the
    /// engine's).
    pub fn with_readahead(mut config: EngineConfig, mut readahead: ReadaheadConfig, stats: Arc<Stats>) -> Arc<Engine> {
        config.block_size = config.block_size.clamp(1, MAX_BLOCK_SIZE);
        readahead.block_size = config.block_size;
        if config.io_threads == 0 {
            readahead.max_window_blocks = 0;
        }
        let cache = BlockCache::new(config.cache_size, Arc::clone(&stats));
        let io_threads = config.io_threads;
        let shared = Arc::new(Shared {
            config,
            readahead,
            stats,
            cache,
            sources: RwLock::new(Vec::new()),
            stopping: AtomicBool::new(false),
        });
        let worker_shared = Arc::clone(&shared);
        let prefetcher = IoPool::start(io_threads, JOB_QUEUE_LEN, move |job: Job| worker_shared.run_prefetch(&job));
        let warm_shared = Arc::clone(&shared);
        let warmer = std::thread::Builder::new()
            .name("stfs-warm".into())
            .spawn(move || warm_shared.cache.keep_warm(warm_shared.config.block_size, &warm_shared.stopping))
            .map_err(|e| log::warn!("no thread to keep spare buffers warm: {e}"))
            .ok();
        Arc::new(Engine { shared, prefetcher, warmer })
    }

    /// Registers a source; blocks are keyed by (source, block index).
    pub fn add_source(&self, source: Arc<dyn Source>) -> SourceId {
        let mut sources = self.shared.sources.write().unwrap_or_else(|p| p.into_inner());
        let id = sources.len();
        let len = source.len();
        let streams = Streams::new(self.shared.readahead.clone(), id, len);
        sources.push(Arc::new(SourceEntry { id, len, source, streams, spares: Spares::default() }));
        id
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
        extent: Range<u64>,
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
        let extent = extent.start.min(entry.len)..extent.end.min(entry.len);
        let shared = &*self.shared;
        let stream =
            entry.streams.on_read(offset..end, extent, &shared.cache, &entry.spares, &shared.stats, |io, lane| {
                let job = Job { source: Arc::clone(&entry), stream: Arc::clone(io), lane };
                self.prefetcher.try_submit(job).is_ok()
            });
        let bs = self.shared.config.block_size;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let slice = |data: &BlockData, block: u64| {
            let block_start = block * bs;
            let from = (offset.max(block_start) - block_start) as usize;
            let to = (end.min(block_start.saturating_add(bs)) - block_start) as usize;
            if data.len() < to {
                return Err(entry.error(block_start, io::Error::other("short block in cache")));
            }
            Ok((from, to))
        };
        if first == last {
            let data = self.demand_block(&entry, first, stream.as_deref())?;
            let (from, to) = slice(&data, first)?;
            return Ok(consume(&data[from..to]));
        }
        let blocks = match stream.as_deref() {
            // A sequential stream's prefetch lanes are loading what follows in parallel: take the
            // blocks one by one, so this thread claims only what it must.
            Some(sequential) => (first..=last)
                .map(|block| self.demand_block(&entry, block, Some(sequential)))
                .collect::<Result<Vec<_>, _>>()?,
            // Nobody else will fetch these: one backing read for each run of cold blocks.
            None => self.demand_blocks(&entry, first, last, None)?,
        };
        JOIN_BUFFER.with(|cell| {
            // A reentrant call (none today) gets its own buffer rather than a borrow panic.
            let mut own = Vec::new();
            let mut borrowed = cell.try_borrow_mut();
            let out = borrowed.as_deref_mut().unwrap_or(&mut own);
            out.clear();
            for (block, data) in (first..).zip(&blocks) {
                let (from, to) = slice(data, block)?;
                out.extend_from_slice(&data[from..to]);
            }
            let result = consume(out);
            if out.capacity() > tuning::JOIN_BUFFER_KEEP_BYTES {
                *out = Vec::new();
            }
            Ok(result)
        })
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

    fn entry(&self, source: SourceId) -> Option<Arc<SourceEntry>> {
        let sources = self.shared.sources.read().unwrap_or_else(|p| p.into_inner());
        sources.get(source).cloned()
    }
}

impl Drop for Engine {
    /// Stops prefetching, closes the job queue and joins the I/O threads.
    fn drop(&mut self) {
        // Queued jobs end at their next block; the pool then joins its threads as it is dropped.
        self.shared.stopping.store(true, Relaxed);
        self.shared.cache.wake_warmer();
        if let Some(warmer) = self.warmer.take() {
            let _ = warmer.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tuning::{FILE_START_WINDOW_BYTES, LANES};
    use crate::source::SourceReader;
    use crate::util::lock;
    use crate::util::test_support::eventually;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::Mutex;
    use std::time::Duration;

    /// An in-memory source that logs every backing read and can be slowed down or made to fail.
    struct FakeSource {
        data: Vec<u8>,
        reads: Mutex<Vec<(u64, usize)>>,
        latency: Duration,
        failures_left: AtomicUsize,
        /// Streams read long runs in pieces of this many bytes (0: in one read), as a local file does.
        piece: AtomicU64,
    }

    struct FakeStream(Arc<FakeSource>);

    impl Source for Arc<FakeSource> {
        fn len(&self) -> u64 {
            self.data.len() as u64
        }
        fn name(&self) -> &str {
            "fake"
        }
        fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
            Ok(Box::new(FakeStream(Arc::clone(self))))
        }
    }

    impl SourceReader for FakeStream {
        fn read_blocks_at(
            &mut self,
            bufs: Vec<Vec<u8>>,
            offset: u64,
            landed: &mut dyn FnMut(Vec<u8>),
        ) -> io::Result<()> {
            // As a local file does: whole buffers, at most `piece` bytes per read (0: all in one).
            let piece = match self.0.piece.load(Relaxed) as usize {
                0 => usize::MAX,
                piece => piece,
            };
            crate::source::read_in_pieces(self, bufs, offset, piece, landed)
        }

        fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let fake = &self.0;
            lock(&fake.reads).push((offset, buf.len()));
            std::thread::sleep(fake.latency);
            let injected = fake.failures_left.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
            if injected.is_ok() {
                return Err(io::Error::other("injected failure"));
            }
            let start = offset as usize;
            let bytes = fake.data.get(start..start + buf.len()).ok_or_else(|| io::Error::other("past end"))?;
            buf.copy_from_slice(bytes);
            Ok(())
        }
    }

    fn fake(len: usize, latency: Duration) -> Arc<FakeSource> {
        let data = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let reads = Mutex::new(Vec::new());
        Arc::new(FakeSource { data, reads, latency, failures_left: AtomicUsize::new(0), piece: AtomicU64::new(0) })
    }

    fn engine(block_size: u64, cache_size: u64, io_threads: usize) -> (Arc<Engine>, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let config = EngineConfig { block_size, cache_size, io_threads };
        let mut readahead = ReadaheadConfig::new(block_size, cache_size);
        // Slack scaled to the small test blocks, so that random tests look random.
        (readahead.back_slack, readahead.forward_slack) = (block_size / 2, 2 * block_size);
        (Engine::with_readahead(config, readahead, Arc::clone(&stats)), stats)
    }

    fn counter(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }

    /// Every backing read covers whole aligned blocks (the last one clipped at the end), and at
    /// most a prefetch chunk of them.
    fn assert_whole_blocks(source: &FakeSource, block_size: u64) {
        let len = source.data.len() as u64;
        let chunk = (PREFETCH_CHUNK_BYTES / block_size).max(1) * block_size;
        for &(offset, n) in lock(&source.reads).iter() {
            let n = n as u64;
            assert_eq!(offset % block_size, 0, "unaligned backing read at {offset}");
            assert!(n > 0 && n <= chunk, "read of {n} at {offset}");
            assert!(n % block_size == 0 || offset + n == len, "partial block read of {n} at {offset}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn any_read_returns_the_source_bytes(
            block_size in 1u64..=65536,
            blocks in 0u64..12,
            extra in 0u64..65536,
            cache_blocks in 0u64..6,
            io_threads in 0usize..3,
            threads in 1usize..4,
            reads in prop::collection::vec((0.0f64..1.1, 0usize..200_000), 1..24),
            piece in 0u64..200_000,
        ) {
            let len = blocks * block_size + extra % block_size;
            let source = fake(len as usize, Duration::ZERO);
            source.piece.store(piece, Relaxed);
            let cache_size = cache_blocks * block_size + extra % 3;
            let (engine, stats) = engine(block_size, cache_size, io_threads);
            let id = engine.add_source(Arc::new(Arc::clone(&source)));
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let (engine, source, reads) = (&engine, &source, &reads);
                    scope.spawn(move || {
                        for &(at, n) in reads.iter().cycle().skip(t).take(reads.len()) {
                            let offset = (at * len as f64) as u64;
                            let got = engine.read(id, offset, n).unwrap();
                            let start = (offset as usize).min(source.data.len());
                            let end = start.saturating_add(n).min(source.data.len());
                            assert_eq!(got, &source.data[start..end], "read of {n} at {offset}");
                        }
                    });
                }
            });
            drop(engine);
            assert_whole_blocks(&source, block_size);
            prop_assert!(counter(&stats.peak_resident_bytes) <= cache_size);
            // A fetch is one read, or several pieces of one.
            let reads = lock(&source.reads).len() as u64;
            prop_assert!(counter(&stats.backing_reads) <= reads);
            prop_assert!(piece > 0 || counter(&stats.backing_reads) == reads);
        }
    }

    #[test]
    fn concurrent_readers_of_one_block_share_one_backing_read() {
        let source = fake(10_000, Duration::from_millis(50));
        // No I/O threads: these nearby reads form a stream, and its prefetch is not under test.
        let (engine, stats) = engine(4096, 1 << 20, 0);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|scope| {
            for t in 0..8 {
                let (engine, barrier) = (&engine, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    assert_eq!(engine.read(id, 100 + t, 10).unwrap().len(), 10);
                });
            }
        });
        assert_eq!(*lock(&source.reads), vec![(0, 4096)]);
        assert_eq!(counter(&stats.cache_misses), 1);
        assert_eq!(counter(&stats.cache_hits), 7);
    }

    #[test]
    fn sequential_scan_prefetches_and_reads_each_block_once() {
        let bs = 4096;
        let source = fake(64 * bs as usize, Duration::ZERO);
        // Room for the whole source twice over: with no cache pressure nothing may be read twice.
        // (With the cache exactly the file's size, an on-demand load may legitimately evict a
        // prefetched block under a slow scheduler, and the test would measure that instead.)
        let (engine, stats) = engine(bs, 128 * bs, 2);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        engine.read(id, 0, 1000).unwrap();
        engine.read(id, 1000, 1000).unwrap();
        eventually("block 1 to be prefetched", || counter(&stats.prefetched_bytes) >= bs);
        let mut offset = 2000;
        while offset < source.data.len() as u64 {
            let got = engine.read(id, offset, 1000).unwrap();
            assert_eq!(got, &source.data[offset as usize..][..got.len()]);
            offset += 1000;
        }
        assert!(counter(&stats.window_bytes) > bs, "the window grew");
        assert_eq!(counter(&stats.streams), 1);
        drop(engine);
        let reads = lock(&source.reads).clone();
        assert_eq!(counter(&stats.backing_read_bytes), source.data.len() as u64, "{reads:?}");
        assert!(counter(&stats.backing_reads) <= 64);
        assert_whole_blocks(&source, bs);
        // Each block was read exactly once: sorted, the reads tile the source.
        let mut reads = lock(&source.reads).clone();
        reads.sort();
        let mut next = 0;
        for (offset, n) in reads {
            assert_eq!(offset, next, "a gap or an overlap before {offset}");
            next += n as u64;
        }
    }

    #[test]
    fn prefetch_coalesces_neighbouring_blocks_into_chunk_reads_on_several_lanes() {
        let bs = 64 << 10;
        let chunk_blocks = PREFETCH_CHUNK_BYTES / bs;
        let source = fake((4 * PREFETCH_CHUNK_BYTES) as usize, Duration::from_millis(1));
        let mut readahead = ReadaheadConfig::new(bs, 1 << 30);
        readahead.max_window_blocks = LANES as u64 * chunk_blocks;
        let stats = Arc::new(Stats::default());
        let config = EngineConfig { block_size: bs, cache_size: 1 << 30, io_threads: 4 };
        let engine = Engine::with_readahead(config, readahead, Arc::clone(&stats));
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        let mut offset = 0;
        while offset < source.data.len() as u64 {
            let got = engine.read(id, offset, 1 << 20).unwrap();
            assert_eq!(got, &source.data[offset as usize..][..got.len()]);
            offset += got.len() as u64;
            // A paced reader (as a consumer that computes between reads), so the lanes get ahead.
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(engine);
        assert_whole_blocks(&source, bs);
        let reads = lock(&source.reads).clone();
        let big = reads.iter().filter(|&&(_, n)| n as u64 >= PREFETCH_CHUNK_BYTES / 2).count();
        assert!(big >= 2, "prefetch read big runs: {reads:?} {stats:?}");
        assert!(counter(&stats.backing_reads) < 4 * chunk_blocks / 4, "{reads:?}");
    }

    #[test]
    fn a_first_read_of_a_file_fetches_its_start_on_every_lane_at_once() {
        let bs = 64 << 10;
        let source = fake(32 << 20, Duration::from_millis(30));
        let (engine, _stats) = engine(bs, 256 << 20, 8);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        let file = (1 << 20) + 100..(17 << 20) + 100;
        let got = engine.read_in(id, file.clone(), file.start, 1, <[u8]>::to_vec).unwrap();
        assert_eq!(got, &source.data[file.start as usize..][..1]);
        let window = FILE_START_WINDOW_BYTES;
        eventually("the file-start prefetch", || {
            lock(&source.reads).iter().map(|&(_, n)| n as u64).sum::<u64>() > window
        });
        drop(engine);
        let reads = lock(&source.reads).clone();
        let prefetch: Vec<_> = reads.iter().filter(|&&(at, _)| at > file.start).collect();
        let share = window / LANES as u64;
        assert!(prefetch.len() >= LANES, "one read per lane: {reads:?}");
        assert!(prefetch.iter().all(|&&(_, n)| n as u64 <= share), "reads of a lane's share: {reads:?}");
        assert_whole_blocks(&source, bs);
    }

    /// A source whose multi-block reads hand out their first block, then wait until the gate opens.
    struct GatedSource {
        data: Vec<u8>,
        open: Mutex<bool>,
        opened: std::sync::Condvar,
    }

    struct GatedStream(Arc<GatedSource>);

    impl Source for Arc<GatedSource> {
        fn len(&self) -> u64 {
            self.data.len() as u64
        }
        fn name(&self) -> &str {
            "gated"
        }
        fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
            Ok(Box::new(GatedStream(Arc::clone(self))))
        }
    }

    impl SourceReader for GatedStream {
        fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            buf.copy_from_slice(&self.0.data[offset as usize..][..buf.len()]);
            Ok(())
        }
        fn read_blocks_at(
            &mut self,
            bufs: Vec<Vec<u8>>,
            offset: u64,
            landed: &mut dyn FnMut(Vec<u8>),
        ) -> io::Result<()> {
            let (many, mut at) = (bufs.len() > 1, offset);
            for (i, mut buf) in bufs.into_iter().enumerate() {
                self.read_exact_at(&mut buf, at)?;
                at += buf.len() as u64;
                landed(buf);
                if i == 0 && many {
                    let open = lock(&self.0.open);
                    let (_open, waited) =
                        self.0.opened.wait_timeout_while(open, Duration::from_secs(5), |o| !*o).unwrap();
                    assert!(!waited.timed_out(), "the gate was never opened");
                }
            }
            Ok(())
        }
    }

    #[test]
    fn a_prefetched_block_is_served_while_the_rest_of_its_read_is_in_flight() {
        let bs = 4096;
        let gated = Arc::new(GatedSource {
            data: (0..64 * bs as usize).map(|i| (i % 249) as u8).collect(),
            open: Mutex::new(false),
            opened: std::sync::Condvar::new(),
        });
        let (engine, stats) = engine(bs, 1 << 20, 1);
        let id = engine.add_source(Arc::new(Arc::clone(&gated)));
        // A read of a file's first byte (the file is blocks 2..40) prefetches blocks 3.. in one read.
        let file = 2 * bs..40 * bs;
        engine.read_in(id, file.clone(), 2 * bs, 100, <[u8]>::to_vec).unwrap();
        eventually("the first prefetched block to land", || counter(&stats.prefetched_bytes) >= bs);
        // The rest of that read is still held at the gate, yet block 3 is served from the cache.
        assert_eq!(counter(&stats.prefetched_bytes), bs);
        let misses = counter(&stats.cache_misses);
        let got = engine.read_in(id, file.clone(), 3 * bs + 10, 100, <[u8]>::to_vec).unwrap();
        assert_eq!(got, &gated.data[3 * bs as usize + 10..][..100]);
        assert_eq!(counter(&stats.cache_misses), misses, "block 3 came from the cache");
        *lock(&gated.open) = true;
        gated.opened.notify_all();
        eventually("the rest of the prefetch", || counter(&stats.prefetched_bytes) > bs);
    }

    #[test]
    fn a_request_over_cold_blocks_is_one_backing_read() {
        let bs = 4096;
        let source = fake(64 * bs as usize, Duration::ZERO);
        let (engine, stats) = engine(bs, 32 * bs, 0);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        // Five blocks, the first and last partly: one whole-block read of all five.
        let (offset, len) = (3 * bs + 100, 4 * bs as usize);
        assert_eq!(engine.read(id, offset, len).unwrap(), &source.data[offset as usize..][..len]);
        assert_eq!(*source.reads.lock().unwrap(), [(3 * bs, 5 * bs as usize)]);
        // With the middle block cached, the cold ones on each side are one read each.
        let (offset, len) = (20 * bs, 3 * bs as usize);
        engine.read(id, 21 * bs, 10).unwrap();
        source.reads.lock().unwrap().clear();
        assert_eq!(engine.read(id, offset, len).unwrap(), &source.data[offset as usize..][..len]);
        assert_eq!(*source.reads.lock().unwrap(), [(20 * bs, bs as usize), (22 * bs, bs as usize)]);
        assert_whole_blocks(&source, bs);
        assert_eq!(counter(&stats.backing_reads), 4);
    }

    #[test]
    fn random_reads_prefetch_nothing() {
        let bs = 4096;
        let source = fake(1000 * bs as usize, Duration::ZERO);
        let (engine, stats) = engine(bs, 64 * bs, 2);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        // Block i*389 mod 1000: within any 16 reads, no two are fewer than 57 blocks apart.
        for i in 0..100u64 {
            let offset = (i * 389 % 1000) * bs + i;
            assert_eq!(engine.read(id, offset, 100).unwrap(), &source.data[offset as usize..][..100]);
        }
        drop(engine);
        assert_eq!(counter(&stats.prefetched_bytes), 0);
        assert_eq!(counter(&stats.backing_read_bytes), 100 * bs);
    }

    #[test]
    fn small_cache_stays_bounded_under_concurrent_scans() {
        let bs = 1024;
        let source = fake(200 * bs as usize, Duration::ZERO);
        let (engine, stats) = engine(bs, 3 * bs, 4);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let engine = &engine;
                let source = &source;
                scope.spawn(move || {
                    let mut offset = t * 50 * bs;
                    while offset < (t + 1) * 50 * bs {
                        let got = engine.read(id, offset, 300).unwrap();
                        assert_eq!(got, &source.data[offset as usize..][..got.len()]);
                        offset += 300;
                    }
                });
            }
        });
        drop(engine);
        assert!(counter(&stats.peak_resident_bytes) <= 3 * bs);
        assert_whole_blocks(&source, bs);
    }

    #[test]
    fn backing_error_surfaces_and_a_retry_succeeds() {
        let source = fake(10_000, Duration::ZERO);
        source.failures_left.store(1, Relaxed);
        let (engine, stats) = engine(4096, 1 << 20, 0);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        let err = engine.read(id, 5000, 10).unwrap_err();
        assert_eq!(err.offset, 4096);
        assert!(err.to_string().contains("injected failure"), "{err}");
        assert_eq!(counter(&stats.backing_errors), 1);
        assert_eq!(engine.read(id, 5000, 10).unwrap(), &source.data[5000..5010]);
    }

    #[test]
    fn reads_are_clipped_at_the_end() {
        let source = fake(10_000, Duration::ZERO);
        let (engine, _) = engine(4096, 1 << 20, 1);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        assert_eq!(engine.source_len(id), 10_000);
        assert_eq!(engine.read(id, 9_990, 100).unwrap(), &source.data[9_990..]);
        assert!(engine.read(id, 10_000, 100).unwrap().is_empty());
        assert!(engine.read(id, u64::MAX, usize::MAX).unwrap().is_empty());
        assert!(engine.read(id + 1, 0, 1).is_err());
    }

    #[test]
    fn local_file_changed_after_open_fails_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let bytes: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        for change in ["truncate", "replace", "delete"] {
            std::fs::write(&path, &bytes).unwrap();
            let file = crate::source::LocalFile::open(&path).unwrap();
            let (engine, _) = engine(4096, 8192, 1);
            let id = engine.add_source(Arc::new(file));
            assert_eq!(engine.read(id, 0, 100).unwrap(), &bytes[..100]);
            match change {
                "truncate" => std::fs::File::options().write(true).open(&path).unwrap().set_len(1).unwrap(),
                "replace" => {
                    std::fs::write(dir.path().join("new"), &bytes).unwrap();
                    std::fs::rename(dir.path().join("new"), &path).unwrap();
                }
                _ => std::fs::remove_file(&path).unwrap(),
            }
            let err = engine.read(id, 30_000, 100).unwrap_err();
            assert!(err.to_string().contains("changed since mount"), "{change}: {err}");
        }
    }
}
