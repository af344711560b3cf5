//! `stfs umount`'s work: unmount an stfs mount, and nothing else, within a bounded time whatever
//! its daemon does. It decides from /proc/self/mountinfo alone ([`mountinfo::locate`]), detaches
//! with umount2(2), or through `fusermount3 -u` when not root, and only then reports. Every step
//! runs against one deadline ([`UNMOUNT_BUDGET`]), so a stopped or wedged daemon cannot hold it; an
//! unmount still working in the kernel at that point (forgetting the inodes of a mount whose
//! hundreds of thousands of files were listed) is waited for while it works, up to
//! [`UNMOUNT_LIMIT`].

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mount::access::{self, NO_FUSERMOUNT};
use crate::mount::bounded::{self, Outcome};
use crate::mount::mountinfo::{self, MountEntry};

/// All of an unmount must be done within this: `stfs umount` promises 2 s, and the rest is for
/// starting and ending the process.
pub const UNMOUNT_BUDGET: Duration = Duration::from_millis(1500);
/// The most an unmount still working in the kernel is waited for: it forgets about 8 µs worth of
/// inode a file here, so a million files listed take about 8 s, far within it.
pub const UNMOUNT_LIMIT: Duration = Duration::from_secs(60);
/// The most a busy mount's staleness probe may take of that.
const PROBE_LIMIT: Duration = Duration::from_millis(300);

/// Why `stfs umount` did not unmount.
#[derive(Debug)]
pub enum UnmountError {
    /// The path does not exist.
    Missing,
    /// Nothing is mounted there.
    NotMounted,
    /// Something other than stfs is mounted there.
    NotStfs {
        /// Its filesystem type.
        fs_type: String,
        /// Its source.
        source: String,
    },
    /// Files on the mount are open.
    Busy,
    /// Another user mounted it, and this one is not root.
    OtherUser {
        /// The uid that mounted it.
        owner: u32,
    },
    /// This user is not root and has no fusermount3 to unmount with.
    NoFusermount,
    /// fusermount3 refused; its own words.
    Fusermount {
        /// The binary run.
        program: PathBuf,
        /// Its message, without its `fusermount3: ` prefix.
        message: String,
    },
    /// A step was waiting, not working, at the deadline: what it waits for (the daemon) does not
    /// answer.
    TimedOut {
        /// What did not finish.
        step: &'static str,
    },
    /// The kernel was still unmounting, and working, at [`UNMOUNT_LIMIT`].
    StillUnmounting {
        /// What was still working.
        step: &'static str,
    },
    /// A system call failed otherwise.
    Io(io::Error),
}

impl fmt::Display for UnmountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnmountError::Missing => f.write_str("mount point does not exist"),
            UnmountError::NotMounted => f.write_str("not a mount point"),
            UnmountError::NotStfs { fs_type, source } => write!(
                f,
                "not an stfs mount: {fs_type} (source {source}) is mounted there; stfs umount leaves it alone \
                 (use umount(8))"
            ),
            UnmountError::Busy => f.write_str("mount is busy (files are open); close them or use --lazy"),
            UnmountError::OtherUser { owner } => {
                write!(f, "mounted by uid {owner}; only that user or root can unmount it")
            }
            UnmountError::NoFusermount => f.write_str(NO_FUSERMOUNT),
            UnmountError::Fusermount { program, message } => write!(f, "{}: {message}", program.display()),
            UnmountError::TimedOut { step } => write!(
                f,
                "{step} was still waiting after {} ms, doing no work (its daemon does not answer); the mount may \
                 still be there (try --lazy)",
                UNMOUNT_BUDGET.as_millis()
            ),
            UnmountError::StillUnmounting { step } => write!(
                f,
                "{step} was still working after {} s (the kernel forgetting the mount's files); the mount is gone \
                 once it ends",
                UNMOUNT_LIMIT.as_secs()
            ),
            UnmountError::Io(e) => f.write_str(&crate::util::describe_io(e)),
        }
    }
}

impl std::error::Error for UnmountError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UnmountError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Unmounts the stfs mount at `path`; `lazy` detaches it even while files are open (MNT_DETACH).
/// Refuses anything that is not an stfs mount. A busy mount whose daemon is gone (killed) is
/// detached anyway, since nothing can be served there. Returns within [`UNMOUNT_BUDGET`], or
/// while the kernel still works on the unmount, within [`UNMOUNT_LIMIT`].
pub fn unmount(path: &Path, lazy: bool) -> Result<(), UnmountError> {
    let start = Instant::now();
    let deadline = Deadline { wait: start + wait_budget(), work: start + UNMOUNT_LIMIT };
    let (at, top) = mountinfo::locate(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => UnmountError::Missing,
        _ => UnmountError::Io(e),
    })?;
    let Some(entry) = top else {
        // Nothing is mounted at `at`, so looking at it asks no daemon.
        return Err(match std::fs::symlink_metadata(&at) {
            Ok(_) => UnmountError::NotMounted,
            Err(_) => UnmountError::Missing,
        });
    };
    if !entry.is_stfs() {
        return Err(UnmountError::NotStfs { fs_type: entry.fs_type, source: entry.source });
    }
    match detach(&at, &entry, lazy, deadline) {
        Err(UnmountError::Busy) if !lazy && daemon_gone(&at, deadline) => detach(&at, &entry, true, deadline),
        result => result,
    }
}

