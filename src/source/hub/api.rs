//! The hub's repository API: which commit a revision is at and which files it holds
//! (`GET {endpoint}/api/models/{repo}/revision/{revision}`), and small files fetched whole.
//! Redirects are followed by hand, with the HTTP source's rule: the token and the user's headers
//! go only to the origin (scheme, host, port) of the URL asked for.

use std::io::Read;
use std::time::{Duration, Instant};

use serde::Deserialize;
use ureq::http::header::{AUTHORIZATION, LOCATION};
use ureq::http::{HeaderName, HeaderValue, Request, Response, Uri};
use ureq::{Agent, Body};

use super::error::HubError;
use super::spec::{encode_path, encode_segment};
use crate::source::http::{new_agent, resolve_location, same_origin, HttpOptions, Secret};

/// Largest API answer read: a repository's file list is a few hundred KB even for thousands of files.
pub const MAX_API_BYTES: u64 = 32 << 20;

/// Tries per API request when the hub answers 429/5xx or the connection fails.
const API_ATTEMPTS: u32 = 3;

/// Redirect hops followed per request (a file's goes to the CDN, a renamed repository's to its new
/// name).
const MAX_REDIRECTS: usize = 5;

/// One file of a repository at a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sibling {
    /// Its path in the repository (`model-00001-of-00002.safetensors`, `unet/config.json`).
    pub path: String,
    /// Its size in bytes, when the hub said (it does with `?blobs=true`).
    pub size: Option<u64>,
}

/// A revision resolved to its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoInfo {
    /// The commit's full sha: every read names it, so two commits are never mixed.
    pub sha: String,
    /// Every file at that commit.
    pub siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct RawInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<RawSibling>,
}

#[derive(Deserialize)]
struct RawSibling {
    rfilename: String,
    size: Option<u64>,
}

/// A client of one hub (endpoint) with its credentials.
pub struct HubClient {
    /// The base URL, without a trailing `/`.
    pub endpoint: String,
    token: Option<Secret>,
    headers: Vec<(HeaderName, HeaderValue)>,
    agent: Agent,
    /// The opening's deadline ([`HttpOptions::deadline`]): every request, retries included, ends by
    /// then.
    deadline: Option<Instant>,
}

