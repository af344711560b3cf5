//! Real mounts: ls, stat, read, cat, dd, mmap, metadata.json, xattrs, read-only refusals, umount.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::Command;

use common::*;
use stfs::format::Dtype;

fn mixed_mount() -> (tempfile::TempDir, Vec<T>, Mount) {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = mixed_tensors();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_checkpoint(&file, &tensors, Some(&meta));
    let m = Mount::new(&file, &["--block-size", "64K", "--cache-size", "256K"]);
    (dir, tensors, m)
}

fn served_path(m: &Mount, name: &str) -> std::path::PathBuf {
    m.file(&stfs::tree::names::escape(name, stfs::tree::namespace::RESERVED))
}

#[test]
fn every_tensor_reads_back_exactly() {
    let (_dir, tensors, m) = mixed_mount();
    for t in &tensors {
        let got = std::fs::read(served_path(&m, &t.name)).unwrap();
        assert_eq!(got, t.data, "tensor {:?}", t.name);
    }
}

#[test]
fn the_mount_is_listed_as_fuse_stfs_with_the_checkpoint_as_source() {
    let (dir, _tensors, m) = mixed_mount();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mp = m.path.to_str().unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(mp)).expect("the mount is listed");
    let after = line.split(" - ").nth(1).unwrap_or_default();
    let fields: Vec<&str> = after.split(' ').collect();
    let source = dir.path().join("model.safetensors");
    assert_eq!(fields.first(), Some(&"fuse.stfs"), "{line}");
    assert_eq!(fields.get(1), Some(&source.to_str().unwrap()), "{line}");
    assert!(line.split(' ').nth(5).unwrap_or_default().split(',').any(|o| o == "ro"), "{line}");
}

#[test]
fn ls_and_stat_show_one_file_per_tensor() {
    let (dir, tensors, m) = mixed_mount();
    let mut names: Vec<String> =
        std::fs::read_dir(&m.path).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut expected: Vec<String> =
        tensors.iter().map(|t| stfs::tree::names::escape(&t.name, stfs::tree::namespace::RESERVED)).collect();
    expected.extend(["metadata.json", ".stfs", "model.safetensors"].map(String::from));
    expected.sort();
    assert_eq!(names, expected);
    let backing = std::fs::metadata(dir.path().join("model.safetensors")).unwrap();
    for t in &tensors {
        let st = std::fs::metadata(served_path(&m, &t.name)).unwrap();
        assert!(st.is_file());
        assert_eq!(st.len(), t.data.len() as u64);
        assert_eq!(st.permissions().mode() & 0o777, 0o444);
        assert_eq!(st.mtime(), backing.mtime());
        assert_eq!(st.uid(), unsafe { libc::getuid() });
        assert_eq!(st.blksize(), 64 << 10);
    }
    let root = std::fs::metadata(&m.path).unwrap();
    assert_eq!((root.ino(), root.permissions().mode() & 0o777), (1, 0o555));
    // ls -l works through the real tool too.
    let out = Command::new("ls").arg("-la").arg(&m.path).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("model.embed.weight"));
}

#[test]
fn reads_at_odd_offsets_and_sizes() {
    let (_dir, tensors, m) = mixed_mount();
    let t = &tensors[1];
    let f = std::fs::File::open(served_path(&m, &t.name)).unwrap();
    let len = t.data.len() as u64;
    for (off, size) in [(0, 1), (1, 4095), (4097, 70_000), (65_535, 2), (len - 3, 100), (len, 10), (len + 5000, 10)] {
        let mut buf = vec![0u8; size];
        let n = f.read_at(&mut buf, off).unwrap();
        let lo = (off as usize).min(t.data.len());
        let hi = (off as usize + size).min(t.data.len());
        assert_eq!(&buf[..n], &t.data[lo..hi], "offset {off} size {size}");
    }
    let mut f = f;
    f.seek(SeekFrom::Start(12345)).unwrap();
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, &t.data[12345..]);
}

#[test]
fn cat_and_dd_serve_the_bytes() {
    let (_dir, tensors, m) = mixed_mount();
    let t = &tensors[0];
    let path = served_path(&m, &t.name);
    let out = Command::new("cat").arg(&path).output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, t.data);
    let out = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args(["bs=1000", "skip=7", "count=13", "status=none"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, &t.data[7000..20000]);
}

