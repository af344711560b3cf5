//! Filesystem operations (lookup, getattr, open, read, readdir, xattrs, statfs) as plain functions
//! returning plain results, independent of the fuser bindings so they can be tested without a mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::engine::{Engine, ReadError};
use crate::namespace::{AttrBase, Content, Ino, Namespace, NodeKind, ROOT_INO};
use crate::stats::Stats;

/// Extended attributes every tensor file carries, in `listxattr` order.
pub const XATTRS: &[&str] = &["user.safetensors.dtype", "user.safetensors.shape", "user.safetensors.offset", "user.safetensors.shard"];

/// Kind of a node, as stat shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
}

/// The attributes of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Size in bytes.
    pub size: u64,
    /// File or directory.
    pub kind: Kind,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification (and change, and access) time: the backing file's mtime.
    pub mtime: SystemTime,
    /// Preferred I/O size: the engine's block size.
    pub blksize: u32,
}

/// The reply to `open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The new file handle.
    pub fh: u64,
    /// Reply FOPEN_DIRECT_IO: only for files whose length is not known in advance (stats).
    pub direct_io: bool,
}

/// One directory entry returned by `readdir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode of the entry.
    pub ino: Ino,
    /// The offset to resume after this entry.
    pub next_offset: u64,
    /// File or directory.
    pub kind: Kind,
    /// Its name.
    pub name: String,
}

/// Filesystem-level statistics for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Total size in units of `bsize`.
    pub blocks: u64,
    /// Number of inodes.
    pub files: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

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
    /// A file handle that `open` never returned, or that was released.
    BadHandle,
    /// The node has no such extended attribute.
    NoXattr,
    /// Extended attributes outside the `user.` namespace are not supported.
    XattrNamespace,
    /// Reading the backing source failed (I/O error, or the file changed since mount).
    Read(ReadError),
}

impl FsError {
    /// The errno the kernel receives. Exhaustive on purpose: a new variant must choose one.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::BadHandle => libc::EBADF,
            FsError::NoXattr => libc::ENODATA,
            FsError::XattrNamespace => libc::EOPNOTSUPP,
            // A changed or failing backing file can no longer be served correctly: EIO, never stale bytes.
            FsError::Read(_) => libc::EIO,
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
            FsError::BadHandle => f.write_str("bad file handle"),
            FsError::NoXattr => f.write_str("no such attribute"),
            FsError::XattrNamespace => f.write_str("attribute namespace not supported"),
            FsError::Read(e) => write!(f, "{e}"),
        }
    }
}

/// The mounted filesystem's state and operations.
pub struct Fs {
    ns: Namespace,
    engine: Arc<Engine>,
    base: AttrBase,
    next_fh: AtomicU64,
    /// Per-handle snapshots of files rendered at open time (stats), so one read sequence is consistent.
    snapshots: Mutex<HashMap<u64, Arc<[u8]>>>,
}

impl Fs {
    /// A filesystem over `ns`, reading tensor bytes through `engine`.
    pub fn new(ns: Namespace, engine: Arc<Engine>, base: AttrBase) -> Fs {
        Fs { ns, engine, base, next_fh: AtomicU64::new(1), snapshots: Mutex::new(HashMap::new()) }
    }

    /// The namespace served.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// The counters shared with the engine.
    pub fn stats(&self) -> &Arc<Stats> {
        self.engine.stats()
    }

