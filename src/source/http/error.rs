//! [`HttpError`]: why a remote source could not be opened or read, and how it becomes an
//! [`io::Error`] of the right kind for the readers above.
//!
//! Messages do not name the URL: whoever shows one puts the source's name in front of it once
//! (`URL: HTTP 404: not found`), as for a local file's errors.

use std::fmt;
use std::io;
use std::time::Duration;

use super::url::UrlError;

/// Why a remote source could not be opened or read. Messages never contain credentials or query
/// strings, nor the URL itself (each variant keeps it, redacted, as `name`).
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
    /// The server did not answer, or not fast enough, within the time allowed: it accepted the
    /// connection and went silent, or sent its answer a few bytes at a time.
    TimedOut(Box<Timeout>),
    /// A transient failure that persisted through every try of the retry policy.
    GaveUp {
        /// How many tries were made.
        attempts: u32,
        /// The last failure.
        last: Box<HttpError>,
    },
}

/// A read cut off by the time allowed: where, what it waited for, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeout {
    /// The URL, redacted.
    pub name: String,
    /// The server waited for (`host:port`).
    pub server: String,
    /// What was still awaited when the time ran out.
    pub stage: Stalled,
    /// The bytes asked for, `first..=last`.
    pub range: (u64, u64),
    /// How long it waited in all: the timeout, when that is what ran out.
    pub after: Duration,
}

/// What a stalled server had not yet done when the time ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stalled {
    /// Accept the connection (TCP, TLS or a proxy's CONNECT).
    Connect,
    /// Answer: the status line and headers never arrived (or not all of them).
    Answer,
    /// Send the body: `arrived` of `expected` bytes had come.
    Body {
        /// Body bytes received.
        arrived: u64,
        /// Body bytes promised.
        expected: u64,
    },
}

/// A duration as a person reads it: `30 s`, `1.5 s`, `250 ms`.
pub(crate) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::BadUrl(error) => write!(f, "{error}"),
            HttpError::BadOption(message) => f.write_str(message),
            HttpError::RangeUnsupported { .. } => f.write_str(
                "the server ignores Range requests (it answered 200 with the whole object); \
                 stfs needs a server with byte-range support",
            ),
            HttpError::Status { status: status @ (401 | 403), .. } => {
                write!(f, "HTTP {status}: access denied; check the token or the --header credentials")
            }
            HttpError::Status { status: status @ (404 | 410), .. } => write!(f, "HTTP {status}: not found"),
            HttpError::Status { status, .. } => write!(f, "HTTP {status}"),
            HttpError::Changed { detail, .. } => write!(f, "remote object changed since mount ({detail})"),
            HttpError::Protocol { detail, .. } => write!(f, "unexpected response: {detail}"),
            HttpError::Transport { detail, .. } => f.write_str(detail),
            HttpError::TimedOut(timeout) => {
                let Timeout { server, stage, range: (first, last), after, .. } = timeout.as_ref();
                let after = human_duration(*after);
                match stage {
                    Stalled::Connect => {
                        write!(f, "timed out after {after} waiting for {server} to accept a connection")
                    }
                    Stalled::Answer => write!(
                        f,
                        "timed out after {after} waiting for {server} to answer the request for bytes {first}-{last}"
                    ),
                    Stalled::Body { arrived, expected } => write!(
                        f,
                        "timed out after {after} waiting for {server} to send bytes {first}-{last} \
                         ({arrived} of {expected} bytes had arrived)"
                    ),
                }
            }
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
            HttpError::GaveUp { .. } | HttpError::TimedOut(_) => io::ErrorKind::TimedOut,
            HttpError::Status { status: 401 | 403, .. } => io::ErrorKind::PermissionDenied,
            HttpError::Status { status: 404 | 410, .. } => io::ErrorKind::NotFound,
            HttpError::BadUrl(_) | HttpError::BadOption(_) => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, error)
    }
}
