//! A tiny fault-injecting FUSE passthrough for tests: serves the regular files of one directory
//! (flat, read-only), fails every read with EIO while one shared flag is set, and holds every
//! read (a hung store) while another is set.
//!
//! It stands in for a disk or network filesystem that returns I/O errors, so a test can put a
//! checkpoint on it, mount stfs on top, and check how a backing EIO surfaces and recovers.
//! Opens reply FOPEN_DIRECT_IO so that every read reaches this process (the kernel page cache
//! would otherwise hide the injected faults). It can also make every read slow (a delay before
//! the bytes are read, so a write to the backing file can land in the middle of a long read) and
//! serve attributes that are never cached ([`FaultMount::uncached`]), so a check of the file's
//! identity always sees its latest size and times.

use std::ffi::OsStr;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};

/// Attribute lifetime: short, so a change below is seen quickly by stfs's stat checks.
const TTL: Duration = Duration::from_millis(100);

/// The filesystem: a backing directory, the failure switch, and inode numbers handed out by name.
struct FaultFs {
    backing: PathBuf,
    /// How long the kernel may cache attributes.
    ttl: Duration,
    /// Microseconds each read waits before reading.
    read_delay_us: Arc<AtomicU64>,
    fail_reads: Arc<AtomicBool>,
    failed_reads: Arc<AtomicU64>,
    hang_reads: Arc<AtomicBool>,
    held_reads: Arc<AtomicU64>,
    /// Index + 2 is the inode number (1 is the root).
    names: Mutex<Vec<std::ffi::OsString>>,
}

impl FaultFs {
    fn ino_of(&self, name: &OsStr) -> u64 {
        let mut names = self.names.lock().unwrap();
        let index = names.iter().position(|n| n == name).unwrap_or_else(|| {
            names.push(name.to_os_string());
            names.len() - 1
        });
        index as u64 + 2
    }

    fn path_of(&self, ino: u64) -> Option<PathBuf> {
        let names = self.names.lock().unwrap();
        let name = names.get(usize::try_from(ino.checked_sub(2)?).ok()?)?;
        Some(self.backing.join(name))
    }

    fn attr(&self, ino: u64, path: &Path) -> std::io::Result<FileAttr> {
        let m = std::fs::symlink_metadata(path)?;
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.mtime(), m.mtime_nsec()),
            kind: if m.is_dir() { FileType::Directory } else { FileType::RegularFile },
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 != 1 {
            return reply.error(Errno::ENOENT);
        }
        let path = self.backing.join(name);
        if !path.is_file() {
            return reply.error(Errno::ENOENT);
        }
        let ino = self.ino_of(name);
        match self.attr(ino, &path) {
            Ok(a) => reply.entry(&self.ttl, &a, Generation(0)),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = if ino.0 == 1 { Some(self.backing.clone()) } else { self.path_of(ino.0) };
        match path.map(|p| self.attr(ino.0, &p)) {
            Some(Ok(a)) => reply.attr(&self.ttl, &a),
            Some(Err(e)) => reply.error(errno_of(&e)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.path_of(ino.0) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            None => reply.error(Errno::ENOENT),
        }
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
        // A hung store: hold the read until released (bounded, so a broken test cannot wedge).
        let held_since = std::time::Instant::now();
        if self.hang_reads.load(SeqCst) {
            self.held_reads.fetch_add(1, SeqCst);
            while self.hang_reads.load(SeqCst) && held_since.elapsed() < super::TIMEOUT {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.held_reads.fetch_sub(1, SeqCst);
        }
        let delay = self.read_delay_us.load(SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if self.fail_reads.load(SeqCst) {
            self.failed_reads.fetch_add(1, SeqCst);
            return reply.error(Errno::EIO);
        }
        let Some(path) = self.path_of(ino.0) else { return reply.error(Errno::ENOENT) };
        let result = std::fs::File::open(path).and_then(|f| {
            let mut buf = vec![0; size as usize];
            let mut filled = 0;
            while filled < buf.len() {
                match f.read_at(&mut buf[filled..], offset + filled as u64)? {
                    0 => break,
                    n => filled += n,
                }
            }
            buf.truncate(filled);
            Ok(buf)
        });
        match result {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino.0 != 1 {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries = vec![(1, FileType::Directory, ".".into()), (1, FileType::Directory, "..".into())];
        if let Ok(dir) = std::fs::read_dir(&self.backing) {
            for e in dir.flatten() {
                if e.path().is_file() {
                    entries.push((self.ino_of(&e.file_name()), FileType::RegularFile, e.file_name()));
                }
            }
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }
}

/// A mounted fault filesystem; unmounted when dropped.
pub struct FaultMount {
    /// Where it is mounted.
    pub path: PathBuf,
    /// While true, every read fails with EIO.
    pub fail_reads: Arc<AtomicBool>,
    /// How many reads were failed on purpose.
    pub failed_reads: Arc<AtomicU64>,
    /// While true, every read waits (up to the test timeout) until it is cleared.
    pub hang_reads: Arc<AtomicBool>,
    /// How many reads `hang_reads` holds right now.
    pub held_reads: Arc<AtomicU64>,
    /// Microseconds every read waits before reading the backing file (0: none).
    pub read_delay_us: Arc<AtomicU64>,
    session: Option<fuser::BackgroundSession>,
}

impl FaultMount {
    /// Mounts a passthrough of `backing` on the (existing, empty) directory `mountpoint`.
    pub fn new(backing: &Path, mountpoint: &Path) -> FaultMount {
        FaultMount::with_ttl(backing, mountpoint, TTL)
    }

    /// [`FaultMount::new`] whose attributes the kernel never caches: every `stat` and `fstat` of
    /// a file sees the backing file as it is now.
    pub fn uncached(backing: &Path, mountpoint: &Path) -> FaultMount {
        FaultMount::with_ttl(backing, mountpoint, Duration::ZERO)
    }

    fn with_ttl(backing: &Path, mountpoint: &Path, ttl: Duration) -> FaultMount {
        let read_delay_us = Arc::new(AtomicU64::new(0));
        let fail_reads = Arc::new(AtomicBool::new(false));
        let failed_reads = Arc::new(AtomicU64::new(0));
        let hang_reads = Arc::new(AtomicBool::new(false));
        let held_reads = Arc::new(AtomicU64::new(0));
        let fs = FaultFs {
            hang_reads: Arc::clone(&hang_reads),
            held_reads: Arc::clone(&held_reads),
            backing: backing.to_path_buf(),
            ttl,
            read_delay_us: Arc::clone(&read_delay_us),
            fail_reads: Arc::clone(&fail_reads),
            failed_reads: Arc::clone(&failed_reads),
            names: Mutex::new(Vec::new()),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::RO, fuser::MountOption::FSName("stfs-faultfs".into())];
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(fs, mountpoint, &config).expect("mount the fault filesystem");
        assert!(
            super::wait_until(super::TIMEOUT, || std::fs::metadata(mountpoint).map(|m| m.ino() == 1).unwrap_or(false)),
            "fault filesystem never answered"
        );
        FaultMount {
            path: mountpoint.to_path_buf(),
            fail_reads,
            failed_reads,
            hang_reads,
            held_reads,
            read_delay_us,
            session: Some(session),
        }
    }
}

impl Drop for FaultMount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if session.umount_and_join().is_err() {
                super::force_unmount(&self.path);
            }
        }
    }
}
