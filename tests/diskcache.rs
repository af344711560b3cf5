//! The disk cache (`--cache-dir`) through real mounts: a URL served by nginx on loopback is read
//! whole, unmounted and mounted again, and the second load must be byte-exact with no tensor byte
//! sent (nginx's access log: the second mount's only request is the opening one, the ranged GET
//! of the first 64 KiB that pins the object and holds its header). A replaced object is read anew,
//! a corrupted block file is refetched and counted, a full tmpfs leaves reads exact with one
//! warning, and a directory others may write to is refused in one line. As root, a tensor whose
//! every byte is cached is passed through to an extent file (the kernel reads and maps it; the
//! daemon sees no READ), and an extent file changed or replaced on disk is never served. Skips
//! when nginx is missing (fails under `CI=true`); the tmpfs, foreign-owner and passthrough cases
//! need root.

mod common;
#[path = "common/nginx.rs"]
mod nginx;

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use nginx::{replace_file, LogLine, Nginx};
use stfs::format::Dtype;

macro_rules! nginx_or_skip {
    () => {
        match Nginx::start() {
            Some(n) => n,
            None => return tool_missing("nginx", "apt-get install nginx"),
        }
    };
}

/// Mixed small tensors plus a few that span many 64 KiB blocks (about 7 MiB in all).
fn fixture(seed: u64) -> Vec<T> {
    let mut tensors = mixed_tensors();
    for i in 0..6 {
        tensors.push(T::new(&format!("big.{i}.weight"), Dtype::F32, &[300 + i, 1000]));
    }
    if seed != 0 {
        for t in &mut tensors {
            t.data = pattern(seed ^ stfs::tree::names::fnv1a64(t.name.as_bytes()), t.data.len());
        }
    }
    tensors
}

fn served(m: &Mount, name: &str) -> PathBuf {
    m.file(&stfs::tree::names::escape(name, stfs::tree::namespace::RESERVED))
}

fn stats(m: &Mount) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(m.file(".stfs/stats.json")).unwrap()).unwrap()
}

fn count(m: &Mount, key: &str) -> u64 {
    stats(m)[key].as_u64().unwrap_or_else(|| panic!("no counter {key}"))
}

fn read_all_exact(m: &Mount, tensors: &[T]) {
    for t in tensors {
        assert!(std::fs::read(served(m, &t.name)).unwrap() == t.data, "tensor {:?} differs", t.name);
    }
}

