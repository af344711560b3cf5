//! limitfs: the benchmark's "limit row", what the kernel's FUSE read path costs by itself.
//!
//! A read-only FUSE mount whose every READ is answered from one pre-faulted, locked buffer: no
//! backing I/O, no cache, no copy in user space (fuser 0.18 hands the reply slice to `writev`
//! as it is). The buffer holds every byte of the files (with `--like`, the checkpoint's own bytes,
//! read into memory at start), so a read of 1 GiB copies 1 GiB of distinct bytes, as any server
//! of real data does; `--hot-buffer` answers every read from the same 16 MiB instead (the first
//! version of this row), whose copy source stays in the CPU's caches and so costs the kernel less
//! than any distinct data can. It presents the same files the benchmark reads from stfs, so the kernel sees the
//! same byte counts and file pattern, and it is mounted with the kernel settings stfs uses
//! (`src/mount/session.rs`, `src/fuse/mod.rs`, `src/mount/mountpoint.rs`):
//! - as root: its own mount(2) of type `fuse.limitfs`, read-only, nosuid, nodev; otherwise
//!   fuser's fusermount path with `ro`;
//! - 16 FUSE threads (`--threads`), each with its own /dev/fuse descriptor (`clone_fd`);
//! - INIT: `max_background` 64, `FUSE_DO_READDIRPLUS | FUSE_AUTO_INVAL_DATA`, `max_write` 1016
//!   KiB (the kernel's `max_pages` follows it: reads of up to 1016 KiB, the cap stfs sets so that
//!   a spliced reply fits one pipe; `--max-read-kib 1024` gives the kernel's own 1 MiB);
//! - OPEN answered with ENOSYS (the kernel then opens files itself, keeping the page cache, and
//!   sends no RELEASE), FLUSH with ENOSYS;
//! - entry and attribute TTLs of one hour; `st_blksize` 64 KiB (`--blksize`: stfs reports its
//!   block size, and `cat` sizes its reads from it);
//! - the bdi's `read_ahead_kb` set to 1016 once the mount answers (root only): one whole read.
//!
//! With `--like` the bytes served are the checkpoint's (the benchmark byte-compares them); with
//! `--size` or `--hot-buffer` they are a fixed pattern.
//!
//! Experiment (`--backing`, with `--like`): reply to each read with a slice of a read-only
//! `mmap` of the checkpoint instead, so the bytes are the checkpoint's and go from its page cache
//! to the FUSE page cache with the kernel's one copy (fuser passes the slice to `writev`, whose
//! `get_user_pages` faults the mapping in; the daemon never touches the bytes itself). This is the
//! "serve a local file from a mapping" design measured without the rest of stfs. A page that is
//! gone (the file was truncated) makes `writev` fail with EFAULT inside the kernel, which ends the
//! request with EIO: no SIGBUS in the daemon. `--populate` maps with MAP_POPULATE (page tables
//! filled at mount) instead of letting `get_user_pages` fault pages in on first use.
//!
//! Usage: `limitfs MOUNTPOINT (--like CHECKPOINT.safetensors | --size BYTES) [--threads 16]
//! [--blksize 65536] [--kernel-readahead-kb 1024] [--stats-file PATH]`.
//! With `--like`, one file per tensor, named after the tensor, of the tensor's size; with
//! `--size`, one file `data`. Prints `ready` on stdout once the mount answers and its readahead
//! is set; unmounts and exits on SIGINT or SIGTERM (also sent to it if its parent dies), or when
//! someone else unmounted it. Counters (READ requests, bytes, request sizes by power of two) are
//! printed as JSON on stderr at exit and, with `--stats-file`, written there.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, Request,
};

/// stfs's entry and attribute lifetime (src/fuse.rs).
const TTL: Duration = Duration::from_secs(3600);
/// stfs's max_background (src/fuse.rs).
const MAX_BACKGROUND: u16 = 64;
/// The largest READ fuser lets the kernel send (its max_write, 16 MiB; the kernel caps requests
/// at max_pages, 1 MiB by default): the `--hot-buffer` buffer covers any of them.
const HOT_BUFFER_BYTES: usize = 16 << 20;
/// Inode of the first file; 1 is the root.
const FIRST_INO: u64 = 2;

