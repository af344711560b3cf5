//! The disk tier (`--cache-dir`): whole blocks kept on local disk below the memory cache, shared by
//! every mount and process of the host that uses the same directory, with no daemon of its own.
//!
//! `backing::read_blocks` hands every run of blocks the engine loads (on demand or on a prefetch
//! lane) to [`DiskCache::read_through`]: each block found on disk (verified) lands without a store
//! request; each run of missing ones is one store read whose blocks are written to disk as they
//! land. So readahead fills the disk as it fills memory, and a second load reads disk on the same
//! lanes, in whole blocks, in order.
//!
//! `store` holds the files (key, layout, checksum, atomic write), `evict` the size bound and LRU,
//! `open` the directory's checks at mount and the default bound. Faults never fail a read: a write
//! that fails (disk full, read-only) is counted and warned about once, a corrupt file is counted,
//! removed and fetched again.

mod evict;
mod open;
mod store;
#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

pub use open::{default_limit, DiskCacheError, DEFAULT_LIMIT_MAX, DEFAULT_LIMIT_PERCENT, MIN_LIMIT};
pub use store::ObjectKey;

use crate::stats::Stats;

/// A store read of whole blocks from `first` into the buffers, handing each to the callback as
/// it lands (`backing`'s read through a descriptor).
pub(crate) type StoreRead<'a> = dyn FnMut(u64, Vec<Vec<u8>>, &mut dyn FnMut(Vec<u8>)) -> io::Result<()> + 'a;

/// One cache directory as a mount uses it.
#[derive(Debug)]
pub struct DiskCache {
    root: PathBuf,
    limit: u64,
    stats: Arc<Stats>,
    /// Bytes believed stored: the last scan plus this process's writes since.
    stored: AtomicU64,
    /// Bytes this process wrote since the last scan: past an eighth of the bound it rescans, so
    /// what other processes wrote is counted too.
    written_since_scan: AtomicU64,
    /// An eviction pass of this process is running.
    evicting: AtomicBool,
    /// A failed write was already logged.
    warned: AtomicBool,
}

impl DiskCache {
    /// Opens (creating it mode 0700 if missing) and checks cache directory `dir`, bound to `limit`
    /// bytes ([`default_limit`] if `None`), counting into `stats`.
    pub fn open(dir: &Path, limit: Option<u64>, stats: Arc<Stats>) -> Result<DiskCache, DiskCacheError> {
        let root = std::path::absolute(dir).map_err(DiskCacheError::Io)?;
        if let Some(size) = limit.filter(|&size| size < MIN_LIMIT) {
            return Err(DiskCacheError::TooSmall { size });
        }
        open::prepare(&root)?;
        let scan = evict::scan(&root, true).map_err(DiskCacheError::Io)?;
        let limit = limit.unwrap_or_else(|| default_limit(open::free_bytes(&root), scan.bytes));
        let stored = AtomicU64::new(scan.bytes);
        stats.disk_cache_limit.store(limit, Relaxed);
        let cache = DiskCache {
            root,
            limit,
            stats,
            stored,
            written_since_scan: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            warned: AtomicBool::new(false),
        };
        cache.publish_stored();
        // A bound lowered since the last mount holds from the start.
        if scan.bytes > limit {
            cache.evict_now();
        }
        Ok(cache)
    }

    /// The directory (absolute).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The bound on the bytes stored.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Reads blocks `first..first + buffers.len()` of the source stored under `key`, handing each
    /// to `landed` in block order: from disk where a verified copy is there, else from the store
    /// through `store` (one call per run of missing blocks), writing each such block to disk as it
    /// lands. On a store error the rest are dropped and the error returned.
    pub(crate) fn read_through(
        &self,
        key: &ObjectKey,
        first: u64,
        buffers: Vec<Vec<u8>>,
        store: &mut StoreRead<'_>,
        landed: &mut dyn FnMut(Vec<u8>),
    ) -> io::Result<()> {
        let mut missing: Vec<Vec<u8>> = Vec::new();
        let mut missing_start = first;
        for (block, buffer) in (first..).zip(buffers) {
            match self.load(key, block, buffer) {
                Ok(data) => {
                    self.fetch(key, missing_start, std::mem::take(&mut missing), store, landed)?;
                    landed(data);
                }
                Err(buffer) => {
                    if missing.is_empty() {
                        missing_start = block;
                    }
                    missing.push(buffer);
                }
            }
        }
        self.fetch(key, missing_start, missing, store, landed)
    }

    /// One store read of the missing run from `first`, each block written to disk as it lands.
    fn fetch(
        &self,
        key: &ObjectKey,
        first: u64,
        buffers: Vec<Vec<u8>>,
        store: &mut StoreRead<'_>,
        landed: &mut dyn FnMut(Vec<u8>),
    ) -> io::Result<()> {
        if buffers.is_empty() {
            return Ok(());
        }
        let mut block = first;
        store(first, buffers, &mut |data| {
            self.save(key, block, &data);
            block += 1;
            landed(data);
        })
    }

