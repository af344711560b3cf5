//! Remote mounts end to end: real `stfs mount URL` against Debian's nginx on loopback, directly and
//! through a fault-injecting proxy. Checks byte-exact tensors, the transfer bound of one tensor (from
//! nginx's own access log), sharded index URLs, clear refusals, and each injected fault's behaviour:
//! retried and correct, or EIO to that reader only, never wrong bytes. Skips when nginx is missing (fails under `CI=true`).

mod common;
#[path = "common/faultproxy.rs"]
mod faultproxy;
#[path = "common/nginx.rs"]
mod nginx;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use common::*;
use faultproxy::FaultProxy;
use nginx::Nginx;
use stfs::format::Dtype;

/// Block size of every mount here: small, so the transfer bound is tight and files span many blocks.
const BLOCK: u64 = 64 << 10;

macro_rules! nginx_or_skip {
    () => {
        match Nginx::start() {
            Some(n) => n,
            None => {
                return tool_missing("nginx", "apt-get install nginx");
            }
        }
    };
}

/// Mixed small tensors plus a few that span many 64 KiB blocks.
fn fixture() -> Vec<T> {
    let mut tensors = mixed_tensors();
    for i in 0..6 {
        tensors.push(T::new(&format!("big.{i}.weight"), Dtype::F32, &[300 + i, 1000]));
    }
    tensors
}

fn served(m: &Mount, name: &str) -> std::path::PathBuf {
    m.file(&stfs::tree::names::escape(name, stfs::tree::namespace::RESERVED))
}

fn mount_url(url: &str, extra: &[&str]) -> Mount {
    let mut args = vec!["--block-size", "64K"];
    args.extend_from_slice(extra);
    Mount::new(Path::new(url), &args)
}

/// Absolute offset of a tensor in the backing file, from metadata.json.
fn m_offset(m: &Mount, name: &str) -> u64 {
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap();
    doc["tensors"][name]["offset"].as_u64().unwrap_or(u64::MAX)
}

fn stats(m: &Mount) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(m.file(".stfs/stats.json")).unwrap()).unwrap()
}

fn assert_all_exact(m: &Mount, tensors: &[T]) {
    for t in tensors {
        assert!(std::fs::read(served(m, &t.name)).unwrap() == t.data, "tensor {:?} differs", t.name);
    }
}