/// A fresh private cache directory inside `work`.
fn cache_dir(work: &Path) -> PathBuf {
    let dir = work.join("cache");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// Mounts `url` with the cache directory (as `-o cache_dir=` when `dash_o`) and `extra` flags.
fn mount_cached(url: &str, cache: &Path, extra: &[&str]) -> Mount {
    let mut args = vec!["--cache-dir", cache.to_str().unwrap()];
    args.extend_from_slice(extra);
    Mount::new(Path::new(url), &args)
}

/// The requests nginx answered since `from`, once the server has been quiet for a moment.
fn requests_since(nginx: &Nginx, from: usize) -> Vec<LogLine> {
    nginx.settled_log(Duration::from_millis(300))[from..].to_vec()
}

/// Body bytes of tensor data sent: everything but the opening request (`bytes=0-65535`).
fn tensor_bytes(lines: &[LogLine]) -> u64 {
    lines.iter().filter(|l| l.range != "bytes=0-65535").map(|l| l.bytes).sum()
}

#[test]
fn a_second_mount_reads_every_block_from_disk_and_no_tensor_byte_from_the_store() {
    let nginx = nginx_or_skip!();
    let work = workdir();
    let cache = cache_dir(work.path());
    let tensors = fixture(0);
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let url = nginx.url("model.safetensors");
    unmount_and_wait({
        // The URL default block size (4 MiB), set as a mount option.
        let opt = format!("cache_dir={}", cache.display());
        let m = Mount::new(Path::new(&url), &["-o", &opt]);
        read_all_exact(&m, &tensors);
        // Written behind the reads, by the mount's writer thread.
        assert!(eventually(|| count(&m, "disk_cache_written_bytes") > 0), "{}", stats(&m));
        assert_eq!(count(&m, "disk_cache_hits"), 0);
        m
    });
    // Blocks only: as root the first mount also wrote extent files, which this mount is told not
    // to pass through to the kernel.
    let mark = nginx.settled_log(Duration::from_millis(300)).len();
    let m = mount_cached(&url, &cache, &["-o", "no_passthrough"]);
    read_all_exact(&m, &tensors);
    assert_eq!(count(&m, "passthrough_opens"), 0);
    let lines = requests_since(&nginx, mark);
    assert_eq!(tensor_bytes(&lines), 0, "the store sent tensor bytes on the second load: {lines:?}");
    assert_eq!(lines.len(), 1, "only the opening request: {lines:?}");
    let s = stats(&m);
    assert_eq!((s["backing_reads"].as_u64(), s["disk_cache_misses"].as_u64()), (Some(0), Some(0)), "{s}");
    assert!(s["disk_cache_hits"].as_u64() > Some(0), "{s}");
    drop(m);

    // The cache outlives the mounts; `stfs cache info` sees it and `clear` empties it.
    let out = stfs(&["cache", "info", cache.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("sources: 1"), "{text}");
    let out = stfs(&["cache", "clear", cache.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = stfs(&["cache", "info", cache.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("blocks: 0"));
}

#[test]
fn two_mounts_at_once_share_one_cache_directory_and_a_third_reads_it_all() {
    let nginx = nginx_or_skip!();
    let work = workdir();
    let cache = cache_dir(work.path());
    let tensors = fixture(3);
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let url = nginx.url("model.safetensors");
    // Two daemons (two processes) fill the same directory at once, each reading every tensor in
    // its own thread: blocks both write race on their final names.
    let (a, b) = (mount_cached(&url, &cache, &[]), mount_cached(&url, &cache, &[]));
    std::thread::scope(|scope| {
        for m in [&a, &b] {
            scope.spawn(|| read_all_exact(m, &tensors));
        }
    });
    unmount_and_wait(a);
    unmount_and_wait(b);
    let mark = nginx.settled_log(Duration::from_millis(300)).len();
    let m = mount_cached(&url, &cache, &["-o", "no_passthrough"]);
    read_all_exact(&m, &tensors);
    let lines = requests_since(&nginx, mark);
    assert_eq!(tensor_bytes(&lines), 0, "a block the two mounts wrote was not whole: {lines:?}");
    let s = stats(&m);
    assert_eq!((s["disk_cache_corrupt"].as_u64(), s["disk_cache_misses"].as_u64()), (Some(0), Some(0)), "{s}");
}

#[test]
fn a_replaced_object_is_read_anew_never_from_the_old_blocks() {
    let nginx = nginx_or_skip!();
    let work = workdir();
    let cache = cache_dir(work.path());
    let path = nginx.root.join("model.safetensors");
    let old = fixture(0);
    write_checkpoint(&path, &old, None);
    let url = nginx.url("model.safetensors");
    {
        let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
        read_all_exact(&m, &old);
    }
    // Same shapes, so the same size: only the ETag (mtime) tells the versions apart.
    let new = fixture(99);
    let bytes = stfs::format::writer::serialize(
        &new.iter().map(|t| (t.name.clone(), t.dtype, t.shape.clone(), t.data.clone())).collect::<Vec<_>>(),
        None,
    )
    .unwrap();
    replace_file(&path, &bytes, Duration::from_secs(5));
    let mark = nginx.settled_log(Duration::from_millis(300)).len();
    let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
    read_all_exact(&m, &new);
    assert_eq!(count(&m, "disk_cache_hits"), 0);
    assert!(tensor_bytes(&requests_since(&nginx, mark)) > 0);
}

#[test]
fn a_corrupted_block_file_is_refetched_counted_and_exact() {
    let nginx = nginx_or_skip!();
    let work = workdir();
    let cache = cache_dir(work.path());
    let tensors = fixture(0);
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let url = nginx.url("model.safetensors");
    unmount_and_wait({
        let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
        read_all_exact(&m, &tensors);
        m
    });
    // Blocks only: as root the first mount also wrote extent files, which the second would pass
    // through to the kernel without reading a block.
    without_extents(&cache);
    // Flip one byte in the middle of one block file (block 20: inside a big tensor).
    let block = walk(&cache.join("objects")).into_iter().find(|p| p.to_string_lossy().ends_with("-20")).unwrap();
    let mut bytes = std::fs::read(&block).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&block, &bytes).unwrap();
    let mark = nginx.settled_log(Duration::from_millis(300)).len();
    let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
    read_all_exact(&m, &tensors);
    assert_eq!(count(&m, "disk_cache_corrupt"), 1, "{}", stats(&m));
    assert_eq!(count(&m, "backing_reads"), 1);
    // Exactly that block came from the store again, and went back to disk whole.
    assert_eq!(tensor_bytes(&requests_since(&nginx, mark)), 64 << 10);
    // The writer thread puts it back on disk whole.
    assert!(eventually(|| std::fs::read(&block).is_ok_and(|b| b.len() == bytes.len() && b != bytes)));
}

/// Whether `ready` holds within 10 s (polled): for what the write-behind thread does after a read.
fn eventually(mut ready: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ready() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let c = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: c is a valid C string for the call.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn a_full_cache_directory_leaves_reads_exact_and_warns_once() {
    if not_root("mounting a tmpfs") {
        return;
    }
    let nginx = nginx_or_skip!();
    let work = workdir();
    let cache = cache_dir(work.path());
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "stfs-test-cache"])
        .arg(&cache)
        .status()
        .unwrap();
    assert!(status.success(), "mount -t tmpfs failed");
    let _tmpfs = Tmpfs(cache.clone());
    let tensors = fixture(0);
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let log = work.path().join("stfs.log");
    // A bound far above the tmpfs's 1 MiB: the disk fills up before eviction would start.
    let m = mount_cached(
        &nginx.url("model.safetensors"),
        &cache,
        &["--block-size", "64K", "--cache-dir-size", "64M", "--log-file", log.to_str().unwrap()],
    );
    read_all_exact(&m, &tensors);
    let s = stats(&m);
    assert!(s["disk_cache_errors"].as_u64() > Some(0), "{s}");
    assert!(s["disk_cache_written_bytes"].as_u64() > Some(0), "{s}");
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("cannot store blocks").count(), 1, "{text}");
    assert!(text.contains("no space left"), "{text}");
}

#[test]
fn a_cache_directory_others_may_write_to_is_refused_in_one_line() {
    let work = workdir();
    let file = work.path().join("m.safetensors");
    write_checkpoint(&file, &mixed_tensors(), None);
    let shared = work.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cases = vec![(shared, "writable by group or others")];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let foreign = work.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
        cases.push((foreign, "owned by uid 65534"));
    }
    for (dir, needle) in cases {
        let mp = work.path().join("mnt");
        let _ = std::fs::create_dir(&mp);
        let out = stfs(&["mount", "--cache-dir", dir.to_str().unwrap(), file.to_str().unwrap(), mp.to_str().unwrap()]);
        if is_mounted(&mp) {
            force_unmount(&mp);
            panic!("mounted with cache directory {dir:?}");
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("stfs: {}: ", dir.display())) && err.contains(needle), "{err}");
    }
}

