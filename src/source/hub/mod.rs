//! The Hugging Face hub as a source of checkpoints: `hf://ORG/REPO[@REVISION][/PATH]`.
//!
//! A revision is resolved once, at mount time, to its commit (the repository API's `sha`); every
//! file is then read from `{endpoint}/{repo}/resolve/{sha}/{path}` through the HTTP source, so
//! reads never mix two commits even when the branch moves. The token (`HF_TOKEN`, else the token
//! file) and the endpoint (`HF_ENDPOINT`) are found as huggingface_hub finds them.
//!
//! - `spec`: [`HubSpec`], the parsed name;
//! - `token`: the token and the endpoint from the environment;
//! - `api`: [`HubClient`], the revision API and small files fetched whole;
//! - `select`: what a file named is, and which small files go beside a checkpoint;
//! - `error`: [`HubError`].

mod api;
mod error;
mod select;
mod spec;
mod token;

pub use api::{HubClient, RepoInfo, Sibling, MAX_API_BYTES};
pub use error::HubError;
pub use select::{file_choice, small_files, small_files_in, Choice, SMALL_FILES_TOTAL, SMALL_FILE_LIMIT};
pub use spec::{encode_path, is_hub_spec, HubSpec, DEFAULT_REVISION, HUB_SCHEME};
pub use token::{endpoint, find_token, process_env, token_file, Env, TokenOrigin, DEFAULT_ENDPOINT};
