//! FUSE over io_uring (`--io-uring`), mounted for real: with the fuse module's `enable_uring` on,
//! the mount runs on the ring (stats say so) and reads every byte right, under concurrent readers
//! too; with it off, the mount falls back to /dev/fuse with one debug line. SIGTERM with reads in
//! flight unmounts and the daemon exits; a killed daemon leaves a mount that detaches.
//!
//! The test (never stfs) turns the parameter on or off as root and restores it. A kernel without
//! the parameter skips these tests, except under CI=true, where it fails.

mod common;

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use common::wedge::process_gone;
use common::*;
use stfs::format::Dtype;

const PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Serialises the tests of this binary: they share the module parameter.
static SERIAL: Mutex<()> = Mutex::new(());

/// The parameter set for one test, restored on drop.
struct Parameter {
    before: String,
    _serial: MutexGuard<'static, ()>,
}

impl Parameter {
    /// Sets `enable_uring` to `on`; None (skip) where the kernel lacks it or it cannot be set,
    /// except under CI=true, where that fails the test.
    fn set(on: bool) -> Option<Parameter> {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        let before = match std::fs::read_to_string(PARAMETER) {
            Ok(v) => v.trim().to_string(),
            Err(e) if ci => panic!("{PARAMETER}: {e}: this kernel has no FUSE over io_uring (Linux 6.14+ needed)"),
            Err(e) => {
                eprintln!("skipped: {PARAMETER}: {e}");
                return None;
            }
        };
        match std::fs::write(PARAMETER, if on { "Y" } else { "N" }) {
            Ok(()) => Some(Parameter { before, _serial: serial }),
            Err(e) if ci => panic!("{PARAMETER} cannot be set ({e}): the io_uring tests need root"),
            Err(e) => {
                eprintln!("skipped: setting {PARAMETER}: {e}");
                None
            }
        }
    }
}

impl Drop for Parameter {
    fn drop(&mut self) {
        let _ = std::fs::write(PARAMETER, &self.before);
    }
}

/// A checkpoint with one 8 MiB tensor and small ones; the tensors are returned to compare.
fn checkpoint(dir: &Path) -> (std::path::PathBuf, Vec<T>) {
    let tensors = vec![
        T::new("big", Dtype::F32, &[2048, 1024]),
        T::new("odd", Dtype::BF16, &[257, 333]),
        T::new("tiny", Dtype::U8, &[5]),
        T::new("empty", Dtype::I32, &[0, 7]),
    ];
    let file = dir.join("m.safetensors");
    write_checkpoint(&file, &tensors, None);
    (file, tensors)
}