#[test]
fn a_local_file_is_cached_too() {
    let work = workdir();
    let cache = cache_dir(work.path());
    let file = work.path().join("m.safetensors");
    let tensors = fixture(0);
    write_checkpoint(&file, &tensors, None);
    unmount_and_wait({
        let m = mount_cached(file.to_str().unwrap(), &cache, &[]);
        read_all_exact(&m, &tensors);
        m
    });
    without_extents(&cache);
    let m = mount_cached(file.to_str().unwrap(), &cache, &[]);
    read_all_exact(&m, &tensors);
    assert_eq!(count(&m, "backing_reads"), 0, "{}", stats(&m));
    assert!(count(&m, "disk_cache_hits") > 0);
}

/// Removes the extent files (written as root), so the next mount reads blocks.
fn without_extents(cache: &Path) {
    match std::fs::remove_dir_all(cache.join("extents")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{e}"),
        _ => {}
    }
}

/// Tensors with bytes (a file of length 0 has nothing to pass through).
fn non_empty(tensors: &[T]) -> Vec<&T> {
    tensors.iter().filter(|t| !t.data.is_empty()).collect()
}

/// The extent files (data, not records) under the cache directory.
fn extent_files(cache: &Path) -> Vec<PathBuf> {
    let dir = cache.join("extents");
    let mut files: Vec<PathBuf> =
        if dir.is_dir() { walk(&dir).into_iter().filter(|p| p.extension().is_none()).collect() } else { vec![] };
    files.sort();
    files
}

