//! Extent files: one tensor file's bytes, exactly, assembled from verified blocks, so the kernel
//! can read them directly (FUSE passthrough maps offset N of the served file to offset N of the
//! backing file: no header fits in front).
//!
//! Layout under the cache directory `DIR`:
//!
//! ```text
//! DIR/extents/ab/KEY-START-LEN        the bytes [START, START+LEN) of the source stored under KEY
//! DIR/extents/ab/KEY-START-LEN.meta   its record: CRC-32 of the bytes, length, and the data
//!                                     file's device, inode, ctime and mtime as created
//! DIR/extents/ab/.NAME.PID.N.tmp      either being written
//! ```
//!
//! How a file is verified before it is handed to the kernel, and why that is sound. It is
//! assembled from blocks that each passed their CRC, checksummed as it is written, renamed into
//! place, and only then is its record written, from an `fstat` of the written file, with the
//! kernel's boot id. An open compares the opened file's `fstat` and the boot id with the record:
//! - any write or truncation through the kernel moves the file's ctime (which no system call can
//!   set back) and mtime, and a replaced or copied file is another inode: so equal stats mean the
//!   bytes have not changed since they were checksummed;
//! - a torn file (a crash before its pages reached the disk; nothing is `fsync`'d) needs a crash,
//!   and a crash means a new boot: so an equal boot id means the file is still the one in the page
//!   cache, whole, whatever reached the disk.
//!
//! When both match the file is handed over at the cost of two `stat`s and a 100-byte read
//! ([`open_checked`]). When either differs (the first open after a reboot, a restored copy) the
//! file needs a full CRC pass against the record ([`check`], run off the threads that answer
//! requests by `extents`): a match rewrites the record (for this boot), a mismatch removes the
//! file, as does an unparsable record. What this cannot see is what no `stat` shows, e.g. the
//! medium corrupting data under the filesystem within one boot, as for any file read from disk.
//!
//! Publication. The record holds the stats of the data file in place (a rename moves its ctime),
//! so the data file is renamed into place first and its record follows; if the record cannot be
//! written, the data file is removed again, so a failure leaves nothing behind. Another process (a
//! mount sharing the directory) can open the data file in between: a data file without a record is
//! taken for one being published ([`Opened::Unpublished`]: not used, not removed) until it is
//! [`UNPUBLISHED_AGE`] old, when only a crash between the two renames can explain it and it is
//! removed. A record never shows half written (it is renamed into place too). The data file's
//! rename never replaces one already there (another process's, which its readers may hold open
//! through passthrough): the second process to finish an extent drops its own.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::store::{self, ObjectKey};

/// The folder of extent files under the cache directory.
pub(crate) const EXTENTS: &str = "extents";
/// The suffix of a record.
const META: &str = ".meta";
/// The first bytes of a record (format version 1).
const MAGIC: &[u8; 8] = b"STFSEXT1";
/// A record: magic, CRC of the data, length, device, inode, ctime s/ns, mtime s/ns, boot id, CRC
/// of these.
const RECORD_LEN: usize = 8 + 4 + 8 * 7 + 16 + 4;

/// The data file of `range` of the source stored under `key`.
pub(crate) fn extent_path(root: &Path, key: &ObjectKey, range: &Range<u64>) -> PathBuf {
    let key = key.as_str();
    root.join(EXTENTS).join(&key[..2]).join(format!("{key}-{}-{}", range.start, range.end - range.start))
}

/// The record of data file `path`.
pub(crate) fn meta_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(META);
    PathBuf::from(name)
}

/// Whether a file name is a data file's (`KEY-START-LEN`).
pub(crate) fn is_extent_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = name.splitn(3, '-');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(key), Some(start), Some(len)) => {
            key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()) && digits(start) && digits(len)
        }
        _ => false,
    }
}

/// Whether a file name is a record's (`KEY-START-LEN.meta`).
pub(crate) fn is_meta_name(name: &str) -> bool {
    name.strip_suffix(META).is_some_and(is_extent_name)
}

/// What is recorded of a data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    crc: u32,
    len: u64,
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
    /// The kernel's boot id when the record was taken (0: unknown, never matches).
    boot: u128,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), 0 if unknown.
fn boot_id() -> u128 {
    static BOOT: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let hex: String = text.chars().filter(char::is_ascii_hexdigit).collect();
        if hex.len() == 32 {
            u128::from_str_radix(&hex, 16).unwrap_or(0)
        } else {
            0
        }
    })
}

impl Record {
    fn of(crc: u32, meta: &std::fs::Metadata) -> Record {
        Record {
            crc,
            len: meta.len(),
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            boot: boot_id(),
        }
    }

