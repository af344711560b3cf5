//! Tests of the engine through its API: every read returns the source's bytes, backing reads are
//! whole blocks and shared, prefetch coalesces and runs on all lanes, failures surface.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::test_support::{assert_whole_blocks, fake, FakeSource};
use super::tuning::{FILE_START_WINDOW_BYTES, LANES, PREFETCH_CHUNK_BYTES, REMOTE_LANES};
use super::{Engine, EngineConfig, ReadaheadConfig};
use crate::stats::Stats;
use crate::util::lock;
use crate::util::test_support::eventually;

fn engine(block_size: u64, cache_size: u64, io_threads: usize) -> (Arc<Engine>, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    let config = EngineConfig {
        block_size,
        cache_size,
        io_threads,
        map_files: true,
        source_timeout: std::time::Duration::from_secs(30),
    };
    let mut readahead = ReadaheadConfig::new(block_size, cache_size);
    // Slack scaled to the small test blocks, so that random tests look random.
    (readahead.back_slack, readahead.forward_slack) = (block_size / 2, 2 * block_size);
    (Engine::with_readahead(config, readahead, Arc::clone(&stats)), stats)
}

fn counter(c: &AtomicU64) -> u64 {
    c.load(Relaxed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn any_read_returns_the_source_bytes(
        block_size in 1u64..=65536,
        blocks in 0u64..12,
        extra in 0u64..65536,
        cache_blocks in 0u64..6,
        io_threads in 0usize..3,
        threads in 1usize..4,
        reads in prop::collection::vec((0.0f64..1.1, 0usize..200_000), 1..24),
        piece in 0u64..200_000,
    ) {
        let len = blocks * block_size + extra % block_size;
        let source = fake(len as usize, Duration::ZERO);
        source.piece.store(piece, Relaxed);
        let cache_size = cache_blocks * block_size + extra % 3;
        let (engine, stats) = engine(block_size, cache_size, io_threads);
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (engine, source, reads) = (&engine, &source, &reads);
                scope.spawn(move || {
                    for &(at, n) in reads.iter().cycle().skip(t).take(reads.len()) {
                        let offset = (at * len as f64) as u64;
                        let got = engine.read(id, offset, n).unwrap();
                        let start = (offset as usize).min(source.data.len());
                        let end = start.saturating_add(n).min(source.data.len());
                        assert_eq!(got, &source.data[start..end], "read of {n} at {offset}");
                    }
                });
            }
        });
        drop(engine);
        assert_whole_blocks(&source, block_size);
        prop_assert!(counter(&stats.peak_resident_bytes) <= cache_size);
        // A fetch is one read, or several pieces of one.
        let reads = lock(&source.reads).len() as u64;
        prop_assert!(counter(&stats.backing_reads) <= reads);
        prop_assert!(piece > 0 || counter(&stats.backing_reads) == reads);
    }
}

#[test]
fn concurrent_readers_of_one_block_share_one_backing_read() {
    let source = fake(10_000, Duration::from_millis(50));
    // No I/O threads: these nearby reads form a stream, and its prefetch is not under test.
    let (engine, stats) = engine(4096, 1 << 20, 0);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (engine, barrier) = (&engine, &barrier);
            scope.spawn(move || {
                barrier.wait();
                assert_eq!(engine.read(id, 100 + t, 10).unwrap().len(), 10);
            });
        }
    });
    assert_eq!(*lock(&source.reads), vec![(0, 4096)]);
    assert_eq!(counter(&stats.cache_misses), 1);
    assert_eq!(counter(&stats.cache_hits), 7);
}

