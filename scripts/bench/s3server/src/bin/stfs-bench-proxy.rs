//! The latency proxy of `scripts/bench/s3.py`: what remote.py's Python `LatencyProxy` models, for
//! less CPU. Each client connection gets its own thread and its own upstream connection
//! (HTTP/1.1 keep-alive); every request waits `--latency-ms` before it is forwarded, and each
//! connection's response bodies are paced to `--conn-mib-s` from the start of each body, as
//! object stores and CDNs limit what one connection delivers. Like the Python proxy it forwards
//! request heads only (GET and HEAD) and takes a body's length from Content-Length (none for
//! HEAD, 204 and 304). The Python proxy cost ~0.7 CPU-seconds per GiB relayed on the bench
//! machine, a fifth of everything the S3 benchmark's chain spent on 2 vCPUs.
//!
//! `stfs-bench-proxy UPSTREAM_PORT LATENCY_MS CONN_MIB_S [--count]` prints the port it listens on.
//! With `--count`, each line it then reads on stdin is answered on stdout with the response body
//! bytes relayed from the server so far: the origin's bytes (`scripts/bench/kubernetes.py`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes relayed per step of a body (then paced).
const PIECE: usize = 1 << 20;

/// The buffer a response head is read through (a body's first bytes may come along in it).
const HEAD_BUFFER: usize = 16 << 10;

/// Response body bytes relayed from the server, over every connection.
static RELAYED: AtomicU64 = AtomicU64::new(0);

/// Answers each line on stdin with [`RELAYED`] on stdout, until stdin ends.
fn report_relayed() {
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
        println!("{}", RELAYED.load(Ordering::Relaxed));
        std::io::stdout().flush().ok();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: stfs-bench-proxy UPSTREAM_PORT LATENCY_MS CONN_MIB_S [--count]";
    let (upstream, latency, rate, count) = match args.as_slice() {
        [upstream, latency, rate] => (upstream, latency, rate, false),
        [upstream, latency, rate, flag] if flag == "--count" => (upstream, latency, rate, true),
        _ => panic!("{usage}"),
    };
    let upstream: u16 = upstream.parse().expect(usage);
    let latency = Duration::from_secs_f64(latency.parse::<f64>().expect(usage) / 1000.0);
    let rate = rate.parse::<f64>().expect(usage) * (1 << 20) as f64;
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a loopback port");
    println!("{}", listener.local_addr().expect("the port").port());
    std::io::stdout().flush().ok();
    if count {
        std::thread::spawn(report_relayed);
    }
    for client in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = serve(client, upstream, latency, rate);
        });
    }
}

/// Reads one message head (up to the empty line); `None` at the end of the connection.
fn head(reader: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        if reader.read_until(b'\n', &mut head)? == 0 {
            return Ok(None);
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(head));
        }
    }
}

/// The Content-Length of a response head (0 if none).
fn content_length(head: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(head);
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}

fn serve(client: TcpStream, upstream_port: u16, latency: Duration, rate: f64) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let mut requests = BufReader::new(client.try_clone()?);
    let mut client = client;
    let mut upstream: Option<(TcpStream, BufReader<TcpStream>)> = None;
    let mut buf = vec![0u8; HEAD_BUFFER];
    let pipe = Pipe::new()?;
    while let Some(request) = head(&mut requests)? {
        std::thread::sleep(latency);
        if upstream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", upstream_port))?;
            stream.set_nodelay(true)?;
            let reader = BufReader::with_capacity(HEAD_BUFFER, stream.try_clone()?);
            upstream = Some((stream, reader));
        }
        let (to_server, responses) = upstream.as_mut().expect("connected above");
        to_server.write_all(&request)?;
        let Some(response) = head(responses)? else { return Ok(()) };
        let status = response.split(|&b| b == b' ').nth(1).unwrap_or(b"");
        let mut left = if request.starts_with(b"HEAD ") || status == b"204" || status == b"304" {
            0
        } else {
            content_length(&response)
        };
        client.write_all(&response)?;
        let (started, mut sent) = (Instant::now(), 0u64);
        while left > 0 {
            let want = left.min(PIECE as u64) as usize;
            // What the head's reader already holds goes by copy, the rest socket to socket
            // through the pipe (no copy through user space).
            let n = if responses.buffer().is_empty() {
                pipe.relay(to_server, &client, want)?
            } else {
                let n = responses.read(&mut buf[..want.min(HEAD_BUFFER)])?;
                client.write_all(&buf[..n])?;
                n
            };
            if n == 0 {
                return Ok(());
            }
            left -= n as u64;
            sent += n as u64;
            RELAYED.fetch_add(n as u64, Ordering::Relaxed);
            if rate > 0.0 {
                let due = Duration::from_secs_f64(sent as f64 / rate);
                if let Some(ahead) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
        }
    }
    Ok(())
}

/// A pipe that `splice` moves a body through, from the server's socket to the client's.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> std::io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors, which the OwnedFds then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: plain fcntl on a descriptor we own; a smaller pipe only means more steps.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIECE as libc::c_int) };
        Ok(Pipe { read, write })
    }

    /// Moves up to `want` bytes from `from` to `to`; 0 at the end of `from`.
    fn relay(&self, from: &TcpStream, to: &TcpStream, want: usize) -> std::io::Result<usize> {
        let moved = splice(from.as_raw_fd(), self.write.as_raw_fd(), want)?;
        let mut left = moved;
        while left > 0 {
            left -= splice(self.read.as_raw_fd(), to.as_raw_fd(), left)?;
        }
        Ok(moved)
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> std::io::Result<usize> {
    loop {
        // SAFETY: splice between descriptors we hold, no user memory involved.
        let n = unsafe {
            libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, libc::SPLICE_F_MOVE)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}
