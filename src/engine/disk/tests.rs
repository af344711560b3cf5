//! The disk tier's store on its own: keys, atomic writes, checksums, eviction within the bound,
//! reading through to the store for missing runs only, and the directory checks at open.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::store::{self, block_path, Miss, HEADER_LEN};
use super::{evict, extent, DiskCache, DiskCacheError, ObjectKey};
use crate::stats::Stats;

pub(super) fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn open(dir: &std::path::Path, limit: u64) -> (DiskCache, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    (DiskCache::open(dir, Some(limit), Arc::clone(&stats)).unwrap(), stats)
}

#[test]
fn keys_depend_on_identity_and_block_size() {
    let a = ObjectKey::new("file:dev=1:ino=2", 4096);
    assert_eq!(a, ObjectKey::new("file:dev=1:ino=2", 4096));
    assert_ne!(a, ObjectKey::new("file:dev=1:ino=3", 4096));
    assert_ne!(a, ObjectKey::new("file:dev=1:ino=2", 8192));
    assert_eq!(a.as_str().len(), 32);
    let name = block_path("/c".as_ref(), &a, 17).file_name().unwrap().to_str().unwrap().to_string();
    assert!(store::is_block_name(&name) && !store::is_temp_name(&name), "{name}");
}

#[test]
fn a_written_block_reads_back_verified_and_corruption_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let key = ObjectKey::new("x", 1000);
    let data = bytes(7, 1000);
    assert_eq!(store::write_block(dir.path(), &key, 3, &data).unwrap(), (HEADER_LEN + 1000) as u64);
    let mut buf = vec![0; 1000];
    store::read_block(&block_path(dir.path(), &key, 3), &mut buf).unwrap();
    assert_eq!(buf, data);
    assert!(matches!(store::read_block(&block_path(dir.path(), &key, 4), &mut buf), Err(Miss::Absent)));
    // A block of another length (the source's last block, say) is not taken for this one.
    let mut short = vec![0; 999];
    assert!(matches!(store::read_block(&block_path(dir.path(), &key, 3), &mut short), Err(Miss::Corrupt(_))));

    let path = block_path(dir.path(), &key, 3);
    let mut file = std::fs::read(&path).unwrap();
    file[HEADER_LEN + 500] ^= 1;
    std::fs::write(&path, &file).unwrap();
    let why = match store::read_block(&path, &mut buf) {
        Err(Miss::Corrupt(why)) => why,
        other => panic!("{other:?}"),
    };
    assert!(why.contains("checksum"), "{why}");
    std::fs::write(&path, &file[..file.len() - 10]).unwrap();
    assert!(matches!(store::read_block(&path, &mut buf), Err(Miss::Corrupt(_))));
    std::fs::write(&path, vec![0u8; HEADER_LEN + 1000]).unwrap();
    assert!(matches!(store::read_block(&path, &mut buf), Err(Miss::Corrupt(_))));

    // Through the cache: counted, removed, then a miss.
    let (cache, stats) = open(dir.path(), 1 << 20);
    assert!(cache.load(&key, 3, vec![0; 1000]).is_err());
    assert!(!path.exists());
    assert_eq!((stats.disk_cache_corrupt.load(Relaxed), stats.disk_cache_misses.load(Relaxed)), (1, 1));
    cache.save(&key, 3, &data);
    assert_eq!(cache.load(&key, 3, vec![0; 1000]).unwrap(), data);
    assert_eq!(stats.disk_cache_hits.load(Relaxed), 1);
}

