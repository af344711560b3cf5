//! The checkpoint re-served: every shard file and the index in the mount root, byte for byte,
//! read through the engine; a tensor under one of their names is escaped; an option hides them.

mod common;
#[path = "common/nginx.rs"]
mod nginx;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use common::*;
use stfs::format::Dtype;

/// sha256 of a file by `sha256sum`, when the tool is there.
fn sha256(path: &Path) -> Option<String> {
    let out = std::process::Command::new("sha256sum").arg(path).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.split(' ').next()?.to_string())
}

/// The whole file read back in odd-sized reads from odd offsets, and whole.
fn assert_same_file(served: &Path, source: &Path) {
    let want = std::fs::read(source).unwrap();
    assert_eq!(std::fs::metadata(served).unwrap().len(), want.len() as u64, "{}", served.display());
    assert!(std::fs::read(served).unwrap() == want, "{} differs from {}", served.display(), source.display());
    let mut f = std::fs::File::open(served).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0; 4099];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == want, "{} differs in small reads", served.display());
    match (sha256(served), sha256(source)) {
        (Some(a), Some(b)) => assert_eq!(a, b),
        _ => tool_missing("sha256sum", "apt-get install coreutils"),
    }
}

fn doc(m: &Mount) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap()
}

#[test]
fn a_single_file_is_served_whole_and_a_colliding_tensor_is_escaped() {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let mut tensors = mixed_tensors();
    tensors.push(T::new("model.safetensors", Dtype::U8, &[77]));
    tensors.push(T::new("big", Dtype::F32, &[300_000]));
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_checkpoint(&file, &tensors, Some(&meta));
    // Without passthrough (as root the kernel would read the file itself), so the engine serves it.
    let m = Mount::new(&file, &["--block-size", "64K", "--cache-size", "1M", "--no-passthrough"]);
    // A tensor file first, so the whole file shares its cached blocks.
    assert_eq!(std::fs::read(m.file("big")).unwrap(), tensors.last().unwrap().data);
    assert_same_file(&m.file("model.safetensors"), &file);
    assert_eq!(std::fs::read(m.file("%6Dodel.safetensors")).unwrap(), tensors[tensors.len() - 2].data);
    let doc = doc(&m);
    assert_eq!(doc["tensors"]["model.safetensors"]["path"], "%6Dodel.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    assert_eq!(doc["checkpoint_files"], serde_json::json!([{"path": "model.safetensors", "size": len, "shard": 0}]));
    assert!(doc["files"].get("model.safetensors").is_none(), "files maps tensor files only");
    // Read through the engine: its counters saw the reads (from blocks, or from the file's mapping).
    let stats: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file(".stfs/stats.json")).unwrap()).unwrap();
    let counted = |k: &str| stats[k].as_u64().unwrap_or(0);
    assert!(counted("backing_read_bytes") + counted("mapped_read_bytes") >= len, "{stats}");
}

#[test]
fn every_shard_and_the_index_are_served() {
    let dir = workdir();
    let a = vec![T::new("model.a", Dtype::F32, &[100, 30]), T::new("model.b", Dtype::BF16, &[7, 9])];
    let b = vec![T::new("model.c", Dtype::I64, &[33]), T::new("lm_head", Dtype::F16, &[40, 3])];
    let shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    write_checkpoint(&dir.path().join(shards[0]), &a, None);
    write_checkpoint(&dir.path().join(shards[1]), &b, None);
    let index = serde_json::json!({
        "metadata": {"total_size": 1},
        "weight_map": {"model.a": shards[0], "model.b": shards[0], "model.c": shards[1], "lm_head": shards[1]}
    });
    let index_name = "model.safetensors.index.json";
    std::fs::write(dir.path().join(index_name), serde_json::to_string_pretty(&index).unwrap()).unwrap();
    for source in [dir.path().join(index_name), dir.path().to_path_buf()] {
        let m = Mount::new(&source, &[]);
        for name in shards.iter().chain([&index_name]) {
            assert_same_file(&m.file(name), &dir.path().join(name));
        }
        let files = doc(&m)["checkpoint_files"].clone();
        let paths: Vec<&str> = files.as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(paths, [shards[0], shards[1], index_name], "{}", source.display());
        assert_eq!(files[1]["shard"], 1);
        assert!(files[2].get("shard").is_none());
    }
}

