//! The disk tier (`--cache-dir`): whole blocks kept on local disk below the memory cache, shared by
//! every mount and process of the host that uses the same directory, with no daemon of its own.
//!
//! `backing::read_blocks` hands every run of blocks the engine loads (on demand or on a prefetch
//! lane) to [`DiskCache::read_through`]: each block found on disk (verified) lands without a store
//! request; each run of missing ones is one store read whose blocks are queued for the disk as
//! they land and written by one writer thread (`behind`), off the reader's path. So readahead
//! fills the disk as it fills memory, and a second load reads disk on the same lanes, in whole
//! blocks, in order.
//!
//! With FUSE passthrough (root), the writer also assembles an extent file for each tensor whose
//! blocks are all on disk when it is closed ([`DiskCache::extent_closed`]); a later open is
//! handed a verified one ([`DiskCache::extent_opened`]) to pass to the kernel.
//!
//! `store` holds the block files (key, layout, checksum, atomic write), `extent` the extent files
//! and their check, `extents` their lifecycle (what is assembled or verified when, off the FUSE
//! threads), `tier` the directory's state (accounting, the verified read, the write, the blocks
//! known on disk), `behind` the write-behind queue, `evict` the size bound and LRU, `open` the
//! directory's checks at mount and the default bound. Faults never fail a read: a write that fails (disk full,
//! read-only) is counted and warned about once, a corrupt file is counted, removed and fetched
//! again, a reader's write the full queue cannot take is counted and dropped.

mod behind;
mod evict;
mod extent;
mod extents;
#[cfg(test)]
mod hostile_tests;
mod open;
mod store;
#[cfg(test)]
mod tests;
mod tier;

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use open::{default_limit, DiskCacheError, DEFAULT_LIMIT_MAX, DEFAULT_LIMIT_PERCENT, MIN_LIMIT};
pub use store::ObjectKey;

use crate::stats::Stats;
use behind::WriteBehind;
use extents::{Extent, Extents};
use tier::Tier;

/// A store read of whole blocks from `first` into the buffers, handing each to the callback as
/// it lands (`backing`'s read through a descriptor).
pub(crate) type StoreRead<'a> = dyn FnMut(u64, Vec<Vec<u8>>, &mut dyn FnMut(Vec<u8>)) -> io::Result<()> + 'a;

/// One cache directory as a mount uses it.
#[derive(Debug)]
pub struct DiskCache {
    tier: Arc<Tier>,
    /// The writes waiting for the disk (`behind`).
    queue: Arc<WriteBehind>,
    /// The extent files' lifecycle (`extents`).
    extents: Arc<Extents>,
}

impl DiskCache {
    /// Opens (creating it mode 0700 if missing) and checks cache directory `dir`, bound to `limit`
    /// bytes ([`default_limit`] if `None`), counting into `stats`. No thread starts until the
    /// first write (the daemon forks after this).
    pub fn open(dir: &Path, limit: Option<u64>, stats: Arc<Stats>) -> Result<DiskCache, DiskCacheError> {
        let root = std::path::absolute(dir).map_err(DiskCacheError::Io)?;
        if let Some(size) = limit.filter(|&size| size < MIN_LIMIT) {
            return Err(DiskCacheError::TooSmall { size });
        }
        open::prepare(&root)?;
        let scan = evict::scan(&root, true).map_err(DiskCacheError::Io)?;
        let limit = limit.unwrap_or_else(|| default_limit(open::free_bytes(&root), scan.bytes));
        let tier = Arc::new(Tier::new(root, limit, scan.bytes, stats));
        // A bound lowered since the last mount holds from the start.
        if scan.bytes > limit {
            tier.evict_now();
        }
        Ok(DiskCache { tier, queue: Arc::default(), extents: Arc::default() })
    }

    /// The directory (absolute).
    pub fn root(&self) -> &Path {
        &self.tier.root
    }

    /// The bound on the bytes stored.
    pub fn limit(&self) -> u64 {
        self.tier.limit
    }

