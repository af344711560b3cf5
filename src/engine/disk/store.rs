//! The disk tier's files: where a block lives (its key and the layout), its header with a CRC-32
//! of its bytes, the atomic write (a temporary name in the same folder, then a rename) and the
//! verified read.
//!
//! Layout under the cache directory `DIR`:
//!
//! ```text
//! DIR/lock                      flock'd by whoever evicts or clears (never by readers or writers)
//! DIR/objects/ab/KEY-BLOCK      one block: a 16-byte header, then the block's bytes
//! DIR/objects/ab/.KEY-BLOCK.PID.N.tmp   a block being written (renamed into place when whole)
//! ```
//!
//! `KEY` is 32 hex digits of the SHA-256 of the source's identity and the block size
//! ([`ObjectKey`]), `ab` its first two, `BLOCK` the block index in decimal. The header is the magic
//! `STFSBLK2`, the CRC-32 of the file's own name (`KEY-BLOCK`) followed by the bytes, and their
//! length (both little-endian u32). A reader opens the file without following a link or blocking
//! (a FIFO), takes only a regular file, and checks its size, the magic, the length and the CRC,
//! so a torn, truncated or overwritten file, and a valid block under another block's name (copied
//! or linked there), is a miss (and is removed), never served. Writes are not fsync'd: a block a
//! power loss tore fails its CRC and is fetched again, and an fsync per block would cost a
//! flush of the disk for every few MiB read.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

/// The first bytes of every block file (format version 2: the CRC covers the file's name; a
/// version 1 file reads as corrupt, is removed and fetched again).
pub(crate) const MAGIC: &[u8; 8] = b"STFSBLK2";
/// Bytes before a block's data: magic, CRC-32, length.
pub(crate) const HEADER_LEN: usize = 16;
/// The folder of block files under the cache directory.
pub(crate) const OBJECTS: &str = "objects";
/// The lock file under the cache directory.
pub(crate) const LOCK: &str = "lock";
/// Hex digits of a key.
const KEY_HEX: usize = 32;
/// A hit refreshes the file's mtime (its LRU age) only if it is older than this, so a block read
/// over and over costs one `futimens` a minute, not one per read.
pub(crate) const TOUCH_AFTER: Duration = Duration::from_secs(60);

/// What one source's blocks are stored under: 32 hex digits of SHA-256(identity, block size).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey(String);

impl ObjectKey {
    /// The key of a source with `identity` ([`crate::source::Source::cache_identity`]) read in
    /// blocks of `block_size` (blocks of another size are other files).
    pub fn new(identity: &str, block_size: u64) -> ObjectKey {
        let text = format!("stfs-disk-cache-v1\n{identity}\nblock-size={block_size}");
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        ObjectKey(hex[..KEY_HEX].to_string())
    }

