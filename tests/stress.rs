//! Concurrency stress on a real mount: many processes reading random ranges and faulting mmapped
//! pages, every byte checked, the cache bound polled throughout, and a burst of page faults on a
//! tensor larger than the cache with few FUSE threads (the queue-full deadlock hazard).
//!
//! Worker processes are this test binary re-run with `--ignored --exact stress_worker` and the
//! job in `STFS_STRESS_WORKER`; the worker test does nothing when that variable is unset.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::*;
use stfs::format::Dtype;

const BLOCK: u64 = 64 << 10;
const CACHE: u64 = 512 << 10;

/// How long the random readers run (STFS_STRESS_SECS, default 10 s).
fn stress_secs() -> u64 {
    std::env::var("STFS_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
}

/// The checkpoint: about 9 MiB over tensors of many sizes and dtypes, so ranges cross blocks,
/// tensor edges and the end of the file, and the whole is 18 times the cache.
fn tensors() -> Vec<T> {
    vec![
        T::new("huge", Dtype::F32, &[1 << 20]),
        T::new("wide", Dtype::BF16, &[1000, 1537]),
        T::new("odd", Dtype::U8, &[65_537]),
        T::new("tiny", Dtype::I8, &[3]),
        T::new("mid", Dtype::F16, &[300_001]),
        T::new("scalar", Dtype::F64, &[]),
        T::new("tail", Dtype::I32, &[123_457]),
    ]
}

fn mount_stress(dir: &Path, threads: &str, extra: &[&str]) -> Mount {
    let file = dir.join("model.safetensors");
    write_checkpoint(&file, &tensors(), None);
    let mut args = vec!["--block-size", "64K", "--cache-size", "512K", "--threads", threads];
    args.extend_from_slice(extra);
    Mount::new(&file, &args)
}

/// A small deterministic generator for offsets (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Reads the live counters and checks the cache bound; returns resident and peak.
fn check_cache_bound(m: &Path) -> (u64, u64) {
    let text = std::fs::read(m.join(".stfs/stats.json")).expect("stats.json");
    let doc: serde_json::Value = serde_json::from_slice(&text).expect("stats.json is JSON");
    let resident = doc["resident_bytes"].as_u64().expect("resident_bytes");
    let peak = doc["peak_resident_bytes"].as_u64().expect("peak_resident_bytes");
    assert!(resident <= CACHE && peak <= CACHE, "cache bound broken: resident {resident}, peak {peak}, cache {CACHE}");
    (resident, peak)
}

/// One worker process: `pread` (buffered), `direct` (O_DIRECT) or `mmap` mode, over every tensor, until the deadline.
#[test]
#[ignore = "run by stress_many_processes as a child process"]
fn stress_worker() {
    let Ok(job) = std::env::var("STFS_STRESS_WORKER") else { return };
    let mut parts = job.split(',');
    let (mode, mp, seed, secs) =
        (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let mut rng = Rng(seed.parse::<u64>().unwrap() | 1);
    let tensors = tensors();
    let deadline = Instant::now() + Duration::from_secs(secs.parse().unwrap());
    let (mut checked, mut rounds) = (0u64, 0u64);
    // At least a few rounds, however slow the machine, so that every worker really reads.
    while rounds < 4 || Instant::now() < deadline {
        rounds += 1;
        let t = &tensors[rng.below(tensors.len() as u64) as usize];
        let path = Path::new(mp).join(&t.name);
        let len = t.data.len() as u64;
        if mode == "mmap" && len > 0 {
            checked += fault_pages(&path, &t.data, &mut rng, 64);
        } else {
            let mut options = std::fs::OpenOptions::new();
            options.read(true);
            if mode == "direct" {
                // O_DIRECT sends every read to the daemon, past the kernel page cache.
                std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_DIRECT);
            }
            let f = options.open(&path).unwrap_or_else(|e| panic!("open {}: {e}", t.name));
            if mode == "pread" {
                // Drop this file's cached pages so buffered reads reach the daemon too.
                // SAFETY: fadvise on a descriptor we own; it has no memory effects.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
            for _ in 0..16 {
                // Sizes from 1 byte to 3 blocks, sometimes running past the end.
                let offset = rng.below(len + 10);
                let size = 1 + rng.below(3 * BLOCK) as usize;
                let mut buf = vec![0; size];
                let n =
                    f.read_at(&mut buf, offset).unwrap_or_else(|e| panic!("read {} at {offset}+{size}: {e}", t.name));
                let lo = (offset as usize).min(t.data.len());
                let hi = (offset as usize + size).min(t.data.len());
                assert_eq!(&buf[..n], &t.data[lo..hi], "{} at {offset}+{size}", t.name);
                checked += n as u64;
            }
        }
    }
    assert!(checked > 0, "worker checked nothing in {rounds} rounds");
    println!("worker {mode} checked {checked} bytes in {rounds} rounds");
}

/// Maps `path` and touches `touches` pages in random order, comparing each with `expected`.
fn fault_pages(path: &Path, expected: &[u8], rng: &mut Rng, touches: usize) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let len = expected.len();
    // SAFETY: a read-only private mapping of a file kept open while the mapping lives.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0) };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap {}: {}", path.display(), std::io::Error::last_os_error());
    // SAFETY: the mapping is `len` readable bytes until munmap below.
    let mapped = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    let pages = len.div_ceil(4096) as u64;
    let mut checked = 0;
    for _ in 0..touches {
        let start = rng.below(pages) as usize * 4096;
        let end = (start + 4096).min(len);
        assert_eq!(&mapped[start..end], &expected[start..end], "{} page at {start}", path.display());
        checked += (end - start) as u64;
    }
    // SAFETY: unmapping the mapping made above; `mapped` is not used after this.
    unsafe { libc::munmap(ptr, len) };
    checked
}

/// The block path (`--no-map`): the cache's bound holds and eviction runs under concurrent readers.
#[test]
fn stress_many_processes() {
    let stats = stress_many_processes_with(&["--no-map"]);
    assert!(stats["evictions"].as_u64().unwrap() > 0, "eviction never ran: {stats}");
}

/// The mapped path (a local file's default): raw reads are replies from the file's mapping.
#[test]
fn stress_many_processes_mapped() {
    let stats = stress_many_processes_with(&[]);
    assert!(stats["mapped_reads"].as_u64().unwrap() > 0, "{stats}");
}

/// Ten processes on one mount (options `extra`) for the stress time; the daemon's counters after.
fn stress_many_processes_with(extra: &[&str]) -> serde_json::Value {
    let dir = workdir();
    let m = mount_stress(dir.path(), "8", extra);
    let secs = stress_secs();
    let exe = std::env::current_exe().unwrap();
    // Eight processes reading ranges (half with O_DIRECT) and two faulting mmapped pages.
    let jobs: Vec<String> = (0..10)
        .map(|i| {
            format!(
                "{},{},{},{secs}",
                if i >= 8 { "mmap" } else { ["pread", "direct"][i % 2] },
                m.path.display(),
                1000 + i
            )
        })
        .collect();
    let mut children: Vec<_> = jobs
        .iter()
        .map(|job| {
            Command::new(&exe)
                .args(["--ignored", "--exact", "stress_worker", "--nocapture", "--test-threads=1"])
                .env("STFS_STRESS_WORKER", job)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    // Poll the cache bound while they run; every child must finish within its time plus a margin.
    let deadline = Instant::now() + Duration::from_secs(secs) + TIMEOUT;
    let mut polls = 0;
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            panic!("stress workers hung past {secs} s + {TIMEOUT:?}");
        }
        check_cache_bound(&m.path);
        polls += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    for (child, job) in children.into_iter().zip(&jobs) {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "worker {job} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let summary = stdout.lines().find(|l| l.contains(" checked "));
        eprintln!("{}", summary.unwrap_or_else(|| panic!("worker {job} did not run its job:\n{stdout}")));
    }
    let (_, peak) = check_cache_bound(&m.path);
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.path.join(".stfs/stats.json")).unwrap()).unwrap();
    // Every poll saw the bound hold; the block path reached it (the mapped path loads no block).
    assert!(polls > 0 && (peak > 0 || stats["mapped_reads"].as_u64().unwrap() > 0));
    eprintln!("daemon counters after the run: {stats}");
    assert_eq!(stats["read_errors"].as_u64().unwrap_or(0), 0, "{stats}");
    assert_eq!(stats["backing_errors"].as_u64().unwrap(), 0, "{stats}");
    stats
}

