//! Mount points: checks before mounting (nothing there, nothing of the checkpoint under it), mounting
//! FUSE as `fuse.stfs` (detached with fsmount(2), then attached; with mount(2) on older kernels),
//! the daemon's own unmount with umount2(2) or fusermount3, and the kernel's readahead knob.
//! `stfs umount` is [`crate::mount::unmount`].

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mount::bounded::{self, Outcome};
use crate::mount::mountinfo;
pub use crate::mount::mountinfo::FS_TYPE;

/// The most `stfs mount` waits to learn whether a FUSE mount already at its mount point is stale.
const STALE_PROBE_LIMIT: Duration = Duration::from_millis(500);

/// How long `stfs mount` keeps looking again at its mount point while the mounts it finds there go
/// away (racing mounts withdrawing, one after another), before it says what it found last.
const RACE_LOOK_LIMIT: Duration = Duration::from_secs(5);

/// Why a directory cannot be mounted on, or unmounted.
#[derive(Debug)]
pub enum MountPointError {
    /// The path does not exist.
    Missing,
    /// The path is not a directory.
    NotADirectory,
    /// Something is mounted there already.
    AlreadyMounted,
    /// A FUSE mount whose daemon is gone ("Transport endpoint is not connected").
    Stale,
    /// Nothing is mounted there (for unmount).
    NotMounted,
    /// Files on the mount are still open (for unmount).
    Busy,
    /// The path holds a NUL byte, which no system call takes.
    NulInPath,
    /// The mount would hide a file of the checkpoint it serves: the file is under the mount point.
    HidesCheckpoint {
        /// The file, by its canonical path.
        file: PathBuf,
    },
    /// Any other failure of the system call.
    Io(io::Error),
}

impl std::fmt::Display for MountPointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MountPointError::Missing => f.write_str("mount point does not exist"),
            MountPointError::NotADirectory => f.write_str("mount point is not a directory"),
            MountPointError::AlreadyMounted => f.write_str("something is already mounted there"),
            MountPointError::Stale => {
                f.write_str("a stale mount whose daemon is gone is still there; run `stfs umount` on it first")
            }
            MountPointError::NotMounted => f.write_str("not a mount point"),
            MountPointError::Busy => f.write_str("mount is busy (files are open); close them or use --lazy"),
            MountPointError::NulInPath => f.write_str("path contains NUL"),
            MountPointError::HidesCheckpoint { file } => write!(
                f,
                "mounting here would hide {}, which the mount reads from; choose a mount point that does not \
                 contain it",
                file.display()
            ),
            MountPointError::Io(e) => f.write_str(&crate::util::describe_io(e)),
        }
    }
}

impl std::error::Error for MountPointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MountPointError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Checks that `path` is an existing directory with nothing mounted on it. A non-empty directory
/// is accepted, as FUSE 3 tools do: its contents are hidden while mounted. What is mounted there is
/// read from mountinfo, so a mount whose daemon does not answer cannot hold this check; a FUSE mount
/// found there is opened with O_PATH (which asks the filesystem nothing) and asked, through that
/// descriptor and for at most half a second, whether its daemon is gone, to say "stale": the mount
/// that answers is the one whose ID is then looked for in mountinfo, even if another was stacked
/// on the path meanwhile (a racing mount that withdraws ends its connection, and a probe of the
/// path alone could take its ENOTCONN for the live mount's below). One that goes away meanwhile is
/// not stale: the check is made again, for as long as the mounts found there keep going away
/// (several racing mounts withdraw one after another), within [`RACE_LOOK_LIMIT`]; past it, a
/// mount point where mounts keep coming and going is already mounted on.
pub fn check_mount_point(path: &Path) -> Result<(), MountPointError> {
    let give_up = Instant::now() + RACE_LOOK_LIMIT;
    loop {
        let (at, top) = mountinfo::locate(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => MountPointError::Missing,
            _ => MountPointError::Io(e),
        })?;
        let Some(entry) = top else { return check_directory(&at) };
        if !entry.fs_type.starts_with("fuse") {
            return Err(MountPointError::AlreadyMounted);
        }
        // Not opened (a mount going away meanwhile took the path with it): something is there.
        let Ok((root, id)) = open_mount_root(&at) else { return Err(MountPointError::AlreadyMounted) };
        let deadline = Instant::now() + STALE_PROBE_LIMIT;
        let stale = matches!(bounded::fstatfs(root.as_fd(), deadline), Ok(Outcome::Returned(libc::ENOTCONN)));
        if !stale {
            return Err(MountPointError::AlreadyMounted);
        }
        if mountinfo::mounts().iter().any(|m| m.id == id) {
            return Err(MountPointError::Stale);
        }
        if Instant::now() >= give_up {
            return Err(MountPointError::AlreadyMounted);
        }
    }
}

