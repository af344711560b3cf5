//! Tests of the remote source against the loopback test server: exact bytes, pinning, retries,
//! redirects, refusal of range-less servers and credential hygiene.

use super::test_server::{Fault, TestServer};
use super::*;
use crate::source::Source;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Deterministic, non-repeating test bytes.
fn pattern(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u8
        })
        .collect()
}

/// Fast retries, short timeouts, no proxy from the environment, a small prefix.
fn options() -> HttpOptions {
    HttpOptions {
        retry: RetryPolicy { attempts: 5, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(20) },
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        proxy: ProxySetting::Direct,
        prefix_len: 4096,
        hub_token_from_env: false,
        ..HttpOptions::default()
    }
}

fn read(source: &HttpSource, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; len];
    source.open_reader()?.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

fn load(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn reads_are_byte_exact_and_the_prefix_saves_requests() {
    let data = pattern(100_000);
    let server = TestServer::start(data.clone());
    let source = HttpSource::open(&server.url("/m.safetensors"), options()).unwrap();
    assert_eq!(source.len(), 100_000);
    assert_eq!(source.header_prefix(), &data[..4096]);
    assert_eq!(source.etag().as_deref(), Some("\"v1\""));
    assert!(source.modified_time().is_some());
    assert_eq!(server.seen().len(), 1);

    let mut stream = source.open_reader().unwrap();
    let mut inside = vec![0; 100];
    stream.read_exact_at(&mut inside, 8).unwrap();
    assert_eq!(inside, &data[8..108]);
    assert_eq!(server.seen().len(), 1, "a read inside the prefix needs no request");

    let mut straddling = vec![0; 2000];
    stream.read_exact_at(&mut straddling, 3000).unwrap();
    assert_eq!(straddling, &data[3000..5000]);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("range"), Some("bytes=4096-4999"), "only the missing part is fetched");
    assert_eq!(seen[1].header("if-match"), Some("\"v1\""));

    for (offset, len) in [(50_000u64, 10_000usize), (99_999, 1), (4096, 95_904), (0, 100_000)] {
        let mut buf = vec![0; len];
        stream.read_exact_at(&mut buf, offset).unwrap();
        assert_eq!(buf, &data[offset as usize..offset as usize + len], "at {offset}");
    }
    stream.read_exact_at(&mut [], 100_000).unwrap();
    let past = stream.read_exact_at(&mut [0; 2], 99_999).unwrap_err();
    assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn a_vectored_read_is_one_request_straight_into_the_buffers() {
    let data = pattern(100_000);
    let server = TestServer::start(data.clone());
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    let mut stream = source.open_reader().unwrap();
    for (offset, lens) in [(10_000u64, vec![1000, 3000, 7]), (0, vec![100, 5000]), (99_000, vec![500, 500])] {
        let before = server.seen().len();
        let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0; n]).collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
        stream.read_vectored_exact_at(&mut slices, offset).unwrap();
        assert_eq!(bufs.concat(), &data[offset as usize..][..lens.iter().sum::<usize>()], "at {offset}");
        assert!(server.seen().len() <= before + 1, "one request at most, at {offset}");
    }
    let mut past = [vec![0u8; 10], vec![0u8; 10]];
    let mut slices: Vec<&mut [u8]> = past.iter_mut().map(Vec::as_mut_slice).collect();
    assert!(stream.read_vectored_exact_at(&mut slices, 99_990).is_err());
}

