//! `s3://` end to end against a real S3 implementation that checks SigV4 signatures (`s3s-fs`, run on
//! loopback with `--access-key`/`--secret-key`): every tensor byte-exact, credentials from the
//! environment, a profile file and an instance-metadata endpoint (IMDSv2, served by the test), a
//! sharded checkpoint by prefix, clear refusals, an object replaced while mounted giving EIO, and
//! the requests a fresh mount makes before its first small tensors are read (one).
//! Skips when `s3s-fs` is missing (fails under `CI=true`).

mod common;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;
#[macro_use]
#[path = "common/s3server.rs"]
mod s3server;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use s3server::*;
use stfs::format::Dtype;
use tinyhttp::{Request, Response, TinyHttp};

#[test]
fn env_credentials_read_every_tensor_byte_exact_and_nothing_leaks() {
    let server = s3_or_skip!();
    let home = workdir();
    let tensors = fixture();
    std::fs::create_dir(server.object("dir")).unwrap();
    write_checkpoint(&server.object("dir/model.safetensors"), &tensors, None);
    let url = format!("s3://{BUCKET}/dir/model.safetensors");
    let vars = env_keys(&server.endpoint(), SECRET_KEY);
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
    assert_refused(&url, home.path(), &env_keys(&server.endpoint(), "not-the-secret"), "signature does not match");
    let good = env_keys(&server.endpoint(), SECRET_KEY);
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
    let m = S3Mount::new(&url, home.path(), &env_keys(&server.endpoint(), SECRET_KEY));
    assert_all_exact(&m, &all);
}

#[test]
fn an_object_replaced_while_mounted_gives_eio() {
    let server = s3_or_skip!();
    let home = workdir();
    let tensors = fixture();
    write_checkpoint(&server.object("m.safetensors"), &tensors, None);
    let m =
        S3Mount::new(&format!("s3://{BUCKET}/m.safetensors"), home.path(), &env_keys(&server.endpoint(), SECRET_KEY));
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

#[test]
fn a_fresh_mount_serves_its_first_small_tensors_from_its_one_opening_request() {
    let server = s3_or_skip!();
    let home = workdir();
    // Three 4 KiB norms, then a 2 MiB weight (file order is by name here: one dtype).
    let mut tensors: Vec<T> =
        ["a", "b", "c"].iter().map(|n| T::new(&format!("{n}.norm"), Dtype::F32, &[1024])).collect();
    tensors.push(T::new("z.weight", Dtype::F32, &[512, 1024]));
    write_checkpoint(&server.object("m.safetensors"), &tensors, None);
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let gate = S3Gate::start(server.port, move |_: &Request| {
        counted.fetch_add(1, Ordering::SeqCst);
        None
    });
    // At the defaults a user mounts with (4 MiB blocks for a URL).
    let (dir, path) = S3Mount::point();
    let url = format!("s3://{BUCKET}/m.safetensors");
    let out = run(&["mount", &url, path.to_str().unwrap()], home.path(), &env_keys(&gate.endpoint(), SECRET_KEY));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = S3Mount::adopt(dir, path);
    assert_eq!(requests.load(Ordering::SeqCst), 1, "the mount is ready after one request (the opening ranged GET)");
    for t in &tensors[..3] {
        assert!(std::fs::read(m.tensor(&t.name)).unwrap() == t.data, "{} differs", t.name);
    }
    assert_eq!(requests.load(Ordering::SeqCst), 1, "tensors inside the opening request's bytes cost no request");
    let stats = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(m.path.join(".stfs/stats.json")).unwrap()).unwrap()
    };
    let doc = stats();
    assert!(doc["opening_reads"].as_u64().unwrap() >= 3, "{doc}");
    assert_eq!(doc["opening_read_bytes"].as_u64(), Some(doc["fuse_read_bytes"].as_u64().unwrap()), "{doc}");
    assert_eq!(doc["backing_reads"].as_u64(), Some(0), "{doc}");
    // A tensor past them is read as ever: whole blocks, byte-exact.
    let big = &tensors[3];
    assert!(std::fs::read(m.tensor(&big.name)).unwrap() == big.data, "{} differs", big.name);
    let doc = stats();
    assert!(requests.load(Ordering::SeqCst) > 1 && doc["backing_reads"].as_u64().unwrap() > 0, "{doc}");
}
