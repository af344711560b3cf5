//! Opening a cache directory at mount: created mode 0700 if missing, refused when another user
//! owns it or anyone else may write to it (they could plant blocks that pass their checksum), and
//! the default bound on what it holds.

use std::fmt;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// The default bound is this share (in percent) of the free space on the cache directory's
/// filesystem at mount time, plus what the cache already holds (so a restart does not shrink it)...
pub const DEFAULT_LIMIT_PERCENT: u64 = 10;
/// ...and at most this: 256 GiB, a few large checkpoints.
pub const DEFAULT_LIMIT_MAX: u64 = 256 << 30;
/// Smallest bound accepted: one 4 MiB block and its header would not fit in less.
pub const MIN_LIMIT: u64 = 1 << 20;

/// A cache directory that cannot be used.
#[derive(Debug)]
pub enum DiskCacheError {
    /// It could not be created or examined.
    Io(io::Error),
    /// It exists but is not a directory.
    NotADirectory,
    /// Another user owns it.
    ForeignOwner {
        /// Its owner.
        owner: u32,
        /// Who mounts.
        user: u32,
    },
    /// The group or others may write to it.
    Writable {
        /// Its permission bits.
        mode: u32,
    },
    /// A `--cache-dir-size` below [`MIN_LIMIT`].
    TooSmall {
        /// The size asked for.
        size: u64,
    },
}

impl fmt::Display for DiskCacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskCacheError::Io(e) => write!(f, "cache directory: {}", crate::util::describe_io(e)),
            DiskCacheError::NotADirectory => f.write_str("cache directory: not a directory"),
            DiskCacheError::ForeignOwner { owner, user } => write!(
                f,
                "cache directory is owned by uid {owner}, not by the mounting user (uid {user}); refusing to use it"
            ),
            DiskCacheError::Writable { mode } => write!(
                f,
                "cache directory is writable by group or others (mode {mode:04o}); refusing to use it (chmod 700 it)"
            ),
            DiskCacheError::TooSmall { size } => {
                write!(f, "cache directory size {size} bytes is below the least accepted, {MIN_LIMIT} (1M)")
            }
        }
    }
}

impl std::error::Error for DiskCacheError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DiskCacheError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Creates `dir` (mode 0700; its parents as usual) if it is missing, then checks that it is a
/// directory owned by this process's effective user that nobody else may write to.
pub(crate) fn prepare(dir: &Path) -> Result<(), DiskCacheError> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(DiskCacheError::Io)?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                // Another mount created it in between: check it like any existing one.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(DiskCacheError::Io(e)),
            }
        }
        Err(e) => return Err(DiskCacheError::Io(e)),
        Ok(_) => {}
    }
    let meta = std::fs::metadata(dir).map_err(DiskCacheError::Io)?;
    if !meta.is_dir() {
        return Err(DiskCacheError::NotADirectory);
    }
    // SAFETY: geteuid has no preconditions.
    let user = unsafe { libc::geteuid() };
    if meta.uid() != user {
        return Err(DiskCacheError::ForeignOwner { owner: meta.uid(), user });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(DiskCacheError::Writable { mode: meta.mode() & 0o7777 });
    }
    Ok(())
}

/// Bytes free to this user on `dir`'s filesystem (0 if unknown).
pub(crate) fn free_bytes(dir: &Path) -> u64 {
    let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str())) else { return 0 };
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills `s`; `c` is a valid C string for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return 0;
    }
    (s.f_bavail as u64).saturating_mul(s.f_frsize as u64)
}

/// The default bound: [`DEFAULT_LIMIT_PERCENT`] of `free` plus `stored`, at most
/// [`DEFAULT_LIMIT_MAX`] and at least [`MIN_LIMIT`].
pub fn default_limit(free: u64, stored: u64) -> u64 {
    (free / 100 * DEFAULT_LIMIT_PERCENT).saturating_add(stored).clamp(MIN_LIMIT, DEFAULT_LIMIT_MAX)
}
