//! Faults while mounted: the backing file changed or failing below us, unmount with open readers,
//! and mount points that are not empty.

mod common;

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::faultfs::FaultMount;
use common::*;
use stfs::format::Dtype;

/// Block size and cache used here: small, so each tensor spans several blocks.
const MOUNT_OPTS: [&str; 4] = ["--block-size", "64K", "--cache-size", "512K"];

/// A checkpoint with a small tensor read before the fault and a large one (4 MiB) whose tail no
/// readahead (ours: window bounded by the 512 KiB cache; the kernel's: 1 MiB) can have reached.
fn fixture(dir: &Path) -> (PathBuf, Vec<T>) {
    let file = dir.join("model.safetensors");
    let tensors = vec![
        T::new("first", Dtype::F32, &[64 << 10]),
        T::new("big", Dtype::U8, &[4 << 20]),
        T::new("last", Dtype::U8, &[100_000]),
    ];
    write_checkpoint(&file, &tensors, None);
    (file, tensors)
}

fn mount_logged(file: &Path, log: &Path) -> Mount {
    let mut args = MOUNT_OPTS.to_vec();
    args.extend(["--log-file", log.to_str().unwrap()]);
    Mount::new(file, &args)
}

fn errno_of(r: std::io::Result<usize>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Reads `len` bytes at `offset` of a served tensor in one call.
fn read_at(m: &Mount, name: &str, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(m.file(name))?;
    let mut buf = vec![0; len];
    let n = f.read_at(&mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

/// After the backing file changed: data never read fails with EIO, anything that does succeed is
/// the bytes pinned at mount time, the log names the change, and the daemon keeps serving what it
/// holds in memory and unmounts cleanly.
fn check_change_is_refused(change: impl FnOnce(&Path), what: &str) {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let log = dir.path().join("stfs.log");
    let m = mount_logged(&file, &log);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    assert_eq!(std::fs::read(m.file("first")).unwrap(), tensors[0].data);
    change(&file);

    let big = &tensors[1].data;
    let tail = big.len() as u64 - 64 * 1024;
    let err = read_at(&m, "big", tail, 4096).map(|v| v.len());
    assert_eq!(errno_of(err), Some(libc::EIO), "{what}: unread data must fail with EIO");
    let err = read_at(&m, "last", 0, 100).map(|v| v.len());
    assert_eq!(errno_of(err), Some(libc::EIO), "{what}: an unread tensor must fail with EIO");
    // Anything else either fails or is exactly what was there at mount time (from a cache).
    for t in &tensors {
        match std::fs::read(m.file(&t.name)) {
            Ok(bytes) => assert_eq!(bytes, t.data, "{what}: {} served changed bytes", t.name),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {}: {e}", t.name),
        }
    }
    // The daemon is up: namespace, metadata.json and stats are served from memory.
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "{what}: daemon died");
    assert!(std::fs::read_to_string(m.file("metadata.json")).unwrap().contains("\"big\""));
    let stats: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file(".stfs/stats.json")).unwrap()).unwrap();
    assert!(stats["backing_errors"].as_u64().unwrap() >= 1, "{what}: {stats}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("backing file changed since mount"), "{what}: log lacks the change: {text}");
    assert!(text.contains(file.to_str().unwrap()), "{what}: log does not name the file: {text}");
    assert!(!text.contains("panicked"), "{text}");

    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(TIMEOUT, || !Path::new(&format!("/proc/{pid}")).exists()), "{what}: daemon did not exit");
}

#[test]
fn truncated_backing_file_gives_eio() {
    check_change_is_refused(
        |f| std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(1000).unwrap(),
        "truncate",
    );
}

#[test]
fn backing_file_rewritten_in_place_gives_eio() {
    check_change_is_refused(
        |f| {
            // Same size, new bytes everywhere: only the modification time betrays it.
            let len = std::fs::metadata(f).unwrap().len();
            let handle = std::fs::OpenOptions::new().write(true).open(f).unwrap();
            handle.write_all_at(&pattern(99, 1 << 20), len - (1 << 20)).unwrap();
            handle.write_all_at(&pattern(98, 1 << 20), len / 2).unwrap();
        },
        "rewrite",
    );
}