    /// Block `block` of `key` from disk into `buffer` (sized to the block), or the buffer back on
    /// a miss. A corrupt file is counted and removed; an unreadable one counted as an error.
    pub(crate) fn load(&self, key: &ObjectKey, block: u64, mut buffer: Vec<u8>) -> Result<Vec<u8>, Vec<u8>> {
        let path = store::block_path(&self.root, key, block);
        let stats = &self.stats;
        match store::read_block(&path, &mut buffer) {
            Ok(()) => {
                Stats::add(&stats.disk_cache_hits, 1);
                Stats::add(&stats.disk_cache_hit_bytes, buffer.len() as u64);
                return Ok(buffer);
            }
            Err(store::Miss::Absent) => {}
            Err(store::Miss::Corrupt(why)) => {
                Stats::add(&stats.disk_cache_corrupt, 1);
                log::warn!("{}: {why}; removed, fetching the block again", path.display());
                let _ = std::fs::remove_file(&path);
            }
            Err(store::Miss::Io(e)) => {
                Stats::add(&stats.disk_cache_errors, 1);
                log::debug!("{}: {e}", path.display());
            }
        }
        Stats::add(&stats.disk_cache_misses, 1);
        Err(buffer)
    }

    /// Writes block `block` of `key` to disk. A failure (disk full, read-only directory) is
    /// counted and logged once per mount: reads go on from the store.
    pub(crate) fn save(&self, key: &ObjectKey, block: u64, data: &[u8]) {
        match store::write_block(&self.root, key, block, data) {
            Ok(bytes) => {
                Stats::add(&self.stats.disk_cache_written_bytes, bytes);
                let stored = self.stored.fetch_add(bytes, Relaxed) + bytes;
                let since = self.written_since_scan.fetch_add(bytes, Relaxed) + bytes;
                self.publish_stored();
                if stored > self.limit || since > self.limit / 8 {
                    self.evict_now();
                }
            }
            Err(e) => {
                Stats::add(&self.stats.disk_cache_errors, 1);
                if !self.warned.swap(true, Relaxed) {
                    log::warn!(
                        "{}: cannot store blocks ({}); reading from the store instead (counted in disk_cache_errors)",
                        self.root.display(),
                        crate::util::describe_io(&e)
                    );
                }
            }
        }
    }

    /// Rescans the directory and evicts least recently used blocks down to the low-water mark if
    /// it holds more than the bound. Skipped while another thread or process is evicting.
    pub(crate) fn evict_now(&self) {
        if self.evicting.swap(true, Relaxed) {
            return;
        }
        if let Ok(Some(_lock)) = evict::lock(&self.root, false) {
            if let Ok(scan) = evict::scan(&self.root, true) {
                let done = evict::evict(scan, self.limit);
                Stats::add(&self.stats.disk_cache_evictions, done.blocks);
                self.stored.store(done.remaining, Relaxed);
                self.written_since_scan.store(0, Relaxed);
                self.publish_stored();
            }
        }
        self.evicting.store(false, Relaxed);
    }

    fn publish_stored(&self) {
        self.stats.disk_cache_bytes.store(self.stored.load(Relaxed), Relaxed);
    }
}

/// What a cache directory holds (`stfs cache info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheInfo {
    /// Block files.
    pub blocks: u64,
    /// Bytes they take (headers included).
    pub bytes: u64,
    /// Distinct sources (keys) they belong to.
    pub objects: u64,
    /// Temporary files (writes in progress, or left by a crash).
    pub temps: u64,
    /// The least and most recent use of a block, if any.
    pub used: Option<(SystemTime, SystemTime)>,
}

/// Reports what cache directory `dir` holds, changing nothing.
pub fn info(dir: &Path) -> io::Result<CacheInfo> {
    let scan = evict::scan(dir, false)?;
    let mut keys: Vec<&str> =
        scan.blocks.iter().filter_map(|b| b.path.file_name()?.to_str()?.split_once('-').map(|(key, _)| key)).collect();
    keys.sort_unstable();
    keys.dedup();
    let oldest = scan.blocks.iter().map(|b| b.used).min();
    let newest = scan.blocks.iter().map(|b| b.used).max();
    Ok(CacheInfo {
        blocks: scan.blocks.len() as u64,
        bytes: scan.bytes,
        objects: keys.len() as u64,
        temps: scan.temps as u64,
        used: oldest.zip(newest),
    })
}

/// Removes every block (and stale temporary file) of cache directory `dir`, holding its lock;
/// anything else in it is left alone. Mounts using it go on (they fetch again). Returns the
/// blocks and bytes removed.
pub fn clear(dir: &Path) -> io::Result<(u64, u64)> {
    if !dir.join(store::OBJECTS).is_dir() {
        return Ok((0, 0));
    }
    let _lock = evict::lock(dir, true)?;
    let scan = evict::scan(dir, true)?;
    let bytes = scan.bytes;
    let done = evict::evict(scan, 0);
    Ok((done.blocks, bytes - done.remaining))
}
