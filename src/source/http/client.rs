//! One ranged GET against a remote object: headers, manual redirects (with the target cached),
//! classification of failures, and the retry loop around it.

use super::agent::agent_config;
use super::auth::Authorizer;
use super::error::{HttpError, Refusal, Stalled, Timeout};
use super::options::HttpOptions;
use super::pin::{header_text, Pin};
use super::retry::{parse_retry_after, RetryPolicy};
use super::url::{display_name, is_hub_url, parse_http_url, resolve_location, same_origin};
use crate::stats::Stats;
use crate::util::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ureq::http::header::{HeaderName, HeaderValue, AUTHORIZATION, LOCATION, RANGE, RETRY_AFTER};
use ureq::http::{Request, Response, Uri};
use ureq::{Agent, Body};

/// Redirect hops followed per request before giving up.
const MAX_REDIRECTS: usize = 10;

/// How long after a read failed a read of the same bytes is taken for a repeat: the kernel asks
/// again for the page a failed read needed, straight away and twice, and each repeat would
/// otherwise hold the reader for another whole timeout (a silent server) or another whole round of
/// retries (a server answering 503 slowly).
pub(crate) const FAILURE_MEMORY: Duration = Duration::from_secs(1);

/// Failed reads remembered at once: every prefetch lane and FUSE thread of a source may fail
/// together when its server goes silent, and one lane's failure must not make a reader's own
/// forgotten.
const REMEMBERED_FAILURES: usize = 64;

/// The time a repeat is given, in one try: enough for a server that has woken up to answer.
pub(crate) const REPEAT_BUDGET: Duration = Duration::from_millis(500);

/// A range whose read failed, and when.
struct RecentFailure {
    range: (u64, u64),
    at: Instant,
}

/// The bearer token to send: the explicit one, else `HF_TOKEN` (read through `hf_token`) for hub URLs
/// when the user gave no Authorization header of their own.
fn bearer_token(options: &HttpOptions, uri: &Uri, hf_token: impl FnOnce() -> Option<String>) -> Option<String> {
    if let Some(token) = &options.bearer_token {
        return Some(token.expose().to_string());
    }
    if !options.hub_token_from_env || !is_hub_url(uri) || options.has_authorization_header() {
        return None;
    }
    hf_token().filter(|token| !token.trim().is_empty())
}

/// Why one try failed, and whether trying again may help.
pub(crate) struct Failure {
    /// What went wrong (already free of credentials).
    pub error: HttpError,
    /// Timeouts, dropped connections, 408/429/5xx: worth another try.
    pub transient: bool,
    /// The server's `Retry-After`, if it sent one.
    pub retry_after: Option<std::time::Duration>,
}

impl Failure {
    /// A failure that retrying cannot fix.
    pub fn permanent(error: HttpError) -> Failure {
        Failure { error, transient: false, retry_after: None }
    }

    /// A failure that may go away on its own.
    pub fn transient(error: HttpError) -> Failure {
        Failure { error, transient: true, retry_after: None }
    }
}

/// The parts of a remote source shared by all its streams.
pub(crate) struct Remote {
    /// The URL as given (may carry a signed query string; never printed).
    uri: Uri,
    /// The URL for messages: no userinfo, no query string.
    pub name: String,
    /// User headers plus Authorization, sent only to the original origin.
    origin_headers: Vec<(HeaderName, HeaderValue)>,
    config: ureq::config::Config,
    retry: RetryPolicy,
    pub stats: Arc<Stats>,
    cache_redirects: bool,
    /// Where the last redirect chain ended, used directly until it refuses us.
    redirect_target: Mutex<Option<Uri>>,
    /// Per-request credentials for the origin (object stores).
    auth: Option<Authorizer>,
    /// The longest one call of [`Remote::with_retries`] waits, retries included.
    timeout: Duration,
    /// While the source is being opened as part of a checkpoint: when the whole opening must end.
    opening_deadline: Mutex<Option<Instant>>,
    /// Reads that failed less than [`FAILURE_MEMORY`] ago, oldest first, at most
    /// [`REMEMBERED_FAILURES`].
    recent_failures: Mutex<VecDeque<RecentFailure>>,
}

impl Remote {
    /// The URL as given, query string included (two objects told apart by their query must not
    /// share cached blocks); for the disk cache's key only, never printed.
    pub fn identity_url(&self) -> String {
        self.uri.to_string()
    }

