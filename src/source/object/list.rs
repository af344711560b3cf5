//! A prefix of an object store (`s3://BUCKET/PREFIX/`, `gs://BUCKET/PREFIX/`) listed once, at
//! mount: S3's ListObjectsV2 or the GCS JSON API's objects list, page after page, within the
//! opening's deadline and the limits the caller gives (objects, bytes of answers), each object
//! with the version the listing saw (its ETag, its generation), which [`Listing::open`] pins.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ureq::http::Uri;

use super::aws::AwsSession;
use super::gcs::{self, GcsAuth};
use super::names::ObjectName;
use super::s3;
use crate::source::http::{new_agent, Authorizer, HttpError, HttpOptions, HttpSource, Refusal};
use crate::source::Source;

/// Tries of one page on a transient failure (5xx, 429, a dropped connection), within the deadline.
const PAGE_ATTEMPTS: u32 = 3;

/// Longest error document read from a refused listing.
const ERROR_BODY_LIMIT: u64 = 64 << 10;

/// One object of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its key below the prefix (`unet/config.json`).
    pub path: String,
    /// Its size, as listed.
    pub size: u64,
    /// The version listed: the ETag (S3; `None` where the store lists none), the generation (GCS).
    pub version: Option<String>,
}

/// How much one listing may hold.
#[derive(Clone, Copy, Debug)]
pub struct ListLimits {
    /// Most objects.
    pub objects: usize,
    /// Most bytes of the store's answers, every page together.
    pub bytes: u64,
}

/// A listed prefix, and how to reach its objects.
pub struct Listing {
    /// The prefix listed.
    pub prefix: ObjectName,
    /// Its objects, in key order.
    pub objects: Vec<Listed>,
    /// The prefix holds more than the limits: the listing stopped there.
    pub over_limit: bool,
    access: Access,
}

/// The store's side of a listing: its objects are opened as it was listed.
pub(crate) enum Access {
    S3 { session: Arc<AwsSession>, endpoint: Option<String>, region: Option<String> },
    Gcs { auth: Arc<GcsAuth> },
}

/// One page: its objects (whole keys, sizes, versions), the next page's token, its size.
struct Page {
    objects: Vec<(String, u64, Option<String>)>,
    next: Option<String>,
    bytes: u64,
}

impl Listing {
    /// Lists `prefix` through `access`, within `http`'s deadline and `limits`.
    pub(crate) fn list(
        prefix: &ObjectName,
        mut access: Access,
        http: &HttpOptions,
        limits: ListLimits,
    ) -> Result<Listing, HttpError> {
        let shown = prefix.shown();
        let (objects, over_limit) = match &mut access {
            Access::S3 { session, endpoint, region } => {
                let list = |in_region: &str| {
                    let auth = s3::signer(session, in_region, &shown);
                    let url = |token: Option<&str>| s3::list_url(prefix, endpoint.as_deref(), in_region, token);
                    pages(prefix, limits, |token, budget| {
                        let url = url(token).map_err(HttpError::BadOption)?;
                        let body = get(&shown, &url, auth.as_ref(), http, budget)?;
                        parse_s3(&body).map_err(|detail| HttpError::Protocol { name: shown.clone(), detail })
                    })
                };
                let (listed, found) = s3::in_region(prefix, region.as_deref(), session, list)?;
                *region = Some(found);
                listed
            }
            Access::Gcs { auth } => {
                let authorizer = Authorizer(Arc::clone(auth) as _);
                pages(prefix, limits, |token, budget| {
                    let body = get(&shown, &gcs::list_url(prefix, auth, token), Some(&authorizer), http, budget)?;
                    parse_gcs(&body).map_err(|detail| HttpError::Protocol { name: shown.clone(), detail })
                })?
            }
        };
        Ok(Listing { prefix: prefix.clone(), objects, over_limit, access })
    }

