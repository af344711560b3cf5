//! `stfs umount`: unmount an stfs mount (and nothing else), or clear a stale one left by a killed
//! daemon, within 2 s whatever the daemon does (up to 60 s while the kernel still works through a
//! large mount); through fusermount3 when not root.

use std::process::ExitCode;

use crate::cli::args::UmountArgs;
use crate::cli::report::Failure;
use crate::mount::unmount::unmount;

/// Runs `stfs umount`.
pub fn run(args: UmountArgs) -> Result<ExitCode, Failure> {
    unmount(&args.mountpoint, args.lazy).map_err(|e| Failure::at(args.mountpoint.display(), e))?;
    Ok(ExitCode::SUCCESS)
}