fn is_eio(result: std::io::Result<Vec<u8>>) -> bool {
    matches!(result, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

#[test]
fn every_tensor_is_byte_exact_and_inspect_works() {
    let nginx = nginx_or_skip!();
    let tensors = fixture();
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let url = nginx.url("model.safetensors");
    let m = mount_url(&url, &[]);
    assert_all_exact(&m, &tensors);
    // Reading a served file a second time comes from the cache or page cache, still exact.
    let t = &tensors[0];
    let mut part = vec![0; 1000];
    std::fs::File::open(served(&m, &t.name)).unwrap().read_exact_at(&mut part, 20_000).unwrap();
    assert_eq!(part, t.data[20_000..21_000]);
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap();
    assert_eq!(doc["tensors"].as_object().unwrap().len(), tensors.len());
    let http_requests = stats(&m)["http_requests"].as_u64().unwrap();
    assert!(http_requests > 0, "stats count requests");

    let out = stfs(&["inspect", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("big.5.weight") && table.contains(&format!("{} tensors", tensors.len())), "{table}");
    let out = stfs(&["inspect", "--json", &url]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["tensors"]["big.5.weight"]["shape"], serde_json::json!([305, 1000]));
}

#[test]
fn one_tensor_transfers_at_most_itself_plus_two_blocks() {
    let nginx = nginx_or_skip!();
    let mut tensors = fixture();
    tensors.push(T::new("huge.weight", Dtype::F32, &[1 << 20]));
    tensors.push(T::new("after.huge", Dtype::F32, &[1 << 20]));
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let m = mount_url(&nginx.url("model.safetensors"), &[]);
    let before = nginx.settled_log(Duration::from_millis(200)).len();
    let mut over = Vec::new();
    for name in ["model.layers.0.mlp.weight", "big.2.weight", "huge.weight"] {
        let t = tensors.iter().find(|t| t.name == name).unwrap();
        let start = nginx.log().len();
        assert!(std::fs::read(served(&m, name)).unwrap() == t.data);
        // Readahead may still be in flight when read() returns: wait until the server is quiet.
        let log = nginx.settled_log(Duration::from_millis(300));
        let sent: u64 = log[start..].iter().map(|l| l.bytes).sum();
        let bound = t.data.len() as u64 + 2 * BLOCK;
        if sent > bound {
            let offset = m_offset(&m, name);
            let requests = log.len() - start;
            over.push(format!(
                "{name}: {sent} bytes in {requests} requests for {} at {offset} (bound {bound})",
                t.data.len()
            ));
        }
        assert!(sent >= t.data.len() as u64, "{name}: the tensor cannot arrive in fewer bytes than it has");
        assert!(log[start..].iter().all(|l| l.status == 206 && l.range.starts_with("bytes=")), "{:?}", &log[start..]);
    }
    assert!(before >= 1, "the mount itself read the header");
    assert!(over.is_empty(), "nginx sent more than the tensor plus two blocks: {over:#?}");
}

#[test]
fn a_sharded_index_url_mounts_its_shards() {
    let nginx = nginx_or_skip!();
    let a = vec![T::new("model.a", Dtype::F32, &[100, 300]), T::new("model.b", Dtype::BF16, &[7, 9])];
    let b = vec![T::new("model.c", Dtype::I64, &[33]), T::new("lm_head", Dtype::F16, &[400, 300])];
    std::fs::create_dir(nginx.root.join("repo")).unwrap();
    write_checkpoint(&nginx.root.join("repo/model-00001-of-00002.safetensors"), &a, None);
    write_checkpoint(&nginx.root.join("repo/model-00002-of-00002.safetensors"), &b, None);
    let index = serde_json::json!({
        "metadata": {"total_size": 1},
        "weight_map": {"model.a": "model-00001-of-00002.safetensors", "model.b": "model-00001-of-00002.safetensors",
                        "model.c": "model-00002-of-00002.safetensors", "lm_head": "model-00002-of-00002.safetensors"}
    });
    std::fs::write(nginx.root.join("repo/model.safetensors.index.json"), index.to_string()).unwrap();
    let m = mount_url(&nginx.url("repo/model.safetensors.index.json"), &[]);
    assert_all_exact(&m, &a);
    assert_all_exact(&m, &b);
    let requested: Vec<String> = nginx.log().into_iter().map(|l| l.request).collect();
    for shard in ["model-00001-of-00002", "model-00002-of-00002"] {
        assert!(requested.iter().any(|r| r.contains(&format!("/repo/{shard}.safetensors"))), "{requested:?}");
    }
    // The shards and the index, re-served under the last segment of their URLs, byte for byte.
    for name in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    {
        let want = std::fs::read(nginx.root.join("repo").join(name)).unwrap();
        assert!(std::fs::read(m.file(name)).unwrap() == want, "{name}");
    }
}

#[test]
fn the_shards_of_an_index_url_are_opened_at_once() {
    let nginx = nginx_or_skip!();
    std::fs::create_dir(nginx.root.join("repo")).unwrap();
    let mut weight_map = serde_json::Map::new();
    let mut all = Vec::new();
    for i in 0..6 {
        let file = format!("model-{:05}-of-00006.safetensors", i + 1);
        let tensors = vec![T::new(&format!("layer.{i}.weight"), Dtype::F32, &[50 + i, 40])];
        write_checkpoint(&nginx.root.join("repo").join(&file), &tensors, None);
        weight_map.insert(tensors[0].name.clone(), file.into());
        all.extend(tensors);
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(nginx.root.join("repo/model.safetensors.index.json"), index.to_string()).unwrap();
    let proxy = FaultProxy::start(nginx.port);
    // Each request waits long enough that opens made one after another could never overlap.
    proxy.knobs.latency_ms.store(150, SeqCst);
    let m = mount_url(&proxy.url("repo/model.safetensors.index.json"), &[]);
    let peak = proxy.knobs.peak_in_flight.load(SeqCst);
    assert!(peak >= 2, "the six shard headers were requested one at a time (peak {peak} in flight)");
    proxy.knobs.latency_ms.store(0, SeqCst);
    assert_all_exact(&m, &all);
}

/// `stfs mount URL` must fail with exit 1, one `stfs: ` line containing `needle`, and no mount.
fn assert_refused(url: &str, needle: &str) -> Duration {
    let mp = workdir();
    let started = Instant::now();
    let out = stfs(&["mount", "--block-size", "64K", url, mp.path().to_str().unwrap()]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("stfs: ") && err.contains(needle), "{err}");
    assert!(!is_mounted(mp.path()));
    took
}

#[test]
fn an_index_url_naming_a_missing_shard_is_refused_naming_it() {
    let nginx = nginx_or_skip!();
    std::fs::create_dir(nginx.root.join("repo")).unwrap();
    let mut weight_map = serde_json::Map::new();
    for i in 0..4 {
        let file = format!("model-{:05}-of-00004.safetensors", i + 1);
        if i != 2 {
            write_checkpoint(&nginx.root.join("repo").join(&file), &[T::new(&format!("w{i}"), Dtype::F32, &[8])], None);
        }
        weight_map.insert(format!("w{i}"), file.into());
    }
    let index = serde_json::json!({"weight_map": weight_map});
    std::fs::write(nginx.root.join("repo/model.safetensors.index.json"), index.to_string()).unwrap();
    assert_refused(&nginx.url("repo/model.safetensors.index.json"), "model-00003-of-00004.safetensors: HTTP 404");
}

#[test]
fn missing_and_non_safetensors_urls_are_refused_with_one_line() {
    let nginx = nginx_or_skip!();
    std::fs::write(nginx.root.join("readme.txt"), "This is not a safetensors file, just some text.\n".repeat(5000))
        .unwrap();
    assert_refused(&nginx.url("nope.safetensors"), "HTTP 404: not found");
    assert_refused(&nginx.url("readme.txt"), "readme.txt");
    assert_refused(&nginx.url("nope.index.json"), "HTTP 404");
    let out = stfs(&["inspect", &nginx.url("nope.safetensors")]);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stderr).lines().count()), (Some(1), 1));
}

/// nginx with a fixture, and the fault proxy in front of it.
fn proxied() -> Option<(Nginx, FaultProxy, Vec<T>)> {
    let nginx = Nginx::start()?;
    let tensors = fixture();
    write_checkpoint(&nginx.root.join("model.safetensors"), &tensors, None);
    let proxy = FaultProxy::start(nginx.port);
    Some((nginx, proxy, tensors))
}

macro_rules! proxied_or_skip {
    () => {
        match proxied() {
            Some(p) => p,
            None => {
                return tool_missing("nginx", "apt-get install nginx");
            }
        }
    };
}

#[test]
fn added_latency_still_serves_correct_bytes() {
    let (_nginx, proxy, tensors) = proxied_or_skip!();
    proxy.knobs.latency_ms.store(15, SeqCst);
    let m = mount_url(&proxy.url("model.safetensors"), &[]);
    assert_all_exact(&m, &tensors);
    let s = stats(&m);
    assert_eq!(s["http_retries"], 0, "latency alone is no failure: {s}");
    let (requests, micros) = (s["http_requests"].as_u64().unwrap(), s["http_request_micros"].as_u64().unwrap());
    assert!(micros >= requests * 15_000, "every request took at least the added 15 ms: {s}");
    assert!(s["http_request_max_micros"].as_u64().unwrap() >= 15_000, "{s}");
    let histogram = s["http_request_latency_ms"].as_object().unwrap();
    let attempts: u64 = histogram.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(attempts, requests, "no redirects here, so one attempt per request: {s}");
    assert_eq!((histogram["<1"].as_u64(), histogram["<5"].as_u64()), (Some(0), Some(0)), "none under 15 ms: {s}");
}

#[test]
fn dropped_connections_and_503_bursts_are_retried() {
    let (_nginx, proxy, tensors) = proxied_or_skip!();
    let m = mount_url(&proxy.url("model.safetensors"), &["--http-retries", "5", "--http-retry-delay", "20ms"]);
    let k = &proxy.knobs;
    // Four faults in all, fewer than the five tries: even if one request meets every one, it succeeds.
    k.reset_next.store(1, SeqCst);
    k.truncate_next.store(1, SeqCst);
    k.fail_503_next.store(2, SeqCst);
    assert_all_exact(&m, &tensors);
    assert_eq!(
        (k.reset_next.load(SeqCst), k.truncate_next.load(SeqCst), k.fail_503_next.load(SeqCst)),
        (0, 0, 0),
        "every fault was injected"
    );
    let s = stats(&m);
    assert!(s["http_retries"].as_u64().unwrap() >= 4, "{s}");
    assert_eq!(s["read_errors"], 0, "{s}");
}

#[test]
fn a_server_ignoring_range_is_refused_without_a_download() {
    let (nginx, proxy, _) = proxied_or_skip!();
    // Big enough that a full download would show: 32 MiB.
    let big = vec![T::new("huge", Dtype::U8, &[32 << 20])];
    let len = write_checkpoint(&nginx.root.join("huge.safetensors"), &big, None).len() as u64;
    proxy.knobs.strip_range.store(true, SeqCst);
    let took = assert_refused(&proxy.url("huge.safetensors"), "ignores Range");
    assert!(took < Duration::from_secs(5), "refused quickly, took {took:?}");
    let sent = proxy.knobs.bytes_to_client.load(SeqCst);
    assert!(sent < len / 4, "the refusal cost {sent} of {len} bytes");
    assert_eq!(proxy.knobs.requests.load(SeqCst), 1, "a refusal is not retried");
}

#[test]
fn a_replaced_object_fails_uncached_reads_and_never_mixes_bytes() {
    let (nginx, proxy, tensors) = proxied_or_skip!();
    let file = nginx.root.join("model.safetensors");
    let m = mount_url(&proxy.url("model.safetensors"), &[]);
    let first = tensors.iter().find(|t| t.name == "big.0.weight").unwrap();
    assert!(std::fs::read(served(&m, &first.name)).unwrap() == first.data);
    // Same size, new content and modified time: only the ETag gives the change away.
    let old = std::fs::read(&file).unwrap();
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    nginx::replace_file(&file, &new, Duration::from_secs(10));
    let mut failures = 0;
    for t in tensors.iter().filter(|t| !t.data.is_empty()) {
        match std::fs::read(served(&m, &t.name)) {
            Ok(bytes) => assert!(bytes == t.data, "{}: a successful read must be the mounted version", t.name),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{}: {e}", t.name);
                failures += 1;
            }
        }
    }
    assert!(failures >= 5, "reads of blocks not cached before the swap fail ({failures} did)");
    assert!(std::fs::read(m.file("metadata.json")).is_ok(), "the mount stays up");
    assert!(stats(&m)["read_errors"].as_u64().unwrap() >= 5);
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&m.path));
}

#[test]
fn a_persistent_503_fails_that_reader_only_and_the_mount_recovers() {
    let (_nginx, proxy, tensors) = proxied_or_skip!();
    let m = mount_url(&proxy.url("model.safetensors"), &["--http-retries", "3", "--http-retry-delay", "20ms"]);
    let (failing, later) = (&tensors[0], &tensors[1]);
    proxy.knobs.fail_503_all.store(true, SeqCst);
    let started = Instant::now();
    assert!(is_eio(std::fs::read(served(&m, &failing.name))), "an outage is EIO to the reader");
    assert!(started.elapsed() < Duration::from_secs(10), "gave up in bounded time: {:?}", started.elapsed());
    assert!(std::fs::read(m.file("metadata.json")).is_ok(), "the mount stays up");
    proxy.knobs.fail_503_all.store(false, SeqCst);
    assert!(std::fs::read(served(&m, &later.name)).unwrap() == later.data);
    assert!(std::fs::read(served(&m, &failing.name)).unwrap() == failing.data, "a failed block is not cached");
    assert_all_exact(&m, &tensors);
    let s = stats(&m);
    assert!(s["http_retries"].as_u64().unwrap() >= 2 && s["read_errors"].as_u64().unwrap() >= 1, "{s}");
}