    /// Opens `object` at the version listed: S3 with `If-Match` on its ETag (a store that lists
    /// none pins what the opening finds, as for a single object), GCS at its generation; a size
    /// other than the one listed is a change too.
    pub fn open(&self, object: &Listed, http: &HttpOptions) -> Result<HttpSource, HttpError> {
        let name = self.prefix.child(&object.path);
        let source = match &self.access {
            Access::S3 { session, endpoint, region } => {
                let mut http = http.clone();
                http.listed_etag = object.version.clone();
                let region = region.as_deref().unwrap_or_default();
                s3::open_in(&name, &http, endpoint.as_deref(), session, region)?
            }
            Access::Gcs { auth } => {
                gcs::open_generation(&name, http, Arc::clone(auth), object.version.as_deref().unwrap_or_default())?
            }
        };
        if source.len() != object.size {
            let detail = format!("listed at {} bytes, opened at {}", object.size, source.len());
            return Err(HttpError::Changed { name: name.shown(), detail });
        }
        Ok(source)
    }
}

/// Every page of the listing of `prefix`, `page` asked for each with the previous page's token
/// and the bytes still allowed: the objects below the prefix that a mount could serve (no
/// folder markers, no empty or `.`/`..` parts), and whether the limits stopped the listing.
fn pages(
    prefix: &ObjectName,
    limits: ListLimits,
    mut page: impl FnMut(Option<&str>, u64) -> Result<Page, HttpError>,
) -> Result<(Vec<Listed>, bool), HttpError> {
    let mut objects = Vec::new();
    let mut token: Option<String> = None;
    let mut bytes_left = limits.bytes;
    loop {
        let answer = match page(token.as_deref(), bytes_left) {
            Err(HttpError::Protocol { detail, .. }) if detail == OVER_BUDGET => return Ok((objects, true)),
            other => other?,
        };
        bytes_left = bytes_left.saturating_sub(answer.bytes);
        for (key, size, version) in answer.objects {
            let Some(path) = key.strip_prefix(prefix.key.as_str()) else { continue };
            if path.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
                continue;
            }
            objects.push(Listed { path: path.to_string(), size, version });
            if objects.len() > limits.objects {
                return Ok((objects, true));
            }
        }
        match answer.next {
            Some(next) if token.as_deref() == Some(next.as_str()) => {
                let detail = "the listing gave the same page token twice".to_string();
                return Err(HttpError::Protocol { name: prefix.shown(), detail });
            }
            Some(next) => token = Some(next),
            None => break,
        }
        log::debug!("{}: {} objects listed so far", prefix.shown(), objects.len());
    }
    objects.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    log::info!("{}: {} objects listed", prefix.shown(), objects.len());
    Ok((objects, false))
}

/// The detail of the error a page over the bytes still allowed gives (the listing then stops).
const OVER_BUDGET: &str = "the listing's answers are over the bytes a mount reads";