/// Unmounts `m` and waits until its daemon has exited (it finishes the disk cache's writes,
/// extent files included, after the unmount).
fn unmount_and_wait(m: Mount) {
    let mp = m.path.clone();
    drop(m);
    assert!(wait_until(Duration::from_secs(20), || daemon_pid(&mp).is_none()), "the daemon did not exit");
}

/// As root: a URL read whole through a mount with `--cache-dir` (again if the daemon's bounded exit
/// left an extent unassembled), with every tensor's extent file written. Returns the nginx, the cache directory, the tensors.
fn cached_with_extents(work: &Path, nginx: &Nginx) -> (String, PathBuf, Vec<T>) {
    let cache = cache_dir(work);
    let tensors = fixture(0);
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let url = nginx.url("model.safetensors");
    read_until_every_extent_is_written(|| mount_cached(&url, &cache, &["--block-size", "64K"]), &cache, &tensors);
    (url, cache, tensors)
}

/// Mounts with `mount`, reads every tensor and unmounts, until every tensor has its extent file in
/// `cache`: the daemon gives its writer a bounded time after the unmount (section 13 of
/// docs/reliability.md), so on a loaded machine an extent may be left for the next mount to
/// assemble. At most three mounts.
fn read_until_every_extent_is_written(mount: impl Fn() -> Mount, cache: &Path, tensors: &[T]) {
    for _ in 0..3 {
        let m = mount();
        read_all_exact(&m, tensors);
        unmount_and_wait(m);
        if extent_files(cache).len() == non_empty(tensors).len() {
            break;
        }
    }
    assert_eq!(extent_files(cache).len(), non_empty(tensors).len(), "one extent file per tensor");
}

#[test]
fn a_second_mount_passes_whole_cached_tensors_to_the_kernel() {
    if not_root("FUSE passthrough") {
        return;
    }
    let nginx = nginx_or_skip!();
    let work = workdir();
    let (url, cache, tensors) = cached_with_extents(work.path(), &nginx);
    let mark = nginx.settled_log(Duration::from_millis(300)).len();
    let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
    read_all_exact(&m, &tensors);
    // Every tensor was opened by passthrough and the daemon saw no READ at all: the kernel read
    // the extent files itself.
    let s = stats(&m);
    let want = non_empty(&tensors);
    assert_eq!(s["passthrough_opens"].as_u64(), Some(want.len() as u64), "{s}");
    let bytes: u64 = want.iter().map(|t| t.data.len() as u64).sum();
    assert_eq!(s["passthrough_open_bytes"].as_u64(), Some(bytes), "{s}");
    assert_eq!(s["fuse_reads"].as_u64(), Some(0), "{s}");
    assert_eq!((s["backing_reads"].as_u64(), s["disk_cache_hits"].as_u64()), (Some(0), Some(0)), "{s}");
    assert_eq!(tensor_bytes(&requests_since(&nginx, mark)), 0);

    // mmap works: a shared read-only map of the biggest tensor file holds its bytes.
    let big = want.iter().max_by_key(|t| t.data.len()).unwrap();
    let file = std::fs::File::open(served(&m, &big.name)).unwrap();
    let len = big.data.len();
    // SAFETY: a read-only shared map of an open file, read only within its length, unmapped below.
    let mapped = unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let bytes = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        libc::munmap(p, len);
        bytes
    };
    assert!(mapped == big.data, "the mapped bytes differ");
    // ... and numpy's memmap, as loaders use it.
    let script = "import numpy, sys, hashlib\n\
                  m = numpy.memmap(sys.argv[1], dtype=numpy.uint8, mode='r')\n\
                  print(hashlib.sha256(m.tobytes()).hexdigest())";
    let path = served(&m, &big.name);
    let numpy = std::process::Command::new("python3").args(["-c", "import numpy"]).output();
    if numpy.is_ok_and(|out| out.status.success()) {
        let out = std::process::Command::new("python3").args(["-c", script]).arg(&path).output().unwrap();
        assert!(out.status.success(), "numpy memmap: {}", String::from_utf8_lossy(&out.stderr));
        let digest = ring::digest::digest(&ring::digest::SHA256, &big.data);
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), hex);
    } else {
        tool_missing("python3 with numpy", "apt-get install python3-numpy");
    }
    // One READ: of stats.json, above; none for the mapped file.
    assert_eq!(count(&m, "fuse_reads"), 1, "mmap went through the daemon");
}

