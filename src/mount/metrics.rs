//! Exporting a mount's counters to Prometheus for its lifetime: the `--metrics-file` rewritten
//! every few seconds, atomically, for node_exporter's textfile collector, and the opt-in
//! `--metrics-addr` listener ([`crate::mount::metrics_http`]); the labels that name the mount.
//! The text itself is [`crate::stats::prometheus`]'s.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use log::{info, warn};

use crate::mount::metrics_http;
use crate::stats::{prometheus, Stats};
use crate::util::{describe_io, lock, wait_while};

/// How often the metrics file is rewritten (a scrape every 15 s or more sees each mount's counters
/// at most this old).
pub const WRITE_INTERVAL: Duration = Duration::from_secs(5);

/// The labels every sample carries, as (name, value).
pub type Labels = Vec<(String, String)>;

/// The labels of a mount: where it is, and its source as mount(8) lists it (a URL without
/// userinfo or query, see `source::http::display_name`; fusermount's `stfs#` prefix dropped).
pub fn labels(mountpoint: &Path, source: &str) -> Labels {
    let source = source.strip_prefix("stfs#").unwrap_or(source);
    vec![("mountpoint".into(), mountpoint.display().to_string()), ("source".into(), source.to_string())]
}

/// The text of `stats` now, labelled.
pub fn render(stats: &Stats, labels: &Labels) -> String {
    let pairs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    prometheus::render(&stats.to_json(), &pairs)
}

/// Why the mount's metrics cannot be exported as asked.
#[derive(Debug)]
pub enum MetricsError {
    /// The metrics file cannot be written where it was asked for.
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// `--metrics-addr` is not a loopback address.
    NotLoopback(SocketAddr),
    /// The listener cannot be bound.
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: io::Error,
    },
}

impl fmt::Display for MetricsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsError::File { path, error } => {
                write!(f, "{}: cannot write the metrics file there: {}", path.display(), describe_io(error))
            }
            MetricsError::NotLoopback(addr) => write!(
                f,
                "--metrics-addr {addr}: not a loopback address; stfs serves /metrics on 127.0.0.1 or [::1] only \
                 (for other hosts, use --metrics-file with node_exporter's textfile collector)"
            ),
            MetricsError::Bind { addr, error } => {
                write!(f, "--metrics-addr {addr}: cannot listen there: {}", describe_io(error))
            }
        }
    }
}

impl std::error::Error for MetricsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MetricsError::File { error, .. } | MetricsError::Bind { error, .. } => Some(error),
            MetricsError::NotLoopback(_) => None,
        }
    }
}

/// Where the metrics go, checked (and the listener bound) before the daemon forks, so a bad path
/// or a taken port fails `stfs mount` in one line and nothing is mounted.
#[derive(Debug, Default)]
pub struct MetricsTargets {
    file: Option<PathBuf>,
    listener: Option<TcpListener>,
}

impl MetricsTargets {
    /// Checks that `file` can be written (a file created and removed beside it) and binds `addr`
    /// (loopback only).
    pub fn prepare(file: Option<&Path>, addr: Option<SocketAddr>) -> Result<MetricsTargets, MetricsError> {
        let mut targets = MetricsTargets::default();
        if let Some(path) = file {
            let fail = |error| MetricsError::File { path: path.to_path_buf(), error };
            if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
                return Err(fail(io::Error::from_raw_os_error(libc::EISDIR)));
            }
            let (dir, name) = split(path).map_err(fail)?;
            let probe = temp_name(&dir, &name);
            create_exclusive(&probe).map_err(fail)?;
            let _ = fs::remove_file(&probe);
            targets.file = Some(path.to_path_buf());
        }
        if let Some(addr) = addr {
            if !addr.ip().is_loopback() {
                return Err(MetricsError::NotLoopback(addr));
            }
            let listener = TcpListener::bind(addr).map_err(|error| MetricsError::Bind { addr, error })?;
            targets.listener = Some(listener);
        }
        Ok(targets)
    }

    /// Whether there is anything to export.
    pub fn is_empty(&self) -> bool {
        self.file.is_none() && self.listener.is_none()
    }
}

/// The directory and file name of `path`.
fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name.to_string()))
}

/// The temporary file beside `name`: hidden and not `*.prom`, so the textfile collector never reads
/// a half-written one; the process id keeps two daemons' apart.
fn temp_name(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.{}.tmp", std::process::id()))
}

/// Creates `path` exclusively, never through a symbolic link, readable by all (the collector may
/// run as another user; the counters hold no secret).
fn create_exclusive(path: &Path) -> io::Result<fs::File> {
    OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Replaces `path` with `text` atomically: written to a new file beside it, then renamed over it
/// (a reader sees the old file or the new one, never a part). A temporary left by a killed daemon
/// with this one's process id is removed (unlinking follows no link) and created anew.
pub fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let (dir, name) = split(path)?;
    let temp = temp_name(&dir, &name);
    let mut file = match create_exclusive(&temp) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(&temp)?;
            create_exclusive(&temp)?
        }
        other => other?,
    };
    let written = file.write_all(text.as_bytes()).and_then(|()| fs::rename(&temp, path));
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Stop flag and its condition variable, shared with the exporter's threads.
type StopSignal = Arc<(Mutex<bool>, Condvar)>;

