//! `stfs umount`: unmount an stfs mount, or clear a stale one left by a killed daemon.

use std::process::ExitCode;

use crate::cli::args::UmountArgs;
use crate::cli::report::Failure;
use crate::mount::mountpoint;

/// Runs `stfs umount`.
pub fn run(args: UmountArgs) -> Result<ExitCode, Failure> {
    mountpoint::unmount(&args.mountpoint, args.lazy).map_err(|e| Failure::at(args.mountpoint.display(), e))?;
    Ok(ExitCode::SUCCESS)
}
