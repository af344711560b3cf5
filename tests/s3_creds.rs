//! The rest of the AWS credential chain and the refusals, end to end against `s3s-fs` (checking
//! every SigV4 signature) with the chain's endpoints served on loopback by the test: web identity
//! (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`, STS's AssumeRoleWithWebIdentity reached through
//! `AWS_ENDPOINT_URL_STS`), ECS container credentials (`AWS_CONTAINER_CREDENTIALS_FULL_URI` with
//! an authorization token or token file, and `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` served on
//! 169.254.170.2 in private namespaces), short-lived credentials fetched again on a long-lived
//! mount (a gate in front of s3s-fs refuses an expired session token, as S3 does), no secret in
//! a trace log, and the refusals S3 gives that s3s-fs cannot (access denied, no such bucket, an
//! expired token, a bucket in another region), each one line naming the object.
//! Skips when `s3s-fs` is missing (fails under `CI=true`).

mod common;
#[path = "common/netns.rs"]
mod netns;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;
#[macro_use]
#[path = "common/s3server.rs"]
mod s3server;

use std::net::Ipv4Addr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use s3server::*;
use tinyhttp::{Request, Response, TinyHttp};

const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/stfs-loader";
const WEB_IDENTITY_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.stfs-web-identity-token.c2lnbmF0dXJl";
const CONTAINER_AUTH: &str = "stfs-container-authorization-0001";

/// The value of `name` in a form-encoded body.
fn form_value(body: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    text.split('&')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")).map(|v| v.replace("%3A", ":").replace("%2F", "/")))
}

/// STS answering AssumeRoleWithWebIdentity for `ROLE_ARN` and the token in the file, with the
/// test's keys and `session` as the session token; counts the calls.
fn start_sts(session: &'static str, calls: Arc<AtomicUsize>) -> TinyHttp {
    TinyHttp::start(move |request| {
        let action = form_value(&request.body, "Action");
        if request.method != "POST" || action.as_deref() != Some("AssumeRoleWithWebIdentity") {
            return sts_error(400, "InvalidAction", "only AssumeRoleWithWebIdentity here");
        }
        calls.fetch_add(1, Ordering::SeqCst);
        if form_value(&request.body, "RoleArn").as_deref() != Some(ROLE_ARN) {
            return sts_error(403, "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity");
        }
        if form_value(&request.body, "WebIdentityToken").as_deref() != Some(WEB_IDENTITY_TOKEN) {
            return sts_error(
                400,
                "InvalidIdentityToken",
                "Couldn't retrieve verification key from your identity provider",
            );
        }
        let body = format!(
            "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
             <AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{ACCESS_KEY}</AccessKeyId>\
             <SecretAccessKey>{SECRET_KEY}</SecretAccessKey><SessionToken>{session}</SessionToken>\
             <Expiration>{}</Expiration></Credentials><AssumedRoleUser>\
             <AssumedRoleId>AROASTFSTEST:loader</AssumedRoleId>\
             <Arn>arn:aws:sts::123456789012:assumed-role/stfs-loader/loader</Arn></AssumedRoleUser>\
             <SubjectFromWebIdentityToken>system:serviceaccount:ml:loader</SubjectFromWebIdentityToken>\
             </AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>\
             </AssumeRoleWithWebIdentityResponse>",
            rfc3339(now_secs() + 3600)
        );
        Response::new(200, body).header("Content-Type", "text/xml")
    })
}

fn sts_error(status: u16, code: &str, message: &str) -> Response {
    let body = format!(
        "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error><Type>Sender</Type>\
         <Code>{code}</Code><Message>{message}</Message></Error><RequestId>1</RequestId></ErrorResponse>"
    );
    Response::new(status, body).header("Content-Type", "text/xml")
}

