//! [`HttpSource`]: a remote object pinned by its opening request, and its readers, each with its
//! own agent, reading one ranged GET per run of blocks and checking every answer against the pin.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use ureq::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE};
use ureq::http::Response;
use ureq::{Agent, Body, ResponseExt};

use super::client::{Failure, Remote, REPEAT_BUDGET};
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
        let listed = listed_pin(&remote, options.listed_etag.as_deref())?;
        let (prefix, pin) =
            remote.with_retries(|deadline| fetch_prefix(&remote, &agent, prefix_len, listed.as_ref(), deadline))?;
        if let Some(listed) = &listed {
            // A store that ignores If-Match: the answer's own ETag tells.
            listed.check(&pin.etag_headers()).map_err(|_| {
                let (was, now) = (pin::shown_validator(listed.etag.as_ref().unwrap()), pin.shown_etag());
                remote.changed(format!("listed with ETag {was}, opened with {now}"))
            })?;
        }
        if pin.etag.is_none() && pin.last_modified.is_none() {
            log::warn!(
                "{}: the server sends neither ETag nor Last-Modified; only a change of size can be detected",
                remote.name
            );
        }
        let pinned_by = match (&pin.etag, &pin.last_modified) {
            (Some(etag), _) => format!("ETag {}", pin::shown_validator(etag)),
            (None, Some(modified)) => format!("Last-Modified {}", pin::shown_validator(modified)),
            (None, None) => "its size only".to_string(),
        };
        log::info!("{}: {} bytes, pinned by {pinned_by}", remote.name, pin.size);
        Ok(HttpSource { remote, pin: Arc::new(pin), prefix: prefix.into() })
    }

    /// Ends the opening begun with a [`HttpOptions::deadline`]: from now on each read has its own
    /// timeout. Checkpoint opening calls it once the source's header is read.
    pub fn opened(&self) {
        self.remote.opened();
    }

    /// The bytes fetched by the opening request (the object's start, up to `prefix_len` bytes):
    /// streams serve reads inside it without a request, so header parsing costs at most one more.
    pub fn header_prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The pinned entity tag, if the server sent one (bytes outside printable ASCII escaped).
    pub fn etag(&self) -> Option<String> {
        self.pin.etag.as_ref().map(pin::shown_validator)
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
    fn remote(&self) -> bool {
        true
    }
    fn modified(&self) -> Option<SystemTime> {
        self.modified_time()
    }
    fn opening_bytes(&self) -> &[u8] {
        &self.prefix
    }
    fn len(&self) -> u64 {
        self.pin.size
    }

    /// The URL with the pinned size, ETag and Last-Modified. Cacheable only with a strong ETag or
    /// a Last-Modified: a weak ETag alone does not promise the same bytes, and a size alone does
    /// not tell versions apart.
    fn cache_identity(&self) -> Option<String> {
        let pin = &self.pin;
        let strong = pin.etag.as_ref().is_some_and(|e| !e.as_bytes().starts_with(b"W/"));
        if !strong && pin.last_modified.is_none() {
            return None;
        }
        let shown = |value: &Option<_>| value.as_ref().map_or_else(|| "-".to_string(), pin::shown_validator);
        let (etag, modified) = (shown(&pin.etag), shown(&pin.last_modified));
        Some(format!("http:{}\nsize={}\netag={etag}\nlast-modified={modified}", self.remote.identity_url(), pin.size))
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
                format!("read of {} bytes at {offset} is past the end ({} bytes)", buf.len(), self.pin.size),
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
        let range = (offset, offset + bufs.iter().map(|b| b.len() as u64).sum::<u64>() - 1);
        let attempt = |deadline| fetch_range(remote, agent, pin, bufs, offset, deadline);
        let result = if remote.repeats_a_failure(range) {
            remote.with_retries_within(REPEAT_BUDGET.min(remote.timeout()), 1, attempt)
        } else {
            remote.with_retries(attempt)
        };
        if result.is_err() {
            remote.note_failure(range);
        }
        result.map_err(io::Error::from)
    }
}

/// The version a listing gave the object, as a pin whose precondition the opening request carries
/// (`None`: the opening pins what it finds).
fn listed_pin(remote: &Remote, etag: Option<&str>) -> Result<Option<Pin>, HttpError> {
    let Some(etag) = etag else { return Ok(None) };
    let value = ureq::http::HeaderValue::from_str(etag)
        .map_err(|_| remote.protocol("the listing gave an ETag that is not a header value".to_string()))?;
    Ok(Some(Pin { size: 0, etag: Some(value), last_modified: None }))
}

