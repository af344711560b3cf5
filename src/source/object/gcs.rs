//! `gs://BUCKET/OBJECT` as an [`HttpSource`] over the JSON API: one metadata GET pins the object's
//! generation, then every ranged media GET carries `ifGenerationMatch` (a replaced object answers
//! 412: EIO) and a bearer token from Application Default Credentials (`gcp_auth`:
//! `GOOGLE_APPLICATION_CREDENTIALS`, the gcloud ADC file, the metadata server), fetched again
//! before it expires. `--no-sign-request` reads public objects anonymously; `--endpoint-url` or
//! `STORAGE_EMULATOR_HOST` (anonymous, as Google's clients do) points at an emulator.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ureq::http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use ureq::http::Uri;

use super::names::{encode_path, ObjectName};
use super::refresh::{lookup, Expiring, Refreshing};
use crate::source::http::{new_agent, Authorizer, HttpError, HttpOptions, HttpSource, Refusal, RequestAuth};

/// The OAuth scope asked for: reading objects only.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_only";

/// Where requests go and the bearer token they carry (none: anonymous).
pub(crate) struct GcsAuth {
    endpoint: String,
    /// Fetched again shortly before it expires, off the read path (see [`Refreshing`]).
    token: Option<Refreshing<Token>>,
    shown: String,
}

/// An access token and its expiry.
#[derive(Clone)]
struct Token {
    value: String,
    expires: SystemTime,
}

impl Expiring for Token {
    fn expires(&self) -> Option<SystemTime> {
        Some(self.expires)
    }
}

impl GcsAuth {
    /// Finds the endpoint and, unless anonymous, a first token (as the mount opens its sources), within
    /// `timeout` (`--timeout`), which also bounds each later fetch of a token.
    pub fn load(
        shown: &str,
        endpoint_url: Option<&str>,
        no_sign_request: bool,
        timeout: Duration,
    ) -> Result<GcsAuth, HttpError> {
        let emulator = std::env::var("STORAGE_EMULATOR_HOST").ok().filter(|h| !h.is_empty());
        let endpoint = match (endpoint_url, &emulator) {
            (Some(url), _) => url.trim_end_matches('/').to_string(),
            (None, Some(host)) if host.contains("://") => host.trim_end_matches('/').to_string(),
            (None, Some(host)) => format!("http://{}", host.trim_end_matches('/')),
            (None, None) => "https://storage.googleapis.com".to_string(),
        };
        let anonymous = no_sign_request || (emulator.is_some() && endpoint_url.is_none());
        let token = if anonymous {
            None
        } else {
            let first = fetch_token(timeout).map_err(|detail| auth_error(shown, detail))?;
            Some(Refreshing::new("Google credentials", first, timeout, Box::new(fetch_token)))
        };
        Ok(GcsAuth { endpoint, token, shown: shown.to_string() })
    }

    /// The current token, fetched again shortly before it expires; a wait for a new one ends by
    /// `deadline`.
    fn bearer(&self, deadline: Instant) -> Result<Option<String>, HttpError> {
        let Some(token) = &self.token else { return Ok(None) };
        token.get(deadline).map(|t| Some(t.value)).map_err(|detail| auth_error(&self.shown, detail))
    }
}

impl RequestAuth for GcsAuth {
    fn headers(&self, _uri: &Uri, deadline: Instant) -> Result<Vec<(HeaderName, HeaderValue)>, HttpError> {
        let Some(token) = self.bearer(deadline)? else { return Ok(Vec::new()) };
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| auth_error(&self.shown, "the token holds invalid characters".to_string()))?;
        Ok(vec![(AUTHORIZATION, value)])
    }
}

/// Set (to anything not empty), the only Google credentials are a key file named by
/// `GOOGLE_APPLICATION_CREDENTIALS`: never the gcloud user file, the metadata server or gcloud
/// (the CSI plugin sets it on its daemons, so a volume never borrows the node's identity).
pub const NO_AMBIENT_CREDENTIALS: &str = "STFS_NO_AMBIENT_CREDENTIALS";

/// Whether [`NO_AMBIENT_CREDENTIALS`] is set.
fn ambient_credentials_off() -> bool {
    std::env::var_os(NO_AMBIENT_CREDENTIALS).is_some_and(|v| !v.is_empty())
}

