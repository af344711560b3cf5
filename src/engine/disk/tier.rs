//! One cache directory's shared state as this process sees it: the bound, the bytes believed
//! stored, the verified read of a block and its atomic write with the accounting, warnings and
//! eviction each needs, and which blocks this process knows are on disk (so that deciding to
//! assemble an extent costs no `stat` per block). The reading threads use it through `DiskCache`;
//! the write-behind thread (`behind`) writes through it.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::evict;
use super::store::{self, ObjectKey};
use crate::stats::Stats;
use crate::util::lock;

/// Most blocks [`Tier::all_present`] asks the write queue about: more than it holds of the
/// smallest blocks (64 MiB of 16 KiB).
const MAX_PENDING_ASKED: usize = 4096;

/// A cache directory's state (every field but the counters is this process's view).
#[derive(Debug)]
pub(crate) struct Tier {
    pub(crate) root: PathBuf,
    pub(crate) limit: u64,
    pub(crate) stats: Arc<Stats>,
    /// Bytes believed stored: the last scan plus this process's writes since.
    stored: AtomicU64,
    /// Bytes this process wrote since the last scan: past an eighth of the bound it rescans, so
    /// what other processes wrote is counted too.
    written_since_scan: AtomicU64,
    /// An eviction pass of this process is running.
    evicting: AtomicBool,
    /// A failed write was already logged.
    warned: AtomicBool,
    /// Writes this process stored (blocks and extents): a failed extent is tried again once this
    /// moved (`extents`).
    writes: AtomicU64,
    /// Blocks this process wrote or read verified, by key: set on a write or a hit, cleared on a
    /// miss and, wholesale, when this process evicts. Another process may still remove a block
    /// meanwhile; whoever reads it then finds it missing. Sparse ([`Present`]): its size follows
    /// the blocks marked, never the source's claimed length.
    present: Mutex<HashMap<ObjectKey, Present>>,
}

impl Tier {
    /// The state of directory `root` holding `stored` bytes, bound to `limit`.
    pub(crate) fn new(root: PathBuf, limit: u64, stored: u64, stats: Arc<Stats>) -> Tier {
        stats.disk_cache_limit.store(limit, Relaxed);
        let tier = Tier {
            root,
            limit,
            stats,
            stored: AtomicU64::new(stored),
            written_since_scan: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            warned: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            present: Mutex::default(),
        };
        tier.publish_stored();
        tier
    }