#[test]
fn sequential_scan_prefetches_and_reads_each_block_once() {
    let bs = 4096;
    let source = fake(64 * bs as usize, Duration::ZERO);
    // Room for the whole source twice over: with no cache pressure nothing may be read twice.
    // (With the cache exactly the file's size, an on-demand load may legitimately evict a
    // prefetched block under a slow scheduler, and the test would measure that instead.)
    let (engine, stats) = engine(bs, 128 * bs, 2);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    engine.read(id, 0, 1000).unwrap();
    engine.read(id, 1000, 1000).unwrap();
    eventually("block 1 to be prefetched", || counter(&stats.prefetched_bytes) >= bs);
    let mut offset = 2000;
    while offset < source.data.len() as u64 {
        let got = engine.read(id, offset, 1000).unwrap();
        assert_eq!(got, &source.data[offset as usize..][..got.len()]);
        offset += 1000;
    }
    assert!(counter(&stats.window_bytes) > bs, "the window grew");
    assert_eq!(counter(&stats.streams), 1);
    drop(engine);
    let reads = lock(&source.reads).clone();
    assert_eq!(counter(&stats.backing_read_bytes), source.data.len() as u64, "{reads:?}");
    assert!(counter(&stats.backing_reads) <= 64);
    assert_whole_blocks(&source, bs);
    // Each block was read exactly once: sorted, the reads tile the source.
    let mut reads = lock(&source.reads).clone();
    reads.sort();
    let mut next = 0;
    for (offset, n) in reads {
        assert_eq!(offset, next, "a gap or an overlap before {offset}");
        next += n as u64;
    }
}