/// One GET of a listing page, its body at most `limit` bytes, within the opening's deadline
/// (`http.deadline`, else `--timeout`), tried again on a transient failure while time is left.
fn get(
    shown: &str,
    url: &str,
    auth: Option<&Authorizer>,
    http: &HttpOptions,
    limit: u64,
) -> Result<Vec<u8>, HttpError> {
    let now = Instant::now();
    let deadline = http.deadline.map_or(now + http.timeout, |d| d.min(now + http.timeout));
    let agent = new_agent(http, None)?;
    let uri: Uri = url.parse().map_err(|_| HttpError::BadOption(format!("{shown}: the listing URL is invalid")))?;
    let server = uri.authority().map_or_else(|| "the server".to_string(), |a| a.to_string());
    let mut attempt = 0;
    loop {
        attempt += 1;
        let transient = |error: HttpError, attempt: u32| {
            let pause = Duration::from_millis(200 * u64::from(attempt));
            if attempt < PAGE_ATTEMPTS && Instant::now() + pause < deadline {
                log::info!("{shown}: listing: {error}; trying again");
                std::thread::sleep(pause);
                Ok(())
            } else {
                Err(error)
            }
        };
        let mut request = agent.get(url);
        if let Some(auth) = auth {
            for (name, mut value) in auth.0.headers(&uri, deadline)? {
                value.set_sensitive(true);
                request = request.header(name, value);
            }
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        let timed_out = || HttpError::Transport {
            name: shown.to_string(),
            detail: format!("timed out waiting for {server} to list the prefix"),
            source: None,
        };
        if budget.is_zero() {
            return Err(timed_out());
        }
        let request = request.config().timeout_global(Some(budget)).build();
        let mut response = match request.call() {
            Ok(response) => response,
            Err(ureq::Error::Timeout(_)) => return Err(timed_out()),
            Err(e) => {
                let error = HttpError::Transport { name: shown.to_string(), detail: e.to_string(), source: None };
                transient(error, attempt)?;
                continue;
            }
        };
        let status = response.status().as_u16();
        let region = response.headers().get("x-amz-bucket-region").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body_limit = if status == 200 { limit } else { ERROR_BODY_LIMIT };
        let body = match response.body_mut().with_config().limit(body_limit).read_to_vec() {
            Ok(body) => body,
            Err(ureq::Error::BodyExceedsLimit(_)) if status == 200 => {
                return Err(HttpError::Protocol { name: shown.to_string(), detail: OVER_BUDGET.to_string() })
            }
            Err(ureq::Error::Timeout(_)) => return Err(timed_out()),
            Err(e) => {
                let error = HttpError::Transport { name: shown.to_string(), detail: e.to_string(), source: None };
                transient(error, attempt)?;
                continue;
            }
        };
        if status == 200 {
            return Ok(body);
        }
        let error = match Refusal::parse(status, &body, region) {
            Some(mut refusal) => {
                if status == 404 && refusal.code.is_empty() {
                    refusal.code = "NoSuchBucket".to_string(); // GCS: the only 404 of a list
                }
                HttpError::Refused { name: shown.to_string(), refusal: Box::new(refusal) }
            }
            None => HttpError::Status { name: shown.to_string(), status },
        };
        if !matches!(status, 429 | 500 | 502 | 503 | 504) {
            return Err(error);
        }
        transient(error, attempt)?;
    }
}

/// A ListObjectsV2 answer: each `<Contents>`'s key, size and ETag, and the continuation token
/// when `<IsTruncated>` says more follow.
fn parse_s3(body: &[u8]) -> Result<Page, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the listing is not UTF-8".to_string())?;
    if !text.contains("<ListBucketResult") {
        return Err("the answer is not a ListObjectsV2 result".to_string());
    }
    let mut objects = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<Contents>") {
        let end = rest[start..].find("</Contents>").ok_or("a <Contents> element is not closed")? + start;
        let entry = &rest[start..end];
        let key = element(entry, "Key").ok_or("an object without <Key>")?;
        let size =
            element(entry, "Size").and_then(|s| s.trim().parse::<u64>().ok()).ok_or("an object without a <Size>")?;
        let etag = element(entry, "ETag").map(|e| e.trim().to_string()).filter(|e| !e.is_empty());
        objects.push((key, size, etag));
        rest = &rest[end..];
    }
    let truncated = element(rest, "IsTruncated").is_some_and(|t| t.trim() == "true");
    let next = match element(rest, "NextContinuationToken") {
        Some(token) if truncated && !token.is_empty() => Some(token),
        _ if truncated => return Err("a truncated listing without <NextContinuationToken>".to_string()),
        _ => None,
    };
    Ok(Page { objects, next, bytes: body.len() as u64 })
}

/// The text of the first `<tag>` element in `xml`, its entities decoded.
fn element(xml: &str, tag: &str) -> Option<String> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    unescape(&xml[start..end])
}

/// XML text with its five entities and character references decoded (`None`: a malformed one).
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let end = rest[at..].find(';')? + at;
        let entity = &rest[at + 1..end];
        let decoded = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = match entity.strip_prefix("#x").or_else(|| entity.strip_prefix("#X")) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => entity.strip_prefix('#')?.parse().ok()?,
                };
                char::from_u32(code)?
            }
        };
        out.push(decoded);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// A JSON API objects list: each item's name, size and generation, and the next page's token.