#[test]
fn a_changed_or_replaced_extent_file_is_never_served() {
    if not_root("FUSE passthrough") {
        return;
    }
    let nginx = nginx_or_skip!();
    let work = workdir();
    let (url, cache, tensors) = cached_with_extents(work.path(), &nginx);
    let files = extent_files(&cache);
    let big: Vec<&PathBuf> = files.iter().filter(|p| std::fs::metadata(p).unwrap().len() > 1000).collect();
    // One byte flipped in place; one byte flipped with the file's mtime put back (its ctime still
    // moves); the file replaced by another of the same size (a new inode).
    let flip = |path: &Path| {
        let file = std::fs::File::options().write(true).read(true).open(path).unwrap();
        let mut b = [0u8];
        std::os::unix::fs::FileExt::read_at(&file, &mut b, 500).unwrap();
        std::os::unix::fs::FileExt::write_at(&file, &[b[0] ^ 0x20], 500).unwrap();
        file
    };
    drop(flip(big[0]));
    let mtime = std::fs::metadata(big[1]).unwrap().modified().unwrap();
    flip(big[1]).set_modified(mtime).unwrap();
    let len = std::fs::metadata(big[2]).unwrap().len() as usize;
    let other = work.path().join("other");
    std::fs::write(&other, vec![0x5a; len]).unwrap();
    std::fs::rename(&other, big[2]).unwrap();

    let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
    read_all_exact(&m, &tensors);
    // The three changed files failed the quick check at open and were served from blocks; their
    // full check runs on the writer thread and finds them corrupt.
    assert!(eventually(|| count(&m, "disk_cache_corrupt") == 3), "{}", stats(&m));
    let s = stats(&m);
    assert_eq!(s["passthrough_opens"].as_u64(), Some(non_empty(&tensors).len() as u64 - 3), "{s}");
    // Those three were read from their blocks on disk, not from the store.
    assert_eq!(s["backing_reads"].as_u64(), Some(0), "{s}");
    assert!(s["fuse_reads"].as_u64() > Some(0), "{s}");
    // Whatever is on disk now (the three were removed, and may be assembled again from their
    // verified blocks) holds the checkpoint's bytes exactly.
    drop(m);
    let checkpoint = std::fs::read(nginx.root.join("model.safetensors")).unwrap();
    for path in &big[..3] {
        if let Ok(bytes) = std::fs::read(path) {
            let name = path.file_name().unwrap().to_str().unwrap();
            let mut parts = name.rsplitn(3, '-');
            let len: usize = parts.next().unwrap().parse().unwrap();
            let start: usize = parts.next().unwrap().parse().unwrap();
            assert!(bytes == checkpoint[start..start + len], "{path:?} holds other bytes");
        }
    }
}

/// A local checkpoint in `dir` of `count` tensors of `elements` f32 each, distinct bytes.
fn local_checkpoint(dir: &Path, count: usize, elements: u64) -> (PathBuf, Vec<T>) {
    let tensors: Vec<T> = (0..count)
        .map(|i| {
            let mut t = T::new(&format!("layer.{i:03}.weight"), Dtype::F32, &[elements]);
            t.data = pattern(i as u64 + 7, t.data.len());
            t
        })
        .collect();
    let path = dir.join("model.safetensors");
    write_checkpoint(&path, &tensors, None);
    (path, tensors)
}