    /// Finds `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let dir = self.ns.dir(parent).ok_or(if self.ns.node(parent).is_some() { FsError::NotDir } else { FsError::NotFound })?;
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| FsError::NotFound)?;
        let ino = match name {
            "." => parent,
            ".." => self.ns.node(parent).map_or(ROOT_INO, |n| n.parent),
            _ => dir.get(name).ok_or(FsError::NotFound)?,
        };
        self.getattr(ino)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr, FsError> {
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let b = &self.base;
        let (kind, size, perm, nlink) = match &node.kind {
            NodeKind::Dir(d) => {
                let subdirs = d.entries().iter().filter(|(_, i)| self.ns.dir(*i).is_some()).count() as u32;
                (Kind::Dir, 0, b.dir_perm, 2 + subdirs)
            }
            NodeKind::File { size, .. } => (Kind::File, *size, b.file_perm, 1),
        };
        Ok(Attr { ino, size, kind, perm, nlink, uid: b.uid, gid: b.gid, mtime: b.mtime, blksize: b.blksize })
    }

    /// Opens a file for reading; `write` is whether the caller asked for write access.
    pub fn open(&self, ino: Ino, write: bool) -> Result<Opened, FsError> {
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let NodeKind::File { content, .. } = &node.kind else { return Err(FsError::IsDir) };
        if write {
            return Err(FsError::ReadOnly);
        }
        let fh = self.next_fh.fetch_add(1, Relaxed);
        let direct_io = matches!(content, Content::Stats);
        if direct_io {
            let mut json = serde_json::to_vec_pretty(&self.stats().to_json()).unwrap_or_default();
            json.push(b'\n');
            self.lock_snapshots().insert(fh, json.into());
        }
        Ok(Opened { fh, direct_io })
    }

    /// Forgets a handle returned by [`Fs::open`].
    pub fn release(&self, fh: u64) {
        self.lock_snapshots().remove(&fh);
    }

    /// Reads up to `size` bytes at `offset` of file `ino`; short only at end of file.
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        self.read_with(ino, fh, offset, size, <[u8]>::to_vec)
    }

    /// Like [`Fs::read`], but hands the bytes to `reply` instead of returning a copy: a raw tensor
    /// range inside one cached block reaches `reply` without any copy in between.
    pub fn read_with<R>(&self, ino: Ino, fh: u64, offset: u64, size: u32, reply: impl FnOnce(&[u8]) -> R) -> Result<R, FsError> {
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let NodeKind::File { content, size: file_size } = &node.kind else { return Err(FsError::IsDir) };
        let mut sent = 0;
        let counted = |data: &[u8]| {
            sent = data.len();
            reply(data)
        };
        let result = match content {
            Content::Tensor(i) => self.read_tensor(*i, offset, size, counted),
            Content::Npy { tensor, header } => self.read_with_prefix(header, *tensor, offset, size).map(|v| counted(&v)),
            Content::F32(i) => self.read_converted(*i, offset, size).map(|v| counted(&v)),
            Content::Bytes(bytes) => Ok(counted(slice_at(bytes, offset, size))),
            Content::Stats => {
                let snapshot = self.lock_snapshots().get(&fh).cloned().ok_or(FsError::BadHandle)?;
                Ok(counted(slice_at(&snapshot, offset, size)))
            }
        };
        let stats = self.stats();
        match &result {
            Ok(_) => {
                Stats::add(&stats.fuse_reads, 1);
                Stats::add(&stats.fuse_read_bytes, sent as u64);
                debug_assert!(matches!(content, Content::Stats) || sent as u64 <= *file_size);
            }
            Err(_) => Stats::add(&stats.read_errors, 1),
        }
        result
    }

    /// Bytes `[offset, offset+size)` of tensor `i`, clipped to its length, handed to `reply`.
    fn read_tensor<R>(&self, i: usize, offset: u64, size: u32, reply: impl FnOnce(&[u8]) -> R) -> Result<R, FsError> {
        let t = self.ns.tensors().get(i).ok_or(FsError::NotFound)?;
        if offset >= t.len {
            return Ok(reply(&[]));
        }
        let n = (t.len - offset).min(u64::from(size)) as usize;
        self.engine.read_with(t.source, t.start + offset, n, reply).map_err(FsError::Read)
    }

    /// Bytes `[offset, offset+size)` of tensor `i` converted to F32: the whole source elements that
    /// cover the range are read through the engine, converted, and trimmed.
    fn read_converted(&self, i: usize, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let t = self.ns.tensors().get(i).ok_or(FsError::NotFound)?;
        let elements = t.shape.iter().product::<u64>();
        let out_len = crate::convert::converted_len(t.dtype, elements).unwrap_or(0);
        if offset >= out_len {
            return Ok(Vec::new());
        }
        let size = (out_len - offset).min(u64::from(size));
        let (first, count) = crate::convert::source_range_for(t.dtype, offset, size);
        let count = count.min(elements.saturating_sub(first));
        let (byte_start, byte_len) = crate::convert::source_byte_range(t.dtype, first, count).ok_or(FsError::NotFound)?;
        let src = self.engine.read(t.source, t.start + byte_start, byte_len as usize).map_err(FsError::Read)?;
        let mut out = Vec::with_capacity(count as usize * 4);
        // The dtype was checked convertible when the namespace was built.
        if crate::convert::convert_to_f32(t.dtype, &src, &mut out).is_err() {
            return Err(FsError::NotFound);
        }
        let skip = (offset - 4 * first) as usize;
        out.drain(..skip.min(out.len()));
        out.truncate(size as usize);
        Ok(out)
    }

    /// A synthesized `prefix` followed by the bytes of tensor `i` (the `.npy` view).
    fn read_with_prefix(&self, prefix: &[u8], i: usize, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let mut out = slice_at(prefix, offset, size).to_vec();
        let rest = size - out.len() as u32;
        if rest > 0 {
            let tensor_offset = offset.saturating_sub(prefix.len() as u64);
            self.read_tensor(i, tensor_offset, rest, |bytes| out.extend_from_slice(bytes))?;
        }
        Ok(out)
    }

    /// Passes the entries of directory `ino` after `offset` (0 starts with `.` and `..`) to `add`
    /// until it returns `true` (the reply buffer is full); nothing is built for entries not sent.
    pub fn readdir(&self, ino: Ino, offset: u64, mut add: impl FnMut(DirEntry) -> bool) -> Result<(), FsError> {
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let NodeKind::Dir(dir) = &node.kind else { return Err(FsError::NotDir) };
        let dots = [(".", ino), ("..", node.parent)];
        let all = dots.into_iter().chain(dir.entries().iter().map(|(n, i)| (n.as_str(), *i)));
        for (i, (name, child)) in all.enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX)) {
            let kind = if self.ns.dir(child).is_some() { Kind::Dir } else { Kind::File };
            if add(DirEntry { ino: child, next_offset: i as u64 + 1, kind, name: name.to_string() }) {
                break;
            }
        }
        Ok(())
    }

    /// The tensor a file serves (raw or `.npy`), for xattrs.
    fn tensor_of(&self, ino: Ino) -> Result<Option<usize>, FsError> {
        Ok(match &self.ns.node(ino).ok_or(FsError::NotFound)?.kind {
            NodeKind::File { content: Content::Tensor(i), .. } => Some(*i),
            NodeKind::File { content: Content::Npy { tensor, .. }, .. } => Some(*tensor),
            NodeKind::File { content: Content::F32(i), .. } => Some(*i),
            _ => None,
        })
    }

    /// Names of the extended attributes of `ino`.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<&'static str>, FsError> {
        Ok(if self.tensor_of(ino)?.is_some() { XATTRS.to_vec() } else { Vec::new() })
    }

    /// The value of extended attribute `name` of `ino`.
    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>, FsError> {
        if !name.as_bytes().starts_with(b"user.") {
            // Only the user namespace exists here. Saying so (EOPNOTSUPP, not ENODATA) lets tools
            // such as `ls -l` stop asking for security.selinux on every file of the mount.
            self.ns.node(ino).ok_or(FsError::NotFound)?;
            return Err(FsError::XattrNamespace);
        }
        let i = self.tensor_of(ino)?.ok_or(FsError::NoXattr)?;
        let t = &self.ns.tensors()[i];
        let value = match name.as_bytes() {
            b"user.safetensors.dtype" => t.dtype.name().to_string(),
            b"user.safetensors.shape" => serde_json::to_string(&t.shape).unwrap_or_default(),
            b"user.safetensors.offset" => t.start.to_string(),
            b"user.safetensors.shard" => self.ns.shards()[t.shard].name.clone(),
            _ => return Err(FsError::NoXattr),
        };
        Ok(value.into_bytes())
    }

    /// Checks an `access` mask: any write request is refused.
    pub fn access(&self, ino: Ino, write: bool) -> Result<(), FsError> {
        self.ns.node(ino).ok_or(FsError::NotFound)?;
        if write {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Filesystem totals.
    pub fn statfs(&self) -> StatFs {
        let bytes: u64 = self.ns.tensors().iter().map(|t| t.len).sum();
        let bsize = self.base.blksize.max(1);
        StatFs { blocks: bytes.div_ceil(u64::from(bsize)), files: self.ns.len() as u64, bsize, namelen: crate::names::NAME_MAX as u32 }
    }

    fn lock_snapshots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<[u8]>>> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `bytes[offset..offset+size]`, clipped to the slice (empty past its end).
fn slice_at(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}
