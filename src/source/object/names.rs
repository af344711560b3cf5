//! [`ObjectName`]: `s3://BUCKET/KEY` and `gs://BUCKET/OBJECT` parsed, shown and encoded for a URL.

/// Which store a name is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// Amazon S3 or an S3-compatible store.
    S3,
    /// Google Cloud Storage.
    Gcs,
}

/// A parsed `s3://BUCKET/KEY` or `gs://BUCKET/OBJECT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectName {
    /// The store.
    pub store: Store,
    /// The bucket.
    pub bucket: String,
    /// The key, as given (not encoded).
    pub key: String,
}

impl ObjectName {
    /// Parses an object store name; `None` for other schemes, or without a bucket and a key.
    pub fn parse(spec: &str) -> Option<ObjectName> {
        let (store, rest) = if let Some(rest) = spec.strip_prefix("s3://") {
            (Store::S3, rest)
        } else {
            (Store::Gcs, spec.strip_prefix("gs://")?)
        };
        let (bucket, key) = rest.split_once('/')?;
        if bucket.is_empty() || key.is_empty() || bucket.contains(['@', '?', '#']) {
            return None;
        }
        Some(ObjectName { store, bucket: bucket.to_string(), key: key.to_string() })
    }

    /// Parses `s3://BUCKET/PREFIX/` or `gs://BUCKET/PREFIX/` (the trailing `/` makes it a prefix;
    /// `s3://BUCKET/` is the whole bucket): the key is the prefix, `/` included, or empty.
    pub fn parse_prefix(spec: &str) -> Option<ObjectName> {
        if !spec.ends_with('/') {
            return None;
        }
        let placeholder = format!("{spec}x");
        let mut name = ObjectName::parse(&placeholder)?;
        name.key.pop();
        (!name.key.starts_with('/') && !name.key.contains("//")).then_some(name)
    }

    /// The object `path` below this prefix.
    pub fn child(&self, path: &str) -> ObjectName {
        ObjectName { store: self.store, bucket: self.bucket.clone(), key: format!("{}{path}", self.key) }
    }

    /// How the object is called in messages and in the mount (it holds no credentials).
    pub fn shown(&self) -> String {
        let scheme = match self.store {
            Store::S3 => "s3",
            Store::Gcs => "gs",
        };
        format!("{scheme}://{}/{}", self.bucket, self.key)
    }
}

/// Percent-encodes an object key for a URL path: everything but RFC 3986's unreserved characters
/// and `/` (what S3's SigV4 canonical URI expects, encoded once).
pub(crate) fn encode_path(key: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(byte as char),
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        let name = ObjectName::parse("s3://b/dir/m.safetensors").unwrap();
        assert_eq!((name.store, name.bucket.as_str(), name.key.as_str()), (Store::S3, "b", "dir/m.safetensors"));
        assert_eq!(name.shown(), "s3://b/dir/m.safetensors");
        assert_eq!(ObjectName::parse("gs://b/o").unwrap().store, Store::Gcs);
        for bad in ["s3://b", "s3://b/", "s3:///k", "http://b/k", "gs://u@b/k"] {
            assert!(ObjectName::parse(bad).is_none(), "{bad}");
        }
        let prefix = ObjectName::parse_prefix("gs://b/sd/v1/").unwrap();
        assert_eq!(
            (prefix.store, prefix.key.as_str(), prefix.shown().as_str()),
            (Store::Gcs, "sd/v1/", "gs://b/sd/v1/")
        );
        assert_eq!(prefix.child("unet/m.safetensors").shown(), "gs://b/sd/v1/unet/m.safetensors");
        assert_eq!(ObjectName::parse_prefix("s3://b/").unwrap().key, "");
        for bad in ["s3://b/m.safetensors", "s3://b//", "s3://b/a//", "s3:///", "s3://b"] {
            assert!(ObjectName::parse_prefix(bad).is_none(), "{bad}");
        }
        assert_eq!(encode_path("a b/c+d~.safetensors", true), "a%20b/c%2Bd~.safetensors");
        assert_eq!(encode_path("a/b", false), "a%2Fb");
    }
}