/// A slow disk over a fresh directory in `work`, holding the private cache directory `cache`.
fn slow_cache(work: &Path, rename_suffix: &str) -> (common::slowdisk::SlowDiskMount, PathBuf) {
    let (backing, mp) = (work.join("disk"), work.join("slow"));
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&mp).unwrap();
    let disk = common::slowdisk::SlowDiskMount::new(&backing, &mp, rename_suffix);
    let cache = disk.path.join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    (disk, cache)
}

/// Issue 23, item 4: two daemons share a cache directory and open the same tensors over and over
/// while both assemble their extent files. Each extent's record is renamed into place 100 ms
/// after its data file (a slow disk), so the other daemon opens many a data file before its
/// record is there: that must be taken for one being published, never removed as corrupt, and
/// every byte read must be exact.
#[test]
fn two_daemons_sharing_a_cache_directory_never_take_an_extent_being_published_for_corrupt() {
    if not_root("FUSE passthrough") {
        return;
    }
    let work = workdir();
    let (path, tensors) = local_checkpoint(work.path(), 40, 1000);
    let (disk, cache) = slow_cache(work.path(), ".meta");
    disk.rename_delay_ms.store(100, std::sync::atomic::Ordering::SeqCst);
    let args = ["--cache-dir", cache.to_str().unwrap(), "--block-size", "64K"];
    let (a, b) = (Mount::new(&path, &args), Mount::new(&path, &args));
    // Counted in the slow disk's backing directory: the slow disk lists a directory afresh for each
    // readdir call, so a listing through it that spans calls can skip an entry while temporary
    // files come and go beside the records.
    let records = || {
        let dir = work.path().join("disk").join(cache.strip_prefix(&disk.path).unwrap()).join("extents");
        let files = if dir.is_dir() { walk(&dir) } else { vec![] };
        files.iter().filter(|p| p.to_string_lossy().ends_with(".meta")).count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    std::thread::scope(|scope| {
        for m in [&a, &b] {
            let (tensors, records) = (&tensors, &records);
            scope.spawn(move || {
                // Until every extent is published, and once more after.
                let mut last = false;
                while !last {
                    last = records() >= tensors.len() || std::time::Instant::now() > deadline;
                    read_all_exact(m, tensors);
                }
            });
        }
    });
    assert_eq!(records(), tensors.len());
    let written = count(&a, "disk_cache_extents_written") + count(&b, "disk_cache_extents_written");
    assert!(written >= tensors.len() as u64, "{written}");
    for m in [&a, &b] {
        let s = stats(m);
        assert_eq!(s["disk_cache_corrupt"].as_u64(), Some(0), "an extent being published was removed: {s}");
    }
    drop((a, b));
    // What is on disk is whole: a third mount passes every tensor through (after a full check
    // where the last record renamed into place was the other daemon's), exact.
    disk.rename_delay_ms.store(0, std::sync::atomic::Ordering::SeqCst);
    let m = Mount::new(&path, &args);
    assert!(all_passed_through(&m, &tensors), "{}", stats(&m));
    assert_eq!(count(&m, "disk_cache_corrupt"), 0);
}

/// Issue 23, item 7: the first open of a cached tensor whose extent needs a full check (after a
/// reboot; here a restored copy) never waits for that check. With only two FUSE threads and a
/// cache disk that reads slowly, three such tensors opened at once are answered at once (served
/// from their blocks), `ls` and another file answer promptly while the checks run on the disk
/// cache's writer thread, and an open after they are done is passed through to the kernel.
#[test]
fn opening_tensors_whose_extents_need_a_full_check_never_waits_for_it() {
    if not_root("FUSE passthrough") {
        return;
    }
    let work = workdir();
    let (path, tensors) = local_checkpoint(work.path(), 3, 4 << 20);
    let (disk, cache) = slow_cache(work.path(), ".meta");
    let args = ["--cache-dir", cache.to_str().unwrap(), "--block-size", "1M", "--threads", "2"];
    read_until_every_extent_is_written(|| Mount::new(&path, &args), &cache, &tensors);
    let extents = extent_files(&cache);
    assert_eq!(extents.len(), tensors.len());
    // Restored copies: other inodes, so their records no longer match and each needs a full pass.
    for extent in &extents {
        let copy = extent.with_extension("copy");
        std::fs::copy(extent, &copy).unwrap();
        std::fs::rename(&copy, extent).unwrap();
    }
    let m = Mount::new(&path, &args);
    // The disk answers each read (at most 128 KiB) in 25 ms: seconds per full check of 16 MiB.
    disk.read_delay_ms.store(25, std::sync::atomic::Ordering::SeqCst);
    let files: Vec<PathBuf> = tensors.iter().map(|t| served(&m, &t.name)).collect();
    let opened: Vec<(std::fs::File, Duration)> = std::thread::scope(|scope| {
        let opens: Vec<_> = files
            .iter()
            .map(|f| {
                scope.spawn(move || {
                    let start = std::time::Instant::now();
                    let file = std::fs::File::open(f).unwrap();
                    (file, start.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let start = std::time::Instant::now();
        let listed = std::fs::read_dir(&m.path).unwrap().count();
        let meta = std::fs::read(m.file("metadata.json")).unwrap();
        let took = start.elapsed();
        assert!(listed >= tensors.len() && !meta.is_empty());
        assert!(took < Duration::from_secs(1), "ls and metadata.json took {took:?} while extents were checked");
        opens.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (_, took) in &opened {
        assert!(*took < Duration::from_secs(1), "an open took {took:?}: it waited for its extent's check");
    }
    assert_eq!(count(&m, "passthrough_opens"), 0, "passed through before its extent was checked");
    drop(opened);
    disk.read_delay_ms.store(0, std::sync::atomic::Ordering::SeqCst);
    // The checks pass (same bytes) and renew the records: the next opens are passed through.
    assert!(all_passed_through(&m, &tensors), "{}", stats(&m));
    assert_eq!(count(&m, "disk_cache_corrupt"), 0);
}

/// Whether, within 10 s, one read of every tensor in `tensors` opens each by passthrough.
fn all_passed_through(m: &Mount, tensors: &[T]) -> bool {
    eventually(|| {
        let before = count(m, "passthrough_opens");
        read_all_exact(m, tensors);
        count(m, "passthrough_opens") - before == tensors.len() as u64
    })
}

/// Issue 23, item 8: a daemon whose cache disk barely moves (every write takes half a second)
/// with a full write queue is gone within 10 s of `stfs umount`: it gives up on the queue and
/// leaves its writer behind rather than wait for the disk.
#[test]
fn a_daemon_is_gone_within_10_s_of_an_unmount_whatever_its_cache_disk_does() {
    let work = workdir();
    let (path, tensors) = local_checkpoint(work.path(), 2, 8 << 20);
    let (disk, cache) = slow_cache(work.path(), ".meta");
    let args = ["--cache-dir", cache.to_str().unwrap(), "--block-size", "64K"];
    let m = Mount::new(&path, &args);
    let pid = daemon_pid(&m.path).expect("the daemon's pid");
    disk.write_delay_ms.store(500, std::sync::atomic::Ordering::SeqCst);
    read_all_exact(&m, &tensors);
    let written = count(&m, "disk_cache_written_bytes");
    assert!(written < 8 << 20, "{written} bytes written: the queue drained before the unmount");
    let out = stfs(&["umount", m.path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let start = std::time::Instant::now();
    let gone = wait_until(Duration::from_secs(20), || !Path::new(&format!("/proc/{pid}")).exists());
    let took = start.elapsed();
    drop(m);
    assert!(gone && took < Duration::from_secs(10), "the daemon took {took:?} to exit after the unmount");
}

/// The resident memory of process `pid` in bytes (`VmRSS`).
fn resident_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Issue 31, defect 2: a source claiming a hostile length (a sparse local file of 2^60 bytes on a
/// tmpfs, as an HTTP server's `Content-Range` could claim) and one read near its end with
/// `--cache-dir`. The disk tier's set of blocks known on disk grew a dense vector to the block
/// read (2 TiB here): the daemon died with "memory allocation of ... failed" and left a stale
/// mount. Now the read answers (zeros), the daemon answers on, and its memory stays small.
#[test]
fn a_read_near_the_end_of_a_source_claiming_2_to_the_60_bytes_keeps_the_daemon_small() {
    if not_root("mounting a tmpfs") {
        return;
    }
    let work = workdir();
    let cache = cache_dir(work.path());
    let fs = work.path().join("tmpfs");
    std::fs::create_dir(&fs).unwrap();
    mount_tmpfs(&fs);
    let _detach = DetachAll(vec![fs.clone()]);
    let len: u64 = 1 << 60;
    let mut header = format!(r#"{{"w":{{"dtype":"U8","shape":[{len}],"data_offsets":[0,{len}]}}}}"#).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let path = fs.join("huge.safetensors");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    std::fs::write(&path, &bytes).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_len(bytes.len() as u64 + len).unwrap();

    let m = mount_cached(path.to_str().unwrap(), &cache, &["--block-size", "64K"]);
    let pid = daemon_pid(&m.path).expect("the daemon's pid");
    let file = std::fs::File::open(served(&m, "w")).unwrap();
    let mut buf = vec![1u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, len - 4096).expect("a read near the end");
    assert!(buf.iter().all(|&b| b == 0), "a sparse file reads as zeros");
    drop(file);
    // The block reached the disk tier (its writer marks it on disk), and the daemon answers on.
    assert!(eventually(|| count(&m, "disk_cache_written_bytes") > 0), "{}", stats(&m));
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "the daemon died");
    let rss = resident_bytes(pid);
    assert!(rss < 256 << 20, "the daemon holds {rss} bytes after one read");
}

/// Issue 31, defect 6: an extent whose record cannot be written (the cache disk fails the
/// record's rename, as a disk filling up between the two renames would). The data file, already
/// renamed into place, was left without a record: taken for one being published for 10 minutes,
/// then removed as corrupt, and this process never assembled the extent again. Now the failed
/// assembly leaves no data file behind, and once the disk takes writes again (a block of another
/// tensor) the extent is assembled and passed through.
#[test]
fn an_extent_whose_record_cannot_be_written_leaves_no_data_file_and_is_assembled_later() {
    if not_root("FUSE passthrough") {
        return;
    }
    let work = workdir();
    let (path, tensors) = local_checkpoint(work.path(), 2, 100_000);
    let (disk, cache) = slow_cache(work.path(), ".meta");
    // Listed in the slow disk's backing directory (see the test above).
    let extents = work.path().join("disk").join(cache.strip_prefix(&disk.path).unwrap()).join("extents");
    let listed = |suffix: &str| {
        let files = if extents.is_dir() { walk(&extents) } else { vec![] };
        files.iter().filter(|p| p.to_string_lossy().ends_with(suffix)).count()
    };
    let data_files = || {
        let files = if extents.is_dir() { walk(&extents) } else { vec![] };
        files.iter().filter(|p| p.extension().is_none() && !p.to_string_lossy().ends_with(".tmp")).count()
    };
    disk.rename_fails.store(true, std::sync::atomic::Ordering::SeqCst);
    let m = Mount::new(&path, &["--cache-dir", cache.to_str().unwrap(), "--block-size", "64K"]);
    read_all_exact(&m, &tensors[..1]);
    assert!(eventually(|| count(&m, "disk_cache_errors") > 0), "the assembly never failed: {}", stats(&m));
    assert!(eventually(|| listed(".tmp") == 0), "a temporary file was left");
    assert_eq!((data_files(), listed(".meta")), (0, 0), "a data file was left without its record");
    disk.rename_fails.store(false, std::sync::atomic::Ordering::SeqCst);
    // The other tensor's blocks are written: the directory takes writes again.
    read_all_exact(&m, &tensors[1..]);
    assert!(
        eventually(|| {
            read_all_exact(&m, &tensors);
            listed(".meta") == tensors.len()
        }),
        "the extent was never assembled again: {}",
        stats(&m)
    );
    assert_eq!(data_files(), tensors.len());
    assert!(all_passed_through(&m, &tensors), "{}", stats(&m));
    assert_eq!(count(&m, "disk_cache_corrupt"), 0);
}