#[test]
fn the_option_hides_them_and_frees_their_names() {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = vec![T::new("model.safetensors", Dtype::U8, &[5]), T::new("w", Dtype::F32, &[3])];
    write_checkpoint(&file, &tensors, None);
    for opts in [&["-o", "ro,no_checkpoint_file"][..], &["--no-checkpoint-file"][..]] {
        let m = Mount::new(&file, opts);
        // The tensor takes its own name back.
        assert_eq!(std::fs::read(m.file("model.safetensors")).unwrap(), tensors[0].data, "{opts:?}");
        assert!(!m.file("%6Dodel.safetensors").exists());
        assert_eq!(doc(&m)["checkpoint_files"], serde_json::json!([]));
        let names = std::fs::read_dir(&m.path).unwrap().count();
        assert_eq!(names, tensors.len() + 2, "tensors, metadata.json, .stfs");
    }
}

#[test]
fn extract_writes_tensors_only() {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = vec![T::new("model.safetensors", Dtype::U8, &[5]), T::new("w", Dtype::F32, &[3])];
    write_checkpoint(&file, &tensors, None);
    let out_dir = dir.path().join("out");
    let out = stfs(&["extract", "--all", file.to_str().unwrap(), "-o", out_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut names: Vec<String> =
        std::fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    // Named as a default mount names them.
    assert_eq!(names, ["%6Dodel.safetensors", "w"]);
    assert_eq!(std::fs::read(out_dir.join("%6Dodel.safetensors")).unwrap(), tensors[0].data);
}

fn stats(m: &Mount) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(m.file(".stfs/stats.json")).unwrap()).unwrap()
}

fn count(m: &Mount, key: &str) -> u64 {
    stats(m)[key].as_u64().unwrap_or_else(|| panic!("no counter {key}"))
}