#[test]
fn writers_racing_on_one_block_never_show_a_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = ObjectKey::new("race", 1 << 16);
    let data = bytes(3, 1 << 16);
    let path = block_path(dir.path(), &key, 0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20 {
                    store::write_block(dir.path(), &key, 0, &data).unwrap();
                }
            });
        }
        s.spawn(|| {
            let mut buf = vec![0; 1 << 16];
            for _ in 0..200 {
                match store::read_block(&path, &mut buf) {
                    Ok(()) => assert!(buf == data),
                    Err(Miss::Absent) => {}
                    Err(other) => panic!("a reader saw {other:?}"),
                }
            }
        });
    });
    // No temporary file is left behind; one left by a crash goes once it is stale.
    let scan = evict::scan(dir.path(), true).unwrap();
    assert_eq!((scan.blocks.len(), scan.temps), (1, 0));
    let fan = path.parent().unwrap();
    let temp = fan.join(format!(".{}-9.1.1.tmp", key.as_str()));
    std::fs::write(&temp, b"torn").unwrap();
    assert_eq!(evict::scan(dir.path(), true).unwrap().temps, 1, "a fresh temp may be a live write");
    let old = SystemTime::now() - evict::STALE_TEMP_AGE - Duration::from_secs(5);
    std::fs::File::options().write(true).open(&temp).unwrap().set_modified(old).unwrap();
    assert_eq!(evict::scan(dir.path(), true).unwrap().temps, 0);
    assert!(!temp.exists());
}

#[test]
fn eviction_keeps_the_bound_and_the_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats) = open(dir.path(), 2 << 20);
    let key = ObjectKey::new("big", 64 << 10);
    let data = bytes(1, 64 << 10);
    // Block 0 is written first, then made the most recently used (as a hit an hour later would).
    cache.save(&key, 0, &data);
    let past = SystemTime::now() - Duration::from_secs(3600);
    for block in 1..50u64 {
        cache.save(&key, block, &data);
        let path = block_path(dir.path(), &key, block);
        if block < 10 {
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(past).unwrap();
        }
    }
    let stored = evict::scan(dir.path(), false).unwrap().bytes;
    assert!(stored <= 2 << 20, "{stored} bytes stored over a 2 MiB bound");
    assert!(stats.disk_cache_evictions.load(Relaxed) >= 50 - 32, "{:?}", stats.disk_cache_evictions);
    assert_eq!(stats.disk_cache_bytes.load(Relaxed), stored);
    // The blocks last written (most recently used) are there; the ones aged an hour are gone.
    assert!(block_path(dir.path(), &key, 49).exists());
    assert!(!block_path(dir.path(), &key, 5).exists());
    // A new mount with a lower bound evicts at open.
    let (_, stats) = open(dir.path(), 1 << 20);
    assert!(evict::scan(dir.path(), false).unwrap().bytes <= 1 << 20);
    assert!(stats.disk_cache_evictions.load(Relaxed) > 0);
    let left = evict::scan(dir.path(), false).unwrap().blocks.len() as u64;
    assert_eq!(super::clear(dir.path()).unwrap().0, left);
    assert_eq!(super::info(dir.path()).unwrap().blocks, 0);
}

#[test]
fn read_through_fetches_only_the_missing_runs_and_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats) = open(dir.path(), 64 << 20);
    let key = ObjectKey::new("src", 100);
    let block = |b: u64| bytes(b as u8, 100);
    for b in [1u64, 2, 5] {
        cache.save(&key, b, &block(b));
    }
    let mut calls = Vec::new();
    let mut landed = Vec::new();
    let mut store = |first: u64, buffers: Vec<Vec<u8>>, land: &mut dyn FnMut(Vec<u8>)| {
        calls.push((first, buffers.len()));
        for (b, mut buf) in (first..).zip(buffers) {
            buf.copy_from_slice(&block(b));
            land(buf);
        }
        Ok(())
    };
    cache.read_through(&key, 0, vec![vec![0; 100]; 7], &mut store, false, &mut |data| landed.push(data)).unwrap();
    assert_eq!(calls, [(0, 1), (3, 2), (6, 1)]);
    assert_eq!(landed, (0..7).map(block).collect::<Vec<_>>());
    assert_eq!((stats.disk_cache_hits.load(Relaxed), stats.disk_cache_misses.load(Relaxed)), (3, 4));
    // Now every block is on disk: no store call at all.
    calls.clear();
    let mut store = |_: u64, _: Vec<Vec<u8>>, _: &mut dyn FnMut(Vec<u8>)| -> std::io::Result<()> {
        panic!("the store was read though every block is on disk")
    };
    let mut again = Vec::new();
    cache.read_through(&key, 0, vec![vec![0; 100]; 7], &mut store, false, &mut |data| again.push(data)).unwrap();
    assert_eq!(again, landed);
    assert!(cache.flush(Duration::from_secs(10)));
    let info = super::info(dir.path()).unwrap();
    assert_eq!((info.blocks, info.objects, info.bytes), (7, 1, 7 * (100 + HEADER_LEN as u64)));
}