impl HubClient {
    /// A client of `endpoint` sending `token` as a bearer token, with the proxy, timeouts and extra
    /// headers of `options`.
    pub fn new(endpoint: &str, token: Option<Secret>, options: &HttpOptions) -> Result<HubClient, HubError> {
        // The same proxy, roots and timeouts as the file sources; a whole exchange within
        // `global_timeout`.
        let agent = new_agent(options, Some(global_timeout(options))).map_err(|e| HubError::Api(e.to_string()))?;
        let mut headers = Vec::new();
        for (name, value) in &options.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| HubError::Api("bad header".to_string()))?;
            let mut value =
                HeaderValue::from_str(value.expose()).map_err(|_| HubError::Api("bad header".to_string()))?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        Ok(HubClient { endpoint: endpoint.to_string(), token, headers, agent, deadline: options.deadline })
    }

    /// Whether a token is sent.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The token sent, if any (for the file sources of the same hub).
    pub fn token(&self) -> Option<&Secret> {
        self.token.as_ref()
    }

    /// The commit `revision` of `repo` is at, and its files.
    pub fn revision_info(&self, repo: &str, revision: &str) -> Result<RepoInfo, HubError> {
        let url = format!("{}/api/models/{repo}/revision/{}?blobs=true", self.endpoint, encode_segment(revision));
        let (status, code, body) = self.get(&url, MAX_API_BYTES)?;
        if status != 200 {
            return Err(self.refusal(repo, revision, status, code.as_deref()));
        }
        let raw: RawInfo =
            serde_json::from_slice(&body).map_err(|e| HubError::Api(format!("the revision API answered {e}")))?;
        let sha =
            raw.sha.filter(|s| !s.is_empty()).ok_or_else(|| HubError::Api("the revision API gave no sha".into()))?;
        if !sha.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(HubError::Api("the revision API gave a malformed sha".into()));
        }
        let siblings = raw.siblings.into_iter().map(|s| Sibling { path: s.rfilename, size: s.size }).collect();
        Ok(RepoInfo { sha, siblings })
    }

    /// The URL of `path` at commit `sha` (redirects to the CDN for large files).
    pub fn resolve_url(&self, repo: &str, sha: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{sha}/{}", self.endpoint, encode_path(path))
    }

    /// The whole of a file of at most `limit` bytes at commit `sha` (a longer one is an error).
    pub fn fetch_file(&self, repo: &str, sha: &str, path: &str, limit: u64) -> Result<Vec<u8>, HubError> {
        let (status, _, body) = self.get(&self.resolve_url(repo, sha, path), limit)?;
        if status != 200 {
            return Err(HubError::Api(format!("the file answered HTTP {status}")));
        }
        Ok(body)
    }

    /// Why the revision API refused: the hub's `X-Error-Code` first, then the status. A 404 without
    /// a code is a missing revision if the repository itself answers, else a missing repository.
    fn refusal(&self, repo: &str, revision: &str, status: u16, code: Option<&str>) -> HubError {
        let revision = revision.to_string();
        match (code, status) {
            (Some("GatedRepo"), _) => HubError::Gated,
            (Some("RevisionNotFound"), _) => HubError::RevisionNotFound(revision),
            (Some("RepoNotFound"), _) => HubError::RepoNotFound { token: self.has_token() },
            (_, 401) if self.has_token() => HubError::TokenRefused,
            (_, 401) => HubError::RepoNotFound { token: false },
            (_, 403) => HubError::Forbidden,
            (_, 404) => {
                // The hub answers the repository itself with 200 (a mirror's file tree with a
                // redirect to its folder): anything below 400 means the repository is there.
                let url = format!("{}/api/models/{repo}", self.endpoint);
                match self.get(&url, MAX_API_BYTES) {
                    Ok((status, _, _)) if status < 400 => HubError::RevisionNotFound(revision),
                    _ => HubError::RepoNotFound { token: self.has_token() },
                }
            }
            (_, status) => HubError::Api(format!("the revision API answered HTTP {status}")),
        }
    }

    /// One GET with retries of transient failures: status, `X-Error-Code`, and a body of at most
    /// `limit` bytes (longer is an error). Messages name no URL (a mirror's may carry a signature).
    /// No retry starts after the deadline.
    fn get(&self, url: &str, limit: u64) -> Result<(u16, Option<String>, Vec<u8>), HubError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let delay = Duration::from_millis(200 << attempt);
            let outcome = self.get_once(url, limit);
            // Judged after the try, which took time of its own: the retry must start in time.
            let in_time = self.deadline.is_none_or(|d| Instant::now() + delay < d);
            match outcome {
                Ok((status, ..))
                    if matches!(status, 429 | 500 | 502 | 503 | 504) && attempt < API_ATTEMPTS && in_time => {}
                Err(HubError::Transport(_)) if attempt < API_ATTEMPTS && in_time => {}
                other => return other,
            }
            std::thread::sleep(delay);
        }
    }

    fn get_once(&self, url: &str, limit: u64) -> Result<(u16, Option<String>, Vec<u8>), HubError> {
        let response = self.follow(url)?;
        let status = response.status().as_u16();
        let code = response.headers().get("x-error-code").and_then(|v| v.to_str().ok()).map(str::to_string);
        let mut body = Vec::new();
        let mut reader = response.into_body().into_reader().take(limit + 1);
        reader.read_to_end(&mut body).map_err(|e| HubError::Transport(e.to_string()))?;
        if body.len() as u64 > limit {
            return Err(HubError::Api(format!("an answer is over the limit of {limit} bytes")));
        }
        Ok((status, code, body))
    }

    /// Sends `GET url` and follows its redirects by hand: the token and the user's headers go to
    /// every hop of `url`'s own origin and to no other (a CDN, another port of the same host).
    /// Returns the first answer that is not a redirect.
    fn follow(&self, url: &str) -> Result<Response<Body>, HubError> {
        let origin: Uri =
            url.parse().map_err(|_| HubError::Api("the hub URL was refused by the HTTP client".to_string()))?;
        let mut uri = origin.clone();
        for _hop in 0..=MAX_REDIRECTS {
            let credentials = same_origin(&uri, &origin);
            let response = self.send(uri.clone(), credentials)?;
            let location = response.headers().get(LOCATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
            if !matches!(response.status().as_u16(), 301 | 302 | 303 | 307 | 308) || location.trim().is_empty() {
                return Ok(response);
            }
            uri = resolve_location(&uri, location).ok_or_else(|| {
                HubError::Api(format!("a redirect ({}) without a usable Location", response.status()))
            })?;
        }
        Err(HubError::Api(format!("more than {MAX_REDIRECTS} redirects")))
    }

    /// One GET of `uri`, with the token and the user's headers when `credentials` is set, ending by
    /// the opening's deadline.
    fn send(&self, uri: Uri, credentials: bool) -> Result<Response<Body>, HubError> {
        let remaining = self.deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining.is_some_and(|r| r.is_zero()) {
            return Err(HubError::Transport("no answer within the timeout (--timeout)".to_string()));
        }
        let mut request = Request::get(uri);
        if credentials {
            for (name, value) in &self.headers {
                request = request.header(name, value);
            }
            if let Some(token) = &self.token {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                    .map_err(|_| HubError::Api("the token holds invalid characters".to_string()))?;
                value.set_sensitive(true);
                request = request.header(AUTHORIZATION, value);
            }
        }
        let request = request.body(()).map_err(|_| HubError::Api("bad request".to_string()))?;
        // The whole exchange, body included, ends by the deadline.
        let request = match remaining {
            Some(remaining) => {
                let limit = remaining.min(self.agent.config().timeouts().global.unwrap_or(remaining));
                self.agent.configure_request(request).timeout_global(Some(limit)).build()
            }
            None => request,
        };
        self.agent.run(request).map_err(|e| HubError::Transport(transport_detail(e)))
    }
}