    /// Validates the URL and the options and prepares the shared agent configuration; `name` is
    /// what messages call the object (by default the URL without credentials or query).
    pub fn new(url: &str, name: Option<&str>, options: &HttpOptions) -> Result<Remote, HttpError> {
        let uri = parse_http_url(url).map_err(HttpError::BadUrl)?;
        let mut origin_headers = Vec::new();
        for (name, value) in &options.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HttpError::BadOption(format!("invalid header name {name:?}")))?;
            let mut value = HeaderValue::from_str(value.expose())
                .map_err(|_| HttpError::BadOption(format!("invalid value for header {name}")))?;
            value.set_sensitive(true);
            origin_headers.push((name, value));
        }
        let token = bearer_token(options, &uri, || std::env::var("HF_TOKEN").ok());
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|_| HttpError::BadOption("the bearer token holds invalid characters".to_string()))?;
            value.set_sensitive(true);
            origin_headers.retain(|(name, _)| *name != AUTHORIZATION);
            origin_headers.push((AUTHORIZATION, value));
        }
        let config = agent_config(options, None)?;
        Ok(Remote {
            name: name.map_or_else(|| display_name(url), str::to_string),
            uri,
            origin_headers,
            config,
            retry: options.retry.clone(),
            stats: Arc::clone(&options.stats),
            cache_redirects: options.cache_redirects,
            redirect_target: Mutex::new(None),
            auth: options.auth.clone(),
            timeout: options.timeout,
            opening_deadline: Mutex::new(options.deadline),
            recent_failures: Mutex::new(VecDeque::new()),
        })
    }

    /// A new agent with its own connection pool, so that each stream keeps its own keep-alive link.
    pub fn new_agent(&self) -> Agent {
        Agent::new_with_config(self.config.clone())
    }

    /// The longest one read waits, retries included.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Ends the opening: later calls each get their own timeout instead of the opening's deadline.
    pub fn opened(&self) {
        *lock(&self.opening_deadline) = None;
    }

    /// Whether a read of `range` repeats one that failed less than [`FAILURE_MEMORY`] ago (the
    /// ranges overlap): it then gets one try of [`REPEAT_BUDGET`] instead of a whole timeout.
    pub fn repeats_a_failure(&self, (first, last): (u64, u64)) -> bool {
        let failures = lock(&self.recent_failures);
        failures.iter().any(|f| f.at.elapsed() < FAILURE_MEMORY && first <= f.range.1 && f.range.0 <= last)
    }

    /// Remembers that a read of `range` failed, for [`Remote::repeats_a_failure`]: whatever the
    /// error, its retries and its time are spent (a timeout, a server still answering 503 at the
    /// end, a dropped connection every try), and a repeat straight after would spend them again.
    pub fn note_failure(&self, range: (u64, u64)) {
        let mut failures = lock(&self.recent_failures);
        while failures.front().is_some_and(|f| f.at.elapsed() >= FAILURE_MEMORY) {
            failures.pop_front();
        }
        if failures.len() == REMEMBERED_FAILURES {
            failures.pop_front();
        }
        failures.push_back(RecentFailure { range, at: Instant::now() });
    }

    /// Runs `attempt` until it succeeds, fails permanently, the policy's tries are used up, or the
    /// time allowed runs out: the timeout from now, or the opening's deadline if that comes first.
    /// Each attempt is told the deadline, which bounds every wait on the socket.
    pub fn with_retries<T>(&self, attempt: impl FnMut(Instant) -> Result<T, Failure>) -> Result<T, HttpError> {
        self.with_retries_within(self.timeout, self.retry.attempts, attempt)
    }

    /// [`Remote::with_retries`] with at most `attempts` tries, all within `budget`.
    pub fn with_retries_within<T>(
        &self,
        budget: Duration,
        attempts: u32,
        mut attempt: impl FnMut(Instant) -> Result<T, Failure>,
    ) -> Result<T, HttpError> {
        let attempts = attempts.max(1);
        let now = Instant::now();
        let deadline = lock(&self.opening_deadline).map_or(now + budget, |d| d.min(now + budget));
        let mut retry = 0;
        loop {
            let started = Instant::now();
            let outcome = attempt(deadline);
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.stats.record_http_latency(micros);
            let failure = match outcome {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            if !failure.transient {
                return Err(failure.error);
            }
            let delay = self.retry.delay(retry, failure.retry_after);
            let out_of_time = Instant::now() + delay >= deadline;
            if retry + 1 < attempts && !out_of_time {
                log::info!("{}: {}; retrying in {} ms", self.name, failure.error, delay.as_millis());
                Stats::add(&self.stats.http_retries, 1);
                std::thread::sleep(delay);
                retry += 1;
                continue;
            }
            let error = match failure.error {
                // The time allowed is what ran out: say so, with that bound.
                HttpError::TimedOut(timeout) if out_of_time => {
                    HttpError::TimedOut(Box::new(Timeout { after: budget, ..*timeout }))
                }
                HttpError::TimedOut(timeout) => {
                    let last = HttpError::TimedOut(Box::new(Timeout { after: now.elapsed(), ..*timeout }));
                    HttpError::GaveUp { attempts: retry + 1, last: Box::new(last) }
                }
                error => HttpError::GaveUp { attempts: retry + 1, last: Box::new(error) },
            };
            log::warn!("{}: {error}", self.name);
            return Err(error);
        }
    }

    /// Sends `GET` for bytes `first..=last` (with the pin's precondition, if any) and returns the first
    /// response that is not a redirect; every wait of it, its body's included, ends by `deadline`.
    /// Uses the cached redirect target first; if that refuses us (typically an expired signature),
    /// forgets it and starts again from the original URL.
    pub fn get_range(
        &self,
        agent: &Agent,
        first: u64,
        last: u64,
        pin: Option<&Pin>,
        deadline: Instant,
    ) -> Result<Response<Body>, Failure> {
        let cached = lock(&self.redirect_target).clone();
        if let Some(target) = cached {
            let (response, _) = self.follow(agent, target.clone(), (first, last), pin, deadline)?;
            if !matches!(response.status().as_u16(), 401 | 403 | 404 | 410) {
                return Ok(response);
            }
            log::info!("{}: cached redirect target refused ({}); resolving again", self.name, response.status());
            let mut slot = lock(&self.redirect_target);
            if slot.as_ref() == Some(&target) {
                *slot = None;
            }
        }
        let (response, final_uri) = self.follow(agent, self.uri.clone(), (first, last), pin, deadline)?;
        if self.cache_redirects && final_uri != self.uri && response.status().as_u16() == 206 {
            *lock(&self.redirect_target) = Some(final_uri);
        }
        Ok(response)
    }

    /// Follows redirects from `uri` by hand, so that credentials stay with their origin and the
    /// precondition headers go to every hop. Returns the final response and where it came from.
    fn follow(
        &self,
        agent: &Agent,
        mut uri: Uri,
        (first, last): (u64, u64),
        pin: Option<&Pin>,
        deadline: Instant,
    ) -> Result<(Response<Body>, Uri), Failure> {
        for _hop in 0..=MAX_REDIRECTS {
            if Instant::now() >= deadline {
                return Err(self.timed_out(&uri, Stalled::Answer, (first, last)));
            }
            let mut request = Request::get(uri.clone()).header(RANGE, format!("bytes={first}-{last}"));
            if let Some((name, value)) = pin.and_then(Pin::precondition) {
                request = request.header(name, value);
            }
            if same_origin(&uri, &self.uri) {
                for (name, value) in &self.origin_headers {
                    request = request.header(name, value);
                }
                if let Some(auth) = &self.auth {
                    for (name, mut value) in auth.0.headers(&uri, deadline).map_err(Failure::permanent)? {
                        value.set_sensitive(true);
                        request = request.header(name, value);
                    }
                }
            }
            let request = request
                .body(())
                .map_err(|_| Failure::permanent(HttpError::BadOption("a header could not be encoded".to_string())))?;
            // The whole exchange, body included, ends by the deadline: a server that trickles its
            // answer a byte at a time is cut off as surely as a silent one. Measured after the
            // credentials, whose wait for a refresh is part of the same deadline.
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.timed_out(&uri, Stalled::Answer, (first, last)));
            }
            let request = agent.configure_request(request).timeout_global(Some(remaining)).build();
            Stats::add(&self.stats.http_requests, 1);
            let response = agent.run(request).map_err(|e| self.transport_failure(e, &uri, (first, last)))?;
            let location = header_text(response.headers(), &LOCATION).unwrap_or_default();
            // An object store's 301 without Location names the bucket's region instead: a status.
            if !matches!(response.status().as_u16(), 301 | 302 | 303 | 307 | 308) || location.is_empty() {
                return Ok((response, uri));
            }
            uri = resolve_location(&uri, &location).ok_or_else(|| {
                Failure::permanent(self.protocol(format!("redirect ({}) without a usable Location", response.status())))
            })?;
            log::debug!("{}: redirected to {}", self.name, display_name(&uri.to_string()));
        }
        Err(Failure::permanent(self.protocol(format!("more than {MAX_REDIRECTS} redirects"))))
    }

    /// Classifies a non-success status. 412 and 416 mean the pinned object is gone or different.
    /// An object store's error document (S3's `<Code>`, GCS's JSON) in a short body is kept.
    pub fn status_failure(&self, response: Response<Body>) -> Failure {
        let status = response.status().as_u16();
        let retry_after = header_text(response.headers(), &RETRY_AFTER).as_deref().and_then(parse_retry_after);
        let region = response.headers().get("x-amz-bucket-region").and_then(|v| v.to_str().ok()).map(str::to_string);
        let mut body = Vec::new();
        let _ = std::io::Read::read_to_end(
            &mut std::io::Read::take(response.into_body().into_reader(), 16 << 10),
            &mut body,
        );
        let name = self.name.clone();
        let error = match Refusal::parse(status, &body, region) {
            Some(refusal) if status != 412 => HttpError::Refused { name, refusal: Box::new(refusal) },
            _ => HttpError::Status { name, status },
        };
        match status {
            412 | 416 => Failure::permanent(self.changed(format!("the server answered {status}"))),
            408 | 429 | 500 | 502 | 503 | 504 => Failure { error, transient: true, retry_after },
            _ => Failure::permanent(error),
        }
    }

    /// The "changed since mount" error.
    pub fn changed(&self, detail: String) -> HttpError {
        HttpError::Changed { name: self.name.clone(), detail }
    }

    /// A response that breaks HTTP range semantics.
    pub fn protocol(&self, detail: String) -> HttpError {
        HttpError::Protocol { name: self.name.clone(), detail }
    }

    /// A try cut off by a timeout while `uri`'s server had yet to do `stage` for bytes `range`.
    /// Transient: the next try may find the server awake (if time remains).
    pub fn timed_out(&self, uri: &Uri, stage: Stalled, range: (u64, u64)) -> Failure {
        let server = uri.authority().map_or_else(|| "the server".to_string(), |a| a.host().to_string());
        let server = match uri.port_u16() {
            Some(port) => format!("{server}:{port}"),
            None => server,
        };
        let timeout = Timeout { name: self.name.clone(), server, stage, range, after: Duration::ZERO };
        let error = HttpError::TimedOut(Box::new(timeout));
        Failure::transient(error)
    }

    /// Maps a ureq error to a failure without echoing URLs (which may carry signatures).
    fn transport_failure(&self, error: ureq::Error, uri: &Uri, range: (u64, u64)) -> Failure {
        use ureq::Error as E;
        if let E::Timeout(reason) = error {
            let stage = match reason {
                ureq::Timeout::Resolve | ureq::Timeout::Connect => Stalled::Connect,
                _ => Stalled::Answer,
            };
            return self.timed_out(uri, stage, range);
        }
        let transient = matches!(
            error,
            E::Io(_)
                | E::Timeout(_)
                | E::HostNotFound
                | E::ConnectionFailed
                | E::Protocol(_)
                | E::BodyStalled
                | E::ConnectProxyFailed(_)
        );
        // The client's own wording of a refused URL may quote it (with its signature): neither
        // the message nor the source chain carries it.
        let (detail, source) = match error {
            E::BadUri(_) => ("the URL was refused by the HTTP client".to_string(), None),
            E::RequireHttpsOnly(_) => ("https is required".to_string(), None),
            other => (other.to_string(), Some(Box::new(other) as Box<dyn std::error::Error + Send + Sync>)),
        };
        let error = HttpError::Transport { name: self.name.clone(), detail, source };
        Failure { error, transient, retry_after: None }
    }

    /// Maps an error while reading a body; every one of them (reset, timeout, short body) is
    /// transient. A timeout says how much of the body had come.
    pub fn body_failure(&self, error: std::io::Error, uri: &Uri, range: (u64, u64), arrived: u64) -> Failure {
        if is_timeout(&error) {
            let expected = range.1 - range.0 + 1;
            return self.timed_out(uri, Stalled::Body { arrived, expected }, range);
        }
        let detail = format!("reading the response body: {error}");
        Failure::transient(HttpError::Transport { name: self.name.clone(), detail, source: Some(Box::new(error)) })
    }
}

