//! Filesystem operations (lookup, getattr, open, read, readdir, xattrs, statfs) as plain functions
//! returning plain results, independent of the fuser bindings so they can be tested without a mount.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::engine::{Engine, ReadError};
use crate::stats::Stats;
use crate::tree::namespace::{AttrBase, Content, Ino, Namespace, NodeKind, ROOT_INO};

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
    /// The stats document as rendered at the last lookup of stats.json, and when.
    stats_snapshot: Mutex<(Arc<[u8]>, SystemTime)>,
}

impl Fs {
    /// A filesystem over `ns`, reading tensor bytes through `engine`.
    pub fn new(ns: Namespace, engine: Arc<Engine>, base: AttrBase) -> Fs {
        let fs = Fs { ns, engine, base, stats_snapshot: Mutex::new((Arc::from(&[][..]), SystemTime::UNIX_EPOCH)) };
        fs.renew_stats_snapshot();
        fs
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
            // Every open by path looks the name up first (entry TTL 0), so each reader gets a
            // document taken when it opened, which serves all of its reads unless another open
            // renews it meanwhile (the kernel caches one copy per file; docs/usage.md).
            self.renew_stats_snapshot();
        }
        self.getattr(ino)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr, FsError> {
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
        let (doc, taken) = self.current_stats_snapshot();
        Ok(Attr { size: doc.len() as u64, mtime: taken, renew_on_lookup: true, ..attr })
    }

    fn renew_stats_snapshot(&self) {
        let mut json = serde_json::to_vec_pretty(&self.stats().to_json()).unwrap_or_default();
        json.push(b'\n');
        let mut now = SystemTime::now();
        let mut current = self.lock_stats_snapshot();
        // A new mtime tells the kernel that its cached pages of the old document are stale.
        if now <= current.1 {
            now = current.1 + std::time::Duration::from_nanos(1);
        }
        *current = (json.into(), now);
    }

    fn current_stats_snapshot(&self) -> (Arc<[u8]>, SystemTime) {
        self.lock_stats_snapshot().clone()
    }