/// Reads the whole file at `path`: its bytes, or the error of its open or of a read.
fn read_whole(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// As root on a kernel with FUSE passthrough, an open of the re-served file of a local file is
/// handed to the kernel (the daemon serves none of its bytes), and gives the same bytes as a mount
/// with `--no-passthrough`; once the local file is replaced or rewritten in place, no open of it
/// is handed over, and reading it fails as it does without passthrough.
/// The value of an open file's `user.stfs.passthrough`.
fn passthrough_xattr(file: &std::fs::File) -> String {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 16];
    // SAFETY: the buffer outlives the call and its length is passed.
    let n = unsafe {
        libc::fgetxattr(file.as_raw_fd(), c"user.stfs.passthrough".as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    };
    assert!(n >= 0, "fgetxattr: {}", std::io::Error::last_os_error());
    String::from_utf8_lossy(&buf[..n as usize]).into_owned()
}

#[test]
fn a_reserved_local_file_is_passed_through_until_it_changes() {
    if not_root("FUSE passthrough") {
        return;
    }
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = vec![T::new("big", Dtype::F32, &[700_000]), T::new("small", Dtype::U8, &[5])];
    write_checkpoint(&file, &tensors, None);
    let len = std::fs::metadata(&file).unwrap().len();
    let off = Mount::new(&file, &["--no-passthrough"]);
    let on = Mount::new(&file, &[]);
    assert_eq!(count(&off, "passthrough_enabled"), 0);
    assert_eq!(count(&on, "passthrough_enabled"), 1, "root on this kernel: {}", stats(&on));
    assert_same_file(&off.file("model.safetensors"), &file);
    let served_before = count(&on, "fuse_read_bytes");
    assert_same_file(&on.file("model.safetensors"), &file);
    // Passed through at every open; the daemon served none of the bytes.
    let s = stats(&on);
    assert!(s["passthrough_checkpoint_opens"].as_u64() >= Some(3), "{s}");
    assert!(s["passthrough_open_bytes"].as_u64() >= Some(3 * len), "{s}");
    // (stats.json's own reads are counted too: they are a few KiB.)
    let served = s["fuse_read_bytes"].as_u64().unwrap() - served_before;
    assert!(served < len, "the daemon served passed-through bytes: {s}");
    assert_eq!(count(&off, "passthrough_opens"), 0);
    assert!(count(&off, "fuse_read_bytes") >= len, "read from its page cache after the first time");
    // Tensor files are still served by the daemon, alike on both mounts.
    assert_eq!(std::fs::read(on.file("big")).unwrap(), std::fs::read(off.file("big")).unwrap());
    // The file says so itself while open (user.stfs.passthrough), and not otherwise.
    let held = std::fs::File::open(on.file("model.safetensors")).unwrap();
    assert_eq!(passthrough_xattr(&held), "1");
    drop(held);
    assert_eq!(passthrough_xattr(&std::fs::File::open(off.file("model.safetensors")).unwrap()), "0");
    assert_eq!(passthrough_xattr(&std::fs::File::open(on.file("big")).unwrap()), "0", "a tensor file, no disk cache");

    // Replaced (same length, other bytes): never handed over, never its bytes.
    let opens = count(&on, "passthrough_checkpoint_opens");
    let other = dir.path().join("other.safetensors");
    let mut changed = vec![T::new("big", Dtype::F32, &[700_000]), T::new("small", Dtype::U8, &[5])];
    changed[0].data.iter_mut().for_each(|b| *b = !*b);
    write_checkpoint(&other, &changed, None);
    assert_eq!(std::fs::metadata(&other).unwrap().len(), len);
    std::fs::rename(&other, &file).unwrap();
    let got = read_whole(&on.file("model.safetensors"));
    assert!(got.is_err(), "a replaced file was read through the mount");
    assert_eq!(count(&on, "passthrough_checkpoint_opens"), opens, "a replaced file was handed over");

    // Rewritten in place on a fresh mount: handed over before, not after.
    let fresh = Mount::new(&file, &[]);
    assert_eq!(read_whole(&fresh.file("model.safetensors")).unwrap(), std::fs::read(&file).unwrap());
    let opens = count(&fresh, "passthrough_checkpoint_opens");
    assert!(opens >= 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\x01\x02", len - 2).unwrap();
    drop(f);
    assert!(read_whole(&fresh.file("model.safetensors")).is_err(), "a rewritten file was read through the mount");
    assert_eq!(count(&fresh, "passthrough_checkpoint_opens"), opens, "a rewritten file was handed over");
}

/// Opens of a re-served local file while others hold it open: 8 threads opening and reading it
/// at once all get its bytes, handed over each time; once the file is rewritten in place, a new
/// open fails (its pin is checked again even while the inode is open) and is not handed over.
#[test]
fn opens_of_a_held_reserved_file_are_checked_each_time() {
    if not_root("FUSE passthrough") {
        return;
    }
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::F32, &[50_000])], None);
    let want = std::fs::read(&file).unwrap();
    let m = Mount::new(&file, &[]);
    let served = m.file("model.safetensors");
    let held = std::fs::File::open(&served).unwrap();
    let opens = count(&m, "passthrough_checkpoint_opens");
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..25 {
                    assert!(read_whole(&served).unwrap() == want, "a concurrent open read other bytes");
                }
            });
        }
    });
    assert_eq!(count(&m, "passthrough_checkpoint_opens"), opens + 200, "{}", stats(&m));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\x01\x02", want.len() as u64 - 2).unwrap();
    drop(f);
    let error = std::fs::File::open(&served).expect_err("a rewritten file opened while held");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert_eq!(count(&m, "passthrough_checkpoint_opens"), opens + 200, "a rewritten file was handed over");
    drop(held);
}

