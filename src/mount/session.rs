//! Serving a mount: builds the engine, namespace and filesystem for an opened checkpoint, mounts it,
//! reports readiness, and runs until unmounted or signalled (SIGINT, SIGTERM, SIGHUP unmount cleanly).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{Config, MountOption, SessionACL};
use log::{info, warn};

use crate::checkpoint::Checkpoint;
use crate::engine::{Engine, EngineConfig};
use crate::fs::Fs;
use crate::fuse::FuseAdapter;
use crate::mount::mountpoint;
use crate::stats::Stats;
use crate::tree::namespace::{AttrBase, Layout, Namespace, Shard, Views};

/// How long to wait for the new mount to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What to mount and how.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where.
    pub mountpoint: PathBuf,
    /// Engine tuning.
    pub engine: EngineConfig,
    /// FUSE threads.
    pub threads: u32,
    /// Let other users in (with default_permissions).
    pub allow_other: bool,
    /// Kernel readahead to set after mounting, in KiB (0: leave alone).
    pub kernel_readahead_kb: u32,
    /// Path layout.
    pub layout: Layout,
    /// Extra views.
    pub views: Views,
}

/// Builds the filesystem for `checkpoint` (no mount yet).
pub fn build_fs(checkpoint: Checkpoint, options: &ServeOptions, stats: Arc<Stats>) -> Result<Arc<Fs>, String> {
    let engine = Engine::new(options.engine.clone(), stats);
    let mut shards = Vec::new();
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut read_bits = 0o444;
    for s in checkpoint.shards {
        newest = newest.max(s.source.modified().unwrap_or(newest));
        if !crate::checkpoint::is_url(s.source.name()) {
            if let Ok(meta) = std::fs::metadata(s.source.name()) {
                read_bits &= meta.permissions().mode();
            }
        }
        let name = s.source.name().to_string();
        let source = engine.add_source(s.source);
        shards.push(Shard { source, name, header: s.header });
    }
    let ns = Namespace::build(shards, options.layout, options.views).map_err(|e| e.to_string())?;
    let (file_perm, dir_perm) = AttrBase::perms_from_mode(read_bits);
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let blksize = u32::try_from(options.engine.block_size).unwrap_or(u32::MAX);
    let base = AttrBase { uid, gid, mtime: newest, file_perm, dir_perm, blksize };
    Ok(Arc::new(Fs::new(ns, engine, base)))
}

/// The mount's source as mount(8) lists it: `fsname`, without the commas that would split the
/// mount options it is passed in.
fn mount_source(fsname: &str) -> String {
    fsname.replace(',', "_")
}

/// The fuser configuration for a mount.
fn fuse_config(fsname: &str, options: &ServeOptions) -> Config {
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
    }
    config.n_threads = Some(options.threads as usize);
    // One /dev/fuse descriptor per thread spreads requests without a shared-queue bottleneck; it
    // needs permission to open /dev/fuse, which an unprivileged user mounting through fusermount
    // may lack, so probe first.
    config.clone_fd = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok();
    config
}

