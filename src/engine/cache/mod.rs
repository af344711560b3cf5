//! The block cache: a byte-bounded LRU of loaded blocks with single-flight loading.
//!
//! This file holds the LRU, its byte budget and admission rules, and the [`LoadTicket`] a loader
//! finishes (finishing re-reserves budget, so the ticket belongs with the budget). Beside it:
//! `slot` (single flight: the [`LoadSlot`] readers of a loading block wait on), `behind`
//! (drop-behind: passed blocks' buffers go to the next loads) and `warm` (spare buffers faulted in
//! ahead of need). The buffer-reuse constants are in [`crate::engine::tuning`].
//!
//! Every block is in one of three places: absent, *loading* (a [`LoadSlot`] that concurrent readers
//! of that block wait on), or *ready* (in the LRU). The byte budget counts ready blocks plus the bytes
//! reserved by loads in flight, so the bound holds while loads run. The global mutex only guards map
//! and counter updates; backing I/O and waiting both happen outside it.
//!
//! Two admission rules:
//! - An on-demand load may evict any ready block. If the budget is entirely reserved by loads in
//!   flight, or the block is larger than the whole budget, the block is still loaded (single flight
//!   still applies) but served *uncached*: its bytes live only as long as the readers that got them.
//!   So a cache smaller than one block works, it just caches nothing.
//! - A prefetch may only evict blocks that were already read (or were loaded on demand), least
//!   recently used first; it never evicts a prefetched block nobody has read yet, because that block
//!   is about to be read. If that leaves no room, the prefetch is refused rather than blocking or
//!   overshooting the budget.
//!
//! Buffers are reused: a block a sequential stream has moved past (`behind`) and a block evicted
//! to make room hand their allocation to the next load, so a steady stream touches no fresh
//! memory (no page faults, no kernel zeroing). Idle spare buffers count against the budget like
//! ready blocks, and are the first thing dropped when room is needed. Until the cache is full
//! enough to recycle, a background thread keeps a few spares faulted in ahead of need (`warm`),
//! so loads do not fault in fresh memory on a reader's time either.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use lru::LruCache;

use super::tuning::reuse_threshold;
use crate::source::SourceId;
use crate::stats::Stats;
use crate::util::lock;

mod behind;
mod slot;
#[cfg(test)]
mod tests;
mod warm;

pub use slot::{BlockData, LoadSlot};

/// A block's identity: its source and its index (`offset / block_size`).
pub type BlockKey = (SourceId, u64);

/// Byte-bounded LRU of blocks; see the module doc for the admission rules.
pub struct BlockCache {
    capacity: u64,
    stats: Arc<Stats>,
    inner: Mutex<Inner>,
    /// Signalled when loads have used up the warm spares ([`BlockCache::keep_warm`]).
    spares_low: Condvar,
}

struct Inner {
    ready: LruCache<BlockKey, Resident>,
    loading: HashMap<BlockKey, Loading>,
    /// Allocations of blocks nobody holds any more, kept for the next loads (most recent last).
    spares: Vec<Vec<u8>>,
    /// Bytes of ready blocks, spare buffers and loads in flight; never above `capacity`.
    used: u64,
    /// The warming thread is waiting for spares to run low ([`BlockCache::keep_warm`]).
    warmer_asleep: bool,
    /// Passed blocks a reader still held when drop-behind reached them, oldest first
    /// ([`BlockCache::recycle`] tries them again).
    held_behind: VecDeque<BlockKey>,
}

struct Resident {
    data: BlockData,
    prefetched: bool,
    read: bool,
}

struct Loading {
    slot: Arc<LoadSlot>,
    prefetched: bool,
    /// Someone waited on this load, so a prefetched block counts as read once it lands.
    demanded: bool,
}

/// What a reader of one block has to do.
pub enum Lookup<'c> {
    /// The block is ready.
    Hit(BlockData),
    /// Another thread is loading it: wait on this slot.
    Wait(Arc<LoadSlot>),
    /// Nobody has it: the caller must load it and hand the bytes to the ticket.
    Load(LoadTicket<'c>),
}

/// What a prefetcher of one block has to do.
pub enum Prefetch<'c> {
    /// The block is ready or already loading; nothing to do.
    Present,
    /// No room without evicting unread data; drop this prefetch.
    Refused,
    /// Space is reserved: load the block and hand the bytes to the ticket.
    Load(LoadTicket<'c>),
}

