//! `stfs stats`: print a mount's live counters, read from its `.stfs/stats.json`, as a short human
//! summary (reprinted live with `--watch`), as the JSON itself (`--json`) or (with `--prometheus`)
//! in the Prometheus text format, labelled as the mount's `--metrics-file` is.

mod summary;

use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cli::args::StatsArgs;
use crate::cli::report::{print_out, Failure};
use crate::format::PrintablePath;
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

/// Longest stats document read: a mount's is a few KiB.
const MAX_STATS_BYTES: u64 = 1 << 20;

/// Reads the stats document at `path`, which must be a regular file (not a FIFO or a device) of
/// at most [`MAX_STATS_BYTES`] ([`crate::source::read_regular`]): `stfs stats DIR` on a directory
/// that is no mount reads whatever is planted there, and must neither block on a FIFO nor read
/// `/dev/zero` until memory runs out.
fn read_stats(path: &std::path::Path) -> io::Result<String> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{CONTROL_DIR}/{STATS_NAME} {e}"));
    let bytes = crate::source::read_regular(path, MAX_STATS_BYTES).map_err(named)?;
    String::from_utf8(bytes).map_err(|_| named(io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8")))
}

/// The mount's stats document, as text and parsed.
fn read_doc(args: &StatsArgs, shown: &str) -> Result<(String, serde_json::Value), Failure> {
    let path = args.mountpoint.join(CONTROL_DIR).join(STATS_NAME);
    let text = read_stats(&path).map_err(|e| Failure::at(shown, NotAMount(e)))?;
    let doc = serde_json::from_str(&text).map_err(|e| Failure::at(shown, NotStats(e)))?;
    Ok((text, doc))
}

/// Seconds since the epoch, now.
fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `--watch`: the summary every `interval`, with each interval's throughput; on a terminal each
/// replaces the last. Ends when the mount can no longer be read (unmounted), or on a signal.
fn watch(args: &StatsArgs, shown: &str, interval: f64) -> Result<ExitCode, Failure> {
    let clear = if io::stdout().is_terminal() { "\x1b[H\x1b[2J" } else { "" };
    let mut previous: Option<(serde_json::Value, Instant)> = None;
    loop {
        let (_, doc) = read_doc(args, shown)?;
        let taken = Instant::now();
        let before = previous.as_ref().map(|(d, at)| (d, taken.duration_since(*at).as_secs_f64()));
        let text = summary::render(&doc, shown, before, now_secs());
        let separator = if previous.is_some() && clear.is_empty() { "\n" } else { "" };
        let mut out = io::stdout().lock();
        match out.write_all(format!("{clear}{separator}{text}").as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // `stfs stats --watch | head` ends when head does.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(Failure::io("writing to stdout", e)),
        }
        drop(out);
        previous = Some((doc, taken));
        std::thread::sleep(Duration::from_secs_f64(interval));
    }
}

/// Runs `stfs stats`: prints the mount's live counters as a summary (once, or under `--watch`),
/// as JSON, or in the Prometheus text format.
pub fn run(args: StatsArgs) -> Result<ExitCode, Failure> {
    let shown = PrintablePath(&args.mountpoint.to_string_lossy()).to_string();
    if let Some(interval) = args.watch {
        return watch(&args, &shown, interval);
    }
    let (text, doc) = read_doc(&args, &shown)?;
    if args.json {
        return print_out(&text);
    }
    if !args.prometheus {
        return print_out(&summary::render(&doc, &shown, None, now_secs()));
    }
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

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use crate::cli::args::StatsArgs;
    use crate::cli::stats::run;

    /// `stfs stats DIR` (or `--prometheus`) of a directory whose `.stfs/stats.json` is `planted`:
    /// the error line, within 10 s (a FIFO used to block the command for ever).
    fn error_with(planted: impl FnOnce(&Path)) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".stfs")).unwrap();
        planted(&dir.path().join(".stfs/stats.json"));
        let (tx, rx) = std::sync::mpsc::channel();
        for (prometheus, json) in [(false, false), (false, true), (true, false)] {
            let args = StatsArgs { mountpoint: PathBuf::from(dir.path()), prometheus, json, watch: None };
            let tx = tx.clone();
            std::thread::spawn(move || tx.send(run(args).map(|_| ()).map_err(|e| e.to_string())));
        }
        let mut errors: Vec<String> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("stfs stats returns").unwrap_err())
            .collect();
        errors.dedup();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let prefix = format!("{}: ", dir.path().display());
        errors[0].strip_prefix(&prefix).unwrap_or_else(|| panic!("{errors:?}")).to_string()
    }

    /// What is planted in a directory that is no mount is never waited on or read without bound.
    #[test]
    fn a_planted_fifo_device_or_huge_file_is_refused_in_one_line() {
        let fifo = error_with(|p| {
            let c = CString::new(p.as_os_str().as_bytes()).unwrap();
            // SAFETY: c is a valid NUL-terminated path for the duration of the call.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        });
        assert_eq!(fifo, "not an stfs mount, or not readable (.stfs/stats.json is not a regular file)");
        let zero = error_with(|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
        assert!(zero.starts_with("not an stfs mount, or not readable ("), "{zero}");
        let big = error_with(|p| crate::util::test_support::write_new(p, vec![b' '; (1 << 20) + 1]));
        assert_eq!(big, "not an stfs mount, or not readable (.stfs/stats.json is larger than 1048576 bytes)");
        let junk = error_with(|p| crate::util::test_support::write_new(p, b"\x1b[2J"));
        assert!(junk.starts_with(".stfs/stats.json is not a stats document ("), "{junk}");
    }
}