/// The block path (`--no-map`): 32 threads fault a tensor 24 times the cache with 2 FUSE threads.
#[test]
fn page_fault_burst_with_few_fuse_threads_does_not_deadlock() {
    let stats = page_fault_burst(&["--no-map"]);
    assert!(stats["cache_misses"].as_u64().unwrap() > 0, "the faults never reached the block cache: {stats}");
}

/// The mapped path (a local file's default): the same burst, replies from the file's mapping.
#[test]
fn page_fault_burst_mapped_does_not_deadlock() {
    let stats = page_fault_burst(&[]);
    assert!(stats["mapped_reads"].as_u64().unwrap() > 0, "the faults never reached the mapping: {stats}");
}

/// The pages `fault_pages` touches from seed `seed` (the same draws, in the same order).
fn touched_pages(seed: u64, pages: u64, touches: usize) -> impl Iterator<Item = u64> {
    let mut rng = Rng(seed);
    (0..touches).map(move |_| rng.below(pages))
}

/// 32 threads each drop the tensor's cached pages and fault 256 random pages of it, with the
/// daemon on 2 FUSE threads; a deadlock shows as threads that never finish. Returns the counters.
fn page_fault_burst(extra: &[&str]) -> serde_json::Value {
    const THREADS: u64 = 32;
    const TOUCHES: usize = 256;
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = [T::new("huge", Dtype::U8, &[12 << 20])];
    write_checkpoint(&file, &tensors, None);
    let mut args = vec!["--block-size", "64K", "--cache-size", "512K", "--threads", "2"];
    args.extend_from_slice(extra);
    let m = Mount::new(&file, &args);
    let huge = &tensors[0];
    assert!(huge.data.len() as u64 > 16 * CACHE);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let (m, huge, done, failed) = (&m, huge, &done, &failed);
        let path = m.file(&huge.name);
        for k in 0..THREADS {
            let (path, tx) = (path.clone(), tx.clone());
            s.spawn(move || {
                let result = std::panic::catch_unwind(|| {
                    let mut rng = Rng(0xC0FFEE + k);
                    // Drop cached pages first, so these faults really queue up on the daemon.
                    let f = std::fs::File::open(&path).unwrap();
                    // SAFETY: fadvise on a descriptor we own; it has no memory effects.
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                    fault_pages(&path, &huge.data, &mut rng, TOUCHES)
                });
                failed.fetch_or(result.is_err(), Relaxed);
                done.fetch_add(1, Relaxed);
                let _ = tx.send(());
            });
        }
        drop(tx);
        // Watch the whole burst with one deadline; a deadlock shows as threads that never finish.
        let deadline = Instant::now() + TIMEOUT;
        while done.load(Relaxed) < THREADS {
            check_cache_bound(&m.path);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Stuck faulting threads cannot be joined, so the scope could never end: report,
                // detach the mount, and exit (a fatal exit also ends the faults waiting on FUSE).
                eprintln!("page-fault burst deadlocked: {} of {THREADS} threads finished", done.load(Relaxed));
                force_unmount(&m.path);
                std::process::exit(101);
            }
            let _ = rx.recv_timeout(left.min(Duration::from_millis(50)));
        }
    });
    assert!(!failed.load(Relaxed), "a faulting thread saw wrong bytes (see its panic above)");
    check_cache_bound(&m.path);
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.path.join(".stfs/stats.json")).unwrap()).unwrap();
    eprintln!("daemon counters after the burst: {stats}");
    // The mount's page cache starts empty and only the daemon fills it, so every page touched was
    // served by the daemon at least once, however the kernel grouped the faults into requests.
    let pages = (huge.data.len() as u64).div_ceil(4096);
    let touched: std::collections::HashSet<u64> =
        (0..THREADS).flat_map(|k| touched_pages(0xC0FFEE + k, pages, TOUCHES)).collect();
    let served = stats["fuse_read_bytes"].as_u64().unwrap();
    assert!(served >= touched.len() as u64 * 4096, "{} pages touched, {served} bytes served: {stats}", touched.len());
    stats
}
