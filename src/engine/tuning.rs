//! The engine's tuning in one place: [`EngineConfig`], what a mount chooses (`--block-size`,
//! `--cache-size`, `--io-threads`), and every fixed constant, each with the reason for its value.
//!
//! Grouped by the room that uses them: reads and loads (`core`, `demand`), prefetch (`stream`,
//! `prefetch`), readahead policy (`readahead`), and the cache's buffer reuse (`cache`).

use std::time::Duration;

/// Tuning of the engine; see each field.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Block size in bytes: every backing read covers whole blocks `[k*B, (k+1)*B)` of the source.
    pub block_size: u64,
    /// Most bytes the cache may hold, prefetched blocks included.
    pub cache_size: u64,
    /// Background I/O threads used for readahead.
    pub io_threads: usize,
    /// Serve reads the kernel copies (raw tensor files through FUSE) of a source that has a
    /// [`Mapping`](crate::source::Mapping) (a file on a local filesystem) straight from it, instead
    /// of through cache blocks. The switch for anything that needs every read to go through the
    /// block path (a disk cache tier): false keeps local files on blocks, as remote sources are.
    pub map_files: bool,
    /// The longest one read of a source may take, retries included (`--timeout`; a remote
    /// source gives up after it). Waits on another thread's load are derived from it
    /// ([`load_wait`]).
    pub source_timeout: Duration,
}

// ---- Reads and loads ----------------------------------------------------------------------------

/// Largest block the engine accepts: one allocation per block, and far above any useful size.
pub const MAX_BLOCK_SIZE: u64 = 1 << 30;

/// How long a reader waits for another thread's load of the same block before failing with EIO,
/// for a source whose reads may each take up to `source_timeout` (`--timeout`): at least as long
/// as that load may itself take, so a healthy load shared by several readers never fails one of
/// them, and no longer, so a hung one surfaces. A load is one store read, or two when a block
/// found on disk splits its run (the disk tier) or a descriptor is opened first; plus
/// [`LOAD_WAIT_SLACK`].
pub fn load_wait(source_timeout: Duration) -> Duration {
    source_timeout.saturating_mul(2).saturating_add(LOAD_WAIT_SLACK)
}

/// What a load may take besides its store reads: the disk tier's reads of the blocks it holds,
/// and a prefetch lane's wait for room in the disk tier's write queue (`disk::behind::LANE_WAIT`,
/// 5 s) before its next block lands.
pub const LOAD_WAIT_SLACK: Duration = Duration::from_secs(6);

/// Capacity a FUSE thread's join buffer (where a read spanning blocks is joined) may keep between
/// requests: a few MiB per thread, so one huge read does not pin its size for the mount's life.
pub const JOIN_BUFFER_KEEP_BYTES: usize = 4 << 20;

/// Idle descriptors kept per source for reads outside a confirmed stream: enough for the FUSE
/// threads reading at once, few enough that closed streams do not pile up open files.
pub const SPARE_DESCRIPTORS: usize = 8;

/// Bytes of a mapped source's replies after which the daemon drops its page-table entries for the
/// mapping ([`Mapping::release`](crate::source::Mapping::release)): every page the kernel copied
/// from stays mapped, so counted in the daemon's resident set, until then. An eighth of the cache
/// budget (which the mapped path does not otherwise use), between 8 and 64 MiB: a few dozen drops
/// per GiB read, each cheap, and the daemon stays within its cache size.
pub const fn mapped_resident_bytes(cache_size: u64) -> u64 {
    let eighth = cache_size / 8;
    if eighth < 8 << 20 {
        8 << 20
    } else if eighth > 64 << 20 {
        64 << 20
    } else {
        eighth
    }
}

// ---- Prefetch -----------------------------------------------------------------------------------

/// Descriptors a stream of a local source may read through at once for its prefetch. Each lane is
/// one descriptor reading whole chunks in increasing order, so every descriptor only moves forward
/// and jumps at least a chunk at a time; together they go past one handle's bandwidth on a network
/// filesystem. Eight fill a 64 MiB window with 8 MiB requests.
pub const LANES: usize = 8;

