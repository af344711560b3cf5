//! The FUSE session of a mount: mounts a built filesystem, reports readiness once the mount
//! answers, and serves until unmounted or signalled (SIGINT, SIGTERM, SIGHUP unmount the daemon's
//! own mount, and nothing else: see [`crate::mount::own_mount`]).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, SessionACL};
use log::{info, warn};

use crate::fs::Fs;
use crate::fuse::{readahead_in_whole_reads, FuseAdapter, SpliceTarget, UringTarget};
use crate::mount::mountinfo;
use crate::mount::mountpoint::{self, MountPointError};
use crate::mount::own_mount::{OwnMount, Whereabouts};
use crate::mount::signals::wait_for_signal;
use crate::mount::watcher::AutoUnmount;
use crate::util::describe_io;

/// How long to wait for the new mount to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where and how to mount (what to serve is [`crate::mount::build::FsOptions`]).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where.
    pub mountpoint: PathBuf,
    /// FUSE threads.
    pub threads: u32,
    /// Let other users in (with default_permissions).
    pub allow_other: bool,
    /// Let root in besides the owner (`-o allow_root`; with default_permissions).
    pub allow_root: bool,
    /// Kernel readahead to set after mounting, in KiB (0: leave alone).
    pub kernel_readahead_kb: u32,
    /// Largest read request to ask the kernel for (it grants at most `fs.fuse.max_pages_limit`
    /// pages).
    pub max_request_bytes: u32,
    /// Splice read replies of a local file's bytes into the FUSE device (`--no-splice` clears it).
    pub splice: bool,
    /// Ask the kernel for FUSE passthrough where it can read a file directly (`--no-passthrough`
    /// clears it).
    pub passthrough: bool,
    /// Ask for FUSE over io_uring (`--io-uring`); without the kernel's consent, `/dev/fuse`.
    pub io_uring: bool,
    /// A `/dev/fuse` descriptor that was mounted already, checked by
    /// [`crate::mount::premounted::check_premounted`] (the mount point `/dev/fd/N`): it is served
    /// and nothing is mounted or unmounted; the session takes it over.
    pub premounted: Option<std::os::fd::RawFd>,
}

/// Why serving a mount failed.
#[derive(Debug)]
pub enum ServeError {
    /// Mounting failed: mount(2), fusermount or the FUSE handshake.
    Mount {
        /// The mount point.
        mountpoint: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The mount point cannot be served: another mount was made there in a race with this one.
    MountPoint {
        /// The mount point.
        mountpoint: PathBuf,
        /// What is wrong with it.
        error: MountPointError,
    },
    /// A thread the session needs could not be started.
    Thread {
        /// What the thread is for.
        purpose: &'static str,
        /// Why.
        error: io::Error,
    },
    /// The mount never answered its first request.
    NotAnswering {
        /// The mount point.
        mountpoint: PathBuf,
        /// How long it was given.
        timeout: Duration,
    },
    /// The thread running the session panicked.
    Panicked,
    /// The session ended with an error of its own.
    Ended(io::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Mount { mountpoint, error } => {
                write!(f, "{}: mounting failed: {}", mountpoint.display(), describe_io(error))
            }
            ServeError::MountPoint { mountpoint, error } => write!(f, "{}: {error}", mountpoint.display()),
            ServeError::Thread { purpose, error } => write!(f, "starting the {purpose}: {error}"),
            ServeError::NotAnswering { mountpoint, timeout } => {
                write!(f, "{}: the mount did not answer within {} s", mountpoint.display(), timeout.as_secs())
            }
            ServeError::Panicked => f.write_str("the FUSE session panicked"),
            ServeError::Ended(e) => write!(f, "FUSE session ended with an error: {e}"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Mount { error, .. } | ServeError::Thread { error, .. } | ServeError::Ended(error) => {
                Some(error)
            }
            ServeError::MountPoint { error, .. } => Some(error),
            ServeError::NotAnswering { .. } | ServeError::Panicked => None,
        }
    }
}

/// The mount's source as mount(8) lists it: `fsname`, without the commas that would split the
/// mount options it is passed in.
pub fn mount_source(fsname: &str) -> String {
    fsname.replace(',', "_")
}

/// The fuser configuration for a mount.
fn fuse_config(fsname: &str, options: &ServeOptions, splice: bool) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::FSName(mount_source(fsname)),
        MountOption::Subtype("stfs".into()),
    ];
    if options.allow_other {
        config.acl = SessionACL::All;
        config.mount_options.push(MountOption::DefaultPermissions);
    } else if options.allow_root {
        // The kernel lets everyone in (allow_other); fuser answers only root and the owner.
        config.acl = SessionACL::RootAndOwner;
        config.mount_options.push(MountOption::DefaultPermissions);
    }
    config.n_threads = Some(options.threads as usize);
    // One /dev/fuse descriptor per thread spreads requests without a shared-queue bottleneck; it
    // needs permission to open /dev/fuse, which an unprivileged user mounting through fusermount
    // may lack, so probe first. Spliced replies need the one shared descriptor instead (the
    // kernel finds a reply's request only on the descriptor it was read from).
    config.clone_fd = !splice && std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok();
    config
}

