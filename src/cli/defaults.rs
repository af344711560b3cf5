//! The defaults a mount gets when an option is not given, chosen per source kind and machine (block
//! size, cache size, thread counts, kernel readahead), each with the measurement behind it.

use std::path::Path;

use crate::engine::EngineConfig;

/// Default block size: the unit of the cache and of alignment, 64 KiB. A random 4 KiB reader pays
/// for one such block, most of it in fresh memory for the cache (measured in docs/notes/benchmarks.md:
/// first-touch random reads take about half the time of 256 KiB blocks, and 8 MiB blocks made them
/// 4-20x slower), while sequential streams still reach the storage in reads of up to
/// [`crate::engine::PREFETCH_CHUNK_BYTES`] (8 MiB): the prefetch coalesces whole aligned blocks.
pub const DEFAULT_BLOCK_SIZE: u64 = 64 << 10;
/// Default block size for a checkpoint read over HTTP(S): 4 MiB. Every block loaded on demand is
/// one request whose round trip dwarfs the transfer of a few MiB, and a 1 MiB kernel request then
/// mostly falls inside one block, which is handed to the kernel without being joined, and a
/// tensor's first window (one block per prefetch lane) spans 16 MiB (measured in docs/notes/remote-benchmarks.md: a
/// 1 GiB model 1.7-1.9 s against 2.0-2.2 s with 64 KiB blocks, a 16 MiB tensor 0.095 s against
/// 0.12 s; the price is that a random 4 KiB read costs one 4 MiB request).
pub const DEFAULT_REMOTE_BLOCK_SIZE: u64 = 4 << 20;
/// Default cache size.
pub const DEFAULT_CACHE_SIZE: u64 = 512 << 20;
/// Most FUSE threads by default: enough for the kernel's parallel readahead and several readers.
pub const DEFAULT_THREADS: u32 = 16;
/// Most readahead threads by default for a local source: one stream with all eight prefetch lanes
/// busy, or several sharing them.
pub const DEFAULT_IO_THREADS: u32 = 8;
/// Readahead threads for a source that waits on storage (a URL, a network filesystem): one remote
/// stream with all sixteen of its lanes busy (`engine::tuning::REMOTE_LANES`), or several sharing
/// them; such lanes mostly wait on the network, so it always gets these.
pub const DEFAULT_REMOTE_IO_THREADS: u32 = 16;

/// CPUs this process may run on (1 if unknown), asked once per process: the answer reads the
/// cgroup's CPU quota, a tenth of a millisecond of every in-process open (the Python module's),
/// and a process's CPU set and quota are taken as fixed while it runs.
fn cpus() -> u32 {
    static CPUS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)))
}

/// Default FUSE threads for `source`: for a file on a local filesystem twice the CPUs, 4 to
/// [`DEFAULT_THREADS`]: a local read is CPU work (the kernel's copy into the reply), so threads
/// beyond the CPUs only add wake-ups and lock waits (docs/notes/benchmarks.md). For a URL or a file on a
/// network or FUSE filesystem [`DEFAULT_THREADS`]: a request there may wait on the storage.
pub fn default_threads(source: &str) -> u32 {
    if waits_on_storage(source) {
        DEFAULT_THREADS
    } else {
        cpus().saturating_mul(2).clamp(4, DEFAULT_THREADS)
    }
}

/// Whether `source` is a URL or a path on a network or FUSE filesystem.
fn waits_on_storage(source: &str) -> bool {
    crate::checkpoint::is_url(source) || crate::source::on_remote_filesystem(Path::new(source))
}

/// Default readahead threads for `source`: for a file on a local filesystem
/// [`DEFAULT_IO_THREADS`], whatever the CPUs (each lane waits for its chunk to be read into the
/// page cache, so the threads mostly sleep on the disk); for a URL or a file on a network or FUSE
/// filesystem [`DEFAULT_REMOTE_IO_THREADS`], whose lanes wait on the storage (each lane one
/// handle's bandwidth).
pub fn default_io_threads(source: &str) -> u32 {
    if waits_on_storage(source) {
        DEFAULT_REMOTE_IO_THREADS
    } else {
        DEFAULT_IO_THREADS
    }
}
/// Default kernel readahead: 1 MiB, the largest request the kernel sends (max_pages 256).
pub const DEFAULT_KERNEL_READAHEAD_KB: u32 = 1024;

/// Default largest read request to ask the kernel for: 1 MiB. Where `fs.fuse.max_pages_limit`
/// allows more, 4 and 16 MiB requests measured slower on the sequential read, the ranks and the
/// remote load (docs/notes/benchmarks.md, issue 34 item 4); `--max-request-kb` asks for more.
pub const DEFAULT_MAX_REQUEST_KB: u32 = 1024;

/// The block size for `source` when none is given: [`DEFAULT_REMOTE_BLOCK_SIZE`] for a URL,
/// [`DEFAULT_BLOCK_SIZE`] otherwise.
pub fn default_block_size(source: &str) -> u64 {
    if crate::checkpoint::is_url(source) {
        DEFAULT_REMOTE_BLOCK_SIZE
    } else {
        DEFAULT_BLOCK_SIZE
    }
}

/// The engine settings for `source` with every option at its default (what `stfs extract` and
/// `stfs cat` read through).
pub fn default_engine(source: &str) -> EngineConfig {
    EngineConfig {
        block_size: default_block_size(source),
        cache_size: DEFAULT_CACHE_SIZE,
        io_threads: default_io_threads(source) as usize,
        map_files: true,
        source_timeout: crate::source::http::DEFAULT_TIMEOUT,
    }
}
