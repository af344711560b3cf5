//! The version pin of a remote object (size plus ETag or Last-Modified) and the header parsing it needs.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use ureq::http::header::{HeaderMap, HeaderName, HeaderValue, ETAG, IF_MATCH, IF_UNMODIFIED_SINCE, LAST_MODIFIED};

/// What identifies the object version that was mounted: every later response must match it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pin {
    /// Total size from the first response.
    pub size: u64,
    /// The entity tag, as sent (`"abc"` or `W/"abc"`): raw bytes, which may be outside ASCII.
    pub etag: Option<HeaderValue>,
    /// The Last-Modified value, as sent (compared as bytes, never re-formatted).
    pub last_modified: Option<HeaderValue>,
}

impl Pin {
    /// Pins the object described by the first response's headers and its total size.
    pub fn from_headers(size: u64, headers: &HeaderMap) -> Pin {
        Pin { size, etag: validator(headers, &ETAG), last_modified: validator(headers, &LAST_MODIFIED) }
    }

    /// The precondition header that makes the server refuse (412) a changed object. A weak ETag
    /// never satisfies `If-Match` (strong comparison), so it falls back to `If-Unmodified-Since`.
    pub fn precondition(&self) -> Option<(HeaderName, &HeaderValue)> {
        match (&self.etag, &self.last_modified) {
            (Some(etag), _) if !is_weak(etag) => Some((IF_MATCH, etag)),
            (_, Some(modified)) => Some((IF_UNMODIFIED_SINCE, modified)),
            _ => None,
        }
    }

    /// Checks a later response's validators against the pin; servers that ignore preconditions
    /// are caught here. A validator that was pinned must be there and equal: a server that stops
    /// sending it may be serving another version. Returns what differs.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), PinMismatch> {
        if let Some(pinned) = &self.etag {
            match validator(headers, &ETAG) {
                None => return Err(PinMismatch::ETagGone),
                Some(now) if opaque_tag(pinned) != opaque_tag(&now) => return Err(PinMismatch::ETag),
                Some(_) => {}
            }
        }
        if let Some(pinned) = &self.last_modified {
            match validator(headers, &LAST_MODIFIED) {
                None => return Err(PinMismatch::LastModifiedGone),
                Some(now) if now.as_bytes() != pinned.as_bytes() => return Err(PinMismatch::LastModified),
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The pinned ETag as response headers (none if none was pinned), for [`Pin::check`].
    pub fn etag_headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(etag) = &self.etag {
            headers.insert(ETAG, etag.clone());
        }
        headers
    }

    /// The pinned ETag in words (`none`).
    pub fn shown_etag(&self) -> String {
        self.etag.as_ref().map_or_else(|| "none".to_string(), shown_validator)
    }

    /// When the pinned version was last modified, if the server said so in a parseable form.
    pub fn modified_time(&self) -> Option<SystemTime> {
        self.last_modified.as_ref().and_then(|value| value.to_str().ok()).and_then(parse_http_date)
    }
}

/// Which validator of a later response differs from the pin, or is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PinMismatch {
    /// The entity tag (compared without its weakness marker).
    ETag,
    /// The entity tag was pinned, and the response has none.
    ETagGone,
    /// The Last-Modified value (compared as bytes).
    LastModified,
    /// The Last-Modified value was pinned, and the response has none.
    LastModifiedGone,
}

impl fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PinMismatch::ETag => "its ETag differs",
            PinMismatch::ETagGone => "its ETag is gone",
            PinMismatch::LastModified => "its Last-Modified differs",
            PinMismatch::LastModifiedGone => "its Last-Modified is gone",
        })
    }
}

/// A validator in words for logs and cache keys: printable ASCII as sent (so the usual values read
/// as before), any other byte as `\xe9` and a backslash as `\\`, so two different validators never
/// read the same.
pub(crate) fn shown_validator(value: &HeaderValue) -> String {
    let mut shown = String::new();
    for &byte in value.as_bytes() {
        match byte {
            b'\\' => shown.push_str("\\\\"),
            b' '..=b'~' => shown.push(char::from(byte)),
            other => shown.push_str(&format!("\\x{other:02x}")),
        }
    }
    shown
}

