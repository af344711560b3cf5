//! Going to the background: fork, a readiness pipe that carries the child's error text back to the
//! parent, and redirection of the child's standard streams.
//!
//! The parent returns only when the child reports: [`Role::Parent`] once the mount answers, else a
//! [`DaemonError`] carrying the child's own one-line reason, so `stfs mount a b && cat b/x` works
//! and nothing fails silently.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::util::describe_io;

/// How long the parent waits for the child to mount before giving up, besides the time the child
/// is given to open the checkpoint (see [`daemonize`]).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// What the child sends when the mount answers.
const READY: &[u8] = b"ready\n";

/// The child's end of the readiness pipe.
pub struct Readiness {
    pipe: File,
}

impl Readiness {
    /// Tells the parent the mount is ready; the parent exits 0. False when the parent cannot hear
    /// it (it was killed while waiting: its end of the pipe is closed).
    pub fn ready(mut self) -> bool {
        self.pipe.write_all(READY).is_ok()
    }

    /// Tells the parent why mounting failed; the parent returns it as [`DaemonError::Child`].
    pub fn failed(mut self, reason: &dyn fmt::Display) {
        let _ = self.pipe.write_all(reason.to_string().as_bytes());
    }

    /// A second descriptor of the pipe, for a thread that may have to end the process with the
    /// reason (`signals::exit_saying`: a signal while the checkpoint opens) while this end stays
    /// where it is; the parent hears that line as the child's reason, as from [`Readiness::failed`].
    pub fn last_words(&self) -> io::Result<OwnedFd> {
        self.pipe.try_clone().map(OwnedFd::from)
    }
}

/// Which side of the fork [`daemonize`] returned in.
pub enum Role {
    /// The parent, after the child reported that the mount answers: its work is done.
    Parent,
    /// The (new session leader) child, which serves the mount and reports through its end of the pipe.
    Child(Readiness),
}

/// Why going to the background, or the mount in the background, failed.
#[derive(Debug)]
pub enum DaemonError {
    /// The log file could not be opened.
    LogFile {
        /// The log file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The readiness pipe could not be made.
    Pipe(io::Error),
    /// fork(2) failed.
    Fork(io::Error),
    /// The child could not point its standard streams away from the terminal.
    Redirect(io::Error),
    /// The child did not report within the time it was given (it has been sent SIGTERM).
    Timeout(Duration),
    /// The parent could not read the child's report.
    Report(io::Error),
    /// The child's own one-line reason why mounting failed.
    Child(String),
    /// The child exited without a report.
    Vanished,
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::LogFile { path, error } => write!(f, "{}: {}", path.display(), describe_io(error)),
            DaemonError::Pipe(e) => write!(f, "pipe: {e}"),
            DaemonError::Fork(e) => write!(f, "fork: {e}"),
            DaemonError::Redirect(e) => write!(f, "redirecting output: {e}"),
            DaemonError::Timeout(t) => write!(f, "the mount did not become ready within {} s", t.as_secs()),
            DaemonError::Report(e) => write!(f, "reading the daemon's report: {e}"),
            DaemonError::Child(reason) => f.write_str(reason),
            DaemonError::Vanished => f.write_str("the mount daemon exited before the mount was ready (see --log-file)"),
        }
    }
}

impl std::error::Error for DaemonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DaemonError::LogFile { error: e, .. }
            | DaemonError::Pipe(e)
            | DaemonError::Fork(e)
            | DaemonError::Redirect(e)
            | DaemonError::Report(e) => Some(e),
            DaemonError::Timeout(_) | DaemonError::Child(_) | DaemonError::Vanished => None,
        }
    }
}

/// Descriptors above stderr that this process was started with, as [`note_inherited_descriptors`]
/// found them before the process opened any of its own.
static INHERITED: OnceLock<Vec<RawFd>> = OnceLock::new();

/// Notes the descriptors above stderr this process inherited from its caller (a lock held by
/// `flock CMD`, the write end of a pipe a script waits on), for the background daemon to close:
/// kept, they would stay held, and the pipe's reader would wait, for the whole life of the mount.
/// A descriptor that an argument or an environment variable names as a path (`/dev/fd/N`,
/// `/proc/self/fd/N`: a source, a header file, a token file re-read at each refresh) is kept.
/// Call it first thing, before anything opens a descriptor.
pub fn note_inherited_descriptors() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return };
    let listed: Vec<RawFd> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    let args = std::env::args_os().chain(std::env::vars_os().map(|(_, value)| value));
    let named: Vec<RawFd> = args.flat_map(|a| descriptors_named(&a.to_string_lossy())).collect();
    // The listing's own descriptor is closed by now, so it is no longer valid.
    // SAFETY: F_GETFD only reads the descriptor's flags.
    let open = |fd: RawFd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
    let _ = INHERITED.set(listed.into_iter().filter(|&fd| fd > 2 && !named.contains(&fd) && open(fd)).collect());
}