/// Prefetch lanes of a stream of a remote source (HTTP, object stores), each its own connection:
/// a store paces each connection (S3 and GCS serve ~100 MiB/s per connection) and charges a
/// latency per request, so one stream's bandwidth is lanes x the per-connection rate x the share
/// of each request spent transferring. With 8 MiB requests at 100 MiB/s and 20 ms per request
/// (docs/notes/remote-benchmarks.md) eight lanes carry at most ~640 MiB/s and sixteen ~1.3 GiB/s: 1 GiB through
/// `s3.py` took 2.03 s with eight and 1.55 s with sixteen (the daemon's CPU per GiB unchanged),
/// where curl's 16 parallel GETs take 0.79 s and 8 take 1.34 s. Sixteen is also what peers open
/// (the Run:ai streamer's default concurrency, gcsfuse's parallel downloads).
pub const REMOTE_LANES: usize = 16;

/// The most lanes any stream has.
pub const MAX_LANES: usize = if REMOTE_LANES > LANES { REMOTE_LANES } else { LANES };

// A stream keeps one bit per lane in its busy and loading masks (`u32`).
const _: () = assert!(MAX_LANES <= 32);

/// Prefetch jobs waiting for an I/O thread. At most one job per stream lane is queued, so this
/// bounds the lanes that may have prefetch pending at once; beyond it readahead is skipped, not
/// waited for.
pub const JOB_QUEUE_LEN: usize = 64;

/// Most bytes one prefetch read covers: a lane loads its chunk of the window in one scatter read,
/// so the storage below sees requests this large however small the blocks are (gcsfuse keeps a
/// handle in sequential mode only while it averages 8 MiB or more per seek).
pub const PREFETCH_CHUNK_BYTES: u64 = 8 << 20;

/// Fewest bytes one prefetch read covers while the window is small: a window is split over the
/// prefetch lanes in equal shares, one per lane, so the first megabytes of a file arrive in parallel
/// (one round trip, not one per chunk in turn), but never in pieces smaller than this.
pub const MIN_PREFETCH_CHUNK_BYTES: u64 = 1 << 20;

// ---- Readahead: stream detection and windows ----------------------------------------------------

/// Streams tracked per source: enough for a loader with a dozen worker processes reading different
/// tensors at once, small enough that a linear scan per read costs nothing.
pub const MAX_STREAMS: usize = 16;

/// How far before a stream's cursor a read may start and still continue it: mmap read-around
/// starts half the kernel readahead (up to a few hundred KiB) before the fault; 1 MiB is what
/// mountpoint-s3 and hf-mount keep behind.
pub const BACK_SLACK: u64 = 1 << 20;

/// How far behind a stream's cursor a block must end before drop-behind reuses its memory
/// ([`crate::engine::cache::BlockCache::recycle`]). The kernel sends a reader's requests several at
/// once (up to 1 MiB each) and the daemon's threads (16 for a URL) take them in any order, so a
/// request can reach the engine after later ones have moved the cursor on by several MiB: a block
/// recycled within that distance was fetched again, one whole round trip with the reader waiting
/// (7 blocks of a 1 GiB load from `s3://` on a fresh mount, 0.39 s; docs/notes/remote-benchmarks.md). 16 MiB is
/// that many threads' requests; it only delays reuse, within a cache whose window is 128 MiB.
pub const DROP_BEHIND_SLACK: u64 = 16 << 20;

/// How far past a stream's cursor a read may start and still continue it: async readahead with
/// `max_background` requests in flight can deliver a later READ first; 16 MiB is mountpoint-s3's
/// and hf-mount's forward tolerance.
pub const FORWARD_SLACK: u64 = 16 << 20;

/// How close to an *unconfirmed* stream's cursor a read must start to confirm it: a new sequential
/// reader's next request starts right where its first ended (or within the kernel's read-around),
/// while a random reader's next read only lands this close by chance, so random readers rarely
/// trigger readahead even though a confirmed stream tolerates the full slacks.
pub const CONFIRM_SLACK: u64 = 256 << 10;

/// Window of a freshly confirmed stream (at least one block), so a reader that touches just two
/// adjacent spots wastes little.
pub const INITIAL_WINDOW_BYTES: u64 = 256 << 10;