    /// The hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The folder a key's blocks live in.
pub(crate) fn fanout(root: &Path, key: &ObjectKey) -> PathBuf {
    root.join(OBJECTS).join(&key.0[..2])
}

/// The file of block `block` of `key`.
pub(crate) fn block_path(root: &Path, key: &ObjectKey, block: u64) -> PathBuf {
    fanout(root, key).join(format!("{}-{block}", key.0))
}

/// Whether a file name is a block file's (`KEY-BLOCK`).
pub(crate) fn is_block_name(name: &str) -> bool {
    match name.split_once('-') {
        Some((key, block)) => {
            key.len() == KEY_HEX
                && key.bytes().all(|b| b.is_ascii_hexdigit())
                && !block.is_empty()
                && block.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// Whether a file name is a temporary file's (a write in progress, or left by a crash).
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Why a block could not be read from disk.
#[derive(Debug)]
pub(crate) enum Miss {
    /// No such file: never written, or evicted.
    Absent,
    /// The file is there but is not a whole, verified block of the expected length.
    Corrupt(String),
    /// It could not be read (permissions, I/O error).
    Io(io::Error),
}

/// Reads block file `path` into `buf` (sized to the block's expected length) and verifies it.
/// A hit older than [`TOUCH_AFTER`] gets its mtime set to now: the LRU clock eviction sorts by.
pub(crate) fn read_block(path: &Path, buf: &mut [u8]) -> Result<(), Miss> {
    // Never through a link, and never waiting on a FIFO someone left in its place.
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let mut file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Miss::Absent),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Miss::Corrupt("a symbolic link".into())),
        Err(e) => return Err(Miss::Io(e)),
    };
    let meta = file.metadata().map_err(Miss::Io)?;
    if !meta.is_file() {
        return Err(Miss::Corrupt("not a regular file".into()));
    }
    let want = (HEADER_LEN + buf.len()) as u64;
    if meta.len() != want {
        return Err(Miss::Corrupt(format!("{} bytes, a whole block file has {want}", meta.len())));
    }
    let mut header = [0u8; HEADER_LEN];
    read_exact_or_corrupt(&mut file, &mut header)?;
    let (crc, len) = parse_header(&header).ok_or_else(|| Miss::Corrupt("bad magic".into()))?;
    if len as usize != buf.len() {
        return Err(Miss::Corrupt(format!("holds {len} bytes, the block has {}", buf.len())));
    }
    read_exact_or_corrupt(&mut file, buf)?;
    if checksum(&file_name(path), buf) != crc {
        return Err(Miss::Corrupt("checksum mismatch".into()));
    }
    touch_if_old(&file, &meta);
    Ok(())
}

/// Sets `file`'s mtime (the LRU clock eviction sorts by) to now if `meta` shows it older than
/// [`TOUCH_AFTER`]. Advice for eviction only: a failure leaves the file a little older than it is.
pub(crate) fn touch_if_old(file: &File, meta: &std::fs::Metadata) {
    let now = SystemTime::now();
    if meta.modified().is_ok_and(|m| now.duration_since(m).is_ok_and(|age| age > TOUCH_AFTER)) {
        let _ = file.set_modified(now);
    }
}

fn read_exact_or_corrupt(file: &mut File, buf: &mut [u8]) -> Result<(), Miss> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => Miss::Corrupt("truncated".into()),
        _ => Miss::Io(e),
    })
}

/// The header of the block file named `name` (`KEY-BLOCK`) holding `data`.
pub(crate) fn header(name: &str, data: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&checksum(name, data).to_le_bytes());
    // A block is at most 1 GiB (MAX_BLOCK_SIZE), so its length fits a u32.
    h[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
    h
}

/// The CRC-32 of a block file's name and then its bytes: a valid block under another block's name
/// fails it.
fn checksum(name: &str, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(name.as_bytes());
    hasher.update(data);
    hasher.finalize()
}

/// The last component of a block file's path, as its name.
fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The CRC and length in a header, if its magic is right.
fn parse_header(h: &[u8; HEADER_LEN]) -> Option<(u32, u32)> {
    if &h[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(h[8..12].try_into().ok()?);
    let len = u32::from_le_bytes(h[12..16].try_into().ok()?);
    Some((crc, len))
}

/// Numbers this process's temporary files.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A new temporary file for `path` (`.NAME.PID.N.tmp` in its folder, which is created mode 0700
/// if missing), created mode 0600: written whole, then renamed over `path`.
pub(crate) fn temp_file(path: &Path) -> io::Result<(PathBuf, File)> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), TEMP_SEQ.fetch_add(1, Relaxed)));
    let create = || OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temp);
    let file = match create() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            create()?
        }
        other => other?,
    };
    Ok((temp, file))
}

/// Writes block `block` of `key` atomically: to a [`temp_file`] in the block's folder, then
/// renamed over the final name, so a reader in any process sees the whole block or no file.
/// Returns the bytes the file takes. On any failure the temporary file is removed.
pub(crate) fn write_block(root: &Path, key: &ObjectKey, block: u64, data: &[u8]) -> io::Result<u64> {
    let path = block_path(root, key, block);
    let (temp, mut file) = temp_file(&path)?;
    let written = file.write_all(&header(&file_name(&path), data)).and_then(|()| file.write_all(data));
    drop(file);
    let result = written.and_then(|()| std::fs::rename(&temp, &path));
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result.map(|()| (HEADER_LEN + data.len()) as u64)
}