#[test]
fn prefetch_coalesces_neighbouring_blocks_into_chunk_reads_on_several_lanes() {
    let bs = 64 << 10;
    let chunk_blocks = PREFETCH_CHUNK_BYTES / bs;
    let source = fake((4 * PREFETCH_CHUNK_BYTES) as usize, Duration::from_millis(1));
    let mut readahead = ReadaheadConfig::new(bs, 1 << 30);
    readahead.max_window_blocks = LANES as u64 * chunk_blocks;
    let stats = Arc::new(Stats::default());
    let config = EngineConfig {
        block_size: bs,
        cache_size: 1 << 30,
        io_threads: 4,
        map_files: true,
        source_timeout: std::time::Duration::from_secs(30),
    };
    let engine = Engine::with_readahead(config, readahead, Arc::clone(&stats));
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    let mut offset = 0;
    while offset < source.data.len() as u64 {
        let got = engine.read(id, offset, 1 << 20).unwrap();
        assert_eq!(got, &source.data[offset as usize..][..got.len()]);
        offset += got.len() as u64;
        // A paced reader (as a consumer that computes between reads), so the lanes get ahead.
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(engine);
    assert_whole_blocks(&source, bs);
    let reads = lock(&source.reads).clone();
    let big = reads.iter().filter(|&&(_, n)| n as u64 >= PREFETCH_CHUNK_BYTES / 2).count();
    assert!(big >= 2, "prefetch read big runs: {reads:?} {stats:?}");
    assert!(counter(&stats.backing_reads) < 4 * chunk_blocks / 4, "{reads:?}");
}

/// The most backing reads that ran at once while one reader went through a 64 MiB source whose
/// every read takes 20 ms and then waits for more to join it until `LANES + 2` run at once (at most
/// 150 ms), with 32 I/O threads (more than any stream's lanes).
fn most_reads_at_once(remote: bool) -> usize {
    let bs = 1 << 20;
    let source = fake(64 << 20, Duration::from_millis(20));
    source.remote.store(remote, Relaxed);
    source.hold_until_in_flight.store(LANES + 2, Relaxed);
    let (engine, _stats) = engine(bs, 1 << 30, 32);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    let whole = 0..source.data.len() as u64;
    let mut offset = 0;
    while offset < whole.end {
        let got = engine.read_in(id, whole.clone(), offset, 1 << 20, <[u8]>::to_vec).unwrap();
        assert_eq!(got, &source.data[offset as usize..][..got.len()]);
        offset += got.len() as u64;
    }
    drop(engine);
    source.most_in_flight.load(Relaxed)
}

#[test]
fn a_remote_sources_stream_prefetches_on_more_lanes_than_a_local_ones() {
    // Each lane is one descriptor (a connection, for a remote source) with one read at a time,
    // and the reader's own load is one more.
    let local = most_reads_at_once(false);
    let remote = most_reads_at_once(true);
    assert!(local <= LANES + 1, "a local stream ran {local} reads at once");
    assert!(
        remote > LANES + 1 && remote <= REMOTE_LANES + 1,
        "a remote stream ran {remote} reads at once (local {local})"
    );
}

#[test]
fn a_first_read_of_a_file_fetches_its_start_on_every_lane_at_once() {
    let bs = 64 << 10;
    let source = fake(32 << 20, Duration::from_millis(30));
    let (engine, _stats) = engine(bs, 256 << 20, 8);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    let file = (1 << 20) + 100..(17 << 20) + 100;
    let got = engine.read_in(id, file.clone(), file.start, 1, <[u8]>::to_vec).unwrap();
    assert_eq!(got, &source.data[file.start as usize..][..1]);
    let window = FILE_START_WINDOW_BYTES;
    eventually("the file-start prefetch", || lock(&source.reads).iter().map(|&(_, n)| n as u64).sum::<u64>() > window);
    drop(engine);
    let reads = lock(&source.reads).clone();
    let prefetch: Vec<_> = reads.iter().filter(|&&(at, _)| at > file.start).collect();
    let share = window / LANES as u64;
    assert!(prefetch.len() >= LANES, "one read per lane: {reads:?}");
    assert!(prefetch.iter().all(|&&(_, n)| n as u64 <= share), "reads of a lane's share: {reads:?}");
    assert_whole_blocks(&source, bs);
}

#[test]
fn a_prefetched_block_is_served_while_the_rest_of_its_read_is_in_flight() {
    let bs = 4096;
    let gated = FakeSource::gated((0..64 * bs as usize).map(|i| (i % 249) as u8).collect());
    let (engine, stats) = engine(bs, 1 << 20, 1);
    let id = engine.add_source(Arc::new(Arc::clone(&gated)));
    // A read of a file's first byte (the file is blocks 2..40) prefetches blocks 3.. in one read.
    let file = 2 * bs..40 * bs;
    engine.read_in(id, file.clone(), 2 * bs, 100, <[u8]>::to_vec).unwrap();
    eventually("the first prefetched block to land", || counter(&stats.prefetched_bytes) >= bs);
    // The rest of that read is still held at the gate, yet block 3 is served from the cache.
    assert_eq!(counter(&stats.prefetched_bytes), bs);
    let misses = counter(&stats.cache_misses);
    let got = engine.read_in(id, file.clone(), 3 * bs + 10, 100, <[u8]>::to_vec).unwrap();
    assert_eq!(got, &gated.data[3 * bs as usize + 10..][..100]);
    assert_eq!(counter(&stats.cache_misses), misses, "block 3 came from the cache");
    gated.open_gate();
    eventually("the rest of the prefetch", || counter(&stats.prefetched_bytes) > bs);
}

#[test]
fn a_request_over_cold_blocks_is_one_backing_read() {
    let bs = 4096;
    let source = fake(64 * bs as usize, Duration::ZERO);
    let (engine, stats) = engine(bs, 32 * bs, 0);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    // Five blocks, the first and last partly: one whole-block read of all five.
    let (offset, len) = (3 * bs + 100, 4 * bs as usize);
    assert_eq!(engine.read(id, offset, len).unwrap(), &source.data[offset as usize..][..len]);
    assert_eq!(*lock(&source.reads), [(3 * bs, 5 * bs as usize)]);
    // With the middle block cached, the cold ones on each side are one read each.
    let (offset, len) = (20 * bs, 3 * bs as usize);
    engine.read(id, 21 * bs, 10).unwrap();
    lock(&source.reads).clear();
    assert_eq!(engine.read(id, offset, len).unwrap(), &source.data[offset as usize..][..len]);
    assert_eq!(*lock(&source.reads), [(20 * bs, bs as usize), (22 * bs, bs as usize)]);
    assert_whole_blocks(&source, bs);
    assert_eq!(counter(&stats.backing_reads), 4);
}

#[test]
fn random_reads_prefetch_nothing() {
    let bs = 4096;
    let source = fake(1000 * bs as usize, Duration::ZERO);
    let (engine, stats) = engine(bs, 64 * bs, 2);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    // Block i*389 mod 1000: within any 16 reads, no two are fewer than 57 blocks apart.
    for i in 0..100u64 {
        let offset = (i * 389 % 1000) * bs + i;
        assert_eq!(engine.read(id, offset, 100).unwrap(), &source.data[offset as usize..][..100]);
    }
    drop(engine);
    assert_eq!(counter(&stats.prefetched_bytes), 0);
    assert_eq!(counter(&stats.backing_read_bytes), 100 * bs);
}

#[test]
fn small_cache_stays_bounded_under_concurrent_scans() {
    let bs = 1024;
    let source = fake(200 * bs as usize, Duration::ZERO);
    let (engine, stats) = engine(bs, 3 * bs, 4);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let engine = &engine;
            let source = &source;
            scope.spawn(move || {
                let mut offset = t * 50 * bs;
                while offset < (t + 1) * 50 * bs {
                    let got = engine.read(id, offset, 300).unwrap();
                    assert_eq!(got, &source.data[offset as usize..][..got.len()]);
                    offset += 300;
                }
            });
        }
    });
    drop(engine);
    assert!(counter(&stats.peak_resident_bytes) <= 3 * bs);
    assert_whole_blocks(&source, bs);
}

