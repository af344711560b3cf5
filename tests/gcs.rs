//! `gs://` end to end against a loopback server that answers as GCS's JSON API does (object
//! metadata with its generation, ranged media GETs with `x-goog-generation`, `ifGenerationMatch`
//! answered 412 once the object is replaced, 401 without the bearer token) and a loopback OAuth
//! token endpoint, reached through a service-account file (`GOOGLE_APPLICATION_CREDENTIALS`, its
//! `token_uri`) whose JWT `gcp_auth` signs with a key made by openssl. Skips without openssl (fails
//! under `CI=true`).

mod common;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use common::*;
use stfs::format::Dtype;
use tinyhttp::{parse_range, Response, TinyHttp};

const TOKEN: &str = "ya29.stfs-test-token";

/// The objects served: key -> (generation, bytes).
type Objects = Arc<Mutex<HashMap<String, (u64, Vec<u8>)>>>;

fn query(target: &str, name: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    query.split('&').find_map(|pair| pair.strip_prefix(&format!("{name}=")).map(str::to_string))
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn error(status: u16, message: &str) -> Response {
    Response::new(status, serde_json::json!({"error": {"code": status, "message": message}}).to_string())
}

/// The fake store and token endpoint on one port.
fn start_gcs(objects: Objects) -> TinyHttp {
    TinyHttp::start(move |request| {
        if request.method == "POST" && request.target == "/token" {
            let body = String::from_utf8_lossy(&request.body);
            if !body.contains("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer") {
                return error(400, "bad grant");
            }
            return Response::new(
                200,
                format!(r#"{{"access_token":"{TOKEN}","expires_in":3600,"token_type":"Bearer"}}"#),
            );
        }
        if request.headers.get("authorization").map(String::as_str) != Some(&format!("Bearer {TOKEN}")) {
            return error(401, "Anonymous caller does not have storage.objects.get access");
        }
        let path = request.target.split('?').next().unwrap();
        let Some(rest) = path.strip_prefix("/storage/v1/b/models/o/") else {
            return error(404, "The specified bucket does not exist.");
        };
        let key = decode(rest);
        let objects = objects.lock().unwrap();
        let Some((generation, bytes)) = objects.get(&key) else {
            return error(404, &format!("No such object: models/{key}"));
        };
        if query(&request.target, "alt").as_deref() != Some("media") {
            let meta = serde_json::json!({"generation": generation.to_string(), "size": bytes.len().to_string()});
            return Response::new(200, meta.to_string());
        }
        if let Some(wanted) = query(&request.target, "ifGenerationMatch") {
            if wanted != generation.to_string() {
                return error(412, "At least one of the pre-conditions you specified did not hold.");
            }
        }
        let Some((first, last)) = parse_range(request.headers.get("range"), bytes.len()) else {
            return Response::new(200, bytes.clone()).header("x-goog-generation", generation);
        };
        Response::new(206, bytes[first..=last].to_vec())
            .header("Content-Range", format!("bytes {first}-{last}/{}", bytes.len()))
            .header("x-goog-generation", generation)
            .header("ETag", format!("\"gen-{generation}\""))
    })
}

/// A service-account file whose key openssl makes, with its token_uri on the fake server.
fn service_account(dir: &Path, server: &TinyHttp) -> Option<PathBuf> {
    let key = dir.join("key.pem");
    let made = Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&key)
        .stderr(Stdio::null())
        .status();
    if !made.is_ok_and(|s| s.success()) {
        return None;
    }
    let account = serde_json::json!({
        "type": "service_account",
        "project_id": "stfs-test",
        "private_key_id": "1",
        "private_key": std::fs::read_to_string(&key).unwrap(),
        "client_email": "loader@stfs-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": format!("{}/token", server.url()),
    });
    let path = dir.join("sa.json");
    std::fs::write(&path, account.to_string()).unwrap();
    Some(path)
}

fn run(args: &[&str], home: &Path, vars: &[(&str, String)]) -> Output {
    let mut command = Command::new(STFS);
    for (name, _) in std::env::vars() {
        if name.starts_with("GOOGLE_") || name.starts_with("STORAGE_") || name.starts_with("GCE_") {
            command.env_remove(name);
        }
    }
    command.env("HOME", home).envs(vars.iter().map(|(k, v)| (k, v)));
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    wait_output(command.spawn().unwrap(), TIMEOUT)
}

#[test]
fn service_account_token_reads_every_tensor_and_a_replaced_object_gives_eio() {
    let objects: Objects = Arc::default();
    let server = start_gcs(Arc::clone(&objects));
    let home = workdir();
    let Some(account) = service_account(home.path(), &server) else {
        return tool_missing("openssl", "apt-get install openssl");
    };
    let mut tensors = mixed_tensors();
    tensors.push(T::new("big.weight", Dtype::F32, &[300, 1000]));
    let file = home.path().join("m.safetensors");
    let bytes = write_checkpoint(&file, &tensors, None);
    objects.lock().unwrap().insert("dir/m.safetensors".to_string(), (1_700_000_000_000_001, bytes.clone()));
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", account.display().to_string())];
    let endpoint = server.url();
    let url = "gs://models/dir/m.safetensors";

    let mp = workdir();
    let args = ["mount", "--block-size", "64K", "--endpoint-url", &endpoint, url, mp.path().to_str().unwrap()];
    let out = run(&args, home.path(), &vars);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result = std::panic::catch_unwind(|| {
        for t in &tensors {
            let path = mp.path().join(stfs::tree::names::escape(&t.name, stfs::tree::namespace::RESERVED));
            assert!(std::fs::read(&path).unwrap() == t.data, "{} differs", t.name);
        }
        let metadata = std::fs::read_to_string(mp.path().join("metadata.json")).unwrap();
        assert!(metadata.contains(url) && !metadata.contains(TOKEN));
        // Replaced (a new generation): the pinned one is refused with 412, so EIO.
        let big = tensors.last().unwrap();
        let path = mp.path().join("big.weight");
        let handle = std::fs::File::open(path).unwrap();
        let mut changed = bytes.clone();
        let end = changed.len();
        changed[end - 100_000..].iter_mut().for_each(|b| *b ^= 0xff);
        objects.lock().unwrap().insert("dir/m.safetensors".to_string(), (1_700_000_000_000_002, changed));
        let mut tail = vec![0; 1000];
        let error = handle.read_exact_at(&mut tail, big.data.len() as u64 - 1000);
        // The whole tensor was read above; a fresh range of it may still be in the page cache.
        if let Err(error) = error {
            assert_eq!(error.raw_os_error(), Some(libc::EIO));
        }
    });
    force_unmount(mp.path());
    result.unwrap();

    // Refusals: one line naming the object and the cause.
    let refused = |url: &str, vars: &[(&str, String)], extra: &[&str], needle: &str| {
        let dir = workdir();
        let mut args = vec!["mount", "--endpoint-url", &endpoint];
        args.extend_from_slice(extra);
        args.extend([url, dir.path().to_str().unwrap()]);
        let out = run(&args, home.path(), vars);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(url) && err.contains(needle) && !err.contains(TOKEN), "{err}");
        assert!(!is_mounted(dir.path()));
    };
    refused("gs://models/nope.safetensors", &vars, &[], "no such key");
    refused("gs://other/m.safetensors", &vars, &[], "no such bucket");
    refused(url, &vars, &["--no-sign-request"], "access denied");
}