/// The root of the topmost mount at `at` (absolute, without symbolic links), opened with O_PATH,
/// and that mount's ID. Crossing into a mount's root and an O_PATH open ask its filesystem
/// nothing, so a wedged FUSE daemon cannot hold this up.
fn open_mount_root(at: &Path) -> io::Result<(OwnedFd, u64)> {
    let c_at = c_string(at.as_os_str().as_bytes())?;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid NUL-terminated path and flags.
    let root = owned_fd(unsafe { libc::open(c_at.as_ptr(), flags) }.into())?;
    let id = mount_id(&root)?;
    Ok((root, id))
}

/// The mount ID of the mount `fd` is on, from /proc/self/fdinfo (without asking the filesystem).
fn mount_id(fd: &OwnedFd) -> io::Result<u64> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    let id = info.lines().find_map(|line| line.strip_prefix("mnt_id:")?.trim().parse().ok());
    id.ok_or_else(|| io::Error::other("no mnt_id in /proc/self/fdinfo"))
}

/// Checks that `at`, with nothing mounted on it, is an existing directory.
fn check_directory(at: &Path) -> Result<(), MountPointError> {
    let meta = match fs::metadata(at) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(MountPointError::Missing),
        Err(e) => return Err(MountPointError::Io(e)),
    };
    if !meta.is_dir() {
        return Err(MountPointError::NotADirectory);
    }
    Ok(())
}

/// Checks that mounting on `path` hides none of `files`, the checkpoint's local files: a file under
/// the mount point (at any depth, or through a symbolic link) would be replaced by the mount's own
/// tree, and every read of it would fail. So would a symbolic link under the mount point that names
/// a file elsewhere, since the daemon looks the file up again by the name it was given. Call after
/// [`check_mount_point`]. The mount point is resolved as [`mountinfo::locate`] does, which asks
/// nothing of a mount made there meanwhile (by a racing `stfs mount`, whose daemon may be gone).
pub fn check_not_hiding<'a>(path: &Path, files: impl IntoIterator<Item = &'a Path>) -> Result<(), MountPointError> {
    let (mount_point, _) = mountinfo::locate(path).map_err(MountPointError::Io)?;
    for file in files {
        let real = fs::canonicalize(file).ok();
        let parent = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let named = file.file_name().and_then(|name| Some(fs::canonicalize(parent).ok()?.join(name)));
        if let Some(file) = [real, named].into_iter().flatten().find(|f| f.starts_with(&mount_point)) {
            return Err(MountPointError::HidesCheckpoint { file });
        }
    }
    Ok(())
}

/// Whether `path` is a FUSE mount whose daemon is gone. Asks statfs(2), which the kernel never
/// answers from its attribute cache (a plain stat may still succeed on a dead mount).
pub fn is_stale(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: c_path is a valid C string and buf a properly sized, writable statfs struct.
    let rc = unsafe {
        let mut buf: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut buf)
    };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// Whether `path` is listed as a mount point in /proc/self/mountinfo (found without asking the
/// mount anything: see [`mountinfo::locate`]).
pub fn is_mount_point(path: &Path) -> bool {
    mountinfo::locate(path).is_ok_and(|(_, top)| top.is_some())
}

/// The mount ID and type of the topmost mount on `path` (absolute, without symlinks), read from
/// /proc/self/mountinfo alone: a dead FUSE mount is found without touching it.
pub fn topmost_mount(path: &Path) -> Option<(u64, String)> {
    mountinfo::mounts().into_iter().rev().find(|m| m.mount_point == path).map(|m| (m.id, m.fs_type))
}

/// The most a mount that lost a race to another at its mount point takes to withdraw.
const WITHDRAW_LIMIT: Duration = Duration::from_secs(2);