/// A store that serves `block(b)` for block `b` and counts its calls.
fn counting_store<'a>(
    calls: &'a mut Vec<(u64, usize)>,
    block: &'a dyn Fn(u64) -> Vec<u8>,
) -> Box<super::StoreRead<'a>> {
    Box::new(move |first, buffers, land| {
        calls.push((first, buffers.len()));
        for (b, mut buf) in (first..).zip(buffers) {
            buf.copy_from_slice(&block(b));
            land(buf);
        }
        Ok(())
    })
}

#[test]
fn writes_leave_the_reader_path_and_queued_blocks_are_served_until_written() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats) = open(dir.path(), 64 << 20);
    let key = ObjectKey::new("behind", 1000);
    let block = |b: u64| bytes(b as u8, 1000);
    // The writer is held: the read returns with its blocks landed, none of them on disk yet.
    cache.queue().hold(true);
    let mut calls = Vec::new();
    let mut landed = Vec::new();
    let mut store = counting_store(&mut calls, &block);
    cache.read_through(&key, 0, vec![vec![0; 1000]; 4], &mut store, false, &mut |d| landed.push(d)).unwrap();
    assert_eq!(landed, (0..4).map(block).collect::<Vec<_>>());
    assert!((0..4).all(|b| !block_path(dir.path(), &key, b).exists()), "written on the reader's path");
    assert_eq!(stats.disk_cache_written_bytes.load(Relaxed), 0);
    // A second read finds them in the queue: no store call, counted as disk hits.
    let mut again = Vec::new();
    let mut none = |_: u64, _: Vec<Vec<u8>>, _: &mut dyn FnMut(Vec<u8>)| -> std::io::Result<()> {
        panic!("a queued block was fetched again")
    };
    cache.read_through(&key, 0, vec![vec![0; 1000]; 4], &mut none, false, &mut |d| again.push(d)).unwrap();
    assert_eq!(again, landed);
    assert_eq!(stats.disk_cache_hits.load(Relaxed), 4);
    // Held, the queue cannot drain: a bounded flush gives up.
    assert!(!cache.flush(Duration::from_millis(50)));
    cache.queue().hold(false);
    assert!(cache.flush(Duration::from_secs(10)));
    for b in 0..4 {
        let mut buf = vec![0; 1000];
        store::read_block(&block_path(dir.path(), &key, b), &mut buf).unwrap();
        assert_eq!(buf, block(b));
    }
    assert_eq!(stats.disk_cache_written_bytes.load(Relaxed), 4 * (1000 + HEADER_LEN as u64));
    assert_eq!(stats.disk_cache_write_drops.load(Relaxed), 0);
}

#[test]
fn a_full_queue_drops_writes_and_counts_them_and_drop_flushes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats) = open(dir.path(), 512 << 20);
    let size = 4 << 20;
    let key = ObjectKey::new("full", size as u64);
    let block = move |b: u64| bytes(b as u8, size);
    let count = (super::behind::QUEUE_BYTES / size as u64) as usize + 3;
    cache.queue().hold(true);
    let mut calls = Vec::new();
    let mut store = counting_store(&mut calls, &block);
    let mut landed = 0;
    cache.read_through(&key, 0, vec![vec![0; size]; count], &mut store, false, &mut |_| landed += 1).unwrap();
    // Every block reached the reader; the queue took what fits and dropped the rest.
    assert_eq!(landed, count);
    assert_eq!(stats.disk_cache_write_drops.load(Relaxed), 3);
    cache.queue().hold(false);
    drop(cache);
    let stored = (0..count as u64).filter(|&b| block_path(dir.path(), &key, b).exists()).count();
    assert_eq!(stored, count - 3, "dropping the cache flushes what was queued");
}

