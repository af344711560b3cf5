//! `hf://ORG/REPO[@REVISION][/PATH]` to opened shards: the revision pinned to its commit through
//! the hub's API, the checkpoint chosen among the repository's files, every shard opened at
//! `{endpoint}/{repo}/resolve/{sha}/{path}`, and the small files beside it (configs, tokenizers)
//! fetched whole from the same commit when asked for.

use std::sync::Arc;

use super::error::{OpenError, OpenProblem};
use super::shard::{checked, in_parallel, open_all, open_source, Checkpoint, OpenedShard, RootFile};
use super::OpenOptions;
use crate::format::index;
use crate::source::http::{HttpOptions, HttpSource};
use crate::source::hub::{self, Choice, Env, HubClient, HubError, HubSpec};
use crate::source::Source;

/// Largest index file read (as for an index URL).
const MAX_INDEX_SIZE: u64 = 64 << 20;

/// Small files fetched at once, at most.
const PARALLEL_FETCHES: usize = 4;

/// A repository at a pinned commit, and how to reach its files.
pub struct HubRepo {
    /// The name as parsed.
    pub spec: HubSpec,
    /// The commit the revision was at when mounted, and its files.
    pub info: hub::RepoInfo,
    /// The client (endpoint and token).
    pub client: HubClient,
}

/// Opens the checkpoint a hub name stands for, reading the environment of the process.
pub fn open_hub(spec: &str, options: &OpenOptions) -> Result<Checkpoint, OpenError> {
    open_hub_with(spec, options, &hub::process_env).map(|(checkpoint, _)| checkpoint)
}

/// [`open_hub`] with the environment looked up through `env`; also returns the pinned repository.
pub fn open_hub_with(spec: &str, options: &OpenOptions, env: Env<'_>) -> Result<(Checkpoint, HubRepo), OpenError> {
    let failed = |shown: &str, e: HubError| OpenError::new(shown, e);
    let parsed =
        HubSpec::parse(spec).map_err(|e| failed(spec.split('@').next().unwrap_or(spec), HubError::BadSpec(e)))?;
    let shown = parsed.shown();
    let repo = pin(parsed, &options.http, env).map_err(|e| failed(&shown, e))?;
    let choice = hub::choose_checkpoint(&repo.info.siblings, repo.spec.path.as_deref(), &repo.info.sha)
        .map_err(|e| failed(&shown, e))?;
    log::info!("{shown}: revision {} is commit {}; checkpoint {choice:?}", repo.spec.revision, repo.info.sha);
    let http = shard_options(&repo, &options.http);
    let open_one = |path: &String| open_file(&repo, path, &http);
    let folder = match &choice {
        Choice::Single(path) | Choice::Index(path) => folder_of(path),
        Choice::Shards(paths) => paths.first().and_then(|p| folder_of(p)),
    }
    .map(str::to_string);
    let mut checkpoint = match choice {
        Choice::Single(path) => Checkpoint::of(vec![open_one(&path)?]),
        Choice::Shards(paths) => {
            let opened = open_all(&paths, open_one)?;
            checked(&shown, opened, None, Vec::new())?
        }
        Choice::Index(path) => {
            let bytes = fetch_index(&repo, &path, &http)?;
            let mut index = index::parse_index(&bytes).map_err(|e| OpenError::new(format!("{shown}/{path}"), e))?;
            index.merge_spellings(index::without_dot_segments);
            let folder = folder_of(&path);
            let paths: Vec<String> =
                index.shards.iter().map(|f| folder.map_or(f.clone(), |d| format!("{d}/{f}"))).collect();
            let opened = open_all(&paths, open_one)?;
            let index_file = super::shard::file_name(&path).map(|name| RootFile { name, bytes });
            checked(&shown, opened, Some(&index), index_file.into_iter().collect())?
        }
    };
    if options.repo_files {
        checkpoint.repo_files = fetch_small_files(&repo, folder.as_deref())?;
    }
    Ok((checkpoint, repo))
}

