//! [`RequestAuth`]: per-request credentials for a remote object (a SigV4 signature, a refreshed
//! OAuth token), computed just before each GET so that expiring credentials are renewed on a
//! long-lived mount. The HTTP source calls it only for requests to the object's own origin.

use std::fmt;
use std::sync::Arc;

use ureq::http::header::{HeaderName, HeaderValue};
use ureq::http::Uri;

use super::error::HttpError;

/// Computes the headers that authorize one `GET` of `uri` (which carries the range's query string,
/// if any; the `Range` and precondition headers are not signed). Errors must hold no secret.
pub trait RequestAuth: Send + Sync {
    /// The authorization headers for a GET of `uri` sent now. Marked sensitive by the caller.
    fn headers(&self, uri: &Uri) -> Result<Vec<(HeaderName, HeaderValue)>, HttpError>;
}

/// A shared [`RequestAuth`], printable without its secrets.
#[derive(Clone)]
pub struct Authorizer(pub Arc<dyn RequestAuth>);

impl fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Authorizer(<redacted>)")
    }
}
