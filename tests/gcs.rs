//! `gs://` end to end against a loopback server that answers as GCS's JSON API does (object
//! metadata with its generation, ranged media GETs with `x-goog-generation`, `ifGenerationMatch`
//! answered 412 once the object is replaced, 401 without the bearer token) and a loopback OAuth
//! token endpoint, reached through a service-account file (`GOOGLE_APPLICATION_CREDENTIALS`, its
//! `token_uri`) whose JWT `gcp_auth` signs with a key made by openssl, or through the GCE metadata
//! server, served on port 80 inside private network, mount and PID namespaces where `/etc/hosts`
//! names it loopback. Prefixes (`gs://BUCKET/PREFIX/`, listed a few objects a page) holding a
//! diffusers pipeline and a sentence-transformers model mount as they are laid out. Skips without
//! openssl or unshare (fails under `CI=true`), and without root.

#[path = "common/certs.rs"]
mod certs;
mod common;
#[path = "common/netns.rs"]
mod netns;
#[path = "common/nginx.rs"]
mod nginx;
#[path = "common/repos.rs"]
mod repos;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;

use std::collections::HashMap;
use std::ffi::CString;
use std::net::ToSocketAddrs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Bearer tokens: those the store accepts (every one issued), and those it was sent, in order.
#[derive(Clone, Default)]
struct Tokens {
    issued: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<Vec<String>>>,
}

/// The fake store and token endpoint on one port.
fn start_gcs(objects: Objects) -> TinyHttp {
    let tokens = Tokens::default();
    tokens.issued.lock().unwrap().push(TOKEN.to_string());
    start_gcs_accepting(objects, tokens)
}

