//! Mounting for a daemon that serves without privilege: [`premount`] opens `/dev/fuse` and mounts
//! it (as root), and [`spawn_server`] starts `stfs mount SOURCE /dev/fd/N` as another user, with no
//! capability and `no_new_privs`, to serve that descriptor, and waits until it answers. Used by
//! `stfs mount --drop-privileges` and by a CSI node plugin, which mounts in the host's namespace and
//! hands the descriptor to an unprivileged daemon.

use std::ffi::{CString, OsString};
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mount::cgroup::CgroupJoiner;
use crate::mount::mountpoint::FS_TYPE;
use crate::mount::privileges::{last_capability, Identity};
use crate::util::describe_io;

/// How a [`premount`] is made.
#[derive(Debug, Clone)]
pub struct PremountOptions {
    /// The mount's source as mountinfo lists it (`fsname`): the checkpoint's name. Commas are
    /// replaced, as they would split the options.
    pub fsname: String,
    /// The user who will serve the mount (`user_id=`): without `allow_other`, the kernel lets only
    /// this user in.
    pub uid: libc::uid_t,
    /// Its group (`group_id=`).
    pub gid: libc::gid_t,
    /// `allow_other`: every user may enter (the daemon must be told `-o allow_other` too, or it
    /// answers only its own user).
    pub allow_other: bool,
    /// `default_permissions`: the kernel checks the files' permission bits (stfs always sets it
    /// with `allow_other`; say so here too).
    pub default_permissions: bool,
}

/// Opens `/dev/fuse` and mounts it at `target` (an existing directory) with mount(2), as type
/// `fuse.stfs`, read-only, nosuid and nodev, with `fd=N,rootmode=40000,user_id=UID,group_id=GID`
/// and `allow_other`/`default_permissions` as `options` say. Returns the `/dev/fuse` descriptor,
/// close-on-exec (hand it to a child with [`spawn_server`], which clears that in the child only).
///
/// Needs CAP_SYS_ADMIN in the mount namespace of `target`. The kernel's INIT request waits on the
/// descriptor: until a daemon answers it, every access to `target` blocks (a `stat`, a `ls`), so
/// start the daemon right away. On failure, nothing is mounted. If the daemon then fails to start,
/// the caller unmounts `target` (`umount2(target, MNT_DETACH)`); dropping the descriptor alone
/// leaves a mount that answers ENOTCONN.
pub fn premount(target: &Path, options: &PremountOptions) -> io::Result<OwnedFd> {
    let device: OwnedFd = fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?.into();
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        device.as_raw_fd(),
        libc::S_IFDIR,
        options.uid,
        options.gid
    );
    if options.allow_other {
        data.push_str(",allow_other");
    }
    if options.default_permissions {
        data.push_str(",default_permissions");
    }
    let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"));
    let source = c(crate::mount::session::mount_source(&options.fsname).as_bytes())?;
    let (target, fs_type, data) = (c(target.as_os_str().as_bytes())?, c(FS_TYPE.as_bytes())?, c(data.as_bytes())?);
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fs_type.as_ptr(), flags, data.as_ptr().cast()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(device)
}

/// What [`spawn_server`] starts: `PROGRAM mount ARGS... SOURCE /dev/fd/N`, where N is `device`'s
/// number, as `identity`, with exactly `env` as its environment.
#[derive(Debug)]
pub struct ServerSpawn<'a> {
    /// The stfs binary.
    pub program: PathBuf,
    /// The checkpoint (a path or URL the user can read: the server opens it after dropping
    /// privileges).
    pub source: OsString,
    /// Options before SOURCE (`-o allow_other,cache_size=1G`, `--log-file PATH`...): the same
    /// `allow_other`/`allow_root` the mount was made with. Never `-f` (the server would not
    /// return) and never a secret (use `env`).
    pub args: Vec<OsString>,
    /// The mounted `/dev/fuse` descriptor from [`premount`].
    pub device: &'a OwnedFd,
    /// Who serves: uid, gid, supplementary groups.
    pub identity: Identity,
    /// The server's whole environment (credentials such as `HF_TOKEN` or `AWS_*` go here; `PATH`
    /// and `HOME` are not added).
    pub env: Vec<(OsString, OsString)>,
    /// The most to wait for the mount to answer (the checkpoint's opening included).
    pub timeout: Duration,
    /// A cgroup the server joins before it drops privileges (and its daemon with it), so that it
    /// outlives the container of whoever started it; None: it stays in the caller's.
    pub cgroup: Option<CgroupJoiner>,
}

