//! `s3://` end to end against a real S3 implementation that checks SigV4 signatures (`s3s-fs`, run on
//! loopback with `--access-key`/`--secret-key`): every tensor byte-exact, credentials from the
//! environment, a profile file and an instance-metadata endpoint (IMDSv2, served by the test), a
//! sharded checkpoint by prefix, clear refusals, an object replaced while mounted giving EIO, and
//! the requests a fresh mount makes before its first small tensors are read (one); prefixes
//! (`s3://BUCKET/PREFIX/`) holding a diffusers pipeline and a sentence-transformers model mount as
//! they are laid out, each object read at the ETag it was listed with.
//! Skips when `s3s-fs` is missing (fails under `CI=true`).

mod common;
#[path = "common/repos.rs"]
mod repos;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;
#[macro_use]
#[path = "common/s3server.rs"]
mod s3server;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

/// Puts `objects` under `prefix` in the bucket (s3s-fs keeps each object as a file).
fn put_all(server: &S3Server, prefix: &str, objects: &[(String, Vec<u8>)]) {
    for (key, bytes) in objects {
        let path = server.object(&format!("{prefix}{key}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

#[test]
fn prefixes_mount_as_the_repositories_they_hold() {
    let server = s3_or_skip!();
    let home = workdir();
    let vars = env_keys(&server.endpoint(), SECRET_KEY);
    let (pipeline, st) = (repos::diffusers(), repos::sentence_transformers());
    put_all(&server, "sd/", &pipeline.objects);
    put_all(&server, "st/all-minilm/", &st.objects);
    put_all(&server, "configs/", &repos::configs_only());
    // Beside the prefix, not below it.
    put_all(&server, "sd-old/", &st.objects);

    let m = S3Mount::new(&format!("s3://{BUCKET}/sd/"), home.path(), &vars);
    repos::assert_mounted(&m.path, &pipeline);
    let unet: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.path.join("unet/metadata.json")).unwrap()).unwrap();
    assert_eq!(unet["shards"][0]["source"], format!("s3://{BUCKET}/sd/unet/diffusion_pytorch_model.safetensors"));
    drop(m);
    let m = S3Mount::new(&format!("s3://{BUCKET}/st/all-minilm/"), home.path(), &vars);
    repos::assert_mounted(&m.path, &st);
    drop(m);

    let nothing = "holds no *.safetensors files, in it or in its folders (looked 4 folders down)";
    assert_refused(&format!("s3://{BUCKET}/configs/"), home.path(), &vars, nothing);
    assert_refused(&format!("s3://{BUCKET}/none/"), home.path(), &vars, "no objects under this prefix");
    assert_refused("s3://no-bucket/sd/", home.path(), &vars, "no such bucket");
}

/// s3s-fs lists no ETag: a gate in front of it lists `"v1-KEY"` for each object and serves each
/// object with that ETag, answering 412 to another in `If-Match` (as S3 does), or, in a second
/// run, ignoring it. A listing whose ETags the objects no longer have (`"v0-KEY"`) is refused
/// in one line either way; a consistent one mounts, every object read with `If-Match` on its
/// listed ETag.
#[test]
fn a_prefix_is_read_at_the_etags_it_was_listed_with() {
    let server = s3_or_skip!();
    let home = workdir();
    let st = repos::sentence_transformers();
    put_all(&server, "st/", &st.objects);
    // 0: consistent; 1: the listing is stale and the store honours If-Match; 2: stale, ignored.
    let mode = Arc::new(AtomicU8::new(0));
    let (lists, if_match) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::<(String, String)>::new())));
    let (port, gate_mode, gate_lists, seen) =
        (server.port, Arc::clone(&mode), Arc::clone(&lists), Arc::clone(&if_match));
    let gate = S3Gate::start(server.port, move |request: &Request| {
        let mode = gate_mode.load(Ordering::SeqCst);
        let version = if mode == 0 { "v1" } else { "v0" };
        if request.target.contains("list-type=2") {
            gate_lists.fetch_add(1, Ordering::SeqCst);
            let mut answer = forward(port, request);
            let body = String::from_utf8(answer.body).unwrap();
            let mut listed = String::new();
            for (i, part) in body.split("</Key>").enumerate() {
                if i > 0 {
                    let key = listed.rsplit("<Key>").next().unwrap().to_string();
                    listed.push_str(&format!("</Key><ETag>&quot;{version}-{key}&quot;</ETag>"));
                }
                listed.push_str(part);
            }
            answer.body = listed.into_bytes();
            return Some(answer);
        }
        let key = request.target.split('?').next().unwrap().trim_start_matches(&format!("/{BUCKET}/")).to_string();
        let current = format!("\"v1-{key}\"");
        if let Some(wanted) = request.headers.get("if-match") {
            seen.lock().unwrap().push((key.clone(), wanted.clone()));
            if mode != 2 && *wanted != current {
                return Some(s3_error(
                    412,
                    "PreconditionFailed",
                    "At least one of the pre-conditions you specified did not hold",
                ));
            }
        }
        let mut answer = forward(port, request);
        answer.headers.retain(|(name, _)| !name.eq_ignore_ascii_case("etag"));
        Some(answer.header("ETag", current))
    });
    let vars = env_keys(&gate.endpoint(), SECRET_KEY);
    let url = format!("s3://{BUCKET}/st/");
    let m = S3Mount::new(&url, home.path(), &vars);
    repos::assert_mounted(&m.path, &st);
    drop(m);
    assert_eq!(lists.load(Ordering::SeqCst), 1, "the prefix is listed once");
    let seen = std::mem::take(&mut *if_match.lock().unwrap());
    for key in ["st/model.safetensors", "st/2_Dense/model.safetensors", "st/modules.json", "st/1_Pooling/config.json"] {
        let wanted = seen.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(wanted, Some(format!("\"v1-{key}\"").as_str()), "{key}: {seen:?}");
    }
    assert!(seen.iter().all(|(key, v)| *v == format!("\"v1-{key}\"")), "{seen:?}");
    // Refused in one line naming the object listed, nothing mounted.
    for stale in [1, 2] {
        mode.store(stale, Ordering::SeqCst);
        let dir = workdir();
        let out = run(&["mount", &url, dir.path().to_str().unwrap()], home.path(), &vars);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{err}");
        assert!(err.starts_with(&format!("stfs: {url}")) && err.contains("remote object changed"), "{err}");
        assert!(!is_mounted(dir.path()));
    }
}
