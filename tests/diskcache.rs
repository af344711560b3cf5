//! The disk cache (`--cache-dir`) through real mounts: a URL served by nginx on loopback is read
//! whole, unmounted and mounted again, and the second load must be byte-exact with no tensor byte
//! sent (nginx's access log: the second mount's only request is the opening one, the ranged GET
//! of the first 64 KiB that pins the object and holds its header). A replaced object is read anew,
//! a corrupted block file is refetched and counted, a full tmpfs leaves reads exact with one
//! warning, and a directory others may write to is refused in one line. Skips when nginx is
//! missing (fails under `CI=true`); the tmpfs and foreign-owner cases need root.

mod common;
#[path = "common/nginx.rs"]
mod nginx;

use std::ffi::CString;
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
    {
        // The URL default block size (4 MiB), set as a mount option.
        let opt = format!("cache_dir={}", cache.display());
        let m = Mount::new(Path::new(&url), &["-o", &opt]);
        read_all_exact(&m, &tensors);
        // Written behind the reads, by the mount's writer thread.
        assert!(eventually(|| count(&m, "disk_cache_written_bytes") > 0), "{}", stats(&m));
        assert_eq!(count(&m, "disk_cache_hits"), 0);
    }
    let mark = nginx.settled_log(Duration::from_millis(300)).len();
    let m = mount_cached(&url, &cache, &[]);
    read_all_exact(&m, &tensors);
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
    {
        let m = mount_cached(&url, &cache, &["--block-size", "64K"]);
        read_all_exact(&m, &tensors);
    }
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
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
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
    {
        let m = mount_cached(file.to_str().unwrap(), &cache, &[]);
        read_all_exact(&m, &tensors);
    }
    let m = mount_cached(file.to_str().unwrap(), &cache, &[]);
    read_all_exact(&m, &tensors);
    assert_eq!(count(&m, "backing_reads"), 0, "{}", stats(&m));
    assert!(count(&m, "disk_cache_hits") > 0);
}