#[test]
fn mmap_of_a_tensor_file_sees_its_bytes() {
    let (_dir, tensors, m) = mixed_mount();
    let t = &tensors[1];
    let f = std::fs::File::open(served_path(&m, &t.name)).unwrap();
    let len = t.data.len();
    // SAFETY: a read-only private mapping of a file we keep open for the mapping's lifetime.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap failed: {}", std::io::Error::last_os_error());
    // SAFETY: the mapping is `len` bytes long and readable.
    let mapped = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    // Touch pages in a scattered order, like page faults of a real consumer.
    for i in (0..len).step_by(4096).rev() {
        assert_eq!(mapped[i], t.data[i]);
    }
    assert_eq!(mapped, &t.data[..]);
    // SAFETY: unmapping the mapping created above.
    unsafe { libc::munmap(ptr, len) };
}

#[test]
fn metadata_json_describes_every_tensor() {
    let (dir, tensors, m) = mixed_mount();
    let text = std::fs::read_to_string(m.file("metadata.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["metadata"]["format"], "pt");
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    for t in &tensors {
        let e = &doc["tensors"][&t.name];
        assert_eq!(e["dtype"], t.dtype.name(), "{}", t.name);
        assert_eq!(e["shape"], serde_json::json!(t.shape));
        assert_eq!(e["byte_len"], t.data.len());
        let off = e["offset"].as_u64().unwrap() as usize;
        assert_eq!(&bytes[off..off + t.data.len()], &t.data[..], "offset of {}", t.name);
        let path = e["path"].as_str().unwrap();
        assert_eq!(doc["files"][path], t.name.as_str());
        assert_eq!(std::fs::read(m.file(path)).unwrap(), t.data);
    }
}

#[test]
fn xattrs_describe_the_tensor() {
    let (_dir, tensors, m) = mixed_mount();
    let path = served_path(&m, &tensors[1].name);
    let out = Command::new("getfattr").args(["-d", "-m", "user.safetensors"]).arg(&path).output();
    let Ok(out) = out else {
        check_xattrs_libc(&path);
        return tool_missing("getfattr", "apt-get install attr");
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("user.safetensors.dtype=\"BF16\""), "{text}");
    assert!(text.contains("user.safetensors.shape=\"[257,333]\""), "{text}");
    check_xattrs_libc(&path);
}

fn check_xattrs_libc(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 256];
    // SAFETY: valid C strings and a buffer of the stated size.
    let n =
        unsafe { libc::getxattr(c.as_ptr(), c"user.safetensors.dtype".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n as usize], b"BF16");
    // SAFETY: as above.
    let n = unsafe { libc::getxattr(c.as_ptr(), c"user.nope".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!((n, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENODATA)));
}

#[test]
fn writes_are_refused_with_erofs() {
    let (_dir, tensors, m) = mixed_mount();
    let path = served_path(&m, &tensors[0].name);
    let erofs = |r: std::io::Result<()>| assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    erofs(std::fs::OpenOptions::new().write(true).open(&path).map(drop));
    erofs(std::fs::write(m.file("new"), b"x"));
    erofs(std::fs::create_dir(m.file("d")));
    erofs(std::fs::remove_file(&path));
    erofs(std::fs::rename(&path, m.file("other")));
    erofs(std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)));
}

#[test]
fn stats_file_and_command_report_counters() {
    let (_dir, tensors, m) = mixed_mount();
    std::fs::read(served_path(&m, &tensors[0].name)).unwrap();
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.path.join(".stfs/stats.json")).unwrap()).unwrap();
    let n = |key: &str| doc[key].as_u64().unwrap();
    assert!(n("fuse_reads") > 0);
    // A local file is served from its mapping (the kernel copies the replies) unless blocks are
    // loaded; either way every byte read is counted.
    assert!(n("mapped_read_bytes") >= tensors[0].data.len() as u64, "{doc}");
    assert!(n("peak_resident_bytes") <= 256 << 10);
    let out = stfs(&["stats", "--json", m.path.to_str().unwrap()]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["mapped_reads"].as_u64().unwrap() > 0);
    // Without --json, the summary a person reads: what programs read, where stfs got it from (in
    // words, not counter names) and whether anything failed.
    let out = stfs(&["stats", m.path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with(&format!("{}: stfs mount, daemon up ", m.path.display())), "{text}");
    let lines = [
        "  read          ",
        "  from source   ",
        " answered directly from the local file, ",
        "  memory cache  ",
        "  throughput    ",
        "  errors        none",
    ];
    for line in lines {
        assert!(text.contains(line), "no {line:?} in {text}");
    }
}

