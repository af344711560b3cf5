//! The background daemon's companions: the `auto_unmount` watcher, which detaches the mount when the
//! daemon dies, the log sent to syslog when there is no `--log-file`, and the debug log's timeline
//! of requests to the store.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use common::*;
use stfs::format::Dtype;

/// A checkpoint with a 4 MiB tensor (its tail beyond any readahead of the first read) and a small one.
fn fixture(dir: &Path) -> (PathBuf, Vec<T>) {
    let file = dir.join("model.safetensors");
    let tensors = vec![T::new("big", Dtype::U8, &[4 << 20]), T::new("small", Dtype::F32, &[100])];
    write_checkpoint(&file, &tensors, None);
    (file, tensors)
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn auto_unmount_detaches_the_mount_when_the_daemon_is_killed() {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let m = Mount::new(&file, &["-o", "auto_unmount"]);
    assert_eq!(std::fs::read(m.file("small")).unwrap(), tensors[1].data);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let watcher = watcher_pid(&m.path).expect("an auto_unmount watcher");
    assert_ne!(pid, watcher);
    // SAFETY: killing the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_until(TIMEOUT, || !is_mounted(&m.path)), "the mount outlived its killed daemon");
    assert!(wait_until(TIMEOUT, || !alive(watcher)), "the watcher did not exit");
    // The directory is usable again at once: a new mount works.
    let again = Mount::new(&file, &[]);
    assert_eq!(std::fs::read(again.file("small")).unwrap(), tensors[1].data);
}

#[test]
fn auto_unmount_watcher_exits_after_a_normal_unmount() {
    let dir = workdir();
    let (file, _) = fixture(dir.path());
    let m = Mount::new(&file, &["--auto-unmount"]);
    let (pid, watcher) = (daemon_pid(&m.path).expect("daemon pid"), watcher_pid(&m.path).expect("watcher pid"));
    // The watcher holds neither the checkpoint nor the mount: only the standard streams and its pipe.
    let fds = std::fs::read_dir(format!("/proc/{watcher}/fd")).unwrap().count();
    assert_eq!(fds, 4, "the watcher keeps descriptors it inherited");
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(TIMEOUT, || !alive(pid) && !alive(watcher)), "daemon or watcher did not exit");
    assert!(!is_mounted(&m.path));
}