#[test]
fn streams_read_in_parallel_over_their_own_connections() {
    let data = pattern(1 << 20);
    let server = TestServer::start(data.clone());
    let options = options();
    let stats = Arc::clone(&options.stats);
    let source = Arc::new(HttpSource::open(&server.url("/m"), options).unwrap());
    let readers: Vec<_> = (0..4u64)
        .map(|reader| {
            let (source, data) = (Arc::clone(&source), data.clone());
            std::thread::spawn(move || {
                let mut stream = source.open_reader().unwrap();
                for block in 0..16u64 {
                    let offset = (reader * 16 + block) * 16384;
                    let mut buf = vec![0; 16384];
                    stream.read_exact_at(&mut buf, offset).unwrap();
                    assert_eq!(buf, &data[offset as usize..offset as usize + 16384]);
                }
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
    // The first block only partly overlaps the prefix, so every block costs one request.
    assert_eq!(load(&stats.http_requests), 1 + 4 * 16);
    assert_eq!(load(&stats.http_bytes), 1 << 20);
    assert_eq!(load(&stats.http_retries), 0);
    assert!(load(&stats.http_request_micros) > 0);
}

#[test]
fn retries_recover_from_503_bursts_drops_truncation_and_stalls() {
    let data = pattern(50_000);
    let server = TestServer::start(data.clone());
    let mut options = options();
    options.read_timeout = Duration::from_millis(300);
    let stats = Arc::clone(&options.stats);
    server.with(|s| s.faults.extend([Fault::Status(503, None), Fault::Drop]));
    let source = HttpSource::open(&server.url("/m"), options).unwrap();
    let faults = [
        vec![Fault::Status(503, Some(0)), Fault::Status(503, None), Fault::Status(429, None)],
        vec![Fault::Drop],
        vec![Fault::Truncate],
        vec![Fault::Status(500, None), Fault::Delay(Duration::from_secs(1))],
    ];
    let mut expected_retries = 2;
    for burst in faults {
        expected_retries += burst.len() as u64;
        server.with(|s| s.faults.extend(burst));
        assert_eq!(read(&source, 10_000, 30_000).unwrap(), &data[10_000..40_000]);
    }
    assert_eq!(load(&stats.http_retries), expected_retries);
}

#[test]
fn a_request_that_keeps_failing_becomes_an_io_error() {
    let server = TestServer::start(pattern(50_000));
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    let before = server.seen().len();
    server.with(|s| s.faults.extend(std::iter::repeat_n(Fault::Status(503, Some(1)), 10)));
    let started = Instant::now();
    let error = read(&source, 20_000, 100).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "Retry-After is capped by max_delay");
    assert_eq!(server.seen().len() - before, 5, "one request per try");
    let message = error.to_string();
    assert!(message.contains("503") && message.contains("5 tries"), "{message}");
}

#[test]
fn a_server_ignoring_range_is_refused_without_downloading_everything() {
    let size = 32 << 20;
    let server = TestServer::start(pattern(size));
    server.with(|s| s.ignore_range = true);
    let started = Instant::now();
    let error = HttpSource::open(&server.url("/big"), options()).unwrap_err();
    assert!(matches!(error, HttpError::RangeUnsupported { .. }), "{error}");
    assert!(error.to_string().contains("Range"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(server.seen().len(), 1, "not retried");
    std::thread::sleep(Duration::from_millis(100));
    let sent = server.with(|s| s.body_bytes_sent);
    assert!(sent < size as u64 / 2, "server pushed {sent} bytes");
}

#[test]
fn a_small_object_sent_whole_is_accepted() {
    let data = pattern(1000);
    let server = TestServer::start(data.clone());
    server.with(|s| s.ignore_range = true);
    let source = HttpSource::open(&server.url("/small"), options()).unwrap();
    assert_eq!(source.len(), 1000);
    assert_eq!(read(&source, 100, 900).unwrap(), &data[100..]);
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn a_replaced_object_fails_without_retrying() {
    let server = TestServer::start(pattern(50_000));
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    server.with(|s| {
        s.data = pattern(60_000);
        s.etag = Some("\"v2\"".to_string());
    });
    let before = server.seen().len();
    let error = read(&source, 10_000, 100).unwrap_err();
    assert!(error.to_string().contains("changed since mount"), "{error}");
    assert_eq!(server.seen().len() - before, 1);
}

/// A server that ignores If-Match and stops sending the ETag it pinned with must not have the new
/// bytes served: the missing validator is a change.
#[test]
fn a_replaced_object_whose_validators_vanish_fails() {
    let server = TestServer::start(pattern(50_000));
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    server.with(|s| {
        s.data = pattern(50_001)[1..].to_vec();
        s.etag = None;
        s.last_modified = None;
        s.ignore_preconditions = true;
    });
    let error = read(&source, 10_000, 100).unwrap_err();
    assert!(error.to_string().contains("changed since mount (its ETag is gone)"), "{error}");
}

/// stfs asks for no content coding: a gzip body is not the object's bytes, at open or later, even
/// when its length is the range's; `identity` is no coding.
#[test]
fn a_body_in_a_content_coding_is_refused() {
    let data = pattern(50_000);
    let server = TestServer::start(data.clone());
    server.with(|s| s.content_encoding = Some("gzip".to_string()));
    let error = HttpSource::open(&server.url("/m"), options()).unwrap_err();
    assert!(error.to_string().contains("Content-Encoding gzip"), "{error}");

    server.with(|s| s.content_encoding = Some("identity".to_string()));
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    assert_eq!(read(&source, 10_000, 100).unwrap(), &data[10_000..10_100]);
    server.with(|s| s.content_encoding = Some("identity, gzip".to_string()));
    let before = server.seen().len();
    let error = read(&source, 20_000, 100).unwrap_err();
    assert!(error.to_string().contains("Content-Encoding identity, gzip"), "{error}");
    assert_eq!(server.seen().len() - before, 1, "not retried");
}

#[test]
fn without_an_etag_the_date_and_size_pin_the_object() {
    let server = TestServer::start(pattern(50_000));
    server.with(|s| s.etag = Some("W/\"weak\"".to_string()));
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    read(&source, 10_000, 100).unwrap();
    let last = server.seen().pop().unwrap();
    assert_eq!(last.header("if-match"), None, "a weak tag never satisfies If-Match");
    assert_eq!(last.header("if-unmodified-since"), Some("Tue, 02 Jan 2024 03:04:05 GMT"));

    // A server that honours no precondition and sends no validator: only the size betrays a change.
    server.with(|s| {
        s.etag = None;
        s.last_modified = None;
    });
    let bare = HttpSource::open(&server.url("/m"), options()).unwrap();
    server.with(|s| s.data = pattern(70_000));
    let error = read(&bare, 10_000, 100).unwrap_err();
    assert!(error.to_string().contains("size is now 70000"), "{error}");
}

#[test]
fn redirects_keep_the_token_at_home_and_cache_the_target() {
    let data = pattern(50_000);
    let hub = TestServer::start(Vec::new());
    let cdn = TestServer::start(data.clone());
    hub.with(|s| {
        s.redirects.insert("/resolve/m".to_string(), cdn.url("/signed/1?sig=abc"));
        s.required_auth = Some("Bearer hub-token".to_string());
    });
    let mut options = options();
    options.bearer_token = Some(Secret::new("hub-token"));
    let source = HttpSource::open(&hub.url("/resolve/m"), options).unwrap();
    assert_eq!(source.len(), 50_000);
    assert_eq!(hub.seen()[0].header("authorization"), Some("Bearer hub-token"));
    assert!(cdn.seen().iter().all(|seen| seen.header("authorization").is_none()), "token leaked to the CDN");

    assert_eq!(read(&source, 20_000, 1000).unwrap(), &data[20_000..21_000]);
    assert_eq!(hub.seen().len(), 1, "later blocks go straight to the cached target");
    assert_eq!(cdn.seen().last().unwrap().header("if-match"), Some("\"v1\""));

    // The signed URL expires: the next block goes back to the hub for a fresh one.
    cdn.with(|s| {
        s.refused.insert("/signed/1?sig=abc".to_string());
    });
    hub.with(|s| s.redirects.insert("/resolve/m".to_string(), cdn.url("/signed/2?sig=def")));
    assert_eq!(read(&source, 30_000, 1000).unwrap(), &data[30_000..31_000]);
    assert_eq!(hub.seen().len(), 2);
    assert_eq!(cdn.seen().last().unwrap().path, "/signed/2?sig=def");
}

#[test]
fn relative_redirects_on_one_host_work() {
    let data = pattern(20_000);
    let server = TestServer::start(data.clone());
    server.with(|s| s.redirects.insert("/a/m".to_string(), "/b/m".to_string()));
    let source = HttpSource::open(&server.url("/a/m"), options()).unwrap();
    assert_eq!(read(&source, 5000, 10_000).unwrap(), &data[5000..15_000]);
}

#[test]
fn credentials_never_show_in_names_debug_or_errors() {
    let server = TestServer::start(pattern(10_000));
    server.with(|s| s.required_auth = Some("Bearer right".to_string()));
    let mut options = options();
    options.bearer_token = Some(Secret::new("wrong-sekret-token"));
    options.add_header_arg("X-Api-Key: key-sekret").unwrap();
    let url = server.url("/m?X-Signature=sig-sekret");
    let error = HttpSource::open(&url, options.clone()).unwrap_err();
    let texts = [error.to_string(), format!("{error:?}"), format!("{options:?}")];
    for text in &texts {
        for secret in ["wrong-sekret-token", "key-sekret", "sig-sekret"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
    // The message leaves the URL to whoever shows it; the error keeps it, redacted.
    assert!(texts[0].contains("401") && !texts[0].contains("http://"), "{}", texts[0]);
    assert!(matches!(&error, HttpError::Status { name, .. } if name.ends_with("/m?<redacted>")), "{error:?}");

    server.with(|s| s.required_auth = None);
    let source = HttpSource::open(&url, options).unwrap();
    assert_eq!(source.name(), format!("http://{}/m?<redacted>", server.addr));
    assert!(!format!("{source:?}").contains("sekret"));
    assert_eq!(server.seen().last().unwrap().header("x-api-key"), Some("key-sekret"));
}

#[test]
fn not_found_is_not_retried() {
    let server = TestServer::start(pattern(10_000));
    server.with(|s| s.faults.push_back(Fault::Status(404, None)));
    let error = HttpSource::open(&server.url("/missing"), options()).unwrap_err();
    assert!(error.to_string().contains("not found"), "{error}");
    assert_eq!(server.seen().len(), 1);
    assert_eq!(io::Error::from(error).kind(), io::ErrorKind::NotFound);
}

#[test]
fn an_explicit_proxy_tunnels_the_requests() {
    let data = pattern(20_000);
    let server = TestServer::start(data.clone());
    let mut options = options();
    options.proxy = ProxySetting::Url(Secret::new(format!("http://{}", server.addr)));
    let source = HttpSource::open("http://stfs-test.invalid/m", options).unwrap();
    assert_eq!(read(&source, 1000, 10_000).unwrap(), &data[1000..11_000]);
    let seen = server.seen();
    assert_eq!(seen[0].method, "CONNECT");
    assert!(seen[0].path.contains("stfs-test.invalid"), "{:?}", seen[0]);
}

#[test]
fn a_silent_server_times_out_within_the_timeout_retries_included() {
    let server = TestServer::start(pattern(10_000));
    server.with(|s| s.faults.extend([Fault::Delay(Duration::from_secs(3)), Fault::Delay(Duration::from_secs(3))]));
    let options = HttpOptions { timeout: Duration::from_millis(400), ..options() };
    let started = Instant::now();
    let error = HttpSource::open(&server.url("/m"), options).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    let expected = format!("timed out after 400 ms waiting for {} to answer the request for bytes 0-4095", server.addr);
    assert_eq!(error.to_string(), expected);
    assert!(matches!(&error, HttpError::TimedOut(t) if t.stage == Stalled::Answer), "{error:?}");
}

#[test]
fn a_repeat_of_any_read_that_failed_gets_one_try_however_many_others_failed_since() {
    let data = pattern(100_000);
    let server = TestServer::start(data.clone());
    let source = HttpSource::open(&server.url("/m"), options()).unwrap();
    let requests = || server.with(|s| s.seen.len());
    // Two reads of different bytes fail after all their tries: a server answering 503 throughout.
    server.with(|s| s.faults.extend(std::iter::repeat_n(Fault::Status(503, None), 10)));
    assert!(read(&source, 20_000, 1000).is_err());
    assert!(read(&source, 60_000, 1000).is_err());
    assert_eq!(server.with(|s| s.faults.len()), 0, "each spent its five tries");
    // The kernel's repeat of the first: one try, although another read failed after it.
    server.with(|s| s.faults.extend(std::iter::repeat_n(Fault::Status(503, None), 5)));
    let before = requests();
    assert!(read(&source, 20_500, 1000).is_err());
    assert_eq!(requests() - before, 1, "a repeat of a failed read gets one try, not another round of retries");
    // Bytes nobody failed on get their whole round of retries, and a server that answers is read.
    server.with(|s| s.faults.truncate(2));
    assert_eq!(read(&source, 40_000, 1000).unwrap(), data[40_000..41_000]);
    assert_eq!(read(&source, 20_000, 1000).unwrap(), data[20_000..21_000]);
}

#[test]
fn a_repeat_of_a_read_that_timed_out_gets_a_short_try() {
    let server = TestServer::start(pattern(100_000));
    let options = HttpOptions { timeout: Duration::from_millis(1500), ..options() };
    let source = HttpSource::open(&server.url("/m"), options).unwrap();
    server.with(|s| s.faults.extend([Fault::Delay(Duration::from_secs(4)), Fault::Delay(Duration::from_secs(4))]));
    let timed = |offset| {
        let started = Instant::now();
        (read(&source, offset, 1000), started.elapsed())
    };
    let (first, took) = timed(50_000);
    assert_eq!(first.unwrap_err().kind(), io::ErrorKind::TimedOut);
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(3),
        "the first waits the timeout: {took:?}"
    );
    // The kernel asks again at once: one short try, not another whole timeout.
    let (repeat, took) = timed(50_500);
    assert_eq!(repeat.unwrap_err().kind(), io::ErrorKind::TimedOut);
    assert!(took < Duration::from_millis(1200), "the repeat is short: {took:?}");
    // A server that answers again is read at once, even within the memory of the stall.
    let (again, _) = timed(50_000);
    assert_eq!(again.unwrap(), pattern(100_000)[50_000..51_000]);
}
