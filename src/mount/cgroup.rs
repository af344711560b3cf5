//! A cgroup (v2) that servers join before they run ([`ServerCgroup`]), so that they outlive the
//! group of the process that started them: a container runtime that stops a container kills every
//! process in its cgroup (and a pid namespace's every process), so a mount daemon started by a
//! node plugin in a container dies with that container unless it lives elsewhere. The child joins
//! in `pre_exec`, before it drops privileges: no moment exists in which the parent could die and
//! leave it behind. Where the parent sits in a cgroup namespace of its own (a container's), the
//! child first enters the initial one (pid 1's), since the kernel lets a process move another only
//! within its own namespace's tree.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `statfs(2)`'s `f_type` of a cgroup v2 filesystem.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The cgroup namespace whose tree holds every cgroup: pid 1's.
const INITIAL_CGROUP_NAMESPACE: &str = "/proc/1/ns/cgroup";

/// A cgroup v2 directory that servers join, held open.
#[derive(Debug)]
pub struct ServerCgroup {
    /// Its `cgroup.procs`, opened for writing ("0" moves the writer).
    procs: File,
    /// The initial cgroup namespace, where this process is in another one.
    namespace: Option<File>,
}

/// Why a [`ServerCgroup`] cannot be used.
#[derive(Debug)]
pub struct CgroupError {
    /// The directory.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

impl std::error::Error for CgroupError {}

/// Whether `path` is on a cgroup v2 filesystem.
fn is_cgroup2(path: &Path) -> io::Result<bool> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"))?;
    // SAFETY: statfs is a plain C struct, valid when zeroed.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated and outlives the call; stat is valid and writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Ok(stat.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

impl ServerCgroup {
    /// Opens the cgroup at `path`, creating it (mode 0755) below an existing cgroup v2 directory
    /// if missing; a link is not followed. Checks that a process can be moved into it, by moving a
    /// short-lived child there.
    pub fn open(path: &Path) -> Result<ServerCgroup, CgroupError> {
        let error = |reason: String| CgroupError { path: path.to_path_buf(), reason };
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        match is_cgroup2(parent) {
            Ok(true) => {}
            Ok(false) => return Err(error(format!("{} is not on a cgroup v2 filesystem", parent.display()))),
            Err(e) => return Err(error(crate::util::describe_io(&e))),
        }
        match std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o755).create(path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(error(crate::util::describe_io(&e))),
            _ => {}
        }
        let meta = fs::symlink_metadata(path).map_err(|e| error(crate::util::describe_io(&e)))?;
        if !meta.is_dir() {
            return Err(error("not a directory (a link is not followed)".into()));
        }
        let procs = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path.join("cgroup.procs"))
            .map_err(|e| error(format!("cgroup.procs: {}", crate::util::describe_io(&e))))?;
        let namespace = other_initial_namespace().map_err(|e| {
            error(format!("cannot open the initial cgroup namespace ({INITIAL_CGROUP_NAMESPACE}): {e}"))
        })?;
        let cgroup = ServerCgroup { procs, namespace };
        cgroup
            .check()
            .map_err(|e| error(format!("cannot move a process into it: {}", crate::util::describe_io(&e))))?;
        Ok(cgroup)
    }

    /// What a child's `pre_exec` needs to join it: raw descriptors, valid while `self` lives.
    pub fn joiner(&self) -> CgroupJoiner {
        CgroupJoiner { procs: self.procs.as_raw_fd(), namespace: self.namespace.as_ref().map(AsRawFd::as_raw_fd) }
    }

    /// Forks a child that joins the cgroup and exits at once: its error, if it could not.
    fn check(&self) -> io::Result<()> {
        let joiner = self.joiner();
        // SAFETY: the child makes only system calls (no allocation, no lock) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            let code = match joiner.join() {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
            };
            // SAFETY: leaving the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(io::Error::last_os_error());
        }
        match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
            Some(0) => Ok(()),
            Some(code) => Err(io::Error::from_raw_os_error(code)),
            None => Err(io::Error::other("the checking child was killed")),
        }
    }
}

/// The initial cgroup namespace, opened, where this process is in another one (None: it is in it,
/// or may not open it, as in a sandbox whose pid 1 is not the host's: the check then tells whether
/// the move works from here).
fn other_initial_namespace() -> io::Result<Option<File>> {
    let own = fs::metadata("/proc/self/ns/cgroup")?;
    let initial = match File::open(INITIAL_CGROUP_NAMESPACE) {
        Ok(file) => file,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = initial.metadata()?;
    Ok(((meta.dev(), meta.ino()) != (own.dev(), own.ino())).then_some(initial))
}

/// The descriptors a forked child uses to join a [`ServerCgroup`].
#[derive(Debug, Clone, Copy)]
pub struct CgroupJoiner {
    procs: RawFd,
    namespace: Option<RawFd>,
}

impl CgroupJoiner {
    /// Moves the calling process into the cgroup (entering the initial cgroup namespace first where
    /// needed). Only system calls: safe in a forked child of a multi-threaded parent.
    pub fn join(&self) -> io::Result<()> {
        if let Some(namespace) = self.namespace {
            // SAFETY: setns with an open namespace descriptor.
            if unsafe { libc::setns(namespace, libc::CLONE_NEWCGROUP) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: writes one byte from a static buffer to an open descriptor.
        if unsafe { libc::write(self.procs, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_off_cgroup2_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let error = ServerCgroup::open(&dir.path().join("daemons")).unwrap_err();
        assert!(error.to_string().contains("not on a cgroup v2 filesystem"), "{error}");
        assert!(error.to_string().starts_with(&dir.path().join("daemons").display().to_string()), "{error}");
        assert!(!dir.path().join("daemons").exists(), "nothing made");
    }
}
