//! A backing file rewritten in place (same size) while readers stream it through a mount: every
//! byte a read returns is the pinned version's, or the read fails with EIO, never a block mixing
//! versions (nor one of the new version), with and without `--cache-dir`; and nothing of the new
//! versions reaches the disk cache. The file sits on a slow FUSE passthrough (`faultfs` with a
//! delay per read and uncached attributes) so that a write lands in the middle of stfs's reads.

mod common;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::faultfs::FaultMount;
use common::*;
use stfs::format::Dtype;

/// The tensor's length: large enough that the mount is still loading it when the writer starts.
const LEN: usize = 16 << 20;
/// Each reader's read size.
const READ: usize = 256 << 10;
/// Readers streaming the tensor at once, each from its own starting point.
const READERS: usize = 6;
/// Mounts per test, each a fresh pin and a fresh race between the readers and the first rewrite.
const ROUNDS: usize = 4;
/// The two fills the writer alternates: neither ever repeats in the pinned bytes (see [`pinned`]).
const FILLS: [u8; 2] = [0xEE, 0x11];

/// The pinned version's bytes: `i % 251` at offset `i`, so no byte repeats next to itself and a
/// byte from another offset (or another version) is seen.
fn pinned() -> Vec<u8> {
    (0..LEN).map(|i| (i % 251) as u8).collect()
}

/// What one round saw.
#[derive(Debug, Default)]
struct Seen {
    good: u64,
    eio: u64,
    /// Reads that returned bytes other than the pinned ones: (offset, first differing byte).
    wrong: Vec<(u64, usize)>,
}

/// One round: a fresh mount of `file` (on the slow passthrough, backed by `backing`), readers
/// streaming the tensor while the data region of `backing` is rewritten in place, alternating
/// [`FILLS`], several times.
fn round(file: &Path, backing: &Path, data_offset: u64, extra: &[&str]) -> Seen {
    let want = Arc::new(pinned());
    let m = Mount::new(file, extra);
    let tensor = m.file("w");
    let stop = Arc::new(AtomicBool::new(false));
    let good = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (tensor, stop, want, good) = (tensor.clone(), Arc::clone(&stop), Arc::clone(&want), Arc::clone(&good));
            std::thread::spawn(move || {
                let mut seen = Seen::default();
                let f = std::fs::File::open(&tensor).unwrap();
                let mut buf = vec![0; READ];
                let chunks = LEN / READ;
                let mut chunk = r * chunks / READERS;
                let deadline = Instant::now() + TIMEOUT;
                while !stop.load(SeqCst) && Instant::now() < deadline {
                    let at = (chunk * READ) as u64;
                    match f.read_exact_at(&mut buf, at) {
                        Ok(()) => match buf.iter().zip(&want[at as usize..]).position(|(a, b)| a != b) {
                            None => {
                                seen.good += 1;
                                good.fetch_add(1, SeqCst);
                            }
                            Some(i) => seen.wrong.push((at, i)),
                        },
                        Err(e) if e.raw_os_error() == Some(libc::EIO) => seen.eio += 1,
                        Err(e) => panic!("read at {at}: {e}"),
                    }
                    chunk = (chunk + 1) % chunks;
                }
                seen
            })
        })
        .collect();
    // The writer starts once the readers are getting bytes, so loads are in flight when it writes.
    assert!(wait_until(TIMEOUT, || good.load(SeqCst) > 0), "the readers never read");
    let writer = std::fs::OpenOptions::new().write(true).open(backing).unwrap();
    let fills = FILLS.map(|fill| vec![fill; LEN]);
    for i in 0..4 {
        writer.write_all_at(&fills[i % 2], data_offset).unwrap();
        std::thread::sleep(Duration::from_millis(25));
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, SeqCst);
    let mut all = Seen::default();
    for reader in readers {
        let seen = reader.join().unwrap();
        all.good += seen.good;
        all.eio += seen.eio;
        all.wrong.extend(seen.wrong);
    }
    drop(m);
    // Back to the pinned bytes for the next round (a new mount pins the file anew).
    writer.write_all_at(&want, data_offset).unwrap();
    all
}

