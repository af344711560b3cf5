//! A pod's view of a shared mount: a read-only bind of it at the volume's target path, and taking
//! that away. Detaching looks only at /proc/self/mountinfo and uses MNT_DETACH, so a target whose
//! daemon died or hangs is never asked anything (no stat, no statfs) before it is gone.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::mount::mountinfo;

/// Most mounts taken away from one target (binds stacked by repeated publishes).
const MOST_STACKED: usize = 16;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Binds `shared` (a mount) at `target` (an existing directory), then makes the bind read-only,
/// nosuid and nodev; undone if the second step fails.
pub fn bind_read_only(shared: &Path, target: &Path) -> io::Result<()> {
    let (source, place) = (c_path(shared)?, c_path(target)?);
    // SAFETY: valid NUL-terminated strings; null type and data are allowed with MS_BIND.
    let rc = unsafe { libc::mount(source.as_ptr(), place.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: as above.
    let rc = unsafe { libc::mount(std::ptr::null(), place.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
    if rc != 0 {
        let error = io::Error::last_os_error();
        // SAFETY: a valid NUL-terminated string.
        unsafe { libc::umount2(place.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
        return Err(error);
    }
    Ok(())
}

/// Whether mountinfo lists a mount at `target` (its parent resolved, the last component never
/// looked at).
pub fn is_mounted(target: &Path) -> io::Result<bool> {
    match mountinfo::locate(target) {
        Ok((_, top)) => Ok(top.is_some()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Detaches every mount stacked at `target` (MNT_DETACH: open files keep working until closed).
/// Nothing mounted there is not an error.
pub fn detach(target: &Path) -> io::Result<()> {
    let Ok((place, _)) = mountinfo::locate(target) else { return Ok(()) };
    let c = c_path(&place)?;
    for _ in 0..MOST_STACKED {
        if !mountinfo::mounts().iter().any(|m| m.mount_point == place) {
            return Ok(());
        }
        // SAFETY: a valid NUL-terminated string.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINVAL) {
                return Err(error);
            }
        }
    }
    Err(io::Error::other(format!("{}: still mounted after {MOST_STACKED} detaches", place.display())))
}

/// Removes the (empty, unmounted) directory `target`; a missing one is not an error.
pub fn remove_target(target: &Path) -> io::Result<()> {
    match std::fs::remove_dir(target) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
