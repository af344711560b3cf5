//! Where the hub token and endpoint come from, as huggingface_hub finds them: `HF_TOKEN`, else the
//! token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`, else `~/.cache/huggingface/token`); and
//! `HF_ENDPOINT`, else `https://huggingface.co`.

use std::path::PathBuf;

use crate::source::http::Secret;

/// The hub used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where a token was found (for messages: never the token itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOrigin {
    /// Given explicitly (`--token-env`).
    Explicit,
    /// The `HF_TOKEN` variable.
    Environment,
    /// A token file.
    File(PathBuf),
}

/// A variable lookup, so tests need not change the process environment.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, empty values counted as unset.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The hub's base URL: `HF_ENDPOINT` without a trailing `/`, else [`DEFAULT_ENDPOINT`].
pub fn endpoint(env: Env<'_>) -> String {
    env("HF_ENDPOINT").map_or(DEFAULT_ENDPOINT.to_string(), |e| e.trim().trim_end_matches('/').to_string())
}

/// The token file huggingface_hub reads: `HF_TOKEN_PATH`, `$HF_HOME/token`,
/// `$XDG_CACHE_HOME/huggingface/token` or `~/.cache/huggingface/token`.
pub fn token_file(env: Env<'_>) -> Option<PathBuf> {
    if let Some(path) = env("HF_TOKEN_PATH") {
        return Some(PathBuf::from(path));
    }
    let home = match env("HF_HOME") {
        Some(home) => PathBuf::from(home),
        None => match env("XDG_CACHE_HOME") {
            Some(cache) => PathBuf::from(cache).join("huggingface"),
            None => PathBuf::from(env("HOME")?).join(".cache/huggingface"),
        },
    };
    Some(home.join("token"))
}

/// Longest token file read (a token is a few dozen bytes).
const MAX_TOKEN_FILE_BYTES: u64 = 64 << 10;

/// The token from `HF_TOKEN`, else from the token file; `None` when neither holds one.
pub fn find_token(env: Env<'_>) -> Option<(Secret, TokenOrigin)> {
    if let Some(token) = env("HF_TOKEN") {
        return Some((Secret::new(token.trim()), TokenOrigin::Environment));
    }
    let file = token_file(env)?;
    // A token is short: a FIFO or a device there is not waited on or read without end.
    let bytes = crate::source::read_regular(&file, MAX_TOKEN_FILE_BYTES).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| (Secret::new(token), TokenOrigin::File(file)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn endpoint_defaults_and_trims() {
        assert_eq!(endpoint(&env_of(&[])), DEFAULT_ENDPOINT);
        assert_eq!(endpoint(&env_of(&[("HF_ENDPOINT", "http://mirror:8080/")])), "http://mirror:8080");
    }

    #[test]
    fn token_from_variable_then_files() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        assert_eq!(find_token(&env_of(&[("HF_HOME", home)])), None);
        std::fs::write(dir.path().join("token"), "hf_file\n").unwrap();
        let (token, origin) = find_token(&env_of(&[("HF_HOME", home)])).unwrap();
        assert_eq!((token.expose(), origin), ("hf_file", TokenOrigin::File(dir.path().join("token"))));
        let (token, origin) = find_token(&env_of(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")])).unwrap();
        assert_eq!((token.expose(), origin), ("hf_env", TokenOrigin::Environment));
        let other = dir.path().join("other");
        std::fs::write(&other, "hf_other").unwrap();
        let found = find_token(&env_of(&[("HF_TOKEN_PATH", other.to_str().unwrap())])).unwrap();
        assert_eq!(found.0.expose(), "hf_other");
        let cache = dir.path().join("c");
        assert_eq!(token_file(&env_of(&[("HOME", "/h")])), Some(PathBuf::from("/h/.cache/huggingface/token")));
        assert_eq!(
            token_file(&env_of(&[("XDG_CACHE_HOME", cache.to_str().unwrap())])),
            Some(cache.join("huggingface/token"))
        );
    }
}
