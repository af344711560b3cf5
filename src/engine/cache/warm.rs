//! Warm spare buffers: a background thread faults in a few block buffers ahead of need, so a load
//! that finds no buffer to reuse (a random reader filling the cache) does not pay for fresh memory
//! on the reader's time.
//!
//! A new block's buffer is fresh memory until the cache is full and starts reusing evicted ones.
//! Its first write costs a page fault per 4 KiB, and on a VM that hands freed memory back to the
//! host (free page reporting) a host fault too: about 3 µs per page here, so 50 µs for a 64 KiB
//! block, half of a first-touch random read (docs/notes/benchmarks.md). The warm spares are ordinary
//! spare buffers (counted against the cache budget), topped up only while the cache is at most
//! three-quarters full, where a load would otherwise allocate.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::{BlockCache, Inner};
use crate::engine::tuning::{MAX_SPARES, WARM_SPARE_BYTES};
use crate::util::wait;

impl BlockCache {
    /// Runs on a background thread until `stop` is set (then call [`BlockCache::wake_warmer`]):
    /// keeps up to [`WARM_SPARE_BYTES`] of spare buffers of `len` bytes faulted in.
    pub fn keep_warm(&self, len: u64, stop: &AtomicBool) {
        let Ok(size) = usize::try_from(len) else { return };
        if len == 0 {
            return;
        }
        loop {
            {
                let mut inner = self.lock_inner();
                while !stop.load(Relaxed) && !self.wants_warm(&inner, len) {
                    inner.warmer_asleep = true;
                    inner = wait(&self.spares_low, inner);
                    inner.warmer_asleep = false;
                }
                if stop.load(Relaxed) {
                    return;
                }
                // Counted now, so the budget holds while the buffer is being faulted in.
                inner.used += len;
                self.stats.add_resident(len as i64);
            }
            let buffer = faulted_in(size);
            self.lock_inner().spares.push(buffer);
        }
    }

    /// Wakes the warming thread (to stop it, or because spares ran low).
    pub fn wake_warmer(&self) {
        // Taking the lock first: the thread is then either before its check of `stop` or waiting.
        drop(self.lock_inner());
        self.spares_low.notify_all();
    }

    /// Called after a load took (or failed to find) a spare buffer: wakes the warming thread if
    /// it sleeps and may top up (so a load costs no wake-up call otherwise).
    pub(super) fn spare_taken(&self, inner: &Inner) {
        if inner.warmer_asleep && inner.used <= self.reuse_threshold() {
            self.spares_low.notify_one();
        }
    }

    /// Warm spares are added only up to the reuse threshold: beyond it, loads reuse the buffers of
    /// evicted blocks, and spares would only crowd out data.
    fn wants_warm(&self, inner: &Inner, len: u64) -> bool {
        let warm = inner.spares.iter().filter(|b| b.len() as u64 == len).count() as u64;
        warm < self.warm_count(len) && inner.used + len <= self.reuse_threshold()
    }

    /// Spares of `len` bytes to keep: none for blocks larger than [`WARM_SPARE_BYTES`], whose
    /// loads are large reads anyway (and a 1 GiB block would make an idle mount hold 1 GiB), and
    /// never more than the pool holds ([`MAX_SPARES`]), so drop-behind can still add to it.
    fn warm_count(&self, len: u64) -> u64 {
        (WARM_SPARE_BYTES / len.max(1)).min(MAX_SPARES as u64)
    }
}

/// A zeroed buffer of `len` bytes whose every page has been written, so it is resident.
fn faulted_in(len: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; len];
    // A zeroed allocation may be untouched pages; writing an opaque zero into each makes the
    // kernel fault it in now (a plain zero store could be optimised away).
    for page in buffer.chunks_mut(4096) {
        page[0] = std::hint::black_box(0);
    }
    buffer
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::cache::Lookup;
    use crate::stats::Stats;
    use crate::util::test_support::eventually;

    const LEN: u64 = 64 << 10;

    fn spares(cache: &BlockCache) -> usize {
        cache.lock_inner().spares.len()
    }

    #[test]
    fn keeps_spares_warm_within_the_budget_and_stops_when_told() {
        let stats = Arc::new(Stats::default());
        let cache = BlockCache::new(1 << 30, Arc::clone(&stats));
        let stop = AtomicBool::new(false);
        let want = (WARM_SPARE_BYTES / LEN).min(MAX_SPARES as u64) as usize;
        std::thread::scope(|scope| {
            let warmer = scope.spawn(|| cache.keep_warm(LEN, &stop));
            eventually("the warm spares", || spares(&cache) == want);
            assert_eq!(cache.used_bytes(), want as u64 * LEN, "spares count against the budget");
            // A load takes one (its buffer is a warm spare, already counted), and the thread tops up.
            let Lookup::Load(mut ticket) = cache.lookup((0, 7), LEN) else { panic!("a miss loads") };
            assert_eq!(ticket.take_buffer(LEN as usize).len(), LEN as usize);
            ticket.complete(vec![7; LEN as usize]);
            eventually("the top-up", || spares(&cache) == want);
            stop.store(true, Relaxed);
            cache.wake_warmer();
            warmer.join().unwrap();
        });
        assert_eq!(spares(&cache), want);
    }

    #[test]
    fn keeps_no_spares_of_blocks_larger_than_the_warm_budget() {
        let cache = BlockCache::new(1 << 30, Arc::new(Stats::default()));
        let stop = AtomicBool::new(false);
        assert!(!cache.wants_warm(&cache.lock_inner(), 2 * WARM_SPARE_BYTES));
        stop.store(true, Relaxed);
        cache.keep_warm(2 * WARM_SPARE_BYTES, &stop);
        assert_eq!((spares(&cache), cache.used_bytes()), (0, 0));
    }

    #[test]
    fn adds_nothing_past_three_quarters_of_a_small_cache() {
        let stats = Arc::new(Stats::default());
        // Room for two blocks: at most one warm spare (1.5 blocks is three quarters).
        let cache = BlockCache::new(2 * LEN, Arc::clone(&stats));
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let warmer = scope.spawn(|| cache.keep_warm(LEN, &stop));
            eventually("one warm spare", || spares(&cache) == 1);
            // A block read on demand fills the cache past the limit: no spare is added back.
            let Lookup::Load(ticket) = cache.lookup((0, 1), LEN) else { panic!("a miss loads") };
            ticket.complete(vec![1; LEN as usize]);
            stop.store(true, Relaxed);
            cache.wake_warmer();
            warmer.join().unwrap();
        });
        assert_eq!(spares(&cache), 0);
        assert!(stats.peak_resident_bytes.load(Relaxed) <= 2 * LEN);
    }
}
