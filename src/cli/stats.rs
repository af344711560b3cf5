//! `stfs stats`: print a mount's live counters, read from its `.stfs/stats.json`, as JSON or (with
//! `--prometheus`) in the Prometheus text format, labelled as the mount's `--metrics-file` is.

use std::fmt;
use std::io;
use std::process::ExitCode;

use crate::cli::args::StatsArgs;
use crate::cli::report::{print_out, Failure};
use crate::mount::metrics;
use crate::mount::mountinfo::locate;
use crate::stats::prometheus;
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

/// The stats document is not JSON (not an stfs mount, or one whose daemon is broken).
#[derive(Debug)]
struct NotStats(serde_json::Error);

impl fmt::Display for NotStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{CONTROL_DIR}/{STATS_NAME} is not a stats document ({})", self.0)
    }
}

impl std::error::Error for NotStats {}

/// Runs `stfs stats`: prints the mount's live counters as JSON, or in the Prometheus text format.
pub fn run(args: StatsArgs) -> Result<ExitCode, Failure> {
    let path = args.mountpoint.join(CONTROL_DIR).join(STATS_NAME);
    let text = std::fs::read_to_string(&path).map_err(|e| Failure::at(args.mountpoint.display(), NotAMount(e)))?;
    if !args.prometheus {
        return print_out(&text);
    }
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Failure::at(args.mountpoint.display(), NotStats(e)))?;
    // Labelled as the daemon labels its --metrics-file: the mount point and source of mountinfo.
    let labels = match locate(&args.mountpoint) {
        Ok((place, Some(entry))) if entry.is_stfs() => metrics::labels(&place, &entry.source),
        _ => {
            let place = std::path::absolute(&args.mountpoint).unwrap_or(args.mountpoint.clone());
            vec![("mountpoint".to_string(), place.display().to_string())]
        }
    };
    let pairs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    print_out(&prometheus::render(&doc, &pairs))
}
