//! The `fuser::Filesystem` adapter: translates kernel requests into [`Fs`] calls and results into
//! replies and errnos, and nothing more. The only file that touches fuser's Reply types; every
//! errno of a failure comes from [`FsError::errno`]. `read_reply` decides how a read reply travels;
//! `splice` writes the read replies that move a local file's pages into the FUSE device without
//! fuser; `uring` is the FUSE-over-io_uring transport beside fuser's `/dev/fuse` threads.

mod passthrough;
mod read_reply;
mod splice;
mod uring;

pub use splice::{readahead_in_whole_reads, MAX_REQUEST_BYTES};
pub use uring::{threads_per_queue, UringTarget, PAYLOAD_BUDGET};

use read_reply::{ReplyPath, Sent};

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use log::{debug, warn};

use crate::fs::{Attr, Fs, FsError, Kind, Xattr};

/// Entry and attribute lifetime in the kernel: the data is immutable, so cache for a long time.
const TTL: Duration = Duration::from_secs(3600);

/// Requests the kernel may keep in flight; fuser's default of 16 starves parallel readahead.
const MAX_BACKGROUND: u16 = 64;

/// A kernel read that took at least this long is logged at debug level (`-d`): a reader waiting
/// on the store, beside the backing reads' own lines.
const SLOW_READ_LOGGED: Duration = Duration::from_millis(5);

/// How long the kernel may keep the name `a` resolves to: not at all for files renewed at lookup.
fn entry_ttl(a: &Attr) -> Duration {
    if a.renew_on_lookup {
        Duration::ZERO
    } else {
        TTL
    }
}

/// Wraps [`Fs`] for fuser; cheap to clone the inner state.
pub struct FuseAdapter {
    fs: Arc<Fs>,
    /// FUSE passthrough: asked for at INIT, and the opens it answers (`passthrough`).
    passthrough: passthrough::Passthrough,
    /// Read replies of a local file's bytes are to be spliced: `init` caps reads so that one
    /// fits a pipe ([`FuseAdapter::splicing`]).
    splice: bool,
    /// The largest read request to ask the kernel for ([`FuseAdapter::requests_up_to`]).
    max_request_bytes: u32,
    /// Where they are spliced to, once the session's descriptor is known
    /// ([`SpliceTarget::connect`]); unset, every reply goes through fuser.
    splicer: SpliceTarget,
    /// `--io-uring`: FUSE over io_uring is asked for, with this many FUSE threads to spread over
    /// its queues (0: not asked).
    uring_threads: u32,
    /// The rings INIT agreed to, for the session to start.
    uring: UringTarget,
}

/// Where an adapter splices read replies: unset until [`SpliceTarget::connect`] gives it the
/// session's `/dev/fuse` descriptor (known only once the session is made, and the adapter is
/// then inside it).
#[derive(Clone, Debug, Default)]
pub struct SpliceTarget(Arc<(OnceLock<splice::Splicer>, AtomicUsize)>);

impl SpliceTarget {
    /// Splices read replies of local files' bytes to `device`, the session's `/dev/fuse`
    /// descriptor. The session must read every request from that one descriptor (no per-thread
    /// clones: a reply is only found on the descriptor its request came from), and the adapter
    /// must have capped reads to fit its pipes at INIT ([`FuseAdapter::splicing`]), which sized
    /// them. Called before the session runs.
    pub fn connect(&self, device: BorrowedFd<'_>) -> io::Result<()> {
        let pipe_bytes = self.0 .1.load(Relaxed);
        if pipe_bytes == 0 {
            return Err(io::Error::other("the FUSE handshake sized no splice pipe"));
        }
        let splicer = splice::Splicer::new(device, pipe_bytes)?;
        let _ = self.0 .0.set(splicer);
        Ok(())
    }

    fn get(&self) -> Option<&splice::Splicer> {
        self.0 .0.get()
    }
}

impl FuseAdapter {
    /// An adapter serving `fs`.
    pub fn new(fs: Arc<Fs>) -> FuseAdapter {
        FuseAdapter {
            fs,
            passthrough: passthrough::Passthrough::new(true),
            splice: false,
            max_request_bytes: MAX_REQUEST_BYTES,
            splicer: SpliceTarget::default(),
            uring_threads: 0,
            uring: UringTarget::default(),
        }
    }

    /// This adapter, asking the kernel for FUSE over io_uring at INIT (`--io-uring`), its
    /// `threads` spread over the ring's queues; [`FuseAdapter::uring_target`] starts them.
    pub fn io_uring(mut self, asked: bool, threads: u32) -> FuseAdapter {
        self.uring_threads = if asked { threads.max(1) } else { 0 };
        self
    }