    /// Checks that file `ino` may be opened (`write`: for writing). Files hold no per-open state:
    /// any reader may read any file at any offset without opening it first.
    pub fn open(&self, ino: Ino, write: bool) -> Result<(), FsError> {
        Stats::add(&self.stats().opens, 1);
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        if !matches!(node.kind, NodeKind::File { .. }) {
            return Err(FsError::IsDir);
        }
        if write {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    /// Reads up to `size` bytes at `offset` of file `ino`; short only at end of file.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        self.read_with(ino, offset, size, <[u8]>::to_vec)
    }

    /// Like [`Fs::read`], but hands the bytes to `reply` instead of returning a copy: a raw tensor
    /// range inside one cached block reaches `reply` without any copy in between.
    pub fn read_with<R>(&self, ino: Ino, offset: u64, size: u32, reply: impl FnOnce(&[u8]) -> R) -> Result<R, FsError> {
        let node = self.ns.node(ino).ok_or(FsError::NotFound)?;
        let NodeKind::File { content, size: file_size } = &node.kind else { return Err(FsError::IsDir) };
        let mut sent = 0;
        let stats = self.stats();
        // Counted before the reply goes out, so a reader that looks at stats.json right after its
        // read returned sees that read.
        let counted = |data: &[u8]| {
            sent = data.len();
            Stats::add(&stats.fuse_reads, 1);
            Stats::add(&stats.fuse_read_bytes, data.len() as u64);
            reply(data)
        };
        let result = match content {
            Content::Tensor(i) => self.read_tensor(*i, offset, size, counted),
            Content::Npy { tensor, header } => {
                self.read_with_prefix(header, *tensor, offset, size).map(|v| counted(&v))
            }
            Content::F32(i) => self.read_converted(*i, offset, size).map(|v| counted(&v)),
            Content::Bytes(bytes) => Ok(counted(slice_at(bytes, offset, size))),
            Content::Stats => Ok(counted(slice_at(&self.current_stats_snapshot().0, offset, size))),
        };
        match &result {
            Ok(_) => debug_assert!(matches!(content, Content::Stats) || sent as u64 <= *file_size),
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
        self.engine.read_in(t.source, t.start..t.start + t.len, t.start + offset, n, reply).map_err(FsError::Read)
    }

    /// Bytes `[offset, offset+size)` of tensor `i` converted to F32: the whole source elements that
    /// cover the range are read through the engine, converted, and trimmed.
    fn read_converted(&self, i: usize, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let t = self.ns.tensors().get(i).ok_or(FsError::NotFound)?;
        let elements = t.shape.iter().product::<u64>();
        let out_len = crate::views::f32::converted_len(t.dtype, elements).unwrap_or(0);
        if offset >= out_len {
            return Ok(Vec::new());
        }
        let size = (out_len - offset).min(u64::from(size));
        let (first, count) = crate::views::f32::source_range_for(t.dtype, offset, size);
        let count = count.min(elements.saturating_sub(first));
        let (byte_start, byte_len) =
            crate::views::f32::source_byte_range(t.dtype, first, count).ok_or(FsError::NotFound)?;
        let src = self
            .engine
            .read_in(t.source, t.start..t.start + t.len, t.start + byte_start, byte_len as usize, <[u8]>::to_vec)
            .map_err(FsError::Read)?;
        let mut out = Vec::with_capacity(count as usize * 4);
        // The dtype was checked convertible when the namespace was built.
        if crate::views::f32::convert_to_f32(t.dtype, &src, &mut out).is_err() {
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
        StatFs {
            blocks: bytes.div_ceil(u64::from(bsize)),
            files: self.ns.len() as u64,
            bsize,
            namelen: crate::tree::names::NAME_MAX as u32,
        }
    }

    fn lock_stats_snapshot(&self) -> std::sync::MutexGuard<'_, (Arc<[u8]>, SystemTime)> {
        // A poisoned lock only means another thread panicked while holding it; the pair is whole.
        self.stats_snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a node is the stats document, rendered anew at each lookup.
fn is_stats(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::File { content: Content::Stats, .. })
}

/// `bytes[offset..offset+size]`, clipped to the slice (empty past its end).
fn slice_at(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::engine::EngineConfig;
    use crate::format::Dtype;
    use crate::source::{Source, SourceReader};
    use crate::tree::namespace::{Layout, Shard, Views, METADATA_NAME};

    /// An in-memory source whose reads can be made to fail.
    struct MemSource {
        bytes: Arc<Vec<u8>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    struct MemStream(Arc<Vec<u8>>, Arc<std::sync::atomic::AtomicBool>);

    impl Source for MemSource {
        fn len(&self) -> u64 {
            self.bytes.len() as u64
        }
        fn name(&self) -> &str {
            "mem.safetensors"
        }
        fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
            Ok(Box::new(MemStream(self.bytes.clone(), self.fail.clone())))
        }
    }

    impl SourceReader for MemStream {
        fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            if self.1.load(Relaxed) {
                return Err(io::Error::other("injected"));
            }
            let start = offset as usize;
            buf.copy_from_slice(self.0.get(start..start + buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?);
            Ok(())
        }
    }

    type Tensors = Vec<(String, Dtype, Vec<u64>, Vec<u8>)>;

    fn fixture(views: Views) -> (Fs, Tensors, Arc<std::sync::atomic::AtomicBool>) {
        let tensors: Tensors = vec![
            ("a/b".into(), Dtype::U8, vec![300], (0..300u32).map(|i| i as u8).collect()),
            ("w".into(), Dtype::BF16, vec![2, 3], vec![0x80, 0x3f, 0, 0x40, 0, 0xc0, 0, 0, 0x80, 0x7f, 1, 0x3f]),
        ];
        let bytes = Arc::new(crate::format::writer::serialize(&tensors, None).unwrap());
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let engine =
            Engine::new(EngineConfig { block_size: 64, cache_size: 256, io_threads: 1 }, Arc::new(Stats::default()));
        let source = engine.add_source(Arc::new(MemSource { bytes: bytes.clone(), fail: fail.clone() }));
        let mut stream = MemStream(bytes.clone(), fail.clone());
        let header =
            crate::format::read_header(|buf, offset| stream.read_exact_at(buf, offset), bytes.len() as u64).unwrap();
        let ns = Namespace::build(vec![Shard { source, name: "mem.safetensors".into(), header }], Layout::Flat, views)
            .unwrap();
        let base =
            AttrBase { uid: 7, gid: 8, mtime: SystemTime::UNIX_EPOCH, file_perm: 0o444, dir_perm: 0o555, blksize: 64 };
        (Fs::new(ns, engine, base), tensors, fail)
    }

    fn ino(fs: &Fs, name: &str) -> Ino {
        fs.lookup(ROOT_INO, OsStr::new(name)).unwrap().ino
    }

    #[test]
    fn lookup_getattr_and_errors() {
        let (fs, tensors, _) = fixture(Views::default());
        let a = fs.lookup(ROOT_INO, OsStr::new("a%2Fb")).unwrap();
        assert_eq!((a.kind, a.size, a.perm, a.uid, a.gid, a.nlink), (Kind::File, 300, 0o444, 7, 8, 1));
        assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
        assert_eq!(fs.lookup(ROOT_INO, OsStr::new(".")).unwrap().ino, ROOT_INO);
        assert!(matches!(fs.lookup(ROOT_INO, OsStr::new("a/b")), Err(FsError::NotFound)));
        assert!(matches!(fs.lookup(a.ino, OsStr::new("x")), Err(FsError::NotDir)));
        assert!(matches!(fs.getattr(9999), Err(FsError::NotFound)));
        assert!(matches!(fs.getattr(0), Err(FsError::NotFound)));
        assert!(matches!(fs.open(ROOT_INO, false), Err(FsError::IsDir)));
        assert!(matches!(fs.open(a.ino, true), Err(FsError::ReadOnly)));
        assert!(matches!(fs.read(ROOT_INO, 0, 10), Err(FsError::IsDir)));
        assert!(matches!(fs.readdir(a.ino, 0, |_| false), Err(FsError::NotDir)));
        assert_eq!(tensors.len(), 2);
        // Every errno is the documented one.
        let expected = [
            (FsError::NotFound, libc::ENOENT),
            (FsError::NotDir, libc::ENOTDIR),
            (FsError::IsDir, libc::EISDIR),
            (FsError::ReadOnly, libc::EROFS),
            (FsError::NoXattr, libc::ENODATA),
            (FsError::XattrNamespace, libc::EOPNOTSUPP),
        ];
        for (e, errno) in expected {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }

    #[test]
    fn reads_clip_at_any_offset_and_size() {
        let (fs, tensors, _) = fixture(Views::default());
        let a = ino(&fs, "a%2Fb");
        let data = &tensors[0].3;
        for (off, size) in
            [(0u64, 300u32), (1, 63), (63, 2), (64, 64), (299, 10), (300, 1), (10_000, 5), (u64::MAX, u32::MAX)]
        {
            let got = fs.read(a, off, size).unwrap();
            let lo = (off.min(300)) as usize;
            let hi = (off.saturating_add(u64::from(size))).min(300) as usize;
            assert_eq!(got, &data[lo..hi], "{off} {size}");
        }
        let meta = fs.read(ino(&fs, METADATA_NAME), 0, u32::MAX).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&meta).unwrap();
        assert_eq!(doc["tensors"]["a/b"]["path"], "a%2Fb");
        assert!(fs.stats().fuse_reads.load(Relaxed) >= 9);
    }

    #[test]
    fn backing_failures_are_eio_and_retry_succeeds() {
        let (fs, tensors, fail) = fixture(Views::default());
        let a = ino(&fs, "a%2Fb");
        fail.store(true, Relaxed);
        let err = fs.read(a, 0, 300).unwrap_err();
        assert_eq!(err.errno(), libc::EIO);
        assert!(fs.stats().read_errors.load(Relaxed) >= 1);
        fail.store(false, Relaxed);
        assert_eq!(fs.read(a, 0, 300).unwrap(), tensors[0].3);
    }

    #[test]
    fn readdir_pages_resume_at_offsets() {
        let (fs, _, _) = fixture(Views { npy: true, as_f32: false });
        let mut all = Vec::new();
        fs.readdir(ROOT_INO, 0, |e| {
            all.push(e);
            false
        })
        .unwrap();
        let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [".", "..", ".stfs", "a%2Fb", "a%2Fb.npy", "metadata.json", "w", "w.npy"]);
        // Stop after two entries, then resume from the offset the second one gave.
        let mut first = Vec::new();
        fs.readdir(ROOT_INO, 0, |e| {
            first.push(e);
            first.len() == 2
        })
        .unwrap();
        let mut rest = Vec::new();
        fs.readdir(ROOT_INO, first[1].next_offset, |e| {
            rest.push(e.name);
            false
        })
        .unwrap();
        assert_eq!(rest, names[2..]);
    }

    #[test]
    fn xattrs_and_views() {
        let (fs, tensors, _) = fixture(Views { npy: true, as_f32: true });
        let w = ino(&fs, "w");
        assert_eq!(fs.getxattr(w, OsStr::new("user.safetensors.dtype")).unwrap(), b"BF16");
        assert_eq!(fs.getxattr(w, OsStr::new("user.safetensors.shape")).unwrap(), b"[2,3]");
        assert!(matches!(fs.getxattr(w, OsStr::new("user.other")), Err(FsError::NoXattr)));
        assert!(matches!(fs.getxattr(w, OsStr::new("security.selinux")), Err(FsError::XattrNamespace)));
        assert_eq!(fs.listxattr(w).unwrap(), XATTRS);
        assert!(fs.listxattr(ROOT_INO).unwrap().is_empty());
        // The F32 view: BF16 bits shifted into the high half.
        let f32_bytes = fs.read(w, 0, 100).unwrap();
        let want: Vec<u8> = tensors[1]
            .3
            .chunks(2)
            .flat_map(|c| (u32::from(u16::from_le_bytes([c[0], c[1]])) << 16).to_le_bytes())
            .collect();
        assert_eq!(f32_bytes, want);
        assert_eq!(fs.read(w, 5, 6).unwrap(), &want[5..11]);
        // The .npy view: header then raw bytes.
        let npy = fs.read(ino(&fs, "w.npy"), 0, 10_000).unwrap();
        assert!(npy.starts_with(b"\x93NUMPY"));
        assert_eq!(&npy[npy.len() - 12..], &tensors[1].3[..]);
    }

    #[test]
    fn stats_snapshot_is_renewed_by_lookup_only() {
        let (fs, tensors, _) = fixture(Views::default());
        let control = ino(&fs, crate::tree::namespace::CONTROL_DIR);
        let name = OsStr::new(crate::tree::namespace::STATS_NAME);
        let first = fs.lookup(control, name).unwrap();
        assert!(first.renew_on_lookup);
        assert!(!fs.getattr(ino(&fs, "a%2Fb")).unwrap().renew_on_lookup);
        let doc = fs.read(first.ino, 0, 1 << 20).unwrap();
        assert_eq!(doc.len() as u64, first.size);
        let parsed: serde_json::Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(parsed["fuse_reads"], 0);
        // Reads and getattr serve the same snapshot, whatever happened since the lookup.
        fs.read(ino(&fs, "a%2Fb"), 0, 300).unwrap();
        assert_eq!(fs.getattr(first.ino).unwrap(), first);
        assert_eq!(fs.read(first.ino, 5, 1 << 20).unwrap(), &doc[5..]);
        // The next lookup renders a new document, with a later mtime so cached pages are dropped.
        let second = fs.lookup(control, name).unwrap();
        assert!(second.mtime > first.mtime);
        let parsed: serde_json::Value = serde_json::from_slice(&fs.read(second.ino, 0, 1 << 20).unwrap()).unwrap();
        assert_eq!(parsed["fuse_reads"], 3);
        assert_eq!(tensors.len(), 2);
    }
}