/// [`UNMOUNT_BUDGET`], or less for tests: `STFS_UMOUNT_WAIT_MS`, which can only shorten it, lets a
/// test see an unmount outlast the time a waiting step is given without a mount of millions of files.
fn wait_budget() -> Duration {
    let asked = std::env::var("STFS_UMOUNT_WAIT_MS").ok().and_then(|ms| ms.parse().ok()).map(Duration::from_millis);
    asked.map_or(UNMOUNT_BUDGET, |asked| asked.min(UNMOUNT_BUDGET))
}

/// When an unmount gives up: at `wait` on a step that waits, at `work` on one that still works.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    wait: Instant,
    work: Instant,
}

/// Whether the FUSE mount at `at` has lost its daemon: statfs(2) says ENOTCONN. Asked only after
/// an unmount found the mount busy, and for at most [`PROBE_LIMIT`]: a daemon that does not answer
/// counts as there.
fn daemon_gone(at: &Path, deadline: Deadline) -> bool {
    let limit = deadline.wait.min(Instant::now() + PROBE_LIMIT);
    matches!(bounded::statfs(at, limit), Ok(Outcome::Returned(libc::ENOTCONN)))
}

/// One detach: umount2(2), or fusermount3 when this user may not call it.
fn detach(at: &Path, entry: &MountEntry, lazy: bool, deadline: Deadline) -> Result<(), UnmountError> {
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    match bounded::umount2(at, flags, deadline.wait, deadline.work).map_err(UnmountError::Io)? {
        Outcome::Returned(0) => Ok(()),
        Outcome::Returned(libc::EPERM) => through_fusermount(at, entry, lazy, deadline),
        Outcome::Returned(libc::EBUSY) => Err(UnmountError::Busy),
        Outcome::Returned(libc::EINVAL) => Err(UnmountError::NotMounted),
        Outcome::Returned(libc::ENOENT) => Err(UnmountError::Missing),
        Outcome::Returned(errno) => Err(UnmountError::Io(io::Error::from_raw_os_error(errno))),
        Outcome::TimedOut => Err(UnmountError::TimedOut { step: "umount2" }),
        Outcome::StillWorking => Err(UnmountError::StillUnmounting { step: "umount2" }),
    }
}

/// Unmounts through `fusermount3 -u` (with `-z` when lazy), the setuid helper that lets the user
/// who mounted a FUSE filesystem unmount it; decided from mountinfo's `user_id` first.
fn through_fusermount(at: &Path, entry: &MountEntry, lazy: bool, deadline: Deadline) -> Result<(), UnmountError> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if let Some(owner) = entry.user_id().filter(|&owner| owner != uid) {
        return Err(UnmountError::OtherUser { owner });
    }
    let program = access::find_fusermount().ok_or(UnmountError::NoFusermount)?;
    let mut child = Command::new(&program)
        .arg("-u")
        .args(lazy.then_some("-z"))
        .arg("--")
        .arg(at)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(UnmountError::Io)?;
    let mut work = bounded::WorkWatch::default();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(UnmountError::Io)? {
            break status;
        }
        let now = Instant::now();
        if now >= deadline.wait {
            // fusermount3 unmounts in its own process: working there is the kernel's unmount.
            let working = work.working(child.id() as libc::pid_t);
            if !working || now >= deadline.work {
                let _ = child.kill();
                let step = "fusermount3 -u";
                return Err(if working {
                    UnmountError::StillUnmounting { step }
                } else {
                    UnmountError::TimedOut { step }
                });
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if status.success() {
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    Err(fusermount_error(&program, &stderr))
}

/// fusermount3's complaint as an error: busy as [`UnmountError::Busy`], else its own first line.
fn fusermount_error(program: &Path, stderr: &str) -> UnmountError {
    let line = stderr.lines().next().unwrap_or("failed").trim();
    if line.contains("Device or resource busy") {
        return UnmountError::Busy;
    }
    let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let message = line.strip_prefix(&format!("{name}: ")).unwrap_or(line).to_string();
    UnmountError::Fusermount { program: program.to_path_buf(), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_an_stfs_mount_is_refused_without_unmounting_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(unmount(dir.path(), false), Err(UnmountError::NotMounted)));
        assert!(matches!(unmount(&dir.path().join("missing"), true), Err(UnmountError::Missing)));
        assert!(matches!(unmount(&dir.path().join("a/b"), false), Err(UnmountError::Missing)));
        let tmpfs = UnmountError::NotStfs { fs_type: "tmpfs".into(), source: "tmpfs".into() };
        assert_eq!(
            tmpfs.to_string(),
            "not an stfs mount: tmpfs (source tmpfs) is mounted there; stfs umount leaves it alone (use umount(8))"
        );
    }

    #[test]
    fn fusermount_messages_are_classified() {
        let program = Path::new("/usr/bin/fusermount3");
        let busy = "fusermount3: failed to unmount /m: Device or resource busy\n";
        assert!(matches!(fusermount_error(program, busy), UnmountError::Busy));
        let other = fusermount_error(program, "fusermount3: entry for /m not found in /etc/mtab\n");
        assert_eq!(other.to_string(), "/usr/bin/fusermount3: entry for /m not found in /etc/mtab");
        assert_eq!(
            UnmountError::OtherUser { owner: 0 }.to_string(),
            "mounted by uid 0; only that user or root can unmount it"
        );
    }
}
