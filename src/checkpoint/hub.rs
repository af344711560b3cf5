//! `hf://ORG/REPO[@REVISION][/PATH]` to opened shards: the revision pinned to its commit through
//! the hub's API, the checkpoint chosen among the repository's files, every shard opened at
//! `{endpoint}/{repo}/resolve/{sha}/{path}`, and the small files beside it (configs, tokenizers)
//! fetched whole from the same commit when asked for. A repository (or a folder of it) is laid
//! out as it is: each folder with a checkpoint of its own a component (`listed`, `layout`).

use std::sync::Arc;

use super::error::{OpenError, OpenProblem};
use super::listed;
use super::shard::{in_parallel, open_source, Checkpoint, OpenedShard, RootFile};
use super::OpenOptions;
use crate::source::http::{HttpOptions, HttpSource};
use crate::source::hub::{self, Env, HubClient, HubError, HubSpec, Sibling};
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
///
/// A file named is that file's checkpoint with its folder's small files; the repository, or a
/// folder of it, is laid out as it is (`listed`): its own checkpoint, each folder below with one
/// as a component, the small files of the folders a mount serves, all from the one commit listed.
pub fn open_hub_with(spec: &str, options: &OpenOptions, env: Env<'_>) -> Result<(Checkpoint, HubRepo), OpenError> {
    let failed = |shown: &str, e: HubError| OpenError::new(shown, e);
    let parsed =
        HubSpec::parse(spec).map_err(|e| failed(spec.split('@').next().unwrap_or(spec), HubError::BadSpec(e)))?;
    let shown = parsed.shown();
    let repo = pin(parsed, &options.http, env).map_err(|e| failed(&shown, e))?;
    let files = HubFiles { http: shard_options(&repo, &options.http), repo: &repo };
    let sha = repo.info.sha.clone();
    log::info!("{shown}: revision {} is commit {sha}", repo.spec.revision);
    let path = repo.spec.path.clone();
    if let Some(file) = path.as_deref().filter(|p| repo.info.siblings.iter().any(|s| s.path == *p)) {
        let choice = hub::file_choice(file);
        log::info!("{shown}: checkpoint {choice:?}");
        let mut checkpoint = listed::open_choice(&files, choice, MAX_INDEX_SIZE as usize)?;
        if options.repo_files {
            checkpoint.repo_files = fetch_small_files(&repo, listed::folder_of(file))?;
        }
        return Ok((checkpoint, repo));
    }
    let scope = path.as_deref();
    let prefix = scope.map_or(String::new(), |p| format!("{p}/"));
    let scoped: Vec<Sibling> = repo
        .info
        .siblings
        .iter()
        .filter_map(|s| Some(Sibling { path: s.path.strip_prefix(prefix.as_str())?.to_string(), size: s.size }))
        .collect();
    if let (Some(path), true) = (scope, scoped.is_empty()) {
        return Err(failed(&shown, HubError::NoSuchPath { path: path.to_string(), sha }));
    }
    let nothing = || failed(&shown, HubError::NoSafetensors { folder: scope.map(str::to_string) });
    let checkpoint = listed::lay_out(&files, &prefix, &scoped, nothing, options.repo_files)?;
    Ok((checkpoint, repo))
}

/// The files of a pinned repository: shards and indexes at `{endpoint}/{repo}/resolve/{sha}/`,
/// small files through the hub's client.
struct HubFiles<'a> {
    repo: &'a HubRepo,
    http: HttpOptions,
}

impl listed::Repository for HubFiles<'_> {
    fn shown(&self) -> String {
        self.repo.spec.shown()
    }

    fn open_shard(&self, path: &str) -> Result<OpenedShard, OpenError> {
        open_file(self.repo, path, &self.http)
    }

    fn fetch_index(&self, path: &str, limit: usize) -> Result<Vec<u8>, OpenError> {
        fetch_index(self.repo, path, &self.http, limit)
    }

    fn fetch_small(&self, path: &str) -> Result<Vec<u8>, OpenError> {
        let repo = self.repo;
        repo.client
            .fetch_file(&repo.spec.repo, &repo.info.sha, path, hub::SMALL_FILE_LIMIT)
            .map_err(|e| OpenError::new(format!("{}/{path}", repo.spec.shown()), e))
    }
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
        Ok(RootFile::remote(name.clone(), bytes))
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
    let source = Arc::new(HttpSource::open(&url, http.clone()).map_err(|e| OpenError::new(&shown, e))?);
    let shard = open_source(Arc::clone(&source) as Arc<dyn Source>).map_err(|e| OpenError { path: shown, ..e })?;
    // From now on each read has its own timeout, not what is left of the opening's.
    source.opened();
    Ok(shard)
}

/// The bytes of an index file at the pinned commit.
fn fetch_index(repo: &HubRepo, path: &str, http: &HttpOptions, limit: usize) -> Result<Vec<u8>, OpenError> {
    let url = repo.client.resolve_url(&repo.spec.repo, &repo.info.sha, path);
    let shown = format!("{}/{path}", repo.spec.shown());
    let source = HttpSource::open(&url, http.clone()).map_err(|e| OpenError::new(&shown, e))?;
    let limit = limit.min(MAX_INDEX_SIZE as usize);
    if source.len() > limit as u64 {
        let len = source.len() as usize;
        return Err(OpenError::new(&shown, OpenProblem::IndexTooLarge { len, limit }));
    }
    let mut bytes = vec![0; source.len() as usize];
    let mut reader = source.open_reader().map_err(|e| OpenError::new(&shown, e))?;
    reader.read_exact_at(&mut bytes, 0).map_err(|e| OpenError::new(&shown, e))?;
    Ok(bytes)
}