/// The folder a file of the repository is in (`None`: the root).
fn folder_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(folder, _)| folder)
}

/// The small files of `folder` ([`hub::small_files`]) at the pinned commit, fetched whole, a few
/// at once, within the opening's deadline. One that cannot be fetched fails the open: a model
/// directory missing its `config.json` would fail later, in the loader, and less clearly.
fn fetch_small_files(repo: &HubRepo, folder: Option<&str>) -> Result<Vec<RootFile>, OpenError> {
    let wanted = hub::small_files(&repo.info.siblings, folder);
    log::debug!("{}: fetching {} small files", repo.spec.shown(), wanted.len());
    in_parallel(&wanted, PARALLEL_FETCHES, |(path, name)| {
        let bytes = repo
            .client
            .fetch_file(&repo.spec.repo, &repo.info.sha, path, hub::SMALL_FILE_LIMIT)
            .map_err(|e| OpenError::new(format!("{}/{path}", repo.spec.shown()), e))?;
        Ok(RootFile { name: name.clone(), bytes })
    })
}

/// Resolves the revision to its commit with the token and endpoint from `env` (an explicit
/// `--token-env` or Authorization header wins over `HF_TOKEN` and the token file).
fn pin(spec: HubSpec, http: &HttpOptions, env: Env<'_>) -> Result<HubRepo, HubError> {
    let endpoint = hub::endpoint(env);
    let own_authorization = http.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("authorization"));
    let token = match &http.bearer_token {
        Some(token) => Some(token.clone()),
        None if own_authorization => None,
        None => hub::find_token(env).map(|(token, origin)| {
            log::debug!("hub token from {origin:?}");
            token
        }),
    };
    let client = HubClient::new(&endpoint, token, http)?;
    let info = client.revision_info(&spec.repo, &spec.revision)?;
    Ok(HubRepo { spec, info, client })
}

/// The HTTP options of the shards: the hub's token sent as a bearer token to the endpoint only
/// (never to the CDN its resolve URLs redirect to).
fn shard_options(repo: &HubRepo, http: &HttpOptions) -> HttpOptions {
    let mut options = http.clone();
    options.hub_token_from_env = false;
    if options.bearer_token.is_none() {
        options.bearer_token = repo.client.token().cloned();
    }
    options
}

/// One file of the pinned commit as an HTTP source with its validated header.
fn open_file(repo: &HubRepo, path: &str, http: &HttpOptions) -> Result<OpenedShard, OpenError> {
    let url = repo.client.resolve_url(&repo.spec.repo, &repo.info.sha, path);
    let shown = format!("{}/{path}", repo.spec.shown());
    let source = HttpSource::open(&url, http.clone()).map_err(|e| OpenError::new(&shown, e))?;
    open_source(Arc::new(source)).map_err(|e| OpenError { path: shown, ..e })
}

/// The bytes of an index file at the pinned commit.
fn fetch_index(repo: &HubRepo, path: &str, http: &HttpOptions) -> Result<Vec<u8>, OpenError> {
    let url = repo.client.resolve_url(&repo.spec.repo, &repo.info.sha, path);
    let shown = format!("{}/{path}", repo.spec.shown());
    let source = HttpSource::open(&url, http.clone()).map_err(|e| OpenError::new(&shown, e))?;
    if source.len() > MAX_INDEX_SIZE {
        let (len, limit) = (source.len() as usize, MAX_INDEX_SIZE as usize);
        return Err(OpenError::new(&shown, OpenProblem::IndexTooLarge { len, limit }));
    }
    let mut bytes = vec![0; source.len() as usize];
    let mut reader = source.open_reader().map_err(|e| OpenError::new(&shown, e))?;
    reader.read_exact_at(&mut bytes, 0).map_err(|e| OpenError::new(&shown, e))?;
    Ok(bytes)
}