fn parse_gcs(body: &[u8]) -> Result<Page, String> {
    let doc: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("the listing is not JSON: {e}"))?;
    let number = |value: Option<&serde_json::Value>| match value {
        Some(serde_json::Value::String(text)) => text.parse::<u64>().ok(),
        Some(serde_json::Value::Number(number)) => number.as_u64(),
        _ => None,
    };
    let mut objects = Vec::new();
    for item in doc.get("items").and_then(|i| i.as_array()).into_iter().flatten() {
        let name = item.get("name").and_then(|n| n.as_str()).ok_or("an object without a name")?;
        let size = number(item.get("size")).ok_or("an object without a size")?;
        let generation = number(item.get("generation")).ok_or("an object without a generation")?;
        objects.push((name.to_string(), size, Some(generation.to_string())));
    }
    let next = doc.get("nextPageToken").and_then(|t| t.as_str()).filter(|t| !t.is_empty()).map(str::to_string);
    Ok(Page { objects, next, bytes: body.len() as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3_page_gives_keys_sizes_etags_and_the_next_token() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>models</Name><Prefix>sd/</Prefix>
<Contents><Key>sd/unet/a&amp;b.safetensors</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>
<ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>1024</Size></Contents>
<Contents><Key>sd/model_index.json</Key><Size>7</Size></Contents>
<IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
</ListBucketResult>"#;
        let page = parse_s3(body).unwrap();
        assert_eq!(
            page.objects,
            [
                ("sd/unet/a&b.safetensors".to_string(), 1024, Some("\"9b2cf535f27731c974343645a3985328\"".to_string())),
                ("sd/model_index.json".to_string(), 7, None),
            ]
        );
        assert_eq!(page.next.as_deref(), Some("1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="));
        let last = b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert!(parse_s3(last).unwrap().next.is_none());
        assert!(parse_s3(b"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>").is_err());
        assert!(parse_s3(b"<Error><Code>AccessDenied</Code></Error>").is_err());
        assert!(parse_s3(b"<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>").is_err());
        assert_eq!(unescape("a&#x41;&#66;&lt;").as_deref(), Some("aAB<"));
        assert!(unescape("a&bogus;").is_none());
    }

    #[test]
    fn a_gcs_page_gives_names_sizes_generations_and_the_next_token() {
        let body = br#"{"items": [{"name": "sd/unet/m.safetensors", "size": "2048", "generation": "1700000000000001"}],
            "nextPageToken": "CgRzZC8x"}"#;
        let page = parse_gcs(body).unwrap();
        assert_eq!(page.objects, [("sd/unet/m.safetensors".to_string(), 2048, Some("1700000000000001".to_string()))]);
        assert_eq!(page.next.as_deref(), Some("CgRzZC8x"));
        assert!(parse_gcs(b"{}").unwrap().objects.is_empty());
        assert!(parse_gcs(br#"{"items": [{"name": "x", "size": "1"}]}"#).is_err());
    }

    /// Pages are followed to the end; objects a mount could not serve are left out; the limits
    /// stop the listing (count, bytes), and a store that repeats a token is not followed forever.
    #[test]
    fn pages_are_followed_within_the_limits() {
        let prefix = ObjectName::parse_prefix("s3://b/sd/").unwrap();
        let keys = ["sd/b.json", "sd/a/x.safetensors", "sd/dir/", "sd/a//y", "sd/../z", "other/w"];
        let served = |limits| {
            let mut at = 0;
            pages(&prefix, limits, |_, _| {
                at += 1;
                let key = keys.get(at - 1).map(|k| k.to_string());
                let objects = key.into_iter().map(|k| (k, 1, None)).collect();
                Ok(Page { objects, next: (at < 6).then(|| at.to_string()), bytes: 10 })
            })
        };
        let roomy = ListLimits { objects: 10, bytes: 1 << 20 };
        let (listed, over) = served(roomy).unwrap();
        let paths: Vec<&str> = listed.iter().map(|l| l.path.as_str()).collect();
        assert_eq!((paths, over), (vec!["a/x.safetensors", "b.json"], false));
        assert!(served(ListLimits { objects: 1, ..roomy }).unwrap().1);
        let looping = pages(&prefix, roomy, |_, _| Ok(Page { objects: Vec::new(), next: Some("t".into()), bytes: 10 }));
        assert!(looping.unwrap_err().to_string().contains("same page token twice"));
        let over_budget = pages(&prefix, roomy, |_, _| {
            Err(HttpError::Protocol { name: String::new(), detail: OVER_BUDGET.to_string() })
        });
        assert!(over_budget.unwrap().1);
    }
}