#[test]
fn backing_error_surfaces_and_a_retry_succeeds() {
    let source = fake(10_000, Duration::ZERO);
    source.failures_left.store(1, Relaxed);
    let (engine, stats) = engine(4096, 1 << 20, 0);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    let err = engine.read(id, 5000, 10).unwrap_err();
    assert_eq!(err.offset, 4096);
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert_eq!(counter(&stats.backing_errors), 1);
    assert_eq!(engine.read(id, 5000, 10).unwrap(), &source.data[5000..5010]);
}

#[test]
fn reads_are_clipped_at_the_end() {
    let source = fake(10_000, Duration::ZERO);
    let (engine, _) = engine(4096, 1 << 20, 1);
    let id = engine.add_source(Arc::new(Arc::clone(&source)));
    assert_eq!(engine.source_len(id), 10_000);
    assert_eq!(engine.read(id, 9_990, 100).unwrap(), &source.data[9_990..]);
    assert!(engine.read(id, 10_000, 100).unwrap().is_empty());
    assert!(engine.read(id, u64::MAX, usize::MAX).unwrap().is_empty());
    assert!(engine.read(id + 1, 0, 1).is_err());
}

#[test]
fn local_file_changed_after_open_fails_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let bytes: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
    for change in ["truncate", "replace", "delete"] {
        std::fs::write(&path, &bytes).unwrap();
        let file = crate::source::LocalFile::open(&path).unwrap();
        let (engine, _) = engine(4096, 8192, 1);
        let id = engine.add_source(Arc::new(file));
        assert_eq!(engine.read(id, 0, 100).unwrap(), &bytes[..100]);
        match change {
            "truncate" => std::fs::File::options().write(true).open(&path).unwrap().set_len(1).unwrap(),
            "replace" => {
                std::fs::write(dir.path().join("new"), &bytes).unwrap();
                std::fs::rename(dir.path().join("new"), &path).unwrap();
            }
            _ => std::fs::remove_file(&path).unwrap(),
        }
        let err = engine.read(id, 30_000, 100).unwrap_err();
        assert!(err.to_string().contains("changed since mount"), "{change}: {err}");
    }
}

/// A local file of `len` patterned bytes, opened as a source (mapped: the tests' temp directory is
/// on a local filesystem).
fn local_file(len: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>, Arc<crate::source::LocalFile>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let file = Arc::new(crate::source::LocalFile::open(&path).unwrap());
    (dir, path, bytes, file)
}