#[derive(Parser)]
#[command(about = "FUSE mount answering every read from one pre-faulted buffer (the benchmark's limit row)")]
struct Args {
    /// Where to mount.
    mountpoint: PathBuf,
    /// Present one file per tensor of this safetensors file (names and sizes only).
    #[arg(long, conflicts_with = "size", required_unless_present = "size")]
    like: Option<PathBuf>,
    /// Present one file `data` of this many bytes.
    #[arg(long)]
    size: Option<u64>,
    /// FUSE worker threads (stfs's default).
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// st_blksize reported for files (stfs reports its block size, 64 KiB by default).
    #[arg(long, default_value_t = 64 << 10)]
    blksize: u32,
    /// Largest read the kernel may send, in KiB (its `max_write`; stfs caps reads at 1016 KiB).
    #[arg(long, default_value_t = 1016)]
    max_read_kib: u32,
    /// Kernel readahead of the mount in KiB, set after mounting (root only; 0 leaves it alone;
    /// stfs sets 1016, one whole read).
    #[arg(long, default_value_t = 1016)]
    kernel_readahead_kb: u32,
    /// Also write the counters as JSON to this file at exit.
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// Experiment: answer reads from a read-only mmap of the --like checkpoint (its real bytes).
    #[arg(long, requires = "like")]
    backing: bool,
    /// With --backing: MAP_POPULATE the mapping at mount.
    #[arg(long, requires = "backing")]
    populate: bool,
    /// Answer every read from the same 16 MiB pattern buffer (cache-hot), not from a buffer
    /// holding all the files' bytes.
    #[arg(long)]
    hot_buffer: bool,
}

/// A read-only shared mapping of a whole file.
struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and lives as long as the filesystem; the daemon only hands
// slices of it to writev (the kernel reads the pages).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(path: &Path, populate: bool) -> io::Result<Mapping> {
        let file = File::open(path)?;
        let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh read-only mapping of an open descriptor; checked for MAP_FAILED.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len.max(1), libc::PROT_READ, flags, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    /// Bytes `[start, start + len)`, clipped to the mapping. The daemon must never read them
    /// itself (a truncated file would SIGBUS); only the kernel does, in writev.
    fn slice(&self, start: u64, len: usize) -> &[u8] {
        let start = usize::try_from(start).unwrap_or(usize::MAX).min(self.len);
        let len = len.min(self.len - start);
        // SAFETY: inside the mapping, which outlives &self.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }
}

/// READ requests seen, bytes replied and request sizes by power of two (bucket i: < 2^(i+1) bytes).
#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    bytes: AtomicU64,
    sizes: [AtomicU64; 32],
}

impl Counters {
    fn to_json(&self) -> String {
        let sizes: Vec<String> = self
            .sizes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match n.load(Relaxed) {
                0 => None,
                n => Some(format!("\"{}\": {n}", 1u64 << i)),
            })
            .collect();
        format!(
            "{{\"fuse_reads\": {}, \"fuse_read_bytes\": {}, \"read_sizes_at_least\": {{{}}}}}\n",
            self.reads.load(Relaxed),
            self.bytes.load(Relaxed),
            sizes.join(", ")
        )
    }
}

struct LimitFile {
    name: Vec<u8>,
    size: u64,
    /// Offset of the file's bytes in the checkpoint (in the buffer, or the mapping of --backing).
    start: u64,
}

struct LimitFs {
    files: Vec<LimitFile>,
    /// Index into `files`, sorted by name, for lookup.
    by_name: Vec<usize>,
    /// Every file's bytes at its `start`, or (`hot`) 16 MiB answering every read.
    buffer: Vec<u8>,
    hot: bool,
    mtime: SystemTime,
    uid: u32,
    gid: u32,
    blksize: u32,
    max_read_kib: u32,
    counters: Arc<Counters>,
    backing: Option<Mapping>,
}

impl LimitFs {
    /// `buffer` holds the files' bytes (every page written, so faulted in before the first
    /// request); it is locked when allowed, so it stays resident.
    fn new(files: Vec<LimitFile>, buffer: Vec<u8>, hot: bool, mtime: SystemTime, blksize: u32) -> LimitFs {
        let mut by_name: Vec<usize> = (0..files.len()).collect();
        by_name.sort_by(|&a, &b| files[a].name.cmp(&files[b].name));
        // SAFETY: the pointer and length describe the live allocation; mlock does not move it.
        if unsafe { libc::mlock(buffer.as_ptr().cast(), buffer.len()) } != 0 {
            eprintln!("limitfs: mlock of {} bytes failed: {}", buffer.len(), io::Error::last_os_error());
        }
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let counters = Arc::new(Counters::default());
        LimitFs { files, by_name, buffer, hot, mtime, uid, gid, blksize, max_read_kib: 1016, counters, backing: None }
    }