/// `stfs stats --watch` reprints the summary with each interval's throughput, and ends (non-zero,
/// in one line) when the mount goes away; every wait here is bounded.
#[test]
fn stats_watch_updates_live_and_ends_with_the_mount() {
    let (_dir, tensors, m) = mixed_mount();
    let mp = m.path.to_str().unwrap();
    let child = Command::new(STFS)
        .args(["stats", "--watch=0.2", mp])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    std::fs::read(served_path(&m, &tensors[0].name)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let out = stfs(&["umount", mp]);
    assert!(out.status.success(), "{out:?}");
    let out = wait_output(child, TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "ends when the mount is gone: {out:?}");
    let summaries = text.matches(": stfs mount, daemon up ").count();
    assert!(summaries >= 3, "{summaries} summaries in 1.4 s at 0.2 s: {text}");
    assert!(text.contains("over the last 0.2 s"), "{text}");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1, "{out:?}");
}

/// The rest of `file`, read 7 bytes at a time (as a reader polling in small pieces would).
fn read_seven_bytes_at_a_time(file: &mut std::fs::File) -> Vec<u8> {
    use std::io::Read;
    let (mut rest, mut chunk) = (Vec::new(), [0u8; 7]);
    loop {
        let n = file.read(&mut chunk).unwrap();
        if n == 0 {
            return rest;
        }
        rest.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn stats_file_is_renewed_at_each_open_and_kept_within_one() {
    use std::io::Read;
    let (_dir, tensors, m) = mixed_mount();
    let stats_path = m.path.join(".stfs/stats.json");
    let reads = |doc: &[u8]| serde_json::from_slice::<serde_json::Value>(doc).unwrap()["fuse_reads"].as_u64().unwrap();
    let before = reads(&std::fs::read(&stats_path).unwrap());
    // A reader keeps the document taken at its open while others read tensors, even read a few
    // bytes at a time. (Another open of stats.json renews the one cached document; see docs/usage.md.)
    let mut held = std::fs::File::open(&stats_path).unwrap();
    let mut first = [0u8; 5];
    held.read_exact(&mut first).unwrap();
    for t in &tensors {
        assert_eq!(std::fs::read(served_path(&m, &t.name)).unwrap(), t.data);
    }
    let rest = read_seven_bytes_at_a_time(&mut held);
    let whole = [&first[..], &rest].concat();
    assert_eq!(
        reads(&whole),
        before + 1,
        "the held document is the one taken at its open: {}",
        String::from_utf8_lossy(&whole)
    );
    // A new open sees every read since, and its stat agrees with what it reads (a stat of the path
    // looks the name up again: another snapshot, whose counters may have moved since).
    let mut opened = std::fs::File::open(&stats_path).unwrap();
    let size = opened.metadata().unwrap().len();
    let mut fresh = Vec::new();
    opened.read_to_end(&mut fresh).unwrap();
    assert!(reads(&fresh) >= before + 1 + tensors.len() as u64);
    assert_eq!(size, fresh.len() as u64);
}

#[test]
fn every_open_of_the_stats_file_reads_a_whole_document_of_its_own() {
    use std::io::Read;
    let (_dir, tensors, m) = mixed_mount();
    let stats_path = m.path.join(".stfs/stats.json");
    let reads = |doc: &[u8]| serde_json::from_slice::<serde_json::Value>(doc).unwrap()["fuse_reads"].as_u64().unwrap();
    let before = reads(&std::fs::read(&stats_path).unwrap());
    let mut held = std::fs::File::open(&stats_path).unwrap();
    let held_len = held.metadata().unwrap().len();
    let mut first = [0u8; 5];
    held.read_exact(&mut first).unwrap();
    for t in &tensors {
        assert_eq!(std::fs::read(served_path(&m, &t.name)).unwrap(), t.data);
    }
    // Others open it meanwhile, one keeping it open: each gets a later document of its own.
    let mut other_held = std::fs::File::open(&stats_path).unwrap();
    let other = std::fs::read(&stats_path).unwrap();
    assert!(reads(&other) >= before + 1 + tensors.len() as u64);
    let rest = read_seven_bytes_at_a_time(&mut held);
    let whole = [&first[..], &rest].concat();
    assert_eq!(whole.len() as u64, held_len, "{}", String::from_utf8_lossy(&whole));
    assert_eq!(reads(&whole), before + 1, "the document taken at the first open: {}", String::from_utf8_lossy(&whole));
    assert_eq!(held.metadata().unwrap().len(), held_len, "fstat keeps the held document's size");
    let mut other_doc = Vec::new();
    other_held.read_to_end(&mut other_doc).unwrap();
    assert_eq!(other_doc.len() as u64, other_held.metadata().unwrap().len());
    assert!(reads(&other_doc) > before + 1);
}

/// Without passthrough (`--no-passthrough`, or not root) opens need no round trip: the first OPEN
/// is declined with ENOSYS and from then on the kernel opens and closes files itself. With it (as
/// root, where the re-served file of a local file is handed to the kernel), every open is
/// answered (one round trip each) until 64 tensor files were opened on a mount without a disk
/// cache; then OPEN is declined too (`tests/checkpoint_file.rs`,
/// `tensor_files_opened_one_by_one_stop_reaching_the_daemon_with_passthrough_on`).
#[test]
fn opening_files_needs_no_round_trip_to_the_daemon() {
    let (_dir, tensors, plain) = mixed_mount();
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    write_checkpoint(&file, &tensors, None);
    let off = Mount::new(&file, &["--no-passthrough"]);
    let on = Mount::new(&file, &[]);
    let opens = |m: &Mount| {
        for _ in 0..3 {
            for t in &tensors {
                let mut f = std::fs::File::open(served_path(m, &t.name)).unwrap();
                let mut first = [0u8; 1];
                std::io::Read::read(&mut f, &mut first).unwrap();
            }
        }
        std::fs::read(m.path.join("metadata.json")).unwrap();
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(m.path.join(".stfs/stats.json")).unwrap()).unwrap();
        // `opens` is the old name of the counter of OPEN requests.
        assert_eq!(doc["opens"], doc["kernel_open_requests"], "{doc}");
        (doc["kernel_open_requests"].as_u64().unwrap(), doc["passthrough_enabled"].as_u64().unwrap())
    };
    assert!(opens(&off).0 <= 1);
    let (n, passthrough) = opens(&on);
    assert!(if passthrough == 1 { n > 3 * tensors.len() as u64 } else { n <= 1 }, "{n} opens, {passthrough}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let (n, passthrough) = opens(&plain);
        assert!(n <= 1 && passthrough == 0, "not root: no passthrough, no round trips");
    }
}

#[test]
fn umount_command_unmounts_and_daemon_exits() {
    let (_dir, _tensors, m) = mixed_mount();
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&m.path));
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a mount point"));
}