/// The descriptor numbers `text` names as paths: `/dev/fd/N` or `/proc/self/fd/N`.
fn descriptors_named(text: &str) -> Vec<RawFd> {
    let mut found = Vec::new();
    for prefix in ["/dev/fd/", "/proc/self/fd/"] {
        for (at, _) in text.match_indices(prefix) {
            let digits: String = text[at + prefix.len()..].chars().take_while(char::is_ascii_digit).collect();
            found.extend(digits.parse::<RawFd>());
        }
    }
    found
}

/// Closes the descriptors [`note_inherited_descriptors`] found (in the daemon, after the fork).
fn close_inherited_descriptors() {
    for &fd in INHERITED.get().map_or(&[][..], Vec::as_slice) {
        // SAFETY: these descriptors were open before stfs opened any, so no object of this process
        // owns them; closing one that is already closed is a harmless EBADF.
        unsafe { libc::close(fd) };
    }
}

/// Leaves the working directory for `/`, so that the daemon does not keep the caller's directory
/// busy. The daemon calls it once the checkpoint is open: relative paths of the command line are
/// opened, and named in messages, as given.
pub fn leave_working_directory() {
    let _ = std::env::set_current_dir("/");
}

/// Forks. In the parent, waits for the child's report, at most `wait`: [`Role::Parent`] once the
/// mount answers, an error otherwise (the child's own line, or the time that ran out). In the child, returns its end of the pipe, having closed the descriptors the
/// process inherited ([`note_inherited_descriptors`]). Call before starting any thread (a thread
/// alive at the fork is reported in the child's log: `N threads alive at fork`).
pub fn daemonize(log_file: Option<&Path>, wait: Duration) -> Result<Role, DaemonError> {
    let log = match log_file {
        Some(p) => Some(open_log(p).map_err(|error| DaemonError::LogFile { path: p.to_path_buf(), error })?),
        None => None,
    };
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(DaemonError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A thread alive at the fork is not copied into the child, and a lock it held stays locked
    // there: the caller's contract is a single thread, checked here and reported in the log.
    let threads = threads_alive();
    // SAFETY: the process is single-threaded here (the caller's contract), so fork is sound.
    match unsafe { libc::fork() } {
        -1 => Err(DaemonError::Fork(io::Error::last_os_error())),
        0 => {
            drop(read_end);
            // SAFETY: setsid has no memory-safety preconditions.
            unsafe { libc::setsid() };
            redirect_std_streams(log.as_ref()).map_err(DaemonError::Redirect)?;
            close_inherited_descriptors();
            if let Some(threads) = threads.filter(|n| *n > 1) {
                // The log is not set up yet; stderr is the log file (or /dev/null) by now.
                let line = format!("stfs: warning: {threads} threads alive at fork (expected 1)\n");
                let _ = io::stderr().write_all(line.as_bytes());
            }
            Ok(Role::Child(Readiness { pipe: File::from(write_end) }))
        }
        child => {
            drop(write_end);
            wait_for_child(File::from(read_end), child, wait).map(|()| Role::Parent)
        }
    }
}

/// Opens the log file for appending, never through a symbolic link (O_NOFOLLOW): an existing
/// regular file is appended to, as log tools do; a missing one is created exclusively (O_EXCL),
/// mode 0600; a character device (`/dev/null`) is written to; anything else (a link, a directory, a
/// FIFO) is refused.
fn open_log(path: &Path) -> io::Result<File> {
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    for _ in 0..2 {
        let file = match OpenOptions::new().append(true).custom_flags(flags).open(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match OpenOptions::new().append(true).create_new(true).mode(0o600).custom_flags(flags).open(path) {
                    // Created by someone else in between: open what is there now, with the same checks.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    other => other?,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "is a symbolic link; refused as a log file"))
            }
            other => other?,
        };
        let kind = file.metadata()?.file_type();
        if !kind.is_file() && !kind.is_char_device() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file; refused as a log file"));
        }
        // Writes to the log are ordinary blocking writes.
        // SAFETY: fcntl on a descriptor this function owns; F_SETFL takes an int.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, libc::O_APPEND) };
        return Ok(file);
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "created and removed while being opened"))
}