    fn file(&self, ino: u64) -> Option<&LimitFile> {
        self.files.get(usize::try_from(ino.checked_sub(FIRST_INO)?).ok()?)
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == 1 {
            (FileType::Directory, 0, 0o555, 2)
        } else {
            (FileType::RegularFile, self.file(ino)?.size, 0o444, 1)
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.blksize,
            flags: 0,
        })
    }

    /// Root entries from `offset`: `.`, `..`, then the files in file order.
    fn entries(&self, offset: u64) -> impl Iterator<Item = (u64, u64, &[u8])> + '_ {
        let dots = [(1u64, &b"."[..]), (1, &b".."[..])];
        let files = self.files.iter().enumerate().map(|(i, f)| (FIRST_INO + i as u64, f.name.as_slice()));
        dots.into_iter()
            .chain(files)
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(i, (ino, name))| (ino, i as u64 + 1, name))
    }
}

impl Filesystem for LimitFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_max_write(self.max_read_kib << 10);
        let wanted = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_AUTO_INVAL_DATA;
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.by_name.binary_search_by(|&i| self.files[i].name.as_slice().cmp(name.as_bytes())) {
            Ok(k) => {
                let attr = self.attr(FIRST_INO + self.by_name[k] as u64).expect("listed file");
                reply.entry_with_ttls(&TTL, &TTL, &attr, Generation(0));
            }
            Err(_) => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // As stfs: ENOSYS, so the kernel opens files itself from now on (keeping their cache).
        match self.file(ino.0) {
            Some(_) => reply.error(Errno::ENOSYS),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.file(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let len = u64::from(size).min(file.size.saturating_sub(offset)) as usize;
        let start = if self.hot { 0 } else { usize::try_from(file.start + offset).unwrap_or(usize::MAX) };
        let Some(bytes) = start.checked_add(len).and_then(|end| self.buffer.get(start..end)) else {
            return reply.error(Errno::EIO);
        };
        self.counters.reads.fetch_add(1, Relaxed);
        self.counters.bytes.fetch_add(len as u64, Relaxed);
        let bucket = (u64::from(size.max(1)).ilog2() as usize).min(31);
        self.counters.sizes[bucket].fetch_add(1, Relaxed);
        match &self.backing {
            Some(map) => reply.data(map.slice(file.start + offset, len)),
            None => reply.data(bytes),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == INodeNo::ROOT {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR);
        } else {
            reply.error(Errno::ENOTDIR);
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        for (ino, next, name) in self.entries(offset) {
            let kind = if ino == 1 { FileType::Directory } else { FileType::RegularFile };
            if reply.add(INodeNo(ino), next, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        for (ino, next, name) in self.entries(offset) {
            let attr = self.attr(ino).expect("listed inode");
            if reply.add(INodeNo(ino), next, OsStr::from_bytes(name), &TTL, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }
}

/// Names and sizes of the tensors of a safetensors file, in file-offset order.
fn tensor_files(path: &Path) -> Result<Vec<LimitFile>, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut file = File::open(path).map_err(|e| fail(&e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| fail(&e))?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(fail(&"header longer than 100 MB"));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(|e| fail(&e))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).map_err(|e| fail(&e))?;
    let data_start = 8 + len;
    let mut tensors = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let offsets = info
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .map(|o| o.iter().filter_map(|v| v.as_u64()).collect::<Vec<_>>());
        let Some([begin, end]) = offsets.as_deref() else {
            return Err(fail(&format!("tensor {name}: no data_offsets")));
        };
        if end < begin || name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(fail(&format!("tensor {name:?}: not servable as a flat file name")));
        }
        tensors.push((*begin, LimitFile { name: name.into_bytes(), size: end - begin, start: data_start + begin }));
    }
    tensors.sort_by_key(|(begin, _)| *begin);
    Ok(tensors.into_iter().map(|(_, f)| f).collect())
}

/// True when `mountpoint` (canonical) is listed in /proc/self/mountinfo.
fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let wanted = mountpoint.as_os_str().as_bytes();
    text.lines().any(|line| line.split(' ').nth(4).is_some_and(|field| unescape_octal(field) == wanted))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], code) {
            (b'\\', Some(code)) => {
                out.push(code);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"))
}

/// As stfs's `mountpoint::mount_fuse`: mount(2) of type `fuse.limitfs` and the /dev/fuse
/// descriptor to serve it on; `None` when not permitted (not root).
fn mount_fuse(path: &Path) -> io::Result<Option<OwnedFd>> {
    let device = match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(device) => device,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => return Err(e),
    };
    let root_type = std::fs::metadata(path)?.mode() & libc::S_IFMT;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!("fd={},rootmode={root_type:o},user_id={uid},group_id={gid}", device.as_raw_fd());
    let (source, target, fs_type, data) = (
        cstring(b"limitfs")?,
        cstring(path.as_os_str().as_bytes())?,
        cstring(b"fuse.limitfs")?,
        cstring(data.as_bytes())?,
    );
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fs_type.as_ptr(), flags, data.as_ptr().cast()) };
    if rc == 0 {
        return Ok(Some(device.into()));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EPERM) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// umount2(2); retried for a few seconds while busy, then detached lazily.