/// The bytes a reply's file range holds, read with `pread` (what a splice would move).
fn file_range_bytes(b: crate::source::KernelBytes<'_>) -> Option<Vec<u8>> {
    let (fd, at) = b.file_range()?;
    let mut out = vec![0u8; b.len()];
    let file = std::fs::File::from(fd.try_clone_to_owned().unwrap());
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut out, at).unwrap();
    Some(out)
}

#[test]
fn reads_for_the_kernel_come_from_the_mapping_and_prefetch_reads_ahead() {
    use crate::source::Source;
    let (_dir, _path, bytes, file) = local_file(24 << 20);
    assert!(file.mapping().is_some(), "a file on a local filesystem is mapped");
    let (engine, stats) = engine(64 << 10, 16 << 20, 2);
    let id = engine.add_source(file);
    let len = bytes.len() as u64;
    // A reader going through the file from its first byte, as `cat` does.
    // Each reply is a slice of the mapping and the same range of the file, for a splice.
    for offset in (0..len).step_by(128 << 10) {
        let (got, spliceable) = engine
            .read_for_kernel(id, 0..len, offset, 128 << 10, |b| (b.slice().to_vec(), file_range_bytes(b)))
            .unwrap();
        let want = &bytes[offset as usize..(offset + (128 << 10)).min(len) as usize];
        assert_eq!(got, want);
        assert_eq!(spliceable.as_deref(), Some(want), "the file range at {offset}");
    }
    assert_eq!(counter(&stats.mapped_reads), len / (128 << 10));
    assert_eq!(counter(&stats.mapped_read_bytes), len);
    assert_eq!((counter(&stats.cache_misses), counter(&stats.peak_resident_bytes)), (0, 0), "no block was loaded");
    // The window ahead was read into the page cache in whole aligned 8 MiB chunks (a shorter run
    // only where the reader caught up), each byte at most once: a handful of reads for 192 small
    // requests, not one per request.
    eventually("the read-ahead ran", || counter(&stats.backing_reads) > 0);
    assert!(counter(&stats.backing_read_bytes) <= len, "{}", counter(&stats.backing_read_bytes));
    assert!(counter(&stats.backing_reads) <= 8, "{} read-aheads", counter(&stats.backing_reads));
    // Reads the user-space views make still go through blocks.
    assert_eq!(engine.read(id, 5, 10).unwrap(), &bytes[5..15]);
    assert!(counter(&stats.cache_misses) > 0);
}

#[test]
fn user_space_reads_of_a_mapped_file_read_ahead_in_whole_chunks() {
    let (_dir, _path, bytes, file) = local_file(24 << 20);
    let (engine, stats) = engine(64 << 10, 16 << 20, 2);
    let id = engine.add_source(file);
    let len = bytes.len() as u64;
    // A view reading the file in small steps: its bytes come through blocks.
    let step = 128 << 10;
    for offset in (0..len).step_by(step) {
        let got = engine.read_in(id, 0..len, offset, step, |b| b.to_vec()).unwrap();
        assert_eq!(got, &bytes[offset as usize..(offset as usize + step).min(bytes.len())]);
    }
    let reads = len / step as u64;
    assert!(counter(&stats.cache_misses) > 0, "the bytes came through blocks");
    // Its window went to the page cache in whole chunks, as a kernel reader's does, not in one
    // read-ahead per read: at most one backing read per read (its own cold blocks) and 8 more.
    eventually("the read-ahead ran", || counter(&stats.prefetched_bytes) > 0);
    assert!(counter(&stats.prefetched_bytes) <= len, "{}", counter(&stats.prefetched_bytes));
    assert!(
        counter(&stats.backing_reads) <= reads + 8,
        "{} backing reads for {reads} reads",
        counter(&stats.backing_reads)
    );
}

