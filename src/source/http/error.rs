//! [`HttpError`]: why a remote source could not be opened or read, and how it becomes an
//! [`io::Error`] of the right kind for the readers above.

use std::fmt;
use std::io;

use super::url::UrlError;

/// Why a remote source could not be opened or read. Messages never contain credentials or query strings.
#[derive(Debug)]
pub enum HttpError {
    /// The URL is unusable (not http(s), no host, credentials inside it).
    BadUrl(UrlError),
    /// An option is malformed (header syntax, missing token variable, proxy URL).
    BadOption(String),
    /// The server ignores `Range` and would send the whole object for every block.
    RangeUnsupported {
        /// The URL, redacted.
        name: String,
    },
    /// The server answered with a status that is neither success nor worth retrying.
    Status {
        /// The URL, redacted.
        name: String,
        /// The HTTP status code.
        status: u16,
    },
    /// The remote object is no longer the version pinned at open time.
    Changed {
        /// The URL, redacted.
        name: String,
        /// What gave the change away.
        detail: String,
    },
    /// A response broke HTTP range semantics (bad Content-Range, wrong length).
    Protocol {
        /// The URL, redacted.
        name: String,
        /// What was wrong.
        detail: String,
    },
    /// Connection, TLS, timeout or body read failure.
    Transport {
        /// The URL, redacted.
        name: String,
        /// What failed, from the underlying error (never a URL).
        detail: String,
        /// The underlying error, when it names no URL.
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A transient failure that persisted through every try of the retry policy.
    GaveUp {
        /// How many tries were made.
        attempts: u32,
        /// The last failure.
        last: Box<HttpError>,
    },
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::BadUrl(error) => write!(f, "{error}"),
            HttpError::BadOption(message) => f.write_str(message),
            HttpError::RangeUnsupported { name } => write!(
                f,
                "{name}: the server ignores Range requests (it answered 200 with the whole object); \
                 stfs needs a server with byte-range support"
            ),
            HttpError::Status { name, status: status @ (401 | 403) } => {
                write!(f, "{name}: HTTP {status}: access denied; check the token or the --header credentials")
            }
            HttpError::Status { name, status: status @ (404 | 410) } => write!(f, "{name}: HTTP {status}: not found"),
            HttpError::Status { name, status } => write!(f, "{name}: HTTP {status}"),
            HttpError::Changed { name, detail } => write!(f, "{name}: remote object changed since mount ({detail})"),
            HttpError::Protocol { name, detail } => write!(f, "{name}: unexpected response: {detail}"),
            HttpError::Transport { name, detail, .. } => write!(f, "{name}: {detail}"),
            HttpError::GaveUp { attempts, last } => write!(f, "{last} (gave up after {attempts} tries)"),
        }
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HttpError::BadUrl(error) => Some(error),
            HttpError::Transport { source, .. } => source.as_deref().map(|e| e as &(dyn std::error::Error + 'static)),
            HttpError::GaveUp { last, .. } => Some(last.as_ref()),
            _ => None,
        }
    }
}

impl From<HttpError> for io::Error {
    fn from(error: HttpError) -> io::Error {
        let kind = match &error {
            HttpError::GaveUp { .. } => io::ErrorKind::TimedOut,
            HttpError::Status { status: 401 | 403, .. } => io::ErrorKind::PermissionDenied,
            HttpError::Status { status: 404 | 410, .. } => io::ErrorKind::NotFound,
            HttpError::BadUrl(_) | HttpError::BadOption(_) => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, error)
    }
}
