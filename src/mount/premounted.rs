//! A mount point written `/dev/fd/N` (or `/proc/self/fd/N`): libfuse's convention for "descriptor N
//! is a `/dev/fuse` that the caller opened and mounted already; serve it". Telling such a mount
//! point apart ([`premounted_descriptor`]) and checking the descriptor before serving it
//! ([`check_premounted`]): open, the FUSE device, mounted, and with the kernel's INIT request
//! waiting, so that a wrong descriptor is one line, never a hang.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::path::Path;
use std::time::Duration;

/// The FUSE device's major and minor numbers (`/dev/fuse` is char 10:229 on every Linux).
const FUSE_MAJOR: u32 = 10;
const FUSE_MINOR: u32 = 229;

/// Why descriptor N cannot be served.
#[derive(Debug)]
pub enum PremountedError {
    /// Nothing is open as descriptor N in this process.
    NotOpen(RawFd),
    /// Descriptor N is open, but not on /dev/fuse.
    NotFuse(RawFd),
    /// Descriptor N is /dev/fuse, but no mount uses it.
    NotMounted(RawFd),
    /// The kernel's INIT request did not come within the time given: another daemon served it.
    NoInit {
        /// The descriptor.
        fd: RawFd,
        /// How long it was waited for.
        waited: Duration,
    },
    /// fstat(2) or poll(2) failed otherwise.
    Io(io::Error),
}

impl fmt::Display for PremountedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PremountedError::NotOpen(fd) => write!(f, "descriptor {fd} is not open (it must be inherited, mounted)"),
            PremountedError::NotFuse(fd) => write!(f, "descriptor {fd} is not /dev/fuse"),
            PremountedError::NotMounted(fd) => {
                write!(f, "descriptor {fd} is /dev/fuse but not mounted (mount it with -o fd={fd} first)")
            }
            PremountedError::NoInit { fd, waited } => write!(
                f,
                "descriptor {fd}: no INIT request from the kernel within {} s (is another daemon serving it?)",
                waited.as_secs()
            ),
            PremountedError::Io(e) => f.write_str(&crate::util::describe_io(e)),
        }
    }
}

impl std::error::Error for PremountedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PremountedError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// The descriptor a mount point names, if it is written `/dev/fd/N` or `/proc/self/fd/N` (N a
/// decimal number): then stfs mounts nothing and serves descriptor N.
pub fn premounted_descriptor(mountpoint: &Path) -> Option<RawFd> {
    let text = mountpoint.to_str()?;
    let digits = ["/dev/fd/", "/proc/self/fd/"].iter().find_map(|prefix| text.strip_prefix(prefix))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0), where it runs as a user other than root:
/// a server of a premounted descriptor usually runs as an unprivileged user that other processes
/// share (`nobody`, a CSI plugin's daemon user), and holds what its mounter gave it in its memory
/// and environment (credentials). Non-dumpable, no other process of that user may ptrace it or
/// read its `/proc/PID/environ` or `mem`, and it leaves no core file. Its own `/proc/self` stays
/// open to it.
pub fn keep_from_its_users_other_processes() {
    // SAFETY: geteuid has no preconditions; prctl with integer arguments.
    if unsafe { libc::geteuid() } != 0 && unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        log::warn!("could not make the daemon non-dumpable: {}", io::Error::last_os_error());
    }
}

/// Checks that `fd` is an open `/dev/fuse` descriptor with a mount on it whose INIT request is
/// waiting, for at most `wait`. Reads nothing from it.
pub fn check_premounted(fd: RawFd, wait: Duration) -> Result<(), PremountedError> {
    // SAFETY: `stat` is a plain C struct; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is valid and writable; any descriptor number is safe to ask about.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBADF) => PremountedError::NotOpen(fd),
            _ => PremountedError::Io(e),
        });
    }
    let is_fuse = st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && libc::major(st.st_rdev) == FUSE_MAJOR
        && libc::minor(st.st_rdev) == FUSE_MINOR;
    if !is_fuse {
        return Err(PremountedError::NotFuse(fd));
    }
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let millis = wait.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: pfd is a valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, millis) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(PremountedError::Io(e));
        }
        // A /dev/fuse without a connection polls as an error; a mounted one is readable once the
        // kernel has queued INIT.
        return match n {
            0 => Err(PremountedError::NoInit { fd, waited: wait }),
            _ if pfd.revents & libc::POLLIN != 0 => Ok(()),
            _ => Err(PremountedError::NotMounted(fd)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn only_a_descriptor_path_names_a_premounted_descriptor() {
        assert_eq!(premounted_descriptor(Path::new("/dev/fd/3")), Some(3));
        assert_eq!(premounted_descriptor(Path::new("/proc/self/fd/12")), Some(12));
        for other in ["/dev/fd/", "/dev/fd/3/", "/dev/fd/x", "/mnt/dev/fd/3", "dev/fd/3", "/dev/fd/-1", "/proc/1/fd/3"]
        {
            assert_eq!(premounted_descriptor(Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_descriptor_that_is_not_a_mounted_fuse_device_is_refused() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let e = check_premounted(null.as_raw_fd(), Duration::from_millis(10)).unwrap_err();
        assert!(matches!(e, PremountedError::NotFuse(_)), "{e:?}");
        let e = check_premounted(1_000_000, Duration::from_millis(10)).unwrap_err();
        assert_eq!(e.to_string(), "descriptor 1000000 is not open (it must be inherited, mounted)");
        if let Ok(fuse) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
            let e = check_premounted(fuse.as_raw_fd(), Duration::from_secs(2)).unwrap_err();
            assert!(matches!(e, PremountedError::NotMounted(_)), "{e:?}");
        }
    }
}
