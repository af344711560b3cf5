//! A scripted HTTP/1.1 server on loopback for tests: serves a few objects with byte ranges, or
//! misbehaves on command: accepts and never answers, trickles its answer a byte at a time, answers
//! a `Content-Range` without a range (`bytes */N`), a range other than the one asked for, or a
//! status. Plain std: a listener thread and one thread per connection.
//!
//! The mode is read when a request arrives, so a test switches it while a mount is live. Every
//! thread polls a stop flag at least every 50 ms and [`ScriptedServer`]'s `Drop` joins them all:
//! a test leaves no server running, whatever state its connections were left in.

#![allow(dead_code)] // shared by several test binaries, each using part of it

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the server answers the next request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `206 Partial Content` for exactly the range asked for, with a strong ETag.
    Serve,
    /// Reads the request and never answers (the connection stays open).
    Silent,
    /// The correct answer, one byte per interval (head and body alike).
    Trickle(Duration),
    /// The head of the correct answer at once, then the body one byte per interval.
    TrickleBody(Duration),
    /// `206` with `Content-Range: bytes */N` and no body.
    StarRange,
    /// `206` for a range one byte off the one asked for (with a body of the asked length).
    WrongRange,
    /// This status with an empty body.
    Status(u16),
}

/// What the threads share.
struct Shared {
    objects: Mutex<BTreeMap<String, Arc<Vec<u8>>>>,
    mode: Mutex<Mode>,
    /// Modes for single paths, over the general one.
    path_modes: Mutex<BTreeMap<String, Mode>>,
    stop: AtomicBool,
    requests: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A running scripted server; stopped (every thread joined) when dropped.
pub struct ScriptedServer {
    /// Port on 127.0.0.1.
    pub port: u16,
    shared: Arc<Shared>,
    listener: Option<JoinHandle<()>>,
}

/// How often every thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(50);

impl ScriptedServer {
    /// Listens on a free loopback port, serving nothing yet, in [`Mode::Serve`].
    pub fn start() -> ScriptedServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            objects: Mutex::new(BTreeMap::new()),
            mode: Mutex::new(Mode::Serve),
            path_modes: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
        });
        let in_thread = Arc::clone(&shared);
        let listener = std::thread::spawn(move || accept_loop(listener, in_thread));
        ScriptedServer { port, shared, listener: Some(listener) }
    }

    /// Serves `bytes` at `/path`.
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.shared.objects.lock().unwrap().insert(path.trim_start_matches('/').to_string(), Arc::new(bytes));
    }

    /// The URL of `/path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, path.trim_start_matches('/'))
    }

    /// `127.0.0.1:PORT`, as messages name the server.
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Changes how later requests are answered.
    pub fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Answers requests for `/path` in `mode`, whatever the general mode is.
    pub fn set_mode_for(&self, path: &str, mode: Mode) {
        self.shared.path_modes.lock().unwrap().insert(path.trim_start_matches('/').to_string(), mode);
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(SeqCst)
    }
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        if let Some(listener) = self.listener.take() {
            let _ = listener.join();
        }
        let threads = std::mem::take(&mut *self.shared.threads.lock().unwrap());
        for thread in threads {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let in_thread = Arc::clone(&shared);
                let handle = std::thread::spawn(move || {
                    let _ = serve_connection(stream, &in_thread);
                });
                shared.threads.lock().unwrap().push(handle);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Sleeps `total` in slices, giving up early (false) once the server is stopping.
fn pause(shared: &Shared, total: Duration) -> bool {
    let until = Instant::now() + total;
    while Instant::now() < until {
        if shared.stop.load(SeqCst) {
            return false;
        }
        std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
    }
    !shared.stop.load(SeqCst)
}

/// Reads one request head; None at the end of the connection or when stopping.
fn read_head(stream: &mut TcpStream, shared: &Shared) -> io::Result<Option<String>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if shared.stop.load(SeqCst) {
            return Ok(None);
        }
        match stream.read(&mut byte) {
            Ok(0) => return Ok(None),
            Ok(_) => head.push(byte[0]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(String::from_utf8_lossy(&head).into_owned()))
}

/// The `Range: bytes=a-b` of a request, if any.
fn range_of(head: &str) -> Option<(u64, u64)> {
    let line = head.lines().find(|l| l.to_ascii_lowercase().starts_with("range:"))?;
    let spec = line.split_once('=')?.1.trim();
    let (a, b) = spec.split_once('-')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

fn serve_connection(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(POLL))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    while let Some(head) = read_head(&mut stream, shared)? {
        shared.requests.fetch_add(1, SeqCst);
        let path = head.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
        let general = shared.mode.lock().unwrap().clone();
        let mode = shared.path_modes.lock().unwrap().get(&path).cloned().unwrap_or(general);
        let object = shared.objects.lock().unwrap().get(&path).cloned();
        let Some(object) = object else {
            stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        };
        let size = object.len() as u64;
        let (first, last) = range_of(&head).unwrap_or((0, size.saturating_sub(1)));
        let last = last.min(size.saturating_sub(1));
        let body = object.get(first as usize..=last as usize).unwrap_or_default();
        let partial = |range: &str, length: usize| {
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {range}/{size}\r\nContent-Length: {length}\r\n\
                 ETag: \"scripted-v1\"\r\nAccept-Ranges: bytes\r\n\r\n"
            )
        };
        match mode {
            Mode::Serve => {
                stream.write_all(partial(&format!("{first}-{last}"), body.len()).as_bytes())?;
                stream.write_all(body)?;
            }
            Mode::Silent => {
                while pause(shared, POLL) {}
                return Ok(());
            }
            Mode::Trickle(every) | Mode::TrickleBody(every) => {
                let head = partial(&format!("{first}-{last}"), body.len());
                let whole = [head.as_bytes(), body].concat();
                let at_once = if matches!(mode, Mode::TrickleBody(_)) { head.len() } else { 0 };
                stream.write_all(&whole[..at_once])?;
                for byte in &whole[at_once..] {
                    if !pause(shared, every) {
                        return Ok(());
                    }
                    stream.write_all(std::slice::from_ref(byte))?;
                }
            }
            Mode::StarRange => stream.write_all(partial("*", 0).as_bytes())?,
            Mode::WrongRange => {
                let (a, b) = if last + 1 < size { (first + 1, last + 1) } else { (first - 1, last - 1) };
                stream.write_all(partial(&format!("{a}-{b}"), body.len()).as_bytes())?;
                stream.write_all(body)?;
            }
            Mode::Status(status) => {
                stream.write_all(format!("HTTP/1.1 {status} Scripted\r\nContent-Length: 0\r\n\r\n").as_bytes())?;
            }
        }
    }
    Ok(())
}