/// fsopen(2), fsconfig(2) and fsmount(2) flags and commands (not in the libc crate).
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NODEV: u64 = 0x4;
/// move_mount(2): follow a symbolic link or automount at the mount point, as mount(2) does.
const MOVE_MOUNT_T_SYMLINKS: libc::c_uint = 0x10;
const MOVE_MOUNT_T_AUTOMOUNTS: libc::c_uint = 0x20;

/// A mount made by [`mount_fuse`] on its way to the mount point; the kernel's INIT request waits
/// on the /dev/fuse descriptor returned with it.
#[derive(Debug)]
pub enum PendingMount {
    /// Made with fsmount(2) and attached nowhere yet, its mount ID read from its descriptor: known
    /// before anything else can be mounted at the mount point. Dropped unattached, it is gone.
    Detached {
        /// The mount, for move_mount(2).
        mount: OwnedFd,
        /// Its mount ID.
        id: u64,
    },
    /// Made with mount(2), on a kernel without fsmount(2): attached already, its ID read from
    /// mountinfo right after, as the topmost mount at the mount point.
    Attached {
        /// Where.
        path: PathBuf,
        /// Its mount ID.
        id: u64,
    },
}

impl PendingMount {
    /// Puts the mount at `path` (a detached one is moved there with move_mount(2), following a
    /// symbolic link as mount(2) does) and returns its mount ID. Call once the mount answers INIT.
    pub fn attach(&self, path: &Path) -> io::Result<u64> {
        match self {
            PendingMount::Detached { mount, id } => {
                let target = c_string(path.as_os_str().as_bytes())?;
                let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_SYMLINKS | MOVE_MOUNT_T_AUTOMOUNTS;
                // SAFETY: an open mount descriptor, an empty and a valid NUL-terminated path.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_move_mount,
                        mount.as_raw_fd(),
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        target.as_ptr(),
                        flags,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(*id)
            }
            PendingMount::Attached { id, .. } => Ok(*id),
        }
    }

    /// Takes the mount away, before it served anything: a detached one is dropped; an attached
    /// one is detached lazily, through its own descriptor where it has one, so that this mount
    /// goes wherever it is, never another at its mount point. Tried again (for [`WITHDRAW_LIMIT`]
    /// at most) until mountinfo no longer lists it: while other mounts stacked with it withdraw
    /// too, the kernel may refuse or move it.
    pub fn withdraw(self) -> Result<(), MountPointError> {
        let (mount, id) = match self {
            PendingMount::Detached { mount, id } => (mount, id),
            PendingMount::Attached { path, .. } => return unmount_own(&path, true),
        };
        let own = CString::new(format!("/proc/self/fd/{}", mount.as_raw_fd())).expect("no NUL in a number");
        let deadline = Instant::now() + WITHDRAW_LIMIT;
        let mut pause = Duration::from_millis(1);
        loop {
            // SAFETY: a valid NUL-terminated path; the descriptor it names stays open meanwhile.
            // One not (or no longer) in the namespace gives EINVAL.
            let failed = unsafe { libc::umount2(own.as_ptr(), libc::MNT_DETACH) } != 0;
            let error = failed.then(io::Error::last_os_error);
            if !mountinfo::mounts().iter().any(|m| m.id == id) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(error.map_or(MountPointError::Busy, MountPointError::Io));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

/// `text` as a C string, or InvalidInput if it holds a NUL.
fn c_string(text: &[u8]) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"))
}

/// The result of a system call that returns a descriptor, as an owned one.
fn owned_fd(rc: libc::c_long) -> io::Result<OwnedFd> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call succeeded, so rc is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}

/// Mounts an empty FUSE filesystem of type [`FS_TYPE`] named `fsname` for `path`, read-only,
/// nosuid and nodev, and returns the /dev/fuse descriptor to serve it on (the kernel is waiting
/// there with its INIT request) with the mount, which the caller attaches at `path` once it has
/// answered INIT ([`PendingMount::attach`]). Made detached with fsmount(2) where the kernel has
/// it (Linux 5.4), else with mount(2). `Ok(None)` when /dev/fuse or mounting is not permitted (not
/// root), or there is no /dev/fuse (a container; [`crate::mount::access::check_can_mount`] saw a
/// fusermount3, maybe a proxy): the caller then lets fuser mount through fusermount. fuser 0.18's own mount(2) call
/// always says `fuse` and drops the subtype, so stfs mounts could not be told apart.
pub fn mount_fuse(path: &Path, fsname: &str, allow_other: bool) -> io::Result<Option<(OwnedFd, PendingMount)>> {
    let device = match fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(device) => device,
        Err(e) if matches!(e.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound) => return Ok(None),
        Err(e) => return Err(e),
    };
    // The mount point is a directory (checked before forking), and so is the root: it is not
    // looked at again, since whatever is mounted there meanwhile would be asked (a racing stfs
    // mount that is withdrawing answers ENOTCONN).
    let root_type = libc::S_IFDIR;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut options = vec![
        ("fd", Some(device.as_raw_fd().to_string())),
        ("rootmode", Some(format!("{root_type:o}"))),
        ("user_id", Some(uid.to_string())),
        ("group_id", Some(gid.to_string())),
    ];
    if allow_other {
        options.extend([("allow_other", None), ("default_permissions", None)]);
    }
    match mount_detached(fsname, &options) {
        Ok((mount, id)) => return Ok(Some((device.into(), PendingMount::Detached { mount, id }))),
        // No fsmount(2) here (ENOSYS), or not allowed to call it (EPERM): mount(2) decides.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {}
        Err(e) => return Err(e),
    }
    let data: Vec<String> =
        options.iter().map(|(key, value)| value.as_ref().map_or(key.to_string(), |v| format!("{key}={v}"))).collect();
    let (source, target, fs_type, data) = (
        c_string(fsname.as_bytes())?,
        c_string(path.as_os_str().as_bytes())?,
        c_string(FS_TYPE.as_bytes())?,
        c_string(data.join(",").as_bytes())?,
    );
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fs_type.as_ptr(), flags, data.as_ptr().cast()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EPERM) => Ok(None),
            _ => Err(e),
        };
    }
    match mountinfo::locate(path) {
        Ok((at, Some(top))) => Ok(Some((device.into(), PendingMount::Attached { path: at, id: top.id }))),
        _ => {
            let _ = unmount_own(path, true);
            Err(io::Error::other("mounted, but the mount is not listed in /proc/self/mountinfo"))
        }
    }
}