#[test]
fn web_identity_credentials_from_sts_read_every_tensor() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let calls = Arc::new(AtomicUsize::new(0));
    let sts = start_sts("stfs-web-identity-session", Arc::clone(&calls));
    let token_file = home.path().join("token");
    std::fs::write(&token_file, WEB_IDENTITY_TOKEN).unwrap();
    let mut vars = vec![
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_ENDPOINT_URL_STS", sts.url()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.display().to_string()),
        ("AWS_ROLE_ARN", ROLE_ARN.to_string()),
        ("AWS_ROLE_SESSION_NAME", "loader".to_string()),
    ];
    let url = format!("s3://{BUCKET}/m.safetensors");
    let m = S3Mount::new(&url, home.path(), &vars);
    assert_all_exact(&m, &tensors);
    assert!(calls.load(Ordering::SeqCst) >= 1, "STS was not asked");
    drop(m);

    // A token STS refuses: one line naming the object and STS's cause, the token not shown.
    std::fs::write(&token_file, "eyJ.not-the-token.x").unwrap();
    let line = assert_refused_hiding(&url, home.path(), &vars, "InvalidIdentityToken", &["eyJ.not-the-token"]);
    assert!(line.contains("AWS credentials could not be loaded"), "{line}");
    // A token file that is not there.
    vars[2].1 = home.path().join("missing-token").display().to_string();
    assert_refused(&url, home.path(), &vars, "missing-token");
}

/// ECS's credentials endpoint: the test's keys for the right `Authorization`, a new session token
/// `tok-N` valid `lifetime` on each call (the issue times and expiries kept in `issued`).
fn start_container_endpoint(lifetime: Duration, issued: Arc<Mutex<Vec<(Instant, u64)>>>) -> TinyHttp {
    TinyHttp::start(move |request| container_answer(request, lifetime, &issued))
}

/// The container endpoint's answer to `request` (see [`start_container_endpoint`]).
fn container_answer(request: &Request, lifetime: Duration, issued: &Mutex<Vec<(Instant, u64)>>) -> Response {
    if request.headers.get("authorization").map(String::as_str) != Some(CONTAINER_AUTH) {
        return Response::new(401, r#"{"Message":"unauthorized"}"#);
    }
    if request.target != "/v2/credentials/stfs" {
        return Response::new(404, "");
    }
    let mut issued = issued.lock().unwrap();
    let expires = now_secs() + lifetime.as_secs();
    issued.push((Instant::now(), expires));
    let body = serde_json::json!({
        "AccessKeyId": ACCESS_KEY,
        "SecretAccessKey": SECRET_KEY,
        "Token": format!("tok-{}", issued.len()),
        "Expiration": rfc3339(expires),
        "RoleArn": ROLE_ARN,
    });
    Response::new(200, body.to_string()).header("Content-Type", "application/json")
}

#[test]
fn container_credentials_with_an_authorization_token_or_token_file() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let issued = Arc::new(Mutex::new(Vec::new()));
    let ecs = start_container_endpoint(Duration::from_secs(3600), Arc::clone(&issued));
    let url = format!("s3://{BUCKET}/m.safetensors");
    let full_uri = format!("{}/v2/credentials/stfs", ecs.url());
    let by_env = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", full_uri.clone()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", CONTAINER_AUTH.to_string()),
    ];
    let m = S3Mount::new(&url, home.path(), &by_env);
    assert_all_exact(&m, &tensors);
    drop(m);
    let token_file = home.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, CONTAINER_AUTH).unwrap();
    let by_file = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", full_uri.clone()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file.display().to_string()),
    ];
    let m = S3Mount::new(&url, home.path(), &by_file);
    assert_all_exact(&m, &tensors);
    drop(m);
    assert!(issued.lock().unwrap().len() >= 2, "the container endpoint was not asked by both mounts");

    // A wrong authorization token: refused in one line, the token not shown.
    let wrong = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", full_uri),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "stfs-wrong-container-token".to_string()),
    ];
    let line = assert_refused_hiding(&url, home.path(), &wrong, "AWS credentials could not be loaded", &["stfs-wrong"]);
    assert!(line.contains("401") || line.to_lowercase().contains("unauthorized"), "{line}");
}

/// Set, to the outer test's namespaces, in the child that runs
/// [`container_relative_uri_inside_namespaces`].
const ECS_INSIDE: &str = "STFS_ECS_RELATIVE_OUTSIDE_NS";
/// Printed by that child at its end, so that a child that ran no test is not taken for a pass.
const ECS_FINISHED: &str = "stfs-ecs-relative: finished inside the namespaces";
/// Where ECS (and the AWS SDK, which cannot be pointed elsewhere) serves task credentials.
const ECS_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 170, 2);