#[test]
fn concurrent_readers_get_the_right_bytes() {
    let (_dir, tensors, m) = mixed_mount();
    std::thread::scope(|s| {
        for k in 0..8 {
            let (tensors, m) = (&tensors, &m);
            s.spawn(move || {
                for round in 0..3 {
                    for (i, t) in tensors.iter().enumerate() {
                        if (i + k + round) % 2 == 0 {
                            assert_eq!(std::fs::read(served_path(m, &t.name)).unwrap(), t.data);
                        }
                    }
                }
            });
        }
    });
}

#[test]
fn large_reads_of_a_local_file_are_spliced_whole_and_no_splice_copies_them() {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    // A first tensor of odd length puts the big one's bytes at no page boundary, so a full read
    // spans one page more than its size (the case a pipe's slots are counted for).
    let tensors = vec![T::new("a", Dtype::U8, &[4099]), T::new("big", Dtype::F32, &[3, 1 << 20])];
    write_checkpoint(&file, &tensors, None);
    for (extra, spliced) in [(&[][..], true), (&["--no-splice"][..], false)] {
        let m = Mount::new(&file, extra);
        let path = served_path(&m, "big");
        // Reads of 1 MiB, as `dd bs=1M` makes them, then the whole file through a mapping.
        let mut f = std::fs::File::open(&path).unwrap();
        let (mut got, mut buf) = (Vec::new(), vec![0u8; 1 << 20]);
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == tensors[1].data, "{extra:?}: read() bytes differ");
        let mapped = std::fs::read(served_path(&m, "a")).unwrap();
        assert_eq!(mapped, tensors[0].data, "{extra:?}");
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(m.path.join(".stfs/stats.json")).unwrap()).unwrap();
        let n = |key: &str| doc[key].as_u64().unwrap();
        assert_eq!(n("read_errors"), 0, "{doc}");
        assert!(n("mapped_read_bytes") >= tensors[1].data.len() as u64, "{doc}");
        if n("io_uring_enabled") == 1 {
            // On FUSE over io_uring (the test command's second pass) nothing is spliced: a ring
            // entry's reply is read into its payload buffer.
            assert_eq!(n("spliced_reads"), 0, "{doc}");
        } else if spliced {
            assert!(n("spliced_read_bytes") >= tensors[1].data.len() as u64, "every big read spliced: {doc}");
            assert_eq!(n("spliced_reads"), n("mapped_reads"), "{doc}");
        } else {
            assert_eq!(n("spliced_reads"), 0, "{doc}");
        }
    }
}

