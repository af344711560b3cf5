//! Mount points: checks before mounting (nothing there, nothing of the checkpoint under it), mounting
//! FUSE as `fuse.stfs` with mount(2), the daemon's own unmount with umount2(2), and the kernel's
//! readahead knob. `stfs umount` is [`crate::mount::unmount`].

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mount::bounded::{self, Outcome};
use crate::mount::mountinfo;
pub use crate::mount::mountinfo::FS_TYPE;

/// The most `stfs mount` waits to learn whether a FUSE mount already at its mount point is stale.
const STALE_PROBE_LIMIT: Duration = Duration::from_millis(500);

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
/// found there is asked (for at most half a second) whether its daemon is gone, to say "stale".
pub fn check_mount_point(path: &Path) -> Result<(), MountPointError> {
    let (at, top) = mountinfo::locate(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => MountPointError::Missing,
        _ => MountPointError::Io(e),
    })?;
    if let Some(entry) = top {
        let deadline = Instant::now() + STALE_PROBE_LIMIT;
        let stale = entry.fs_type.starts_with("fuse")
            && matches!(bounded::statfs(&at, deadline), Ok(Outcome::Returned(libc::ENOTCONN)));
        return Err(if stale { MountPointError::Stale } else { MountPointError::AlreadyMounted });
    }
    let meta = match fs::metadata(&at) {
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
/// [`check_mount_point`] (nothing is mounted there, so resolving it asks no daemon).
pub fn check_not_hiding<'a>(path: &Path, files: impl IntoIterator<Item = &'a Path>) -> Result<(), MountPointError> {
    let mount_point = fs::canonicalize(path).map_err(MountPointError::Io)?;
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

/// Mounts an empty FUSE filesystem of type [`FS_TYPE`] named `fsname` on `path` with mount(2),
/// read-only, nosuid and nodev, and returns the /dev/fuse descriptor to serve it on (the kernel
/// is waiting there with its INIT request). `Ok(None)` when /dev/fuse or mount(2) is not
/// permitted (not root): the caller then lets fuser mount through fusermount. fuser 0.18's own
/// mount(2) call always says `fuse` and drops the subtype, so stfs mounts could not be told apart.
pub fn mount_fuse(path: &Path, fsname: &str, allow_other: bool) -> io::Result<Option<OwnedFd>> {
    let device = match fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(device) => device,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => return Err(e),
    };
    let root_type = fs::metadata(path)?.mode() & libc::S_IFMT;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!("fd={},rootmode={root_type:o},user_id={uid},group_id={gid}", device.as_raw_fd());
    if allow_other {
        data.push_str(",allow_other,default_permissions");
    }
    let c = |text: &[u8]| CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"));
    let (source, target, fs_type, data) =
        (c(fsname.as_bytes())?, c(path.as_os_str().as_bytes())?, c(FS_TYPE.as_bytes())?, c(data.as_bytes())?);
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fs_type.as_ptr(), flags, data.as_ptr().cast()) };
    if rc == 0 {
        return Ok(Some(device.into()));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EPERM) => Ok(None),
        _ => Err(e),
    }
}

/// Unmounts the daemon's own mount at `path` with umount2(2); `lazy` detaches it even while files
/// are open (MNT_DETACH). Only for the daemon, whose own threads answer the mount: `stfs umount`
/// uses [`crate::mount::unmount::unmount`], which touches nothing and is bounded in time.
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
        Some(libc::EINVAL) => MountPointError::NotMounted,
        Some(libc::ENOENT) => MountPointError::Missing,
        Some(libc::EBUSY) => MountPointError::Busy,
        _ => MountPointError::Io(e),
    })
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
