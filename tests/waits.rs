//! Waits derived from the limits the user set (issue 23, item 6): a reader waiting for another
//! reader's load of the same block waits as long as `--timeout` says that load may take, not a
//! fixed minute. Two tensor files share a block (the end of one, the start of the other); the
//! backing file sits on a fault-injecting FUSE mount that holds every read for 17 s (a slow
//! store). The first reader loads the block; the second waits for that load. With `--timeout 1s` its wait (8 s) ends
//! first (twice over, 16 s, where the load is a prefetch a waiter retries once) and it gets EIO
//! while the load itself succeeds; with `--timeout 10s` (a 26 s wait) both get their bytes.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use common::faultfs::FaultMount;
use common::*;
use stfs::format::Dtype;

/// How long the slow store holds the shared load.
const LOAD_TAKES: Duration = Duration::from_secs(17);

/// Two tensors of 100,000 bytes, the end of `a` and the start of `b` in the second 64 KiB block,
/// behind a fault mount in `dir`.
fn two_tensors_in_one_block(dir: &Path) -> (Vec<T>, FaultMount) {
    let (backing, fault_mp) = (dir.join("backing"), dir.join("fault"));
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&fault_mp).unwrap();
    let mut tensors = vec![T::new("a", Dtype::F32, &[25_000]), T::new("b", Dtype::F32, &[25_000])];
    for (i, t) in tensors.iter_mut().enumerate() {
        t.data = pattern(i as u64 + 1, t.data.len());
    }
    write_checkpoint(&backing.join("model.safetensors"), &tensors, None);
    (tensors, FaultMount::new(&backing, &fault_mp))
}

/// Reads `a` (which loads the shared block, held by the store for [`LOAD_TAKES`]) and, once the
/// store holds that load, `b` (which waits for it), through a mount with `--timeout timeout`.
type Read = (std::io::Result<Vec<u8>>, Duration);

/// 4 KiB of `file` at `offset`, with the kernel's readahead off for it (so one FUSE READ of
/// those pages, not of the file's start or of what follows).
fn read_4k(file: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(file)?;
    // SAFETY: advice on a descriptor we own.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut buf = vec![0; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, offset)?;
    Ok(buf)
}

fn shared_slow_load(timeout: &str) -> (Read, Read, Vec<T>) {
    let dir = workdir();
    let (tensors, fault) = two_tensors_in_one_block(dir.path());
    // Every read goes through blocks (no mapping), and one load of the shared block, by `a` (readahead stays within a file).
    let args = ["--block-size", "64K", "--no-map", "--io-threads", "1", "--threads", "4", "--timeout", timeout];
    let m = Mount::new(&fault.path.join("model.safetensors"), &args);
    fault.hang_reads.store(true, SeqCst);
    let (a, b) = std::thread::scope(|scope| {
        // Neither at a file's first byte (which would start a prefetch): the end of `a`, the
        // start of `b` past its first page, both in the second block. Each read's time counts
        // from its own start.
        let read = |name: &'static str, offset: u64| {
            let m = &m;
            move || {
                let start = std::time::Instant::now();
                (read_4k(&m.file(name), offset), start.elapsed())
            }
        };
        let a = scope.spawn(read("a", 90_112));
        // `b` only once `a`'s load is held by the store (not after a fixed pause: on a loaded
        // machine `a`'s request could reach the daemon after `b`'s, making `b` the loader).
        let held = wait_until(TIMEOUT, || fault.held_reads.load(SeqCst) == 1);
        let held_at = std::time::Instant::now();
        let b = held.then(|| scope.spawn(read("b", 8192)));
        std::thread::sleep(LOAD_TAKES.saturating_sub(held_at.elapsed()));
        fault.hang_reads.store(false, SeqCst);
        let (a, b) = (a.join().unwrap(), b.map(|b| b.join().unwrap()));
        (a, b.expect("a's load never reached the store"))
    });
    drop(m);
    drop(fault);
    (a, b, tensors)
}

#[test]
fn a_reader_waiting_on_a_shared_load_gives_up_only_after_what_timeout_allows() {
    let ((a, a_took), (b, b_took), tensors) = shared_slow_load("1s");
    assert!(a_took >= LOAD_TAKES - Duration::from_secs(1), "the store did not hold the load: {a_took:?}");
    assert_eq!(a.unwrap(), tensors[0].data[90_112..94_208], "the load itself succeeds");
    let e = b
        .map(|v| v.len())
        .expect_err("with --timeout 1s the wait (2 x 1 s + 6 s, at most twice) ends before the 17 s load");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(b_took < LOAD_TAKES, "{b_took:?}");

    let ((a, _), (b, b_took), tensors) = shared_slow_load("10s");
    assert_eq!(a.unwrap(), tensors[0].data[90_112..94_208]);
    let b = b.expect("with --timeout 10s the waiting reader gets its bytes");
    assert_eq!(b, tensors[1].data[8192..12_288]);
    assert!(b_took >= LOAD_TAKES - Duration::from_secs(1), "b did not wait for the load: {b_took:?}");
}
