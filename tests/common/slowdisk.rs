//! A writable FUSE passthrough of one directory tree for tests that need a slow disk below stfs's
//! cache directory: every WRITE or READ can be made to take a set time (a disk that barely
//! moves), and every RENAME onto a name with a set suffix too (a slow metadata update, to widen a
//! window between two renames), or fail (a disk full between two renames). Everything else passes straight through to the backing directory.
//!
//! Attributes and entries are never cached by the kernel (TTL 0), so what stfs sees is always the
//! backing directory as it is. Inode numbers are handed out per path (a rename moves the number).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenAccMode,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::ZERO;

#[derive(Default)]
struct Inodes {
    by_ino: HashMap<u64, PathBuf>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
}

struct SlowDisk {
    backing: PathBuf,
    write_delay_ms: Arc<AtomicU64>,
    read_delay_ms: Arc<AtomicU64>,
    rename_delay_ms: Arc<AtomicU64>,
    rename_fails: Arc<AtomicBool>,
    rename_suffix: String,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn sleep_ms(ms: &AtomicU64) {
    let ms = ms.load(SeqCst);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

impl SlowDisk {
    fn path(&self, ino: u64) -> Option<PathBuf> {
        if ino == 1 {
            return Some(self.backing.clone());
        }
        self.inodes.lock().unwrap().by_ino.get(&ino).cloned()
    }

    fn ino(&self, path: &Path) -> u64 {
        if path == self.backing {
            return 1;
        }
        let mut inodes = self.inodes.lock().unwrap();
        if let Some(&ino) = inodes.by_path.get(path) {
            return ino;
        }
        inodes.next = inodes.next.max(1) + 1;
        let ino = inodes.next;
        inodes.by_ino.insert(ino, path.to_path_buf());
        inodes.by_path.insert(path.to_path_buf(), ino);
        ino
    }

    fn forget_path(&self, path: &Path) {
        let mut inodes = self.inodes.lock().unwrap();
        if let Some(ino) = inodes.by_path.remove(path) {
            inodes.by_ino.remove(&ino);
        }
    }

    fn attr(&self, path: &Path) -> std::io::Result<FileAttr> {
        let m = std::fs::symlink_metadata(path)?;
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
        let kind = if m.is_dir() {
            FileType::Directory
        } else if m.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        Ok(FileAttr {
            ino: INodeNo(self.ino(path)),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.mtime(), m.mtime_nsec()),
            kind,
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Option<PathBuf> {
        self.path(parent.0).map(|p| p.join(name))
    }

    fn keep(&self, file: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, SeqCst) + 1;
        self.files.lock().unwrap().insert(fh, Arc::new(file));
        FileHandle(fh)
    }

    fn file(&self, fh: FileHandle) -> Option<Arc<File>> {
        self.files.lock().unwrap().get(&fh.0).cloned()
    }
}

impl Filesystem for SlowDisk {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(path) = self.child(parent, name) else { return reply.error(Errno::ENOENT) };
        match self.attr(&path) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(path) = self.path(ino.0) else { return reply.error(Errno::ENOENT) };
        match self.attr(&path) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(path) = self.path(ino.0) else { return reply.error(Errno::ENOENT) };
        let result = (|| {
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if size.is_some() || atime.is_some() || mtime.is_some() {
                let file = File::options().write(true).open(&path)?;
                if let Some(size) = size {
                    file.set_len(size)?;
                }
                let at = |t: TimeOrNow| match t {
                    TimeOrNow::SpecificTime(t) => t,
                    TimeOrNow::Now => std::time::SystemTime::now(),
                };
                let mut times = std::fs::FileTimes::new();
                if let Some(t) = atime {
                    times = times.set_accessed(at(t));
                }
                if let Some(t) = mtime {
                    times = times.set_modified(at(t));
                }
                file.set_times(times)?;
            }
            self.attr(&path)
        })();
        match result {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let Some(path) = self.child(parent, name) else { return reply.error(Errno::ENOENT) };
        match std::fs::DirBuilder::new().mode(mode & !umask & 0o7777).create(&path).and_then(|()| self.attr(&path)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Some(path) = self.child(parent, name) else { return reply.error(Errno::ENOENT) };
        let mut options = File::options();
        options.read(true).write(true).mode(mode & !umask & 0o7777);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        match options.open(&path).and_then(|f| Ok((f, self.attr(&path)?))) {
            Ok((file, a)) => reply.created(&TTL, &a, Generation(0), self.keep(file), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(path) = self.path(ino.0) else { return reply.error(Errno::ENOENT) };
        let mut options = File::options();
        match flags.acc_mode() {
            OpenAccMode::O_RDONLY => options.read(true),
            OpenAccMode::O_WRONLY => options.write(true),
            _ => options.read(true).write(true),
        };
        match options.open(&path) {
            Ok(file) => reply.opened(self.keep(file), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        sleep_ms(&self.read_delay_ms);
        let Some(file) = self.file(fh) else { return reply.error(Errno::EBADF) };
        let mut buf = vec![0; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..filled]);
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        sleep_ms(&self.write_delay_ms);
        let Some(file) = self.file(fh) else { return reply.error(Errno::EBADF) };
        match file.write_all_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (Some(from), Some(to)) = (self.child(parent, name), self.child(newparent, newname)) else {
            return reply.error(Errno::ENOENT);
        };
        if newname.to_string_lossy().ends_with(&self.rename_suffix) {
            sleep_ms(&self.rename_delay_ms);
            if self.rename_fails.load(SeqCst) {
                return reply.error(Errno::ENOSPC);
            }
        }
        // With the caller's flags (RENAME_NOREPLACE), as the filesystem below would take them.
        match rename_with_flags(&from, &to, flags.bits()) {
            Ok(()) => {
                self.forget_path(&to);
                let mut inodes = self.inodes.lock().unwrap();
                if let Some(ino) = inodes.by_path.remove(&from) {
                    inodes.by_ino.insert(ino, to.clone());
                    inodes.by_path.insert(to, ino);
                }
                drop(inodes);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(path) = self.child(parent, name) else { return reply.error(Errno::ENOENT) };
        match std::fs::remove_file(&path) {
            Ok(()) => {
                self.forget_path(&path);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(path) = self.child(parent, name) else { return reply.error(Errno::ENOENT) };
        match std::fs::remove_dir(&path) {
            Ok(()) => {
                self.forget_path(&path);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Lists the backing directory afresh at each call and resumes at `offset` by position, so a
    /// listing that takes several calls while entries come and go may skip or repeat one: count
    /// what a test must count exactly in the backing directory.
    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(path) = self.path(ino.0) else { return reply.error(Errno::ENOENT) };
        let mut entries = vec![(ino.0, FileType::Directory, ".".into()), (1, FileType::Directory, "..".into())];
        match std::fs::read_dir(&path) {
            Ok(dir) => {
                for e in dir.flatten() {
                    let kind = match e.file_type() {
                        Ok(t) if t.is_dir() => FileType::Directory,
                        Ok(t) if t.is_symlink() => FileType::Symlink,
                        _ => FileType::RegularFile,
                    };
                    entries.push((self.ino(&e.path()), kind, e.file_name()));
                }
            }
            Err(e) => return reply.error(errno(&e)),
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(self.backing.as_os_str())).unwrap();
        // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: statvfs fills `s`; `c` is a valid C string for the call.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(Errno::EIO);
        }
        reply.statfs(
            s.f_blocks as u64,
            s.f_bfree as u64,
            s.f_bavail as u64,
            s.f_files as u64,
            s.f_ffree as u64,
            s.f_bsize as u32,
            255,
            s.f_frsize as u32,
        );
    }
}

/// A mounted slow disk; unmounted when dropped.
pub struct SlowDiskMount {
    /// Where it is mounted.
    pub path: PathBuf,
    /// Milliseconds every WRITE takes (0: as fast as the backing directory).
    pub write_delay_ms: Arc<AtomicU64>,
    /// Milliseconds every READ takes.
    pub read_delay_ms: Arc<AtomicU64>,
    /// Milliseconds every RENAME onto a name ending in the suffix takes.
    pub rename_delay_ms: Arc<AtomicU64>,
    /// While set, every RENAME onto a name ending in the suffix fails with ENOSPC (a disk that
    /// fills up between two renames).
    pub rename_fails: Arc<AtomicBool>,
    session: Option<fuser::BackgroundSession>,
}

impl SlowDiskMount {
    /// Mounts a writable passthrough of `backing` on the (existing, empty) directory
    /// `mountpoint`; renames onto names ending in `rename_suffix` take `rename_delay_ms`.
    pub fn new(backing: &Path, mountpoint: &Path, rename_suffix: &str) -> SlowDiskMount {
        let write_delay_ms = Arc::new(AtomicU64::new(0));
        let read_delay_ms = Arc::new(AtomicU64::new(0));
        let rename_delay_ms = Arc::new(AtomicU64::new(0));
        let rename_fails = Arc::new(AtomicBool::new(false));
        let fs = SlowDisk {
            backing: backing.to_path_buf(),
            write_delay_ms: Arc::clone(&write_delay_ms),
            read_delay_ms: Arc::clone(&read_delay_ms),
            rename_delay_ms: Arc::clone(&rename_delay_ms),
            rename_fails: Arc::clone(&rename_fails),
            rename_suffix: rename_suffix.to_string(),
            inodes: Mutex::default(),
            files: Mutex::default(),
            next_fh: AtomicU64::new(0),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("stfs-slowdisk".into())];
        config.n_threads = Some(8);
        let session = fuser::spawn_mount(fs, mountpoint, &config).expect("mount the slow disk");
        assert!(
            super::wait_until(super::TIMEOUT, || std::fs::metadata(mountpoint).map(|m| m.ino() == 1).unwrap_or(false)),
            "slow disk never answered"
        );
        SlowDiskMount {
            path: mountpoint.to_path_buf(),
            write_delay_ms,
            read_delay_ms,
            rename_delay_ms,
            rename_fails,
            session: Some(session),
        }
    }
}

impl Drop for SlowDiskMount {
    fn drop(&mut self) {
        self.write_delay_ms.store(0, SeqCst);
        self.read_delay_ms.store(0, SeqCst);
        self.rename_delay_ms.store(0, SeqCst);
        if let Some(session) = self.session.take() {
            if session.umount_and_join().is_err() {
                super::force_unmount(&self.path);
            }
        }
    }
}

/// `renameat2(from, to, flags)`.
fn rename_with_flags(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let (from, to) = (c(from), c(to));
    // SAFETY: two valid NUL-terminated paths that outlive the call.
    let done = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