/// Prefetch started by a read from a file's first byte, before any second read confirms a stream:
/// readers that start there (cat, numpy, torch, a loader) almost always go on, and on a store with
/// per-request latency the file's next chunk is then already on its way when they do. One
/// prefetch chunk, so a reader that only peeks at the start of each file wastes a bounded amount.
/// With large blocks (4 MiB, the default for URLs) the window is one block per prefetch lane
/// instead, so the start of a file is fetched on every lane at once.
pub const FILE_START_WINDOW_BYTES: u64 = 8 << 20;

/// Largest window in bytes: 64 MiB in flight per stream keeps a local NVMe or a network store
/// streaming (gcsfuse's buffered reader peaks at 320 MiB, hf-mount at 128 MiB) while leaving room
/// in the default 512 MiB cache for several streams.
pub const MAX_WINDOW_BYTES: u64 = 64 << 20;

/// Largest window of a remote source (HTTP, object stores): on a store with per-request latency
/// the window holds the chunks in flight *and* those landed but not yet read, so 64 MiB kept only
/// ~6 of the 8 lanes busy (s3 benchmark: 20 ms per request, 100 MiB/s per connection, 8 MiB
/// chunks); 128 MiB keeps all eight going, 1 GiB read in ~15% less time. With [`REMOTE_LANES`]
/// (16) the same window goes out as sixteen 8 MiB requests; 256 MiB bought 5% more speed for 10%
/// more CPU and half the default cache, so it stays 128 MiB.
pub const REMOTE_MAX_WINDOW_BYTES: u64 = 128 << 20;

/// Largest window for a cache of `cache_size` bytes: `largest` ([`MAX_WINDOW_BYTES`], or
/// [`REMOTE_MAX_WINDOW_BYTES`]), and at most half the cache, so one stream cannot crowd out the
/// others or the blocks being read right now.
pub const fn max_window_bytes(cache_size: u64, largest: u64) -> u64 {
    let half = cache_size / 2;
    if half < largest {
        half
    } else {
        largest
    }
}

// ---- Cache: buffer reuse ------------------------------------------------------------------------

/// Spare buffers the cache keeps at most: enough for the loads of several streams in flight at once.
pub const MAX_SPARES: usize = 32;

/// Cache fill from which a cache is no longer filling: three-quarters of its budget `capacity`.
/// Below it warm spares are topped up; from it on, loads reuse the buffers of blocks that go
/// (drop-behind may start earlier, at [`STREAM_REUSE_BYTES`]).
pub const fn reuse_threshold(capacity: u64) -> u64 {
    capacity / 4 * 3
}

/// Cache fill (in bytes) from which a stream's passed blocks give their buffers to the next loads,
/// or [`reuse_threshold`] if that is less: room for a full readahead window ([`MAX_WINDOW_BYTES`])
/// ahead of a stream and as much of what it just read.
pub const STREAM_REUSE_BYTES: u64 = 128 << 20;

/// Passed blocks remembered while a reply still holds them; beyond this the oldest is left to the
/// LRU (it was demoted, so it goes first anyway).
pub const MAX_HELD_BEHIND: usize = 64;

/// Bytes of warm spares kept ready (at most [`MAX_SPARES`] buffers): a few FUSE requests' worth.
pub const WARM_SPARE_BYTES: u64 = 4 << 20;

// ---- Descriptors --------------------------------------------------------------------------------

/// Sources that may keep descriptors open at once (`descriptors`): beyond this, the least recently
/// read ones close theirs, to reopen at their next read. A source being read sequentially holds
/// one for its reads and one per busy prefetch lane ([`LANES`], [`REMOTE_LANES`]; the I/O threads
/// bound how many are busy at once), plus a few spares: 32 sources
/// read at once (more than any loader reads in parallel) stay within a few hundred descriptors,
/// well under a soft limit of 1,024, while reopening a shard costs one `open` or one connection.
pub const OPEN_SOURCES: usize = 32;

/// How long a source may go unread before its descriptors close (stream and lane descriptors,
/// spares, an HTTP reader's keep-alive connection, a local file's mapping): a mount left idle holds
/// none, as an HTTP client's pool drops idle connections, while a loader pausing between tensors
/// for less than this keeps its streams.
pub const IDLE_DESCRIPTORS_AFTER: Duration = Duration::from_secs(30);

/// How often the engine looks for sources idle for [`IDLE_DESCRIPTORS_AFTER`].
pub const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(5);
