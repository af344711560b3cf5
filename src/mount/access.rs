//! What a user needs to mount FUSE: read-write access to /dev/fuse, and, unless root, the setuid
//! helper fusermount3 (package fuse3) that mounts and unmounts for them; without any /dev/fuse (a
//! container), a fusermount3 alone (a proxy that mounts from outside, as SkyPilot's fuse-proxy).
//! Checked before mounting, so that a mount that cannot work fails with one line saying what is
//! missing and what to do.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The FUSE device.
pub const DEV_FUSE: &str = "/dev/fuse";

/// Why this user cannot mount FUSE.
#[derive(Debug)]
pub enum AccessError {
    /// There is no /dev/fuse.
    NoDevice,
    /// /dev/fuse is there but this user may not open it for reading and writing.
    NoDeviceAccess {
        /// Its permission bits.
        mode: u32,
        /// Its owner's uid.
        owner: u32,
    },
    /// /dev/fuse could not be opened for another reason.
    Device(io::Error),
    /// A user who is not root has no fusermount3 (or fusermount) to mount and unmount with.
    NoFusermount,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccessError::NoDevice => f.write_str(
                "no /dev/fuse and no fusermount3 to mount through: load the FUSE module (`modprobe fuse` as \
                 root), or start the container with `--device /dev/fuse` (or with a fusermount3 proxy on PATH)",
            ),
            AccessError::NoDeviceAccess { mode, owner } => write!(
                f,
                "no access to /dev/fuse (mode {mode:04o}, owner uid {owner}): a user who is not root needs to \
                 read and write it; desktop distributions make it 0666 (udev), here run `chmod 0666 /dev/fuse` \
                 as root, or mount as root"
            ),
            AccessError::Device(e) => write!(f, "cannot open /dev/fuse: {}", crate::util::describe_io(e)),
            AccessError::NoFusermount => f.write_str(NO_FUSERMOUNT),
        }
    }
}

impl std::error::Error for AccessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AccessError::Device(e) => Some(e),
            _ => None,
        }
    }
}

/// What to say when a user who is not root has no fusermount3.
pub const NO_FUSERMOUNT: &str = "no fusermount3, which a user who is not root needs to mount and unmount FUSE \
                                 filesystems: install the fuse3 package (`apt install fuse3`, `dnf install fuse3`), \
                                 or run as root";

/// Whether this process runs as root (effective uid 0), which may call mount(2) and umount2(2).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `path` is a regular file someone may execute.
fn executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The fusermount binary fuser will run, found as fuser looks for it: `FUSERMOUNT_PATH` if set,
/// else `fusermount3` or `fusermount` on PATH, then in /sbin and /bin.
pub fn find_fusermount() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FUSERMOUNT_PATH") {
        return Some(PathBuf::from(path)).filter(|p| executable(p));
    }
    const NAMES: [&str; 2] = ["fusermount3", "fusermount"];
    let path_dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    let on_path = NAMES.iter().flat_map(|name| path_dirs.iter().map(move |dir| dir.join(name)));
    let fixed = ["/sbin", "/bin"].iter().flat_map(|dir| NAMES.iter().map(move |name| Path::new(dir).join(name)));
    on_path.chain(fixed).find(|p| executable(p))
}

/// Checks that this user can mount FUSE: /dev/fuse opens for reading and writing, and a user who
/// is not root has fusermount3. Where there is no /dev/fuse at all, a fusermount3 (or fusermount)
/// found as fuser finds it is enough, for root too: it mounts and hands the descriptor over
/// (`_FUSE_COMMFD`), which a proxy does from outside a container.
pub fn check_can_mount() -> Result<(), AccessError> {
    match fs::OpenOptions::new().read(true).write(true).open(DEV_FUSE) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return find_fusermount().map(|_| ()).ok_or(AccessError::NoDevice);
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let meta = fs::metadata(DEV_FUSE).map_err(AccessError::Device)?;
            return Err(AccessError::NoDeviceAccess { mode: meta.mode() & 0o7777, owner: meta.uid() });
        }
        Err(e) => return Err(AccessError::Device(e)),
    }
    if !is_root() && find_fusermount().is_none() {
        return Err(AccessError::NoFusermount);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_why_and_what_to_do() {
        let e = AccessError::NoDeviceAccess { mode: 0o600, owner: 0 };
        assert!(e.to_string().starts_with("no access to /dev/fuse (mode 0600, owner uid 0)"), "{e}");
        assert!(e.to_string().contains("chmod 0666 /dev/fuse"));
        let e = AccessError::NoFusermount.to_string();
        assert!(e.starts_with("no fusermount3") && e.contains("install the fuse3 package"), "{e}");
        assert!(AccessError::NoDevice.to_string().contains("modprobe fuse"));
    }

    #[test]
    fn fusermount_is_found_only_as_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!executable(dir.path()));
        let file = dir.path().join("fusermount3");
        fs::write(&file, "#!/bin/sh\n").unwrap();
        assert!(!executable(&file));
        fs::set_permissions(&file, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(executable(&file));
        assert!(!executable(Path::new("/dev/null")));
    }
}