/// One try at the opening request: the first `prefix_len` bytes, the total size and the pin; with
/// `listed`, only the version listed (`If-Match`).
fn fetch_prefix(
    remote: &Remote,
    agent: &Agent,
    prefix_len: u64,
    listed: Option<&Pin>,
    deadline: Instant,
) -> Result<(Vec<u8>, Pin), Failure> {
    let response = remote.get_range(agent, 0, prefix_len - 1, listed, deadline)?;
    match response.status().as_u16() {
        206 => {
            let content_range = content_range(remote, &response)?;
            let total = content_range
                .total
                .ok_or_else(|| Failure::permanent(remote.protocol("Content-Range gives no total size".to_string())))?;
            let last = match content_range.range {
                Some((0, last)) if last < prefix_len => last,
                other => {
                    let detail = format!("asked for bytes 0-{}, got {}", prefix_len - 1, shown_range(other, total));
                    return Err(Failure::permanent(remote.protocol(detail)));
                }
            };
            expect_identity(remote, &response)?;
            let pin = Pin::from_headers(total, response.headers());
            let mut prefix = vec![0; last as usize + 1]; // last < prefix_len, a u32
            read_body_exact(remote, response, &mut [&mut prefix], 0)?;
            Ok((prefix, pin))
        }
        200 => {
            // The whole object is coming. Accept it only if it fits in the prefix; otherwise drop the
            // connection now rather than download a multi-gigabyte body.
            let declared = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|length| length > prefix_len) {
                return Err(Failure::permanent(HttpError::RangeUnsupported { name: remote.name.clone() }));
            }
            expect_identity(remote, &response)?;
            let headers = response.headers().clone();
            let response_uri = response.get_uri().clone();
            let mut whole = Vec::new();
            let mut reader = response.into_body().into_reader().take(prefix_len + 1);
            let uri = response_uri.clone();
            let arrived = |whole: &Vec<u8>| whole.len() as u64;
            if let Err(e) = reader.read_to_end(&mut whole) {
                return Err(remote.body_failure(e, &uri, (0, prefix_len - 1), arrived(&whole)));
            }
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

/// One try at reading `buf.len()` bytes at `offset`, checked against the pin, by `deadline`.
fn fetch_range(
    remote: &Remote,
    agent: &Agent,
    pin: &Pin,
    bufs: &mut [&mut [u8]],
    offset: u64,
    deadline: Instant,
) -> Result<(), Failure> {
    let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let last = offset + len - 1; // callers checked 0 < len and offset + len <= size
    let response = open_range(remote, agent, pin, (offset, last), deadline)?;
    read_body_exact(remote, response, bufs, offset)
}

/// A Content-Range's range in words: `bytes 5-9`, or what `bytes */N` means.
fn shown_range(range: Option<(u64, u64)>, total: u64) -> String {
    match range {
        Some((first, last)) => format!("bytes {first}-{last}"),
        None => format!("no byte range (Content-Range: bytes */{total}) in a 206 answer"),
    }
}

/// Sends the ranged GET for bytes `offset..=last` of the pinned object and checks the answer: a
/// 206 for exactly that range of the same object, ready for its body to be read.
fn open_range(
    remote: &Remote,
    agent: &Agent,
    pin: &Pin,
    (offset, last): (u64, u64),
    deadline: Instant,
) -> Result<Response<Body>, Failure> {
    let response = remote.get_range(agent, offset, last, Some(pin), deadline)?;
    match response.status().as_u16() {
        206 => {}
        200 => return Err(Failure::permanent(HttpError::RangeUnsupported { name: remote.name.clone() })),
        _ => return Err(remote.status_failure(response)),
    }
    if let Err(mismatch) = pin.check(response.headers()) {
        return Err(Failure::permanent(remote.changed(mismatch.to_string())));
    }
    expect_identity(remote, &response)?;
    let content_range = content_range(remote, &response)?;
    match content_range.total {
        Some(total) if total != pin.size => {
            return Err(Failure::permanent(remote.changed(format!("its size is now {total}, was {}", pin.size))));
        }
        None => return Err(Failure::permanent(remote.protocol("Content-Range gives no total size".to_string()))),
        Some(_) => {}
    }
    if content_range.range != Some((offset, last)) {
        let detail = format!("asked for bytes {offset}-{last}, got {}", shown_range(content_range.range, pin.size));
        return Err(Failure::permanent(remote.protocol(detail)));
    }
    Ok(response)
}

/// Refuses a body in a content coding (`Content-Encoding: gzip`): stfs asks for none, so such a
/// body is not the object's bytes, even when its length is the range's. `identity` is no coding.
fn expect_identity(remote: &Remote, response: &Response<Body>) -> Result<(), Failure> {
    for value in response.headers().get_all(CONTENT_ENCODING) {
        let codings = value.as_bytes().split(|&b| b == b',').map(<[u8]>::trim_ascii);
        if codings.into_iter().any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")) {
            let shown: String = value.as_bytes().escape_ascii().to_string().chars().take(40).collect();
            let detail = format!("a body in Content-Encoding {shown}, which stfs never asks for");
            return Err(Failure::permanent(remote.protocol(detail)));
        }
    }
    Ok(())
}

/// The parsed Content-Range of a response, or a protocol failure.
fn content_range(remote: &Remote, response: &Response<Body>) -> Result<pin::ContentRange, Failure> {
    let text = pin::header_text(response.headers(), &CONTENT_RANGE);
    text.as_deref().and_then(parse_content_range).ok_or_else(|| {
        let detail = match text {
            Some(text) => format!("malformed Content-Range: {text}"),
            None => "a 206 answer without Content-Range".to_string(),
        };
        Failure::permanent(remote.protocol(detail))
    })
}

/// Fills `bufs`, the bytes from `offset` on, from the body and checks that nothing follows (a
/// longer body means a confused server).
fn read_body_exact(
    remote: &Remote,
    response: Response<Body>,
    bufs: &mut [&mut [u8]],
    offset: u64,
) -> Result<(), Failure> {
    let uri = response.get_uri().clone();
    let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let range = (offset, offset + total.max(1) - 1);
    let mut reader = response.into_body().into_reader();
    let mut arrived = 0u64;
    for buf in bufs.iter_mut() {
        let mut filled = 0;
        while filled < buf.len() {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => {
                    let short = io::Error::new(io::ErrorKind::UnexpectedEof, "the body ended early");
                    return Err(remote.body_failure(short, &uri, range, arrived));
                }
                Ok(n) => {
                    filled += n;
                    arrived += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(remote.body_failure(e, &uri, range, arrived)),
            }
        }
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