#[test]
fn a_changed_file_fails_reads_for_the_kernel_and_map_files_off_uses_blocks() {
    let (_dir, path, bytes, file) = local_file(1 << 20);
    let stats = Arc::new(Stats::default());
    let config = EngineConfig {
        block_size: 64 << 10,
        cache_size: 4 << 20,
        io_threads: 1,
        map_files: false,
        source_timeout: std::time::Duration::from_secs(30),
    };
    let blocks = Engine::new(config, Arc::clone(&stats));
    let on_blocks = blocks.add_source(Arc::clone(&file) as Arc<dyn crate::source::Source>);
    let (got, spliceable) = blocks
        .read_for_kernel(on_blocks, 0..1 << 20, 100, 1000, |b| (b.slice().to_vec(), file_range_bytes(b)))
        .unwrap();
    assert_eq!(got, &bytes[100..1100]);
    assert_eq!(spliceable, None, "a block is no range of the file");
    assert_eq!((counter(&stats.mapped_reads), counter(&stats.cache_misses)), (0, 1), "map_files off: blocks");

    let (engine, stats) = engine(64 << 10, 4 << 20, 1);
    let id = engine.add_source(file);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1000).unwrap();
    let err = engine.read_for_kernel(id, 0..1 << 20, 4096, 4096, |b| b.len()).unwrap_err();
    assert!(err.to_string().contains("size"), "{err}");
    assert_eq!((counter(&stats.mapped_reads), counter(&stats.backing_errors)), (0, 1));
}

/// A source whose first `.1` bytes were fetched when it was opened, as an HTTP source's are.
struct Opened(Arc<FakeSource>, usize);

impl crate::source::Source for Opened {
    fn len(&self) -> u64 {
        self.0.data.len() as u64
    }
    fn name(&self) -> &str {
        "opened"
    }
    fn open_reader(&self) -> std::io::Result<Box<dyn crate::source::SourceReader>> {
        self.0.open_reader()
    }
    fn opening_bytes(&self) -> &[u8] {
        &self.0.data[..self.1]
    }
}

#[test]
fn reads_inside_the_opening_bytes_load_no_block_and_others_whole_blocks() {
    let bs = 4096;
    let source = fake(10 * bs as usize, Duration::ZERO);
    let (engine, stats) = engine(bs, 1 << 20, 2);
    let id = engine.add_source(Arc::new(Opened(Arc::clone(&source), 6000)));
    // Inside the opening bytes, from a file's first byte too (which would prefetch its start).
    for (offset, len, extent) in [(100, 400, 100..500), (4096, 1904, 4096..6000), (0, 6000, 0..6000)] {
        let got = engine.read_in(id, extent, offset, len, <[u8]>::to_vec).unwrap();
        assert_eq!(got, source.data[offset as usize..offset as usize + len]);
    }
    // No block holding an opening byte was loaded. The stream saw the reads, so its prefetch may
    // already be reading past them (from the first block after the last one they touch): how far
    // it got by now is a race, and was this test's flake (about one run in three under load).
    let past_opening = 2 * bs;
    assert!(lock(&source.reads).iter().all(|&(at, _)| at >= past_opening), "{:?}", lock(&source.reads));
    assert_eq!((counter(&stats.opening_reads), counter(&stats.opening_read_bytes)), (3, 8304));
    // One byte past them: its block, whole, as ever (and the stream's prefetch after it).
    assert_eq!(engine.read(id, 5000, 1001).unwrap(), source.data[5000..6001]);
    assert!(lock(&source.reads).contains(&(bs, bs as usize)), "{:?}", lock(&source.reads));
    assert_eq!(counter(&stats.opening_reads), 3);
    assert_whole_blocks(&source, bs);
}

/// Descriptors of this process open on `path`.
fn descriptors_on(path: &std::path::Path) -> usize {
    let fds = std::fs::read_dir("/proc/self/fd").unwrap();
    fds.flatten().filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path)).count()
}