/// The key file's provider alone ([`NO_AMBIENT_CREDENTIALS`]).
fn key_file_provider() -> Result<std::sync::Arc<dyn gcp_auth::TokenProvider>, String> {
    let Some(file) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").filter(|p| !p.is_empty()) else {
        return Err(format!(
            "no Google credentials: the volume has no key (GOOGLE_APPLICATION_CREDENTIALS_JSON) and the node's own \
             identity is off ({NO_AMBIENT_CREDENTIALS}; the CSI plugin's --allow-node-credentials); for a public \
             object use --no-sign-request"
        ));
    };
    let account = gcp_auth::CustomServiceAccount::from_file(&file).map_err(|e| {
        format!(
            "Google credentials could not be loaded from {} (GOOGLE_APPLICATION_CREDENTIALS): {}",
            std::path::Path::new(&file).display(),
            one_line(&e)
        )
    })?;
    Ok(std::sync::Arc::new(account))
}

fn auth_error(shown: &str, detail: String) -> HttpError {
    HttpError::Auth { name: shown.to_string(), detail }
}

/// One token from Application Default Credentials, within `timeout`, on the lookup runtime.
fn fetch_token(timeout: Duration) -> Result<Token, String> {
    lookup(timeout, async {
        let provider = if ambient_credentials_off() { key_file_provider() } else { ambient_provider().await }?;
        let token =
            provider.token(&[SCOPE]).await.map_err(|e| format!("getting a Google token failed: {}", one_line(&e)))?;
        let expires = UNIX_EPOCH + Duration::from_secs(u64::try_from(token.expires_at().timestamp()).unwrap_or(0));
        Ok(Token { value: token.as_str().to_string(), expires })
    })?
}

/// Application Default Credentials: the first of the key file, the gcloud user file, the
/// metadata server and gcloud that answers.
async fn ambient_provider() -> Result<std::sync::Arc<dyn gcp_auth::TokenProvider>, String> {
    {
        gcp_auth::provider().await.map_err(|e| match e {
            // Each source's own failure, in the order tried (gcp_auth names no file or host).
            gcp_auth::Error::NoAuthMethod(gcloud, metadata, user_file) => format!(
                "no Google credentials found (tried: GOOGLE_APPLICATION_CREDENTIALS, not set; \
                 ~/.config/gcloud/application_default_credentials.json: {}; the metadata server \
                 metadata.google.internal: {}; gcloud auth print-access-token: {}); for a public object use \
                 --no-sign-request",
                one_line(&*user_file),
                one_line(&*metadata),
                one_line(&*gcloud)
            ),
            other => match std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").filter(|p| !p.is_empty()) {
                Some(file) => format!(
                    "Google credentials could not be loaded from {} (GOOGLE_APPLICATION_CREDENTIALS): {}",
                    std::path::Path::new(&file).display(),
                    one_line(&other)
                ),
                None => format!("Google credentials could not be loaded: {}", one_line(&other)),
            },
        })
    }
}

/// An error and its causes on one line.
fn one_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let words = inner.to_string();
        if !text.contains(&words) {
            text.push_str(&format!(": {words}"));
        }
        cause = inner.source();
    }
    text.replace('\n', " ")
}

/// Opens the object: its metadata (size, generation), then the media URL pinned to that generation.
pub(crate) fn open(name: &ObjectName, http: &HttpOptions, auth: Arc<GcsAuth>) -> Result<HttpSource, HttpError> {
    let generation = fetch_generation(&name.shown(), &object_path(name, &auth), &auth, http)?;
    open_generation(name, http, auth, &generation)
}

/// Opens the object at `generation` (its metadata's, or a listing's): every media GET carries
/// `ifGenerationMatch`, so another generation answers 412.
pub(crate) fn open_generation(
    name: &ObjectName,
    http: &HttpOptions,
    auth: Arc<GcsAuth>,
    generation: &str,
) -> Result<HttpSource, HttpError> {
    let shown = name.shown();
    if generation.is_empty() || !generation.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HttpError::Protocol { name: shown, detail: "the object has no valid generation".to_string() });
    }
    let url = format!("{}?alt=media&ifGenerationMatch={generation}", object_path(name, &auth));
    let mut http = http.clone();
    http.hub_token_from_env = false;
    http.auth = Some(Authorizer(auth));
    let source = HttpSource::open_named(&url, Some(&shown), http)?;
    log::info!("{shown}: generation {generation}");
    Ok(source)
}