#[test]
fn a_prefetch_lane_waits_for_room_in_a_full_queue_where_a_reader_drops() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats) = open(dir.path(), 512 << 20);
    let size = 4 << 20;
    let key = ObjectKey::new("lane", size as u64);
    let block = move |b: u64| bytes(b as u8, size);
    let fill = (super::behind::QUEUE_BYTES / size as u64) as usize;
    cache.queue().hold(true);
    let mut calls = Vec::new();
    let mut store = counting_store(&mut calls, &block);
    cache.read_through(&key, 0, vec![vec![0; size]; fill], &mut store, false, &mut |_| {}).unwrap();
    assert_eq!(stats.disk_cache_write_drops.load(Relaxed), 0);
    let landed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let lane = s.spawn(|| {
            let mut calls = Vec::new();
            let mut store = counting_store(&mut calls, &block);
            let first = fill as u64;
            cache.read_through(&key, first, vec![vec![0; size]; 2], &mut store, true, &mut |_| {
                landed.fetch_add(1, Relaxed);
            })
        });
        // The lane hands its first block on (however slow a loaded machine makes that), then waits
        // for room instead of dropping it: after a further 300 ms it has still not gone on.
        crate::util::test_support::eventually("the lane's first block", || landed.load(Relaxed) >= 1);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(landed.load(Relaxed), 1);
        assert!(!lane.is_finished());
        cache.queue().hold(false);
        lane.join().unwrap().unwrap();
    });
    assert!(cache.flush(Duration::from_secs(10)));
    assert_eq!(stats.disk_cache_write_drops.load(Relaxed), 0);
    assert!((0..fill as u64 + 2).all(|b| block_path(dir.path(), &key, b).exists()));
}

#[test]
fn open_creates_a_private_directory_and_refuses_shared_or_foreign_ones() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("a/b/cache");
    open(&fresh, 1 << 20);
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);

    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    for bad in [0o777, 0o770, 0o702] {
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(bad)).unwrap();
        let e = DiskCache::open(&shared, None, Default::default()).unwrap_err();
        assert!(matches!(e, DiskCacheError::Writable { .. }), "{bad:o}: {e}");
        assert!(e.to_string().contains("writable by group or others"), "{e}");
    }
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = DiskCache::open(&shared, None, Default::default()).unwrap();
    assert!(cache.limit() >= super::MIN_LIMIT && cache.limit() <= super::DEFAULT_LIMIT_MAX);
    assert!(matches!(DiskCache::open(&shared, Some(1000), Default::default()), Err(DiskCacheError::TooSmall { .. })));

    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert!(matches!(DiskCache::open(&file, None, Default::default()), Err(DiskCacheError::NotADirectory)));

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let foreign = dir.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
        let e = DiskCache::open(&foreign, None, Default::default()).unwrap_err();
        assert!(matches!(e, DiskCacheError::ForeignOwner { owner: 65534, .. }), "{e}");
    }
}

#[test]
fn the_default_bound_is_a_tenth_of_free_space_plus_what_is_stored_capped() {
    assert_eq!(super::default_limit(100 << 30, 0), 10 << 30);
    assert_eq!(super::default_limit(100 << 30, 5 << 30), 15 << 30);
    assert_eq!(super::default_limit(10 << 40, 0), super::DEFAULT_LIMIT_MAX);
    assert_eq!(super::default_limit(0, 0), super::MIN_LIMIT);
}

/// A cache with extent files on and blocks 0..6 of a 5500-byte source in blocks of 1000.
pub(super) fn with_blocks(dir: &std::path::Path) -> (DiskCache, Arc<Stats>, ObjectKey, Vec<u8>) {
    let (cache, stats) = open(dir, 64 << 20);
    cache.enable_extents();
    let key = ObjectKey::new("extent", 1000);
    let source = bytes(9, 5500);
    for (b, chunk) in source.chunks(1000).enumerate() {
        cache.save(&key, b as u64, chunk);
    }
    (cache, stats, key, source)
}