/// ECS task credentials named by `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`, which the SDK always
/// asks at `http://169.254.170.2` (port 80). The test runs in private network, mount and PID
/// namespaces, where loopback also has that address and the test serves port 80 on it.
#[test]
fn container_credentials_by_relative_uri_read_every_tensor() {
    netns::run_in_namespaces("container_relative_uri_inside_namespaces", ECS_INSIDE, ECS_FINISHED);
}

/// Run by [`container_credentials_by_relative_uri_read_every_tensor`] as the first process of its
/// namespaces.
#[test]
#[ignore = "run by container_credentials_by_relative_uri_read_every_tensor inside its namespaces"]
fn container_relative_uri_inside_namespaces() {
    // Never add an address to the machine's loopback: only in new namespaces.
    let Some(()) = netns::inside(ECS_INSIDE) else { return };
    netns::add_loopback_address(ECS_ADDRESS);
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    // No Authorization is needed on the relative path, as on ECS: the address is the proof.
    let _ecs = TinyHttp::start_at(&format!("{ECS_ADDRESS}:80"), move |request| {
        log.lock().unwrap().push(request.target.clone());
        if request.target != "/v2/credentials/task-7f3e" {
            return Response::new(404, r#"{"Message":"no such task"}"#);
        }
        let body = serde_json::json!({
            "AccessKeyId": ACCESS_KEY,
            "SecretAccessKey": SECRET_KEY,
            "Token": "ecs-task-session",
            "Expiration": rfc3339(now_secs() + 3600),
            "RoleArn": ROLE_ARN,
        });
        Response::new(200, body.to_string()).header("Content-Type", "application/json")
    });
    let url = format!("s3://{BUCKET}/m.safetensors");
    let mut vars = vec![
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/task-7f3e".to_string()),
    ];
    let m = S3Mount::new(&url, home.path(), &vars);
    assert_all_exact(&m, &tensors);
    drop(m);
    assert!(asked.lock().unwrap().iter().any(|t| t == "/v2/credentials/task-7f3e"), "{:?}", asked.lock().unwrap());
    // A task the endpoint does not know: one line naming the object and the cause.
    vars[1].1 = "/v2/credentials/task-gone".to_string();
    let line = assert_refused(&url, home.path(), &vars, "AWS credentials could not be loaded");
    assert!(line.contains("m.safetensors"), "{line}");
    println!("{ECS_FINISHED}");
}

/// A gate that lets a request through only while its session token (`tok-N`) is unexpired, as
/// S3 answers `ExpiredToken` otherwise; records which tokens it let through and when.
fn expiry_gate(
    s3_port: u16,
    issued: Arc<Mutex<Vec<(Instant, u64)>>>,
    accepted: Arc<Mutex<Vec<(usize, Instant)>>>,
) -> S3Gate {
    expiry_gate_counting(s3_port, issued, accepted, Arc::default())
}

/// [`expiry_gate`], counting in `expired` the requests it refused.
fn expiry_gate_counting(
    s3_port: u16,
    issued: Arc<Mutex<Vec<(Instant, u64)>>>,
    accepted: Arc<Mutex<Vec<(usize, Instant)>>>,
    expired: Arc<AtomicUsize>,
) -> S3Gate {
    S3Gate::start(s3_port, move |request: &Request| {
        let token = request.headers.get("x-amz-security-token")?;
        let index: usize = token.strip_prefix("tok-").and_then(|n| n.parse().ok()).unwrap_or(0);
        let expires = index.checked_sub(1).and_then(|i| issued.lock().unwrap().get(i).map(|(_, e)| *e));
        match expires {
            Some(expires) if now_secs() < expires => {
                accepted.lock().unwrap().push((index, Instant::now()));
                None
            }
            _ => {
                expired.fetch_add(1, Ordering::SeqCst);
                Some(s3_error(400, "ExpiredToken", "The provided token has expired."))
            }
        }
    })
}

#[test]
fn short_lived_credentials_are_fetched_again_and_never_used_expired_and_no_secret_is_logged() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let lifetime = Duration::from_secs(16);
    let issued = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let ecs = start_container_endpoint(lifetime, Arc::clone(&issued));
    let gate = expiry_gate(server.port, Arc::clone(&issued), Arc::clone(&accepted));
    let url = format!("s3://{BUCKET}/m.safetensors");
    let mut vars = container_vars(gate.endpoint(), &ecs);
    vars.push(("RUST_LOG", "trace".to_string()));
    // In the foreground with debug logging (-d), every line of the log kept in a file.
    let (dir, path) = S3Mount::point();
    let log_path = home.path().join("stfs.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command =
        command(&["mount", "-d", "--block-size", "64K", &url, path.to_str().unwrap()], home.path(), &vars);
    command.stdout(Stdio::null()).stderr(log);
    let mut child = command.spawn().unwrap();
    let m = S3Mount::adopt(dir, path);
    let mounted = wait_until(TIMEOUT, || is_mounted(&m.path) || child.try_wait().unwrap().is_some());
    assert!(mounted && is_mounted(&m.path), "not mounted: {}", std::fs::read_to_string(&log_path).unwrap());
    let first_expiry = issued.lock().unwrap()[0].0 + lifetime;

    // Read one tensor now, the others once the first credentials have expired: each is read
    // from the store for the first time then (nothing of it cached), signed with fresh ones.
    let (now, later) = tensors.split_at(1);
    assert_all_exact(&m, now);
    std::thread::sleep(first_expiry.saturating_duration_since(Instant::now()) + Duration::from_secs(2));
    assert_all_exact(&m, later);
    let fetched_after_expiry = issued.lock().unwrap().iter().filter(|(at, _)| *at > first_expiry).count();
    assert!(fetched_after_expiry >= 1, "no credentials fetched after the first ones expired: {:?}", issued.lock());
    let accepted_late = accepted.lock().unwrap().iter().any(|(_, at)| *at > first_expiry);
    assert!(accepted_late, "no read reached the store after the first credentials expired");

    // No secret in the mount's source name, metadata.json, the daemon's command line or the log.
    let secrets = [SECRET_KEY, CONTAINER_AUTH, "tok-1", "tok-2"];
    let metadata = std::fs::read_to_string(m.path.join("metadata.json")).unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo.lines().find(|l| l.contains(m.path.to_str().unwrap())).unwrap().to_string();
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap()).to_string();
    force_unmount(&m.path);
    let exited = wait_until(TIMEOUT, || child.try_wait().unwrap().is_some());
    if !exited {
        let _ = child.kill();
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(exited, "the foreground mount did not exit after the unmount: {log}");
    assert!(log.contains("fetching them again") && log.contains("mounted"), "not a debug log of the refresh: {log}");
    for secret in secrets {
        for (what, text) in [("metadata.json", &metadata), ("mountinfo", &line), ("cmdline", &cmdline), ("log", &log)] {
            let shown: Vec<&str> = text.lines().filter(|l| l.contains(secret)).take(3).collect();
            assert!(shown.is_empty(), "{what} shows {secret}: {shown:?}");
        }
    }
}

/// The refusals S3 gives and s3s-fs does not, answered by the gate in S3's words; the rest goes
/// on to s3s-fs.
#[test]
fn access_denied_no_bucket_expired_token_and_wrong_region_are_one_line_each() {
    let server = s3_or_skip!();
    let home = workdir();
    let tensors = fixture();
    std::fs::create_dir(server.object("eu")).unwrap();
    write_checkpoint(&server.object("eu/m.safetensors"), &tensors, None);
    write_checkpoint(&server.object("denied.safetensors"), &tensors, None);
    let regions_seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&regions_seen);
    let gate = S3Gate::start(server.port, move |request: &Request| {
        let path = request.target.split('?').next().unwrap_or_default();
        if request.headers.get("x-amz-security-token").map(String::as_str) == Some("stfs-expired-token") {
            return Some(s3_error(400, "ExpiredToken", "The provided token has expired."));
        }
        if path.starts_with("/gone/") {
            return Some(s3_error(404, "NoSuchBucket", "The specified bucket does not exist"));
        }
        if path == format!("/{BUCKET}/denied.safetensors") {
            return Some(s3_error(403, "AccessDenied", "Access Denied"));
        }
        if path.starts_with(&format!("/{BUCKET}/eu/")) {
            let region = signed_region(request).unwrap_or_default();
            seen.lock().unwrap().push(region.clone());
            if region != "eu-west-1" {
                let redirect = s3_error(
                    301,
                    "PermanentRedirect",
                    "The bucket you are attempting to access must be addressed using the specified endpoint.",
                );
                return Some(redirect.header("x-amz-bucket-region", "eu-west-1"));
            }
        }
        None
    });
    let keys = env_keys(&gate.endpoint(), SECRET_KEY);
    let object = |key: &str| format!("s3://{BUCKET}/{key}");
    assert_refused(&object("denied.safetensors"), home.path(), &keys, "access denied");
    assert_refused("s3://gone/m.safetensors", home.path(), &keys, "no such bucket");
    let mut expired = keys.clone();
    expired.push(("AWS_SESSION_TOKEN", "stfs-expired-token".to_string()));
    assert_refused_hiding(
        &object("m.safetensors"),
        home.path(),
        &expired,
        "the session token has expired",
        &["stfs-expired-token"],
    );

    // The region named (AWS_REGION=us-east-1) and wrong: refused, naming the bucket's.
    let line =
        assert_refused(&object("eu/m.safetensors"), home.path(), &keys, "wrong region: the bucket is in eu-west-1");
    assert!(line.contains("HTTP 301") && line.contains("(set AWS_REGION=eu-west-1)"), "{line}");
    // The region given with --region (which wins over AWS_REGION) and wrong: the line says to change it.
    let dir = workdir();
    let url = object("eu/m.safetensors");
    let out = run(&["mount", "--region", "us-west-2", &url, dir.path().to_str().unwrap()], home.path(), &keys);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("stfs: {url}: wrong region: the bucket is in eu-west-1 (use --region eu-west-1)")),
        "{err}"
    );
    assert!(!err.contains("AWS_REGION") && !is_mounted(dir.path()), "{err}");
    // No region named: the 301 is followed to eu-west-1, and every tensor reads.
    regions_seen.lock().unwrap().clear();
    let mut unnamed = keys.clone();
    unnamed.push(("AWS_REGION", String::new()));
    let m = S3Mount::new(&object("eu/m.safetensors"), home.path(), &unnamed);
    assert_all_exact(&m, &tensors);
    let seen = regions_seen.lock().unwrap().clone();
    assert_eq!(seen.first().map(String::as_str), Some("us-east-1"), "{seen:?}");
    assert!(seen[1..].iter().all(|r| r == "eu-west-1") && seen.len() > 1, "{seen:?}");
    // The followed region holds for reads after the mount too (a range far into the file).
    let big = tensors.last().unwrap();
    let mut tail = vec![0; 1000];
    std::fs::File::open(m.tensor(&big.name)).unwrap().read_exact_at(&mut tail, big.data.len() as u64 - 1000).unwrap();
    assert_eq!(tail, big.data[big.data.len() - 1000..]);
}

