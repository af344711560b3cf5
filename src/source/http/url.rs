//! URL handling for remote sources: validation, credential-free display names, origins and redirects.

use std::fmt;

use ureq::http::Uri;

/// Hosts whose URLs get `HF_TOKEN` automatically (the Hugging Face hub and its short domain).
const HUB_HOSTS: [&str; 2] = ["huggingface.co", "hf.co"];

/// Why a URL is refused. Each variant holds the URL as shown in messages ([`display_name`]: no
/// credentials, no query string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlError {
    /// The text does not parse as a URL.
    Invalid {
        /// The URL, redacted.
        shown: String,
    },
    /// The scheme is not `http` or `https`.
    Scheme {
        /// The URL, redacted.
        shown: String,
    },
    /// The URL names no host.
    NoHost {
        /// The URL, redacted.
        shown: String,
    },
    /// The URL carries `user:pass@`.
    Credentials {
        /// The URL, redacted.
        shown: String,
    },
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::Invalid { shown } => write!(f, "not a valid URL: {shown}"),
            UrlError::Scheme { shown } => write!(f, "only http:// and https:// URLs are supported: {shown}"),
            UrlError::NoHost { shown } => write!(f, "URL has no host: {shown}"),
            UrlError::Credentials { shown } => write!(
                f,
                "credentials inside the URL are refused ({shown}); pass them with --header or a token variable"
            ),
        }
    }
}

impl std::error::Error for UrlError {}

/// Parses an absolute http(s) URL. Refuses userinfo (`user:pass@host`) because credentials in a URL
/// end up in shell history, process lists and logs; a header or a token variable is the safe way.
pub(crate) fn parse_http_url(url: &str) -> Result<Uri, UrlError> {
    let shown = || display_name(url);
    let uri: Uri = url.parse().map_err(|_| UrlError::Invalid { shown: shown() })?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(UrlError::Scheme { shown: shown() }),
    }
    let authority = uri.authority().ok_or_else(|| UrlError::NoHost { shown: shown() })?;
    if authority.as_str().contains('@') {
        return Err(UrlError::Credentials { shown: shown() });
    }
    Ok(uri)
}

/// The URL without userinfo, query string or fragment, for messages and logs. A query string often
/// carries a signature or token (signed CDN URLs), so only its presence is shown.
pub fn display_name(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => (&url[..at], &url[at + 3..]),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let tail = &rest[authority_end..];
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let path = &tail[..path_end];
    let query_marker = if tail[path_end..].starts_with('?') { "?<redacted>" } else { "" };
    if scheme.is_empty() {
        format!("{host}{path}{query_marker}")
    } else {
        format!("{scheme}://{host}{path}{query_marker}")
    }
}

/// Whether two URLs share scheme, host and port: credentials go only to the origin they were meant for.
pub(crate) fn same_origin(a: &Uri, b: &Uri) -> bool {
    a.scheme_str() == b.scheme_str()
        && a.host().map(str::to_ascii_lowercase) == b.host().map(str::to_ascii_lowercase)
        && effective_port(a) == effective_port(b)
}

fn effective_port(uri: &Uri) -> Option<u16> {
    uri.port_u16().or(match uri.scheme_str() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    })
}

/// Whether the URL points at the Hugging Face hub (which takes `HF_TOKEN` as a bearer token).
pub(crate) fn is_hub_url(uri: &Uri) -> bool {
    let Some(host) = uri.host() else { return false };
    let host = host.to_ascii_lowercase();
    HUB_HOSTS.iter().any(|hub| host == *hub || host.strip_suffix(hub).is_some_and(|sub| sub.ends_with('.')))
}

/// Resolves a `Location` header against the URL that answered with it (absolute, scheme-relative,
/// absolute-path or relative-path forms). Returns `None` for anything that is not http(s).
pub(crate) fn resolve_location(base: &Uri, location: &str) -> Option<Uri> {
    let location = location.split('#').next().unwrap_or_default().trim();
    let scheme = base.scheme_str()?;
    let authority = base.authority()?.as_str();
    let absolute = if location.contains("://") {
        location.to_string()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let base_path = base.path();
        let directory = &base_path[..base_path.rfind('/').map_or(0, |slash| slash + 1)];
        let directory = if directory.is_empty() { "/" } else { directory };
        format!("{scheme}://{authority}{directory}{location}")
    };
    parse_http_url(&absolute).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_name_hides_userinfo_and_query() {
        assert_eq!(
            display_name("https://bob:hunter2@cdn.example/a/b.safetensors?X-Sig=abc#frag"),
            "https://cdn.example/a/b.safetensors?<redacted>"
        );
        assert_eq!(display_name("http://h:8080/x"), "http://h:8080/x");
        assert_eq!(display_name("http://h"), "http://h");
    }

    #[test]
    fn parse_refuses_userinfo_without_echoing_it() {
        let err = parse_http_url("https://bob:hunter2@example.org/m").unwrap_err().to_string();
        assert_eq!(
            err,
            "credentials inside the URL are refused (https://example.org/m); pass them with --header or a token variable"
        );
        assert!(parse_http_url("ftp://example.org/m").is_err());
        assert!(parse_http_url("/local/path").is_err());
        assert!(parse_http_url("https://example.org/m?sig=1").is_ok());
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        let a: Uri = "https://Example.org/x".parse().unwrap();
        let b: Uri = "https://example.org:443/y".parse().unwrap();
        let c: Uri = "http://example.org/x".parse().unwrap();
        let d: Uri = "https://cdn.example.org/x".parse().unwrap();
        assert!(same_origin(&a, &b));
        assert!(!same_origin(&a, &c));
        assert!(!same_origin(&a, &d));
    }

    #[test]
    fn hub_hosts_are_recognised() {
        let yes = ["https://huggingface.co/o/r/resolve/main/m.safetensors", "https://hf.co/x"];
        for url in yes {
            assert!(is_hub_url(&url.parse().unwrap()), "{url}");
        }
        let no = ["https://nothuggingface.co/x", "https://huggingface.co.evil.org/x"];
        for url in no {
            assert!(!is_hub_url(&url.parse().unwrap()), "{url}");
        }
    }

    #[test]
    fn locations_resolve_in_every_form() {
        let base: Uri = "https://hub.example/org/repo/resolve/main/m.bin?x=1".parse().unwrap();
        let cases = [
            ("https://cdn.example/obj?sig=2", "https://cdn.example/obj?sig=2"),
            ("//cdn.example/obj", "https://cdn.example/obj"),
            ("/other/path", "https://hub.example/other/path"),
            ("sibling.bin", "https://hub.example/org/repo/resolve/main/sibling.bin"),
            ("/p#frag", "https://hub.example/p"),
        ];
        for (location, expected) in cases {
            assert_eq!(resolve_location(&base, location).unwrap().to_string(), expected);
        }
        assert!(resolve_location(&base, "ftp://x/y").is_none());
    }
}