/// The duty to finish one load; dropping it unfinished fails the load so waiters never hang.
pub struct LoadTicket<'c> {
    cache: &'c BlockCache,
    key: BlockKey,
    slot: Arc<LoadSlot>,
    reserved: u64,
    finished: bool,
    buffer: Option<Vec<u8>>,
}

impl LoadTicket<'_> {
    /// A buffer of `len` bytes to load the block into: a reused allocation when one was free (its
    /// old bytes are overwritten by the load), else a fresh zeroed one.
    pub fn take_buffer(&mut self, len: usize) -> Vec<u8> {
        match self.buffer.take() {
            Some(mut buffer) => {
                buffer.resize(len, 0);
                buffer
            }
            None => vec![0; len],
        }
    }

    /// Publishes the loaded bytes: caches them (if space was reserved, or has freed up since) and
    /// wakes the waiters. Returns the same bytes for the caller.
    pub fn complete(mut self, data: Vec<u8>) -> BlockData {
        self.finished = true;
        let data = Arc::new(data);
        let len = data.len() as u64;
        let cache = self.cache;
        {
            let mut inner = cache.lock_inner();
            let loading = inner.loading.remove(&self.key);
            let prefetched = loading.as_ref().is_some_and(|l| l.prefetched);
            let demanded = loading.as_ref().is_some_and(|l| l.demanded);
            inner.release(self.reserved, &cache.stats);
            // Re-reserve the real length; for an uncached load this is a second chance at a slot.
            let evict_read_only = prefetched;
            let mut unused = None;
            if len > 0 && inner.make_room(len, cache.capacity, evict_read_only, &cache.stats, &mut unused) {
                inner.used += len;
                cache.stats.add_resident(len as i64);
                let read = !prefetched || demanded;
                inner.ready.push(self.key, Resident { data: Arc::clone(&data), prefetched, read });
            }
        }
        self.slot.ready(Arc::clone(&data));
        data
    }

    /// Releases the reservation without caching anything and wakes the waiters with `error`.
    pub fn fail(mut self, error: &io::Error) {
        self.finished = true;
        self.abandon(error.kind(), error.to_string());
    }

    fn abandon(&self, kind: io::ErrorKind, text: String) {
        {
            let mut inner = self.cache.lock_inner();
            inner.loading.remove(&self.key);
            inner.release(self.reserved, &self.cache.stats);
        }
        self.slot.failed(kind, text);
    }
}

impl Drop for LoadTicket<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.abandon(io::ErrorKind::Other, "block load was abandoned".into());
        }
    }
}

impl Inner {
    fn release(&mut self, bytes: u64, stats: &Stats) {
        self.used -= bytes;
        stats.add_resident(-(bytes as i64));
    }

    /// Takes a spare buffer of exactly `len` bytes (out of the budget: the caller reserves anew).
    fn take_spare(&mut self, len: u64, stats: &Stats) -> Option<Vec<u8>> {
        let index = self.spares.iter().rposition(|b| b.len() as u64 == len)?;
        let buffer = self.spares.swap_remove(index);
        self.release(len, stats);
        Some(buffer)
    }

    /// Drops spare buffers, then evicts least recently used blocks, until `len` more bytes fit, and
    /// returns whether they do. Prefetched blocks nobody has read yet go last; with `read_only`
    /// they are passed over. Nothing is evicted unless enough blocks can go. An evicted block nobody holds
    /// becomes `reuse` (if that is empty and the sizes match), so the load needs no new memory.
    fn make_room(
        &mut self,
        len: u64,
        capacity: u64,
        read_only: bool,
        stats: &Stats,
        reuse: &mut Option<Vec<u8>>,
    ) -> bool {
        if len > capacity {
            return false;
        }
        while self.used + len > capacity {
            let Some(spare) = self.spares.pop() else { break };
            self.release(spare.len() as u64, stats);
        }
        let excess = (self.used + len).saturating_sub(capacity);
        let mut victims = Vec::new();
        let mut freed = 0;
        // Blocks already read (or loaded on demand) go first, least recently used first; then,
        // unless `read_only`, prefetched blocks nobody has read yet (each would be fetched again
        // when its reader comes).
        for unread in [false, true] {
            if unread && read_only {
                break;
            }
            for (key, resident) in self.ready.iter().rev() {
                if freed >= excess {
                    break;
                }
                if (resident.prefetched && !resident.read) == unread {
                    freed += resident.data.len() as u64;
                    victims.push(*key);
                }
            }
        }
        if freed < excess {
            return false;
        }
        for key in victims {
            if let Some(victim) = self.ready.pop(&key) {
                let bytes = victim.data.len() as u64;
                self.release(bytes, stats);
                Stats::add(&stats.evictions, 1);
                if victim.prefetched && !victim.read {
                    Stats::add(&stats.prefetch_unused_bytes, bytes);
                }
                if reuse.is_none() && bytes == len {
                    *reuse = Arc::try_unwrap(victim.data).ok();
                }
            }
        }
        true
    }
}

