//! `hf://ORG/REPO[@REVISION][/PATH]`: parsing a hub name into its repository, revision and path.

use std::fmt;

/// The scheme prefix of a hub name.
pub const HUB_SCHEME: &str = "hf://";

/// The revision used when the name gives none.
pub const DEFAULT_REVISION: &str = "main";

/// A parsed `hf://` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec {
    /// `ORG/REPO`.
    pub repo: String,
    /// A branch, tag or commit (`main` when none is given); `refs/pr/1` is written `refs%2Fpr%2F1`.
    pub revision: String,
    /// A file or folder inside the repository, if named (no leading or trailing `/`).
    pub path: Option<String>,
}

/// Whether `spec` is a hub name (`hf://...`).
pub fn is_hub_spec(spec: &str) -> bool {
    spec.starts_with(HUB_SCHEME)
}

impl HubSpec {
    /// Parses `hf://ORG/REPO[@REVISION][/PATH]`. The revision ends at the next `/`; a revision that
    /// holds a `/` (`refs/pr/1`) is written with `%2F`, as huggingface_hub's file system does.
    pub fn parse(spec: &str) -> Result<HubSpec, String> {
        let rest = spec.strip_prefix(HUB_SCHEME).ok_or_else(|| format!("not an {HUB_SCHEME} name"))?;
        let usage = "expected hf://ORG/REPO[@REVISION][/PATH]";
        let mut parts = rest.splitn(3, '/');
        let org = parts.next().unwrap_or_default();
        let repo_rev = parts.next().unwrap_or_default();
        let path = parts.next().map(|p| p.trim_matches('/')).filter(|p| !p.is_empty());
        let (repo, revision) = match repo_rev.split_once('@') {
            Some((repo, revision)) => (repo, percent_decode(revision).ok_or_else(|| format!("bad revision: {usage}"))?),
            None => (repo_rev, DEFAULT_REVISION.to_string()),
        };
        if !valid_name(org) || !valid_name(repo) {
            return Err(format!("bad repository name: {usage}"));
        }
        if revision.is_empty() || revision.chars().any(|c| c.is_control() || c == ' ') {
            return Err(format!("empty or bad revision: {usage}"));
        }
        if let Some(path) = path {
            if path.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") || path.contains(['?', '#']) {
                return Err(format!("bad path in the repository: {usage}"));
            }
        }
        Ok(HubSpec { repo: format!("{org}/{repo}"), revision, path: path.map(str::to_string) })
    }

    /// `hf://ORG/REPO@REVISION` (with `@REVISION` only when not `main`), for messages.
    pub fn shown(&self) -> String {
        if self.revision == DEFAULT_REVISION {
            format!("{HUB_SCHEME}{}", self.repo)
        } else {
            format!("{HUB_SCHEME}{}@{}", self.repo, encode_segment(&self.revision))
        }
    }
}

impl fmt::Display for HubSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())?;
        match &self.path {
            Some(path) => write!(f, "/{path}"),
            None => Ok(()),
        }
    }
}

/// A user or repository name as the hub allows them: letters, digits, `-`, `_`, `.`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 96
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes one URL path segment (everything but unreserved characters), `/` included.
pub fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes a path inside a repository, segment by segment, keeping its `/`.
pub fn encode_path(path: &str) -> String {
    path.split('/').map(encode_segment).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(repo: &str, revision: &str, path: Option<&str>) -> HubSpec {
        HubSpec { repo: repo.to_string(), revision: revision.to_string(), path: path.map(str::to_string) }
    }

    #[test]
    fn names_parse() {
        assert_eq!(HubSpec::parse("hf://org/repo").unwrap(), spec("org/repo", "main", None));
        assert_eq!(HubSpec::parse("hf://org/repo/").unwrap(), spec("org/repo", "main", None));
        assert_eq!(HubSpec::parse("hf://o/r@v1.0").unwrap(), spec("o/r", "v1.0", None));
        assert_eq!(
            HubSpec::parse("hf://o/r@refs%2Fpr%2F3/unet/x.safetensors").unwrap(),
            spec("o/r", "refs/pr/3", Some("unet/x.safetensors"))
        );
        assert_eq!(
            HubSpec::parse("hf://o/r/model.safetensors").unwrap(),
            spec("o/r", "main", Some("model.safetensors"))
        );
        for bad in [
            "hf://",
            "hf://org",
            "hf://org/",
            "hf:///repo",
            "hf://o/r@",
            "hf://o/r/a/../b",
            "hf://o/r@%zz",
            "hf://o p/r",
        ] {
            assert!(HubSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shown_and_encoded() {
        assert_eq!(HubSpec::parse("hf://o/r@main/x").unwrap().to_string(), "hf://o/r/x");
        assert_eq!(HubSpec::parse("hf://o/r@refs%2Fpr%2F3").unwrap().shown(), "hf://o/r@refs%2Fpr%2F3");
        assert_eq!(encode_path("a b/c+d.json"), "a%20b/c%2Bd.json");
        assert!(is_hub_spec("hf://o/r") && !is_hub_spec("https://hf.co/o/r"));
    }
}
