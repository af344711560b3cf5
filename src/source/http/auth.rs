//! [`RequestAuth`]: per-request credentials for a remote object (a SigV4 signature, a refreshed
//! OAuth token), computed just before each GET so that expiring credentials are renewed on a
//! long-lived mount. The HTTP source calls it only for requests to the object's own origin.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use ureq::http::header::{HeaderName, HeaderValue};
use ureq::http::Uri;

use super::error::HttpError;

/// Computes the headers that authorize one `GET` of `uri` (which carries the range's query string,
/// if any; the `Range` and precondition headers are not signed). Errors must hold no secret.
pub trait RequestAuth: Send + Sync {
    /// The authorization headers for a GET of `uri` sent now. Marked sensitive by the caller.
    /// Returns by `deadline`, the read's own (a wait for new credentials included): the time
    /// spent here is taken from the read's, not added to it.
    fn headers(&self, uri: &Uri, deadline: Instant) -> Result<Vec<(HeaderName, HeaderValue)>, HttpError>;
}

/// A shared [`RequestAuth`], printable without its secrets.
#[derive(Clone)]
pub struct Authorizer(pub Arc<dyn RequestAuth>);

impl fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Authorizer(<redacted>)")
    }
}
