//! A loopback HTTP/1.1 test server: serves one byte buffer with Range, ETag and Last-Modified, follows a
//! script of injected faults, redirects, refuses expired paths, and records every request it saw.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::util::lock;

/// One injected misbehaviour, used up by the next request that arrives.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    /// Answer with this status (and `Retry-After` seconds, if given) and an empty body.
    Status(u16, Option<u32>),
    /// Close the connection without answering.
    Drop,
    /// Send the headers and half of the body, then close.
    Truncate,
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// Wait this long, then answer with this status and an empty body (a slow failure).
    LateStatus(Duration, u16),
}

/// A request as the server saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub method: String,
    pub path: String,
    /// Header names in lower case, values as sent.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    /// The value of header `name` (lower case), if it was sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// What the server serves and how it misbehaves; tests change it between requests.
#[derive(Default)]
pub(crate) struct State {
    pub data: Vec<u8>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub faults: VecDeque<Fault>,
    /// Answer every GET with 200 and the whole object.
    pub ignore_range: bool,
    /// Path to `Location` value, answered with 302.
    pub redirects: HashMap<String, String>,
    /// Paths answered with 403 (an expired signed URL).
    pub refused: HashSet<String>,
    /// Sent as `Content-Encoding` with every body (which stays the object's bytes).
    pub content_encoding: Option<String>,
    /// Answer as if no precondition (`If-Match`, `If-Unmodified-Since`) had been sent.
    pub ignore_preconditions: bool,
    /// When set, data requests without exactly this Authorization value get 401.
    pub required_auth: Option<String>,
    pub seen: Vec<Seen>,
    /// Body bytes written to sockets (including those of 200 answers).
    pub body_bytes_sent: u64,
}

/// A running server on 127.0.0.1; stops accepting when dropped.
pub(crate) struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts serving `data` with a strong ETag and a Last-Modified date.
    pub fn start(data: Vec<u8>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State {
            data,
            etag: Some("\"v1\"".to_string()),
            last_modified: Some("Tue, 02 Jan 2024 03:04:05 GMT".to_string()),
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                for connection in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(connection) = connection else { continue };
                    let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
                    std::thread::spawn(move || serve_connection(connection, &state, &stop));
                }
            })
        };
        TestServer { addr, state, stop, acceptor: Some(acceptor) }
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Runs `change` on the server state under its lock.
    pub fn with<R>(&self, change: impl FnOnce(&mut State) -> R) -> R {
        change(&mut lock(&self.state))
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.with(|state| state.seen.clone())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Serves keep-alive requests on one connection until the client closes, a fault drops it, or the
/// server stops. A socket timeout bounds how long an idle connection thread lives.
fn serve_connection(connection: TcpStream, state: &Mutex<State>, stop: &AtomicBool) {
    let _ = connection.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(writer) = connection.try_clone() else {
        return;
    };
    let mut writer = writer;
    let mut reader = BufReader::new(connection);
    while !stop.load(Ordering::SeqCst) {
        let Some(request) = read_request(&mut reader) else {
            return;
        };
        if request.method == "CONNECT" {
            // Act as an HTTP CONNECT proxy to ourselves: the tunnel then carries ordinary requests.
            lock(state).seen.push(request);
            if writer.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
                return;
            }
            continue;
        }
        if !answer(&request, &mut writer, state) {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Seen> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    // Through a proxy (or in absolute form) the target is a full URL; keep only the path.
    let path = match target.find("://") {
        Some(at) => target[at + 3..].find('/').map_or("/".to_string(), |slash| target[at + 3 + slash..].to_string()),
        None => target,
    };
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Some(Seen { method, path, headers })
}

/// Writes the answer to one request; false when the connection must close.
fn answer(request: &Seen, writer: &mut TcpStream, state: &Mutex<State>) -> bool {
    let fault = {
        let mut state = lock(state);
        state.seen.push(request.clone());
        state.faults.pop_front()
    };
    let mut truncate = false;
    match fault {
        Some(Fault::Drop) => return false,
        Some(Fault::Delay(pause)) => std::thread::sleep(pause),
        Some(Fault::Status(status, retry_after)) => {
            let extra = retry_after.map(|s| format!("Retry-After: {s}\r\n")).unwrap_or_default();
            return write_head(writer, status, &format!("{extra}Content-Length: 0\r\n"));
        }
        Some(Fault::LateStatus(pause, status)) => {
            std::thread::sleep(pause);
            return write_head(writer, status, "Content-Length: 0\r\n");
        }
        Some(Fault::Truncate) => truncate = true,
        None => {}
    }
    let (head_status, head, body) = {
        let state = lock(state);
        match plan(request, &state) {
            Ok(plan) => plan,
            Err((status, extra)) => return write_head(writer, status, &format!("{extra}Content-Length: 0\r\n")),
        }
    };
    if !write_head(writer, head_status, &head) {
        return false;
    }
    let body = if truncate { &body[..body.len() / 2] } else { &body[..] };
    for chunk in body.chunks(64 * 1024) {
        if writer.write_all(chunk).is_err() {
            return false;
        }
        lock(state).body_bytes_sent += chunk.len() as u64;
    }
    !truncate
}

/// Decides status, headers and body for a data request, or an error status with extra headers.
#[allow(clippy::type_complexity)]
fn plan(request: &Seen, state: &State) -> Result<(u16, String, Vec<u8>), (u16, String)> {
    if state.refused.contains(&request.path) {
        return Err((403, String::new()));
    }
    if let Some(location) = state.redirects.get(&request.path) {
        return Err((302, format!("Location: {location}\r\n")));
    }
    if state.required_auth.is_some() && request.header("authorization") != state.required_auth.as_deref() {
        return Err((401, String::new()));
    }
    if let Some(wanted) = request.header("if-match").filter(|_| !state.ignore_preconditions) {
        if state.etag.as_deref() != Some(wanted) {
            return Err((412, String::new()));
        }
    }
    if let Some(wanted) = request.header("if-unmodified-since").filter(|_| !state.ignore_preconditions) {
        if state.last_modified.as_deref() != Some(wanted) {
            return Err((412, String::new()));
        }
    }
    let mut validators = String::new();
    if let Some(etag) = &state.etag {
        validators += &format!("ETag: {etag}\r\n");
    }
    if let Some(modified) = &state.last_modified {
        validators += &format!("Last-Modified: {modified}\r\n");
    }
    if let Some(coding) = &state.content_encoding {
        validators += &format!("Content-Encoding: {coding}\r\n");
    }
    let len = state.data.len() as u64;
    let range = request.header("range").filter(|_| !state.ignore_range).and_then(|value| {
        let (first, last) = value.strip_prefix("bytes=")?.split_once('-')?;
        Some((first.parse::<u64>().ok()?, last.parse::<u64>().ok()?))
    });
    let Some((first, last)) = range else {
        let head = format!("{validators}Content-Length: {len}\r\n");
        return Ok((200, head, state.data.clone()));
    };
    if first >= len {
        return Err((416, format!("Content-Range: bytes */{len}\r\n")));
    }
    let last = last.min(len - 1);
    let body = state.data[first as usize..=last as usize].to_vec();
    let head = format!("{validators}Content-Range: bytes {first}-{last}/{len}\r\nContent-Length: {}\r\n", body.len());
    Ok((206, head, body))
}

fn write_head(writer: &mut TcpStream, status: u16, headers: &str) -> bool {
    let head = format!("HTTP/1.1 {status} Test\r\n{headers}\r\n");
    writer.write_all(head.as_bytes()).is_ok()
}
