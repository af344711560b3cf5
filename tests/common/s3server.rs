//! The S3 side of the `s3://` tests: a real `s3s-fs` on loopback checking every SigV4 signature,
//! an optional gate in front of it that answers some requests as AWS S3 does where s3s-fs cannot
//! (an expired session token, access denied, a bucket in another region), and the helpers that run
//! stfs with a clean AWS environment and mount, refuse or read through it.
#![allow(dead_code)] // each test file uses part of it

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;
use crate::tinyhttp::{Request, Response, TinyHttp};
use stfs::format::Dtype;

pub const ACCESS_KEY: &str = "AKIASTFSTESTKEY00001";
pub const SECRET_KEY: &str = "stfs-test-secret/very+secret0000000000";
pub const BUCKET: &str = "models";

/// A running `s3s-fs` serving `root` (one directory per bucket); killed on drop.
pub struct S3Server {
    child: Child,
    root: tempfile::TempDir,
    pub port: u16,
}

impl S3Server {
    pub fn start() -> Option<S3Server> {
        let binary = find_s3s_fs()?;
        let root = workdir();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        let server = S3Server { child, root, port };
        assert!(
            wait_until(Duration::from_secs(10), || TcpStream::connect(("127.0.0.1", port)).is_ok()),
            "s3s-fs did not listen"
        );
        Some(server)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn object(&self, key: &str) -> PathBuf {
        self.root.path().join(BUCKET).join(key)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_s3s_fs() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let candidates = [home.join(".cargo/bin/s3s-fs"), PathBuf::from("/usr/local/bin/s3s-fs")];
    if let Some(found) = candidates.into_iter().find(|p| p.is_file()) {
        return Some(found);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("s3s-fs")).find(|p| p.is_file())
}

macro_rules! s3_or_skip {
    () => {
        match S3Server::start() {
            Some(server) => server,
            None => return tool_missing("s3s-fs", "cargo install s3s-fs@0.14.1 --features binary --locked"),
        }
    };
}

/// A gate in front of s3s-fs: `answer` may answer a request itself (as S3 would), else the
/// request goes on to s3s-fs unchanged (its `Host` too, so the signature still holds).
pub struct S3Gate {
    server: TinyHttp,
}

impl S3Gate {
    pub fn start(s3_port: u16, answer: impl Fn(&Request) -> Option<Response> + Send + Sync + 'static) -> S3Gate {
        let server = TinyHttp::start(move |request| answer(request).unwrap_or_else(|| forward(s3_port, request)));
        S3Gate { server }
    }

    pub fn endpoint(&self) -> String {
        self.server.url()
    }
}

/// Sends `request` to 127.0.0.1:`port` as HTTP/1.0 (the answer ends with the connection).
pub fn forward(port: u16, request: &Request) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to s3s-fs");
    let mut head = format!("{} {} HTTP/1.0\r\n", request.method, request.target);
    for (name, value) in &request.headers {
        if name != "connection" {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&request.body)).expect("forward");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("s3s-fs answer");
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP answer");
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap();
    let mut response = Response::new(status, answer[split + 4..].to_vec());
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if !["content-length", "connection", "transfer-encoding"]
                .contains(&name.trim().to_ascii_lowercase().as_str())
            {
                response = response.header(name.trim(), value.trim());
            }
        }
    }
    response
}

/// An S3 error document, as AWS S3 sends it.
pub fn s3_error(status: u16, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message>\
         <RequestId>STFSTEST</RequestId></Error>"
    );
    Response::new(status, body).header("Content-Type", "application/xml")
}

/// The region a SigV4 `Authorization` header's credential scope names.
pub fn signed_region(request: &Request) -> Option<String> {
    let auth = request.headers.get("authorization")?;
    let scope = auth.split("Credential=").nth(1)?.split(',').next()?;
    scope.split('/').nth(2).map(str::to_string)
}

/// The environment of every stfs run here: no AWS settings (nor `RUST_LOG`) inherited, an empty
/// home (no ~/.aws), no instance metadata unless a test serves one, then `vars`.
pub fn command(args: &[&str], home: &Path, vars: &[(&str, String)]) -> Command {
    let mut command = Command::new(STFS);
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command.env("HOME", home).env("AWS_EC2_METADATA_DISABLED", "true").env("AWS_REGION", "us-east-1");
    // An empty value removes the variable (`("AWS_REGION", "")`: no region from the environment).
    for (name, value) in vars {
        if value.is_empty() {
            command.env_remove(name);
        } else {
            command.env(name, value);
        }
    }
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

pub fn run(args: &[&str], home: &Path, vars: &[(&str, String)]) -> Output {
    wait_output(command(args, home, vars).spawn().unwrap(), TIMEOUT)
}

pub fn env_keys(endpoint: &str, secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
    ]
}

/// A mount of `url` with `vars`, unmounted on drop.
pub struct S3Mount {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl S3Mount {
    pub fn new(url: &str, home: &Path, vars: &[(&str, String)]) -> S3Mount {
        let (dir, path) = S3Mount::point();
        let out = run(&["mount", "--block-size", "64K", url, path.to_str().unwrap()], home, vars);
        let mount = S3Mount { _dir: dir, path };
        assert!(out.status.success(), "stfs mount failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(is_mounted(&mount.path));
        mount
    }

    /// A fresh mount point in its own temp dir.
    pub fn point() -> (tempfile::TempDir, PathBuf) {
        let dir = workdir();
        let path = dir.path().join("m");
        std::fs::create_dir(&path).unwrap();
        (dir, path)
    }

    /// A guard for a mount made by the caller on `path`.
    pub fn adopt(dir: tempfile::TempDir, path: PathBuf) -> S3Mount {
        S3Mount { _dir: dir, path }
    }

    pub fn tensor(&self, name: &str) -> PathBuf {
        self.path.join(stfs::tree::names::escape(name, stfs::tree::namespace::RESERVED))
    }
}

impl Drop for S3Mount {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

pub fn fixture() -> Vec<T> {
    let mut tensors = mixed_tensors();
    for i in 0..4 {
        tensors.push(T::new(&format!("big.{i}.weight"), Dtype::F32, &[200 + i, 1000]));
    }
    tensors
}

pub fn assert_all_exact(m: &S3Mount, tensors: &[T]) {
    for t in tensors {
        let got = std::fs::read(m.tensor(&t.name)).unwrap();
        assert!(got == t.data, "{} differs", t.name);
    }
}

/// Asserts a refused mount: exit 1, one line naming the object and holding `needle`, nothing
/// mounted, none of `secrets` shown. Returns the line.
pub fn assert_refused_hiding(
    url: &str,
    home: &Path,
    vars: &[(&str, String)],
    needle: &str,
    secrets: &[&str],
) -> String {
    let dir = workdir();
    let out = run(&["mount", url, dir.path().to_str().unwrap()], home, vars);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    println!("refused: {}", err.trim_end());
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with(&format!("stfs: {url}: ")) && err.contains(needle), "{err}");
    assert_eq!(err.matches(url).count(), 1, "the object is named once: {err}");
    for secret in [SECRET_KEY].iter().chain(secrets) {
        assert!(!err.contains(secret), "{err}");
    }
    assert!(!is_mounted(dir.path()));
    err
}

/// [`assert_refused_hiding`] with only the secret key to hide.
pub fn assert_refused(url: &str, home: &Path, vars: &[(&str, String)], needle: &str) -> String {
    assert_refused_hiding(url, home, vars, needle, &[])
}

/// `secs` since the epoch as RFC 3339 (`2024-01-01T00:00:00Z`).
pub fn rfc3339(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Seconds since the epoch now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}
