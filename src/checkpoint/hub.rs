//! `hf://ORG/REPO[@REVISION][/PATH]` to opened shards: the revision pinned to its commit through
//! the hub's API, the checkpoint chosen among the repository's files, every shard opened at
//! `{endpoint}/{repo}/resolve/{sha}/{path}`, and the small files beside it (configs, tokenizers)
//! fetched whole from the same commit when asked for. A repository (or a folder of it) is laid
//! out as it is: each folder with a checkpoint of its own a component (`layout`).

use std::sync::Arc;

use super::error::{OpenError, OpenProblem};
use std::collections::HashMap;

use super::layout;
use super::shard::{checked, in_parallel, open_all, open_source, Checkpoint, Component, OpenedShard, RootFile};
use super::OpenOptions;
use crate::format::index;
use crate::source::http::{HttpOptions, HttpSource};
use crate::source::hub::{self, Choice, Env, HubClient, HubError, HubSpec, Sibling};
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
/// folder of it, is laid out as it is (`layout`): its own checkpoint, each folder below with one
/// as a component, the small files of the folders a mount serves, all from the one commit listed.
pub fn open_hub_with(spec: &str, options: &OpenOptions, env: Env<'_>) -> Result<(Checkpoint, HubRepo), OpenError> {
    let failed = |shown: &str, e: HubError| OpenError::new(shown, e);
    let parsed =
        HubSpec::parse(spec).map_err(|e| failed(spec.split('@').next().unwrap_or(spec), HubError::BadSpec(e)))?;
    let shown = parsed.shown();
    let repo = pin(parsed, &options.http, env).map_err(|e| failed(&shown, e))?;
    let http = shard_options(&repo, &options.http);
    let sha = repo.info.sha.clone();
    let path = repo.spec.path.clone();
    if let Some(file) = path.as_deref().filter(|p| repo.info.siblings.iter().any(|s| s.path == *p)) {
        let choice = hub::choose_checkpoint(&repo.info.siblings, Some(file), &sha).map_err(|e| failed(&shown, e))?;
        log::info!("{shown}: revision {} is commit {sha}; checkpoint {choice:?}", repo.spec.revision);
        let mut checkpoint = open_choice(&repo, choice, &http)?;
        if options.repo_files {
            checkpoint.repo_files = fetch_small_files(&repo, folder_of(file))?;
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
    let root_has = layout::root_has_checkpoint(&scoped);
    let folders = layout::component_folders(&scoped, root_has).map_err(|e| OpenError::new(&shown, e))?;
    let mut checkpoint = if root_has || folders.is_empty() {
        let choice = hub::choose_checkpoint(&repo.info.siblings, scope, &sha).map_err(|e| failed(&shown, e))?;
        log::info!("{shown}: revision {} is commit {sha}; checkpoint {choice:?}", repo.spec.revision);
        open_choice(&repo, choice, &http)?
    } else {
        Checkpoint::of(Vec::new())
    };
    for folder in &folders {
        let full = format!("{prefix}{folder}");
        let choice = hub::choose_checkpoint(&repo.info.siblings, Some(&full), &sha).map_err(|e| failed(&shown, e))?;
        log::info!("{shown}: component {folder}: checkpoint {choice:?}");
        let component = open_choice(&repo, choice, &http)?;
        checkpoint.components.push(Component { folder: folder.clone(), checkpoint: component });
    }
    if options.repo_files {
        fetch_layout_files(&repo, &prefix, &scoped, &mut checkpoint)?;
    }
    Ok((checkpoint, repo))
}

/// The checkpoint `choice` names at the pinned commit, every shard opened.
fn open_choice(repo: &HubRepo, choice: Choice, http: &HttpOptions) -> Result<Checkpoint, OpenError> {
    let shown = repo.spec.shown();
    let open_one = |path: &String| open_file(repo, path, http);
    match choice {
        Choice::Single(path) => Ok(Checkpoint::of(vec![open_one(&path)?])),
        Choice::Shards(paths) => {
            let opened = open_all(&paths, open_one)?;
            checked(&shown, opened, None, Vec::new())
        }
        Choice::Index(path) => {
            let bytes = fetch_index(repo, &path, http)?;
            let mut index = index::parse_index(&bytes).map_err(|e| OpenError::new(format!("{shown}/{path}"), e))?;
            index.merge_spellings(index::without_dot_segments);
            let folder = folder_of(&path);
            let paths: Vec<String> =
                index.shards.iter().map(|f| folder.map_or(f.clone(), |d| format!("{d}/{f}"))).collect();
            let opened = open_all(&paths, open_one)?;
            let index_file = super::shard::file_name(&path).map(|name| RootFile { name, bytes });
            checked(&shown, opened, Some(&index), index_file.into_iter().collect())
        }
    }
}

/// The small files of a repository laid out in folders (those of the root, of each component's
/// folder and of the folders the root's manifest names: `layout`), fetched whole from the pinned
/// commit, a few at once, and given to the component whose folder holds each (the others to the
/// root, by their path). `scoped` lists the files below `prefix` (the folder named, or the
/// repository), without it. One that cannot be fetched fails the open, as in a flat repository.
fn fetch_layout_files(
    repo: &HubRepo,
    prefix: &str,
    scoped: &[Sibling],
    checkpoint: &mut Checkpoint,
) -> Result<(), OpenError> {
    let fetch = |path: &String| {
        let full = format!("{prefix}{path}");
        repo.client
            .fetch_file(&repo.spec.repo, &repo.info.sha, &full, hub::SMALL_FILE_LIMIT)
            .map_err(|e| OpenError::new(format!("{}/{full}", repo.spec.shown()), e))
    };
    let mut folders: Vec<String> = vec![String::new()];
    folders.extend(checkpoint.components.iter().map(|c| c.folder.clone()));
    let mut fetched: HashMap<String, Vec<u8>> = HashMap::new();
    for manifest in layout::MANIFESTS {
        let listed = scoped.iter().any(|s| s.path == manifest && s.size.is_some_and(|n| n <= hub::SMALL_FILE_LIMIT));
        if listed {
            let bytes = fetch(&manifest.to_string())?;
            folders.extend(layout::manifest_folders(manifest, &bytes));
            fetched.insert(manifest.to_string(), bytes);
        }
    }
    let folders: Vec<&str> = folders.iter().map(String::as_str).collect();
    let wanted = hub::small_files_in(scoped, &folders);
    log::debug!("{}: fetching {} small files", repo.spec.shown(), wanted.len());
    let missing: Vec<String> = wanted.iter().filter(|p| !fetched.contains_key(*p)).cloned().collect();
    let bytes = in_parallel(&missing, PARALLEL_FETCHES, fetch)?;
    fetched.extend(missing.into_iter().zip(bytes));
    for path in wanted {
        if let Some(bytes) = fetched.remove(&path) {
            checkpoint.add_repo_file(path, bytes);
        }
    }
    Ok(())
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
