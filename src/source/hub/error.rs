//! [`HubError`]: why a hub repository could not be resolved to a checkpoint, in words that say
//! what to do. Messages never hold the token.

use std::fmt;

/// Why an `hf://` name could not be resolved.
#[derive(Debug)]
pub enum HubError {
    /// The name does not parse.
    BadSpec(String),
    /// The hub knows no such repository (it answers so for private ones without access, too).
    RepoNotFound {
        /// Whether a token was sent.
        token: bool,
    },
    /// The repository is gated and the token's account has not been granted access.
    Gated,
    /// A token was sent and refused (HTTP 401).
    TokenRefused,
    /// HTTP 403 without a more precise reason.
    Forbidden,
    /// The repository has no such branch, tag or commit.
    RevisionNotFound(String),
    /// No `*.safetensors` file where the checkpoint was looked for.
    NoSafetensors {
        /// The folder looked in, if not the repository's root.
        folder: Option<String>,
    },
    /// The named path is neither a file nor a folder at that commit.
    NoSuchPath {
        /// The path named.
        path: String,
        /// The commit looked in.
        sha: String,
    },
    /// The hub's answer was unusable (status, malformed JSON, too large).
    Api(String),
    /// The connection failed (after retries).
    Transport(String),
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubError::BadSpec(detail) => f.write_str(detail),
            HubError::RepoNotFound { token: false } => f.write_str(
                "repository not found (or private or gated: no token was sent; set HF_TOKEN or run `hf auth login`)",
            ),
            HubError::RepoNotFound { token: true } => {
                f.write_str("repository not found (or the token has no access to it)")
            }
            HubError::Gated => f.write_str(
                "gated repository: accept its conditions on the hub with the token's account, then try again",
            ),
            HubError::TokenRefused => f.write_str("HTTP 401: the token was refused (invalid or expired)"),
            HubError::Forbidden => {
                f.write_str("HTTP 403: access denied (gated repository, or a token without read access)")
            }
            HubError::RevisionNotFound(revision) => write!(f, "revision not found: {revision}"),
            HubError::NoSafetensors { folder: None } => f.write_str("the repository holds no *.safetensors files"),
            HubError::NoSafetensors { folder: Some(folder) } => {
                write!(f, "folder {folder} holds no *.safetensors files")
            }
            HubError::NoSuchPath { path, sha } => write!(f, "no file or folder {path} at commit {sha}"),
            HubError::Api(detail) => write!(f, "hub API: {detail}"),
            HubError::Transport(detail) => write!(f, "cannot reach the hub: {detail}"),
        }
    }
}

impl std::error::Error for HubError {}