/// How a local file changes under a reader of its handed-over re-served file (issue 44, defect 2).
#[derive(Clone, Copy, Debug)]
enum Change {
    /// `truncate` to half its length.
    Truncate,
    /// Its last 4 KiB rewritten in place, the same length.
    Rewrite,
    /// Another file of the same length renamed over its path.
    Replace,
}

/// The text of the log at `path` (empty until it exists).
fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Issue 44, defect 2: a reader holding the re-served file of a local file open (handed to the
/// kernel) while the file changes reads what the kernel reads from the file itself: after a
/// truncation a `pread` near the old end gives 0 bytes while `fstat` keeps the mount's size, and a
/// sequential read ends at the new end with no error; after a rewrite in place the new bytes;
/// after a replacement by rename the pinned bytes (its open holds the pinned inode). The mount
/// cannot turn those reads into EIO; it sees the change (inotify), counts it in
/// `passthrough_files_changed`, logs one line naming the file, and hands the file over no more: a
/// new open while the reader holds it fails with EIO, and after it closed a new open is served by
/// the daemon, whose reads fail with EIO.
fn check_change_while_handed_over(change: Change) {
    use std::os::unix::fs::FileExt;
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::F32, &[400_000])], None);
    let want = std::fs::read(&file).unwrap();
    let len = want.len() as u64;
    let log = dir.path().join("stfs.log");
    let m = Mount::new(&file, &["--log-file", log.to_str().unwrap()]);
    let served = m.file("model.safetensors");
    let held = std::fs::File::open(&served).unwrap();
    assert_eq!(passthrough_xattr(&held), "1", "{change:?}: not handed over: {}", stats(&m));
    let mut head = vec![0; 4096];
    held.read_exact_at(&mut head, 0).unwrap();
    assert!(head == want[..4096]);
    assert_eq!(count(&m, "passthrough_files_changed"), 0, "{change:?}: a change before any");
    let opens = count(&m, "passthrough_checkpoint_opens");

    let tail = len - 4096;
    match change {
        Change::Truncate => std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len / 2).unwrap(),
        Change::Rewrite => {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.write_all_at(&vec![0xA5; 4096], tail).unwrap();
        }
        Change::Replace => {
            let other = dir.path().join("other.safetensors");
            let mut bytes = want.clone();
            bytes[tail as usize..].fill(0x5A);
            std::fs::write(&other, &bytes).unwrap();
            std::fs::rename(&other, &file).unwrap();
        }
    }

    // What the reader holding it sees: the kernel reads the local file, as any reader of it would.
    let mut buf = vec![0; 4096];
    let got = held.read_at(&mut buf, tail).unwrap();
    assert_eq!(held.metadata().unwrap().len(), len, "{change:?}: fstat gives the mount's size");
    match change {
        Change::Truncate => {
            assert_eq!(got, 0, "{change:?}: a read past the new end");
            let mut whole = Vec::new();
            (&held).read_to_end(&mut whole).unwrap();
            assert!(whole == want[..len as usize / 2], "{change:?}: a sequential read ends at the new end");
        }
        Change::Rewrite => assert!(got == 4096 && buf.iter().all(|&b| b == 0xA5), "{change:?}: the new bytes"),
        Change::Replace => assert!(got == 4096 && buf == want[tail as usize..], "{change:?}: the pinned bytes"),
    }

    // Seen, counted once and logged.
    assert!(eventually(|| count(&m, "passthrough_files_changed") == 1), "{change:?}: not seen: {}", stats(&m));
    let line = format!("{}: changed while mounted", file.display());
    assert!(eventually(|| log_text(&log).contains(&line)), "{change:?}: no line `{line}` in:\n{}", log_text(&log));
    // Handed over no more: refused while the reader holds it, served by the daemon (EIO) after.
    let error = std::fs::File::open(&served).expect_err("a changed file opened while handed over");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{change:?}: {error}");
    drop(held);
    // The kernel sends RELEASE after close(2) returns (in the background), so the daemon may still
    // count the dropped reader for a moment: an open refused (EIO) until it has seen that RELEASE.
    let mut reopened = None;
    let released = eventually(|| match std::fs::File::open(&served) {
        Ok(file) => reopened.replace(file).is_none(),
        Err(error) if error.raw_os_error() == Some(libc::EIO) => false,
        Err(error) => panic!("{change:?}: reopening after the reader closed: {error}"),
    });
    assert!(released, "{change:?}: still refused 20 s after the reader closed it");
    let again = reopened.expect("opened once released");
    assert_eq!(passthrough_xattr(&again), "0", "{change:?}: handed over after the change");
    let error = (&again).read_to_end(&mut Vec::new()).expect_err("a changed file read through the mount");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{change:?}: {error}");
    assert_eq!(count(&m, "passthrough_checkpoint_opens"), opens, "{change:?}: handed over after the change");
    assert_eq!(count(&m, "passthrough_files_changed"), 1, "{change:?}: counted twice");
}

