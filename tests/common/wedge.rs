//! A wedged daemon for the unmount tests: stop an stfs daemon with SIGSTOP (and always continue it
//! again), run a command with a time limit, read /proc/self/mountinfo without touching the mount,
//! and hold a file of a mount open in a process other than the test's own.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{wait_output, wait_until, TIMEOUT};

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The filesystem type (`fuse.stfs`, `tmpfs`).
    pub fs_type: String,
    /// The mount source (for stfs, the checkpoint).
    pub source: String,
    /// The superblock options (`ro,user_id=0,group_id=0`).
    pub options: String,
}

/// Every mount of this process's namespace, in mount order: mountinfo as stfs itself reads it
/// (bytes: a mount point elsewhere that is not UTF-8 hides no line).
pub fn mounts() -> Vec<MountEntry> {
    stfs::mount::mountinfo::mounts()
        .into_iter()
        .map(|m| MountEntry {
            mount_point: m.mount_point,
            fs_type: m.fs_type,
            source: m.source,
            options: m.super_options,
        })
        .collect()
}

/// The topmost mount at `path`, found in mountinfo alone: only the parent directory is resolved, so
/// a mount whose daemon does not answer is never asked anything.
pub fn mount_entry(path: &Path) -> Option<MountEntry> {
    let parent = std::fs::canonicalize(path.parent()?).ok()?;
    let want = parent.join(path.file_name()?);
    mounts().into_iter().rev().find(|m| m.mount_point == want)
}

/// Whether anything is mounted at `path`, by mountinfo alone (see [`mount_entry`]).
pub fn listed(path: &Path) -> bool {
    mount_entry(path).is_some()
}

/// A process stopped with SIGSTOP; continued with SIGCONT when dropped, whatever happened.
pub struct Stopped {
    pub pid: i32,
}

impl Stopped {
    /// Stops `pid` and waits (bounded) until the kernel reports it stopped.
    pub fn new(pid: i32) -> Stopped {
        // SAFETY: signalling a process this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
        let stopped = Stopped { pid };
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next())
        };
        assert!(wait_until(TIMEOUT, || matches!(state(), Some('T' | 't'))), "daemon {pid} did not stop");
        stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: signalling a process this test started.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

/// Whether process `pid` is gone (or a zombie).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Runs `cmd` (stdin null, output captured) for at most `limit`. Returns its output and how long it
/// took, or `None` with the limit when it overran: it is then killed with SIGKILL and reaped by a
/// thread of its own, since it may be waiting on a stopped daemon until the test continues it.
pub fn run_timed(cmd: &mut Command, limit: Duration) -> (Option<Output>, Duration) {
    let start = Instant::now();
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn command");
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            let took = start.elapsed();
            return (Some(child.wait_with_output().expect("output")), took);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            std::thread::spawn(move || child.wait());
            return (None, limit);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// How long `stfs umount` may take, whatever the daemon does.
pub const UMOUNT_LIMIT: Duration = Duration::from_secs(2);

/// Runs `cmd` (an unmount), allowing it 5 s, and asserts that it finished within [`UMOUNT_LIMIT`];
/// returns its output.
pub fn run_bounded_unmount(cmd: &mut Command, what: &str) -> Output {
    let (out, took) = run_timed(cmd, Duration::from_secs(5));
    let out = out.unwrap_or_else(|| panic!("{what} did not return within 5 s (the limit is {UMOUNT_LIMIT:?})"));
    assert!(
        took <= UMOUNT_LIMIT,
        "{what} took {took:?}, over {UMOUNT_LIMIT:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A process holding a file open (as its descriptor 3) until told to read it, or killed.
///
/// Files on a mount whose daemon a test stops are held here, never in the test process: every
/// child the test starts would close its copy of the descriptor on exec, and that close sends a
/// FLUSH that waits, uninterruptibly, for the stopped daemon.
pub struct Holder {
    child: Option<Child>,
}

impl Holder {
    /// Opens `path` in a new `shell` (a `sh` command, perhaps run as another user).
    pub fn open(mut shell: Command, path: &Path) -> Holder {
        let child = shell
            .args(["-c", "exec 3<\"$1\" || exit 1; echo open; read _ && exec cat <&3", "sh"])
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the holder");
        let mut holder = Holder { child: Some(child) };
        let mut line = String::new();
        let stdout = holder.child.as_mut().and_then(|c| c.stdout.as_mut()).expect("holder stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read from the holder");
        assert_eq!(line.trim(), "open", "the holder could not open {}", path.display());
        holder
    }

    /// Reads the whole file through the held descriptor and returns its bytes.
    pub fn read_all(mut self) -> Vec<u8> {
        let mut child = self.child.take().expect("holder child");
        child.stdin.take().expect("holder stdin").write_all(b"\n").expect("tell the holder to read");
        let out = wait_output(child, TIMEOUT);
        assert!(out.status.success(), "the holder's read failed");
        out.stdout
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
