//! Tests of the block cache: the budget and its admission rules, single flight, failures.

use super::*;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

fn cache(capacity: u64) -> (BlockCache, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    (BlockCache::new(capacity, Arc::clone(&stats)), stats)
}

fn load(cache: &BlockCache, block: u64, len: u64) -> BlockData {
    match cache.lookup((0, block), len) {
        Lookup::Load(ticket) => ticket.complete(vec![block as u8; len as usize]),
        Lookup::Hit(data) => data,
        Lookup::Wait(_) => panic!("nobody else is loading block {block}"),
    }
}

fn prefetch(cache: &BlockCache, block: u64, len: u64) -> bool {
    match cache.prefetch((0, block), len) {
        Prefetch::Load(ticket) => {
            ticket.complete(vec![block as u8; len as usize]);
            true
        }
        Prefetch::Present | Prefetch::Refused => false,
    }
}

#[test]
fn evicts_least_recently_used_within_budget() {
    let (cache, stats) = cache(300);
    for block in 0..3 {
        load(&cache, block, 100);
    }
    assert!(matches!(cache.lookup((0, 0), 100), Lookup::Hit(_)));
    load(&cache, 3, 100);
    assert!(!cache.contains((0, 1)), "block 1 was the least recently used");
    assert!(cache.contains((0, 0)) && cache.contains((0, 2)) && cache.contains((0, 3)));
    assert_eq!(cache.used_bytes(), 300);
    assert_eq!(stats.evictions.load(Relaxed), 1);
    assert_eq!(stats.peak_resident_bytes.load(Relaxed), 300);
    assert_eq!((stats.cache_hits.load(Relaxed), stats.cache_misses.load(Relaxed)), (1, 4));
}

#[test]
fn prefetch_never_evicts_unread_prefetched_blocks() {
    let (cache, stats) = cache(200);
    assert!(prefetch(&cache, 0, 100));
    assert!(prefetch(&cache, 1, 100));
    assert!(!prefetch(&cache, 2, 100), "both resident blocks are unread");
    assert!(!prefetch(&cache, 0, 100), "already present");
    load(&cache, 0, 100); // reads block 0, so a later prefetch may evict it
    assert!(prefetch(&cache, 2, 100));
    assert!(!cache.contains((0, 0)));
    assert_eq!(stats.prefetch_unused_bytes.load(Relaxed), 0);
    load(&cache, 3, 100); // on demand evicts block 1, prefetched and never read
    assert_eq!(stats.prefetch_unused_bytes.load(Relaxed), 100);
}

#[test]
fn a_demand_load_evicts_read_blocks_before_unread_prefetched_ones() {
    let (cache, stats) = cache(300);
    assert!(prefetch(&cache, 0, 100)); // the least recently used, but nobody has read it yet
    load(&cache, 1, 100);
    assert!(prefetch(&cache, 2, 100));
    load(&cache, 3, 100);
    assert!(cache.contains((0, 0)), "an unread prefetched block went while a read one could");
    assert!(!cache.contains((0, 1)), "block 1 was read and is the oldest read block");
    assert_eq!(stats.prefetch_unused_bytes.load(Relaxed), 0);
    // Nothing read is left but block 3: it goes, then the oldest unread ones.
    load(&cache, 4, 200);
    assert!(!cache.contains((0, 3)) && !cache.contains((0, 0)) && cache.contains((0, 2)));
    assert_eq!(stats.prefetch_unused_bytes.load(Relaxed), 100);
}

#[test]
fn in_flight_loads_count_against_the_budget() {
    let (cache, stats) = cache(200);
    let Lookup::Load(first) = cache.lookup((0, 0), 100) else { panic!("expected a miss") };
    let Lookup::Load(second) = cache.lookup((0, 1), 100) else { panic!("expected a miss") };
    assert!(matches!(cache.prefetch((0, 2), 100), Prefetch::Refused));
    // No room for a third on-demand block: it is still loaded, but not cached.
    let Lookup::Load(third) = cache.lookup((0, 2), 100) else { panic!("expected a miss") };
    third.complete(vec![2; 100]);
    assert!(!cache.contains((0, 2)));
    first.complete(vec![0; 100]);
    second.complete(vec![1; 100]);
    assert_eq!(stats.peak_resident_bytes.load(Relaxed), 200);
}

#[test]
fn a_block_larger_than_the_cache_is_served_uncached() {
    let (cache, stats) = cache(50);
    assert_eq!(load(&cache, 0, 100).len(), 100);
    assert!(!cache.contains((0, 0)));
    assert_eq!(stats.peak_resident_bytes.load(Relaxed), 0);
}

#[test]
fn waiters_share_one_load() {
    let (cache, stats) = cache(1000);
    let Lookup::Load(ticket) = cache.lookup((0, 7), 10) else { panic!("expected a miss") };
    std::thread::scope(|scope| {
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let Lookup::Wait(slot) = cache.lookup((0, 7), 10) else { panic!("expected a wait") };
                scope.spawn(move || slot.wait(Duration::from_secs(5)).unwrap())
            })
            .collect();
        ticket.complete(vec![7; 10]);
        for waiter in waiters {
            assert_eq!(*waiter.join().unwrap(), vec![7; 10]);
        }
    });
    assert_eq!(stats.single_flight_waits.load(Relaxed), 4);
    assert_eq!(stats.cache_misses.load(Relaxed), 1);
}

#[test]
fn failed_or_abandoned_loads_wake_waiters_and_are_not_cached() {
    let (cache, stats) = cache(1000);
    let Lookup::Load(ticket) = cache.lookup((0, 1), 10) else { panic!("expected a miss") };
    let Lookup::Wait(slot) = cache.lookup((0, 1), 10) else { panic!("expected a wait") };
    ticket.fail(&io::Error::other("disk on fire"));
    let err = slot.wait(Duration::from_secs(5)).unwrap_err();
    assert!(err.to_string().contains("disk on fire"), "{err}");
    assert!(!cache.contains((0, 1)));
    assert_eq!(stats.resident_bytes.load(Relaxed), 0);

    let Lookup::Load(ticket) = cache.lookup((0, 1), 10) else { panic!("a retry loads again") };
    let Lookup::Wait(slot) = cache.lookup((0, 1), 10) else { panic!("expected a wait") };
    drop(ticket);
    assert!(slot.wait(Duration::from_secs(5)).is_err());
    assert!(matches!(cache.lookup((0, 1), 10), Lookup::Load(_)));
}

#[test]
fn waiting_times_out() {
    let (cache, _) = cache(1000);
    let Lookup::Load(_ticket) = cache.lookup((0, 1), 10) else { panic!("expected a miss") };
    let Lookup::Wait(slot) = cache.lookup((0, 1), 10) else { panic!("expected a wait") };
    let err = slot.wait(Duration::from_millis(10)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
}
