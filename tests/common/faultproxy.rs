//! A small fault-injecting HTTP/1.1 proxy for tests: sits between stfs and nginx on loopback and,
//! on command, adds latency, drops connections, answers 503, strips `Range` (a server that ignores
//! it) or fails every request. Plain std: a listener thread and one thread per client connection,
//! each with its own keep-alive connection upstream.
//!
//! Knobs are atomics, so a test flips them while a mount is live. `bytes_to_client` counts body and
//! head bytes actually written to stfs, which bounds what a refused download really cost.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The faults to inject, changeable at any time.
#[derive(Default)]
pub struct Knobs {
    /// Milliseconds added before each request is forwarded.
    pub latency_ms: AtomicU64,
    /// The next N requests: the connection is closed without any answer (a reset).
    pub reset_next: AtomicU32,
    /// The next N requests: the answer's head and part of its body are sent, then the connection closes.
    pub truncate_next: AtomicU32,
    /// The next N requests are answered `503 Service Unavailable` (a burst).
    pub fail_503_next: AtomicU32,
    /// While set, every request is answered 503 (an outage).
    pub fail_503_all: AtomicBool,
    /// While set, the `Range` header is removed, so nginx answers 200 with the whole object.
    pub strip_range: AtomicBool,
    /// Requests received.
    pub requests: AtomicU64,
    /// Bytes written to clients (heads and bodies).
    pub bytes_to_client: AtomicU64,
    /// Requests being answered right now (latency included).
    pub in_flight: AtomicU64,
    /// The most requests ever answered at once.
    pub peak_in_flight: AtomicU64,
}

/// Counts one request in flight for as long as it lives.
struct InFlight<'a>(&'a Knobs);

impl<'a> InFlight<'a> {
    fn enter(knobs: &'a Knobs) -> InFlight<'a> {
        let now = knobs.in_flight.fetch_add(1, SeqCst) + 1;
        knobs.peak_in_flight.fetch_max(now, SeqCst);
        InFlight(knobs)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// A running proxy; it lives as long as the test process (its threads end with their sockets).
pub struct FaultProxy {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// The fault switches.
    pub knobs: Arc<Knobs>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let knobs = Arc::new(Knobs::default());
        let shared = Arc::clone(&knobs);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let knobs = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let _ = serve_connection(client, upstream_port, &knobs);
                });
            }
        });
        FaultProxy { port, knobs }
    }

    /// The proxied URL of a file nginx serves.
    pub fn url(&self, file: &str) -> String {
        format!("http://127.0.0.1:{}/{file}", self.port)
    }
}

/// Takes one from a countdown; true if it was positive.
fn take(counter: &AtomicU32) -> bool {
    counter.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// Reads a head (request or response) up to the blank line; None at a clean end of stream.
fn read_head(reader: &mut impl BufRead) -> io::Result<Option<Vec<String>>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return if lines.is_empty() { Ok(None) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            return Ok(Some(lines));
        }
        lines.push(line);
    }
}

fn header<'a>(head: &'a [String], name: &str) -> Option<&'a str> {
    head.iter().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn write_counted(client: &mut TcpStream, bytes: &[u8], knobs: &Knobs) -> io::Result<()> {
    client.write_all(bytes)?;
    knobs.bytes_to_client.fetch_add(bytes.len() as u64, SeqCst);
    Ok(())
}

fn serve_connection(client: TcpStream, upstream_port: u16, knobs: &Knobs) -> io::Result<()> {
    let mut requests = BufReader::new(client.try_clone()?);
    let mut client = client;
    let mut upstream: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while let Some(mut head) = read_head(&mut requests)? {
        knobs.requests.fetch_add(1, SeqCst);
        let _in_flight = InFlight::enter(knobs);
        let latency = knobs.latency_ms.load(SeqCst);
        if latency > 0 {
            std::thread::sleep(Duration::from_millis(latency));
        }
        if take(&knobs.reset_next) {
            return client.shutdown(Shutdown::Both);
        }
        if knobs.fail_503_all.load(SeqCst) || take(&knobs.fail_503_next) {
            write_counted(&mut client, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", knobs)?;
            continue;
        }
        if knobs.strip_range.load(SeqCst) {
            head.retain(|line| !line.to_ascii_lowercase().starts_with("range:"));
        }
        let truncate = take(&knobs.truncate_next);
        if upstream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", upstream_port))?;
            upstream = Some((stream.try_clone()?, BufReader::new(stream)));
        }
        let (up_write, up_read) = upstream.as_mut().unwrap();
        let mut request = head.join("\r\n");
        request.push_str("\r\n\r\n");
        up_write.write_all(request.as_bytes())?;
        let response = read_head(up_read)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let length: Option<u64> = header(&response, "content-length").and_then(|v| v.parse().ok());
        let mut out = response.join("\r\n");
        out.push_str("\r\n\r\n");
        write_counted(&mut client, out.as_bytes(), knobs)?;
        let Some(length) = length else {
            // No length: the body runs to the end of the upstream connection (not sent by nginx for
            // static files, kept for completeness).
            let mut rest = Vec::new();
            up_read.read_to_end(&mut rest)?;
            write_counted(&mut client, &rest, knobs)?;
            return client.shutdown(Shutdown::Both);
        };
        let limit = if truncate { length / 2 } else { length };
        let mut body = up_read.by_ref().take(limit);
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = body.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            write_counted(&mut client, &chunk[..n], knobs)?;
        }
        if truncate {
            return client.shutdown(Shutdown::Both);
        }
    }
    Ok(())
}