/// Mounts `fs`, calls `on_ready` once the mount answers (with the error if it never does), and
/// serves until unmounted or signalled; `watcher` is armed once the mount answers. `on_ready`
/// returns whether the news reached whoever waits for the mount: if not (the `stfs mount` that
/// forked this daemon was killed meanwhile), nobody knows the mount is there, and it is withdrawn
/// (detached lazily) instead of left behind. Signals must already be blocked (see
/// [`crate::mount::signals::block_signals`]).
pub fn serve(
    fs: Arc<Fs>,
    fsname: &str,
    options: &ServeOptions,
    mut watcher: Option<AutoUnmount>,
    on_ready: impl FnOnce(Result<(), &ServeError>) -> bool,
) -> Result<(), ServeError> {
    let mp = options.mountpoint.clone();
    // Spliced replies only carry a local file's bytes: without one, keep per-thread descriptors.
    let splice = options.splice && fs.serves_file_ranges();
    let config = fuse_config(fsname, options, splice);
    let (session, mounted, uring) = match open_session(Arc::clone(&fs), fsname, options, &config, splice) {
        Ok(s) => s,
        Err(e) => return Err(not_ready(on_ready, e)),
    };
    let (stop, stopped) = mpsc::channel();
    let ended = SessionEnded(stop.clone());
    let stats = Arc::clone(fs.stats());
    let runner = std::thread::Builder::new().name("fuse-session".into()).spawn(move || {
        let _ended = ended;
        // The ring threads (if INIT agreed to FUSE over io_uring) start beside fuser's.
        session.run_with(|dispatcher| uring.start(dispatcher, stats))
    });
    let runner = match runner {
        Ok(r) => r,
        Err(error) => {
            mounted.give_up();
            return Err(not_ready(on_ready, ServeError::Thread { purpose: "session", error }));
        }
    };
    // A premounted descriptor has no path here to look at: its INIT answered is its readiness.
    if options.premounted.is_none() {
        if let Err(e) = wait_until_answering(&mp) {
            mounted.give_up();
            return Err(not_ready(on_ready, e));
        }
    }
    let readahead_kb = kernel_readahead_kb(options.kernel_readahead_kb, &fs, splice);
    if options.premounted.is_some() {
        info!("kernel readahead left to whoever mounted {}: stfs does not know where the mount is", mp.display());
    } else if readahead_kb > 0 {
        if let Err(e) = mountpoint::set_kernel_readahead(&mp, readahead_kb) {
            info!("kernel readahead left at its default: {e}");
        }
    }
    let own = mounted.own_mount(&mp);
    match (&own, watcher.as_mut()) {
        (Some(own), Some(w)) => w.arm(own.id()),
        (None, Some(_)) => warn!("auto_unmount: {} is not in mountinfo; the watcher stands down", mp.display()),
        _ => {}
    }
    info!("mounted {} on {}", fsname, mp.display());
    if !on_ready(Ok(())) && options.premounted.is_none() {
        warn!("{}: whoever mounted it is gone before hearing it was ready: withdrawing the mount", mp.display());
        match own.as_ref().map(|own| own.unmount(true)) {
            Some(Ok(Whereabouts::Top(_) | Whereabouts::Gone)) => {}
            Some(Ok(Whereabouts::Covered(at))) => warn!("{} is covered by another mount: left as it is", at.display()),
            Some(Err(e)) => warn!("{}: withdrawing failed: {e}", mp.display()),
            None => warn!("{} is not known in mountinfo: left as it is", mp.display()),
        }
    }
    let signal_mp = mp.clone();
    let premounted = options.premounted.is_some();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let signal = wait_for_signal();
            if premounted {
                info!("signal {signal}: stopping; the premounted {} ends with its connection", signal_mp.display());
                let _ = stop.send(Stop::Abandoned);
            } else if !unmount_on_signal(signal, own.as_ref(), &signal_mp) {
                let _ = stop.send(Stop::Abandoned);
            }
        })
        .map_err(|error| ServeError::Thread { purpose: "signal thread", error })?;
    if let Ok(Stop::Abandoned) = stopped.recv() {
        // The FUSE threads are still reading /dev/fuse: the process exits under them, and the
        // kernel ends the connection when it closes the device.
        info!("stopped serving {}; final counters: {}", mp.display(), fs.stats().to_json());
        return Ok(());
    }
    let result = runner.join().map_err(|_| ServeError::Panicked);
    // A session that ended because its mount went away has nothing left to unmount (and its mount
    // ID may already name a newer mount). One that failed or panicked may leave its mount listed
    // (a spliced reply keeps the connection open: see `fuse/mod.rs`), which is detached if it is
    // still the topmost at its mount point.
    if let (Some(own), false) = (&own, matches!(result, Ok(Ok(())))) {
        match own.unmount(true) {
            Ok(Whereabouts::Top(at)) => info!("detached {} after the session ended", at.display()),
            Ok(Whereabouts::Covered(at)) => warn!("{} is covered by another mount: left as it is", at.display()),
            Ok(Whereabouts::Gone) => {}
            Err(e) => warn!("{}: detaching failed: {e}", mp.display()),
        }
    }
    let result = result?;
    info!("unmounted {}; final counters: {}", mp.display(), fs.stats().to_json());
    result.map_err(ServeError::Ended)
}