/// A counter of the mount's stats.json (`stfs stats` given [`TIMEOUT`]: a mount whose requests
/// are stranded fails the test instead of hanging it).
fn stat(mp: &Path, key: &str) -> u64 {
    let child = std::process::Command::new(STFS)
        .args(["stats", "--json", mp.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn stfs stats");
    let out = wait_output(child, TIMEOUT);
    assert!(out.status.success(), "stfs stats: {}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc[key].as_u64().unwrap_or_else(|| panic!("no {key} in {doc}"))
}

fn read_all(path: &Path) -> Vec<u8> {
    let mut data = Vec::new();
    std::fs::File::open(path).unwrap().read_to_end(&mut data).unwrap();
    data
}

#[test]
fn asked_with_the_parameter_on_the_mount_runs_on_the_ring_and_reads_every_byte() {
    let Some(_p) = Parameter::set(true) else { return };
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let m = Mount::new(&file, &["--io-uring"]);
    assert!(wait_until(TIMEOUT, || stat(&m.path, "io_uring_enabled") == 1), "the mount is not on the ring");
    for t in &tensors {
        assert!(read_all(&m.file(&t.name)) == t.data, "{}: wrong bytes on the ring", t.name);
    }
    assert!(read_all(&m.file("m.safetensors")) == std::fs::read(&file).unwrap(), "the re-served checkpoint file");
    assert!(stat(&m.path, "io_uring_requests") > 0);
    let out = stfs(&["stats", m.path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("transport     FUSE over io_uring"), "{text}");
}

#[test]
fn with_the_parameter_off_the_mount_falls_back_to_dev_fuse_with_one_debug_line() {
    let Some(_p) = Parameter::set(false) else { return };
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let log = dir.path().join("daemon.log");
    let m = Mount::with_env(&file, &["-o", "io_uring", "--log-file", log.to_str().unwrap()], &[]);
    assert!(read_all(&m.file("big")) == tensors[0].data);
    assert_eq!(stat(&m.path, "io_uring_enabled"), 0);
    assert_eq!(stat(&m.path, "io_uring_requests"), 0);
    let out = stfs(&["stats", m.path.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("transport     /dev/fuse\n"));
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("ERROR") && !text.contains("WARN"), "a fallback is no error: {text}");
}

#[test]
fn the_fallback_line_is_logged_at_debug_level_once() {
    let Some(_p) = Parameter::set(false) else { return };
    let dir = workdir();
    let (file, _) = checkpoint(dir.path());
    let log = dir.path().join("daemon.log");
    let m = Mount::with_env(
        &file,
        &["--io-uring", "--log-file", log.to_str().unwrap()],
        &[("RUST_LOG", Path::new("stfs=debug"))],
    );
    read_all(&m.file("tiny"));
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("requests go through /dev/fuse")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("DEBUG") && lines[0].contains("not offered"), "{}", lines[0]);
}

#[test]
fn concurrent_readers_on_the_ring_each_get_their_own_bytes() {
    let Some(_p) = Parameter::set(true) else { return };
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let m = Mount::new(&file, &["--io-uring", "--threads", "8"]);
    assert!(wait_until(TIMEOUT, || stat(&m.path, "io_uring_enabled") == 1));
    let want = Arc::new(tensors[0].data.clone());
    let readers: Vec<_> = (0..8u64)
        .map(|i| {
            let (path, want) = (m.file("big"), Arc::clone(&want));
            thread::spawn(move || {
                let f = std::fs::File::open(&path).unwrap();
                let mut buf = vec![0u8; 4096 * (i as usize + 1) + 17];
                for k in 0..200u64 {
                    let at = (k * 7919 + i * 104_729) * 331 % (want.len() - buf.len()) as u64;
                    f.read_exact_at(&mut buf, at).unwrap();
                    assert!(buf[..] == want[at as usize..at as usize + buf.len()], "reader {i} at {at}");
                }
            })
        })
        .collect();
    for r in readers {
        r.join().expect("a reader failed");
    }
}

/// Readers that loop over `path` until it fails (the mount went away); each returns how many
/// reads succeeded. Every read either gets its bytes or an error: none hangs (the test's bounded
/// joins would say so).
fn looping_readers(path: &Path, want: &Arc<Vec<u8>>) -> Vec<thread::JoinHandle<u64>> {
    (0..4)
        .map(|i| {
            let (path, want) = (path.to_path_buf(), Arc::clone(want));
            thread::spawn(move || {
                let mut ok = 0;
                for k in 0u64.. {
                    let Ok(f) = std::fs::File::open(&path) else { return ok };
                    let mut buf = vec![0u8; 1 << 20];
                    let at = ((k * 13 + i) % 7) << 20;
                    match f.read_exact_at(&mut buf, at) {
                        Ok(()) => assert!(buf[..] == want[at as usize..at as usize + buf.len()]),
                        Err(_) => return ok,
                    }
                    ok += 1;
                    // Fresh pages: the kernel must ask the daemon again.
                    drop(f);
                    let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
                }
                ok
            })
        })
        .collect()
}

fn join_bounded(readers: Vec<thread::JoinHandle<u64>>) -> u64 {
    let joiner = thread::spawn(move || readers.into_iter().map(|r| r.join().expect("a reader failed")).sum::<u64>());
    assert!(wait_until(TIMEOUT, || joiner.is_finished()), "a read hung after the mount went away");
    joiner.join().unwrap()
}

/// A mount on the ring with readers looping over its big tensor, and its daemon sent `signal`
/// 300 ms into their reads: (the checkpoint's directory, the mount, the daemon's pid, the readers).
fn signalled_with_reads_in_flight(
    signal: libc::c_int,
) -> (tempfile::TempDir, Mount, i32, Vec<thread::JoinHandle<u64>>) {
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let m = Mount::new(&file, &["--io-uring"]);
    assert!(wait_until(TIMEOUT, || stat(&m.path, "io_uring_enabled") == 1));
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let readers = looping_readers(&m.file("big"), &Arc::new(tensors[0].data.clone()));
    thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    (dir, m, pid, readers)
}

#[test]
fn sigterm_with_reads_in_flight_unmounts_and_the_daemon_exits() {
    let Some(_p) = Parameter::set(true) else { return };
    let (_dir, m, pid, readers) = signalled_with_reads_in_flight(libc::SIGTERM);
    assert!(wait_until(TIMEOUT, || !is_mounted(&m.path)), "SIGTERM left the mount");
    let reads = join_bounded(readers);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit on SIGTERM");
    assert!(reads > 0, "no read succeeded before the signal");
}

#[test]
fn a_killed_daemon_on_the_ring_leaves_a_mount_that_detaches() {
    let Some(_p) = Parameter::set(true) else { return };
    let (_dir, m, pid, readers) = signalled_with_reads_in_flight(libc::SIGKILL);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not die");
    join_bounded(readers);
    // The connection is gone: reads fail at once, and the mount detaches.
    assert!(std::fs::read(m.file("tiny")).is_err(), "a read of a dead mount succeeded");
    let out = stfs(&["umount", m.path.to_str().unwrap()]);
    assert!(out.status.success(), "stfs umount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&m.path));
}

/// The CPUs this test may run on (its affinity set).
fn usable_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set, filled by sched_getaffinity.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size given.
    assert_eq!(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }, 0);
    // SAFETY: CPU_ISSET reads the set within its 1,024 bits.
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// The ring's queues: one per possible CPU (`/sys/devices/system/cpu/possible`, "0-7" or "0-3,6").
fn ring_queues() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    text.trim().split([',', '-']).filter_map(|n| n.parse::<usize>().ok()).max().unwrap() + 1
}

/// Reads 128 KiB of `path` from a thread pinned to each usable CPU, its pages dropped first so
/// that the kernel asks the daemon, on that CPU's queue. Each read gets `want`'s bytes or an
/// error: (cpu, outcome), all within [`TIMEOUT`], or the test fails naming the CPU whose read hung.
fn read_on_every_cpu(path: &Path, want: &Arc<Vec<u8>>) -> Vec<(usize, std::io::Result<()>)> {
    let readers: Vec<_> = usable_cpus()
        .into_iter()
        .map(|cpu| {
            let (path, want) = (path.to_path_buf(), Arc::clone(want));
            let reader = thread::spawn(move || {
                // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within its bits (the
                // CPU came from one); sched_setaffinity reads the live set.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
                }
                let f = std::fs::File::open(&path)?;
                // SAFETY: plain fadvise on a descriptor this thread owns.
                unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
                let mut buf = vec![0u8; 128 << 10];
                let at = (cpu * buf.len() * 3) % (want.len() - buf.len());
                f.read_exact_at(&mut buf, at as u64)?;
                assert!(buf[..] == want[at..at + buf.len()], "CPU {cpu}: wrong bytes at {at}");
                Ok(())
            });
            (cpu, reader)
        })
        .collect();
    let hung = |readers: &[(usize, thread::JoinHandle<std::io::Result<()>>)]| {
        readers.iter().filter(|(_, r)| !r.is_finished()).map(|(cpu, _)| *cpu).collect::<Vec<_>>()
    };
    wait_until(TIMEOUT, || hung(&readers).is_empty());
    let stuck = hung(&readers);
    assert!(stuck.is_empty(), "reads issued on CPUs {stuck:?} were not answered within {TIMEOUT:?}");
    readers.into_iter().map(|(cpu, r)| (cpu, r.join().expect("a reader panicked"))).collect()
}

/// Whether the daemon's log at `log` has a line containing `what`.
fn logged(log: &Path, what: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains(what))
}