    /// Reads blocks `first..first + buffers.len()` of the source stored under `key`, handing each
    /// to `landed` in block order: from disk where a verified copy is there (or from the
    /// write-behind queue), else from the store through `store` (one call per run of missing
    /// blocks), queueing each such block for the disk as it lands. A prefetch lane (`lane`) hands
    /// each block on first, then waits (bounded) for room in a full queue, so the store is read
    /// no faster than the disk takes it; a reader's own load never waits (its write is dropped).
    /// On a store error the rest are dropped and the error returned.
    pub(crate) fn read_through(
        &self,
        key: &ObjectKey,
        first: u64,
        buffers: Vec<Vec<u8>>,
        store: &mut StoreRead<'_>,
        lane: bool,
        landed: &mut dyn FnMut(Vec<u8>),
    ) -> io::Result<()> {
        let mut missing: Vec<Vec<u8>> = Vec::new();
        let mut missing_start = first;
        for (block, buffer) in (first..).zip(buffers) {
            match self.load(key, block, buffer) {
                Ok(data) => {
                    self.fetch(key, missing_start, std::mem::take(&mut missing), store, lane, landed)?;
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
        self.fetch(key, missing_start, missing, store, lane, landed)
    }

    /// One store read of the missing run from `first`, each block queued for the disk as it lands.
    fn fetch(
        &self,
        key: &ObjectKey,
        first: u64,
        buffers: Vec<Vec<u8>>,
        store: &mut StoreRead<'_>,
        lane: bool,
        landed: &mut dyn FnMut(Vec<u8>),
    ) -> io::Result<()> {
        if buffers.is_empty() {
            return Ok(());
        }
        let mut block = first;
        store(first, buffers, &mut |data| {
            if lane {
                let copy = self.queue.pend(key, block, &data);
                landed(data);
                self.queue.push_pending(&self.tier, key, block, copy, behind::LANE_WAIT);
            } else {
                self.queue.push(&self.tier, key, block, &data);
                landed(data);
            }
            block += 1;
        })
    }

    /// Block `block` of `key` into `buffer` (sized to the block): from the write-behind queue if
    /// it waits there, else from disk (verified); the buffer back on a miss. A corrupt file is
    /// counted and removed; an unreadable one counted as an error.
    pub(crate) fn load(&self, key: &ObjectKey, block: u64, mut buffer: Vec<u8>) -> Result<Vec<u8>, Vec<u8>> {
        if let Some(data) = self.queue.get(key, block).filter(|d| d.len() == buffer.len()) {
            buffer.copy_from_slice(&data);
            Stats::add(&self.tier.stats.disk_cache_hits, 1);
            Stats::add(&self.tier.stats.disk_cache_hit_bytes, buffer.len() as u64);
            return Ok(buffer);
        }
        self.tier.load(key, block, buffer)
    }

    /// Writes block `block` of `key` to disk now, on this thread (counted, a failure warned about
    /// once, as the writer thread does).
    #[cfg(test)]
    pub(crate) fn save(&self, key: &ObjectKey, block: u64, data: &[u8]) {
        self.tier.save(key, block, data);
    }

    /// Turns extent files on, unless forbidden: a mount that can hand files to the kernel (FUSE
    /// passthrough). Returns whether they are on.
    pub fn enable_extents(&self) -> bool {
        self.extents.enable()
    }

    /// Keeps extent files off for this mount (`--no-passthrough`).
    pub fn forbid_extents(&self) {
        self.extents.forbid();
    }

    /// A file holding exactly `range` of the source under `key` (of `source_len` bytes, read in
    /// blocks of `block_size`) is opened: its extent file, verified, if one is ready at once
    /// (`extents`); else `None`, and what would make one ready for a later open is queued. Never
    /// reads the extent's data on the calling thread.
    pub(crate) fn extent_opened(
        &self,
        key: &ObjectKey,
        block_size: u64,
        source_len: u64,
        range: Range<u64>,
    ) -> Option<File> {
        let extent = Extent { key: key.clone(), block_size, source_len, range };
        self.extents.opened(&self.tier, &self.queue, &extent)
    }

    /// A file holding exactly `range` of the source under `key` was closed: its extent file is
    /// assembled (off this thread) if it has none and every block it covers is on disk or
    /// queued. Cheap: one `stat` and a look at the blocks this process knows are on disk.
    pub(crate) fn extent_closed(&self, key: &ObjectKey, block_size: u64, source_len: u64, range: Range<u64>) {
        let extent = Extent { key: key.clone(), block_size, source_len, range };
        self.extents.closed(&self.tier, &self.queue, &extent);
    }

    /// The engine is stopping: prefetch lanes no longer wait for room in the write queue.
    pub(crate) fn close_lanes(&self) {
        self.queue.close();
    }

    /// Waits until the queued writes are on disk, at most `timeout`; false if some are left.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.queue.flush(timeout)
    }

    #[cfg(test)]
    pub(crate) fn queue(&self) -> &WriteBehind {
        &self.queue
    }
}

impl Drop for DiskCache {
    /// Flushes the queued writes (for at most [`behind::FLUSH_WAIT`]) and stops the writer (for
    /// at most [`behind::STOP_WAIT`]; a writer busy longer is left to end with the process).
    fn drop(&mut self) {
        if !self.queue.flush(behind::FLUSH_WAIT) {
            log::warn!("{}: gave up waiting for the disk cache's queued writes", self.tier.root.display());
        }
        self.queue.stop(&self.tier.stats, behind::STOP_WAIT);
    }
}

/// What a cache directory holds (`stfs cache info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheInfo {
    /// Block files.
    pub blocks: u64,
    /// Extent files (one tensor file's bytes each, for FUSE passthrough).
    pub extents: u64,
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
    let extents = scan.blocks.iter().filter(|b| b.extent && b.record.is_some()).count() as u64;
    keys.sort_unstable();
    keys.dedup();
    let oldest = scan.blocks.iter().map(|b| b.used).min();
    let newest = scan.blocks.iter().map(|b| b.used).max();
    Ok(CacheInfo {
        blocks: scan.blocks.iter().filter(|b| !b.extent).count() as u64,
        extents,
        bytes: scan.bytes,
        objects: keys.len() as u64,
        temps: scan.temps as u64,
        used: oldest.zip(newest),
    })
}

/// Removes every block and extent file (and stale temporary file) of cache directory `dir`,
/// holding its lock; anything else in it is left alone. Mounts using it go on (they fetch again;
/// a file the kernel already has open stays readable until closed). Returns the files and bytes
/// removed.
pub fn clear(dir: &Path) -> io::Result<(u64, u64)> {
    if !dir.join(store::OBJECTS).is_dir() && !dir.join(extent::EXTENTS).is_dir() {
        return Ok((0, 0));
    }
    let _lock = evict::lock(dir, true)?;
    let scan = evict::scan(dir, true)?;
    let bytes = scan.bytes;
    let done = evict::evict(scan, 0);
    Ok((done.blocks, bytes - done.remaining))
}