/// Whether the stalling credential endpoint holds its requests, and how many it held.
#[derive(Default)]
struct Stall {
    on: AtomicBool,
    held: AtomicUsize,
}

/// The endpoint of [`start_container_endpoint`] that, while `stall.on` is set, accepts each request
/// and never answers it, as a wedged credential service does (it lets go once the stall ends, or
/// after a minute, with a 503).
fn start_stalling_container_endpoint(
    lifetime: Duration,
    issued: Arc<Mutex<Vec<(Instant, u64)>>>,
    stall: Arc<Stall>,
) -> TinyHttp {
    TinyHttp::start(move |request| {
        if stall.on.load(Ordering::SeqCst) {
            stall.held.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(60);
            while stall.on.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Response::new(503, r#"{"Message":"stalled"}"#);
        }
        container_answer(request, lifetime, &issued)
    })
}

/// The environment of a mount whose store is `endpoint` and whose credentials come from the
/// container endpoint `ecs`, with its authorization token.
fn container_vars(endpoint: String, ecs: &TinyHttp) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("{}/v2/credentials/stfs", ecs.url())),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", CONTAINER_AUTH.to_string()),
    ]
}

/// A fresh home directory and `m.safetensors` (the S3 fixture) written to the server's bucket.
fn stored_model(server: &S3Server) -> (tempfile::TempDir, Vec<T>) {
    let home = workdir();
    let tensors = fixture();
    write_checkpoint(&server.object("m.safetensors"), &tensors, None);
    (home, tensors)
}

