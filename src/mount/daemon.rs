//! Going to the background: fork, a readiness pipe that carries the child's error text back to the
//! parent, and redirection of the child's standard streams.
//!
//! The parent exits only when the child reports: 0 once the mount answers, 1 with the child's own
//! one-line reason otherwise, so `stfs mount a b && cat b/x` works and nothing fails silently.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the parent waits for the child to mount before giving up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// What the child sends when the mount answers.
const READY: &[u8] = b"ready\n";

/// The child's end of the readiness pipe.
pub struct Readiness {
    pipe: File,
}

impl Readiness {
    /// Tells the parent the mount is ready; the parent exits 0.
    pub fn ready(mut self) {
        let _ = self.pipe.write_all(READY);
    }

    /// Tells the parent why mounting failed; the parent prints it and exits 1.
    pub fn failed(mut self, message: &str) {
        let _ = self.pipe.write_all(message.as_bytes());
    }
}

/// Forks. In the parent, waits for the child's report and exits the process with its status; in
/// the (new session leader) child, returns its end of the pipe. Call before starting any thread.
pub fn daemonize(log_file: Option<&Path>) -> Result<Readiness, String> {
    let log = match log_file {
        Some(p) => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("{}: {}", p.display(), crate::util::describe_io(&e)))?,
        ),
        None => None,
    };
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is single-threaded here (the caller's contract), so fork is sound.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", io::Error::last_os_error())),
        0 => {
            drop(read_end);
            // SAFETY: setsid has no memory-safety preconditions.
            unsafe { libc::setsid() };
            // Do not keep the caller's directory busy; every path was made absolute before the fork.
            let _ = std::env::set_current_dir("/");
            redirect_std_streams(log.as_ref()).map_err(|e| format!("redirecting output: {e}"))?;
            Ok(Readiness { pipe: File::from(write_end) })
        }
        child => {
            drop(write_end);
            std::process::exit(wait_for_child(File::from(read_end), child))
        }
    }
}

/// Reads the child's report with a timeout and turns it into the parent's exit status.
fn wait_for_child(mut pipe: File, child: libc::pid_t) -> i32 {
    let deadline = Instant::now() + READY_TIMEOUT;
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
            eprintln!("stfs: the mount did not become ready within {} s", READY_TIMEOUT.as_secs());
            return 1;
        }
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => report.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("stfs: reading the daemon's report: {e}");
                return 1;
            }
        }
        if report.ends_with(READY) {
            return 0;
        }
    }
    let text = String::from_utf8_lossy(&report);
    let text = text.trim();
    if text.is_empty() {
        eprintln!("stfs: the mount daemon exited before the mount was ready (see --log-file)");
    } else {
        eprintln!("stfs: {text}");
    }
    1
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
