//! `auto_unmount`: a small watcher process that detaches the mount when the daemon dies.
//!
//! The watcher is forked (twice, so init adopts it and no zombie is left) before the daemon starts
//! any thread, and holds the read end of a pipe whose write end only the daemon keeps. Once the
//! mount answers the daemon writes the mount's ID into the pipe. When the pipe closes, the daemon
//! is gone (exit, crash, SIGKILL): if /proc/self/mountinfo still shows that same mount as the
//! topmost one on the mount point, the watcher detaches it (umount2 MNT_DETACH as root, else
//! `fusermount3 -u -z`), then exits. It never stats the mount point, which would hang or fail on a
//! dead FUSE mount. After a normal unmount the daemon exits, and the watcher finds nothing to do.

use std::ffi::CStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use log::{info, warn};

use crate::mount::mountinfo;
use crate::mount::mountpoint::{topmost_mount, unmount_own, FS_TYPE};

/// The watcher's process name (comm), as ps and pgrep show it.
pub const WATCHER_NAME: &CStr = c"stfs-watch";

/// The daemon's end of the watcher's pipe. Dropping it without [`AutoUnmount::arm`] lets the
/// watcher exit with nothing to do.
#[derive(Debug)]
pub struct AutoUnmount {
    pipe: File,
}

impl AutoUnmount {
    /// Tells the watcher which mount to detach if the daemon dies: the daemon's own, by its mount
    /// ID ([`crate::mount::own_mount`]). Call once the mount answers.
    pub fn arm(&mut self, id: u64) {
        if let Err(e) = writeln!(self.pipe, "{id}") {
            warn!("auto_unmount: the watcher is gone ({e}); the mount stays if stfs dies");
        }
    }
}

/// Forks the watcher of `mountpoint` (an existing directory, not yet mounted on); `init` runs in
/// the watcher once it has closed every inherited descriptor but the standard streams (it sets up
/// logging). The process must be single-threaded.
pub fn spawn_watcher(mountpoint: &Path, init: impl FnOnce()) -> io::Result<AutoUnmount> {
    // mountinfo lists mount points without symlinks; resolve them now, asking nothing of a mount
    // that a racing `stfs mount` may have made there meanwhile.
    let (mountpoint, _) = mountinfo::locate(mountpoint)?;
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: single-threaded (the caller's contract); the child only forks again or exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: as above; the intermediate child exits at once, so init adopts the watcher.
        if unsafe { libc::fork() } == 0 {
            crate::mount::limits::restore_for_child();
            drop(write_end);
            watch(read_end, &mountpoint, init);
        }
        // SAFETY: _exit skips the parent's atexit handlers and buffers, as a forked child must.
        unsafe { libc::_exit(0) };
    }
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(read_end);
    let mut status = 0;
    // SAFETY: child is our own child's pid and status a valid int.
    while unsafe { libc::waitpid(child, &mut status, 0) } < 0 {
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    Ok(AutoUnmount { pipe: File::from(write_end) })
}

/// The watcher: waits for the pipe to close, detaches the mount if it is still the daemon's, exits.
fn watch(pipe: OwnedFd, mountpoint: &Path, init: impl FnOnce()) -> ! {
    close_inherited(pipe.as_raw_fd());
    // SAFETY: prctl with a NUL-terminated name, signal with a valid disposition: no preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, WATCHER_NAME.as_ptr());
        // A terminal's Ctrl-C or hangup is for the daemon, which unmounts; the watcher outlives it.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let _ = std::env::set_current_dir("/");
    init();
    let mut report = Vec::new();
    let _ = File::from(pipe).read_to_end(&mut report);
    let id = std::str::from_utf8(&report).ok().and_then(|t| t.trim().parse::<u64>().ok());
    if let Some(id) = id {
        if topmost_mount(mountpoint) == Some((id, FS_TYPE.to_string())) {
            match unmount_own(mountpoint, true) {
                Ok(()) => warn!("the stfs daemon of {} died: its mount was detached", mountpoint.display()),
                Err(e) => warn!("the stfs daemon of {} died; detaching its mount failed: {e}", mountpoint.display()),
            }
        } else {
            info!("auto_unmount: {} was unmounted", mountpoint.display());
        }
    }
    // SAFETY: _exit ends the watcher without running the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}

/// Closes every descriptor but the standard streams and `keep`: the watcher must not hold the
/// daemon's readiness pipe (its parent would wait for it), the checkpoint or /dev/fuse.
fn close_inherited(keep: i32) {
    let Ok(dir) = fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<i32> = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    for fd in fds.into_iter().filter(|&fd| fd > 2 && fd != keep) {
        // SAFETY: closing a descriptor nothing in this process uses any more (the listing's own
        // descriptor is already closed and gets EBADF).
        unsafe { libc::close(fd) };
    }
}