/// The soft `RLIMIT_NOFILE` of process `pid`, from `/proc/PID/limits`.
fn soft_open_files(pid: i32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    line.split_whitespace().nth(3).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn the_daemon_raises_its_descriptor_limit_to_its_budget_and_its_watcher_keeps_the_callers() {
    use std::os::unix::process::CommandExt;
    use stfs::mount::limits::DESCRIPTORS_NEEDED;
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let _detach = DetachAll(vec![mp.clone()]);
    // A container's hard limit can be about 10^9; a test may lower the soft one only.
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    let (soft, hard) = (512u64, limit.rlim_max);
    assert!(hard > DESCRIPTORS_NEEDED, "a hard limit of {hard} leaves nothing to test");
    let mut command = std::process::Command::new(STFS);
    command.args(["mount", file.to_str().unwrap(), mp.to_str().unwrap(), "--auto-unmount"]);
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        })
    };
    let out = wait_output(command.spawn().unwrap(), TIMEOUT);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mp.join("small")).unwrap(), tensors[1].data);
    let daemon = daemon_pid(&mp).expect("daemon pid");
    let watcher = watcher_pid(&mp).expect("watcher pid");
    assert_eq!(soft_open_files(daemon), DESCRIPTORS_NEEDED, "the daemon's limit is what its budget needs");
    assert_eq!(soft_open_files(watcher), soft, "the watcher starts with the caller's limit");
    let out = unmount_retrying(|| stfs(&["umount", mp.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn without_auto_unmount_no_watcher_runs() {
    let dir = workdir();
    let (file, _) = fixture(dir.path());
    let m = Mount::new(&file, &[]);
    assert!(daemon_pid(&m.path).is_some());
    assert_eq!(watcher_pid(&m.path), None);
}

/// Receives datagrams until one satisfies `want` or [`TIMEOUT`] passes; returns all received.
fn receive_until(socket: &UnixDatagram, want: impl Fn(&str) -> bool) -> Vec<String> {
    socket.set_read_timeout(Some(std::time::Duration::from_millis(100))).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0; 16 << 10];
    wait_until(TIMEOUT, || {
        if let Ok(n) = socket.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        got.last().is_some_and(|g| want(g))
    });
    got
}

#[test]
fn background_warnings_go_to_syslog_as_stfs_pid() {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let socket_path = dir.path().join("log.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let m = Mount::with_env(&file, &[], &[("STFS_SYSLOG_SOCKET", &socket_path)]);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    // Nothing below warn by default: the mount itself logs no datagram.
    assert_eq!(std::fs::read(m.file("small")).unwrap(), tensors[1].data);
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(1000).unwrap();
    let err = std::fs::read(m.file("big")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    let ident = format!(" stfs[{pid}]: ");
    let got = receive_until(&socket, |d| d.contains(&ident) && d.contains("backing file changed"));
    let warning = got.last().expect("no datagram arrived");
    assert!(warning.contains(&ident) && warning.contains("backing file changed"), "{got:?}");
    // Facility daemon (3), severity warning (4) or error (3).
    assert!(warning.starts_with("<28>") || warning.starts_with("<27>"), "{warning}");
    assert!(got.iter().all(|d| !d.contains("mounted ")), "info records reached syslog: {got:?}");
}

#[test]
fn a_missing_syslog_socket_is_no_error() {
    let dir = workdir();
    let (file, _) = fixture(dir.path());
    let missing = dir.path().join("no-such-socket");
    let m = Mount::with_env(&file, &[], &[("STFS_SYSLOG_SOCKET", &missing)]);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(1000).unwrap();
    assert_eq!(std::fs::read(m.file("big")).unwrap_err().raw_os_error(), Some(libc::EIO));
    // The warning went nowhere, and the daemon goes on serving what it holds.
    assert!(alive(pid));
    assert!(std::fs::read_to_string(m.file("metadata.json")).unwrap().contains("\"big\""));
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_debug_log_has_a_line_per_backing_read() {
    let dir = workdir();
    let (file, tensors) = fixture(dir.path());
    let log = dir.path().join("stfs.log");
    let args = ["--no-map", "--block-size", "1M", "--log-file", log.to_str().unwrap()];
    let m = Mount::with_env(&file, &args, &[("RUST_LOG", Path::new("stfs=debug"))]);
    assert_eq!(std::fs::read(m.file("big")).unwrap(), tensors[0].data);
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<_> = text.lines().filter(|l| l.contains(": backing read of blocks ")).collect();
    // The 4 MiB tensor and the header span 5 blocks of 1 MiB, each read once, in one or more reads.
    let mut blocks: Vec<u64> = Vec::new();
    for line in &lines {
        let range = line.split("backing read of blocks ").nth(1).and_then(|r| r.split(' ').next()).unwrap();
        let (from, to) = range.split_once("..").unwrap();
        blocks.extend(from.parse::<u64>().unwrap()..to.parse::<u64>().unwrap());
        assert!(line.contains(file.to_str().unwrap()) && line.ends_with(" ms"), "{line}");
    }
    blocks.sort_unstable();
    assert_eq!(blocks, (0..5).collect::<Vec<_>>(), "{text}");
}

/// Unmounts a mount point on drop, whatever happened.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

/// `stfs mount SOURCE MP` run with descriptor `fd` of this process passed down as descriptor `as_fd`
/// (inheritable), as a shell's `N>&M` would.
fn mount_passing(source: &str, mp: &Path, fd: std::os::fd::RawFd, as_fd: std::os::fd::RawFd) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut command = Command::new(STFS);
    command.args(["mount", source, mp.to_str().unwrap()]);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe; they only set up the child's descriptor table.
    // dup2 onto the same number leaves close-on-exec set, so that case clears it instead.
    unsafe {
        command.pre_exec(move || {
            let rc = if fd == as_fd { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, as_fd) };
            if rc < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
    }
    wait_output(command.spawn().unwrap(), TIMEOUT)
}

/// A descriptor the caller of `stfs mount` passes down (here the write end of a pipe, as a script
/// waiting for the command's output through it, or a lock held by `flock stfs mount ...`) is not
/// kept by the daemon for the life of the mount.
#[test]
fn the_daemon_keeps_no_descriptor_its_caller_passed_down() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;

    let dir = workdir();
    let (source, _) = fixture(dir.path());
    let mp = dir.path().join("m");
    std::fs::create_dir(&mp).unwrap();
    let mut ends = [0; 2];
    // SAFETY: pipe2 fills the two ints of `ends`.
    assert_eq!(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just opened and belong to nobody else.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    let pipe_inode = std::fs::metadata(format!("/proc/self/fd/{}", read_end.as_raw_fd())).unwrap().ino();
    let out = mount_passing(source.to_str().unwrap(), &mp, write_end.as_raw_fd(), 7);
    let _guard = UnmountOnDrop(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pid = daemon_pid(&mp).expect("the daemon runs");
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.display().to_string())
        .collect();
    assert!(!held.contains(&format!("pipe:[{pipe_inode}]")), "the daemon holds the caller's pipe: {held:?}");
    // So the pipe's reader sees its end once the caller's own copy is gone.
    drop(write_end);
    let mut buf = [0u8; 1];
    // SAFETY: a read into a one-byte buffer of our own.
    assert_eq!(unsafe { libc::read(read_end.as_raw_fd(), buf.as_mut_ptr().cast(), 1) }, 0, "end of file");
}

/// A source the caller passes down as a descriptor and names as `/dev/fd/N` stays readable: the
/// daemon keeps the descriptors its arguments name.
#[test]
fn a_source_named_as_a_passed_down_descriptor_is_kept() {
    use std::os::fd::AsRawFd;

    let dir = workdir();
    let (source, tensors) = fixture(dir.path());
    let mp = dir.path().join("m");
    std::fs::create_dir(&mp).unwrap();
    let file = std::fs::File::open(&source).unwrap();
    let out = mount_passing("/dev/fd/8", &mp, file.as_raw_fd(), 8);
    let _guard = UnmountOnDrop(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for t in &tensors {
        assert_eq!(std::fs::read(mp.join(&t.name)).unwrap(), t.data, "{}", t.name);
    }
}
