//! Mount points: checks before mounting, mounting FUSE as `fuse.stfs` with mount(2), unmounting with
//! umount2(2), and the kernel's readahead knob.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The filesystem type stfs mounts as: what mount(8), findmnt, df -T and fstab's type field show.
pub const FS_TYPE: &str = "fuse.stfs";

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
/// is accepted, as FUSE 3 tools do: its contents are hidden while mounted.
pub fn check_mount_point(path: &Path) -> Result<(), MountPointError> {
    if is_stale(path) {
        return Err(MountPointError::Stale);
    }
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Err(MountPointError::Stale),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(MountPointError::Missing),
        Err(e) => return Err(MountPointError::Io(e)),
    };
    if !meta.is_dir() {
        return Err(MountPointError::NotADirectory);
    }
    if is_mount_point(path) {
        return Err(MountPointError::AlreadyMounted);
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

/// Whether `path` is listed as a mount point in /proc/self/mountinfo.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(canonical) = fs::canonicalize(path).or_else(|_| std::path::absolute(path)) else { return false };
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else { return false };
    info.lines()
        .any(|line| line.split(' ').nth(4).map(unescape_mountinfo).as_deref() == Some(canonical.as_os_str().as_bytes()))
}

/// The mount ID and type of the topmost mount on `path` (absolute, without symlinks), read from
/// /proc/self/mountinfo alone: a dead FUSE mount is found without touching it.
pub fn topmost_mount(path: &Path) -> Option<(u64, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let on_path = |line: &str| {
        let fields: Vec<&str> = line.splitn(6, ' ').collect();
        let fs_type = line.split(" - ").nth(1)?.split(' ').next()?;
        let here = unescape_mountinfo(fields.get(4)?) == path.as_os_str().as_bytes();
        here.then(|| Some((fields[0].parse().ok()?, fs_type.to_string()))).flatten()
    };
    info.lines().rev().find_map(on_path)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal =
            b.get(i + 1..i + 4).and_then(|o| std::str::from_utf8(o).ok()).and_then(|o| u8::from_str_radix(o, 8).ok());
        match (b[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
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

/// Unmounts `path` with umount2(2); `lazy` detaches it even while files are open (MNT_DETACH).
/// A stale mount (its daemon killed) is always detached, since nobody can be served there anyway.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), MountPointError> {
    let stale = is_stale(path);
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| MountPointError::NulInPath)?;
    let flags = if lazy || stale { libc::MNT_DETACH } else { 0 };
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
    fn mountinfo_octal_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b\134c"), b"/mnt/a b\\c");
        assert_eq!(unescape_mountinfo(r"/plain"), b"/plain");
        assert_eq!(unescape_mountinfo(r"/trailing\04"), b"/trailing\\04");
    }

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
        assert!(matches!(unmount(dir.path(), false), Err(MountPointError::NotMounted)));
        let nul = Path::new(std::ffi::OsStr::from_bytes(b"/a\0b"));
        assert_eq!(unmount(nul, false).unwrap_err().to_string(), "path contains NUL");
    }
}