#[test]
fn a_handed_over_file_truncated_while_open_reads_short_and_is_counted_and_refused() {
    if not_root("FUSE passthrough") {
        return;
    }
    check_change_while_handed_over(Change::Truncate);
}

#[test]
fn a_handed_over_file_rewritten_while_open_reads_new_bytes_and_is_counted_and_refused() {
    if not_root("FUSE passthrough") {
        return;
    }
    check_change_while_handed_over(Change::Rewrite);
}

#[test]
fn a_handed_over_file_replaced_while_open_reads_the_pinned_bytes_and_is_counted_and_refused() {
    if not_root("FUSE passthrough") {
        return;
    }
    check_change_while_handed_over(Change::Replace);
}

/// Issue 44, defect 9: with passthrough on and no disk cache, no tensor file can be handed over,
/// so tensor files read one by one must not each cost an OPEN and a RELEASE round trip (as root
/// they did: one per open, 1.25-1.44x the time of `cat` of 2,000 small tensor files). A few looks
/// at tensor files leave the re-served file handed over; past 64 the kernel opens every file
/// itself (OPEN declined with ENOSYS): 300 more tensor opens reach the daemon at most 64 times
/// (300 before), every byte is right, and the re-served file is then served by the daemon, whole
/// and exact.
#[test]
fn tensor_files_opened_one_by_one_stop_reaching_the_daemon_with_passthrough_on() {
    if not_root("FUSE passthrough") {
        return;
    }
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors: Vec<T> = (0..150).map(|i| T::new(&format!("t{i:03}"), Dtype::U8, &[4096])).collect();
    write_checkpoint(&file, &tensors, None);
    let m = Mount::new(&file, &[]);
    assert_eq!(count(&m, "passthrough_enabled"), 1, "root on this kernel: {}", stats(&m));
    for t in &tensors[..3] {
        assert_eq!(std::fs::read(m.file(&t.name)).unwrap(), t.data);
    }
    let held = std::fs::File::open(m.file("model.safetensors")).unwrap();
    assert_eq!(passthrough_xattr(&held), "1", "a few tensor opens stopped the hand-over");
    drop(held);
    let before = count(&m, "kernel_open_requests");
    for t in tensors.iter().chain(&tensors) {
        assert!(std::fs::read(m.file(&t.name)).unwrap() == t.data, "{}", t.name);
    }
    let reached = count(&m, "kernel_open_requests") - before;
    assert!(reached <= 64, "{reached} of 300 tensor opens reached the daemon: {}", stats(&m));
    let whole = std::fs::File::open(m.file("model.safetensors")).unwrap();
    assert_eq!(passthrough_xattr(&whole), "0");
    let opens = count(&m, "passthrough_checkpoint_opens");
    assert!(read_whole(&m.file("model.safetensors")).unwrap() == std::fs::read(&file).unwrap());
    assert_eq!(count(&m, "passthrough_checkpoint_opens"), opens);
}

/// Whether, within 20 s, `ready` holds (polled every 20 ms).
fn eventually(mut ready: impl FnMut() -> bool) -> bool {
    wait_until(std::time::Duration::from_secs(20), &mut ready)
}