fn read_file(mut f: std::fs::File) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut out).unwrap();
    out
}

/// The extent file of `range` of [`with_blocks`]'s source, if `cache` hands one over at once.
fn opened(cache: &DiskCache, key: &ObjectKey, range: &std::ops::Range<u64>) -> Option<std::fs::File> {
    cache.extent_opened(key, 1000, 5500, range.clone())
}

/// Tells `cache` a file of `range` of [`with_blocks`]'s source was closed.
fn closed(cache: &DiskCache, key: &ObjectKey, range: std::ops::Range<u64>) {
    cache.extent_closed(key, 1000, 5500, range);
}

/// Sets `path`'s mtime `age` in the past.
pub(super) fn age(path: &std::path::Path, age: Duration) {
    std::fs::File::options().write(true).open(path).unwrap().set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn an_extent_file_holds_exactly_its_bytes_and_is_checked_before_each_use() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats, key, source) = with_blocks(dir.path());
    let range = 1500..5200;
    // No extent file yet: served from blocks, and (every block being on disk) one is assembled.
    assert!(opened(&cache, &key, &range).is_none(), "no extent file yet");
    assert!(cache.flush(Duration::from_secs(10)));
    assert_eq!(stats.disk_cache_extents_written.load(Relaxed), 1);
    let path = extent::extent_path(dir.path(), &key, &range);
    assert_eq!(std::fs::read(&path).unwrap(), &source[1500..5200]);
    assert_eq!(read_file(opened(&cache, &key, &range).unwrap()), &source[1500..5200]);

    // The same bytes written again (a restored copy: new times): not handed over until a full
    // check (off this thread) passes and renews the record; then served from the record again.
    let record = std::fs::read(extent::meta_path(&path)).unwrap();
    std::fs::write(&path, &source[1500..5200]).unwrap();
    assert!(opened(&cache, &key, &range).is_none(), "handed over unchecked");
    assert!(cache.flush(Duration::from_secs(10)));
    assert_eq!(read_file(opened(&cache, &key, &range).unwrap()), &source[1500..5200]);
    assert_ne!(std::fs::read(extent::meta_path(&path)).unwrap(), record, "the record was not renewed");
    assert_eq!(stats.disk_cache_corrupt.load(Relaxed), 0);

    // One byte changed, its times put back: ctime still moves, the CRC catches it, the file goes.
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_at(&file, &[source[1600] ^ 1], 100).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    cache.queue().hold(true);
    assert!(opened(&cache, &key, &range).is_none());
    assert!(path.exists(), "checked on the caller's thread");
    cache.queue().hold(false);
    assert!(cache.flush(Duration::from_secs(10)));
    assert_eq!(stats.disk_cache_corrupt.load(Relaxed), 1);
    assert!(!path.exists() && !extent::meta_path(&path).exists());

    // A data file without a record is never used: a young one is being published (left alone),
    // an old one was left by a crash (removed as corrupt).
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &source[1500..5200]).unwrap();
    assert!(opened(&cache, &key, &range).is_none());
    assert!(path.exists());
    assert_eq!(stats.disk_cache_corrupt.load(Relaxed), 1);
    age(&path, extent::UNPUBLISHED_AGE + Duration::from_secs(60));
    assert!(opened(&cache, &key, &range).is_none());
    assert_eq!(stats.disk_cache_corrupt.load(Relaxed), 2);
    assert!(!path.exists());
}