/// Sleeps until 1.5 s after the last credentials issued (kept as `(issued at, ...)`) expire.
fn sleep_past_expiry(issued: &Mutex<Vec<(Instant, u64)>>, lifetime: Duration) {
    let expiry = issued.lock().unwrap().last().unwrap().0 + lifetime;
    std::thread::sleep((expiry + Duration::from_millis(1500)).saturating_duration_since(Instant::now()));
}

/// Mounts `url` in the background with `--timeout timeout`, its log in `log`.
fn mount_with_timeout(url: &str, home: &Path, vars: &[(&str, String)], timeout: &str, log: &Path) -> S3Mount {
    let (dir, path) = S3Mount::point();
    let args = ["mount", "--block-size", "64K", "--timeout", timeout, "--log-file", log.to_str().unwrap(), url];
    let out = run(&[&args[..], &[path.to_str().unwrap()]].concat(), home, vars);
    let m = S3Mount::adopt(dir, path);
    assert!(out.status.success(), "stfs mount failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(&m.path));
    m
}

/// Reads each of `tensors` on a thread of its own at once, in 64 KiB preads: per tensor, its
/// bytes or the first error, and the longest single pread (the failing one included).
fn read_concurrently(m: &S3Mount, tensors: &[&T]) -> Vec<(std::io::Result<Vec<u8>>, Duration)> {
    std::thread::scope(|scope| {
        let readers: Vec<_> = tensors
            .iter()
            .map(|t| {
                let path = m.tensor(&t.name);
                let len = t.data.len();
                scope.spawn(move || {
                    let mut slowest = Duration::ZERO;
                    let file = match std::fs::File::open(&path) {
                        Ok(file) => file,
                        Err(e) => return (Err(e), slowest),
                    };
                    let mut bytes = vec![0; len];
                    for (i, chunk) in bytes.chunks_mut(64 * 1024).enumerate() {
                        let started = Instant::now();
                        let read = file.read_exact_at(chunk, i as u64 * 64 * 1024);
                        slowest = slowest.max(started.elapsed());
                        if let Err(e) = read {
                            return (Err(e), slowest);
                        }
                    }
                    (Ok(bytes), slowest)
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// Asserts that none of the secrets the container endpoint handed out shows in `log`.
fn assert_no_secret_in(log: &str) {
    for secret in [SECRET_KEY, CONTAINER_AUTH, "tok-1", "tok-2", "tok-3"] {
        let shown: Vec<&str> = log.lines().filter(|l| l.contains(secret)).take(3).collect();
        assert!(shown.is_empty(), "the log shows {secret}: {shown:?}");
    }
}

/// The longest a read may wait while valid credentials are at hand: a read of 64 KiB from the
/// loopback store takes milliseconds, a read held by the refresh would wait its `--timeout 10s`.
const READ_BOUND: Duration = Duration::from_millis(2500);

/// Credentials within stfs's refresh margin (they expire in 2 minutes, and stfs fetches new ones
/// once less than 5 are left), then a credential endpoint that accepts each request and never
/// answers: reads go on with the current credentials, none waiting on the endpoint, while the
/// refresh waits there off the read path. The reads come 11 s after the mount, past the 10 s
/// stfs leaves between two fetches of credentials that are still valid.
#[test]
fn a_stalled_credential_endpoint_holds_no_read_while_the_credentials_are_valid() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let issued = Arc::new(Mutex::new(Vec::new()));
    let stall = Arc::new(Stall::default());
    let ecs = start_stalling_container_endpoint(Duration::from_secs(120), Arc::clone(&issued), Arc::clone(&stall));
    let vars = container_vars(server.endpoint(), &ecs);
    let url = format!("s3://{BUCKET}/m.safetensors");
    let log_path = home.path().join("stfs.log");
    let mounted = Instant::now();
    let m = mount_with_timeout(&url, home.path(), &vars, "10s", &log_path);
    stall.on.store(true, Ordering::SeqCst);
    std::thread::sleep((mounted + Duration::from_secs(11)).saturating_duration_since(Instant::now()));
    let big: Vec<&T> = tensors.iter().filter(|t| t.name.starts_with("big.")).collect();
    let results = read_concurrently(&m, &big);
    // The refresh those reads started reaches the endpoint on its own thread, soon.
    let held = wait_until(TIMEOUT, || stall.held.load(Ordering::SeqCst) >= 1);
    stall.on.store(false, Ordering::SeqCst);
    drop(m);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    for (t, (result, slowest)) in big.iter().zip(results) {
        let got = result.unwrap_or_else(|e| panic!("reading {} failed: {e}; log: {log}", t.name));
        assert!(got == t.data, "{} differs", t.name);
        assert!(slowest < READ_BOUND, "a read of {} waited {slowest:?} on the stalled endpoint; log: {log}", t.name);
    }
    assert!(held, "no refresh reached the credential endpoint: {log}");
    assert_no_secret_in(&log);
}

/// Expired credentials and a credential endpoint that accepts each request and never answers:
/// every read fails with EIO within `--timeout` (plus a margin), concurrent readers included,
/// no request carries the expired credentials, and the log says why in words that show no
/// secret; once the endpoint answers again, reads go on.
#[test]
fn expired_credentials_and_a_stalled_endpoint_fail_reads_within_the_timeout() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let lifetime = Duration::from_secs(8);
    let issued = Arc::new(Mutex::new(Vec::new()));
    let (accepted, expired) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicUsize::new(0)));
    let stall = Arc::new(Stall::default());
    let ecs = start_stalling_container_endpoint(lifetime, Arc::clone(&issued), Arc::clone(&stall));
    let gate = expiry_gate_counting(server.port, Arc::clone(&issued), accepted, Arc::clone(&expired));
    let vars = container_vars(gate.endpoint(), &ecs);
    let url = format!("s3://{BUCKET}/m.safetensors");
    let log_path = home.path().join("stfs.log");
    let m = mount_with_timeout(&url, home.path(), &vars, "2s", &log_path);
    assert_all_exact(&m, &tensors[..1]);
    // That read started a refresh (the credentials expire within 5 minutes): let it land first.
    std::thread::sleep(Duration::from_secs(1));
    stall.on.store(true, Ordering::SeqCst);
    sleep_past_expiry(&issued, lifetime);

    let big: Vec<&T> = tensors.iter().filter(|t| t.name.starts_with("big.")).collect();
    let started = Instant::now();
    let results = read_concurrently(&m, &big);
    let took = started.elapsed();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let bound = Duration::from_secs(2 + 3);
    for (t, (result, slowest)) in big.iter().zip(&results) {
        let error = result.as_ref().err().unwrap_or_else(|| panic!("{} read with expired credentials", t.name));
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{}: {error}", t.name);
        assert!(*slowest < bound, "a read of {} waited {slowest:?} (--timeout 2s); log: {log}", t.name);
    }
    assert!(took < 2 * bound, "the readers took {took:?} (--timeout 2s)");
    assert_eq!(expired.load(Ordering::SeqCst), 0, "the store was sent expired credentials");
    assert!(stall.held.load(Ordering::SeqCst) >= 1, "the credential endpoint was not asked: {log}");
    let said: Vec<&str> = log.lines().filter(|l| l.contains("AWS credentials")).collect();
    assert!(said.iter().any(|l| l.contains("expired") && l.contains("2 s")), "no line says why: {log}");
    assert_no_secret_in(&log);

    // The endpoint answers again: soon a read fetches new credentials (the fetch held when the
    // stall ends fails, and for a second after a failure reads fail at once), and every tensor reads.
    stall.on.store(false, Ordering::SeqCst);
    let mut last = Vec::new();
    let back = wait_until(TIMEOUT, || {
        last = read_concurrently(&m, &big).into_iter().map(|(result, _)| result).collect();
        last.iter().all(|r| r.is_ok())
    });
    assert!(back, "reads still fail once the endpoint answers again: {:?}", last.iter().map(|r| r.as_ref().err()));
    for (t, result) in big.iter().zip(last) {
        assert!(result.unwrap() == t.data, "{} differs", t.name);
    }
}

/// Expired credentials, a credential endpoint that answers only after 4 s of a 5 s `--timeout`,
/// and then a store that accepts the GET and never answers: the read fails with EIO once its one
/// `--timeout` has passed, the wait for the credentials included. (It used to measure its time
/// left before the credentials and so waited about 4 s + a whole 5 s more.)
#[test]
fn a_slow_credential_refresh_counts_in_the_reads_one_timeout() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let lifetime = Duration::from_secs(8);
    let issued = Arc::new(Mutex::new(Vec::new()));
    let slow = Arc::new(AtomicBool::new(false));
    let ecs = {
        let (issued, slow) = (Arc::clone(&issued), Arc::clone(&slow));
        TinyHttp::start(move |request| {
            if slow.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(4));
            }
            container_answer(request, lifetime, &issued)
        })
    };
    let silent = Arc::new(Stall::default());
    let gate = {
        let silent = Arc::clone(&silent);
        S3Gate::start(server.port, move |_| {
            if !silent.on.load(Ordering::SeqCst) {
                return None;
            }
            silent.held.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(60);
            while silent.on.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            Some(s3_error(503, "SlowDown", "stalled"))
        })
    };
    let vars = container_vars(gate.endpoint(), &ecs);
    let url = format!("s3://{BUCKET}/m.safetensors");
    let log_path = home.path().join("stfs.log");
    let m = mount_with_timeout(&url, home.path(), &vars, "5s", &log_path);
    assert_all_exact(&m, &tensors[..1]);
    // That read started a refresh (the credentials expire within 5 minutes): let it land first.
    std::thread::sleep(Duration::from_secs(1));
    slow.store(true, Ordering::SeqCst);
    sleep_past_expiry(&issued, lifetime);
    let fetched_before = issued.lock().unwrap().len();
    silent.on.store(true, Ordering::SeqCst);

    let big: Vec<&T> = tensors.iter().filter(|t| t.name.starts_with("big.")).take(1).collect();
    let results = read_concurrently(&m, &big);
    silent.on.store(false, Ordering::SeqCst);
    drop(m);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let (result, slowest) = &results[0];
    let error = result.as_ref().err().unwrap_or_else(|| panic!("read from a silent store; log: {log}"));
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert!(issued.lock().unwrap().len() > fetched_before, "the read fetched no new credentials: {log}");
    assert!(silent.held.load(Ordering::SeqCst) >= 1, "the store was not asked: {log}");
    // 5 s, and the kernel's repeats of the failed read (half a second each, twice), and a margin:
    // well under the 4 s + 5 s of a read whose timeout starts after its credentials.
    let bound = Duration::from_millis(7500);
    assert!(*slowest < bound, "a read waited {slowest:?} with --timeout 5s; log: {log}");
    println!("the read failed after {slowest:?}");
    assert_no_secret_in(&log);
}

/// A credential lookup that resolves a host name (the container endpoint named `localhost`) runs
/// a thread of tokio's blocking pool; the lookup joins it before the daemon forks, so the daemon's
/// log reports no thread alive at the fork.
#[test]
fn credential_lookups_leave_no_thread_alive_at_the_fork() {
    let server = s3_or_skip!();
    let (home, tensors) = stored_model(&server);
    let issued = Arc::new(Mutex::new(Vec::new()));
    let ecs = start_container_endpoint(Duration::from_secs(3600), Arc::clone(&issued));
    let vars = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("http://localhost:{}/v2/credentials/stfs", ecs.port)),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", CONTAINER_AUTH.to_string()),
    ];
    let url = format!("s3://{BUCKET}/m.safetensors");
    let log_path = home.path().join("stfs.log");
    let m = mount_with_timeout(&url, home.path(), &vars, "30s", &log_path);
    assert_all_exact(&m, &tensors);
    drop(m);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!issued.lock().unwrap().is_empty(), "the container endpoint was not asked");
    assert!(log.contains("mounted"), "not the daemon's log: {log}");
    assert!(!log.contains("alive at fork"), "{log}");
}
