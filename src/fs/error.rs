//! `FsError`: why a filesystem operation failed, and the crate's only errno table.
//!
//! Every errno the kernel receives for a failed request comes from [`FsError::errno`], an
//! exhaustive match, so a new failure must choose its errno here.

use std::fmt;

use crate::engine::ReadError;
use crate::format::Dtype;

/// Why an operation failed; each maps to one errno.
#[derive(Debug)]
pub enum FsError {
    /// No such inode or name.
    NotFound,
    /// A directory operation on a file.
    NotDir,
    /// A file operation on a directory.
    IsDir,
    /// Any attempt to modify the read-only mount.
    ReadOnly,
    /// A permission the node does not have (execute, on a file).
    AccessDenied,
    /// The node has no such extended attribute.
    NoXattr,
    /// Extended attributes outside the `user.` namespace are not supported.
    XattrNamespace,
    /// The attribute value or name list is longer than the caller's buffer.
    XattrTooLarge {
        /// Bytes needed.
        needed: usize,
        /// Bytes the caller offered.
        offered: u32,
    },
    /// Reading the backing source failed (I/O error, or the file changed since mount).
    Read(ReadError),
    /// The F32 view of a tensor that exists could not be computed (its dtype does not convert, or
    /// the range overflows). Never for a namespace built by `Namespace::build`, which offers the view
    /// only for convertible dtypes; an internal failure on a file that exists, so EIO, not ENOENT.
    Convert {
        /// The tensor's name.
        tensor: String,
        /// Its stored dtype.
        dtype: Dtype,
        /// The offset asked for in the converted file.
        offset: u64,
    },
}

impl FsError {
    /// The errno the kernel receives. Exhaustive on purpose: a new variant must choose one.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::AccessDenied => libc::EACCES,
            FsError::NoXattr => libc::ENODATA,
            FsError::XattrNamespace => libc::EOPNOTSUPP,
            // What getxattr(2) and listxattr(2) answer for a buffer that is too small.
            FsError::XattrTooLarge { .. } => libc::ERANGE,
            // A changed or failing backing file can no longer be served correctly: EIO, never stale bytes.
            FsError::Read(_) => libc::EIO,
            // The file exists; the failure is ours, not a missing name.
            FsError::Convert { .. } => libc::EIO,
        }
    }

    /// Whether the failure is worth a warning in the log (a read that went wrong) rather than an
    /// ordinary answer (a miss, a refused write).
    pub fn is_failure(&self) -> bool {
        match self {
            FsError::Read(_) | FsError::Convert { .. } => true,
            FsError::NotFound
            | FsError::NotDir
            | FsError::IsDir
            | FsError::ReadOnly
            | FsError::AccessDenied
            | FsError::NoXattr
            | FsError::XattrNamespace
            | FsError::XattrTooLarge { .. } => false,
        }
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsError::NotFound => f.write_str("no such file or directory"),
            FsError::NotDir => f.write_str("not a directory"),
            FsError::IsDir => f.write_str("is a directory"),
            FsError::ReadOnly => f.write_str("read-only file system"),
            FsError::AccessDenied => f.write_str("permission denied"),
            FsError::NoXattr => f.write_str("no such attribute"),
            FsError::XattrNamespace => f.write_str("attribute namespace not supported"),
            FsError::XattrTooLarge { needed, offered } => {
                write!(f, "attribute needs {needed} bytes, the buffer holds {offered}")
            }
            FsError::Read(e) => write!(f, "{e}"),
            FsError::Convert { tensor, dtype, offset } => {
                write!(f, "tensor {tensor:?}: {} cannot be converted to F32 at byte {offset}", dtype.name())
            }
        }
    }
}

impl std::error::Error for FsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FsError::Read(e) => Some(e),
            _ => None,
        }
    }
}
