//! [`HttpSource`]: a remote object pinned by its opening request, and its readers, each with its
//! own agent, reading one ranged GET per run of blocks and checking every answer against the pin.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::SystemTime;

use ureq::http::header::{CONTENT_LENGTH, CONTENT_RANGE};
use ureq::http::Response;
use ureq::{Agent, Body};

use super::client::{Failure, Remote};
use super::error::HttpError;
use super::options::HttpOptions;
use super::pin::{self, parse_content_range, Pin};
use crate::source::{read_joined, Source, SourceReader};
use crate::stats::Stats;

/// A remote object pinned at open time; streams read it with one ranged GET per block.
pub struct HttpSource {
    remote: Arc<Remote>,
    pin: Arc<Pin>,
    prefix: Arc<[u8]>,
}

impl HttpSource {
    /// Opens `url`: one speculative ranged GET for the first `options.prefix_len` bytes, which pins
    /// the object's size and version. Fails for servers that ignore `Range` (without downloading the
    /// object), for HTTP errors, and after the retry policy is exhausted on transient failures.
    pub fn open(url: &str, options: HttpOptions) -> Result<HttpSource, HttpError> {
        HttpSource::open_named(url, None, options)
    }

    /// [`HttpSource::open`], calling the object `name` in messages and in the mount (an object
    /// store's `s3://BUCKET/KEY` rather than the endpoint URL it is read through).
    pub fn open_named(url: &str, name: Option<&str>, options: HttpOptions) -> Result<HttpSource, HttpError> {
        let remote = Arc::new(Remote::new(url, name, &options)?);
        let agent = remote.new_agent();
        let prefix_len = u64::from(options.prefix_len.max(1));
        let (prefix, pin) = remote.with_retries(|| fetch_prefix(&remote, &agent, prefix_len))?;
        if pin.etag.is_none() && pin.last_modified.is_none() {
            log::warn!(
                "{}: the server sends neither ETag nor Last-Modified; only a change of size can be detected",
                remote.name
            );
        }
        log::info!("{}: {} bytes, pinned by {:?}", remote.name, pin.size, pin.precondition().map(|p| p.0));
        Ok(HttpSource { remote, pin: Arc::new(pin), prefix: prefix.into() })
    }

    /// The bytes fetched by the opening request (the object's start, up to `prefix_len` bytes):
    /// streams serve reads inside it without a request, so header parsing costs at most one more.
    pub fn header_prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The pinned entity tag, if the server sent one.
    pub fn etag(&self) -> Option<&str> {
        self.pin.etag.as_deref()
    }

    /// The pinned Last-Modified time, if the server sent a parseable one (for the mount's attributes).
    pub fn modified_time(&self) -> Option<SystemTime> {
        self.pin.modified_time()
    }
}

impl fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSource")
            .field("name", &self.remote.name)
            .field("len", &self.pin.size)
            .field("etag", &self.pin.etag)
            .field("last_modified", &self.pin.last_modified)
            .finish()
    }
}

impl Source for HttpSource {
    fn modified(&self) -> Option<SystemTime> {
        self.modified_time()
    }
    fn len(&self) -> u64 {
        self.pin.size
    }

    fn name(&self) -> &str {
        &self.remote.name
    }

    fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
        Ok(Box::new(HttpStream {
            remote: Arc::clone(&self.remote),
            pin: Arc::clone(&self.pin),
            prefix: Arc::clone(&self.prefix),
            agent: self.remote.new_agent(),
        }))
    }
}

/// One reader of an [`HttpSource`] with its own agent, hence its own keep-alive connection.
struct HttpStream {
    remote: Arc<Remote>,
    pin: Arc<Pin>,
    prefix: Arc<[u8]>,
    agent: Agent,
}

impl SourceReader for HttpStream {
    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = u64::try_from(buf.len()).ok().and_then(|len| offset.checked_add(len));
        if end.is_none_or(|end| end > self.pin.size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: read of {} bytes at {offset} is past the end ({} bytes)",
                    self.remote.name,
                    buf.len(),
                    self.pin.size
                ),
            ));
        }
        // Serve what the opening request already fetched, then fetch only the rest.
        let from_prefix = usize::try_from(offset)
            .ok()
            .and_then(|start| self.prefix.get(start..))
            .map_or(0, |available| available.len().min(buf.len()));
        if from_prefix > 0 {
            let start = offset as usize; // fits: it indexed the prefix above
            buf[..from_prefix].copy_from_slice(&self.prefix[start..start + from_prefix]);
        }
        let rest = &mut buf[from_prefix..];
        if rest.is_empty() {
            return Ok(());
        }
        let rest_offset = offset + from_prefix as u64;
        self.fetch(&mut [rest], rest_offset)
    }

    /// One ranged GET whose body goes straight into the blocks' buffers, one after the other
    /// (the default would join them in a temporary buffer and copy out).
    fn read_vectored_exact_at(&mut self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let end = offset.checked_add(total as u64);
        let from_prefix = offset < self.prefix.len() as u64;
        if bufs.len() < 2 || total == 0 || from_prefix || end.is_none_or(|end| end > self.pin.size) {
            // Single buffers, ranges the opening request already holds and errors: the plain path.
            return read_joined(self, bufs, offset);
        }
        self.fetch(bufs, offset)
    }

    // `read_blocks_at` keeps the default: the blocks of a GET land together once its body is in.
    // Landing them one by one as the body arrives was measured on loopback (remote.py) and only
    // added wake-ups: the reader then competes with the transfer for the same CPUs.
}

impl HttpStream {
    /// Fetches `offset..offset + total length of bufs` (inside the object) into `bufs`, with retries.
    fn fetch(&mut self, bufs: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let (remote, agent, pin) = (&self.remote, &self.agent, &self.pin);
        remote.with_retries(|| fetch_range(remote, agent, pin, bufs, offset)).map_err(io::Error::from)
    }
}

