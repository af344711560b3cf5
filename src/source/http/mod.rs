//! A remote safetensors object read over HTTP(S) with range requests, as a [`Source`](crate::source::Source).
//!
//! Opening sends one speculative ranged GET for the first `prefix_len` bytes: it yields the total size,
//! the version pin (ETag, else Last-Modified, plus size) and usually the whole safetensors header.
//! Every later block is one ranged GET carrying `If-Match` (or `If-Unmodified-Since`), and every
//! response is checked against the pin, so a replaced object fails with "changed since mount" instead
//! of mixing versions. Each stream owns its own agent (keep-alive connection pool), so streams proceed
//! in parallel over separate connections. Transient failures are retried with capped, jittered backoff.
//!
//! - `source`: [`HttpSource`] and its readers, the opening request and the checked range reads;
//! - `client`: one ranged GET (headers, redirects followed by hand) and the retry loop around it;
//! - `pin`: the version pin and the header parsing it needs; `retry`: [`RetryPolicy`];
//! - `url`: validation ([`UrlError`]) and credential-free [`display_name`]s;
//! - `agent`: every ureq agent's configuration (proxy, roots, timeouts), in one place;
//! - `options`: [`HttpOptions`]; `error`: [`HttpError`]; `auth`: [`RequestAuth`], per-request
//!   credentials (object stores' signatures and tokens).

mod agent;
mod auth;
mod client;
mod error;
mod options;
mod pin;
mod retry;
mod source;
mod url;

#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;

pub(crate) use agent::new_agent;
pub use auth::{Authorizer, RequestAuth};
pub use error::{HttpError, Refusal, Stalled, Timeout};
pub use options::{HttpOptions, ProxySetting, Secret, DEFAULT_TIMEOUT};
pub use retry::RetryPolicy;
pub use source::HttpSource;
pub use url::{display_name, UrlError};
pub(crate) use url::{resolve_location, same_origin};
