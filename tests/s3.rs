//! `s3://` end to end against a real S3 implementation that checks SigV4 signatures (`s3s-fs`, run on
//! loopback with `--access-key`/`--secret-key`): every tensor byte-exact, credentials from the
//! environment, a profile file and an instance-metadata endpoint (IMDSv2, served by the test), a
//! sharded checkpoint by prefix, clear refusals, and an object replaced while mounted giving EIO.
//! Skips when `s3s-fs` is missing (fails under `CI=true`).

mod common;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;

use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::*;
use stfs::format::Dtype;
use tinyhttp::{Response, TinyHttp};

const ACCESS_KEY: &str = "AKIASTFSTESTKEY00001";
const SECRET_KEY: &str = "stfs-test-secret/very+secret0000000000";
const BUCKET: &str = "models";

/// A running `s3s-fs` serving `root` (one directory per bucket); killed on drop.
struct S3Server {
    child: Child,
    root: tempfile::TempDir,
    port: u16,
}

impl S3Server {
    fn start() -> Option<S3Server> {
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

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn object(&self, key: &str) -> PathBuf {
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

/// The environment of every stfs run here: no AWS settings inherited, an empty home (no
/// ~/.aws), no instance metadata unless a test serves one, then `vars`.
fn command(args: &[&str], home: &Path, vars: &[(&str, String)]) -> Command {
    let mut command = Command::new(STFS);
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") {
            command.env_remove(name);
        }
    }
    command.env("HOME", home).env("AWS_EC2_METADATA_DISABLED", "true").env("AWS_REGION", "us-east-1");
    for (name, value) in vars {
        command.env(name, value);
    }
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn run(args: &[&str], home: &Path, vars: &[(&str, String)]) -> Output {
    wait_output(command(args, home, vars).spawn().unwrap(), TIMEOUT)
}

fn env_keys(server: &S3Server, secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
    ]
}

/// A mount of `url` with `vars`, unmounted on drop.
struct S3Mount {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl S3Mount {
    fn new(url: &str, home: &Path, vars: &[(&str, String)]) -> S3Mount {
        let dir = workdir();
        let path = dir.path().join("m");
        std::fs::create_dir(&path).unwrap();
        let out = run(&["mount", "--block-size", "64K", url, path.to_str().unwrap()], home, vars);
        let mount = S3Mount { _dir: dir, path };
        assert!(out.status.success(), "stfs mount failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(is_mounted(&mount.path));
        mount
    }

    fn tensor(&self, name: &str) -> PathBuf {
        self.path.join(stfs::tree::names::escape(name, stfs::tree::namespace::RESERVED))
    }
}

impl Drop for S3Mount {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

fn fixture() -> Vec<T> {
    let mut tensors = mixed_tensors();
    for i in 0..4 {
        tensors.push(T::new(&format!("big.{i}.weight"), Dtype::F32, &[200 + i, 1000]));
    }
    tensors
}

fn assert_all_exact(m: &S3Mount, tensors: &[T]) {
    for t in tensors {
        let got = std::fs::read(m.tensor(&t.name)).unwrap();
        assert!(got == t.data, "{} differs", t.name);
    }
}

/// Asserts a refused mount: exit 1, one line naming the object and holding `needle`, nothing mounted.
fn assert_refused(url: &str, home: &Path, vars: &[(&str, String)], needle: &str) {
    let dir = workdir();
    let out = run(&["mount", url, dir.path().to_str().unwrap()], home, vars);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with(&format!("stfs: {url}: ")) && err.contains(needle), "{err}");
    assert_eq!(err.matches(url).count(), 1, "the object is named once: {err}");
    assert!(!err.contains(SECRET_KEY), "{err}");
    assert!(!is_mounted(dir.path()));
}

#[test]
fn env_credentials_read_every_tensor_byte_exact_and_nothing_leaks() {
    let server = s3_or_skip!();
    let home = workdir();
    let tensors = fixture();
    std::fs::create_dir(server.object("dir")).unwrap();
    write_checkpoint(&server.object("dir/model.safetensors"), &tensors, None);
    let url = format!("s3://{BUCKET}/dir/model.safetensors");
    let vars = env_keys(&server, SECRET_KEY);
    let m = S3Mount::new(&url, home.path(), &vars);
    assert_all_exact(&m, &tensors);
    let metadata = std::fs::read_to_string(m.path.join("metadata.json")).unwrap();
    assert!(metadata.contains(&url) && !metadata.contains(SECRET_KEY) && !metadata.contains(ACCESS_KEY), "{metadata}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo.lines().find(|l| l.contains(m.path.to_str().unwrap())).unwrap().to_string();
    assert!(line.contains(&url) && !line.contains(SECRET_KEY), "{line}");
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(SECRET_KEY));

    let out = run(&["inspect", &url], home.path(), &vars);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("big.3.weight"));
    // A small tensor: the output goes through a pipe read only at the end.
    let q = tensors.iter().find(|t| t.name == "q").unwrap();
    let out = run(&["cat", &url, "q"], home.path(), &vars);
    assert!(out.status.success() && out.stdout == q.data, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn wrong_secret_and_missing_objects_are_refused_in_one_line() {
    let server = s3_or_skip!();
    let home = workdir();
    write_checkpoint(&server.object("m.safetensors"), &mixed_tensors(), None);
    let url = format!("s3://{BUCKET}/m.safetensors");
    assert_refused(&url, home.path(), &env_keys(&server, "not-the-secret"), "signature does not match");
    let good = env_keys(&server, SECRET_KEY);
    let missing = format!("s3://{BUCKET}/nope.safetensors");
    assert_refused(&missing, home.path(), &good, "no such key");
    // s3s-fs answers NoSuchKey for a missing bucket too (S3 says NoSuchBucket: the unit tests cover it).
    assert_refused("s3://no-bucket/m.safetensors", home.path(), &good, "HTTP 404");
    let none = [("AWS_ENDPOINT_URL", server.endpoint())];
    assert_refused(&url, home.path(), &none, "no AWS credentials found (tried: the environment");
    assert_refused("s4://b/m.safetensors", home.path(), &good, "unknown scheme s4://");
}

/// A store that accepts the connection and never answers: the mount fails within `--timeout`,
/// in one line naming the object once (no s3s-fs needed).
#[test]
fn a_silent_store_fails_the_mount_within_the_timeout() {
    let home = workdir();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let dir = workdir();
    let url = format!("s3://{BUCKET}/m.safetensors");
    let args = ["mount", &url, dir.path().to_str().unwrap(), "--timeout", "2s", "--no-sign-request"];
    let args = [&args[..], &["--region", "us-east-1", "--endpoint-url", &endpoint]].concat();
    let started = std::time::Instant::now();
    let out = run(&args, home.path(), &[]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < Duration::from_secs(12), "took {took:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with(&format!("stfs: {url}: timed out after 2 s")), "{err}");
    assert_eq!(err.matches(&url).count(), 1, "{err}");
    assert!(!is_mounted(dir.path()));
    drop(silent);
}

#[test]
fn profile_file_credentials() {
    let server = s3_or_skip!();
    let home = workdir();
    write_checkpoint(&server.object("m.safetensors"), &mixed_tensors(), None);
    let credentials = home.path().join("credentials");
    let text = format!("[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n[stfs]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n");
    std::fs::write(&credentials, text).unwrap();
    let config = home.path().join("config");
    std::fs::write(&config, format!("[profile stfs]\nregion = us-east-1\nendpoint_url = {}\n", server.endpoint()))
        .unwrap();
    let vars = [
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.display().to_string()),
        ("AWS_CONFIG_FILE", config.display().to_string()),
        ("AWS_PROFILE", "stfs".to_string()),
    ];
    let m = S3Mount::new(&format!("s3://{BUCKET}/m.safetensors"), home.path(), &vars);
    assert_all_exact(&m, &mixed_tensors());
}

/// `secs` since the epoch as RFC 3339 (`2024-01-01T00:00:00Z`).
fn rfc3339(secs: u64) -> String {
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

#[test]
fn instance_metadata_credentials_through_imdsv2_are_fetched_again_before_expiry() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let server = s3_or_skip!();
    let home = workdir();
    write_checkpoint(&server.object("m.safetensors"), &fixture(), None);
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&fetches);
    let imds = TinyHttp::start(move |request| {
        const TOKEN: &str = "imds-session-token";
        match (request.method.as_str(), request.target.as_str()) {
            ("PUT", "/latest/api/token") => {
                Response::new(200, TOKEN).header("x-aws-ec2-metadata-token-ttl-seconds", 21600)
            }
            _ if request.headers.get("x-aws-ec2-metadata-token").map(String::as_str) != Some(TOKEN) => {
                Response::new(401, "")
            }
            ("GET", "/latest/meta-data/iam/security-credentials/") => Response::new(200, "stfs-role"),
            ("GET", "/latest/meta-data/iam/security-credentials/stfs-role") => {
                counted.fetch_add(1, Ordering::SeqCst);
                // Expiring within the refresh margin: every signature fetches them again.
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
                let expires = rfc3339(now + 120);
                let body = format!(
                    r#"{{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"{ACCESS_KEY}","SecretAccessKey":"{SECRET_KEY}","Token":"session-token","Expiration":"{expires}","LastUpdated":"2024-01-01T00:00:00Z"}}"#
                );
                Response::new(200, body)
            }
            _ => Response::new(404, ""),
        }
    });
    let vars = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_EC2_METADATA_DISABLED", "false".to_string()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url()),
    ];
    let m = S3Mount::new(&format!("s3://{BUCKET}/m.safetensors"), home.path(), &vars);
    let at_mount = fetches.load(Ordering::SeqCst);
    // Fetches inside the margin are at least 10 s apart (the daemon inherits the mount's last one).
    std::thread::sleep(std::time::Duration::from_secs(11));
    assert_all_exact(&m, &fixture());
    // The daemon (forked after the first fetch) fetched them again on its own runtime.
    assert!(fetches.load(Ordering::SeqCst) > at_mount, "credentials were not fetched again");
}

#[test]
fn sharded_checkpoint_by_prefix() {
    let server = s3_or_skip!();
    let home = workdir();
    std::fs::create_dir(server.object("sharded")).unwrap();
    let mut weight_map = serde_json::Map::new();
    let mut all = Vec::new();
    for i in 0..3 {
        let file = format!("model-{:05}-of-00003.safetensors", i + 1);
        let tensors = vec![
            T::new(&format!("layer{i}.w"), Dtype::F32, &[64, 100 + i]),
            T::new(&format!("layer{i}.b"), Dtype::F16, &[7]),
        ];
        write_checkpoint(&server.object(&format!("sharded/{file}")), &tensors, None);
        for t in &tensors {
            weight_map.insert(t.name.clone(), file.clone().into());
        }
        all.extend(tensors);
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(server.object("sharded/model.safetensors.index.json"), index.to_string()).unwrap();
    let url = format!("s3://{BUCKET}/sharded/model.safetensors.index.json");
    let m = S3Mount::new(&url, home.path(), &env_keys(&server, SECRET_KEY));
    assert_all_exact(&m, &all);
}

#[test]
fn an_object_replaced_while_mounted_gives_eio() {
    let server = s3_or_skip!();
    let home = workdir();
    let tensors = fixture();
    write_checkpoint(&server.object("m.safetensors"), &tensors, None);
    let m = S3Mount::new(&format!("s3://{BUCKET}/m.safetensors"), home.path(), &env_keys(&server, SECRET_KEY));
    // Read before: the middle of another tensor (a read from a tensor's first byte would prefetch
    // the rest of it, and the kernel reads ahead inside a file, so the checked one stays untouched).
    let first = tensors.iter().find(|t| t.name == "big.0.weight").unwrap();
    let mut middle = vec![0; 1000];
    std::fs::File::open(m.tensor(&first.name)).unwrap().read_exact_at(&mut middle, 400_000).unwrap();
    assert_eq!(middle, first.data[400_000..401_000]);
    let big = tensors.last().unwrap();
    let file = std::fs::File::open(m.tensor(&big.name)).unwrap();
    // Same size, other bytes: only the version pin can tell.
    let mut replaced = std::fs::read(server.object("m.safetensors")).unwrap();
    let end = replaced.len();
    replaced[end - 300_000..].iter_mut().for_each(|b| *b ^= 0xff);
    std::fs::write(server.object("m.safetensors"), &replaced).unwrap();
    let mut tail = vec![0; 1000];
    let error = file.read_exact_at(&mut tail, big.data.len() as u64 - 1000).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
}
