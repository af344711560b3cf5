//! `stfs mount`: check what needs no opening in the foreground, go to the background, then open
//! the checkpoint and serve; an error of the opening travels back to the foreground as one line.

use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
use std::process::ExitCode;
use std::sync::Arc;

use crate::checkpoint::{self, OpenOptions};
use crate::cli::args::MountArgs;
use crate::cli::options::MountConfig;
use crate::cli::report::{Failure, EXIT_FAILURE};
use crate::cli::unprivileged::{dropping_to, premount_for, UnprivilegedError, PREMOUNTED_WAIT};
use crate::engine::disk::DiskCache;
use crate::fs::Fs;
use crate::mount::access::check_can_mount;
use crate::mount::build::{build_fs, FsOptions};
use crate::mount::daemon::{self, Role};
use crate::mount::logging::{init_debug_logging, init_logging, init_syslog};
use crate::mount::metrics::{self, Exporter, MetricsError, MetricsTargets};
use crate::mount::mountpoint::{check_mount_point, check_not_hiding};
use crate::mount::premount::{SOURCE_FROM_ENV, SOURCE_VAR};
use crate::mount::premounted::{check_premounted, keep_from_its_users_other_processes, premounted_descriptor};
use crate::mount::privileges::last_capability;
use crate::mount::session::{mount_source, serve, ServeError};
use crate::mount::signals::{block_signals, exit_saying, interruptible, signal_name};
use crate::mount::watcher::{spawn_watcher, AutoUnmount};
use crate::stats::Stats;