/// One try at the opening request: the first `prefix_len` bytes, the total size and the pin.
fn fetch_prefix(remote: &Remote, agent: &Agent, prefix_len: u64) -> Result<(Vec<u8>, Pin), Failure> {
    let response = remote.get_range(agent, 0, prefix_len - 1, None)?;
    match response.status().as_u16() {
        206 => {
            let content_range = content_range(remote, &response)?;
            let total = content_range
                .total
                .ok_or_else(|| Failure::permanent(remote.protocol("Content-Range gives no total size".to_string())))?;
            let (first, last) = content_range.range.unwrap_or((1, 0));
            if first != 0 || last >= prefix_len {
                let detail = format!("asked for bytes 0-{}, got {first}-{last}", prefix_len - 1);
                return Err(Failure::permanent(remote.protocol(detail)));
            }
            let pin = Pin::from_headers(total, response.headers());
            let mut prefix = vec![0; last as usize + 1]; // last < prefix_len, a u32
            read_body_exact(remote, response, &mut [&mut prefix])?;
            Ok((prefix, pin))
        }
        200 => {
            // The whole object is coming. Accept it only if it fits in the prefix; otherwise drop the
            // connection now rather than download a multi-gigabyte body.
            let declared = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|length| length > prefix_len) {
                return Err(Failure::permanent(HttpError::RangeUnsupported { name: remote.name.clone() }));
            }
            let headers = response.headers().clone();
            let mut whole = Vec::new();
            let mut reader = response.into_body().into_reader().take(prefix_len + 1);
            reader.read_to_end(&mut whole).map_err(|e| remote.body_failure(e))?;
            Stats::add(&remote.stats.http_bytes, whole.len() as u64);
            if whole.len() as u64 > prefix_len {
                return Err(Failure::permanent(HttpError::RangeUnsupported { name: remote.name.clone() }));
            }
            let pin = Pin::from_headers(whole.len() as u64, &headers);
            Ok((whole, pin))
        }
        416 => match content_range(remote, &response)?.total {
            Some(0) => Ok((Vec::new(), Pin::from_headers(0, response.headers()))),
            _ => Err(Failure::permanent(remote.protocol("416 for the first bytes of a non-empty object".to_string()))),
        },
        _ => Err(remote.status_failure(response)),
    }
}

/// One try at reading `buf.len()` bytes at `offset`, checked against the pin.
fn fetch_range(remote: &Remote, agent: &Agent, pin: &Pin, bufs: &mut [&mut [u8]], offset: u64) -> Result<(), Failure> {
    let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let last = offset + len - 1; // callers checked 0 < len and offset + len <= size
    let response = open_range(remote, agent, pin, offset, last)?;
    read_body_exact(remote, response, bufs)
}

/// Sends the ranged GET for bytes `offset..=last` of the pinned object and checks the answer: a
/// 206 for exactly that range of the same object, ready for its body to be read.
fn open_range(remote: &Remote, agent: &Agent, pin: &Pin, offset: u64, last: u64) -> Result<Response<Body>, Failure> {
    let response = remote.get_range(agent, offset, last, Some(pin))?;
    match response.status().as_u16() {
        206 => {}
        200 => return Err(Failure::permanent(HttpError::RangeUnsupported { name: remote.name.clone() })),
        _ => return Err(remote.status_failure(response)),
    }
    if let Err(mismatch) = pin.check(response.headers()) {
        return Err(Failure::permanent(remote.changed(mismatch.to_string())));
    }
    let content_range = content_range(remote, &response)?;
    match content_range.total {
        Some(total) if total != pin.size => {
            return Err(Failure::permanent(remote.changed(format!("its size is now {total}, was {}", pin.size))));
        }
        None => return Err(Failure::permanent(remote.protocol("Content-Range gives no total size".to_string()))),
        Some(_) => {}
    }
    if content_range.range != Some((offset, last)) {
        let detail = format!("asked for bytes {offset}-{last}, got {:?}", content_range.range);
        return Err(Failure::permanent(remote.protocol(detail)));
    }
    Ok(response)
}

/// The parsed Content-Range of a response, or a protocol failure.
fn content_range(remote: &Remote, response: &Response<Body>) -> Result<pin::ContentRange, Failure> {
    let text = pin::header_text(response.headers(), &CONTENT_RANGE);
    text.as_deref()
        .and_then(parse_content_range)
        .ok_or_else(|| Failure::permanent(remote.protocol(format!("bad or missing Content-Range {text:?}"))))
}

/// Fills `buf` from the body and checks that nothing follows (a longer body means a confused server).
fn read_body_exact(remote: &Remote, response: Response<Body>, bufs: &mut [&mut [u8]]) -> Result<(), Failure> {
    let mut reader = response.into_body().into_reader();
    for buf in bufs.iter_mut() {
        reader.read_exact(buf).map_err(|e| remote.body_failure(e))?;
        Stats::add(&remote.stats.http_bytes, buf.len() as u64);
    }
    expect_body_end(remote, &mut reader)
}

/// Checks that a body holds nothing past the promised bytes; reading to its end also lets the
/// agent put the connection back into its pool.
fn expect_body_end(remote: &Remote, reader: &mut impl Read) -> Result<(), Failure> {
    // Reading to the end also lets the agent put the connection back into its pool. An error here
    // comes after every promised byte arrived, so the data stands.
    let mut probe = [0u8; 1];
    if let Ok(1) = reader.read(&mut probe) {
        return Err(Failure::permanent(remote.protocol("the body is longer than its Content-Range".to_string())));
    }
    Ok(())
}