/// Issue 34, item 2: a remote shard read whole through a mount with `--cache-dir` is kept there as
/// one file, and a later mount hands its re-served file to the kernel (no byte from the origin, no
/// READ for the daemon); once the object changes (a new ETag), the old file is never served.
#[test]
fn a_remote_shard_cached_whole_is_passed_through_until_its_object_changes() {
    if not_root("FUSE passthrough") {
        return;
    }
    let Some(server) = nginx::Nginx::start() else { return tool_missing("nginx", "apt-get install nginx") };
    let dir = workdir();
    let cache = dir.path().join("cache");
    let tensors = vec![T::new("big", Dtype::F32, &[300_000]), T::new("small", Dtype::U8, &[5])];
    let bytes = write_checkpoint(&server.root.join("model.safetensors"), &tensors, None);
    let url = server.url("model.safetensors");
    let mount = || Mount::new(Path::new(&url), &["--cache-dir", cache.to_str().unwrap(), "--block-size", "64K"]);
    // Read whole (every block lands on disk), closed (the whole-file extent is assembled), again
    // on later mounts until an open is handed over: the daemon's exit bounds its writer's time.
    let mut passed = None;
    for _ in 0..3 {
        let m = mount();
        let first = count(&m, "passthrough_checkpoint_opens");
        assert!(read_whole(&m.file("model.safetensors")).unwrap() == bytes);
        if first == 0
            && !eventually(|| {
                let got = read_whole(&m.file("model.safetensors")).unwrap();
                assert!(got == bytes);
                count(&m, "passthrough_checkpoint_opens") > 0
            })
        {
            continue;
        }
        passed = Some(m);
        break;
    }
    let m = passed.expect("the re-served file of a cached remote shard was never handed over");
    // A mount made now passes it through at its first open: no READ reaches the daemon for it.
    drop(m);
    let m = mount();
    let before = count(&m, "fuse_read_bytes");
    assert!(read_whole(&m.file("model.safetensors")).unwrap() == bytes);
    assert_eq!(count(&m, "passthrough_checkpoint_opens"), 1, "{}", stats(&m));
    assert!(count(&m, "fuse_read_bytes") - before < bytes.len() as u64 / 2, "{}", stats(&m));
    assert_eq!(count(&m, "disk_cache_corrupt"), 0);
    drop(m);

    // The object changes (same size, a new ETag): a new mount never hands the old file over.
    let mut changed = vec![T::new("big", Dtype::F32, &[300_000]), T::new("small", Dtype::U8, &[5])];
    changed[0].data.iter_mut().for_each(|b| *b = !*b);
    let new_bytes = {
        let aside = dir.path().join("new.safetensors");
        write_checkpoint(&aside, &changed, None)
    };
    assert_eq!(new_bytes.len(), bytes.len());
    nginx::replace_file(&server.root.join("model.safetensors"), &new_bytes, std::time::Duration::from_secs(5));
    let m = mount();
    assert!(read_whole(&m.file("model.safetensors")).unwrap() == new_bytes, "old bytes served after a change");
    assert_eq!(count(&m, "passthrough_checkpoint_opens"), 0, "the old object's file was handed over");
}

/// Where each tensor's bytes start in the safetensors file `bytes`, by name.
fn tensor_starts(bytes: &[u8]) -> BTreeMap<String, u64> {
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len as usize]).unwrap();
    let tensors = header.as_object().unwrap().iter().filter(|(name, _)| *name != "__metadata__");
    tensors.map(|(name, t)| (name.clone(), 8 + header_len + t["data_offsets"][0].as_u64().unwrap())).collect()
}

/// `key` of the mount's stats.json once the prefetch the reads so far started has landed: the
/// same value for 300 ms running (within 10 s).
fn settled_count(m: &Mount, key: &str) -> u64 {
    let (mut last, mut since) = (count(m, key), std::time::Instant::now());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while since.elapsed() < std::time::Duration::from_millis(300) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = count(m, key);
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        }
    }
    last
}

