//! Drop-behind: the buffers of blocks a sequential stream has moved past go to the next loads, so
//! reading a checkpoint once touches a bounded amount of fresh memory whatever the cache's budget.
//!
//! A passed block stays cached (only demoted to be the first evicted) while the cache holds less
//! than [`STREAM_REUSE_BYTES`] or three-quarters of its budget: another reader, or another view of
//! the same bytes, may still want it, and storage should see each byte once. From there on its
//! allocation becomes a spare for the next load. The kernel's page cache keeps what the stream
//! read (stfs opens files with `FOPEN_KEEP_CACHE`), so a reader of the same file does not miss it.
//!
//! Fresh memory is not free: every first touch of a page is a page fault and a clear, and on a VM
//! that hands freed memory back to the host a host fault as well. Filling a 512 MiB cache that way
//! while streaming a 1 GiB checkpoint once cost the daemon about as much CPU as everything else it
//! did for those bytes (docs/notes/remote-benchmarks.md).
//!
//! A reply still being written from a passed block (the kernel sends several reads at once) keeps
//! the block alive; it is remembered and recycled at a later drop-behind once the reply is done.

use std::sync::Arc;

use super::{BlockCache, BlockKey, Inner};
use crate::engine::tuning::{MAX_HELD_BEHIND, MAX_SPARES, STREAM_REUSE_BYTES};
use crate::stats::Stats;

/// What drop-behind did with one passed block.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Its buffer is a spare now.
    Recycled,
    /// A reader still holds its bytes: try again later.
    Held,
    /// Not cached (any more), not read yet, or the spare pool is full: nothing to do.
    Left,
}

impl BlockCache {
    /// Drop-behind for block `key`, which a sequential reader has moved past (see the module doc).
    /// Also recycles the earlier passed blocks whose readers have finished since. Returns whether
    /// `key` itself was turned into a spare.
    pub fn recycle(&self, key: BlockKey) -> bool {
        let mut inner = self.lock_inner();
        if inner.used < self.drop_behind_threshold() {
            inner.ready.demote(&key);
            return false;
        }
        while let Some(&oldest) = inner.held_behind.front() {
            if inner.recycle_one(oldest, &self.stats) == Outcome::Held {
                break;
            }
            inner.held_behind.pop_front();
        }
        match inner.recycle_one(key, &self.stats) {
            Outcome::Recycled => true,
            Outcome::Held => {
                inner.ready.demote(&key);
                if inner.held_behind.len() == MAX_HELD_BEHIND {
                    inner.held_behind.pop_front();
                }
                inner.held_behind.push_back(key);
                false
            }
            Outcome::Left => false,
        }
    }

    /// Fill from which passed blocks are recycled rather than kept.
    fn drop_behind_threshold(&self) -> u64 {
        self.reuse_threshold().min(STREAM_REUSE_BYTES)
    }
}

impl Inner {
    fn recycle_one(&mut self, key: BlockKey, stats: &Stats) -> Outcome {
        let Some(resident) = self.ready.peek(&key) else {
            return Outcome::Left;
        };
        if !resident.read || self.spares.len() >= MAX_SPARES {
            return Outcome::Left;
        }
        if Arc::strong_count(&resident.data) > 1 {
            return Outcome::Held;
        }
        let Some(resident) = self.ready.pop(&key) else {
            return Outcome::Left;
        };
        match Arc::try_unwrap(resident.data) {
            Ok(buffer) => {
                self.spares.push(buffer);
                Stats::add(&stats.evictions, 1);
                Outcome::Recycled
            }
            Err(data) => {
                // Unreachable under the lock (the count was 1), but never lose the accounting.
                self.release(data.len() as u64, stats);
                Outcome::Left
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cache::{BlockData, Lookup};

    fn cache(capacity: u64) -> BlockCache {
        BlockCache::new(capacity, Arc::new(Stats::default()))
    }

    fn load(cache: &BlockCache, block: u64) -> BlockData {
        match cache.lookup((0, block), 100) {
            Lookup::Load(ticket) => ticket.complete(vec![block as u8; 100]),
            Lookup::Hit(data) => data,
            Lookup::Wait(_) => panic!("nobody else is loading block {block}"),
        }
    }

    fn spares(cache: &BlockCache) -> usize {
        cache.lock_inner().spares.len()
    }

    #[test]
    fn passed_blocks_stay_cached_until_the_threshold_then_become_spares() {
        let cache = cache(400); // threshold: three-quarters, 300 bytes
        load(&cache, 0);
        load(&cache, 1);
        assert!(!cache.recycle((0, 0)), "below the threshold a passed block stays");
        assert!(cache.contains((0, 0)));
        load(&cache, 2);
        assert!(cache.recycle((0, 1)));
        assert!(!cache.contains((0, 1)));
        assert_eq!((spares(&cache), cache.used_bytes()), (1, 300), "the buffer stays counted");
        load(&cache, 3);
        assert_eq!((spares(&cache), cache.used_bytes()), (0, 300), "the next load reused it");
    }

    #[test]
    fn a_passed_block_still_being_replied_is_recycled_once_released() {
        let cache = cache(400);
        let held = load(&cache, 0);
        load(&cache, 1);
        load(&cache, 2);
        assert!(!cache.recycle((0, 0)));
        assert!(cache.contains((0, 0)), "a reader still holds it");
        drop(held);
        assert!(cache.recycle((0, 1)));
        assert!(!cache.contains((0, 0)) && !cache.contains((0, 1)));
        assert_eq!(spares(&cache), 2);
    }

    #[test]
    fn unread_blocks_are_never_recycled() {
        let cache = cache(300);
        load(&cache, 0);
        load(&cache, 1);
        let crate::engine::cache::Prefetch::Load(ticket) = cache.prefetch((0, 2), 100) else {
            panic!("room for a prefetch")
        };
        ticket.complete(vec![2; 100]);
        assert!(!cache.recycle((0, 2)));
        assert!(cache.contains((0, 2)));
    }

    #[test]
    fn a_large_cache_starts_reusing_at_stream_reuse_bytes() {
        assert_eq!(cache(1 << 30).drop_behind_threshold(), STREAM_REUSE_BYTES);
        assert_eq!(cache(1 << 20).drop_behind_threshold(), 3 << 18);
    }
}