    /// The rings INIT agreed to, to be started once the session runs.
    pub fn uring_target(&self) -> UringTarget {
        self.uring.clone()
    }

    /// This adapter, set to splice read replies of local files' bytes once its target is
    /// connected: the FUSE handshake (which runs when the session is made) caps the kernel's
    /// reads so that a reply fits one pipe, and sizes the pipes ([`splice::sizes`]).
    pub fn splicing(mut self, splice: bool) -> FuseAdapter {
        self.splice = splice;
        self
    }

    /// This adapter, asking the kernel for read requests of at most `bytes` (`--max-request-kb`;
    /// the kernel grants at most `fs.fuse.max_pages_limit` pages).
    pub fn requests_up_to(mut self, bytes: u32) -> FuseAdapter {
        self.max_request_bytes = bytes;
        self
    }

    /// This adapter, allowed to ask the kernel for FUSE passthrough (`--no-passthrough` clears it).
    pub fn passing_through(mut self, allow: bool) -> FuseAdapter {
        self.passthrough.allowed = allow;
        self
    }

    /// Where this adapter splices read replies, to be connected once the session exists.
    pub fn splice_target(&self) -> SpliceTarget {
        self.splicer.clone()
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

/// Not an error but a protocol answer: to OPEN, "no per-open state, stop asking"; to FLUSH,
/// "nothing to flush, stop sending it at each close".
const NOT_NEEDED: Errno = Errno::ENOSYS;

/// Logs a failed operation once (warn for read failures, debug for ordinary misses) and gives its errno.
fn errno(op: &str, ino: u64, e: &FsError) -> Errno {
    if e.is_failure() {
        warn!("{op} of inode {ino} failed with errno {}: {e}", e.errno());
    } else {
        debug!("{op} of inode {ino} failed with errno {}: {e}", e.errno());
    }
    Errno::from_i32(e.errno())
}

/// Replies to a write-like request: the mount is read-only.
macro_rules! read_only {
    ($reply:expr) => {
        $reply.error(Errno::from_i32(FsError::ReadOnly.errno()))
    };
}

/// Replies to getxattr or listxattr.
fn reply_xattr(op: &str, ino: u64, result: Result<Xattr, FsError>, reply: ReplyXattr) {
    match result {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(bytes)) => reply.data(&bytes),
        Err(e) => reply.error(errno(op, ino, &e)),
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Requests of the size asked for (`--max-request-kb`, 1 MiB by default) where the kernel
        // allows it (`fs.fuse.max_pages_limit`): fuser asks for `max_write` pages; a splicing
        // mount asks for no more than its pipes carry. The granted size goes to stats.json
        // (`max_request_bytes`).
        let limit =
            if config.capabilities().contains(InitFlags::FUSE_MAX_PAGES) { splice::max_pages_limit() } else { 32 };
        let sizes = splice::sizes(self.splice, self.max_request_bytes, limit, splice::pipe_max_bytes());
        if let Err(max) = config.set_max_write(sizes.request_bytes) {
            debug!("kernel refused max_write {}, keeps {max}", sizes.request_bytes);
        }
        if self.splice {
            self.splicer.0 .1.store(sizes.pipe_bytes, Relaxed);
        }
        self.fs.stats().max_request_bytes.store(u64::from(sizes.request_bytes), Relaxed);
        debug!("read requests of up to {} KiB (fs.fuse.max_pages_limit {limit})", sizes.request_bytes >> 10);
        if let Err(max) = config.set_max_background(MAX_BACKGROUND) {
            debug!("kernel refused max_background {MAX_BACKGROUND}, keeps {max}");
        }
        // Directory listings carry attributes (no lookup per file); the kernel may cache them.
        // AUTO_INVAL_DATA: a file whose mtime moves (stats.json, renewed at lookup) loses its
        // cached pages; tensor files never change, so theirs stay.
        let wanted = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_AUTO_INVAL_DATA;
        if let Err(missing) = config.add_capabilities(wanted & config.capabilities()) {
            debug!("kernel lacks {missing:?}");
        }
        self.passthrough.negotiate(&self.fs, config);
        let asked = self.uring_threads > 0;
        // The ring's payload buffers hold the largest request the kernel may send: fuser asks for
        // max(max_write, max_readahead) pages (a new mount's INIT offers the default readahead,
        // 128 KiB; 1 MiB is counted to be safe), and the kernel caps that at its limit.
        let uring_pages = limit.min(sizes.request_bytes.div_ceil(4096).max(256));
        if let Some(plan) = uring::negotiate(asked, self.uring_threads, sizes.request_bytes, uring_pages, config) {
            self.uring.set(plan);
        }
        Ok(())
    }

    /// The kernel drops its references to an inode: a stats.json snapshot's document goes (the
    /// tree's inodes keep no per-lookup state). fuser's `batch_forget` calls this for each inode.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name) {
            Ok(a) => reply.entry_with_ttls(&TTL, &entry_ttl(&a), &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno("lookup", parent.0, &e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno("getattr", ino.0, &e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        match self.fs.open(ino.0, write) {
            // Files keep no per-open state, so opens need no round trip: on ENOSYS the kernel
            // stops sending OPEN and RELEASE for files and opens them itself with FOPEN_KEEP_CACHE
            // (the data is immutable; never direct_io, which would break mmap).
            Ok(()) if !self.passthrough.on => reply.error(NOT_NEEDED),
            Ok(()) => self.passthrough.open_file(&self.fs, ino.0, reply),
            Err(e) => reply.error(errno("open", ino.0, &e)),
        }
    }

    /// Sent only when OPEN was answered (passthrough on): the last release of an inode drops its
    /// backing file, or tells the disk cache it was closed (it may assemble its extent file).
    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.passthrough.release_file(&self.fs, ino.0, reply);
    }

    /// Nothing to flush on a read-only mount; ENOSYS stops the kernel sending FLUSH at each close.
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.error(NOT_NEEDED);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The reply is written from inside the read, so bytes go from the cached block (or the
        // backing file) to the kernel: a local file's pages are read into the ring entry or
        // spliced into the device, else fuser hands the slice to `writev` as it is; nothing here
        // reads it (the contract of `read_for_kernel`).
        let mut reply = Some(reply);
        // A kernel read that waited is logged beside the backing reads' lines (debug level).
        let started = log::log_enabled!(log::Level::Debug).then(Instant::now);
        let path = ReplyPath::of_this_request(self.splicer.get());
        let sent = self.fs.read_for_kernel(ino.0, offset, size, |data| {
            let Some(reply) = reply.take() else { return };
            match path.send(req.unique().0, ino.0, offset, &data, self.fs.stats()) {
                // Answered already: nothing more goes out for this request (vendor/fuser's patch).
                Sent::Elsewhere => reply.sent_elsewhere(),
                Sent::Failed => reply.error(Errno::EIO),
                Sent::NotYet => reply.data(data.slice()),
            }
        });
        if let (Err(e), Some(reply)) = (sent, reply) {
            reply.error(errno("read", ino.0, &e));
        }
        if let Some(waited) = started.map(|s| s.elapsed()).filter(|&w| w >= SLOW_READ_LOGGED) {
            debug!("read of inode {} at {offset} ({size} bytes) took {:.1} ms", ino.0, waited.as_secs_f64() * 1e3);
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(errno("opendir", ino.0, &e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let result =
            self.fs.readdir(ino.0, offset, |e| reply.add(INodeNo(e.ino), e.next_offset, file_type(e.kind), &e.name));
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdir", ino.0, &e)),
        }
    }

    /// Entries with their attributes, so `ls -l` of a large checkpoint needs no lookup per file.
    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let result = self.fs.readdir(ino.0, offset, |e| match self.fs.getattr(e.ino) {
            Ok(a) => reply.add(INodeNo(e.ino), e.next_offset, &e.name, &entry_ttl(&a), &file_attr(&a), Generation(0)),
            Err(_) => false,
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdirplus", ino.0, &e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.bsize);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let result = if name == crate::fs::PASSTHROUGH_XATTR {
            self.fs.passthrough_xattr(ino.0, self.passthrough.passed_through(ino.0), size)
        } else {
            self.fs.getxattr(ino.0, name, size)
        };
        reply_xattr("getxattr", ino.0, result, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr("listxattr", ino.0, self.fs.listxattr(ino.0, size), reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.fs.access(ino.0, mask.contains(AccessFlags::W_OK), mask.contains(AccessFlags::X_OK)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("access", ino.0, &e)),
        }
    }

    // Every write-like request answers EROFS (the mount is also `ro`, so most never arrive).

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        read_only!(reply)
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        read_only!(reply)
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        read_only!(reply)
    }

    fn mkdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        read_only!(reply)
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        read_only!(reply)
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        read_only!(reply)
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        read_only!(reply)
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        read_only!(reply)
    }

    fn symlink(&self, _req: &Request, _parent: INodeNo, _link_name: &OsStr, _target: &Path, reply: ReplyEntry) {
        read_only!(reply)
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        read_only!(reply)
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        read_only!(reply)
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        read_only!(reply)
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        read_only!(reply)
    }

    /// No ioctl applies to a tensor file: ENOTTY, what a regular file answers, and nothing logged
    /// (Python's `open()` asks every file whether it is a terminal with `TCGETS`; fuser's default
    /// logged a warning each time).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY)
    }
}