    fn to_bytes(self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&self.crc.to_le_bytes());
        let fields = [self.len, self.dev, self.ino, self.ctime.0 as u64, self.ctime.1 as u64, self.mtime.0 as u64];
        for (i, v) in fields.iter().chain([self.mtime.1 as u64].iter()).enumerate() {
            out[12 + 8 * i..20 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        out[68..84].copy_from_slice(&self.boot.to_le_bytes());
        let crc = crc32fast::hash(&out[..RECORD_LEN - 4]);
        out[RECORD_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn from_bytes(b: &[u8]) -> Option<Record> {
        if b.len() != RECORD_LEN || &b[..8] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
        if crc32fast::hash(&b[..RECORD_LEN - 4]) != u32_at(RECORD_LEN - 4) {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[12 + 8 * i..20 + 8 * i].try_into().unwrap_or_default());
        Some(Record {
            crc: u32_at(8),
            len: u64_at(0),
            dev: u64_at(1),
            ino: u64_at(2),
            ctime: (u64_at(3) as i64, u64_at(4) as i64),
            mtime: (u64_at(5) as i64, u64_at(6) as i64),
            boot: u128::from_le_bytes(b[68..84].try_into().unwrap_or_default()),
        })
    }
}

/// Writes `record` for data file `path` (temporary name, then rename).
fn write_record(path: &Path, record: Record) -> io::Result<u64> {
    let meta = meta_path(path);
    let (temp, mut file) = store::temp_file(&meta)?;
    let result = file.write_all(&record.to_bytes()).and_then(|()| std::fs::rename(&temp, &meta));
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result.map(|()| RECORD_LEN as u64)
}

/// What an assembly came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Assembled {
    /// The extent file and its record are in place: the bytes they take.
    Written(u64),
    /// This block is not on disk, or failed its check: nothing was left behind.
    Missing(u64),
    /// Another process (a mount sharing the directory) published this extent file first: ours was
    /// dropped, and theirs, which a reader may have open, was left in place.
    Published,
}

/// Assembles the extent file of `range` (within a source of `source_len` bytes read in blocks of
/// `block_size`) from the block files under `key`, each verified as it is read, and publishes it:
/// the data file renamed into place, then its record (module note: until the record is there, an
/// open takes the file for one still being published, not for a corrupt one).
pub(crate) fn assemble(
    root: &Path,
    key: &ObjectKey,
    block_size: u64,
    source_len: u64,
    range: &Range<u64>,
) -> io::Result<Assembled> {
    let path = extent_path(root, key, range);
    let (temp, mut file) = store::temp_file(&path)?;
    let result = (|| {
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = Vec::new();
        for block in range.start / block_size..range.end.div_ceil(block_size) {
            let at = block * block_size;
            buf.resize(source_len.saturating_sub(at).min(block_size) as usize, 0);
            if store::read_block(&store::block_path(root, key, block), &mut buf).is_err() {
                return Ok(Assembled::Missing(block));
            }
            let from = (range.start.max(at) - at) as usize;
            let to = (range.end.min(at + block_size) - at) as usize;
            let part = buf.get(from..to).ok_or_else(|| io::Error::other("block shorter than the extent"))?;
            hasher.update(part);
            file.write_all(part)?;
        }
        if !rename_no_replace(&temp, &path)? {
            return Ok(Assembled::Published);
        }
        // From an fstat after the rename, which moves the file's ctime on most filesystems.
        let record = file.metadata().and_then(|meta| write_record(&path, Record::of(hasher.finalize(), &meta)));
        match record {
            Ok(bytes) => Ok(Assembled::Written(range.end - range.start + bytes)),
            Err(e) => {
                // No record (a disk full between the two renames): the data file is taken back, or
                // it would stand as one being published for UNPUBLISHED_AGE, then be removed as
                // corrupt, and no assembly would replace it meanwhile.
                unpublish(&path, &file);
                Err(e)
            }
        }
    })();
    if !matches!(result, Ok(Assembled::Written(_))) {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Removes the data file at `path` if it is still `ours` (same device and inode): never another
/// process's, which only a crash-left file's cleanup could have put there meanwhile.
fn unpublish(path: &Path, ours: &File) {
    let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| (a.dev(), a.ino()) == (b.dev(), b.ino());
    if let (Ok(there), Ok(ours)) = (std::fs::symlink_metadata(path), ours.metadata()) {
        if same(&there, &ours) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Renames `from` to `to` unless something is at `to` already (`renameat2` with
/// `RENAME_NOREPLACE`): false then, and nothing moved. Publishing never replaces another
/// process's data file, which one of its readers may hold open (through passthrough) while its
/// record is about to follow; a stale one is removed by the open that finds it corrupt or old.
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two valid NUL-terminated paths that live across the call; no memory is handed over.
    let done =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if done == 0 {
        return Ok(true);
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        e => Err(e),
    }
}

/// A data file without a record younger than this (by its mtime, which nothing but its writer
/// sets) is being published by another process, between its rename and its record's; an older
/// one was left by a crash there and is removed as corrupt.
pub(crate) const UNPUBLISHED_AGE: Duration = Duration::from_secs(600);

/// What opening an extent file found.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The file, verified.
    Verified(File),
    /// The file and its record are there, but its stats or the boot differ from the record's: it
    /// needs a full CRC pass ([`check`]) before it may be used.
    Unchecked,
    /// No such file.
    Absent,
    /// A data file whose record is not written yet: another process is publishing it.
    Unpublished,
    /// The file is not the one recorded (or has no record and is old): it was removed.
    Corrupt(String),
    /// It could not be read.
    Io(io::Error),
}

/// Opens the extent file of `range` under `key` and checks it against its record (module note)
/// at the cost of two `stat`s and a 100-byte read; never reads the data. A file that fails is
/// removed with its record; one that needs a full pass is [`Opened::Unchecked`].
pub(crate) fn open_checked(root: &Path, key: &ObjectKey, range: &Range<u64>) -> Opened {
    match open_data(root, key, range) {
        Ok((file, meta, record)) if record.boot != 0 && Record::of(record.crc, &meta) == record => {
            touch(&meta_path(&extent_path(root, key, range)));
            Opened::Verified(file)
        }
        Ok(_) => Opened::Unchecked,
        Err(opened) => opened,
    }
}

/// [`open_checked`] with a full CRC pass where the stats or the boot differ: a match rewrites the
/// record (for this boot and these stats), so the next [`open_checked`] passes; a mismatch
/// removes the file. Reads the whole file: never on a thread that answers requests.
pub(crate) fn check(root: &Path, key: &ObjectKey, range: &Range<u64>) -> Opened {
    let path = extent_path(root, key, range);
    let (file, meta, record) = match open_data(root, key, range) {
        Ok(opened) => opened,
        Err(opened) => return opened,
    };
    if record.boot != 0 && Record::of(record.crc, &meta) == record {
        return Opened::Verified(file);
    }
    match crc_of(&file, meta.len()) {
        Ok(crc) if crc == record.crc => {
            // Same bytes, another boot, inode or time (a restored copy): recorded as it is now.
            let _ = write_record(&path, Record::of(crc, &meta));
            Opened::Verified(file)
        }
        Ok(_) => remove_corrupt(&path, "checksum mismatch".into()),
        Err(e) => Opened::Io(e),
    }
}

/// Removes a data file and its record: `why` they are corrupt.
fn remove_corrupt(path: &Path, why: String) -> Opened {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(meta_path(path));
    Opened::Corrupt(why)
}

/// The data file of `range` under `key` open, its stats, and its record if both are there and
/// agree on the length; else what [`open_checked`] answers.
fn open_data(root: &Path, key: &ObjectKey, range: &Range<u64>) -> Result<(File, std::fs::Metadata, Record), Opened> {
    let path = extent_path(root, key, range);
    // Not following a link, and not blocking on a FIFO planted in its place (then refused below).
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Opened::Absent),
        Err(e) => return Err(Opened::Io(e)),
    };
    let meta = file.metadata().map_err(Opened::Io)?;
    if !meta.is_file() || meta.len() != range.end - range.start {
        return Err(remove_corrupt(&path, format!("{} bytes, the extent has {}", meta.len(), range.end - range.start)));
    }
    let record = match read_record(&meta_path(&path)) {
        Ok(bytes) => Record::from_bytes(&bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let age = meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok());
            if age.is_none_or(|age| age < UNPUBLISHED_AGE) {
                return Err(Opened::Unpublished);
            }
            None
        }
        Err(e) => return Err(Opened::Io(e)),
    };
    match record {
        Some(record) if record.len == meta.len() => Ok((file, meta, record)),
        Some(record) => {
            Err(remove_corrupt(&path, format!("recorded {} bytes, the file has {}", record.len, meta.len())))
        }
        None => Err(remove_corrupt(&path, "no valid checksum record".into())),
    }
}

/// The CRC-32 of the first `len` bytes of `file`.
fn crc_of(file: &File, len: u64) -> io::Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = file.read_at(&mut buf[..(len - at).min(1 << 20) as usize], at)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hasher.finalize())
}

/// A record file opened as block files are: never through a link, never waiting on a FIFO, and
/// only if it is a regular file.
fn open_record(meta: &Path) -> io::Result<(File, std::fs::Metadata)> {
    let file =
        OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(meta)?;
    let stat = file.metadata()?;
    if !stat.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    Ok((file, stat))
}

/// The bytes of a record file, at most one more than a record's (so anything longer reads as no
/// valid record, not as a read without end). A link, a FIFO or anything but a regular file in its
/// place reads as no bytes: no valid record.
fn read_record(meta: &Path) -> io::Result<Vec<u8>> {
    let file = match open_record(meta) {
        Ok((file, _)) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) || e.kind() == io::ErrorKind::InvalidData => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::with_capacity(RECORD_LEN + 1);
    file.take(RECORD_LEN as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Refreshes a record's mtime (the extent's LRU age; the data file's own times are part of its
/// record and never touched) as a block hit refreshes its file's: through a descriptor of the
/// record itself, so never another file's a link would lead to.
fn touch(meta: &Path) {
    if let Ok((file, stat)) = open_record(meta) {
        store::touch_if_old(&file, &stat);
    }
}