/// The object's JSON API URL.
fn object_path(name: &ObjectName, auth: &GcsAuth) -> String {
    format!("{}/storage/v1/b/{}/o/{}", auth.endpoint, encode_path(&name.bucket, false), encode_path(&name.key, false))
}

/// The URL of one page of the JSON API's objects list of `prefix` (its key) from `token` on:
/// each object's name, size and generation, and the next page's token.
pub(crate) fn list_url(prefix: &ObjectName, auth: &GcsAuth, token: Option<&str>) -> String {
    let mut url = format!(
        "{}/storage/v1/b/{}/o?prefix={}&fields=items(name%2Csize%2Cgeneration)%2CnextPageToken",
        auth.endpoint,
        encode_path(&prefix.bucket, false),
        encode_path(&prefix.key, false)
    );
    if let Some(token) = token {
        url.push_str(&format!("&pageToken={}", encode_path(token, false)));
    }
    url
}

/// A duration as the HTTP source words it: `30 s`, `1.5 s`, `250 ms`.
fn seconds(d: Duration) -> String {
    match d.as_millis() {
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        _ => format!("{:.1} s", d.as_secs_f64()),
    }
}

/// The object's generation, from a metadata GET (JSON API).
fn fetch_generation(shown: &str, url: &str, auth: &GcsAuth, http: &HttpOptions) -> Result<String, HttpError> {
    // Within the one time budget of the opening (`--timeout`, or the checkpoint's deadline).
    let now = Instant::now();
    let budget = http.deadline.map_or(http.timeout, |d| d.saturating_duration_since(now).min(http.timeout));
    // The agent of every other request (proxy, trusted roots, timeouts), the whole exchange
    // within the budget.
    let agent = new_agent(http, None)?;
    let mut request = agent.get(url).query("fields", "generation,size");
    if let Some(token) = auth.bearer(now + budget)? {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    // What the token took is taken from the budget.
    let budget = (now + budget).saturating_duration_since(Instant::now());
    let request = request.config().timeout_global(Some(budget)).build();
    let server = ureq::http::Uri::try_from(url).ok().and_then(|u| u.authority().map(|a| a.to_string()));
    let server = server.unwrap_or_else(|| "the server".to_string());
    let transport = |e: ureq::Error| {
        let detail = match e {
            ureq::Error::Timeout(_) => format!(
                "timed out after {} waiting for {server} to answer the object's metadata request",
                seconds(http.timeout)
            ),
            other => other.to_string(),
        };
        HttpError::Transport { name: shown.to_string(), detail, source: None }
    };
    let mut response = request.call().map_err(transport)?;
    let status = response.status().as_u16();
    let body = response.body_mut().with_config().limit(1 << 20).read_to_vec().map_err(transport)?;
    if status != 200 {
        return Err(match Refusal::parse(status, &body, None) {
            Some(mut refusal) => {
                if status == 404 {
                    let bucket = refusal.message.to_ascii_lowercase().contains("bucket");
                    refusal.code = if bucket { "NoSuchBucket" } else { "NoSuchKey" }.to_string();
                }
                HttpError::Refused { name: shown.to_string(), refusal: Box::new(refusal) }
            }
            None => HttpError::Status { name: shown.to_string(), status },
        });
    }
    let json: serde_json::Value = serde_json::from_slice(&body).map_err(|e| HttpError::Protocol {
        name: shown.to_string(),
        detail: format!("object metadata is not JSON: {e}"),
    })?;
    let generation = match json.get("generation") {
        Some(serde_json::Value::String(text)) if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() => {
            text.clone()
        }
        Some(serde_json::Value::Number(number)) => number.to_string(),
        _ => {
            return Err(HttpError::Protocol {
                name: shown.to_string(),
                detail: "object metadata has no generation".to_string(),
            })
        }
    };
    Ok(generation)
}

impl std::fmt::Debug for GcsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcsAuth").field("endpoint", &self.endpoint).field("signed", &self.token.is_some()).finish()
    }
}