#[test]
fn a_failed_wait_is_tried_again_and_every_cpus_reads_are_answered() {
    let Some(_p) = Parameter::set(true) else { return };
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let log = dir.path().join("daemon.log");
    // One ring thread per queue, each of whose first wait for a request fails (a debug build's
    // test hook): the thread must wait again, not leave its CPU without an entry.
    let m = Mount::with_env(
        &file,
        &["--io-uring", "--threads", "1", "--log-file", log.to_str().unwrap()],
        &[("STFS_TEST_URING_FAULT", Path::new("all 1"))],
    );
    for q in 0..ring_queues() {
        let line = format!("queue {q}: waiting for requests failed");
        assert!(wait_until(TIMEOUT, || logged(&log, &line)), "no wait of queue {q} failed: is this a debug build?");
    }
    let before = stat(&m.path, "io_uring_requests");
    for (cpu, outcome) in read_on_every_cpu(&m.file("big"), &Arc::new(tensors[0].data.clone())) {
        outcome.unwrap_or_else(|e| panic!("a read on CPU {cpu} failed: {e}"));
    }
    assert_eq!(stat(&m.path, "io_uring_enabled"), 1, "every queue still serves");
    assert!(stat(&m.path, "io_uring_requests") > before, "the reads went by the ring");
}

