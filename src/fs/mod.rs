//! Filesystem operations (lookup, getattr, open, read, readdir, xattrs, access, statfs) as plain
//! methods returning plain results and [`FsError`], independent of the fuser bindings so they can be
//! tested without a mount (the adapter is [`crate::fuse`]).
//!
//! This file holds the operations on the tree; `error` the errno table, `read` what the bytes of
//! each kind of file are, `control` the `.stfs/stats.json` document.

mod control;
mod error;
mod read;
#[cfg(test)]
mod tests;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::engine::{DirectReader, Engine};
use crate::fs::control::{is_snapshot_ino, is_stats, Snapshot, StatsFile};
use crate::source::{KernelBytes, SourceId};
use crate::stats::Stats;
use crate::tree::namespace::{AttrBase, Content, Ino, Namespace, NodeKind, ROOT_INO};

pub use error::FsError;

/// Extended attributes every tensor file carries, in `listxattr` order.
pub const XATTRS: &[&str] =
    &["user.safetensors.dtype", "user.safetensors.shape", "user.safetensors.offset", "user.safetensors.shard"];

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
    /// The content is rendered anew at every lookup (stats.json), so the kernel must look the
    /// name up again on every path walk instead of caching the entry.
    pub renew_on_lookup: bool,
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

/// What `getxattr` and `listxattr` answer for a caller's buffer of a given size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    /// The caller offered no buffer (size 0): the bytes the answer needs.
    Size(u32),
    /// The value (or the NUL-terminated name list), which fits the caller's buffer.
    Data(Vec<u8>),
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

/// The mounted filesystem's state and operations.
pub struct Fs {
    ns: Namespace,
    engine: Arc<Engine>,
    base: AttrBase,
    control: StatsFile,
}

impl Fs {
    /// A filesystem over `ns`, reading tensor bytes through `engine`.
    pub fn new(ns: Namespace, engine: Arc<Engine>, base: AttrBase) -> Fs {
        let control = StatsFile::new(Arc::clone(engine.stats()));
        Fs { ns, engine, base, control }
    }

    /// The namespace served.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// The counters shared with the engine.
    pub fn stats(&self) -> &Arc<Stats> {
        self.engine.stats()
    }

    /// Whether some file's bytes reach the kernel as a range of a local file, which the adapter
    /// can splice ([`Fs::read_for_kernel`]).
    pub fn serves_file_ranges(&self) -> bool {
        self.engine.serves_mapped()
    }