/// The running exporter; dropping it stops its threads and removes the metrics file (a file left
/// behind would show an unmounted mount's last counters as if it were alive).
pub struct Exporter {
    stop: StopSignal,
    threads: Vec<JoinHandle<()>>,
    file: Option<PathBuf>,
    addr: Option<SocketAddr>,
}

impl Exporter {
    /// Starts the threads `targets` need, rendering `stats` with `labels`; call after forking.
    pub fn start(stats: Arc<Stats>, labels: Labels, targets: MetricsTargets) -> io::Result<Exporter> {
        let stop: StopSignal = Arc::new((Mutex::new(false), Condvar::new()));
        let mut exporter = Exporter { stop: stop.clone(), threads: Vec::new(), file: None, addr: None };
        let labels = Arc::new(labels);
        if let Some(path) = targets.file {
            let (stats, labels, stop, at) = (stats.clone(), labels.clone(), stop.clone(), path.clone());
            let writer = std::thread::Builder::new()
                .name("metrics-file".into())
                .spawn(move || write_periodically(&at, &stats, &labels, &stop))?;
            exporter.threads.push(writer);
            exporter.file = Some(path);
        }
        if let Some(listener) = targets.listener {
            exporter.addr = listener.local_addr().ok();
            let stop = stop.clone();
            let http = std::thread::Builder::new()
                .name("metrics-http".into())
                .spawn(move || metrics_http::serve(listener, &|| render(&stats, &labels), &|| *lock(&stop.0)))?;
            exporter.threads.push(http);
        }
        Ok(exporter)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        *lock(&self.stop.0) = true;
        self.stop.1.notify_all();
        if let Some(addr) = self.addr {
            // Wakes the listener from accept(2) so it sees the flag.
            let _ = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1));
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        if let Some(path) = &self.file {
            let _ = fs::remove_file(path);
        }
    }
}

/// Rewrites `path` every [`WRITE_INTERVAL`] until stopped; a failure is logged once, and again
/// only after a write succeeded in between.
fn write_periodically(path: &Path, stats: &Stats, labels: &Labels, stop: &StopSignal) {
    let mut failing = false;
    loop {
        match write_atomically(path, &render(stats, labels)) {
            Ok(()) if failing => {
                info!("{}: the metrics file is written again", path.display());
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                warn!("{}: cannot write the metrics file: {}", path.display(), describe_io(&e));
                failing = true;
            }
            Err(_) => {}
        }
        let stopped = wait_while(&stop.1, lock(&stop.0), WRITE_INTERVAL, |stopped| !*stopped);
        if *stopped {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_file_is_replaced_whole_and_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stfs.prom");
        write_atomically(&path, "a 1\n").unwrap();
        write_atomically(&path, "a 2\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a 2\n");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777 & !0o022, 0o644 & !0o022);
        // Nothing else is left in the directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        // A link planted at the temporary name is removed, not followed.
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, temp_name(dir.path(), "stfs.prom")).unwrap();
        write_atomically(&path, "a 3\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(fs::read_to_string(&path).unwrap(), "a 3\n");
    }

    #[test]
    fn bad_targets_are_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/stfs.prom");
        let e = MetricsTargets::prepare(Some(&missing), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{}: cannot write the metrics file there: no such file or directory", missing.display())
        );
        let e = MetricsTargets::prepare(Some(dir.path()), None).unwrap_err();
        assert!(e.to_string().ends_with("is a directory"), "{e}");
        let e = MetricsTargets::prepare(None, Some("0.0.0.0:9400".parse().unwrap())).unwrap_err();
        assert!(e.to_string().starts_with("--metrics-addr 0.0.0.0:9400: not a loopback address"), "{e}");
        assert!(!e.to_string().contains('\n'));
        // A good file is only probed: nothing is left before the exporter starts.
        let good = dir.path().join("stfs.prom");
        let targets = MetricsTargets::prepare(Some(&good), Some("127.0.0.1:0".parse().unwrap())).unwrap();
        assert!(!targets.is_empty());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_exporter_writes_at_once_and_removes_the_file_when_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stfs.prom");
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.fuse_reads, 42);
        let targets = MetricsTargets::prepare(Some(&path), None).unwrap();
        let exporter = Exporter::start(stats, labels(Path::new("/mnt/m"), "stfs#/m.safetensors"), targets).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("stfs_fuse_reads_total{mountpoint=\"/mnt/m\",source=\"/m.safetensors\"} 42\n"), "{text}");
        let started = std::time::Instant::now();
        drop(exporter);
        assert!(started.elapsed() < Duration::from_secs(2), "stopping waited for the interval");
        assert!(!path.exists());
    }

    #[test]
    fn the_listener_serves_the_labelled_counters_until_the_exporter_stops() {
        use std::io::Read;
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.cache_hits, 5);
        let targets = MetricsTargets::prepare(None, Some("127.0.0.1:0".parse().unwrap())).unwrap();
        let addr = targets.listener.as_ref().unwrap().local_addr().unwrap();
        let exporter = Exporter::start(stats, labels(Path::new("/m"), "src"), targets).unwrap();
        let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(reply.contains("stfs_cache_hits_total{mountpoint=\"/m\",source=\"src\"} 5\n"), "{reply}");
        let started = std::time::Instant::now();
        drop(exporter);
        assert!(started.elapsed() < Duration::from_secs(3), "stopping took {:?}", started.elapsed());
        assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "still listening");
    }
}