/// Issue 31, defect 7: a prefetch job still queued when the idle sweep closed its source opens a
/// lane descriptor after it. The source was left unmarked in the descriptor budget, so no sweep
/// ever looked at it again and an idle mount held that descriptor (or an HTTP lane's socket) for
/// its life. Here the one I/O thread is held by another source's prefetch while the sweep runs;
/// once the queued prefetch has run, a later sweep must close what it opened.
#[test]
fn a_prefetch_that_opens_a_lane_after_its_source_was_closed_as_idle_is_closed_by_a_later_sweep() {
    let bs = 4096;
    let gated = FakeSource::gated((0..64 * bs as usize).map(|i| (i % 249) as u8).collect());
    let (_dir, path, bytes, local) = local_file(64 * bs as usize);
    let stats = Arc::new(Stats::default());
    let config = EngineConfig {
        block_size: bs,
        cache_size: 1 << 20,
        io_threads: 1,
        map_files: false,
        source_timeout: Duration::from_secs(30),
    };
    let engine = Engine::with_readahead(config, ReadaheadConfig::new(bs, 1 << 20), Arc::clone(&stats));
    let (held, idle) = (engine.add_source(Arc::new(Arc::clone(&gated))), engine.add_source(local));
    // A read of a file's first byte prefetches the rest of it: the held source's prefetch takes
    // the only I/O thread and waits at the gate; the other source's queues behind it.
    let file = 2 * bs..40 * bs;
    engine.read_in(held, file.clone(), file.start, 100, <[u8]>::to_vec).unwrap();
    eventually("the held prefetch to take the I/O thread", || counter(&stats.prefetched_bytes) >= bs);
    let got = engine.read_in(idle, file.clone(), file.start, 100, <[u8]>::to_vec).unwrap();
    assert_eq!(got, &bytes[file.start as usize..][..100]);
    engine.close_idle_sources(Duration::ZERO);
    assert_eq!(descriptors_on(&path), 0, "the sweep closed the idle source's descriptors");
    // The queued prefetch runs now, on a lane descriptor of its own.
    gated.open_gate();
    eventually("the queued prefetch to open its lane", || descriptors_on(&path) > 0);
    eventually("a later sweep to close the lane's descriptor", || {
        engine.close_idle_sources(Duration::ZERO);
        descriptors_on(&path) == 0
    });
}

/// A source that says it can be mapped but is not (its mapping failed: no descriptor left, an
/// mmap refused), as a local file may be.
struct Unmappable(Arc<FakeSource>);

impl crate::source::Source for Unmappable {
    fn len(&self) -> u64 {
        self.0.data.len() as u64
    }
    fn name(&self) -> &str {
        "unmappable"
    }
    fn open_reader(&self) -> std::io::Result<Box<dyn crate::source::SourceReader>> {
        self.0.open_reader()
    }
    fn mappable(&self) -> bool {
        true
    }
}

/// A mapped source whose mapping fails is served as any block source: its stream reads ahead
/// into blocks, a read waits for the blocks its stream is loading instead of loading them again,
/// and the blocks it has passed make room for the next (drop-behind), so a file larger than the
/// cache is read once.
#[test]
fn a_source_whose_mapping_fails_is_read_once_through_blocks() {
    let (bs, request) = (64 << 10, 128 << 10);
    let len = 256 * bs as usize;
    let source = fake(len, Duration::from_millis(2));
    let (engine, stats) = engine(bs, 1 << 20, 2);
    let id = engine.add_source(Arc::new(Unmappable(Arc::clone(&source))));
    for offset in (0..len).step_by(request) {
        let got = engine.read_in(id, 0..len as u64, offset as u64, request, <[u8]>::to_vec).unwrap();
        assert_eq!(got, source.data[offset..offset + request], "at {offset}");
    }
    assert_eq!(counter(&stats.mapped_reads), 0);
    assert!(counter(&stats.prefetched_bytes) > len as u64 / 2, "its stream read ahead into blocks");
    let read: usize = lock(&source.reads).iter().map(|&(_, n)| n).sum();
    assert_eq!(read, len, "every byte loaded once: {:?}", lock(&source.reads));
    assert_whole_blocks(&source, bs);
}