    /// Finds `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let dir = self.ns.dir(parent).ok_or(if self.ns.node(parent).is_some() {
            FsError::NotDir
        } else {
            FsError::NotFound
        })?;
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| FsError::NotFound)?;
        let ino = match name {
            "." => parent,
            ".." => self.ns.node(parent).map_or(ROOT_INO, |n| n.parent),
            _ => dir.get(name).ok_or(FsError::NotFound)?,
        };
        if self.ns.node(ino).is_some_and(|n| is_stats(&n.kind)) {
            // Every open by path looks the name up first (entry TTL 0), so each opener gets a
            // document of its own, taken when it opened, under an inode of its own (or the one a
            // stat of the name just took, while unread: `control`).
            let (ino, snapshot) = self.control.look_up();
            return Ok(self.snapshot_attr(ino, &snapshot));
        }
        self.getattr(ino)
    }

    /// The attributes of the stats document's snapshot `snapshot`, inode `ino`.
    fn snapshot_attr(&self, ino: Ino, snapshot: &Snapshot) -> Attr {
        let b = &self.base;
        Attr {
            ino,
            size: snapshot.bytes.len() as u64,
            kind: Kind::File,
            perm: b.file_perm,
            nlink: 1,
            uid: b.uid,
            gid: b.gid,
            mtime: snapshot.taken,
            blksize: b.blksize,
            renew_on_lookup: true,
        }
    }

    /// Whether `ino` is a node of the tree or a stats snapshot the kernel may still hold.
    fn exists(&self, ino: Ino) -> bool {
        self.ns.node(ino).is_some() || self.snapshot(ino).is_some()
    }

    /// The stats snapshot of inode `ino`, if it is one.
    fn snapshot(&self, ino: Ino) -> Option<Snapshot> {
        is_snapshot_ino(ino).then(|| self.control.snapshot(ino)).flatten()
    }

    /// The kernel has forgotten `lookups` of its lookups of inode `ino`: a stats snapshot's
    /// document goes once every lookup answered with it is forgotten (the tree's own inodes live
    /// as long as the mount).
    pub fn forget(&self, ino: Ino, lookups: u64) {
        if is_snapshot_ino(ino) {
            self.control.forget(ino, lookups);
        }
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr, FsError> {
        if let Some(snapshot) = self.snapshot(ino) {
            return Ok(self.snapshot_attr(ino, &snapshot));
        }
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let b = &self.base;
        let (kind, size, perm, nlink) = match &node.kind {
            NodeKind::Dir(d) => (Kind::Dir, 0, b.dir_perm, 2 + d.subdirs()),
            NodeKind::File { size, .. } => (Kind::File, *size, b.file_perm, 1),
        };
        let attr = Attr {
            ino,
            size,
            kind,
            perm,
            nlink,
            uid: b.uid,
            gid: b.gid,
            mtime: b.mtime,
            blksize: b.blksize,
            renew_on_lookup: false,
        };
        if !is_stats(&node.kind) {
            return Ok(attr);
        }
        let latest = self.control.latest();
        Ok(Attr { size: latest.bytes.len() as u64, mtime: latest.taken, renew_on_lookup: true, ..attr })
    }

    /// Checks that file `ino` may be opened (`write`: for writing). Files hold no per-open state:
    /// any reader may read any file at any offset without opening it first.
    pub fn open(&self, ino: Ino, write: bool) -> Result<(), FsError> {
        Stats::add(&self.stats().kernel_open_requests, 1);
        if self.snapshot(ino).is_none() {
            let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
            if !matches!(node.kind, NodeKind::File { .. }) {
                return Err(FsError::IsDir);
            }
        }
        if write {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    /// Turns on whole tensor files on disk for FUSE passthrough ([`Fs::tensor_opened`]); false
    /// if the mount has no disk cache.
    pub fn enable_passthrough(&self) -> bool {
        self.engine.enable_extent_files()
    }

    /// Raw tensor file `ino`, or the re-served file of a shard that is not a local file, is
    /// opened: a verified file on local disk holding exactly its bytes (offset for offset), for the
    /// kernel to read directly, if the disk cache has one ready; otherwise the disk cache prepares
    /// one for a later open, off this thread (a whole shard: once every block of it is on disk).
    pub fn tensor_opened(&self, ino: Ino) -> Option<std::fs::File> {
        let (source, range) = self.cached_extent(ino)?;
        self.engine.extent_opened(source, range)
    }

    /// The source range file `ino` serves offset for offset from a disk cache extent: a raw
    /// tensor's, or a whole shard's re-served file when the shard is not a local file (a local
    /// file is handed over itself: [`Fs::checkpoint_opened`]).
    fn cached_extent(&self, ino: Ino) -> Option<(crate::source::SourceId, std::ops::Range<u64>)> {
        if let Some(t) = self.raw_tensor(ino) {
            return Some((t.source, t.start..t.start + t.len));
        }
        let (source, size) = self.whole_shard(ino)?;
        (!self.engine.source_is_local_file(source)).then_some((source, 0..size))
    }

    /// Whether `ino` is a re-served checkpoint file (a shard's whole file).
    pub fn is_checkpoint_file(&self, ino: Ino) -> bool {
        self.ns.node(ino).is_some_and(|n| matches!(n.kind, NodeKind::File { content: Content::Checkpoint(_), .. }))
    }

    /// Whether the mount re-serves a checkpoint file of a local file ([`Fs::checkpoint_opened`]
    /// may then hand it to the kernel).
    pub fn reserves_local_files(&self) -> bool {
        self.ns.shards().iter().any(|s| s.file.is_some() && self.engine.source_is_local_file(s.source))
    }

    /// Re-served checkpoint file `ino` is opened: the local file it re-serves (offset for
    /// offset), on a new descriptor checked against the file's pin at this open, for the kernel to
    /// read directly. `None` for every other file, a remote source, or a file rewritten or
    /// replaced since the mount (its reads then fail as they would without passthrough).
    pub fn checkpoint_opened(&self, ino: Ino) -> Option<std::fs::File> {
        let (source, size) = self.whole_shard(ino)?;
        self.engine.pinned_file(source, size)
    }

    /// Shard `shard`'s own local file, on a new descriptor checked against its pin now, for a reader
    /// in this process to map whole (the Python module's zero-copy load); `None` for a remote
    /// shard, a file on a network or FUSE filesystem (its page cache is not where reads ahead of
    /// the mapping's faults would land: read it through the engine, each byte fetched once), or a
    /// file rewritten or replaced since it was opened.
    pub fn shard_opened(&self, shard: usize) -> Option<std::fs::File> {
        let shard = self.ns.shards().get(shard)?;
        if !self.engine.source_is_local_file(shard.source) {
            return None;
        }
        self.engine.pinned_file(shard.source, shard.header.file_len)
    }

    /// Where raw tensor file `ino`'s bytes lie: `(source, start, len)`, offset N of the file being
    /// byte `start + N` of `source`, when they may be read past the block cache
    /// ([`Fs::read_direct`]); `None` for every other file (a view, the re-served file, a small
    /// file) and for a source the disk tier keeps (its reads go through blocks, which land on
    /// disk). No system call.
    pub fn direct_extent(&self, ino: Ino) -> Option<(SourceId, u64, u64)> {
        let node = self.ns.node(ino)?;
        let NodeKind::File { content: Content::Tensor(i), .. } = &node.kind else { return None };
        let t = self.ns.tensors().get(*i)?;
        self.engine.reads_directly(t.source).then_some((t.source, t.start, t.len))
    }

    /// A reader of `source`'s bytes past the block cache, on a descriptor of its own
    /// ([`Fs::read_direct`]).
    pub fn direct_reader(&self, source: SourceId) -> Option<DirectReader> {
        self.engine.direct_reader(source)
    }

    /// Fills `bufs`, one after the other, from `reader`'s source at `offset`, in one backing read,
    /// past the block cache (one copy: from the store into the caller's memory), counted as reads
    /// served. Offsets are the source's: a raw tensor file's as [`Fs::direct_extent`] gives them.
    pub fn read_direct(&self, reader: &mut DirectReader, offset: u64, bufs: &mut [&mut [u8]]) -> Result<(), FsError> {
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let stats = self.stats();
        match reader.read(offset, bufs) {
            Ok(()) => {
                Stats::add(&stats.fuse_reads, 1);
                Stats::add(&stats.fuse_read_bytes, bytes);
                Ok(())
            }
            Err(e) => {
                Stats::add(&stats.read_errors, 1);
                Err(FsError::Read(e))
            }
        }
    }

    /// Whether shard `shard` is a local file [`Fs::shard_opened`] hands out to map. No system call.
    pub fn shard_is_mappable(&self, shard: usize) -> bool {
        self.ns.shards().get(shard).is_some_and(|s| self.engine.source_is_local_file(s.source))
    }

    /// Whether `ino` is a re-served checkpoint file of a local file, which
    /// [`Fs::checkpoint_opened`] may hand to the kernel. No system call.
    pub fn is_local_checkpoint_file(&self, ino: Ino) -> bool {
        self.whole_shard(ino).is_some_and(|(source, _)| self.engine.source_is_local_file(source))
    }

    /// Whether the disk cache may hold file `ino` whole for the kernel ([`Fs::tensor_opened`]):
    /// a raw tensor file, or the re-served file of a shard that is not a local file. No system
    /// call.
    pub fn may_have_extent(&self, ino: Ino) -> bool {
        self.cached_extent(ino).is_some()
    }

    /// Whether `ino` is a tensor file (raw, `.npy` or F32 view): what a reader of tensors one by
    /// one opens, never small files, `metadata.json` or `stats.json`. No system call.
    pub fn is_tensor_file(&self, ino: Ino) -> bool {
        self.ns.node(ino).is_some_and(|n| {
            matches!(n.kind, NodeKind::File { content: Content::Tensor(_) | Content::Npy { .. } | Content::F32(_), .. })
        })
    }

    /// The source and length of re-served checkpoint file `ino`, when it is a shard's whole file.
    fn whole_shard(&self, ino: Ino) -> Option<(crate::source::SourceId, u64)> {
        let NodeKind::File { content: Content::Checkpoint(i), size } = &self.ns.node(ino)?.kind else { return None };
        let shard = self.ns.shards().get(*i).filter(|s| s.header.file_len == *size && *size > 0)?;
        Some((shard.source, *size))
    }

    /// File `ino` of [`Fs::tensor_opened`] was closed (not passed through): the disk cache may
    /// now assemble its file.
    pub fn tensor_closed(&self, ino: Ino) {
        if let Some((source, range)) = self.cached_extent(ino) {
            self.engine.extent_closed(source, range);
        }
    }

    /// The tensor `ino` serves raw (a tensor file, not a view), if it is one and not empty.
    fn raw_tensor(&self, ino: Ino) -> Option<&crate::tree::namespace::Tensor> {
        match &self.ns.node(ino)?.kind {
            NodeKind::File { content: Content::Tensor(i), .. } => self.ns.tensors().get(*i).filter(|t| t.len > 0),
            _ => None,
        }
    }

    /// Checks that `ino` is a directory that may be listed.
    pub fn opendir(&self, ino: Ino) -> Result<(), FsError> {
        match self.ns.node(ino).ok_or(FsError::NotFound)?.kind {
            NodeKind::Dir(_) => Ok(()),
            NodeKind::File { .. } => Err(FsError::NotDir),
        }
    }

    /// Reads up to `size` bytes at `offset` of file `ino`; short only at end of file.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        self.read_with(ino, offset, size, <[u8]>::to_vec)
    }

    /// Like [`Fs::read`], but hands the bytes to `reply` instead of returning a copy: a raw tensor
    /// range inside one cached block reaches `reply` without any copy in between.
    pub fn read_with<R>(&self, ino: Ino, offset: u64, size: u32, reply: impl FnOnce(&[u8]) -> R) -> Result<R, FsError> {
        self.read_dispatch(ino, offset, size, false, |bytes| reply(bytes.slice()))
    }

    /// Like [`Fs::read_with`] for a `reply` that hands the bytes to the kernel (`writev` or
    /// `splice` to the FUSE device) and **never reads them itself**: a raw tensor of a local file
    /// is then handed over as a range of the file, with a slice of the file's mapping
    /// ([`Engine::read_for_kernel`]), which a truncation of the file would turn into SIGBUS for a
    /// user-space read (the kernel's copy fails with EIO).
    pub fn read_for_kernel<R>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        reply: impl FnOnce(KernelBytes<'_>) -> R,
    ) -> Result<R, FsError> {
        self.read_dispatch(ino, offset, size, true, reply)
    }

    fn read_dispatch<R>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        to_kernel: bool,
        reply: impl FnOnce(KernelBytes<'_>) -> R,
    ) -> Result<R, FsError> {
        let stats = self.stats();
        if let Some(snapshot) = is_snapshot_ino(ino).then(|| self.control.read(ino)).flatten() {
            Stats::add(&stats.fuse_reads, 1);
            let bytes = read::slice_at(&snapshot.bytes, offset, size);
            Stats::add(&stats.fuse_read_bytes, bytes.len() as u64);
            return Ok(reply(bytes.into()));
        }
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let NodeKind::File { content, size: file_size } = &node.kind else { return Err(FsError::IsDir) };
        let mut sent = 0;
        // Counted before the reply goes out, so a reader that looks at stats.json right after its
        // read returned sees that read.
        let counted = |data: KernelBytes<'_>| {
            sent = data.len();
            Stats::add(&stats.fuse_reads, 1);
            Stats::add(&stats.fuse_read_bytes, data.len() as u64);
            reply(data)
        };
        let source = read::Source { ns: &self.ns, engine: &self.engine, control: &self.control, to_kernel };
        let result = source.read_content(content, offset, size, counted);
        match &result {
            Ok(_) => debug_assert!(matches!(content, Content::Stats) || sent as u64 <= *file_size),
            Err(_) => Stats::add(&stats.read_errors, 1),
        }
        result
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

    /// The tensor a file serves (raw, `.npy` or F32), for xattrs.
    fn tensor_of(&self, ino: Ino) -> Result<Option<usize>, FsError> {
        if self.snapshot(ino).is_some() {
            return Ok(None);
        }
        Ok(match &self.ns.node(ino).ok_or(FsError::NotFound)?.kind {
            NodeKind::File { content: Content::Tensor(i), .. } => Some(*i),
            NodeKind::File { content: Content::Npy { tensor, .. }, .. } => Some(*tensor),
            NodeKind::File { content: Content::F32(i), .. } => Some(*i),
            _ => None,
        })
    }

    /// The names of the extended attributes of `ino`, each NUL-terminated, for a buffer of `size`.
    pub fn listxattr(&self, ino: Ino, size: u32) -> Result<Xattr, FsError> {
        let names: &[&str] = if self.tensor_of(ino)?.is_some() { XATTRS } else { &[] };
        fit(names.iter().flat_map(|n| n.bytes().chain([0])).collect(), size)
    }

    /// The value of extended attribute `name` of `ino`, for a buffer of `size`.
    pub fn getxattr(&self, ino: Ino, name: &OsStr, size: u32) -> Result<Xattr, FsError> {
        if !name.as_bytes().starts_with(b"user.") {
            // Only the user namespace exists here. Saying so (EOPNOTSUPP, not ENODATA) lets tools
            // such as `ls -l` stop asking for security.selinux on every file of the mount.
            return Err(if self.exists(ino) { FsError::XattrNamespace } else { FsError::NotFound });
        }
        let i = self.tensor_of(ino)?.ok_or(FsError::NoXattr)?;
        let t = self.ns.tensors().get(i).ok_or(FsError::NoXattr)?;
        let value = match name.as_bytes() {
            b"user.safetensors.dtype" => t.dtype.name().to_string(),
            b"user.safetensors.shape" => serde_json::to_string(&t.shape).unwrap_or_default(),
            b"user.safetensors.offset" => t.start.to_string(),
            b"user.safetensors.shard" => self.ns.shards()[t.shard].name.clone(),
            _ => return Err(FsError::NoXattr),
        };
        fit(value.into_bytes(), size)
    }

    /// The value of [`PASSTHROUGH_XATTR`] of `ino`, for a buffer of `size`: "1" when the fuse
    /// layer says the file's opens are `handed_over` to the kernel (FUSE passthrough), else "0".
    pub fn passthrough_xattr(&self, ino: Ino, handed_over: bool, size: u32) -> Result<Xattr, FsError> {
        if !self.exists(ino) {
            return Err(FsError::NotFound);
        }
        fit(if handed_over { b"1".to_vec() } else { b"0".to_vec() }, size)
    }

    /// Checks an `access` mask: any write request is refused, and so is execute on a file (files
    /// have no execute bits; directories have them all).
    pub fn access(&self, ino: Ino, write: bool, execute: bool) -> Result<(), FsError> {
        if !self.exists(ino) {
            return Err(FsError::NotFound);
        }
        if write {
            return Err(FsError::ReadOnly);
        }
        if execute && self.ns.dir(ino).is_none() {
            return Err(FsError::AccessDenied);
        }
        Ok(())
    }

    /// Filesystem totals.
    pub fn statfs(&self) -> StatFs {
        // Saturating: shards a server claims to be huge could otherwise overflow the total.
        let bytes = self.ns.tensors().iter().fold(0u64, |total, t| total.saturating_add(t.len));
        let bsize = self.base.blksize.max(1);
        StatFs {
            blocks: bytes.div_ceil(u64::from(bsize)),
            files: self.ns.len() as u64,
            bsize,
            namelen: crate::tree::names::NAME_MAX as u32,
        }
    }
}

/// An extended attribute of every file, not listed: "1" while the file's opens are handed to the
/// kernel (FUSE passthrough: its reads and mappings never reach the daemon), "0" otherwise. How
/// `stfs.load` knows a re-served file may be mapped once and used in place.
pub const PASSTHROUGH_XATTR: &str = "user.stfs.passthrough";

/// An xattr answer for a buffer of `size` bytes: the size needed when `size` is 0, the bytes when
/// they fit, else [`FsError::XattrTooLarge`].
fn fit(bytes: Vec<u8>, size: u32) -> Result<Xattr, FsError> {
    if size == 0 {
        Ok(Xattr::Size(u32::try_from(bytes.len()).unwrap_or(u32::MAX)))
    } else if bytes.len() <= size as usize {
        Ok(Xattr::Data(bytes))
    } else {
        Err(FsError::XattrTooLarge { needed: bytes.len(), offered: size })
    }
}