#[test]
fn a_generation_replaced_between_reads_is_refused() {
    let objects: Objects = Arc::default();
    let server = start_gcs(Arc::clone(&objects));
    let home = workdir();
    let Some(account) = service_account(home.path(), &server) else {
        return tool_missing("openssl", "apt-get install openssl");
    };
    let mut tensors = mixed_tensors();
    tensors.push(T::new("big.weight", Dtype::F32, &[300, 1000]));
    let bytes = write_checkpoint(&home.path().join("m.safetensors"), &tensors, None);
    objects.lock().unwrap().insert("m.safetensors".to_string(), (7, bytes.clone()));
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", account.display().to_string())];
    let mp = workdir();
    let endpoint = server.url();
    let args = [
        "mount",
        "--block-size",
        "64K",
        "--endpoint-url",
        &endpoint,
        "gs://models/m.safetensors",
        mp.path().to_str().unwrap(),
    ];
    let out = run(&args, home.path(), &vars);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result = std::panic::catch_unwind(|| {
        let handle = std::fs::File::open(mp.path().join("big.weight")).unwrap();
        let mut head = vec![0; 1000];
        handle.read_exact_at(&mut head, 0).unwrap();
        objects.lock().unwrap().insert("m.safetensors".to_string(), (8, bytes.clone()));
        let mut tail = vec![0; 1000];
        let len = tensors.last().unwrap().data.len() as u64;
        let error = handle.read_exact_at(&mut tail, len - 1000).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    });
    force_unmount(mp.path());
    result.unwrap();
}

