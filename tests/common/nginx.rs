//! A throwaway nginx on a free loopback port serving one directory, with a parseable access log.
//!
//! The log line is `status|body_bytes_sent|range|request`, so a test can sum what the server really
//! sent (the transfer bound) and see which ranges were asked for. nginx writes each line when the
//! request ends (no log buffer is configured), so the log is current once a response has been read.

#![allow(dead_code)] // shared by several test binaries, each using part of it

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where a program is, if installed, looking in /usr/sbin and /sbin too (nginx lives there, often
/// not on a user's PATH).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Where nginx is, if installed.
pub fn find_nginx() -> Option<PathBuf> {
    find_program("nginx")
}

/// A free loopback port (bound then released; nginx binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One access-log line.
#[derive(Debug, Clone)]
pub struct LogLine {
    /// HTTP status sent.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// The Range header asked for, or "-".
    pub range: String,
    /// The request line ("GET /x HTTP/1.1").
    pub request: String,
}

/// A running nginx; killed when dropped, pass or fail.
pub struct Nginx {
    child: Child,
    /// The served directory: put files here.
    pub root: PathBuf,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    /// The HTTPS port, when started with a certificate.
    pub https_port: Option<u16>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts nginx serving a fresh empty directory; None when nginx is not installed.
    pub fn start() -> Option<Nginx> {
        Nginx::start_with_tls(None)
    }

    /// [`Nginx::start`], also serving the directory over HTTPS with `(certificate, key)` (PEM files).
    pub fn start_with_tls(tls: Option<(&Path, &Path)>) -> Option<Nginx> {
        Nginx::start_configured(tls, "", None)
    }

    /// [`Nginx::start`] with `directives` added to the plain-HTTP server block (`location`s,
    /// `default_type`, ...).
    pub fn start_with_directives(directives: &str) -> Option<Nginx> {
        Nginx::start_configured(None, directives, None)
    }

    /// [`Nginx::start`], also terminating TLS on `listen` (`127.0.0.1:443`) with `(certificate,
    /// key)` and passing every request on to `upstream` (`http://127.0.0.1:PORT`): an HTTPS front
    /// for a plain-HTTP test server, speaking HTTP/2 as well (a client may offer only `h2`; the
    /// `listen ... http2` form, which nginx 1.22 needs and later ones still take).
    pub fn start_tls_proxy(listen: &str, tls: (&Path, &Path), upstream: &str) -> Option<Nginx> {
        let (cert, key) = (tls.0.display(), tls.1.display());
        let server = format!(
            "server {{ listen {listen} ssl http2; ssl_certificate {cert}; ssl_certificate_key {key}; \
             location / {{ proxy_pass {upstream}; proxy_set_header Host $host; }} }}"
        );
        let nginx = Nginx::start_configured(None, "", Some(&server))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(listen).is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {listen}");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(nginx)
    }

    fn start_configured(tls: Option<(&Path, &Path)>, directives: &str, extra_server: Option<&str>) -> Option<Nginx> {
        let program = find_nginx()?;
        let dir = tempfile::Builder::new().prefix("stfs-nginx-").tempdir().unwrap();
        let d = dir.path().display();
        let root = dir.path().join("www");
        std::fs::create_dir(&root).unwrap();
        let log = dir.path().join("access.log");
        let port = free_port();
        let https_port = tls.map(|_| free_port());
        let tls_server = match (tls, https_port) {
            (Some((cert, key)), Some(p)) => format!(
                "server {{ listen 127.0.0.1:{p} ssl; ssl_certificate {}; ssl_certificate_key {}; root {d}/www; }}",
                cert.display(),
                key.display()
            ),
            _ => String::new(),
        } + extra_server.unwrap_or("");
        // master_process off: one process to kill. open_file_cache stays off (the default), so a file
        // swapped on disk is served (with its new ETag) from the very next request.
        let config = format!(
            "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log warn;
             events {{ worker_connections 256; }}
             http {{ log_format ranges '$status|$body_bytes_sent|$http_range|$request';
                    access_log {d}/access.log ranges;
                    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
                    uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
                    keepalive_requests 100000;
                    server {{ listen 127.0.0.1:{port}; root {d}/www; {directives} }}
                    {tls_server} }}"
        );
        std::fs::write(dir.path().join("nginx.conf"), config).unwrap();
        let child = Command::new(program)
            .args(["-e", "stderr", "-p"])
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start nginx");
        let nginx = Nginx { child, root, port, https_port, log, _dir: dir };
        for p in std::iter::once(port).chain(https_port) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while TcpStream::connect(("127.0.0.1", p)).is_err() {
                assert!(Instant::now() < deadline, "nginx did not listen on {p}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Some(nginx)
    }

    /// The URL of a served file.
    pub fn url(&self, file: &str) -> String {
        format!("http://127.0.0.1:{}/{file}", self.port)
    }

    /// Every access-log line so far.
    pub fn log(&self) -> Vec<LogLine> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let mut parts = line.splitn(4, '|');
                Some(LogLine {
                    status: parts.next()?.parse().ok()?,
                    bytes: parts.next()?.parse().ok()?,
                    range: parts.next()?.to_string(),
                    request: parts.next()?.to_string(),
                })
            })
            .collect()
    }

    /// Waits (bounded) until the log has stopped growing for `quiet`, so background readahead
    /// that was still in flight is counted; returns every line.
    pub fn settled_log(&self, quiet: Duration) -> Vec<LogLine> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = self.log().len();
        let mut since = Instant::now();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.log().len();
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= quiet {
                break;
            }
        }
        self.log()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces `path` by `bytes` atomically (write aside, rename), as a publisher would, with a modified
/// time `skew` away from the old one so nginx's ETag (mtime-size) changes even at the same size.
pub fn replace_file(path: &Path, bytes: &[u8], skew: Duration) {
    let old = std::fs::metadata(path).unwrap().modified().unwrap();
    let aside = path.with_extension("new");
    std::fs::write(&aside, bytes).unwrap();
    let file = std::fs::File::options().write(true).open(&aside).unwrap();
    file.set_modified(old + skew).unwrap();
    drop(file);
    std::fs::rename(&aside, path).unwrap();
}