/// The longest one exchange with the API may take.
fn global_timeout(options: &HttpOptions) -> Duration {
    options.request_timeout.min(Duration::from_secs(120))
}

/// A transport error's wording without any URL.
fn transport_detail(error: ureq::Error) -> String {
    match error {
        ureq::Error::BadUri(_) => "the hub URL was refused by the HTTP client".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::http::test_server::{Fault, TestServer};
    use crate::source::http::ProxySetting;

    const TOKEN: &str = "hf_TOKENSECRET";

    /// A client of `hub` with a token and a user header, no proxy, short timeouts.
    fn client(hub: &TestServer) -> HubClient {
        let mut options = HttpOptions { proxy: ProxySetting::Direct, ..HttpOptions::default() };
        options.connect_timeout = Duration::from_secs(2);
        options.read_timeout = Duration::from_secs(2);
        options.add_header_arg("X-Api-Key: HEADERSECRET").unwrap();
        HubClient::new(&hub.url(""), Some(Secret::new(TOKEN)), &options).unwrap()
    }

    /// A file redirected to a CDN on another origin (here another port of the same host, which a
    /// same-host rule would let through) still loads, and neither the token nor the user's headers
    /// reach the CDN.
    #[test]
    fn a_redirect_to_another_origin_carries_no_credentials() {
        let hub = TestServer::start(Vec::new());
        let cdn = TestServer::start(b"{\"model_type\": \"t\"}".to_vec());
        hub.with(|s| {
            s.redirects.insert("/o/r/resolve/abc/config.json".to_string(), cdn.url("/cdn/config.json?sig=1"));
        });
        let body = client(&hub).fetch_file("o/r", "abc", "config.json", 1 << 20).unwrap();
        assert_eq!(body, b"{\"model_type\": \"t\"}");

        let asked = hub.seen();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
        assert_eq!(asked[0].header("x-api-key"), Some("HEADERSECRET"));
        let served = cdn.seen();
        assert_eq!(served.len(), 1);
        assert_eq!(served[0].path, "/cdn/config.json?sig=1");
        for (name, value) in &served[0].headers {
            assert!(
                name != "authorization" && !value.contains("TOKENSECRET") && !value.contains("HEADERSECRET"),
                "the CDN received {name}: {value}"
            );
        }
    }

    /// A redirect within the hub's own origin (a renamed repository) keeps the credentials.
    #[test]
    fn a_redirect_within_the_origin_keeps_the_credentials() {
        let hub = TestServer::start(b"{}".to_vec());
        hub.with(|s| {
            s.redirects
                .insert("/o/old/resolve/abc/config.json".to_string(), "/o/new/resolve/abc/config.json".to_string());
            s.required_auth = Some(format!("Bearer {TOKEN}"));
        });
        let body = client(&hub).fetch_file("o/old", "abc", "config.json", 1 << 20).unwrap();
        assert_eq!(body, b"{}");
        let seen = hub.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].path, "/o/new/resolve/abc/config.json");
        assert_eq!(seen[1].header("x-api-key"), Some("HEADERSECRET"));
    }

    /// A slow failing answer uses up time of its own: a retry whose wait would end past the
    /// deadline is not started, so the caller has its error by the deadline. Here the first answer
    /// (a 503) takes 300 ms and the first retry waits 400 ms, past the 650 ms deadline: the 503 is
    /// returned at about 300 ms. Judged before the try, the retry started and ended at 700 ms.
    #[test]
    fn no_retry_wait_ends_past_the_deadline() {
        let hub = TestServer::start(Vec::new());
        hub.with(|s| {
            for _ in 0..API_ATTEMPTS {
                s.faults.push_back(Fault::LateStatus(Duration::from_millis(300), 503));
            }
        });
        let budget = Duration::from_millis(650);
        let mut options = HttpOptions { proxy: ProxySetting::Direct, ..HttpOptions::default() };
        options.deadline = Some(Instant::now() + budget);
        let started = Instant::now();
        let client = HubClient::new(&hub.url(""), None, &options).unwrap();
        let outcome = client.fetch_file("o/r", "abc", "config.json", 1 << 20);
        let took = started.elapsed();
        assert!(matches!(outcome, Err(HubError::Api(ref m)) if m.contains("503")), "{outcome:?}");
        assert!(took < budget, "the call took {took:?}, past its {budget:?} deadline");
        assert_eq!(hub.seen().len(), 1, "a retry was sent");
    }
}
