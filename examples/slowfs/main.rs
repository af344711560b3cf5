//! slowfs: a read-only passthrough FUSE mount that charges object-store costs (GCSFuse-like) per handle.
//!
//! Model. Every open file handle is one network stream. A read that starts exactly where that
//! handle's previous read ended costs transfer time only (`len / bandwidth`). Any other read (the
//! first on the handle, a backward jump, a forward jump) is a new range request and first pays
//! the fixed latency. Reads on one handle are served one at a time, in the order the kernel
//! queued them (by FUSE request id), so several threads never overlap on one stream; different
//! handles proceed in parallel (8 FUSE threads).
//!
//! Page cache. Files are opened without `FOPEN_KEEP_CACHE`, like a network filesystem: the kernel
//! drops this file's cached pages on every open, so each new open (a fresh stfs mount, a fresh
//! Python process) starts cold. Within one open the page cache still serves re-reads, as it does
//! on GCSFuse. Kernel readahead is left at its default (128 KiB).
//!
//! Counters (global, since mount): READ requests, range requests, bytes served, opens. They are
//! readable as JSON from the hidden file `MOUNTPOINT/.slowfs_stats` (not listed by readdir, always
//! fresh: direct I/O) and, with `--stats-file PATH`, rewritten atomically to PATH whenever they
//! changed (checked every 50 ms) and once more at unmount.
//!
//! Usage: `slowfs SRC_DIR MOUNTPOINT [--bandwidth-mbps 200] [--latency-ms 10] [--stats-file PATH]`.
//! Bandwidth is in megabytes (10^6 bytes) per second per handle. Prints `ready` on stdout once the
//! mount is visible in /proc/self/mountinfo; unmounts and exits on SIGINT or SIGTERM, or when
//! someone else unmounted it.

mod fs;

use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use fuser::{Config, MountOption};

use fs::{CostModel, Counters, SlowFs};

#[derive(Parser)]
#[command(about = "Read-only passthrough FUSE mount that models object-store per-stream costs")]
struct Args {
    /// Directory whose regular files are exposed (flat, no subdirectories).
    src_dir: PathBuf,
    /// Where to mount.
    mountpoint: PathBuf,
    /// Per-handle stream bandwidth in MB/s (10^6 bytes per second).
    #[arg(long, default_value_t = 200.0)]
    bandwidth_mbps: f64,
    /// Fixed cost of each new range request, in milliseconds.
    #[arg(long, default_value_t = 10.0)]
    latency_ms: f64,
    /// Also keep the counters as JSON in this file.
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 8)]
    threads: usize,
}

/// True when `mountpoint` (canonical path) appears as a mount point in /proc/self/mountinfo.
fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = mountpoint.as_os_str().as_bytes();
    text.lines().any(|line| line.split(' ').nth(4).is_some_and(|field| unescape_octal(field) == wanted))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], code) {
            (b'\\', Some(code)) => {
                out.push(code);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

fn write_stats_file(path: &Path, counters: &Counters) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, counters.to_json())?;
    std::fs::rename(&tmp, path)
}

/// Blocks SIGINT and SIGTERM in this thread (and in the threads it spawns later) and returns the set.
fn block_exit_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local, zero-initialised sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits up to `timeout` for one of the signals in `set`; true if one arrived.
fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> bool {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `set` is a valid signal set and the info pointer may be null.
    unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) > 0 }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.bandwidth_mbps.is_nan() || args.bandwidth_mbps <= 0.0 || args.latency_ms.is_nan() || args.latency_ms < 0.0 {
        return Err("--bandwidth-mbps must be > 0 and --latency-ms >= 0".into());
    }
    let model =
        CostModel { bytes_per_sec: args.bandwidth_mbps * 1e6, latency: Duration::from_secs_f64(args.latency_ms / 1e3) };
    let counters = Arc::new(Counters::default());
    let fs = SlowFs::new(&args.src_dir, model, Arc::clone(&counters))?;
    let mountpoint = std::fs::canonicalize(&args.mountpoint)?;

    let signals = block_exit_signals();
    let mut config = Config::default();
    config.mount_options =
        vec![MountOption::RO, MountOption::FSName("slowfs".into()), MountOption::Subtype("slowfs".into())];
    config.n_threads = Some(args.threads.max(1));
    let session = fuser::spawn_mount(fs, &mountpoint, &config)?;

    let ready_by = Instant::now() + Duration::from_secs(10);
    while !is_mounted(&mountpoint) {
        if Instant::now() > ready_by {
            return Err("mount did not appear in /proc/self/mountinfo within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("ready");
    io::stdout().flush()?;

    let mut last_written = String::new();
    loop {
        if let Some(path) = &args.stats_file {
            let json = counters.to_json();
            if json != last_written {
                write_stats_file(path, &counters)?;
                last_written = json;
            }
        }
        if wait_signal(&signals, Duration::from_millis(50)) {
            break;
        }
        if !is_mounted(&mountpoint) {
            eprintln!("slowfs: {} was unmounted externally", mountpoint.display());
            break;
        }
    }
    let unmounted = session.umount_and_join();
    if let Some(path) = &args.stats_file {
        write_stats_file(path, &counters)?;
    }
    unmounted?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_octal("/tmp/a\\040b\\134c"), b"/tmp/a b\\c".to_vec());
        assert_eq!(unescape_octal("/x\\04"), b"/x\\04".to_vec());
    }
}
