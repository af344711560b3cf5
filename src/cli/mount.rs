//! `stfs mount`: validate everything in the foreground, then serve (in the background by default).

use std::process::ExitCode;
use std::sync::Arc;

use super::{MountArgs, MountConfig};
use crate::checkpoint;
use crate::mount::daemon;
use crate::mount::mountpoint::check_mount_point;
use crate::mount::session::{self, ServeOptions};
use crate::stats::Stats;

/// Extra help for `stfs mount`.
pub const AFTER_HELP: &str = "\
Mount options (-o, comma-separated; each long flag works as -o name=value):
  cache_size=SIZE, block_size=SIZE, allow_other, threads=N, io_threads=N,
  kernel_readahead_kb=KIB, log_file=PATH, foreground, npy, as=f32, layout=flat|tree
  ro, nosuid, nodev, noatime, _netdev, x-* and other generic mount(8) options are accepted and ignored.
Sizes: 4096, 512K, 64M, 2G.

Examples:
  stfs mount model.safetensors /mnt/model
  stfs mount -o cache_size=2G,allow_other model.safetensors /mnt/model
  stfs mount -f model.safetensors /mnt/model     # foreground; Ctrl-C unmounts";

/// Runs `stfs mount`.
pub fn run(args: MountArgs) -> Result<ExitCode, String> {
    let mut config = MountConfig::from_args(args)?;
    // The daemon leaves the working directory, so every path it keeps must be absolute.
    config.mountpoint =
        std::path::absolute(&config.mountpoint).map_err(|e| format!("{}: {e}", config.mountpoint.display()))?;
    // Everything that can be wrong with the input is found before forking: nothing is half-mounted.
    let stats = Arc::new(Stats::default());
    let opened =
        checkpoint::open(&config.source, &config.remote.open_options(stats.clone())?).map_err(|e| e.to_string())?;
    check_mount_point(&config.mountpoint).map_err(|e| format!("{}: {e}", config.mountpoint.display()))?;
    let options = ServeOptions {
        mountpoint: config.mountpoint.clone(),
        engine: config.engine.clone(),
        threads: config.threads,
        allow_other: config.allow_other,
        kernel_readahead_kb: config.kernel_readahead_kb,
        layout: config.layout,
        views: config.views,
    };
    let fsname = if checkpoint::is_url(&config.source) {
        crate::source::http::display_name(&config.source)
    } else {
        std::path::absolute(&config.source).map_or(config.source.clone(), |p| p.display().to_string())
    };
    if config.foreground {
        crate::init_logging(None);
        session::block_signals();
        let fs = session::build_fs(opened, &options, stats)?;
        session::serve(fs, &fsname, &options, |_| {})?;
        return Ok(ExitCode::SUCCESS);
    }
    let readiness = daemon::daemonize(config.log_file.as_deref())?;
    // From here on we are the daemon: errors go to the parent through the readiness pipe.
    crate::init_logging(config.log_file.as_deref());
    session::block_signals();
    let fs = match session::build_fs(opened, &options, stats) {
        Ok(fs) => fs,
        Err(e) => {
            readiness.failed(&e);
            return Err(e);
        }
    };
    let mut readiness = Some(readiness);
    let result = session::serve(fs, &fsname, &options, |r| {
        if let Some(p) = readiness.take() {
            match r {
                Ok(()) => p.ready(),
                Err(e) => p.failed(&e),
            }
        }
    });
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            log::error!("{e}");
            Err(e)
        }
    }
}