/// Unmounts the daemon's own mount for `signal`, only while it is the topmost mount at its mount
/// point (where it is now: a renamed parent moves it); a busy one is detached lazily, and the
/// session ends when its last file is closed. Returns false when the session must be ended by
/// the daemon instead: its mount was detached already (`stfs umount -l`), is covered by another
/// mount, or could not be unmounted. What is mounted over it is never touched.
fn unmount_on_signal(signal: libc::c_int, own: Option<&OwnMount>, mp: &Path) -> bool {
    let Some(own) = own else {
        warn!("signal {signal}: {} is not known in mountinfo: stopping without unmounting", mp.display());
        return false;
    };
    let unmounted = own.unmount(false).or_else(|e| {
        warn!("signal {signal}: unmounting {} failed ({e}); detaching lazily", mp.display());
        own.unmount(true)
    });
    match unmounted {
        Ok(Whereabouts::Top(at)) => {
            info!("signal {signal}: unmounted {}", at.display());
            true
        }
        Ok(Whereabouts::Covered(at)) => {
            warn!(
                "signal {signal}: another mount covers {}, and stays; stopping: the mount under it is left without \
                 its daemon, for `stfs umount` once uncovered",
                at.display()
            );
            false
        }
        Ok(Whereabouts::Gone) => {
            info!(
                "signal {signal}: the mount of {} was detached already; stopping: files still open on it fail with \
                 ENOTCONN",
                mp.display()
            );
            false
        }
        Err(e) => {
            warn!("signal {signal}: detaching {} failed ({e}); stopping", mp.display());
            false
        }
    }
}

/// Why the daemon stops waiting for its session.
enum Stop {
    /// The session's threads have ended.
    Ended,
    /// A signal came, and the mount could not be unmounted: the daemon exits with its session running.
    Abandoned,
}

/// Sends [`Stop::Ended`] when dropped: when the session thread ends, by returning or panicking.
struct SessionEnded(mpsc::Sender<Stop>);