/// Runs `stfs mount`.
///
/// Before the fork: the options, the mount point (a directory, nothing mounted on it), whether
/// this user can mount FUSE, the metrics targets. After it (or without it, in the foreground):
/// the checkpoint is opened (credentials fetched, every shard's header read), the mount point
/// checked not to hide one of its files, the disk cache opened and the tree built. So no thread
/// of a source (a credential refresh, a lookup's runtime) ever crosses a fork, and an error of
/// the opening reaches the foreground as the one line it always was, nothing half-mounted.
pub fn run(mut args: MountArgs) -> Result<ExitCode, Failure> {
    if args.source == SOURCE_FROM_ENV {
        args.source = source_from_env()?;
    }
    let mut config = MountConfig::from_args(args)?;
    // The daemon leaves the working directory, so every path it keeps must be absolute.
    config.mountpoint =
        std::path::absolute(&config.mountpoint).map_err(|e| Failure::at(config.mountpoint.display(), e))?;
    let dropping = dropping_to(&config)?;
    let stats = Arc::new(Stats::default());
    let open_options = config.open_options(stats.clone())?;
    let (mut fs_options, mut serve_options) = (config.fs_options(), config.serve_options());
    match serve_options.premounted {
        Some(fd) => {
            if config.auto_unmount {
                return Err(Failure::usage(UnprivilegedError::NoMountPointToWatch));
            }
            check_premounted(fd, PREMOUNTED_WAIT).map_err(|e| Failure::at(config.mountpoint.display(), e))?;
            keep_from_its_users_other_processes();
        }
        None => check_place(&config.mountpoint)?,
    }
    let fsname = if checkpoint::is_url(&config.source) {
        crate::source::http::display_name(&config.source)
    } else {
        std::path::absolute(&config.source).map_or(config.source.clone(), |p| p.display().to_string())
    };
    let exports = metrics_targets(&mut config)?;
    // The mount point as mountinfo will list it (parents resolved), so that `stfs stats
    // --prometheus` labels this mount's samples the same (a descriptor is labelled as named).
    let place = match serve_options.premounted {
        Some(_) => config.mountpoint.clone(),
        None => crate::mount::mountinfo::locate(&config.mountpoint).map_or(config.mountpoint.clone(), |(p, _)| p),
    };
    let labels = metrics::labels(&place, &mount_source(&fsname));
    // Before any shard is opened: a checkpoint of hundreds of shards needs more than a soft 1,024.
    crate::mount::limits::raise_open_files_limit();
    if config.foreground {
        let init = || if config.debug { init_debug_logging() } else { init_logging(None) };
        let watcher = watch(&config, init)?;
        // Before any thread starts (the opening's may): they inherit the mask.
        block_signals();
        // Logging starts once the checkpoint is open: a failed opening is the one line on stderr.
        let stopped = stopped_while_opening(&config.mountpoint, &fsname);
        let fs = interruptible(
            || open(&config, &open_options, &mut fs_options, &stats),
            move |signal| {
                exit_saying(std::io::stderr().as_fd(), &format!("stfs: {}", stopped(signal)), None, EXIT_FAILURE)
            },
        )?;
        init();
        log::debug!("mounting {fsname} on {}: {fs_options:?}, {serve_options:?}", config.mountpoint.display());
        let _exporter = export(&stats, labels, exports)?;
        serve(fs, &fsname, &serve_options, watcher, |_| true)?;
        return Ok(ExitCode::SUCCESS);
    }
    // The foreground waits for the opening too: within its timeout (credentials, then the
    // checkpoint's one deadline), then the usual time for the mount to answer.
    let wait = daemon::READY_TIMEOUT + 2 * open_options.http.timeout;
    // With --drop-privileges, root mounts here, and the daemon serves the descriptor as the user.
    let premount = match &dropping {
        Some(identity) => Some(premount_for(&config, &fsname, identity)?),
        None => None,
    };
    if let Some(premount) = &premount {
        serve_options.premounted = Some(premount.device.as_raw_fd());
    }
    let readiness = match daemon::daemonize(config.log_file.as_deref(), wait) {
        // The child reported that the mount answers.
        Ok(Role::Parent) => {
            if let Some(premount) = premount {
                premount.served(config.kernel_readahead_kb);
            }
            return Ok(ExitCode::SUCCESS);
        }
        Ok(Role::Child(readiness)) => readiness,
        Err(e) => {
            if let Some(premount) = premount {
                premount.withdraw();
            }
            return Err(e.into());
        }
    };
    if let (Some(identity), Some(premount)) = (&dropping, premount) {
        // The daemon owns the descriptor now; the session takes it over.
        let _ = premount.device.into_raw_fd();
        if let Err(e) = identity.become_it(last_capability()) {
            readiness.failed(&e);
            return Err(Failure::new(e));
        }
    }
    // From here on we are the daemon: errors go to the parent through the readiness pipe.
    let init = || if config.log_file.is_some() { init_logging(config.log_file.as_deref()) } else { init_syslog() };
    let watcher = watch(&config, init);
    init();
    let watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            readiness.failed(&e);
            return Err(e.into());
        }
    };
    block_signals();
    // A signal while opening (the foreground gave up waiting, or a user's kill) ends the daemon at
    // once: nothing is mounted yet. The reason goes, as the daemon's one line, to the foreground
    // (which prints it), on a descriptor of the readiness pipe of its own, then to the log.
    let last_words = match readiness.last_words() {
        Ok(fd) => fd,
        Err(e) => {
            let e = Failure::at(config.mountpoint.display(), e);
            readiness.failed(&e);
            return Err(e);
        }
    };
    let stopped = stopped_while_opening(&config.mountpoint, &fsname);
    let opened = interruptible(
        || open(&config, &open_options, &mut fs_options, &stats),
        move |signal| {
            // The parent's line first: a log file on a stuck filesystem must not keep it waiting.
            let line = stopped(signal);
            exit_saying(last_words.as_fd(), &line, Some(line.clone()), EXIT_FAILURE)
        },
    );
    // Sources are kept by absolute path; relative ones were opened (and named) as given.
    daemon::leave_working_directory();
    let fs = match opened {
        Ok(fs) => fs,
        Err(e) => {
            readiness.failed(&e);
            return Err(e);
        }
    };
    log::debug!("mounting {fsname} on {}: {fs_options:?}, {serve_options:?}", config.mountpoint.display());
    // Stopped (and its file removed) when this returns, after the mount is gone.
    let _exporter = match export(&stats, labels, exports) {
        Ok(exporter) => exporter,
        Err(e) => {
            readiness.failed(&e);
            return Err(e.into());
        }
    };
    let mut readiness = Some(readiness);
    let result = serve(fs, &fsname, &serve_options, watcher, |r| match (readiness.take(), r) {
        (Some(p), Ok(())) => p.ready(),
        (Some(p), Err(e)) => {
            p.failed(e);
            true
        }
        (None, _) => true,
    });
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            log::error!("{e}");
            Err(e.into())
        }
    }
}

/// The source [`SOURCE_VAR`] holds, the variable then removed (no child of the daemon sees it).
fn source_from_env() -> Result<String, Failure> {
    let source = match std::env::var(SOURCE_VAR) {
        Ok(source) if !source.is_empty() => source,
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            return Err(Failure::usage(format!("SOURCE is `-` but {SOURCE_VAR} is not set (it holds the source)")))
        }
        Err(std::env::VarError::NotUnicode(_)) => return Err(Failure::usage(format!("{SOURCE_VAR}: not UTF-8"))),
    };
    std::env::remove_var(SOURCE_VAR);
    Ok(source)
}