/// Whether an entity tag is weak (`W/"abc"`).
fn is_weak(etag: &HeaderValue) -> bool {
    etag.as_bytes().starts_with(b"W/")
}

/// The tag without its weakness marker: proxies may weaken a tag without the bytes changing.
fn opaque_tag(etag: &HeaderValue) -> &[u8] {
    let bytes = etag.as_bytes();
    bytes.strip_prefix(b"W/").unwrap_or(bytes)
}

/// A validator header's raw value without surrounding whitespace, if present and not empty. Raw:
/// a value with bytes outside ASCII (obs-text) is a validator like any other.
fn validator(headers: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    let trimmed = headers.get(name)?.as_bytes().trim_ascii();
    if trimmed.is_empty() {
        return None;
    }
    // A part of a valid header value is a valid header value.
    HeaderValue::from_bytes(trimmed).ok()
}

/// A header's value as text, if present and printable.
pub(crate) fn header_text(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    headers.get(name).and_then(|value| value.to_str().ok()).map(|text| text.trim().to_string())
}

/// A parsed `Content-Range: bytes first-last/total` (the range is absent in `bytes */total`, the total in
/// `bytes first-last/*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ContentRange {
    /// First and last byte positions, inclusive.
    pub range: Option<(u64, u64)>,
    /// Total length of the object.
    pub total: Option<u64>,
}

/// Parses a Content-Range value; `None` for anything malformed (including `last < first`).
pub(crate) fn parse_content_range(value: &str) -> Option<ContentRange> {
    let spec = value.trim().strip_prefix("bytes")?.trim_start();
    let (range_text, total_text) = spec.split_once('/')?;
    let total = match total_text.trim() {
        "*" => None,
        digits => Some(parse_decimal(digits)?),
    };
    let range = match range_text.trim() {
        "*" => None,
        pair => {
            let (first, last) = pair.split_once('-')?;
            let (first, last) = (parse_decimal(first)?, parse_decimal(last)?);
            if last < first || total.is_some_and(|total| last >= total) {
                return None;
            }
            Some((first, last))
        }
    };
    if range.is_none() && total.is_none() {
        return None;
    }
    Some(ContentRange { range, total })
}

fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only date form servers may send now.
pub(crate) fn parse_http_date(text: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (_weekday, rest) = text.trim().split_once(", ")?;
    let mut fields = rest.split(' ');
    let day: u64 = parse_decimal(fields.next()?)?;
    let month_name = fields.next()?;
    let month = MONTHS.iter().position(|m| *m == month_name)? as u64 + 1;
    let year: u64 = parse_decimal(fields.next()?)?;
    let mut clock = fields.next()?.split(':').map(parse_decimal);
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if fields.next()? != "GMT" || fields.next().is_some() || clock.next().is_some() {
        return None;
    }
    if !(1970..=9999).contains(&year) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_since_epoch(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (valid for years from 1970 on).
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    // Count years from March so that the leap day is the last day of the counted year.
    let (year, month) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era_days = year * 365 + year / 4 - year / 100 + year / 400;
    let day_of_year = (153 * month + 2) / 5 + day - 1;
    // 719_468 is the same count for 1970-01-01.
    era_days + day_of_year - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use ureq::http::HeaderValue;

    fn headers(pairs: &[(HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn content_range_forms() {
        let full = parse_content_range("bytes 0-99/1000").unwrap();
        assert_eq!(full, ContentRange { range: Some((0, 99)), total: Some(1000) });
        assert_eq!(parse_content_range("bytes */1000").unwrap().total, Some(1000));
        assert_eq!(parse_content_range("bytes 5-9/*").unwrap().total, None);
        for bad in ["bytes 9-5/100", "bytes 0-100/100", "bytes -1-5/10", "items 0-1/2", "bytes */*", "bytes 0-1"] {
            assert!(parse_content_range(bad).is_none(), "{bad}");
        }
        assert!(parse_content_range("bytes 0-1/99999999999999999999999").is_none());
    }

    #[test]
    fn strong_etag_is_the_precondition_weak_falls_back_to_date() {
        let strong = Pin::from_headers(5, &headers(&[(ETAG, "\"v1\""), (LAST_MODIFIED, "x")]));
        assert_eq!(strong.precondition(), Some((IF_MATCH, &HeaderValue::from_static("\"v1\""))));
        let weak = Pin::from_headers(5, &headers(&[(ETAG, "W/\"v1\""), (LAST_MODIFIED, "x")]));
        assert_eq!(weak.precondition(), Some((IF_UNMODIFIED_SINCE, &HeaderValue::from_static("x"))));
        let bare = Pin::from_headers(5, &HeaderMap::new());
        assert_eq!(bare.precondition(), None);
    }

    #[test]
    fn check_spots_changed_validators() {
        let pin = Pin::from_headers(5, &headers(&[(ETAG, "\"v1\""), (LAST_MODIFIED, "a")]));
        let both = |etag, modified| headers(&[(ETAG, etag), (LAST_MODIFIED, modified)]);
        assert!(pin.check(&both("\"v1\"", "a")).is_ok());
        assert!(pin.check(&both("W/\"v1\"", "a")).is_ok());
        assert_eq!(pin.check(&both("\"v2\"", "a")), Err(PinMismatch::ETag));
        assert_eq!(pin.check(&both("\"v1\"", "b")), Err(PinMismatch::LastModified));
    }

    /// A server that ignores If-Match and stops sending the pinned validators may be serving
    /// another version: their absence is a mismatch, never a pass.
    #[test]
    fn check_refuses_a_response_without_the_pinned_validators() {
        let pin = Pin::from_headers(5, &headers(&[(ETAG, "\"v1\""), (LAST_MODIFIED, "a")]));
        assert_eq!(pin.check(&HeaderMap::new()), Err(PinMismatch::ETagGone));
        assert_eq!(pin.check(&headers(&[(ETAG, " ")])), Err(PinMismatch::ETagGone));
        assert_eq!(pin.check(&headers(&[(ETAG, "\"v1\"")])), Err(PinMismatch::LastModifiedGone));
        assert_eq!(pin.check(&headers(&[(LAST_MODIFIED, "a")])), Err(PinMismatch::ETagGone));
        let dated = Pin::from_headers(5, &headers(&[(LAST_MODIFIED, "a")]));
        assert!(dated.check(&headers(&[(LAST_MODIFIED, "a")])).is_ok(), "an ETag that was never sent is not missed");
        assert_eq!(dated.check(&HeaderMap::new()), Err(PinMismatch::LastModifiedGone));
    }

    /// An ETag with bytes outside ASCII (obs-text) is pinned, sent back and compared as bytes.
    #[test]
    fn validators_outside_ascii_are_pinned_as_bytes() {
        let raw = |bytes: &[u8]| {
            let mut map = HeaderMap::new();
            map.insert(ETAG, HeaderValue::from_bytes(bytes).unwrap());
            map
        };
        let pin = Pin::from_headers(5, &raw(b"\"\xe9v1\""));
        let (name, value) = pin.precondition().expect("a precondition for an obs-text ETag");
        assert_eq!((name, value.as_bytes()), (IF_MATCH, &b"\"\xe9v1\""[..]));
        assert!(pin.check(&raw(b"\"\xe9v1\"")).is_ok());
        assert_eq!(pin.check(&raw(b"\"\xe9v2\"")), Err(PinMismatch::ETag));
        assert_eq!(shown_validator(pin.etag.as_ref().unwrap()), "\"\\xe9v1\"");
        assert_eq!(shown_validator(&HeaderValue::from_static("\"v1\"")), "\"v1\"");
    }

    #[test]
    fn http_dates_parse() {
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 784_111_777);
        let leap = parse_http_date("Thu, 29 Feb 2024 00:00:00 GMT").unwrap();
        assert_eq!(leap.duration_since(UNIX_EPOCH).unwrap().as_secs(), 1_709_164_800);
        for bad in
            ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 06 Foo 1994 08:49:37 GMT", ""]
        {
            assert!(parse_http_date(bad).is_none(), "{bad}");
        }
    }
}
