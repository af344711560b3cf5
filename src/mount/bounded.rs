//! System calls with a deadline. A call on a FUSE mount whose daemon is stopped or wedged can wait
//! in the kernel for as long as the daemon does, and a thread left waiting there would also hold up
//! the process's exit; so each call here runs in a forked child that is abandoned at the deadline,
//! or, for an unmount, once it has stopped working: a call still running on a CPU (the kernel
//! forgetting a large mount's inodes in the calling task) is given until a later limit.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// What a bounded call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It returned: 0, or the errno it failed with.
    Returned(i32),
    /// It had not returned by the deadline, and was waiting, not working; the child is killed and
    /// left to init.
    TimedOut,
    /// It was still working in the kernel (running, or using CPU time since the last look) at the
    /// last limit it was given; the child is killed, which takes effect once the call returns.
    StillWorking,
}

/// How long a bounded call is waited for.
#[derive(Debug, Clone, Copy)]
struct Patience {
    /// Given up at this point unless it is working.
    deadline: Instant,
    /// Given up at this point whatever it is doing.
    limit: Instant,
}

/// How often a call past its deadline is looked at to see whether it still works.
const WORK_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The path as a C string; `EINVAL` for a path holding a NUL byte, as the kernel would say.
fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The errno of the last failed call in this thread.
fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Runs `call` in a forked child and waits for it as `patience` says. `call` returns 0 or an errno
/// (below 256) and must only make system calls on memory prepared before the fork: the parent may
/// have other threads, and the child has only the one that forked.
fn in_child(patience: Patience, call: impl FnOnce() -> i32) -> io::Result<Outcome> {
    // SAFETY: fork has no memory-safety preconditions; the child below only makes system calls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // Nothing but the exit status comes back, and a child that outlives its deadline must
        // not hold the caller's output open: on FUSE over io_uring a request the kernel handed to
        // a stopped daemon's ring cannot be abandoned, and its caller waits, unkillable, until the
        // daemon runs again.
        for fd in 0..3 {
            // SAFETY: close is async-signal-safe; the child uses none of these descriptors.
            unsafe { libc::close(fd) };
        }
        let code = call();
        // SAFETY: _exit ends the child at once, without running the parent's atexit handlers.
        unsafe { libc::_exit(code.clamp(0, 255)) };
    }
    let mut pause = Duration::from_micros(200);
    let mut work = WorkWatch::default();
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
        let now = Instant::now();
        if now >= patience.deadline {
            let working = work.working(pid);
            if !working || now >= patience.limit {
                // SAFETY: pid is our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Ok(if working { Outcome::StillWorking } else { Outcome::TimedOut });
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// umount2(2) of `path` with `flags`, given until `deadline`.
///
/// Past `deadline` it is waited for while it still works in the kernel, up to `limit`: an unmount
/// forgets every inode of the mount in the calling task, about 8 µs each here (2.4 s for 300,000
/// files listed with `ls -l`), and a daemon that does not answer leaves it asleep instead.
pub fn umount2(path: &Path, flags: i32, deadline: Instant, limit: Instant) -> io::Result<Outcome> {
    let c = c_path(path)?;
    in_child(Patience { deadline, limit: limit.max(deadline) }, || {
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
    in_child(Patience { deadline, limit: deadline }, || {
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

/// fstatfs(2) of `fd` (an O_PATH descriptor will do), given until `deadline`: `Returned(ENOTCONN)`
/// for a FUSE mount whose daemon is gone. Asks exactly the filesystem `fd` is on, whatever has
/// been mounted over its path since it was opened.
pub fn fstatfs(fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<Outcome> {
    let fd = fd.as_raw_fd();
    in_child(Patience { deadline, limit: deadline }, || {
        // SAFETY: fd is open (inherited by the child) and buf a properly sized, writable struct.
        let rc = unsafe {
            let mut buf: libc::statfs = std::mem::zeroed();
            libc::fstatfs(fd, &mut buf)
        };
        match rc {
            0 => 0,
            _ => errno(),
        }
    })
}

/// Tells a child that still works in the kernel from one that waits, looked at every
/// [`WORK_CHECK_EVERY`] once its deadline has passed.
#[derive(Debug, Default)]
pub struct WorkWatch {
    /// When it was last looked at, whether it was working then, and the CPU time it had used.
    last: Option<(Instant, bool, u64)>,
}

impl WorkWatch {
    /// Whether process `pid` is working: running now, or having used CPU time since the last look
    /// (an answer at most [`WORK_CHECK_EVERY`] old is given again). The first look only takes a
    /// baseline and counts as working: an unmount sleeps now and then while it works (waiting for
    /// RCU, or for a lock another unmount holds), so one sample in such a sleep decides nothing.
    /// One that cannot be read is not working.
    pub fn working(&mut self, pid: libc::pid_t) -> bool {
        let now = Instant::now();
        if let Some((at, working, _)) = self.last {
            if now < at + WORK_CHECK_EVERY {
                return working;
            }
        }
        let Some((running, ticks)) = activity(pid) else { return false };
        let worked = self.last.is_none_or(|(_, _, before)| ticks > before);
        self.last = Some((now, running || worked, ticks));
        running || worked
    }
}

/// Whether process `pid` is running (state `R`), and the CPU time it has used (user and system
/// clock ticks), from `/proc/PID/stat`; `None` if it cannot be read.
fn activity(pid: libc::pid_t) -> Option<(bool, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = crate::stats::process::stat_fields_after_comm(&stat)?;
    let running = fields.first()? == &"R";
    let ticks = fields.get(14 - 3)?.parse::<u64>().ok()? + fields.get(15 - 3)?.parse::<u64>().ok()?;
    Some((running, ticks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn calls_return_their_errno_and_slow_ones_time_out() {
        let soon = Instant::now() + Duration::from_secs(10);
        assert_eq!(statfs(Path::new("/"), soon).unwrap(), Outcome::Returned(0));
        assert_eq!(statfs(Path::new("/no/such/path"), soon).unwrap(), Outcome::Returned(libc::ENOENT));
        let root = std::fs::File::open("/").unwrap();
        assert_eq!(fstatfs(root.as_fd(), soon).unwrap(), Outcome::Returned(0));
        let dir = tempfile::tempdir().unwrap();
        let not_mounted = umount2(dir.path(), 0, soon, soon).unwrap();
        assert!(matches!(not_mounted, Outcome::Returned(libc::EINVAL | libc::EPERM)), "{not_mounted:?}");
        let start = Instant::now();
        let waits = Patience { deadline: start + Duration::from_millis(50), limit: start + Duration::from_secs(30) };
        let slow = in_child(waits, || {
            // SAFETY: pause only waits for a signal (here the SIGKILL at the deadline).
            unsafe { libc::pause() };
            0
        });
        assert_eq!(slow.unwrap(), Outcome::TimedOut, "a call that waits is not given until its limit");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(
            statfs(Path::new(std::ffi::OsStr::from_bytes(b"/a\0b")), soon).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    /// Spins on the CPU until `until` (as the kernel does forgetting inodes), then returns 0.
    fn spin(until: Instant) -> i32 {
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        0
    }

    #[test]
    fn a_call_that_works_past_its_deadline_is_given_until_its_limit() {
        let start = Instant::now();
        let patience = Patience { deadline: start + Duration::from_millis(50), limit: start + Duration::from_secs(30) };
        let done = in_child(patience, || spin(start + Duration::from_millis(600)));
        assert_eq!(done.unwrap(), Outcome::Returned(0), "a working call is waited for past its deadline");
        assert!(start.elapsed() >= Duration::from_millis(600));
        let start = Instant::now();
        let patience =
            Patience { deadline: start + Duration::from_millis(50), limit: start + Duration::from_millis(400) };
        let endless = in_child(patience, || spin(start + Duration::from_secs(60)));
        assert_eq!(endless.unwrap(), Outcome::StillWorking, "but not past its limit");
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}