/// Makes a detached FUSE mount of type [`FS_TYPE`] with fsopen(2), fsconfig(2) (`options`: a
/// key and its value, or a flag) and fsmount(2), read-only, nosuid and nodev; returns it with its
/// mount ID (from /proc/self/fdinfo, without asking the filesystem).
fn mount_detached(fsname: &str, options: &[(&str, Option<String>)]) -> io::Result<(OwnedFd, u64)> {
    // SAFETY: a valid NUL-terminated filesystem name and flags.
    let context = owned_fd(unsafe { libc::syscall(libc::SYS_fsopen, c"fuse".as_ptr(), FSOPEN_CLOEXEC) })?;
    let configure = |command: libc::c_uint, key: Option<&str>, value: Option<&str>| -> io::Result<()> {
        let key = key.map(|k| c_string(k.as_bytes())).transpose()?;
        let value = value.map(|v| c_string(v.as_bytes())).transpose()?;
        let pointer = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: an open filesystem context, and NUL-terminated strings (or null where the
        // command takes none) that outlive the call.
        let rc = unsafe {
            libc::syscall(libc::SYS_fsconfig, context.as_raw_fd(), command, pointer(&key), pointer(&value), 0)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    configure(FSCONFIG_SET_STRING, Some("source"), Some(fsname))?;
    configure(FSCONFIG_SET_STRING, Some("subtype"), FS_TYPE.strip_prefix("fuse."))?;
    for (key, value) in options {
        match value {
            Some(value) => configure(FSCONFIG_SET_STRING, Some(key), Some(value))?,
            None => configure(FSCONFIG_SET_FLAG, Some(key), None)?,
        }
    }
    configure(FSCONFIG_SET_FLAG, Some("ro"), None)?;
    configure(FSCONFIG_CMD_CREATE, None, None)?;
    let attributes = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    // SAFETY: an open, created filesystem context and flags.
    let mount =
        owned_fd(unsafe { libc::syscall(libc::SYS_fsmount, context.as_raw_fd(), FSMOUNT_CLOEXEC, attributes) })?;
    let id = mount_id(&mount)?;
    Ok((mount, id))
}

/// Unmounts the mount at exactly `path` (no symbolic link followed) with umount2(2); `lazy`
/// detaches it even while files are open (MNT_DETACH). A user who may not call umount2 (not
/// root) goes through `fusermount3 -u` (`-z` when lazy). Only for the daemon and its watcher,
/// once they know that the topmost mount at `path` is their own (see
/// [`crate::mount::own_mount`]); `stfs umount` uses [`crate::mount::unmount::unmount`], which
/// touches nothing and is bounded in time.
pub fn unmount_own(path: &Path, lazy: bool) -> Result<(), MountPointError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| MountPointError::NulInPath)?;
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(c_path.as_ptr(), flags) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EPERM) => return through_fusermount(path, lazy).map_err(|_| MountPointError::Io(e)),
        Some(libc::EINVAL) => MountPointError::NotMounted,
        Some(libc::ENOENT) => MountPointError::Missing,
        Some(libc::EBUSY) => MountPointError::Busy,
        _ => MountPointError::Io(e),
    })
}