#[test]
fn backing_file_replaced_by_rename_gives_eio() {
    check_change_is_refused(
        |f| {
            let new = f.with_extension("new");
            let mut bytes = std::fs::read(f).unwrap();
            let len = bytes.len();
            bytes[len / 2..].copy_from_slice(&pattern(97, len - len / 2));
            std::fs::write(&new, bytes).unwrap();
            std::fs::rename(&new, f).unwrap();
        },
        "rename over",
    );
}

#[test]
fn deleted_backing_file_gives_eio() {
    check_change_is_refused(|f| std::fs::remove_file(f).unwrap(), "delete");
}

/// Issue 31, defect 3: a FIFO put at the checkpoint's path after mounting, before any read. A
/// read's lazy reopen of the file was a blocking open: the FUSE thread waited in it for a writer
/// and a second reader sat in D state. Now each read fails with EIO at once (section 4's
/// promise), and the daemon answers on and unmounts. A read still blocked after 10 s is freed (the
/// FIFO opened for writing) before the test fails.
#[test]
fn a_fifo_put_at_the_checkpoints_path_after_mounting_gives_eio_without_blocking() {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let log = dir.path().join("stfs.log");
    let m = mount_logged(&file, &log);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    std::fs::rename(&file, file.with_extension("old")).unwrap();
    let c_path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    for t in &tensors {
        let (done, answer) = std::sync::mpsc::channel();
        let path = m.file(&t.name);
        std::thread::spawn(move || done.send(std::fs::read(path).map(|b| b.len()).map_err(|e| e.raw_os_error())));
        let read = answer.recv_timeout(Duration::from_secs(10));
        if read.is_err() {
            // Frees the daemon's open (it has the FIFO's read end) so the test ends.
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&file);
            let _ = answer.recv_timeout(Duration::from_secs(10));
        }
        assert_eq!(read, Ok(Err(Some(libc::EIO))), "{}: a read must fail with EIO at once", t.name);
    }
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "daemon died");
    assert!(std::fs::read_to_string(m.file("metadata.json")).unwrap().contains("\"big\""));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("not a regular file"), "the log does not say why: {text}");
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn umount_with_open_readers_is_busy_and_lazy_detaches() {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let m = Mount::new(&file, &MOUNT_OPTS);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let open = std::fs::File::open(m.file("big")).unwrap();

    let out = stfs(&["umount", m.path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("busy") && err.contains("--lazy"), "{err}");
    assert!(is_mounted(&m.path));

    let out = stfs(&["umount", "--lazy", m.path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&m.path), "lazy unmount left the mount visible");
    // The open reader keeps working on the detached mount, and keeps the daemon alive...
    let mut buf = vec![0; 100_000];
    let n = open.read_at(&mut buf, 1_000_000).unwrap();
    assert_eq!(&buf[..n], &tensors[1].data[1_000_000..1_000_000 + n]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "daemon exited under an open reader");
    // ...until it closes.
    drop(open);
    assert!(wait_until(TIMEOUT, || !Path::new(&format!("/proc/{pid}")).exists()), "daemon outlived its last reader");
}

#[test]
fn non_empty_mount_point_is_accepted_and_restored() {
    // As with FUSE 3 tools (fusermount3 dropped `nonempty`), existing files are hidden, not refused.
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let mp = dir.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    std::fs::write(mp.join("hidden.txt"), b"underneath").unwrap();
    let out = stfs(&["mount", file.to_str().unwrap(), mp.to_str().unwrap()]);
    let _cleanup = Unmount(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!mp.join("hidden.txt").exists(), "the mount must hide what is underneath");
    assert_eq!(std::fs::read(mp.join("last")).unwrap(), tensors[2].data);
    let out = unmount_retrying(|| stfs(&["umount", mp.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mp.join("hidden.txt")).unwrap(), b"underneath");
}

/// Unmounts a path on drop (for mounts made without [`Mount`]).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

/// The fixture written under `dir/backing`, served through a fault-injecting mount on `dir/fault`.
fn fixture_behind_fault_mount(dir: &Path) -> (Vec<T>, FaultMount) {
    let (backing, fault_mp) = (dir.join("backing"), dir.join("fault"));
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&fault_mp).unwrap();
    let (_, tensors) = fixture(&backing);
    (tensors, FaultMount::new(&backing, &fault_mp))
}

#[test]
fn backing_eio_surfaces_as_eio_and_a_retry_succeeds() {
    let dir = workdir();
    let (tensors, fault) = fixture_behind_fault_mount(dir.path());
    let log = dir.path().join("stfs.log");
    let m = mount_logged(&fault.path.join("model.safetensors"), &log);
    assert_eq!(std::fs::read(m.file("first")).unwrap(), tensors[0].data);

    fault.fail_reads.store(true, std::sync::atomic::Ordering::SeqCst);
    let big = &tensors[1].data;
    let offset = big.len() as u64 - 200_000;
    let first = read_at(&m, "big", offset, 100_000).map(|v| v.len());
    assert_eq!(errno_of(first), Some(libc::EIO), "a backing EIO must reach the reader");
    assert_eq!(errno_of(read_at(&m, "last", 0, 10).map(|v| v.len())), Some(libc::EIO));
    assert!(fault.failed_reads.load(std::sync::atomic::Ordering::SeqCst) > 0, "the fault layer was never asked");
    fault.fail_reads.store(false, std::sync::atomic::Ordering::SeqCst);

    // The failure was not cached: the same reads now succeed with the right bytes.
    assert_eq!(read_at(&m, "big", offset, 100_000).unwrap(), &big[offset as usize..offset as usize + 100_000]);
    assert_eq!(std::fs::read(m.file("last")).unwrap(), tensors[2].data);
    assert_eq!(std::fs::read(m.file("big")).unwrap(), *big);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("backing read of block") && text.contains("Input/output error"), "log lacks the EIO: {text}");
    drop(m);
    drop(fault);
}