/// The fake store accepting the tokens in `tokens.issued` (and answering `/token` with [`TOKEN`]).
fn start_gcs_accepting(objects: Objects, tokens: Tokens) -> TinyHttp {
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
        let bearer = request.headers.get("authorization").and_then(|v| v.strip_prefix("Bearer "));
        if let Some(token) = bearer {
            tokens.seen.lock().unwrap().push(token.to_string());
        }
        if !bearer.is_some_and(|token| tokens.issued.lock().unwrap().iter().any(|t| t == token)) {
            return error(401, "Anonymous caller does not have storage.objects.get access");
        }
        let path = request.target.split('?').next().unwrap();
        if path == "/storage/v1/b/models/o" {
            return list(&objects, &request.target);
        }
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

/// Objects per page of a listing: small, so a listing takes several.
const PAGE: usize = 2;

/// The JSON API's objects list: the objects under `prefix`, in name order, [`PAGE`] a page, the
/// page token the offset of the next.
fn list(objects: &Objects, target: &str) -> Response {
    let prefix = query(target, "prefix").map(|p| decode(&p)).unwrap_or_default();
    let from: usize = query(target, "pageToken").map_or(0, |t| t.parse().unwrap());
    let objects = objects.lock().unwrap();
    let mut names: Vec<&String> = objects.keys().filter(|k| k.starts_with(&prefix)).collect();
    names.sort();
    let items: Vec<serde_json::Value> = names
        .iter()
        .skip(from)
        .take(PAGE)
        .map(|name| {
            let (generation, bytes) = &objects[*name];
            serde_json::json!({"name": name, "size": bytes.len().to_string(), "generation": generation.to_string()})
        })
        .collect();
    let mut page = serde_json::json!({"kind": "storage#objects", "items": items});
    if from + PAGE < names.len() {
        page["nextPageToken"] = (from + PAGE).to_string().into();
    }
    Response::new(200, page.to_string())
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

/// An HTTPS endpoint whose certificate a test CA signed, trusted the way every request of stfs
/// trusts its roots (the platform's store, here `SSL_CERT_FILE`): the metadata request that pins
/// the generation goes through the same agent as the reads (its roots, proxy and timeouts), so
/// the mount succeeds and every tensor reads. (Before it had an agent of its own, with ureq's
/// bundled roots: "invalid peer certificate: UnknownIssuer".)
#[test]
fn the_metadata_request_trusts_the_same_roots_as_the_reads() {
    let objects: Objects = Arc::default();
    let server = start_gcs(Arc::clone(&objects));
    let home = workdir();
    let Some(account) = service_account(home.path(), &server) else {
        return tool_missing("openssl", "apt-get install openssl");
    };
    let certificates = workdir();
    assert!(certs::make_certificates(certificates.path(), "IP:127.0.0.1"), "openssl made no certificate");
    let tls = (certificates.path().join("leaf.pem"), certificates.path().join("leaf.key"));
    let listen = format!("127.0.0.1:{}", nginx::free_port());
    let Some(front) = nginx::Nginx::start_tls_proxy(&listen, (&tls.0, &tls.1), &server.url()) else {
        return tool_missing("nginx", "apt-get install nginx");
    };
    let tensors = store_fixture(&objects, 1_700_000_000_000_003);
    let vars = [
        ("GOOGLE_APPLICATION_CREDENTIALS", account.display().to_string()),
        ("SSL_CERT_FILE", certificates.path().join("ca.pem").display().to_string()),
    ];
    let endpoint = format!("https://{listen}");
    let url = "gs://models/dir/m.safetensors";
    let mp = workdir();
    let args = ["mount", "--timeout", "10s", "--endpoint-url", &endpoint, url, mp.path().to_str().unwrap()];
    let out = run(&args, home.path(), &vars);
    let _guard = Unmount(mp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for t in &tensors {
        let path = mp.path().join(stfs::tree::names::escape(&t.name, stfs::tree::namespace::RESERVED));
        assert!(std::fs::read(&path).unwrap() == t.data, "{} differs", t.name);
    }
    drop(front);
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

/// Set, to the outer test's namespaces, in the child that runs [`metadata_server_inside_namespaces`].
const INSIDE: &str = "STFS_GCS_METADATA_OUTSIDE_NS";
/// Printed by that child at its end, so that a child that ran no test is not taken for a pass.
const FINISHED: &str = "stfs-gcs-metadata: finished inside the namespaces";
/// The metadata server's tokens live 303 s: 3 s after one is issued it is within the 5 minutes
/// before expiry in which stfs fetches a new one.
const TOKEN_LIFE: u64 = 303;

/// Credentials from the GCE metadata server, which `gcp_auth` always asks at
/// `http://metadata.google.internal/` (port 80; `GCE_METADATA_HOST` is not read). The test runs in
/// private network, mount and PID namespaces (`unshare`): there `/etc/hosts` maps that name to
/// loopback and the test serves port 80. Killing `unshare` (on a timeout) kills its child, the PID
/// namespace's first process, and with it everything in the namespace, the daemon included.
#[test]
fn metadata_server_token_reads_every_tensor() {
    netns::run_in_namespaces("metadata_server_inside_namespaces", INSIDE, FINISHED);
}

/// Set, to the outer test's namespaces, in the child that runs [`gcloud_adc_inside_namespaces`].
const ADC_INSIDE: &str = "STFS_GCS_ADC_OUTSIDE_NS";
/// Printed by that child at its end.
const ADC_FINISHED: &str = "stfs-gcs-adc: finished inside the namespaces";

/// The gcloud ADC file (`gcloud auth application-default login`: an `authorized_user` with a
/// refresh token), whose token endpoint `gcp_auth` 0.12 hard-codes as
/// `https://accounts.google.com/o/oauth2/token`. The test runs in private network, mount and PID
/// namespaces: there `/etc/hosts` maps that name to loopback, nginx terminates TLS on port 443
/// with a certificate for it from a test CA (trusted through `SSL_CERT_FILE`, which the native
/// roots honour) and hands the requests to the test's token endpoint.
#[test]
fn gcloud_user_credentials_are_refreshed_at_the_token_endpoint() {
    netns::run_in_namespaces("gcloud_adc_inside_namespaces", ADC_INSIDE, ADC_FINISHED);
}

/// Run by [`gcloud_user_credentials_are_refreshed_at_the_token_endpoint`] as the first process
/// of its namespaces.
#[test]
#[ignore = "run by gcloud_user_credentials_are_refreshed_at_the_token_endpoint inside its namespaces"]
fn gcloud_adc_inside_namespaces() {
    // Never touch the machine's /etc/hosts or port 443: only in new namespaces.
    let Some(()) = netns::inside(ADC_INSIDE) else { return };
    if nginx::find_nginx().is_none() {
        return tool_missing("nginx", "apt-get install nginx");
    }
    if nginx::find_program("openssl").is_none() {
        return tool_missing("openssl", "apt-get install openssl");
    }
    let etc = workdir();
    let hosts = etc.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost accounts.google.com\n::1 localhost\n").unwrap();
    bind_over(&hosts, Path::new("/etc/hosts"));
    let certificates = workdir();
    assert!(certs::make_certificates(certificates.path(), "DNS:accounts.google.com"), "openssl failed");

    // Google's token endpoint for a refresh token: a new access token, living TOKEN_LIFE, per call.
    let tokens = Tokens::default();
    let issued = Arc::clone(&tokens.issued);
    let refused_grants = Arc::new(AtomicUsize::new(0));
    let refusals = Arc::clone(&refused_grants);
    let endpoint = TinyHttp::start(move |request| {
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let grant = (body["grant_type"].as_str(), body["refresh_token"].as_str(), body["client_secret"].as_str());
        if request.method != "POST"
            || request.target != "/o/oauth2/token"
            || grant != (Some("refresh_token"), Some("1//stfs-refresh-token"), Some("stfs-client-secret"))
        {
            refusals.fetch_add(1, Ordering::SeqCst);
            return Response::new(400, r#"{"error":"invalid_grant","error_description":"Bad Request"}"#);
        }
        let mut issued = issued.lock().unwrap();
        let token = format!("ya29.user-{}", issued.len() + 1);
        issued.push(token.clone());
        let body = serde_json::json!({"access_token": token, "expires_in": TOKEN_LIFE, "token_type": "Bearer",
                                      "scope": "https://www.googleapis.com/auth/cloud-platform"});
        Response::new(200, body.to_string()).header("Content-Type", "application/json")
    });
    let tls = (certificates.path().join("leaf.pem"), certificates.path().join("leaf.key"));
    let front =
        nginx::Nginx::start_tls_proxy("127.0.0.1:443", (&tls.0, &tls.1), &endpoint.url()).expect("nginx is installed");

    let objects: Objects = Arc::default();
    let server = start_gcs_accepting(Arc::clone(&objects), tokens.clone());
    let home = workdir();
    let gcloud = home.path().join(".config/gcloud");
    std::fs::create_dir_all(&gcloud).unwrap();
    let adc = serde_json::json!({
        "type": "authorized_user",
        "client_id": "stfs-test.apps.googleusercontent.com",
        "client_secret": "stfs-client-secret",
        "refresh_token": "1//stfs-refresh-token",
    });
    std::fs::write(gcloud.join("application_default_credentials.json"), adc.to_string()).unwrap();
    let tensors = store_fixture(&objects, 1_700_000_000_000_002);
    let url = "gs://models/dir/m.safetensors";
    let trust = [("SSL_CERT_FILE", certificates.path().join("ca.pem").display().to_string())];

    let secrets = ["stfs-refresh-token"];
    read_across_a_token_refresh(home.path(), url, &server.url(), &trust, &tensors, &tokens, &secrets);
    assert_eq!(refused_grants.load(Ordering::SeqCst), 0, "the token endpoint refused a request");

    // A refresh token the endpoint refuses: one line naming the object and the file, the token
    // not shown.
    let revoked = serde_json::json!({
        "type": "authorized_user",
        "client_id": "stfs-test.apps.googleusercontent.com",
        "client_secret": "stfs-client-secret",
        "refresh_token": "1//stfs-revoked-token",
    });
    std::fs::write(gcloud.join("application_default_credentials.json"), revoked.to_string()).unwrap();
    let dir = workdir();
    let args = ["mount", "--endpoint-url", &server.url(), url, dir.path().to_str().unwrap()];
    let out = run(&args, home.path(), &trust);
    let _guard = Unmount(dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("stfs: {url}: ")), "{err}");
    assert!(!err.contains("stfs-revoked-token") && !err.contains("stfs-client-secret"), "{err}");
    assert!(refused_grants.load(Ordering::SeqCst) > 0, "the token endpoint was not asked");
    drop(front);
    wait_alone();
    println!("{ADC_FINISHED}");
}

/// What the loopback metadata server was asked, and whether it has a service account to issue for.
#[derive(Default)]
struct MetadataLog {
    token_requests: AtomicUsize,
    project_requests: AtomicUsize,
    /// Requests refused: without `Metadata-Flavor: Google`, or for another path.
    refused: Mutex<Vec<String>>,
    no_account: AtomicBool,
}

/// A metadata server on 127.0.0.1:80 answering as GCE's does: `Metadata-Flavor: Google` required
/// (403 without, or with `X-Forwarded-For`) and echoed; the default service account's token (a new
/// one each time, added to `issued`), or 404 when no account is attached; the project id.
fn start_metadata_server(issued: Arc<Mutex<Vec<String>>>, log: Arc<MetadataLog>) -> TinyHttp {
    TinyHttp::start_at("127.0.0.1:80", move |request| {
        let flavored = request.headers.get("metadata-flavor").map(String::as_str) == Some("Google");
        if !flavored || request.headers.contains_key("x-forwarded-for") {
            log.refused.lock().unwrap().push(request.target.clone());
            return Response::new(403, "Missing required header \"Metadata-Flavor\"")
                .header("Metadata-Flavor", "Google");
        }
        let path = request.target.split('?').next().unwrap();
        let response = match (request.method.as_str(), path) {
            ("GET", "/computeMetadata/v1/instance/service-accounts/default/token") => {
                log.token_requests.fetch_add(1, Ordering::SeqCst);
                if log.no_account.load(Ordering::SeqCst) {
                    Response::new(404, "Not Found")
                } else {
                    let mut issued = issued.lock().unwrap();
                    let token = format!("ya29.metadata-{}", issued.len() + 1);
                    issued.push(token.clone());
                    let body =
                        serde_json::json!({"access_token": token, "expires_in": TOKEN_LIFE, "token_type": "Bearer"});
                    Response::new(200, body.to_string()).header("Content-Type", "application/json")
                }
            }
            ("GET", "/computeMetadata/v1/project/project-id") => {
                log.project_requests.fetch_add(1, Ordering::SeqCst);
                Response::new(200, "stfs-test").header("Content-Type", "application/text")
            }
            _ => {
                log.refused.lock().unwrap().push(request.target.clone());
                Response::new(404, "Not Found")
            }
        };
        response.header("Metadata-Flavor", "Google")
    })
}

/// Bind-mounts `file` over `target` (in this private mount namespace only).
fn bind_over(file: &Path, target: &Path) {
    let (source, target_c) = (path_c(file), path_c(target));
    // SAFETY: two valid C strings for the duration of the call; null type and data for a bind mount.
    let rc =
        unsafe { libc::mount(source.as_ptr(), target_c.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    assert_eq!(rc, 0, "bind {} over {}: {}", file.display(), target.display(), std::io::Error::last_os_error());
}

fn path_c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// The mixed tensors and one of 1.2 MB (last), stored in `objects` as `dir/m.safetensors` at
/// `generation`.
fn store_fixture(objects: &Objects, generation: u64) -> Vec<T> {
    let dir = workdir();
    let mut tensors = mixed_tensors();
    tensors.push(T::new("big.weight", Dtype::F32, &[300, 1000]));
    let bytes = write_checkpoint(&dir.path().join("m.safetensors"), &tensors, None);
    objects.lock().unwrap().insert("dir/m.safetensors".to_string(), (generation, bytes));
    tensors
}

/// Mounts `url` from `endpoint` (64 KiB blocks, `vars` set, `home` as HOME), then, 11 s after the
/// mount started (the first token lives [`TOKEN_LIFE`], so it is then within the 5 minutes before
/// expiry in which the daemon fetches a new one, off the read path), reads the end of the last
/// tensor, and every tensor once a new token is in. Checks
/// the bytes, that the store got only tokens `tokens` issued, the first and a refreshed one among
/// them, and that neither a token nor any of `secrets` shows in `metadata.json` or the mount
/// table. Unmounts, and returns the tokens the store saw.
fn read_across_a_token_refresh(
    home: &Path,
    url: &str,
    endpoint: &str,
    vars: &[(&str, String)],
    tensors: &[T],
    tokens: &Tokens,
    secrets: &[&str],
) -> Vec<String> {
    let mp = workdir();
    let log_path = home.join("stfs-refresh.log");
    let log = log_path.to_str().unwrap();
    // A block cache smaller than the object, so that blocks read after the refresh come from the store.
    let args = ["mount", "--block-size", "64K", "--cache-size", "256K", "--log-file", log, "--endpoint-url", endpoint];
    let args = [&args[..], &[url, mp.path().to_str().unwrap()]].concat();
    let out = run(&args, home, vars);
    let guard = Unmount(mp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(mp.path()));
    // After the mount returned, so after its fetch of the first token began, however long the
    // mount took (counted from before it, a mount of more than a second on a loaded machine left
    // the read below inside stfs's 10 s pause, and no refresh followed).
    let mounted = Instant::now();
    let first = tokens.issued.lock().unwrap().first().cloned().expect("no token was issued at the mount");
    let file = |t: &T| mp.path().join(stfs::tree::names::escape(&t.name, stfs::tree::namespace::RESERVED));
    let (big, small) = tensors.split_last().unwrap();
    assert!(tokens.seen.lock().unwrap().contains(&first), "the store never saw the first token");
    // 11 s: within the 5 minutes before expiry, and past the 10 s stfs leaves between two fetches
    // (the first token was fetched as the mount opened the object).
    std::thread::sleep(Duration::from_secs(11).saturating_sub(mounted.elapsed()));
    // This read, with the current token (still valid), starts the refresh, which runs off the read
    // path: the read does not wait for it, and later reads from the store carry the new token.
    let tail = big.data.len() as u64 - 1000;
    std::fs::File::open(file(big)).unwrap().read_exact_at(&mut [0; 1000], tail).unwrap();
    let refreshed = wait_until(TIMEOUT, || tokens.issued.lock().unwrap().len() >= 2);
    assert!(refreshed, "no new token was fetched: {:?}", tokens.issued.lock().unwrap());
    // Once the daemon has the new token, the next block read from the store carries it: read one
    // block of the tensor every 250 ms from its start until the store sees it.
    let handle = std::fs::File::open(file(big)).unwrap();
    let mut offsets = (0..tail).step_by(64 * 1024);
    let reached = wait_until(TIMEOUT, || {
        if tokens.seen.lock().unwrap().iter().any(|t| t != &first) {
            return true;
        }
        if let Some(offset) = offsets.next() {
            handle.read_exact_at(&mut [0; 100], offset).unwrap();
        }
        std::thread::sleep(Duration::from_millis(250));
        false
    });
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        reached,
        "no refreshed token reached the store: {:?}; issued {:?}; log: {log}",
        tokens.seen.lock().unwrap(),
        tokens.issued.lock().unwrap()
    );
    for t in small.iter().chain([big]) {
        assert!(std::fs::read(file(t)).unwrap() == t.data, "{} differs", t.name);
    }
    let seen = tokens.seen.lock().unwrap().clone();
    let issued = tokens.issued.lock().unwrap().clone();
    assert!(seen.iter().all(|t| issued.contains(t)), "the store was sent a token not issued: {seen:?}");
    assert!(seen.iter().any(|t| t != &first), "no refreshed token reached the store: {seen:?}");
    let metadata = std::fs::read_to_string(mp.path().join("metadata.json")).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(metadata.contains(url));
    for secret in secrets.iter().chain(&["ya29."]) {
        assert!(!metadata.contains(secret) && !mounts.contains(secret), "{secret} shown");
    }
    drop(guard);
    assert!(!is_mounted(mp.path()));
    seen
}

/// Unmounts on drop, whatever happened.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        force_unmount(self.0);
    }
}

/// Waits (bounded) until this process, the PID namespace's first, is the only one left in it,
/// reaping the daemons it inherited; panics naming what is still there.
fn wait_alone() {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        // SAFETY: waitpid with WNOHANG on any child; no Command child of this process is running.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        let others: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.bytes().all(|b| b.is_ascii_digit()) && name != "1")
            .map(|pid| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default().replace('\0', " "))
            .collect();
        if others.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still running after the unmount: {others:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run by [`metadata_server_token_reads_every_tensor`] as the first process of its namespaces.
#[test]
#[ignore = "run by metadata_server_token_reads_every_tensor inside its namespaces"]
fn metadata_server_inside_namespaces() {
    // Never touch the machine's /etc/hosts or port 80: only in new namespaces.
    let Some(()) = netns::inside(INSIDE) else { return };
    let etc = workdir();
    let hosts = etc.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost metadata.google.internal metadata\n::1 localhost\n").unwrap();
    bind_over(&hosts, Path::new("/etc/hosts"));
    let resolved: Vec<_> = ("metadata.google.internal", 80).to_socket_addrs().unwrap().collect();
    assert!(!resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()), "{resolved:?}");

    let tokens = Tokens::default();
    let log = Arc::new(MetadataLog::default());
    let _metadata = start_metadata_server(Arc::clone(&tokens.issued), Arc::clone(&log));
    let objects: Objects = Arc::default();
    let server = start_gcs_accepting(Arc::clone(&objects), tokens.clone());
    // No GOOGLE_* variable and no ADC file under HOME: only the metadata server can give a token.
    let home = workdir();
    let tensors = store_fixture(&objects, 1_700_000_000_000_001);
    let url = "gs://models/dir/m.safetensors";
    let endpoint = server.url();

    let seen = read_across_a_token_refresh(home.path(), url, &endpoint, &[], &tensors, &tokens, &[]);
    assert!(log.refused.lock().unwrap().is_empty(), "refused: {:?}", log.refused.lock().unwrap());
    println!(
        "metadata server: {} token requests, {} project-id requests; the store saw {} requests with {} tokens",
        log.token_requests.load(Ordering::SeqCst),
        log.project_requests.load(Ordering::SeqCst),
        seen.len(),
        seen.iter().collect::<std::collections::HashSet<_>>().len()
    );
    wait_alone();

    // No service account attached (the token request answers 404): one line naming the server.
    log.no_account.store(true, Ordering::SeqCst);
    let asked = log.token_requests.load(Ordering::SeqCst);
    let dir = workdir();
    let args = ["mount", "--endpoint-url", &endpoint, url, dir.path().to_str().unwrap()];
    let out = run(&args, home.path(), &[("PATH", "/nonexistent".to_string())]);
    let _guard = Unmount(dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("stfs: {url}: no Google credentials found")), "{err}");
    assert!(err.contains("the metadata server metadata.google.internal: token request failed"), "{err}");
    assert!(log.token_requests.load(Ordering::SeqCst) > asked, "the metadata server was not asked");
    assert!(!is_mounted(dir.path()));
    wait_alone();
    println!("{FINISHED}");
}

/// Whether the stalling token endpoint holds its requests, and how many it held.
#[derive(Default)]
struct Stall {
    on: AtomicBool,
    held: AtomicUsize,
}

/// A service account's token endpoint (`POST /token`) issuing a new token living `life` seconds
/// at each call (added to `tokens.issued`, its time to `times`), that while `stall.on` is set
/// accepts each request and never answers it, as a wedged token service does (it lets go once
/// the stall ends, or after 20 s, with a 503).
fn start_stalling_token_endpoint(
    life: u64,
    tokens: Tokens,
    times: Arc<Mutex<Vec<Instant>>>,
    stall: Arc<Stall>,
) -> TinyHttp {
    TinyHttp::start(move |request| {
        if stall.on.load(Ordering::SeqCst) {
            stall.held.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(20);
            while stall.on.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            return error(503, "stalled");
        }
        if request.method != "POST" || request.target != "/token" {
            return error(404, "no such endpoint");
        }
        let mut issued = tokens.issued.lock().unwrap();
        let token = format!("ya29.stall-{}", issued.len() + 1);
        issued.push(token.clone());
        times.lock().unwrap().push(Instant::now());
        let body = serde_json::json!({"access_token": token, "expires_in": life, "token_type": "Bearer"});
        Response::new(200, body.to_string()).header("Content-Type", "application/json")
    })
}

/// A reader of [`read_parts`] stops after a pread this slow (so a test of a stall ends soon).
const GIVE_UP: Duration = Duration::from_secs(5);

/// Reads `data`, the file at `path`, in `parts` ranges at once, each on its own thread in 64 KiB
/// preads: per range, whether it read back exactly (or its first error), and its longest pread.
fn read_parts(path: &Path, data: &[u8], parts: usize) -> Vec<(std::io::Result<bool>, Duration)> {
    let share = data.len().div_ceil(parts);
    std::thread::scope(|scope| {
        let readers: Vec<_> = data
            .chunks(share)
            .enumerate()
            .map(|(i, expected)| {
                scope.spawn(move || {
                    let mut slowest = Duration::ZERO;
                    let file = match std::fs::File::open(path) {
                        Ok(file) => file,
                        Err(e) => return (Err(e), slowest),
                    };
                    let mut bytes = vec![0; expected.len()];
                    for (j, chunk) in bytes.chunks_mut(64 * 1024).enumerate() {
                        let started = Instant::now();
                        let read = file.read_exact_at(chunk, (i * share + j * 64 * 1024) as u64);
                        slowest = slowest.max(started.elapsed());
                        if let Err(e) = read {
                            return (Err(e), slowest);
                        }
                        if slowest > GIVE_UP {
                            return (Ok(false), slowest);
                        }
                    }
                    (Ok(bytes == expected), slowest)
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// Mounts `url` from `endpoint` in the background with `--timeout timeout` and `vars`, its log
/// in `log`; the caller unmounts.
fn mount_with_timeout(
    home: &Path,
    url: &str,
    endpoint: &str,
    vars: &[(&str, String)],
    timeout: &str,
    log: &Path,
    mp: &Path,
) {
    let args = ["mount", "--block-size", "64K", "--timeout", timeout, "--log-file", log.to_str().unwrap()];
    let args = [&args[..], &["--endpoint-url", endpoint, url, mp.to_str().unwrap()]].concat();
    let out = run(&args, home, vars);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A token within stfs's refresh margin (it expires in 2 minutes, and stfs fetches a new one once
/// less than 5 are left), then a token endpoint that accepts each request and never answers:
/// reads go on with the current token, none waiting on the endpoint, while the refresh waits
/// there off the read path.
#[test]
fn a_stalled_token_endpoint_holds_no_read_while_the_token_is_valid() {
    let objects: Objects = Arc::default();
    let tokens = Tokens::default();
    let server = start_gcs_accepting(Arc::clone(&objects), tokens.clone());
    let stall = Arc::new(Stall::default());
    let endpoint = start_stalling_token_endpoint(120, tokens.clone(), Arc::default(), Arc::clone(&stall));
    let home = workdir();
    let Some(account) = service_account(home.path(), &endpoint) else {
        return tool_missing("openssl", "apt-get install openssl");
    };
    let tensors = store_fixture(&objects, 1_700_000_000_000_003);
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", account.display().to_string())];
    let (mp, log) = (workdir(), home.path().join("stfs.log"));
    let mounted = Instant::now();
    mount_with_timeout(home.path(), "gs://models/dir/m.safetensors", &server.url(), &vars, "10s", &log, mp.path());
    let guard = Unmount(mp.path());
    stall.on.store(true, Ordering::SeqCst);
    // The reads come 11 s after the mount, past the 10 s stfs leaves between two fetches (the
    // first token was fetched as the mount opened the object).
    std::thread::sleep((mounted + Duration::from_secs(11)).saturating_duration_since(Instant::now()));
    let big = tensors.last().unwrap();
    let results = read_parts(&mp.path().join("big.weight"), &big.data, 4);
    // The refresh those reads started reaches the endpoint on its own thread, soon.
    let held = wait_until(TIMEOUT, || stall.held.load(Ordering::SeqCst) >= 1);
    stall.on.store(false, Ordering::SeqCst);
    drop(guard);
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    for (i, (result, slowest)) in results.into_iter().enumerate() {
        // Milliseconds from the loopback store; a read held by the refresh would wait its 10 s.
        assert!(slowest < Duration::from_millis(2500), "a read waited {slowest:?} on the stalled endpoint; log: {log}");
        let exact = result.unwrap_or_else(|e| panic!("reading part {i} failed: {e}; log: {log}"));
        assert!(exact, "part {i} differs");
    }
    assert!(held, "no refresh reached the token endpoint: {log}");
    assert!(!log.contains("ya29."), "the log shows a token: {log}");
}

/// An expired token and a token endpoint that accepts each request and never answers: every read
/// fails with EIO within `--timeout` (plus a margin), concurrent readers included, no request
/// reaches the store (the expired token is never sent), and the log says why without a token;
/// once the endpoint answers again, reads go on.
#[test]
fn an_expired_token_and_a_stalled_endpoint_fail_reads_within_the_timeout() {
    let objects: Objects = Arc::default();
    let tokens = Tokens::default();
    let server = start_gcs_accepting(Arc::clone(&objects), tokens.clone());
    let stall = Arc::new(Stall::default());
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let life = 8;
    let endpoint = start_stalling_token_endpoint(life, tokens.clone(), Arc::clone(&times), Arc::clone(&stall));
    let home = workdir();
    let Some(account) = service_account(home.path(), &endpoint) else {
        return tool_missing("openssl", "apt-get install openssl");
    };
    let tensors = store_fixture(&objects, 1_700_000_000_000_004);
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", account.display().to_string())];
    let (mp, log_path) = (workdir(), home.path().join("stfs.log"));
    mount_with_timeout(home.path(), "gs://models/dir/m.safetensors", &server.url(), &vars, "2s", &log_path, mp.path());
    let _guard = Unmount(mp.path());
    let file = |t: &T| mp.path().join(stfs::tree::names::escape(&t.name, stfs::tree::namespace::RESERVED));
    assert!(std::fs::read(file(&tensors[0])).unwrap() == tensors[0].data);
    // That read started a refresh (the token expires within 5 minutes): let it land first.
    std::thread::sleep(Duration::from_secs(1));
    stall.on.store(true, Ordering::SeqCst);
    let expiry = *times.lock().unwrap().last().unwrap() + Duration::from_secs(life);
    std::thread::sleep((expiry + Duration::from_millis(1500)).saturating_duration_since(Instant::now()));

    let seen = tokens.seen.lock().unwrap().len();
    let big = tensors.last().unwrap();
    let started = Instant::now();
    let results = read_parts(&file(big), &big.data, 4);
    let took = started.elapsed();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let bound = Duration::from_secs(2 + 3);
    for (i, (result, slowest)) in results.iter().enumerate() {
        let error = result.as_ref().err().unwrap_or_else(|| panic!("part {i} read with an expired token"));
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "part {i}: {error}");
        assert!(*slowest < bound, "a read of part {i} waited {slowest:?} (--timeout 2s); log: {log}");
    }
    assert!(took < 2 * bound, "the readers took {took:?} (--timeout 2s)");
    assert_eq!(tokens.seen.lock().unwrap().len(), seen, "a request reached the store with an expired token");
    assert!(stall.held.load(Ordering::SeqCst) >= 1, "the token endpoint was not asked: {log}");
    let said: Vec<&str> = log.lines().filter(|l| l.contains("Google credentials")).collect();
    assert!(said.iter().any(|l| l.contains("expired") && l.contains("2 s")), "no line says why: {log}");
    assert!(!log.contains("ya29."), "the log shows a token: {log}");

    // The endpoint answers again: soon a read fetches a new token (the fetch held when the stall
    // ends fails, and for a second after a failure reads fail at once), and every part reads.
    stall.on.store(false, Ordering::SeqCst);
    let mut last = Vec::new();
    let back = wait_until(TIMEOUT, || {
        last = read_parts(&file(big), &big.data, 4).into_iter().map(|(result, _)| result).collect();
        last.iter().all(|r| r.is_ok())
    });
    assert!(back, "reads still fail once the endpoint answers again: {last:?}");
    assert!(last.iter().all(|r| matches!(r, Ok(true))), "a part differs");
}

#[test]
fn prefixes_mount_as_the_repositories_they_hold() {
    let objects: Objects = Arc::default();
    let server = start_gcs(Arc::clone(&objects));
    let home = workdir();
    let Some(account) = service_account(home.path(), &server) else {
        return tool_missing("openssl", "apt-get install openssl");
    };
    let (pipeline, st) = (repos::diffusers(), repos::sentence_transformers());
    let all = [("sd/", &pipeline.objects), ("st/", &st.objects), ("configs/", &repos::configs_only())];
    for (i, (prefix, files)) in all.iter().enumerate() {
        for (j, (key, bytes)) in files.iter().enumerate() {
            let generation = 1_700_000_000_000_000 + 100 * i as u64 + j as u64;
            objects.lock().unwrap().insert(format!("{prefix}{key}"), (generation, bytes.clone()));
        }
    }
    let vars = [("GOOGLE_APPLICATION_CREDENTIALS", account.display().to_string())];
    let endpoint = server.url();
    for (url, repo) in [("gs://models/sd/", &pipeline), ("gs://models/st/", &st)] {
        let mp = workdir();
        let out = run(&["mount", "--endpoint-url", &endpoint, url, mp.path().to_str().unwrap()], home.path(), &vars);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let result = std::panic::catch_unwind(|| repos::assert_mounted(mp.path(), repo));
        force_unmount(mp.path());
        result.unwrap();
    }
    for (url, needle) in [
        ("gs://models/configs/", "holds no *.safetensors files, in it or in its folders (looked 4 folders down)"),
        ("gs://models/none/", "no objects under this prefix"),
        ("gs://other/sd/", "no such bucket"),
    ] {
        let dir = workdir();
        let out = run(&["mount", "--endpoint-url", &endpoint, url, dir.path().to_str().unwrap()], home.path(), &vars);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{err}");
        assert!(err.starts_with(&format!("stfs: {url}: ")) && err.contains(needle) && !err.contains(TOKEN), "{err}");
        assert!(!is_mounted(dir.path()));
    }
}