/// Unmounts `path` with fusermount3 (or fusermount), which lets a user unmount their own FUSE mount.
fn through_fusermount(path: &Path, lazy: bool) -> io::Result<()> {
    for helper in ["fusermount3", "fusermount"] {
        let run = Command::new(helper)
            .arg("-u")
            .args(lazy.then_some("-z"))
            .arg("--")
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match run {
            Ok(status) if status.success() => return Ok(()),
            Ok(status) => return Err(io::Error::other(format!("{helper} -u: {status}"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from(io::ErrorKind::NotFound))
}

/// Sets the kernel readahead of the FUSE mount at `path` (its bdi `read_ahead_kb`), so buffered and
/// mmap readers send requests of up to 1 MiB instead of 128 KiB. Needs root; returns the error otherwise.
pub fn set_kernel_readahead(path: &Path, kib: u32) -> io::Result<()> {
    let dev = fs::metadata(path)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    fs::write(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"), kib.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_point_checks() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_mount_point(dir.path()).is_ok());
        assert!(matches!(check_mount_point(&dir.path().join("missing")), Err(MountPointError::Missing)));
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(check_mount_point(&file), Err(MountPointError::NotADirectory)));
        assert!(is_mount_point(Path::new("/proc")));
        assert_eq!(topmost_mount(Path::new("/proc")).map(|(_, t)| t).as_deref(), Some("proc"));
        assert_eq!(topmost_mount(dir.path()), None);
        assert!(matches!(check_mount_point(Path::new("/proc")), Err(MountPointError::AlreadyMounted)));
        assert!(matches!(check_mount_point(&dir.path().join("a/b")), Err(MountPointError::Missing)));
        assert!(matches!(unmount_own(dir.path(), false), Err(MountPointError::NotMounted)));
        let nul = Path::new(std::ffi::OsStr::from_bytes(b"/a\0b"));
        assert_eq!(unmount_own(nul, false).unwrap_err().to_string(), "path contains NUL");
    }

    #[test]
    fn a_mount_point_over_the_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (d, other) = (dir.path().join("d"), dir.path().join("other"));
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::create_dir(&other).unwrap();
        let file = d.join("m.safetensors");
        fs::write(&file, b"x").unwrap();
        let link = other.join("link.safetensors");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let canonical = fs::canonicalize(&file).unwrap();
        for (mp, named) in [(&d, &file), (&dir.path().to_path_buf(), &file), (&d, &link)] {
            match check_not_hiding(mp, [named.as_path()]) {
                Err(MountPointError::HidesCheckpoint { file }) => assert_eq!(file, canonical),
                other => panic!("{} over {}: {other:?}", mp.display(), named.display()),
            }
        }
        // A link under the mount point to a file elsewhere: the daemon looks the file up by the link.
        match check_not_hiding(&other, [link.as_path()]) {
            Err(MountPointError::HidesCheckpoint { file }) => {
                assert_eq!(file, fs::canonicalize(&other).unwrap().join("link.safetensors"))
            }
            other => panic!("a link under the mount point: {other:?}"),
        }
        assert!(check_not_hiding(&other, [file.as_path()]).is_ok());
        assert!(check_not_hiding(&d.join("sub"), [file.as_path()]).is_ok());
    }
}