#[test]
fn a_ring_thread_that_cannot_wait_ends_the_connection_and_no_read_waits_for_it() {
    let Some(_p) = Parameter::set(true) else { return };
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let log = dir.path().join("daemon.log");
    let trigger = dir.path().join("fail-now");
    // From the trigger on, every wait of the last usable CPU's ring thread fails.
    let cpu = *usable_cpus().last().unwrap();
    let fault = format!("{cpu} always {}", trigger.display());
    let m = Mount::with_env(
        &file,
        &["--io-uring", "--threads", "1", "--log-file", log.to_str().unwrap()],
        &[("STFS_TEST_URING_FAULT", Path::new(&fault))],
    );
    assert!(wait_until(TIMEOUT, || stat(&m.path, "io_uring_enabled") == 1), "the mount is not on the ring");
    let pid = daemon_pid(&m.path).expect("daemon pid");
    std::fs::write(&trigger, b"").unwrap();
    let line = format!("queue {cpu}: waiting for requests failed");
    assert!(wait_until(TIMEOUT, || logged(&log, &line)), "the waits of queue {cpu} did not fail");
    // Nothing can serve that CPU's queue now: its reads (and the others', once the connection
    // ends) get an error in bounded time instead of waiting until unmount.
    let outcomes = read_on_every_cpu(&m.file("big"), &Arc::new(tensors[0].data.clone()));
    let (_, faulty) = outcomes.iter().find(|(c, _)| *c == cpu).unwrap();
    assert!(faulty.is_err(), "a read on CPU {cpu} was answered by a queue that cannot wait");
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon kept a connection it cannot serve");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("the connection ends"), "the log does not say why the mount stopped: {text}");
    let out = stfs(&["umount", m.path.to_str().unwrap()]);
    assert!(out.status.success(), "stfs umount: {}", String::from_utf8_lossy(&out.stderr));
}

/// Reads 64 KiB of `path` at `at` with O_DIRECT (one request to the daemon, never retried by the
/// page cache) from a thread pinned to `cpu`: its outcome, or None if it was not answered within
/// [`TIMEOUT`].
fn direct_read_on(cpu: usize, path: &Path, at: u64) -> Option<std::io::Result<()>> {
    let path = path.to_path_buf();
    let reader = thread::spawn(move || {
        // SAFETY: as in `read_on_every_cpu`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
        let mut options = std::fs::OpenOptions::new();
        std::os::unix::fs::OpenOptionsExt::custom_flags(options.read(true), libc::O_DIRECT);
        let f = options.open(&path)?;
        // A page-aligned buffer of 64 KiB inside a larger one.
        let mut buf = vec![0u8; (64 << 10) + 4096];
        let skip = buf.as_ptr().align_offset(4096);
        f.read_exact_at(&mut buf[skip..skip + (64 << 10)], at)
    });
    wait_until(TIMEOUT, || reader.is_finished());
    reader.is_finished().then(|| reader.join().expect("the reader panicked"))
}

#[test]
fn a_handler_that_panics_on_the_ring_fails_its_read_with_eio_and_every_cpu_is_served_after() {
    let Some(_p) = Parameter::set(true) else { return };
    let dir = workdir();
    let (file, tensors) = checkpoint(dir.path());
    let log = dir.path().join("daemon.log");
    let trigger = dir.path().join("panic-now");
    // From the trigger on, the first read answered into a ring entry panics in its handler (a
    // debug build's test hook), once.
    let fault = format!("panic {}", trigger.display());
    let m = Mount::with_env(
        &file,
        &["--io-uring", "--threads", "1", "--log-file", log.to_str().unwrap()],
        &[("STFS_TEST_URING_FAULT", Path::new(&fault))],
    );
    assert!(wait_until(TIMEOUT, || stat(&m.path, "io_uring_enabled") == 1), "the mount is not on the ring");
    let before = stat(&m.path, "io_uring_requests");
    std::fs::write(&trigger, b"").unwrap();
    let cpu = usable_cpus()[0];
    let outcome = direct_read_on(cpu, &m.file("big"), 1 << 20)
        .unwrap_or_else(|| panic!("the read whose handler panicked on CPU {cpu} was not answered within {TIMEOUT:?}"));
    let e = outcome.expect_err("the read whose handler panicked succeeded: is this a debug build?");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // That CPU's entry, and every other, goes on serving.
    for (cpu, outcome) in read_on_every_cpu(&m.file("big"), &Arc::new(tensors[0].data.clone())) {
        outcome.unwrap_or_else(|e| panic!("a read on CPU {cpu} after the panic failed: {e}"));
    }
    assert_eq!(direct_read_on(cpu, &m.file("big"), 1 << 20).map(|r| r.is_ok()), Some(true), "CPU {cpu} again");
    assert_eq!(stat(&m.path, "io_uring_enabled"), 1, "every queue still has its entry");
    assert!(stat(&m.path, "io_uring_requests") > before, "the reads went by the ring");
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("panicked in its handler")).collect();
    assert_eq!(lines.len(), 1, "one warning for the one panic: {text}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
}