/// Whether an I/O error from a body read is a timeout (ureq wraps its own, or the socket's).
fn is_timeout(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
        || error
            .get_ref()
            .and_then(|e| e.downcast_ref::<ureq::Error>())
            .is_some_and(|e| matches!(e, ureq::Error::Timeout(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::http::Secret;

    #[test]
    fn hf_token_goes_only_to_hub_urls_without_other_credentials() {
        let hub: Uri = "https://huggingface.co/o/r/resolve/main/m.safetensors".parse().unwrap();
        let elsewhere: Uri = "https://example.org/m.safetensors".parse().unwrap();
        let from_env = || Some("hf_env".to_string());
        let mut options = HttpOptions::default();
        assert_eq!(bearer_token(&options, &hub, from_env).as_deref(), Some("hf_env"));
        assert_eq!(bearer_token(&options, &elsewhere, from_env), None);
        assert_eq!(bearer_token(&options, &hub, || Some(" ".to_string())), None);
        options.bearer_token = Some(Secret::new("explicit"));
        assert_eq!(bearer_token(&options, &elsewhere, from_env).as_deref(), Some("explicit"));
        options.bearer_token = None;
        options.add_header_arg("Authorization: Basic abc").unwrap();
        assert_eq!(bearer_token(&options, &hub, from_env), None);
        options.headers.clear();
        options.hub_token_from_env = false;
        assert_eq!(bearer_token(&options, &hub, from_env), None);
    }
}