/// An endpoint that accepts the connection and never answers: the mount fails within `--timeout`,
/// in one line naming the object once.
#[test]
fn a_silent_endpoint_fails_the_mount_within_the_timeout() {
    let home = workdir();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let mp = workdir();
    let url = "gs://models/m.safetensors";
    let args = ["mount", "--timeout", "2s", "--no-sign-request", "--endpoint-url", &endpoint, url];
    let args = [&args[..], &[mp.path().to_str().unwrap()]].concat();
    let started = std::time::Instant::now();
    let out = run(&args, home.path(), &[]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < std::time::Duration::from_secs(12), "took {took:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with(&format!("stfs: {url}: timed out after 2 s")), "{err}");
    assert_eq!(err.matches(url).count(), 1, "{err}");
    assert!(!is_mounted(mp.path()));
    drop(silent);
}

/// Without credentials, or with a credentials file that cannot be used, the mount fails in one
/// line naming the object and, for each source tried, why it gave nothing; nothing is mounted.
/// (`gcloud` is kept off `PATH`; the metadata server's name does not resolve off Google Cloud.)
#[test]
fn missing_or_unusable_credentials_are_refused_in_one_line() {
    let server = start_gcs(Arc::default());
    let home = workdir();
    let url = "gs://models/m.safetensors";
    let endpoint = server.url();
    let refused = |home: &Path, vars: &[(&str, String)], needles: &[&str]| {
        let dir = workdir();
        let args = ["mount", "--endpoint-url", &endpoint, url, dir.path().to_str().unwrap()];
        let mut vars = vars.to_vec();
        vars.push(("PATH", "/nonexistent".to_string()));
        let out = run(&args, home, &vars);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("stfs: {url}: ")), "{err}");
        for needle in needles {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        assert!(!is_mounted(dir.path()));
        err
    };
    refused(
        home.path(),
        &[],
        &[
            "no Google credentials found (tried: GOOGLE_APPLICATION_CREDENTIALS, not set; ",
            "application_default_credentials.json: failed to open",
            "the metadata server metadata.google.internal: ",
            "gcloud auth print-access-token: ",
            "for a public object use --no-sign-request",
        ],
    );
    let missing = home.path().join("nope.json");
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", missing.display().to_string())];
    refused(
        home.path(),
        &vars,
        &[&format!("could not be loaded from {} (GOOGLE_APPLICATION_CREDENTIALS)", missing.display())],
    );
    let broken = home.path().join("broken.json");
    std::fs::write(&broken, r#"{"type": "service_account", "client_email": "x@y"}"#).unwrap();
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", broken.display().to_string())];
    refused(home.path(), &vars, &["broken.json (GOOGLE_APPLICATION_CREDENTIALS): ", "private_key"]);

    // The gcloud ADC file (authorized_user) is found under $HOME and its refresh token sent to
    // Google's token endpoint, which gcp_auth 0.12 hard-codes (https://accounts.google.com): off
    // line the refresh fails, and the line says so for that file, the refresh token not shown.
    let gcloud = home.path().join(".config/gcloud");
    std::fs::create_dir_all(&gcloud).unwrap();
    let adc = serde_json::json!({
        "type": "authorized_user",
        "client_id": "stfs-test.apps.googleusercontent.com",
        "client_secret": "stfs-client-secret",
        "refresh_token": "1//stfs-refresh-token",
    });
    std::fs::write(gcloud.join("application_default_credentials.json"), adc.to_string()).unwrap();
    let err = refused(home.path(), &[], &["application_default_credentials.json: "]);
    assert!(!err.contains("application_default_credentials.json: failed to open"), "{err}");
    assert!(!err.contains("stfs-refresh-token") && !err.contains("stfs-client-secret"), "{err}");
}