/// The one line saying that `signal` stopped the opening of `source` for `mountpoint`.
fn stopped_while_opening(mountpoint: &std::path::Path, source: &str) -> impl Fn(libc::c_int) -> String {
    let (mountpoint, source) = (mountpoint.display().to_string(), source.to_string());
    move |signal| {
        format!("{mountpoint}: stopped by {} while opening {source}; nothing was mounted", signal_name(signal))
    }
}

/// Opens the checkpoint and what serves it: its sources (credentials included), the check that
/// the mount would hide none of its files, the disk cache (a directory others could write to is
/// refused in one line), and the filesystem.
fn open(
    config: &MountConfig,
    open_options: &OpenOptions,
    fs_options: &mut FsOptions,
    stats: &Arc<Stats>,
) -> Result<Arc<Fs>, Failure> {
    let opened = checkpoint::open(&config.source, open_options)?;
    // A premounted descriptor's mount is wherever its mounter put it (checked there, for
    // --drop-privileges, before mounting).
    if premounted_descriptor(&config.mountpoint).is_none() && config.drop_privileges.is_none() {
        check_hiding(&config.mountpoint, &opened)?;
    }
    build_opened(config, opened, fs_options, stats)
}

/// The filesystem over `opened` as `config` asks: its disk cache (a directory others could write
/// to is refused in one line), then the tree. A mount and a reader in this process without one
/// (`unmounted`) build it here alike.
pub fn build_opened(
    config: &MountConfig,
    opened: checkpoint::Checkpoint,
    fs_options: &mut FsOptions,
    stats: &Arc<Stats>,
) -> Result<Arc<Fs>, Failure> {
    if let Some(dir) = &config.cache_dir {
        let disk =
            DiskCache::open(dir, config.cache_dir_size, stats.clone()).map_err(|e| Failure::at(dir.display(), e))?;
        if config.no_passthrough {
            disk.forbid_extents();
        }
        fs_options.disk = Some(Arc::new(disk));
    }
    Ok(build_fs(opened, fs_options, stats.clone())?)
}
/// Checks `--metrics-file` (made absolute: the daemon leaves the working directory) and binds
/// `--metrics-addr`, before anything is mounted.
fn metrics_targets(config: &mut crate::cli::options::MountConfig) -> Result<MetricsTargets, Failure> {
    if let Some(path) = &config.metrics.metrics_file {
        let absolute = std::path::absolute(path).map_err(|e| Failure::io(path.display(), e))?;
        config.metrics.metrics_file = Some(absolute);
    }
    MetricsTargets::prepare(config.metrics.metrics_file.as_deref(), config.metrics.metrics_addr).map_err(|e| match e {
        MetricsError::NotLoopback(_) => Failure::usage(e),
        e => Failure::new(e),
    })
}

/// Starts exporting the counters where `targets` say (nothing to start if they are empty).
fn export(
    stats: &Arc<crate::stats::Stats>,
    labels: metrics::Labels,
    targets: MetricsTargets,
) -> Result<Option<Exporter>, ServeError> {
    if targets.is_empty() {
        return Ok(None);
    }
    Exporter::start(stats.clone(), labels, targets)
        .map(Some)
        .map_err(|error| ServeError::Thread { purpose: "metrics exporter", error })
}

/// With `--auto-unmount`, forks the watcher that detaches the mount if this process dies (before
/// any thread starts); `init` sets up the watcher's logging.
fn watch(config: &MountConfig, init: impl FnOnce()) -> Result<Option<AutoUnmount>, ServeError> {
    if !config.auto_unmount {
        return Ok(None);
    }
    spawn_watcher(&config.mountpoint, init)
        .map(Some)
        .map_err(|error| ServeError::Thread { purpose: "auto_unmount watcher", error })
}

/// Checks, before anything is opened or mounted, that `mountpoint` is a directory with nothing
/// mounted on it and that this user can mount FUSE.
pub fn check_place(mountpoint: &std::path::Path) -> Result<(), Failure> {
    check_mount_point(mountpoint).map_err(|e| Failure::at(mountpoint.display(), e))?;
    check_can_mount().map_err(|e| Failure::at(mountpoint.display(), e))
}

/// Checks that a mount on `mountpoint` would hide no file of `checkpoint`.
pub fn check_hiding(mountpoint: &std::path::Path, checkpoint: &checkpoint::Checkpoint) -> Result<(), Failure> {
    // Local shards are named by absolute path; remote ones by URL.
    let files = checkpoint.all_shards().map(|s| std::path::Path::new(s.source.name())).filter(|p| p.is_absolute());
    check_not_hiding(mountpoint, files).map_err(|e| Failure::at(mountpoint.display(), e))
}