impl Drop for SessionEnded {
    fn drop(&mut self) {
        let _ = self.0.send(Stop::Ended);
    }
}

/// Tells `on_ready` that the mount will not answer, and gives the error back for the caller.
fn not_ready(on_ready: impl FnOnce(Result<(), &ServeError>) -> bool, e: ServeError) -> ServeError {
    on_ready(Err(&e));
    e
}

/// A mount made by [`open_session`], and how it is known.
enum Mounted {
    /// stfs mounted it (as [`crate::mount::mountinfo::FS_TYPE`]), and knows its mount ID.
    Own(OwnMount),
    /// fuser mounted it through fusermount, for a user who may not mount; its ID is read from
    /// mountinfo once it answers.
    Fuser(fuser::SessionUnmounter),
    /// Someone else mounted it and handed over its descriptor: stfs never unmounts it.
    Premounted,
}

impl Mounted {
    /// Takes the mount down before it was ready: stfs's own only while it is the topmost at its
    /// mount point, fuser's through fuser.
    fn give_up(self) {
        match self {
            Mounted::Own(own) => {
                let _ = own.unmount(true);
            }
            Mounted::Fuser(mut unmounter) => {
                let _ = unmounter.unmount();
            }
            Mounted::Premounted => {}
        }
    }

    /// The daemon's own mount, once it answers at `mp`: fuser's is the topmost stfs mount there.
    fn own_mount(self, mp: &Path) -> Option<OwnMount> {
        match self {
            Mounted::Own(own) => Some(own),
            Mounted::Premounted => None,
            Mounted::Fuser(_) => {
                let top = mountinfo::locate(mp).ok().and_then(|(_, top)| top).filter(|m| m.is_stfs());
                top.map(|m| OwnMount::new(m.id))
            }
        }
    }
}

