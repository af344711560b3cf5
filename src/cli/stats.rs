//! `stfs stats`: print a mount's live counters, read from its `.stfs/stats.json`.

use std::fmt;
use std::io;
use std::process::ExitCode;

use crate::cli::args::StatsArgs;
use crate::cli::report::{print_out, Failure};
use crate::tree::namespace::{CONTROL_DIR, STATS_NAME};
use crate::util::describe_io;

/// The mount point has no readable stats document.
#[derive(Debug)]
struct NotAMount(io::Error);

impl fmt::Display for NotAMount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an stfs mount, or not readable ({})", describe_io(&self.0))
    }
}

impl std::error::Error for NotAMount {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Runs `stfs stats`: prints the mount's live counters as JSON.
pub fn run(args: StatsArgs) -> Result<ExitCode, Failure> {
    let path = args.mountpoint.join(CONTROL_DIR).join(STATS_NAME);
    let text = std::fs::read_to_string(&path).map_err(|e| Failure::at(args.mountpoint.display(), NotAMount(e)))?;
    print_out(&text)
}
