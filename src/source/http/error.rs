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
    /// An object store refused the request with an error document naming the cause.
    Refused {
        /// The object, redacted.
        name: String,
        /// What the store said.
        refusal: Box<Refusal>,
    },
    /// Credentials for the request could not be had (none found, a refresh failed).
    Auth {
        /// The object, redacted.
        name: String,
        /// What was tried and what failed (never a secret).
        detail: String,
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
            HttpError::Refused { refusal, .. } => write!(f, "{refusal}"),
            HttpError::Auth { detail, .. } => f.write_str(detail),
        }
    }
}

impl HttpError {
    /// A copy, for reporting one failure again (a cause that cannot be copied becomes its text).
    pub fn clone_message(&self) -> HttpError {
        match self {
            HttpError::Auth { name, detail } => HttpError::Auth { name: name.clone(), detail: detail.clone() },
            HttpError::Refused { name, refusal } => HttpError::Refused { name: name.clone(), refusal: refusal.clone() },
            HttpError::Status { name, status } => HttpError::Status { name: name.clone(), status: *status },
            HttpError::BadOption(message) => HttpError::BadOption(message.clone()),
            HttpError::TimedOut(timeout) => HttpError::TimedOut(timeout.clone()),
            other => HttpError::BadOption(other.to_string()),
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
            HttpError::Refused { refusal, .. } if matches!(refusal.status, 401 | 403) => {
                io::ErrorKind::PermissionDenied
            }
            HttpError::Refused { refusal, .. } if matches!(refusal.status, 404 | 410) => io::ErrorKind::NotFound,
            HttpError::Auth { .. } => io::ErrorKind::PermissionDenied,
            HttpError::BadUrl(_) | HttpError::BadOption(_) => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, error)
    }
}

/// An object store's error document: S3's `<Error><Code>..</Code><Message>..</Message>`, GCS's
/// `{"error": {"message": ..}}`, plus the bucket's region when the store names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: u16,
    /// The store's error code (`NoSuchKey`, `AccessDenied`, ...), empty for GCS.
    pub code: String,
    /// The store's message, cut to one short line.
    pub message: String,
    /// The region the bucket is in, when the answer names it (`x-amz-bucket-region`, `<Region>`).
    pub region: Option<String>,
    /// Whether the request's region was the user's `--region` (so a wrong one is fixed there, not
    /// through `AWS_REGION`, which the option overrides).
    pub region_from_option: bool,
}

impl Refusal {
    /// Reads an error body; `None` when it is not an object store's error document.
    pub fn parse(status: u16, body: &[u8], region: Option<String>) -> Option<Refusal> {
        let text = String::from_utf8_lossy(body);
        let element = |tag: &str| {
            let start = text.find(&format!("<{tag}>"))? + tag.len() + 2;
            let end = start + text[start..].find(&format!("</{tag}>"))?;
            Some(text[start..end].trim().to_string())
        };
        let (code, message, region) = if let Some(code) = element("Code") {
            (code, element("Message").unwrap_or_default(), region.or_else(|| element("Region")))
        } else {
            let json: serde_json::Value = serde_json::from_slice(body).ok()?;
            let message = json.pointer("/error/message")?.as_str()?.to_string();
            (String::new(), message, region)
        };
        let mut message: String = message.chars().filter(|c| !c.is_control()).take(200).collect();
        if message.len() >= 200 {
            message.push_str("...");
        }
        Some(Refusal { status, code, message, region, region_from_option: false })
    }

    /// Whether the answer says the request went to the wrong region.
    pub fn wrong_region(&self) -> bool {
        matches!(self.code.as_str(), "PermanentRedirect" | "AuthorizationHeaderMalformed" | "IncorrectEndpoint")
            || (self.status == 301 && self.region.is_some())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (status, code) = (self.status, &self.code);
        let cause = match code.as_str() {
            "NoSuchKey" => "no such key".to_string(),
            "NoSuchBucket" => "no such bucket".to_string(),
            "AccessDenied" | "AllAccessDisabled" => {
                "access denied: check the credentials and the bucket's policy".to_string()
            }
            "SignatureDoesNotMatch" => "access denied: the signature does not match (wrong secret key?)".to_string(),
            "InvalidAccessKeyId" => "access denied: the access key id is unknown to the server".to_string(),
            "ExpiredToken" | "TokenRefreshRequired" => {
                "the session token has expired; renew the credentials".to_string()
            }
            "InvalidToken" => "the session token is invalid".to_string(),
            _ if self.wrong_region() => match (&self.region, self.region_from_option) {
                (Some(region), true) => format!("wrong region: the bucket is in {region} (use --region {region})"),
                (Some(region), false) => format!("wrong region: the bucket is in {region} (set AWS_REGION={region})"),
                (None, true) => "wrong region for this bucket (--region names another)".to_string(),
                (None, false) => "wrong region for this bucket (set AWS_REGION)".to_string(),
            },
            _ if status == 404 => format!("not found ({})", self.message),
            _ if matches!(status, 401 | 403) => format!("access denied ({})", self.message),
            _ if self.message.is_empty() => "refused".to_string(),
            _ => self.message.clone(),
        };
        if code.is_empty() {
            write!(f, "{cause} (HTTP {status})")
        } else {
            write!(f, "{cause} (HTTP {status} {code})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_error_documents_name_the_cause() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
        let refusal = Refusal::parse(404, body, None).unwrap();
        assert_eq!(refusal.to_string(), "no such key (HTTP 404 NoSuchKey)");
        let body = b"<Error><Code>PermanentRedirect</Code><Message>m</Message></Error>";
        let refusal = Refusal::parse(301, body, Some("eu-west-1".to_string())).unwrap();
        assert!(refusal.wrong_region());
        assert!(refusal.to_string().contains("the bucket is in eu-west-1 (set AWS_REGION=eu-west-1)"), "{refusal}");
        // The user's --region was wrong: the line says to change the option, which wins over AWS_REGION.
        let refusal = Refusal { region_from_option: true, ..refusal };
        assert!(refusal.to_string().contains("the bucket is in eu-west-1 (use --region eu-west-1)"), "{refusal}");
        let refusal = Refusal { region: None, ..refusal };
        assert!(refusal.to_string().starts_with("wrong region for this bucket (--region names another)"), "{refusal}");
        let refusal = Refusal::parse(404, br#"{"error":{"code":404,"message":"No such object: b/o"}}"#, None).unwrap();
        assert_eq!(refusal.to_string(), "not found (No such object: b/o) (HTTP 404)");
        assert!(Refusal::parse(404, b"<html>nope</html>", None).is_none());
    }
}
