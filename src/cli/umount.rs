//! `stfs umount` and `stfs stats`: the commands that act on an existing mount.

use std::process::ExitCode;

use super::{print_out, StatsArgs, UmountArgs};
use crate::mount::mountpoint;
use crate::tree::namespace::{CONTROL_DIR, STATS_NAME};

/// Runs `stfs umount`.
pub fn run_umount(args: UmountArgs) -> Result<ExitCode, String> {
    mountpoint::unmount(&args.mountpoint, args.lazy).map_err(|e| format!("{}: {e}", args.mountpoint.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `stfs stats`: prints the mount's live counters as JSON.
pub fn run_stats(args: StatsArgs) -> Result<ExitCode, String> {
    let path = args.mountpoint.join(CONTROL_DIR).join(STATS_NAME);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!("{}: not an stfs mount, or not readable ({})", args.mountpoint.display(), crate::util::describe_io(&e))
    })?;
    print_out(&text)
}