    /// Block `block` of `key` from disk into `buffer` (sized to the block), or the buffer back on
    /// a miss. A corrupt file is counted and removed; an unreadable one counted as an error.
    pub(crate) fn load(&self, key: &ObjectKey, block: u64, mut buffer: Vec<u8>) -> Result<Vec<u8>, Vec<u8>> {
        let path = store::block_path(&self.root, key, block);
        let stats = &self.stats;
        match store::read_block(&path, &mut buffer) {
            Ok(()) => {
                self.mark(key, block, true);
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
        self.mark(key, block, false);
        Stats::add(&stats.disk_cache_misses, 1);
        Err(buffer)
    }

    /// Writes block `block` of `key` to disk. A failure (disk full, read-only directory) is
    /// counted and logged once per mount: reads go on from the store.
    pub(crate) fn save(&self, key: &ObjectKey, block: u64, data: &[u8]) {
        match store::write_block(&self.root, key, block, data) {
            Ok(bytes) => {
                self.mark(key, block, true);
                self.wrote(bytes);
            }
            Err(e) => self.failed_write(&e),
        }
    }

    /// Accounts for `bytes` just stored, evicting if the bound is passed.
    pub(crate) fn wrote(&self, bytes: u64) {
        self.writes.fetch_add(1, Relaxed);
        Stats::add(&self.stats.disk_cache_written_bytes, bytes);
        let stored = self.stored.fetch_add(bytes, Relaxed) + bytes;
        let since = self.written_since_scan.fetch_add(bytes, Relaxed) + bytes;
        self.publish_stored();
        if stored > self.limit || since > self.limit / 8 {
            self.evict_now();
        }
    }

    /// How many writes this process has stored: one more after each.
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    /// Counts a failed write and warns about the first one.
    pub(crate) fn failed_write(&self, e: &std::io::Error) {
        Stats::add(&self.stats.disk_cache_errors, 1);
        if !self.warned.swap(true, Relaxed) {
            log::warn!(
                "{}: cannot store blocks ({}); reading from the store instead (counted in disk_cache_errors)",
                self.root.display(),
                crate::util::describe_io(e)
            );
        }
    }

    /// Rescans the directory and evicts least recently used files down to the low-water mark if
    /// it holds more than the bound. Skipped while another thread or process is evicting.
    pub(crate) fn evict_now(&self) {
        if self.evicting.swap(true, Relaxed) {
            return;
        }
        if let Ok(Some(_lock)) = evict::lock(&self.root, false) {
            if let Ok(scan) = evict::scan(&self.root, true) {
                let done = evict::evict(scan, self.limit);
                if done.blocks > 0 {
                    lock(&self.present).clear();
                }
                Stats::add(&self.stats.disk_cache_evictions, done.blocks);
                self.stored.store(done.remaining, Relaxed);
                self.written_since_scan.store(0, Relaxed);
                self.publish_stored();
            }
        }
        self.evicting.store(false, Relaxed);
    }

    /// Records that block `block` of `key` is (or is not) on disk.
    pub(crate) fn mark(&self, key: &ObjectKey, block: u64, on: bool) {
        let mut present = lock(&self.present);
        if on {
            // The key is cloned only for its first block, not on every hit.
            if !present.contains_key(key) {
                present.insert(key.clone(), Present::default());
            }
            if let Some(blocks) = present.get_mut(key) {
                blocks.set(block);
            }
        } else if let Some(blocks) = present.get_mut(key) {
            blocks.clear(block);
            if blocks.is_empty() {
                present.remove(key);
            }
        }
    }

    /// Whether every block of `blocks` of `key` is known to be on disk, or `pending` (queued for
    /// the disk) says it soon will be.
    pub(crate) fn all_present(&self, key: &ObjectKey, blocks: Range<u64>, pending: impl Fn(u64) -> bool) -> bool {
        let missing: Vec<u64> = {
            let present = lock(&self.present);
            let marked = present.get(key);
            let marked = |b: u64| marked.is_some_and(|p| p.get(b));
            let mut missing = Vec::new();
            for block in blocks {
                if !marked(block) {
                    missing.push(block);
                    // More holes than the write queue can hold blocks: not worth asking it.
                    if missing.len() > MAX_PENDING_ASKED {
                        return false;
                    }
                }
            }
            missing
        };
        missing.into_iter().all(pending)
    }

    fn publish_stored(&self) {
        self.stats.disk_cache_bytes.store(self.stored.load(Relaxed), Relaxed);
    }
}

/// One source's blocks known on disk: a bit per block, in 64-block words kept only where a bit is
/// set, so its size follows the blocks marked (bounded by what the cache holds), whatever block
/// index a source of a hostile claimed length asks about. (A dense vector grew to the highest
/// block ever marked: one read near the end of a source claiming 2^60 bytes asked for terabytes.)
#[derive(Debug, Default)]
struct Present(BTreeMap<u64, u64>);

impl Present {
    fn set(&mut self, block: u64) {
        *self.0.entry(block / 64).or_insert(0) |= 1 << (block % 64);
    }

    fn clear(&mut self, block: u64) {
        if let Some(word) = self.0.get_mut(&(block / 64)) {
            *word &= !(1 << (block % 64));
            if *word == 0 {
                self.0.remove(&(block / 64));
            }
        }
    }

    fn get(&self, block: u64) -> bool {
        self.0.get(&(block / 64)).is_some_and(|word| word & (1 << (block % 64)) != 0)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
