//! System calls with a deadline. A call on a FUSE mount whose daemon is stopped or wedged can wait
//! in the kernel for as long as the daemon does, and a thread left waiting there would also hold up
//! the process's exit; so each call here runs in a forked child that is abandoned at the deadline.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// What a bounded call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It returned: 0, or the errno it failed with.
    Returned(i32),
    /// It had not returned by the deadline; the child is killed and left to init.
    TimedOut,
}

/// The path as a C string; `EINVAL` for a path holding a NUL byte, as the kernel would say.
fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The errno of the last failed call in this thread.
fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Runs `call` in a forked child and waits for it until `deadline`. `call` returns 0 or an errno
/// (below 256) and must only make system calls on memory prepared before the fork: the parent may
/// have other threads, and the child has only the one that forked.
fn in_child(deadline: Instant, call: impl FnOnce() -> i32) -> io::Result<Outcome> {
    // SAFETY: fork has no memory-safety preconditions; the child below only makes system calls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = call();
        // SAFETY: _exit ends the child at once, without running the parent's atexit handlers.
        unsafe { libc::_exit(code.clamp(0, 255)) };
    }
    let mut pause = Duration::from_micros(200);
    loop {
        let mut status = 0;
        // SAFETY: pid is our own child and status a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return Ok(match libc::WIFEXITED(status) {
                true => Outcome::Returned(libc::WEXITSTATUS(status)),
                false => Outcome::Returned(libc::EINTR),
            });
        }
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        if Instant::now() >= deadline {
            // SAFETY: pid is our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Ok(Outcome::TimedOut);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// umount2(2) of `path` with `flags`, given until `deadline`.
pub fn umount2(path: &Path, flags: i32, deadline: Instant) -> io::Result<Outcome> {
    let c = c_path(path)?;
    in_child(deadline, || {
        // SAFETY: c is a valid NUL-terminated string that outlives the call.
        match unsafe { libc::umount2(c.as_ptr(), flags) } {
            0 => 0,
            _ => errno(),
        }
    })
}

/// statfs(2) of `path`, given until `deadline`: `Returned(ENOTCONN)` for a FUSE mount whose
/// daemon is gone.
pub fn statfs(path: &Path, deadline: Instant) -> io::Result<Outcome> {
    let c = c_path(path)?;
    in_child(deadline, || {
        // SAFETY: c is a valid C string and buf a properly sized, writable statfs struct.
        let rc = unsafe {
            let mut buf: libc::statfs = std::mem::zeroed();
            libc::statfs(c.as_ptr(), &mut buf)
        };
        match rc {
            0 => 0,
            _ => errno(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_return_their_errno_and_slow_ones_time_out() {
        let soon = Instant::now() + Duration::from_secs(10);
        assert_eq!(statfs(Path::new("/"), soon).unwrap(), Outcome::Returned(0));
        assert_eq!(statfs(Path::new("/no/such/path"), soon).unwrap(), Outcome::Returned(libc::ENOENT));
        let dir = tempfile::tempdir().unwrap();
        let not_mounted = umount2(dir.path(), 0, soon).unwrap();
        assert!(matches!(not_mounted, Outcome::Returned(libc::EINVAL | libc::EPERM)), "{not_mounted:?}");
        let start = Instant::now();
        let slow = in_child(start + Duration::from_millis(50), || {
            // SAFETY: pause only waits for a signal (here the SIGKILL at the deadline).
            unsafe { libc::pause() };
            0
        });
        assert_eq!(slow.unwrap(), Outcome::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(
            statfs(Path::new(std::ffi::OsStr::from_bytes(b"/a\0b")), soon).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