/// `file` opened for reads of exactly the pages asked for (no kernel readahead).
fn open_random(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: advice on a descriptor this function owns.
    assert_eq!(unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) }, 0);
    file
}

/// A loader that maps the re-served file faults in a page at each tensor's start, and every
/// fault's read-around (two kernel requests back to back) takes one in: those reads cost the
/// blocks they cover and a small window, not the tensor's first 8 MiB or the rest of it (issue 45:
/// a diffusers pipeline's `from_pretrained` had the mount fetch 769 MB from a slow store where the
/// kernel asked for 212 MB, and return later than from the folder). A tensor file read from its
/// first byte still has its start prefetched at once.
#[test]
fn reads_at_a_tensor_start_in_the_reserved_file_fetch_their_blocks_not_the_tensor() {
    use std::os::unix::fs::FileExt;
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    // `middle` (the writer orders tensors by name) puts `z` past the forward slack of the stream the
    // reads of `b` start.
    let tensors = [
        T::new("a", Dtype::U8, &[100_000]),
        T::new("b", Dtype::U8, &[16 << 20]),
        T::new("middle", Dtype::U8, &[20 << 20]),
        T::new("z", Dtype::U8, &[16 << 20]),
    ];
    let starts = tensor_starts(&write_checkpoint(&file, &tensors, None));
    // The block path (no mapping, no passthrough), so every byte from the file is a backing read.
    let m = Mount::new(&file, &["--block-size", "64K", "--no-passthrough", "--no-map"]);
    let served = open_random(&m.file("model.safetensors"));
    let page = starts["b"] / 4096 * 4096;
    let mut buf = [0u8; 4096];
    served.read_exact_at(&mut buf, page).unwrap();
    served.read_exact_at(&mut buf, page + 4096).unwrap();
    let fetched = settled_count(&m, "backing_read_bytes");
    assert!(fetched <= 512 << 10, "two pages at tensor b's start fetched {fetched} bytes");
    open_random(&m.file("z")).read_exact_at(&mut buf, 0).unwrap();
    let more = settled_count(&m, "backing_read_bytes") - fetched;
    assert!(more >= 4 << 20, "a tensor file read from its first byte prefetched only {more} bytes");
}

/// Bytes the kernel was given through the re-served file are not fetched again by prefetch: it
/// keeps them, and never asks for them again (issue 45: a loader that faults in each tensor's
/// first pages and later reads every tensor had the mount fetch those pages twice). Here a range
/// inside tensor `b` is read first and leaves the (small) cache; reading `b` from its start then
/// costs the rest of `b`, not that range again.
#[test]
fn prefetch_skips_bytes_the_kernel_was_given_through_the_reserved_file() {
    use std::os::unix::fs::FileExt;
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let mib = 1u64 << 20;
    let tensors = [T::new("b", Dtype::U8, &[16 * mib]), T::new("c", Dtype::U8, &[16 * mib])];
    let starts = tensor_starts(&write_checkpoint(&file, &tensors, None));
    let m = Mount::new(&file, &["--block-size", "64K", "--cache-size", "8M", "--no-passthrough", "--no-map"]);
    let served = open_random(&m.file("model.safetensors"));
    let read = |from: u64, len: u64| {
        let mut buf = vec![0u8; 256 << 10];
        for at in (from..from + len).step_by(buf.len()) {
            served.read_exact_at(&mut buf, at).unwrap();
        }
    };
    let b = starts["b"].div_ceil(4096) * 4096;
    read(b + 6 * mib, 4 * mib);
    read(starts["c"].div_ceil(4096) * 4096, 12 * mib);
    let before = settled_count(&m, "backing_read_bytes");
    read(b, 14 * mib);
    let fetched = settled_count(&m, "backing_read_bytes") - before;
    assert!(fetched < 12 * mib, "reading b's first 14 MiB, 4 MiB of which the kernel holds, fetched {fetched} bytes");
}