/// Issue 23, item 4: two processes sharing a directory. One publishes an extent (the data file
/// renamed into place, then its record); the other opens it in between. It must take the file
/// for one being published, not remove it as corrupt, and use it once the record is there; and a
/// process that did find one corrupt assembles it again. A second process finishing the same
/// extent never replaces the first one's file.
#[test]
fn an_extent_opened_between_its_data_and_its_record_is_not_taken_for_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, _, key, source) = with_blocks(dir.path());
    let (reader, reader_stats) = open(dir.path(), 64 << 20);
    reader.enable_extents();
    let range = 0..5500;
    let path = extent::extent_path(dir.path(), &key, &range);
    // The writer publishes (data file, then record); the reader looks in between: the data file
    // in place, no record yet (the record held aside here).
    let written = extent::assemble(dir.path(), &key, 1000, 5500, &range).unwrap();
    assert!(matches!(written, extent::Assembled::Written(_)), "{written:?}");
    let record = extent::meta_path(&path);
    let aside = dir.path().join("record-aside");
    std::fs::rename(&record, &aside).unwrap();
    assert!(opened(&reader, &key, &range).is_none());
    assert!(reader.flush(Duration::from_secs(10)));
    assert!(path.exists(), "the file being published was removed");
    assert_eq!(reader_stats.disk_cache_corrupt.load(Relaxed), 0);
    std::fs::rename(&aside, &record).unwrap();
    // A second process finishing the same extent leaves the first one's file in place (a reader
    // may hold it open through passthrough) and drops its own.
    let inode = std::fs::metadata(&path).unwrap().ino();
    let again = extent::assemble(dir.path(), &key, 1000, 5500, &range).unwrap();
    assert_eq!(again, extent::Assembled::Published);
    assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode, "the published file was replaced");
    drop(writer);
    assert_eq!(read_file(opened(&reader, &key, &range).unwrap()), source);

    // A corrupt one is removed, and the process that found it assembles it again at the next close.
    std::fs::write(&path, vec![0u8; 5500]).unwrap();
    assert!(opened(&reader, &key, &range).is_none());
    assert!(reader.flush(Duration::from_secs(10)));
    assert_eq!(reader_stats.disk_cache_corrupt.load(Relaxed), 1);
    assert!(!path.exists());
    for b in 0..6 {
        assert!(reader.load(&key, b, vec![0; if b == 5 { 500 } else { 1000 }]).is_ok());
    }
    closed(&reader, &key, range.clone());
    assert!(reader.flush(Duration::from_secs(10)));
    assert_eq!(read_file(opened(&reader, &key, &range).unwrap()), source);
}

/// Issue 23, item 7: an extent whose record is stale (after a reboot, a restored copy) needs a
/// full CRC pass: never on the opening thread. The open answers at once (the tensor is served
/// from blocks) while the writer thread, held here, has not run the check.
#[test]
fn an_extent_with_a_stale_record_is_checked_off_the_opening_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats, key, source) = with_blocks(dir.path());
    let range = 0..5500;
    closed(&cache, &key, range.clone());
    assert!(cache.flush(Duration::from_secs(10)));
    let path = extent::extent_path(dir.path(), &key, &range);
    // A copy of the file in its place: another inode, the record no longer matches.
    let copy = dir.path().join("copy");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::rename(&copy, &path).unwrap();
    cache.queue().hold(true);
    for _ in 0..3 {
        assert!(opened(&cache, &key, &range).is_none(), "checked in full on the opening thread");
    }
    cache.queue().hold(false);
    assert!(cache.flush(Duration::from_secs(10)));
    assert_eq!(read_file(opened(&cache, &key, &range).unwrap()), source);
    assert_eq!(stats.disk_cache_corrupt.load(Relaxed), 0);
}

#[test]
fn an_extent_is_assembled_only_when_every_block_is_there_and_only_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, stats, key, _) = with_blocks(dir.path());
    std::fs::remove_file(block_path(dir.path(), &key, 3)).unwrap();
    closed(&cache, &key, 2500..3500);
    closed(&cache, &key, 0..900);
    assert!(cache.flush(Duration::from_secs(10)));
    assert!(!extent::extent_path(dir.path(), &key, &(2500..3500)).exists());
    assert!(extent::extent_path(dir.path(), &key, &(0..900)).exists());
    assert_eq!(stats.disk_cache_extents_written.load(Relaxed), 1);
    // A block removed after the job was queued: assembly finds it missing and leaves nothing.
    let (cache, _, key, _) = with_blocks(dir.path());
    cache.queue().hold(true);
    closed(&cache, &key, 4000..5500);
    std::fs::remove_file(block_path(dir.path(), &key, 5)).unwrap();
    cache.queue().hold(false);
    assert!(cache.flush(Duration::from_secs(10)));
    assert!(!extent::extent_path(dir.path(), &key, &(4000..5500)).exists());
    assert_eq!(evict::scan(dir.path(), false).unwrap().temps, 0);
    // Off (no passthrough): nothing is made and nothing is served.
    let (off, _) = open(dir.path(), 64 << 20);
    off.save(&key, 5, &bytes(9, 5500)[5000..]);
    closed(&off, &key, 1000..2000);
    assert!(off.flush(Duration::from_secs(10)));
    assert!(!extent::extent_path(dir.path(), &key, &(1000..2000)).exists());
    assert!(opened(&off, &key, &(0..900)).is_none());
}