impl BlockCache {
    /// An empty cache that holds at most `capacity` bytes and records its counters in `stats`.
    pub fn new(capacity: u64, stats: Arc<Stats>) -> BlockCache {
        let inner = Inner {
            ready: LruCache::unbounded(),
            loading: HashMap::new(),
            spares: Vec::new(),
            used: 0,
            warmer_asleep: false,
            held_behind: VecDeque::new(),
        };
        BlockCache { capacity, stats, inner: Mutex::new(inner), spares_low: Condvar::new() }
    }

    /// Finds block `key` (of `len` bytes) for a reader: ready, loading, or the reader's to load.
    pub fn lookup(&self, key: BlockKey, len: u64) -> Lookup<'_> {
        let stats = &self.stats;
        let mut inner = self.lock_inner();
        if let Some(resident) = inner.ready.get_mut(&key) {
            resident.read = true;
            Stats::add(&stats.cache_hits, 1);
            return Lookup::Hit(Arc::clone(&resident.data));
        }
        if let Some(loading) = inner.loading.get_mut(&key) {
            loading.demanded = true;
            Stats::add(&stats.cache_hits, 1);
            Stats::add(&stats.single_flight_waits, 1);
            return Lookup::Wait(Arc::clone(&loading.slot));
        }
        Stats::add(&stats.cache_misses, 1);
        let mut buffer = inner.take_spare(len, stats);
        self.spare_taken(&inner);
        let fits = inner.make_room(len, self.capacity, false, stats, &mut buffer);
        let reserved = if fits { len } else { 0 };
        Lookup::Load(self.start_load(inner, key, reserved, false, buffer))
    }

    /// Reserves space to prefetch block `key`, unless it is present or there is no room to spare.
    pub fn prefetch(&self, key: BlockKey, len: u64) -> Prefetch<'_> {
        let mut inner = self.lock_inner();
        if inner.ready.contains(&key) || inner.loading.contains_key(&key) {
            return Prefetch::Present;
        }
        let mut buffer = inner.take_spare(len, &self.stats);
        self.spare_taken(&inner);
        if !inner.make_room(len, self.capacity, true, &self.stats, &mut buffer) {
            if let Some(buffer) = buffer {
                // Back where it came from: the budget had room for it a moment ago.
                inner.used += len;
                self.stats.add_resident(len as i64);
                inner.spares.push(buffer);
            }
            return Prefetch::Refused;
        }
        Prefetch::Load(self.start_load(inner, key, len, true, buffer))
    }

    /// Whether block `key` is ready or loading.
    pub fn contains(&self, key: BlockKey) -> bool {
        let inner = self.lock_inner();
        inner.ready.contains(&key) || inner.loading.contains_key(&key)
    }

    /// Bytes held or reserved right now.
    pub fn used_bytes(&self) -> u64 {
        self.lock_inner().used
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The fill from which loads reuse the buffers of blocks that go ([`reuse_threshold`]).
    fn reuse_threshold(&self) -> u64 {
        reuse_threshold(self.capacity)
    }

    fn start_load<'c>(
        &'c self,
        mut inner: MutexGuard<'c, Inner>,
        key: BlockKey,
        reserved: u64,
        prefetched: bool,
        buffer: Option<Vec<u8>>,
    ) -> LoadTicket<'c> {
        inner.used += reserved;
        self.stats.add_resident(reserved as i64);
        let slot = Arc::new(LoadSlot::new(prefetched));
        let loading = Loading { slot: Arc::clone(&slot), prefetched, demanded: false };
        inner.loading.insert(key, loading);
        LoadTicket { cache: self, key, slot, reserved, finished: false, buffer }
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }
}