/// Mounts `fs`, calls `on_ready` once the mount answers (with `Err` if it never does), and serves
/// until unmounted or signalled. Signals must already be blocked (see [`block_signals`]).
pub fn serve(
    fs: Arc<Fs>,
    fsname: &str,
    options: &ServeOptions,
    on_ready: impl FnOnce(Result<(), String>),
) -> Result<(), String> {
    let mp = options.mountpoint.clone();
    let config = fuse_config(fsname, options);
    let (session, mut unmounter) = match open_session(Arc::clone(&fs), fsname, options, &config) {
        Ok(s) => s,
        Err(e) => {
            let message = format!("{}: mounting failed: {}", mp.display(), crate::util::describe_io(&e));
            on_ready(Err(message.clone()));
            return Err(message);
        }
    };
    let own_mount = matches!(unmounter, Unmounter::Own(_));
    let runner = std::thread::Builder::new().name("fuse-session".into()).spawn(move || session.run());
    let runner = match runner {
        Ok(r) => r,
        Err(e) => {
            let _ = unmounter.unmount();
            on_ready(Err(format!("starting the session: {e}")));
            return Err(e.to_string());
        }
    };
    match wait_until_answering(&mp) {
        Ok(()) => {
            if options.kernel_readahead_kb > 0 {
                if let Err(e) = mountpoint::set_kernel_readahead(&mp, options.kernel_readahead_kb) {
                    info!("kernel readahead left at its default: {e}");
                }
            }
            info!("mounted {} on {}", fsname, mp.display());
            on_ready(Ok(()));
        }
        Err(message) => {
            let _ = unmounter.unmount();
            on_ready(Err(message.clone()));
            return Err(message);
        }
    }
    let signal_mp = mp.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let signal = wait_for_signal();
            info!("signal {signal}: unmounting {}", signal_mp.display());
            if let Err(e) = unmounter.unmount() {
                warn!("unmount failed ({e}); detaching lazily");
                let _ = mountpoint::unmount(&signal_mp, true);
            }
        })
        .map_err(|e| e.to_string())?;
    let result = runner.join().map_err(|_| "the FUSE session panicked".to_string());
    if own_mount && mountpoint::is_stale(&mp) {
        // The session ended without an unmount (its descriptor is closed): detach the dead mount.
        let _ = mountpoint::unmount(&mp, true);
    }
    let result = result?;
    info!("unmounted {}; final counters: {}", mp.display(), fs.stats().to_json());
    result.map_err(|e| format!("FUSE session ended with an error: {e}"))
}

/// How a mount made by [`open_session`] is taken down.
enum Unmounter {
    /// fuser mounted it (through fusermount, for a user who may not call mount(2)).
    Fuser(fuser::SessionUnmounter),
    /// stfs mounted it with mount(2), as [`mountpoint::FS_TYPE`].
    Own(PathBuf),
}

impl Unmounter {
    fn unmount(&mut self) -> Result<(), String> {
        match self {
            Unmounter::Fuser(unmounter) => unmounter.unmount().map_err(|e| e.to_string()),
            Unmounter::Own(mp) => match mountpoint::unmount(mp, false) {
                Ok(()) | Err(mountpoint::MountPointError::NotMounted) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        }
    }
}

/// Mounts and returns the session to run: as type `fuse.stfs` with stfs's own mount(2) call where
/// that is permitted (root), else through fuser, which runs fusermount.
fn open_session(
    fs: Arc<Fs>,
    fsname: &str,
    options: &ServeOptions,
    config: &Config,
) -> std::io::Result<(fuser::Session<FuseAdapter>, Unmounter)> {
    let mp = &options.mountpoint;
    let Some(device) = mountpoint::mount_fuse(mp, &mount_source(fsname), options.allow_other)? else {
        let mut session = fuser::Session::new(FuseAdapter::new(fs), mp, config)?;
        let unmounter = Unmounter::Fuser(session.unmount_callable());
        return Ok((session, unmounter));
    };
    match fuser::Session::from_fd(FuseAdapter::new(fs), device, config.acl, config.clone()) {
        Ok(session) => Ok((session, Unmounter::Own(mp.clone()))),
        Err(e) => {
            // The handshake failed: the mount must not outlive this error.
            let _ = mountpoint::unmount(mp, true);
            Err(e)
        }
    }
}

/// Polls the mount point until its root answers as inode 1 (the FUSE root), with a timeout.
fn wait_until_answering(mp: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match std::fs::metadata(mp) {
            Ok(m) if m.ino() == 1 && mountpoint::is_mount_point(mp) => return Ok(()),
            _ if Instant::now() >= deadline => {
                return Err(format!("{}: the mount did not answer within {} s", mp.display(), READY_TIMEOUT.as_secs()))
            }
            _ => std::thread::sleep(pause),
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a zeroed sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and every thread it starts afterwards,
/// so that only [`wait_for_signal`] receives them. Call before starting any thread.
pub fn block_signals() {
    let set = signal_set();
    // SAFETY: set is initialised; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Waits for one of the blocked signals and returns its number.
fn wait_for_signal() -> libc::c_int {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: set is initialised and sig is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    sig
}
