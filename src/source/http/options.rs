//! Settings of a remote source (headers, credentials, timeouts, retries, proxy) and their parsing.

use super::auth::Authorizer;
use super::error::HttpError;
use super::retry::RetryPolicy;
use crate::stats::Stats;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ureq::http::header::{HeaderName, HeaderValue};

/// How long stfs waits for a server by default before the mount fails or a read gets EIO.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers stfs sets itself: a user value would break range reads or the version pin.
const RESERVED_HEADERS: [&str; 9] = [
    "range",
    "if-match",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "if-modified-since",
    "host",
    "content-length",
    "transfer-encoding",
];

/// A credential or header value: kept out of `Debug`, logs and error messages.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a sensitive value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for building requests only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Which proxy requests go through.
#[derive(Clone, Debug, Default)]
pub enum ProxySetting {
    /// `ALL_PROXY`, `HTTPS_PROXY` or `HTTP_PROXY` (upper or lower case), minus the hosts in `NO_PROXY`.
    #[default]
    FromEnvironment,
    /// No proxy, whatever the environment says.
    Direct,
    /// This proxy URL (`http://[user:pass@]host:port`; it may hold credentials, hence the Secret).
    Url(Secret),
}

/// Everything [`super::HttpSource::open`] needs besides the URL.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Extra request headers, `(name, value)`, sent only to the URL's own origin (scheme, host, port).
    pub headers: Vec<(String, Secret)>,
    /// Sent as `Authorization: Bearer <token>`, only to the URL's own origin, never after a redirect
    /// to another host.
    pub bearer_token: Option<Secret>,
    /// Read `HF_TOKEN` for huggingface.co / hf.co URLs when no token or Authorization header is given.
    pub hub_token_from_env: bool,
    /// Limit for DNS plus TCP (plus TLS) connection setup.
    pub connect_timeout: Duration,
    /// Limit for each wait on the socket; a stalled transfer fails after this long.
    pub read_timeout: Duration,
    /// Limit for a whole exchange (request, headers and body of one block).
    pub request_timeout: Duration,
    /// The longest wait for the server: opening (every request and retry of it) and each read
    /// (retries included) fail once this long has passed, however the server behaves (silent, or
    /// trickling its answer).
    pub timeout: Duration,
    /// Set by a caller that opens several sources as one checkpoint: the opening request, and
    /// every read until [`super::HttpSource::opened`], end by then at the latest, so that the
    /// whole open stays within one timeout.
    pub deadline: Option<Instant>,
    /// Backoff for transient failures.
    pub retry: RetryPolicy,
    /// Proxy choice.
    pub proxy: ProxySetting,
    /// Bytes fetched by the first (speculative) request; enough for typical safetensors headers.
    pub prefix_len: u32,
    /// Follow a redirect once and send later requests straight to its target (signed CDN URL),
    /// going back to the original URL when the target refuses (403, 404, 410: expired).
    pub cache_redirects: bool,
    /// Where the `http_*` counters go.
    pub stats: Arc<Stats>,
    /// Per-request credentials (an object store's signature or token), sent only to the origin.
    pub auth: Option<Authorizer>,
    /// Trust the certificates of this PEM file instead of the platform's (`AWS_CA_BUNDLE`).
    pub ca_bundle: Option<PathBuf>,
    /// The ETag an object store's listing gave the object (`s3://BUCKET/PREFIX/`): the opening
    /// request carries it as `If-Match`, and an answer with another fails the opening as a change,
    /// so the object read is the version listed.
    pub listed_etag: Option<String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            headers: Vec::new(),
            bearer_token: None,
            hub_token_from_env: true,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(300),
            timeout: DEFAULT_TIMEOUT,
            deadline: None,
            retry: RetryPolicy::default(),
            proxy: ProxySetting::default(),
            prefix_len: 64 * 1024,
            cache_redirects: true,
            stats: Arc::new(Stats::default()),
            auth: None,
            ca_bundle: None,
            listed_etag: None,
        }
    }
}

impl HttpOptions {
    /// Adds a header from a `--header 'Name: value'` argument. Refuses malformed ones and the
    /// headers stfs manages itself (Range, conditionals, Host, framing).
    pub fn add_header_arg(&mut self, argument: &str) -> Result<(), HttpError> {
        let (name, value) = argument
            .split_once(':')
            .ok_or_else(|| HttpError::BadOption("a header must look like 'Name: value'".to_string()))?;
        let name = name.trim();
        let value = value.trim();
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            // Not echoed either: without its colon, a line's value runs into the name.
            return Err(HttpError::BadOption(
                "invalid header name before the first `:` (a header must look like 'Name: value')".to_string(),
            ));
        }
        if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(HttpError::BadOption(format!("header {name} is set by stfs itself")));
        }
        if HeaderValue::from_str(value).is_err() {
            // The value is not echoed: it may be a credential.
            return Err(HttpError::BadOption(format!("invalid value for header {name}")));
        }
        self.headers.push((name.to_string(), Secret::new(value)));
        Ok(())
    }

    /// Takes the bearer token from the environment variable `variable`; fails if it is unset or empty.
    pub fn token_from_env(&mut self, variable: &str) -> Result<(), HttpError> {
        match std::env::var(variable) {
            Ok(token) if !token.trim().is_empty() => {
                self.bearer_token = Some(Secret::new(token.trim()));
                Ok(())
            }
            _ => Err(HttpError::BadOption(format!("token variable {variable} is unset or empty"))),
        }
    }

    /// Whether the user already supplied an Authorization header of their own.
    pub(crate) fn has_authorization_header(&self) -> bool {
        self.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_arguments_parse_and_refuse() {
        let mut options = HttpOptions::default();
        options.add_header_arg("X-Api-Key:  abc:def ").unwrap();
        assert_eq!(options.headers[0].0, "X-Api-Key");
        assert_eq!(options.headers[0].1.expose(), "abc:def");
        assert!(options.add_header_arg("no colon").is_err());
        assert!(options.add_header_arg("Bad Name: x").is_err());
        assert!(options.add_header_arg("range: bytes=0-1").is_err());
        let error = options.add_header_arg("Authorization: Bearer x\u{7f}secret").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[test]
    fn debug_output_hides_secrets() {
        let mut options = HttpOptions::default();
        options.add_header_arg("Authorization: Basic c2VrcmV0").unwrap();
        options.bearer_token = Some(Secret::new("tok-sekret"));
        options.proxy = ProxySetting::Url(Secret::new("http://user:pw-sekret@proxy:3128"));
        let debug = format!("{options:?}");
        for secret in ["c2VrcmV0", "tok-sekret", "pw-sekret"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(debug.contains("Authorization"));
    }

    #[test]
    fn token_from_missing_variable_fails() {
        let mut options = HttpOptions::default();
        let error = options.token_from_env("STFS_TEST_SURELY_UNSET_VARIABLE").unwrap_err();
        assert!(error.to_string().contains("STFS_TEST_SURELY_UNSET_VARIABLE"));
        assert!(options.bearer_token.is_none());
    }
}
