//! A volume's `volumeAttributes` (and the pod's fsGroup) checked and turned into what the mount
//! daemon is given: its source and its `stfs mount` flags. Nothing here names a path on the node
//! that anything writes to; a value that is not of its attribute's form is refused by name.

use std::collections::HashMap;
use std::fmt;

/// The prefix of the attributes kubelet adds itself (pod name, namespace, ephemeral): ignored.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// The attributes a volume may give, as documented in docs/kubernetes.md.
pub const KNOWN: &[&str] = &[
    "source",
    "cacheSize",
    "blockSize",
    "nodeCache",
    "layout",
    "npy",
    "as",
    "checkpointFiles",
    "endpointUrl",
    "region",
    "noSignRequest",
    "timeout",
    "uid",
    "gid",
    "umask",
];

/// What a volume's daemon serves: the checkpoint, the flags of its `stfs mount`, and whether it
/// keeps blocks in the node's cache folder. Two volumes with equal specs (and equal secrets) share
/// one mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// The checkpoint: an absolute path on the node or a URL.
    pub source: String,
    /// `stfs mount` flags, in the order of [`KNOWN`] (so equal attributes give equal flags).
    pub flags: Vec<String>,
    /// Whether the daemon uses the plugin's `--cache-dir`.
    pub node_cache: bool,
}

/// An attribute that is not of its form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeError {
    /// No `source` attribute.
    MissingSource,
    /// An attribute stfs does not know.
    Unknown {
        /// Its name.
        name: String,
        /// The known attribute closest to it, if any.
        suggestion: Option<&'static str>,
    },
    /// A known attribute with a value not of its form.
    Invalid {
        /// Its name.
        name: &'static str,
        /// What its values look like.
        expected: &'static str,
    },
}

impl fmt::Display for AttributeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttributeError::MissingSource => f.write_str(
                "volume attribute `source` is missing (a path on the node, hf://ORG/REPO, s3://, gs:// or https://)",
            ),
            AttributeError::Unknown { name, suggestion: Some(s) } => {
                write!(f, "unknown volume attribute `{name}` (did you mean `{s}`?)")
            }
            AttributeError::Unknown { name, suggestion: None } => write!(f, "unknown volume attribute `{name}`"),
            AttributeError::Invalid { name, expected } => {
                write!(f, "volume attribute `{name}`: expected {expected}")
            }
        }
    }
}

impl std::error::Error for AttributeError {}

/// The schemes a `source` URL may have.
const URL_SCHEMES: &[&str] = &["hf://", "s3://", "gs://", "http://", "https://"];

/// Reads `attributes` (kubelet's own left out) and `mount_group` (the pod's fsGroup, the owner
/// group unless `gid` is given); `node_cache_available` says whether the plugin has a cache folder.
pub fn parse(
    attributes: &HashMap<String, String>,
    mount_group: &str,
    node_cache_available: bool,
) -> Result<VolumeSpec, AttributeError> {
    let mut names: Vec<&String> = attributes.keys().filter(|k| !k.starts_with(KUBELET_PREFIX)).collect();
    names.sort();
    if let Some(name) = names.iter().find(|n| !KNOWN.contains(&n.as_str())) {
        let suggestion = crate::util::suggest::closest(name, KNOWN.iter().copied());
        return Err(AttributeError::Unknown { name: name.to_string(), suggestion });
    }
    let value = |name: &str| attributes.get(name).map(String::as_str);
    let source = value("source").filter(|s| !s.is_empty()).ok_or(AttributeError::MissingSource)?;
    check_source(source)?;
    let mut flags = Vec::new();
    for &name in KNOWN {
        let Some(text) = value(name) else { continue };
        let invalid = |expected| AttributeError::Invalid { name, expected };
        let mut flag = |flag: &str, value: Option<&str>| {
            flags.push(flag.to_string());
            flags.extend(value.map(str::to_string));
        };
        match name {
            "source" | "nodeCache" | "gid" => {}
            "cacheSize" | "blockSize" => {
                crate::util::size::parse_size(text).map_err(|_| invalid("a size such as 512M or 2G"))?;
                flag(if name == "cacheSize" { "--cache-size" } else { "--block-size" }, Some(text));
            }
            "layout" if matches!(text, "flat" | "tree") => flag("--layout", Some(text)),
            "layout" => return Err(invalid("`flat` or `tree`")),
            "as" if text == "f32" => flag("--as", Some(text)),
            "as" => return Err(invalid("`f32`")),
            "npy" => {
                if boolean(name, text)? {
                    flag("--npy", None);
                }
            }
            "checkpointFiles" => {
                if !boolean(name, text)? {
                    flag("--no-checkpoint-file", None);
                }
            }
            "noSignRequest" => {
                if boolean(name, text)? {
                    flag("--no-sign-request", None);
                }
            }
            "endpointUrl" if is_plain_url(text) => flag("--endpoint-url", Some(text)),
            "endpointUrl" => return Err(invalid("an http:// or https:// URL")),
            "region" if is_word(text, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') => {
                flag("--region", Some(text))
            }
            "region" => return Err(invalid("a region name such as eu-west-1")),
            "timeout" if is_word(text, |c| c.is_ascii_digit() || c == 'm' || c == 's') => flag("--timeout", Some(text)),
            "timeout" => return Err(invalid("a duration such as 30s or 500ms")),
            "uid" => flag("-o", Some(&format!("uid={}", number(name, text)?))),
            "umask" if !text.is_empty() && text.len() <= 4 && text.chars().all(|c| ('0'..='7').contains(&c)) => {
                flag("-o", Some(&format!("umask={text}")))
            }
            "umask" => return Err(invalid("octal mode bits such as 022")),
            _ => unreachable!("every name of KNOWN has an arm"),
        }
    }
    let gid = match value("gid") {
        Some(text) => Some(number("gid", text)?),
        None if mount_group.is_empty() => None,
        None => Some(mount_group.parse::<u32>().map_err(|_| AttributeError::Invalid {
            name: "gid",
            expected: "a numeric group (the pod's fsGroup was not a number)",
        })?),
    };
    if let Some(gid) = gid {
        flags.extend(["-o".to_string(), format!("gid={gid}")]);
    }
    let node_cache = match value("nodeCache") {
        Some(text) => boolean("nodeCache", text)?,
        None => node_cache_available,
    };
    Ok(VolumeSpec { source: source.to_string(), flags, node_cache: node_cache && node_cache_available })
}