/// Files under `dir` holding a run of 64 bytes of one of [`FILLS`]: a block of a version the mount
/// never pinned, stored on disk.
fn files_holding_fills(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).unwrap();
                if FILLS.iter().any(|&fill| bytes.windows(64).any(|w| w.iter().all(|&b| b == fill))) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// Bytes stored under `dir`.
fn stored_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// A directory in memory (`/dev/shm`) where there is one: the writer's rewrites then take no disk
/// time, and the readers see each one at once.
fn fast_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix("stfs-test-");
    if shm.is_dir() { builder.tempdir_in(shm) } else { builder.tempdir() }.expect("tempdir")
}

/// Writes the checkpoint (one U8 tensor `w` of the pinned bytes) into `backing_dir`, mounts the
/// slow passthrough of it, and returns (passthrough, its checkpoint, the backing file, the
/// tensor's offset in the file).
fn slow_checkpoint(work: &Path, backing_dir: &Path) -> (FaultMount, PathBuf, PathBuf, u64) {
    let backing = backing_dir.join("model.safetensors");
    let tensor = T { name: "w".into(), dtype: Dtype::U8, shape: vec![LEN as u64], data: pinned() };
    let bytes = write_checkpoint(&backing, &[tensor], None);
    let data_offset = (bytes.len() - LEN) as u64;
    let slow_dir = work.join("slow");
    std::fs::create_dir(&slow_dir).unwrap();
    let slow = FaultMount::uncached(backing_dir, &slow_dir);
    // Each read of the passthrough waits first: a 1 MiB read of stfs takes tens of milliseconds,
    // so the writer's rewrites land in the middle of them.
    slow.read_delay_us.store(25_000, SeqCst);
    let file = slow_dir.join("model.safetensors");
    (slow, file, backing, data_offset)
}

fn assert_never_mixed(rounds: Vec<Seen>) {
    let (good, eio): (u64, u64) = rounds.iter().fold((0, 0), |(g, e), s| (g + s.good, e + s.eio));
    let wrong: Vec<&(u64, usize)> = rounds.iter().flat_map(|s| &s.wrong).collect();
    assert!(
        wrong.is_empty(),
        "{} reads returned bytes of another version (offset, first bad byte): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(good > 0 && eio > 0, "the rounds were not a test: {good} good reads, {eio} EIO");
}

#[test]
fn a_file_rewritten_in_place_during_reads_gives_the_pinned_bytes_or_eio_never_a_mix() {
    if not_root("mounting FUSE") {
        return;
    }
    let work = workdir();
    let backing_dir = fast_dir();
    let (_slow, file, backing, data_offset) = slow_checkpoint(work.path(), backing_dir.path());
    let rounds = (0..ROUNDS).map(|_| round(&file, &backing, data_offset, &[])).collect();
    assert_never_mixed(rounds);
}

#[test]
fn with_a_disk_cache_a_file_rewritten_in_place_never_leaves_a_mixed_block_on_disk() {
    if not_root("mounting FUSE") {
        return;
    }
    let work = workdir();
    let backing_dir = fast_dir();
    let (_slow, file, backing, data_offset) = slow_checkpoint(work.path(), backing_dir.path());
    let cache = work.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    let args = ["--cache-dir", cache.to_str().unwrap()];
    let rounds = (0..ROUNDS).map(|_| round(&file, &backing, data_offset, &args)).collect();
    assert_never_mixed(rounds);
    // What the mounts stored before the first rewrite is on disk, and nothing of the new versions.
    assert!(stored_bytes(&cache) > (1 << 20), "the disk cache stored nothing");
    let bad = files_holding_fills(&cache);
    assert!(bad.is_empty(), "blocks of a version never pinned were stored: {bad:?}");
}
