//! A tiny HTTP/1.1 server on loopback for tests: one thread per connection, keep-alive, a handler
//! from request to response. Stands in for an instance-metadata endpoint, a token endpoint or a
//! store's API where no real server can run offline.
#![allow(dead_code)] // each test file uses part of it

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

/// One request as the handler sees it.
pub struct Request {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// One response: status, extra headers, body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: Vec::new(), body: body.into() }
    }

    pub fn header(mut self, name: &str, value: impl ToString) -> Response {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

/// A running server; it lives as long as the test process (its threads are detached).
pub struct TinyHttp {
    pub port: u16,
}

impl TinyHttp {
    pub fn start(handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> TinyHttp {
        TinyHttp::start_at("127.0.0.1:0", handler)
    }

    /// On a given address (a fixed port, such as a metadata server's 80, in a private network namespace).
    pub fn start_at(address: &str, handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> TinyHttp {
        let listener = TcpListener::bind(address).unwrap_or_else(|e| panic!("bind {address}: {e}"));
        let port = listener.local_addr().unwrap().port();
        let handler = Arc::new(handler);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let handler = Arc::clone(&handler);
                std::thread::spawn(move || serve(stream, &*handler));
            }
        });
        TinyHttp { port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn serve(stream: TcpStream, handler: &(dyn Fn(&Request) -> Response + Send + Sync)) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let response = handler(&Request { method: method.clone(), target, headers, body });
        let mut head = format!("HTTP/1.1 {} X\r\nContent-Length: {}\r\n", response.status, response.body.len());
        for (name, value) in &response.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let body: &[u8] = if method == "HEAD" { &[] } else { &response.body };
        if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(body)).is_err() {
            return;
        }
    }
}

/// Parses `Range: bytes=first-last` against an object of `len` bytes.
pub fn parse_range(value: Option<&String>, len: usize) -> Option<(usize, usize)> {
    let spec = value?.strip_prefix("bytes=")?;
    let (first, last) = spec.split_once('-')?;
    let first: usize = first.parse().ok()?;
    let last: usize = last.parse::<usize>().ok().unwrap_or(len.saturating_sub(1)).min(len.saturating_sub(1));
    (first <= last).then_some((first, last))
}
