//! `--metrics-addr`: a minimal HTTP/1.1 listener on loopback that answers `GET /metrics` with the
//! mount's counters in the Prometheus text format. One thread, one connection at a time, each
//! bounded in size and time; it reads only the counters' atomics, so it never waits on (nor holds
//! up) a FUSE thread.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use log::debug;

use crate::stats::prometheus;

/// The most a request (line and headers) may take; a longer one is answered 431 unread.
const MAX_REQUEST: usize = 8 << 10;

/// The most time one connection may take, reading and writing, before it is dropped.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);

/// Answers connections on `listener` with the text of `metrics` until `stopped` says so (checked
/// after each accept: whoever stops it connects once to wake the accept).
pub(crate) fn serve(listener: TcpListener, metrics: &dyn Fn() -> String, stopped: &dyn Fn() -> bool) {
    for connection in listener.incoming() {
        if stopped() {
            return;
        }
        match connection {
            Ok(stream) => {
                if let Err(e) = answer(stream, metrics) {
                    debug!("metrics listener: {e}");
                }
            }
            // Out of descriptors, or an aborted connection: do not spin.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Reads one request and writes its answer.
fn answer(mut stream: TcpStream, metrics: &dyn Fn() -> String) -> io::Result<()> {
    let deadline = Instant::now() + CONNECTION_DEADLINE;
    let request = read_request(&mut stream, deadline)?;
    let (status, content_type, body) = reply_to(request.as_deref(), metrics);
    let head_only = request.as_deref().is_some_and(|r| r.starts_with("HEAD "));
    stream.set_write_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))?;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()?;
    if request.is_none() {
        // The rest of a request too large to read: closing with it unread would reset the
        // connection and could lose the answer, so it is read (until the deadline) and dropped.
        stream.shutdown(Shutdown::Write)?;
        let mut sink = [0u8; 4096];
        while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            stream.set_read_timeout(Some(left))?;
            if stream.read(&mut sink)? == 0 {
                break;
            }
        }
    }
    Ok(())
}

/// The request's line and headers, up to the blank line; `None` if they exceed [`MAX_REQUEST`].
fn read_request(stream: &mut TcpStream, deadline: Instant) -> io::Result<Option<String>> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::from(io::ErrorKind::TimedOut));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[len..])? {
            0 => break,
            n => len += n,
        }
    }
    Ok(Some(String::from_utf8_lossy(&buf[..len]).into_owned()))
}

/// Status line, content type and body for a request (`None`: too large).
fn reply_to(request: Option<&str>, metrics: impl FnOnce() -> String) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let Some(request) = request else {
        return ("431 Request Header Fields Too Large", TEXT, "request too large\n".into());
    };
    let mut words = request.lines().next().unwrap_or("").split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", prometheus::CONTENT_TYPE, metrics()),
        ("GET" | "HEAD", _) => ("404 Not Found", TEXT, "stfs serves /metrics only\n".into()),
        _ => ("405 Method Not Allowed", TEXT, "GET /metrics only\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;

    use super::*;

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(request).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn answers_metrics_and_nothing_else_and_a_silent_client_holds_it_up_only_so_long() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let server = std::thread::spawn(move || {
            serve(listener, &|| "stfs_cache_hits_total 5\n".to_string(), &|| flag.load(Relaxed))
        });
        let reply = exchange(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{reply}");
        assert!(reply.ends_with("\r\n\r\nstfs_cache_hits_total 5\n"), "{reply}");
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())), "{head}");
        assert!(exchange(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        let head = exchange(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(exchange(addr, &vec![b'a'; MAX_REQUEST + 10]).starts_with("HTTP/1.1 431 "));
        // A client that says nothing is dropped at the deadline; the next one is then answered.
        let silent = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        let reply = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(started.elapsed() < CONNECTION_DEADLINE + Duration::from_secs(3), "{:?}", started.elapsed());
        drop(silent);
        stop.store(true, Relaxed);
        let _ = TcpStream::connect(addr);
        server.join().unwrap();
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "still listening");
    }
}