/// The read request size the kernel granted is in stats.json (`stfs stats` prints the same
/// document): what the mount asked for (`--max-request-kb`, 1 MiB by default) up to
/// `fs.fuse.max_pages_limit` pages, two pages less than the splice pipe when a local file's reads
/// are spliced; and no read the daemon served was larger. As root the limit is raised to 4,096
/// pages for a while (and restored): the default still asks for 1 MiB, and 16 MiB is granted when
/// asked for.
#[test]
fn the_granted_request_size_is_in_stats_json() {
    const LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";
    let (_dir, file, t) = one_tensor_checkpoint();
    let found = std::fs::read_to_string(LIMIT).map_or(256, |s| s.trim().parse::<u64>().unwrap());
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // What the kernel grants: the pages asked for, at most the limit; spliced, a power of two of
    // pipe slots (256 without privilege), less two.
    let want = |asked_kb: u64, limit: u64, splice: bool| {
        let pages = (asked_kb / 4).min(limit).max(1);
        let pages =
            if splice { (pages.next_power_of_two().min(if root { 4096 } else { 256 }) - 2).min(pages) } else { pages };
        pages * 4096
    };
    let check = |limit: u64| {
        for (asked_kb, opts) in [
            (1024, &["--no-splice"][..]),
            (1024, &[][..]),
            (64, &["--no-splice", "--max-request-kb", "64"][..]),
            (64, &["-o", "max_request_kb=64"][..]),
            (16384, &["--no-splice", "--max-request-kb", "16384"][..]),
            (16384, &["--max-request-kb", "16384"][..]),
        ] {
            let expected = want(asked_kb, limit, !opts.contains(&"--no-splice"));
            let m = Mount::new(&file, opts);
            assert_eq!(std::fs::read(m.file(&t.name)).unwrap(), t.data);
            let out = stfs(&["stats", "--json", m.path.to_str().unwrap()]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(s["max_request_bytes"].as_u64(), Some(expected), "limit {limit}, {opts:?}: {s}");
            let (reads, bytes) = (s["fuse_reads"].as_u64().unwrap(), s["fuse_read_bytes"].as_u64().unwrap());
            assert!(reads > 0 && bytes / reads <= expected, "limit {limit}, {opts:?}: {s}");
        }
    };
    check(found);
    if root && std::fs::metadata(LIMIT).is_ok() {
        /// Puts the limit found back, even when an assertion fails.
        struct Restore(u64);
        impl Drop for Restore {
            fn drop(&mut self) {
                let _ = std::fs::write(LIMIT, self.0.to_string());
            }
        }
        let _restore = Restore(found);
        std::fs::write(LIMIT, "4096").unwrap();
        check(4096);
    }
}