fn unmount(path: &Path) {
    let Ok(c_path) = cstring(path.as_os_str().as_bytes()) else { return };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: c_path is a valid NUL-terminated string.
        if unsafe { libc::umount2(c_path.as_ptr(), 0) } == 0 || !is_mounted(path) {
            return;
        }
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As stfs's `mountpoint::set_kernel_readahead`: the bdi knob of the mount's device.
fn set_kernel_readahead(path: &Path, kib: u32) -> io::Result<()> {
    let dev = std::fs::metadata(path)?.dev();
    std::fs::write(format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev)), kib.to_string())
}

/// Blocks SIGINT and SIGTERM in this thread and the threads it starts later; returns the set.
fn block_exit_signals() -> libc::sigset_t {
    // SAFETY: plain signal-set manipulation on a zero-initialised local sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits up to `timeout` for a signal of `set`; true if one arrived.
fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> bool {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `set` is a valid signal set and the info pointer may be null.
    unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) > 0 }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let signals = block_exit_signals();
    // If the benchmark driver dies, take the mount down with it. SAFETY: prctl with plain integers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) };
    let (files, mtime) = match (&args.like, args.size) {
        (Some(path), _) => (tensor_files(path)?, std::fs::metadata(path)?.modified()?),
        (None, Some(size)) => (vec![LimitFile { name: b"data".to_vec(), size, start: 0 }], SystemTime::now()),
        (None, None) => unreachable!("clap requires --like or --size"),
    };
    let mountpoint = std::fs::canonicalize(&args.mountpoint)?;
    let buffer = if args.hot_buffer || args.backing {
        (0..HOT_BUFFER_BYTES).map(|i| (i % 251) as u8).collect()
    } else if let Some(path) = &args.like {
        std::fs::read(path)?
    } else {
        let size = usize::try_from(args.size.unwrap_or(0)).map_err(io::Error::other)?;
        (0..size).map(|i| (i % 251) as u8).collect()
    };
    let mut fs = LimitFs::new(files, buffer, args.hot_buffer || args.backing, mtime, args.blksize);
    fs.max_read_kib = args.max_read_kib;
    let counters = Arc::clone(&fs.counters);
    if let (true, Some(path)) = (args.backing, &args.like) {
        fs.backing = Some(Mapping::new(path, args.populate)?);
    }

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::FSName("limitfs".into()),
        MountOption::Subtype("limitfs".into()),
    ];
    config.n_threads = Some(args.threads.max(1));
    config.clone_fd = true;
    let (session, fuser_unmounter) = match mount_fuse(&mountpoint)? {
        Some(device) => match fuser::Session::from_fd(fs, device, config.acl, config) {
            Ok(session) => (session, None),
            Err(e) => {
                unmount(&mountpoint);
                return Err(e.into());
            }
        },
        None => {
            let mut session = fuser::Session::new(fs, &mountpoint, &config)?;
            let unmounter = session.unmount_callable();
            (session, Some(unmounter))
        }
    };
    let runner = std::thread::Builder::new().name("fuse-session".into()).spawn(move || session.run())?;
    let take_down = |fuser_unmounter: Option<fuser::SessionUnmounter>| match fuser_unmounter {
        Some(mut u) => {
            if u.unmount().is_err() {
                unmount(&mountpoint);
            }
        }
        None => unmount(&mountpoint),
    };

    // Ready once the root answers as inode 1 (the FUSE root), as stfs's wait_until_answering.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(is_mounted(&mountpoint) && std::fs::metadata(&mountpoint).is_ok_and(|m| m.ino() == 1)) {
        if Instant::now() > deadline || runner.is_finished() {
            take_down(fuser_unmounter);
            return Err("the mount did not answer within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if args.kernel_readahead_kb > 0 {
        if let Err(e) = set_kernel_readahead(&mountpoint, args.kernel_readahead_kb) {
            eprintln!("limitfs: kernel readahead left at its default: {e}");
        }
    }
    println!("ready");
    io::stdout().flush()?;

    loop {
        if wait_signal(&signals, Duration::from_millis(100)) {
            break;
        }
        if !is_mounted(&mountpoint) || runner.is_finished() {
            eprintln!("limitfs: {} was unmounted externally", mountpoint.display());
            break;
        }
    }
    take_down(fuser_unmounter);
    let result = runner.join().map_err(|_| "the FUSE session panicked")?;
    let json = counters.to_json();
    eprint!("{json}");
    if let Some(path) = &args.stats_file {
        std::fs::write(path, &json)?;
    }
    result.map_err(Into::into)
}