/// Why the server did not start serving.
#[derive(Debug)]
pub enum SpawnError {
    /// The program could not be started (or dropping privileges in the child failed).
    Start(io::Error),
    /// The server's own one-line reason (from `stfs: ...` on its stderr), with its exit status.
    Failed {
        /// Its exit code (None: killed by a signal).
        code: Option<i32>,
        /// Its last line on stderr.
        reason: String,
    },
    /// It did not report within the time given; it was killed.
    Timeout(Duration),
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::Start(e) => write!(f, "starting the mount server: {}", describe_io(e)),
            SpawnError::Failed { code, reason } if reason.is_empty() => {
                write!(f, "the mount server exited with status {code:?} and no message")
            }
            SpawnError::Failed { reason, .. } => f.write_str(reason.strip_prefix("stfs: ").unwrap_or(reason)),
            SpawnError::Timeout(t) => write!(f, "the mount server did not answer within {} s", t.as_secs()),
        }
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpawnError::Start(e) => Some(e),
            _ => None,
        }
    }
}

/// The variable `stfs mount -` reads its source from (kept off the command line: a signed URL's
/// query, a `user:pass@`).
pub const SOURCE_VAR: &str = "STFS_SOURCE";

/// The SOURCE argument of `stfs mount` that means "the source is in [`SOURCE_VAR`]".
pub const SOURCE_FROM_ENV: &str = "-";

/// Starts `stfs mount ARGS - /dev/fd/N` (the source in [`SOURCE_VAR`]) as [`ServerSpawn::identity`], with the capability
/// bounding set emptied, no capability, `no_new_privs` (see [`Identity::become_it`]), stdin on
/// /dev/null, and descriptor N inherited (its close-on-exec cleared in the child only), and waits
/// until it returns: `Ok` once the mount answers. The server then runs in the background in a
/// session of its own (it outlives the caller), and exits when the mount's connection ends (the
/// mount unmounted). The caller may drop its copy of the descriptor afterwards (it should: a copy
/// held keeps the connection alive after the server died). Needs root. Call from any thread: the
/// child runs only system calls before exec.
pub fn spawn_server(spawn: &ServerSpawn<'_>) -> Result<(), SpawnError> {
    let fd = spawn.device.as_raw_fd();
    let mut command = Command::new(&spawn.program);
    command
        .arg("mount")
        .args(&spawn.args)
        .arg("--")
        .arg(SOURCE_FROM_ENV)
        .arg(format!("/dev/fd/{fd}"))
        .env_clear()
        .envs(spawn.env.iter().map(|(k, v)| (k, v)))
        // Off the command line (a signed URL's query, a `user:pass@`): `stfs mount -` reads it.
        .env(SOURCE_VAR, &spawn.source)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let identity = spawn.identity.clone();
    let cgroup = spawn.cgroup;
    let last_cap = last_capability();
    // SAFETY: the closure makes only system calls (no allocation, no lock), as the child of a
    // possibly multi-threaded parent must.
    unsafe {
        command.pre_exec(move || {
            if let Some(cgroup) = &cgroup {
                cgroup.join()?;
            }
            identity.become_it(last_cap).map_err(|e| match e {
                crate::mount::privileges::PrivilegeError::Call { error, .. } => error,
                _ => io::Error::from_raw_os_error(libc::EPERM),
            })?;
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(SpawnError::Start)?;
    let stderr = child.stderr.take().expect("stderr is piped");
    // The server's stderr closes when it exits (its background daemon points its own elsewhere).
    let (sender, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.take(64 * 1024).read_to_end(&mut text);
        let _ = sender.send(text);
    });
    let deadline = Instant::now() + spawn.timeout;
    let status = loop {
        match child.try_wait().map_err(SpawnError::Start)? {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SpawnError::Timeout(spawn.timeout));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    if status.success() {
        return Ok(());
    }
    let text = said.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let reason = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_string();
    Err(SpawnError::Failed { code: status.code(), reason })
}