/// The mtime can be set back by anyone who can write the file (`touch -r`, `cp -p`, rsync); the
/// change time cannot, and it is part of the pin (src/source.rs), so such a rewrite is caught.
#[test]
fn rewrite_that_restores_the_mtime_gives_eio() {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let m = Mount::new(&file, &MOUNT_OPTS);
    let before = std::fs::metadata(&file).unwrap().modified().unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    let handle = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    handle.write_all_at(&pattern(96, 100_000), len - 100_000).unwrap();
    handle.set_modified(before).unwrap();
    drop(handle);
    match read_at(&m, "last", 0, 100_000) {
        Ok(bytes) => assert_eq!(bytes, tensors[2].data, "served bytes written after the mount"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
    }
}

#[test]
fn a_hung_backing_store_blocks_only_the_reads_that_need_it() {
    let dir = workdir();
    let (tensors, fault) = fixture_behind_fault_mount(dir.path());
    let mut args = MOUNT_OPTS.to_vec();
    args.extend(["--threads", "4"]);
    let m = Mount::new(&fault.path.join("model.safetensors"), &args);
    assert_eq!(std::fs::read(m.file("first")).unwrap(), tensors[0].data);

    fault.hang_reads.store(true, std::sync::atomic::Ordering::SeqCst);
    let stuck = {
        let path = m.file("last");
        std::thread::spawn(move || std::fs::read(path))
    };
    // While that read hangs below us, the namespace, metadata.json, stats and cached data answer.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!stuck.is_finished(), "the read should be held by the hung store");
    let quick = std::thread::spawn({
        let (root, first) = (m.path.clone(), m.file("first"));
        move || {
            let names = std::fs::read_dir(&root).unwrap().count();
            let meta = std::fs::read(root.join("metadata.json")).unwrap().len();
            let stats = std::fs::read(root.join(".stfs/stats.json")).unwrap().len();
            let first = std::fs::read(first).unwrap();
            (names, meta, stats, first)
        }
    });
    assert!(wait_until(Duration::from_secs(10), || quick.is_finished()), "a hung store blocked the whole mount");
    let (names, meta, stats, first) = quick.join().unwrap();
    assert!(names == tensors.len() + 3 && meta > 0 && stats > 0, "every tensor, metadata.json, .stfs, the checkpoint");
    assert_eq!(first, tensors[0].data, "cached data is still served");
    // Once the store answers again, the held read completes with the right bytes.
    fault.hang_reads.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(wait_until(TIMEOUT, || stuck.is_finished()), "the held read never completed");
    assert_eq!(stuck.join().unwrap().unwrap(), tensors[2].data);
}