#[test]
fn extent_files_are_counted_evicted_and_cleared_with_their_records() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, _, key, _) = with_blocks(dir.path());
    closed(&cache, &key, 0..5500);
    assert!(cache.flush(Duration::from_secs(10)));
    let info = super::info(dir.path()).unwrap();
    assert_eq!((info.blocks, info.extents, info.objects), (6, 1, 1));
    let path = extent::extent_path(dir.path(), &key, &(0..5500));
    let past = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().write(true).open(extent::meta_path(&path)).unwrap().set_modified(past).unwrap();
    let scan = evict::scan(dir.path(), false).unwrap();
    let extent_bytes: u64 = scan.blocks.iter().filter(|b| b.extent).map(|b| b.bytes).sum();
    assert!(extent_bytes > 5500, "{extent_bytes}: the data file and its record");
    // The least recently used go first (the extent: its record is an hour old), with its record.
    // Just over the bound: removing the oldest (the extent) is enough to reach the low-water mark.
    let bound = scan.bytes - 1;
    let done = evict::evict(scan, bound);
    assert_eq!(done.blocks, 1);
    assert!(!path.exists() && !extent::meta_path(&path).exists());
    assert!(block_path(dir.path(), &key, 5).exists());
    // clear removes everything.
    closed(&cache, &key, 100..200);
    drop(cache);
    assert_eq!(super::info(dir.path()).unwrap().extents, 1);
    super::clear(dir.path()).unwrap();
    let info = super::info(dir.path()).unwrap();
    assert_eq!((info.blocks, info.extents, info.bytes), (0, 0, 0));
}

/// Issue 23, item 8: dropping the cache (at unmount) waits a bounded time for a writer busy with
/// a long job (a multi-GB extent, a hung disk), then leaves it behind: the daemon can exit.
#[test]
fn dropping_the_cache_leaves_a_writer_busy_past_the_bound_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, _) = open(dir.path(), 64 << 20);
    let started = Arc::new(std::sync::Barrier::new(2));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (job_started, job_done) = (Arc::clone(&started), Arc::clone(&done));
    let job = super::behind::Job::Extent(Box::new(move |_| {
        job_started.wait();
        // Busy until the test lets go (after the drop is measured), 30 s at most.
        let since = std::time::Instant::now();
        while !job_done.load(Relaxed) && since.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }));
    assert!(cache.queue.push_extent(&cache.tier, job));
    started.wait();
    let start = std::time::Instant::now();
    drop(cache);
    let took = start.elapsed();
    done.store(true, Relaxed);
    let bound = super::behind::FLUSH_WAIT + super::behind::STOP_WAIT;
    assert!(took >= bound && took < bound + Duration::from_secs(2), "dropping the cache took {took:?}");
}

/// The directory's lock file is created exclusively, reused when there, and never reached through
/// a link planted at its name (the link's target is left untouched).
#[test]
fn the_lock_file_is_never_reached_through_a_planted_link() {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join(store::LOCK);
    let first = evict::lock(dir.path(), false).unwrap().expect("free lock");
    assert_eq!(std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(evict::lock(dir.path(), false).unwrap().is_none(), "held by the first");
    drop(first);
    assert!(evict::lock(dir.path(), true).unwrap().is_some());
    std::fs::remove_file(&lock).unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    assert!(evict::lock(dir.path(), true).is_err(), "a link was followed");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
}