/// A `source` is a URL of a known scheme or an absolute path; nothing that could be read as a flag.
fn check_source(source: &str) -> Result<(), AttributeError> {
    let invalid = AttributeError::Invalid {
        name: "source",
        expected:
            "an absolute path on the node, hf://ORG/REPO[@REVISION], s3://BUCKET/KEY, gs://BUCKET/OBJECT or https://URL",
    };
    let is_url = URL_SCHEMES.iter().any(|s| source.starts_with(s) && source.len() > s.len());
    let is_path = source.starts_with('/');
    if (is_url || is_path) && !source.contains(['\0', '\n']) {
        Ok(())
    } else {
        Err(invalid)
    }
}

/// `true` or `false`.
fn boolean(name: &'static str, text: &str) -> Result<bool, AttributeError> {
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(AttributeError::Invalid { name, expected: "`true` or `false`" }),
    }
}

/// A user or group number below 2^32 - 1.
fn number(name: &'static str, text: &str) -> Result<u32, AttributeError> {
    text.parse::<u32>()
        .ok()
        .filter(|&n| n < u32::MAX && !text.starts_with('+'))
        .ok_or(AttributeError::Invalid { name, expected: "a number (a user or group id)" })
}

/// A value of characters `allowed` that starts with a letter or digit (never read as a flag).
fn is_word(text: &str, allowed: impl Fn(char) -> bool) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphanumeric()) && text.len() <= 64 && text.chars().all(allowed)
}

/// An http(s) URL with no whitespace or control characters.
fn is_plain_url(text: &str) -> bool {
    (text.starts_with("http://") || text.starts_with("https://"))
        && text.len() <= 2048
        && !text.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn flags_follow_the_attributes_and_the_fs_group() {
        let spec = parse(
            &attributes(&[
                ("source", "hf://org/repo@main"),
                ("cacheSize", "1G"),
                ("npy", "true"),
                ("checkpointFiles", "false"),
                ("uid", "1000"),
                ("csi.storage.k8s.io/pod.name", "p"),
            ]),
            "2000",
            true,
        )
        .unwrap();
        assert_eq!(spec.source, "hf://org/repo@main");
        assert_eq!(
            spec.flags,
            ["--cache-size", "1G", "--npy", "--no-checkpoint-file", "-o", "uid=1000", "-o", "gid=2000"]
        );
        assert!(spec.node_cache);
    }

    #[test]
    fn a_gid_attribute_wins_over_the_fs_group_and_no_cache_folder_means_no_node_cache() {
        let spec =
            parse(&attributes(&[("source", "/models/m.safetensors"), ("gid", "7"), ("nodeCache", "true")]), "9", false)
                .unwrap();
        assert_eq!(spec.flags, ["-o", "gid=7"]);
        assert!(!spec.node_cache);
    }

    #[test]
    fn each_bad_attribute_is_named() {
        let refused = |pairs: &[(&str, &str)]| parse(&attributes(pairs), "", false).unwrap_err().to_string();
        assert!(refused(&[]).contains("`source` is missing"));
        assert!(refused(&[("source", "relative/path")]).contains("`source`"));
        assert!(refused(&[("source", "--help")]).contains("`source`"));
        assert_eq!(
            refused(&[("source", "/m"), ("cachesize", "1G")]),
            "unknown volume attribute `cachesize` (did you mean `cacheSize`?)"
        );
        assert!(refused(&[("source", "/m"), ("cacheDir", "/etc")]).contains("unknown volume attribute `cacheDir`"));
        assert!(refused(&[("source", "/m"), ("cacheSize", "lots")]).contains("`cacheSize`"));
        assert!(refused(&[("source", "/m"), ("layout", "deep")]).contains("`layout`"));
        assert!(refused(&[("source", "/m"), ("npy", "yes")]).contains("`npy`"));
        assert!(refused(&[("source", "/m"), ("uid", "-1")]).contains("`uid`"));
        assert!(refused(&[("source", "/m"), ("umask", "0999")]).contains("`umask`"));
        assert!(refused(&[("source", "/m"), ("region", "--x")]).contains("`region`"));
        assert!(refused(&[("source", "/m"), ("endpointUrl", "file:///etc")]).contains("`endpointUrl`"));
        assert!(parse(&attributes(&[("source", "/m")]), "not-a-number", false)
            .unwrap_err()
            .to_string()
            .contains("`gid`"));
    }
}
