//! The disk tier's size bound: a scan of everything stored (every process's blocks), and LRU
//! eviction by each file's mtime, which a hit refreshes (`store::read_block`). Whoever evicts or
//! clears holds an exclusive `flock` on `DIR/lock`, so two processes never evict at once; readers
//! and writers take no lock (a block removed under a reader's open descriptor stays readable, and
//! a block written during a clear is a whole, valid block).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::extent::{is_extent_name, is_meta_name, meta_path, EXTENTS};
use super::store::{is_block_name, is_temp_name, LOCK, OBJECTS};

/// A temporary file older than this was left by a crashed writer (a live one writes a block in
/// well under a second) and is removed by the next scan.
pub(crate) const STALE_TEMP_AGE: Duration = Duration::from_secs(600);

/// Eviction brings the stored bytes down to this share of the bound (in 1/16ths), so it runs
/// once per several blocks written, not once per block.
const LOW_WATER_SIXTEENTHS: u64 = 14;

/// One stored block or extent file, as a scan found it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) path: PathBuf,
    /// Its extent record, removed with it.
    pub(crate) record: Option<PathBuf>,
    pub(crate) bytes: u64,
    /// Last use: the block's mtime, or the extent record's (set when written, refreshed by hits).
    pub(crate) used: SystemTime,
    /// An extent file (or a record left without one), not a block.
    pub(crate) extent: bool,
}

/// Everything under a cache directory's `objects/`.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub(crate) blocks: Vec<Stored>,
    pub(crate) bytes: u64,
    /// Temporary files still there (after removing stale ones, if asked).
    pub(crate) temps: usize,
}

/// Lists every block file under `root/objects/` and every extent file (with its record) under
/// `root/extents/`; removes temporary files older than [`STALE_TEMP_AGE`] when `clean` is set. A
/// missing folder is an empty one. Folders are walked only where they are real directories, never
/// through a symbolic link: what the scan counts, evicts or removes is inside the cache directory
/// (`stfs cache clear` run by root on a user's cache must not follow that user's links out of it).
pub(crate) fn scan(root: &Path, clean: bool) -> io::Result<Scan> {
    let mut out = Scan::default();
    for folder in [OBJECTS, EXTENTS] {
        let path = root.join(folder);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => scan_folder(std::fs::read_dir(&path)?, clean, &mut out),
            Ok(_) => log::warn!("{}: not a directory; its contents are not the cache's", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// [`scan`] of one folder of fan-out folders.
fn scan_folder(dir: std::fs::ReadDir, clean: bool, out: &mut Scan) {
    let now = SystemTime::now();
    for fan in dir.flatten() {
        // The entry's own type: a link to a directory is not one.
        if !fan.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(fan.path()) else { continue };
        for file in files.flatten() {
            let name = file.file_name();
            let Some(name) = name.to_str() else { continue };
            // Gone since it was listed (evicted by another process): skip it.
            let Ok(meta) = file.metadata() else { continue };
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if is_block_name(name) && meta.is_file() {
                out.bytes += meta.len();
                out.blocks.push(Stored { path: file.path(), record: None, bytes: meta.len(), used, extent: false });
            } else if is_extent_name(name) && meta.is_file() {
                // The record holds the extent's last use (the data file's times are its identity).
                let record = meta_path(&file.path());
                let (record_bytes, used) = match std::fs::metadata(&record) {
                    Ok(m) => (m.len(), m.modified().unwrap_or(used)),
                    Err(_) => (0, used),
                };
                let bytes = meta.len() + record_bytes;
                out.bytes += bytes;
                out.blocks.push(Stored { path: file.path(), record: Some(record), bytes, used, extent: true });
            } else if is_meta_name(name) && !file.path().with_extension("").exists() {
                // A record whose data file is gone: evicted (or cleared) like one.
                out.bytes += meta.len();
                out.blocks.push(Stored { path: file.path(), record: None, bytes: meta.len(), used, extent: true });
            } else if is_temp_name(name) {
                let stale = now.duration_since(used).is_ok_and(|age| age > STALE_TEMP_AGE);
                if clean && stale && std::fs::remove_file(file.path()).is_ok() {
                    continue;
                }
                out.temps += 1;
            }
        }
    }
}

/// What an eviction pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Evicted {
    /// Block files removed.
    pub(crate) blocks: u64,
    /// Bytes stored after the pass.
    pub(crate) remaining: u64,
}

/// Removes the least recently used blocks of `scan` until at most the low-water mark of `limit`
/// bytes remain (nothing if `scan` is within `limit`).
pub(crate) fn evict(mut scan: Scan, limit: u64) -> Evicted {
    let mut out = Evicted { blocks: 0, remaining: scan.bytes };
    if scan.bytes <= limit {
        return out;
    }
    let target = limit / 16 * LOW_WATER_SIXTEENTHS;
    scan.blocks.sort_by_key(|b| b.used);
    for block in &scan.blocks {
        if out.remaining <= target {
            break;
        }
        // Already gone (another process evicted it, or a clear): it no longer counts either way.
        if let Some(record) = &block.record {
            let _ = std::fs::remove_file(record);
        }
        match std::fs::remove_file(&block.path) {
            Ok(()) => out.blocks += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => continue,
        }
        out.remaining = out.remaining.saturating_sub(block.bytes);
    }
    out
}

/// The lock file at `path`, shared by every process using the directory: opened as it is, or
/// created exclusively (O_EXCL, mode 0600) when missing; never through a symbolic link
/// (O_NOFOLLOW), and refused unless it is a regular file.
fn open_lock_file(path: &Path) -> io::Result<File> {
    let open = |create: bool| {
        let mut options = OpenOptions::new();
        options.read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if create {
            options.create_new(true).mode(0o600);
        }
        options.open(path)
    };
    let file = match open(false) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => match open(true) {
            // Created by another process in between: open theirs.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open(false)?,
            other => other?,
        },
        other => other?,
    };
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: not a regular file", path.display())));
    }
    Ok(file)
}

/// An exclusive `flock` on `root/lock`, released when dropped. With `wait` false, `None` when
/// another process holds it.
pub(crate) fn lock(root: &Path, wait: bool) -> io::Result<Option<File>> {
    let file = open_lock_file(&root.join(LOCK))?;
    let flags = if wait { libc::LOCK_EX } else { libc::LOCK_EX | libc::LOCK_NB };
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    if unsafe { libc::flock(file.as_raw_fd(), flags) } == 0 {
        return Ok(Some(file));
    }
    let e = io::Error::last_os_error();
    if !wait && e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(None);
    }
    Err(e)
}