/// Mounts and returns the session to run: as type `fuse.stfs` with stfs's own system calls where
/// that is permitted (root), else through fuser, which runs fusermount. stfs's own mount is
/// attached at the mount point once the session has answered the kernel's INIT; one that lands on
/// another mount made there since `stfs mount` checked the mount point (a race between two
/// mounts) withdraws, and the mount point is reported as already mounted on.
/// Sets FD_CLOEXEC on `fd`.
fn close_on_exec(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this process owns; F_GETFD/F_SETFD touch only its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn open_session(
    fs: Arc<Fs>,
    fsname: &str,
    options: &ServeOptions,
    config: &Config,
    splice: bool,
) -> Result<(fuser::Session<FuseAdapter>, Mounted, UringTarget), ServeError> {
    let mp = &options.mountpoint;
    let failed = |error| ServeError::Mount { mountpoint: mp.clone(), error };
    let adapter = FuseAdapter::new(fs)
        .splicing(splice)
        .requests_up_to(options.max_request_bytes)
        .passing_through(options.passthrough)
        .io_uring(options.io_uring, options.threads);
    let target = adapter.splice_target();
    let uring = adapter.uring_target();
    if let Some(fd) = options.premounted {
        // SAFETY: the caller checked that `fd` is an open /dev/fuse descriptor that nothing else in
        // this process owns (inherited, named by the mount point `/dev/fd/N`): the session takes it.
        let device = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // It came in inheritable (the parent cleared close-on-exec to pass it): set it back, so
        // that no helper the daemon runs (gcloud, a credential process) holds the connection.
        close_on_exec(&device).map_err(failed)?;
        let session = fuser::Session::from_fd(adapter, device, config.acl, config.clone()).map_err(failed)?;
        connect_splice(splice, &target, &session);
        return Ok((session, Mounted::Premounted, uring));
    }
    let Some((device, pending)) =
        mountpoint::mount_fuse(mp, &mount_source(fsname), options.allow_other || options.allow_root).map_err(failed)?
    else {
        // fusermount3 mounts it, and lives on with auto_unmount: with the caller's limit.
        let session = crate::mount::limits::with_original_limit(|| fuser::Session::new(adapter, mp, config));
        let mut session = session.map_err(failed)?;
        let unmounter = Mounted::Fuser(session.unmount_callable());
        connect_splice(splice, &target, &session);
        return Ok((session, unmounter, uring));
    };
    let session = match fuser::Session::from_fd(adapter, device, config.acl, config.clone()) {
        Ok(session) => session,
        Err(e) => {
            // The handshake failed: the mount must not outlive this error.
            let _ = pending.withdraw();
            // Seen once in a loaded CI run of concurrent mounts on one mount point: a loser's
            // handshake read ECONNABORTED while the winner was already there. Whatever broke it,
            // the mount point is taken: say so, as the other losers do.
            if mountpoint::is_mount_point(mp) {
                return Err(ServeError::MountPoint { mountpoint: mp.clone(), error: MountPointError::AlreadyMounted });
            }
            return Err(failed(e));
        }
    };
    let own = match pending.attach(mp) {
        Ok(id) => OwnMount::new(id),
        Err(e) => {
            drop(pending);
            // Seen in a loaded run of concurrent mounts on FUSE over io_uring: move_mount(2) said
            // ENOENT, its target resolved to a racing mount that withdrew meanwhile. The mount
            // point is taken then: say so, as the other losers do.
            if mountpoint::is_mount_point(mp) {
                return Err(ServeError::MountPoint { mountpoint: mp.clone(), error: MountPointError::AlreadyMounted });
            }
            return Err(failed(e));
        }
    };
    if own.lost_race() {
        info!("{}: another mount was made there at the same time; withdrawing mount {}", mp.display(), own.id());
        if let Err(e) = pending.withdraw() {
            warn!("{}: withdrawing mount {} failed: {e}", mp.display(), own.id());
        }
        return Err(ServeError::MountPoint { mountpoint: mp.clone(), error: MountPointError::AlreadyMounted });
    }
    // Its own descriptor goes: a mount held open would be busy for `stfs umount`.
    drop(pending);
    connect_splice(splice, &target, &session);
    Ok((session, Mounted::Own(own), uring))
}

/// Gives the adapter the session's descriptor for spliced replies, if they are wanted; without
/// it (no descriptor to spare) every reply goes through fuser, which is only slower.
fn connect_splice(splice: bool, target: &SpliceTarget, session: &fuser::Session<FuseAdapter>) {
    if splice {
        if let Err(e) = target.connect(session.as_fd()) {
            info!("read replies are copied, not spliced: {e}");
        }
    }
}

/// The kernel readahead for a wish of `kb` KiB: at least one whole request of the size the kernel
/// granted (`max_request_bytes`) when the wish is at least one request of the old 1 MiB limit,
/// so that larger requests are sent at all; rounded down to whole requests when splicing.
fn kernel_readahead_kb(kb: u32, fs: &Fs, splice: bool) -> u32 {
    let request = u32::try_from(fs.stats().max_request_bytes.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(0);
    let kb = if kb >= 1016 { kb.max(request >> 10) } else { kb };
    if splice && request > 0 {
        readahead_in_whole_reads(kb, request)
    } else {
        kb
    }
}

/// Polls the mount point until its root answers as inode 1 (the FUSE root), with a timeout.
fn wait_until_answering(mp: &Path) -> Result<(), ServeError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match std::fs::metadata(mp) {
            Ok(m) if m.ino() == 1 && mountpoint::is_mount_point(mp) => return Ok(()),
            _ if Instant::now() >= deadline => {
                return Err(ServeError::NotAnswering { mountpoint: mp.to_path_buf(), timeout: READY_TIMEOUT })
            }
            _ => std::thread::sleep(pause),
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::time::Duration;

    use crate::mount::session::{mount_source, ServeError};

    #[test]
    fn errors_name_the_mount_point_and_keep_their_cause() {
        let e =
            ServeError::Mount { mountpoint: "/mnt/m".into(), error: std::io::Error::from_raw_os_error(libc::EPERM) };
        assert_eq!(e.to_string(), "/mnt/m: mounting failed: operation not permitted");
        assert!(e.source().is_some());
        let e = ServeError::NotAnswering { mountpoint: "/mnt/m".into(), timeout: Duration::from_secs(30) };
        assert_eq!(e.to_string(), "/mnt/m: the mount did not answer within 30 s");
        assert_eq!(mount_source("/m/a,b.safetensors"), "/m/a_b.safetensors");
    }
}