/// How many threads this process has (`Threads:` of `/proc/self/status`), if it can tell.
pub fn threads_alive() -> Option<usize> {
    threads_in_status(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The `Threads:` count of a `/proc/PID/status` text.
fn threads_in_status(status: &str) -> Option<usize> {
    status.lines().find_map(|line| line.strip_prefix("Threads:")).and_then(|n| n.trim().parse().ok())
}

/// Reads the child's report, waiting at most `wait`: `Ok` once the mount answers.
fn wait_for_child(mut pipe: File, child: libc::pid_t, wait: Duration) -> Result<(), DaemonError> {
    let deadline = Instant::now() + wait;
    let mut report = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd { fd: pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: pfd is a valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n == 0 {
            // SAFETY: child is our own child's pid.
            unsafe { libc::kill(child, libc::SIGTERM) };
            return Err(DaemonError::Timeout(wait));
        }
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => report.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DaemonError::Report(e)),
        }
        if report.ends_with(READY) {
            return Ok(());
        }
    }
    let text = String::from_utf8_lossy(&report);
    let text = text.trim();
    if text.is_empty() {
        Err(DaemonError::Vanished)
    } else {
        Err(DaemonError::Child(text.to_string()))
    }
}

/// Points stdin and stdout at /dev/null and stderr at the log file (or /dev/null).
fn redirect_std_streams(log: Option<&File>) -> io::Result<()> {
    let null = OpenOptions::new().read(true).write(true).open("/dev/null")?;
    let err_target = log.unwrap_or(&null);
    for (from, to) in [(&null, 0), (&null, 1), (err_target, 2)] {
        // SAFETY: both descriptors are open; dup2 atomically replaces the standard stream.
        if unsafe { libc::dup2(from.as_raw_fd(), to) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use std::fs::File;
    use std::os::fd::FromRawFd;

    use crate::mount::daemon::{descriptors_named, DaemonError, Readiness, READY};

    /// The daemon learns whether the news of a ready mount reached the parent: not when the
    /// parent's end of the pipe is closed (it was killed while waiting), so the daemon withdraws
    /// a mount nobody knows of (`session::serve`). A write to a closed pipe is EPIPE, not a
    /// SIGPIPE: Rust ignores that signal.
    #[test]
    fn readiness_says_whether_the_parent_heard() {
        use std::io::Read;
        for parent_alive in [true, false] {
            let mut fds = [0; 2];
            // SAFETY: fds is a valid array of two ints for pipe2 to fill.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
            let (read_end, write_end) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
            let readiness = Readiness { pipe: write_end };
            if parent_alive {
                assert!(readiness.ready());
                let mut heard = Vec::new();
                (&read_end).read_to_end(&mut heard).unwrap();
                assert_eq!(heard, READY);
            } else {
                drop(read_end);
                assert!(!readiness.ready());
            }
        }
    }

    #[test]
    fn descriptors_named_as_paths_are_found_anywhere_in_a_text() {
        assert_eq!(descriptors_named("/dev/fd/3"), [3]);
        assert_eq!(descriptors_named("npy,header_file=/proc/self/fd/12,log_file=/dev/fd/9x"), [9, 12]);
        assert_eq!(descriptors_named("/work/dev/fd/model.safetensors /dev/fd/"), Vec::<std::os::fd::RawFd>::new());
    }

    #[test]
    fn threads_are_counted() {
        use super::threads_in_status;
        assert_eq!(threads_in_status("Name:\tstfs\nThreads:\t7\nSigQ:\t0/1\n"), Some(7));
        assert_eq!(threads_in_status("Name:\tstfs\n"), None);
        // Three threads parked until told: this one and they are alive, whatever other tests run.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let parked: Vec<_> = (0..3)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || rx.lock().unwrap().recv())
            })
            .collect();
        let counted = crate::mount::daemon::threads_alive().unwrap();
        drop(tx);
        for thread in parked {
            let _ = thread.join();
        }
        assert!(counted >= 4, "{counted} threads counted with 4 alive");
    }

    #[test]
    fn messages_are_one_line_and_keep_their_cause() {
        let e =
            DaemonError::LogFile { path: "/no/dir/log".into(), error: std::io::Error::from_raw_os_error(libc::ENOENT) };
        assert_eq!(e.to_string(), "/no/dir/log: no such file or directory");
        assert_eq!(e.source().and_then(|c| c.downcast_ref::<std::io::Error>()).and_then(|c| c.raw_os_error()), Some(2));
        let child = DaemonError::Child("/mnt/x: mounting failed: permission denied".into());
        assert_eq!(child.to_string(), "/mnt/x: mounting failed: permission denied");
        assert_eq!(
            DaemonError::Timeout(crate::mount::daemon::READY_TIMEOUT).to_string(),
            "the mount did not become ready within 60 s"
        );
    }
}
