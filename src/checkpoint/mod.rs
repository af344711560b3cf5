//! Opening a checkpoint: resolves what the user named to backing sources and validated headers.
//!
//! Everything that can be wrong with the input is found here, before anything is mounted.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::format::index;
use crate::format::{self, Header};
use crate::source::http::{HttpOptions, HttpSource};
use crate::source::{LocalFile, Source};
use crate::util::describe_io;

/// One opened shard: its source and its header.
pub struct OpenedShard {
    /// The backing source, pinned.
    pub source: Arc<dyn Source>,
    /// The validated header.
    pub header: Header,
}

/// A checkpoint ready to mount: one or more shards with unique tensor names.
pub struct Checkpoint {
    /// Shards in the order their tensors appear.
    pub shards: Vec<OpenedShard>,
}

/// A problem with the input, naming the file (or URL) it concerns.
#[derive(Debug)]
pub struct OpenError {
    /// The file or URL the problem is in.
    pub path: String,
    /// What is wrong, one line.
    pub problem: String,
}

impl OpenError {
    /// A problem with `path`.
    pub fn new(path: impl Into<String>, problem: impl fmt::Display) -> OpenError {
        OpenError { path: path.into(), problem: problem.to_string() }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

impl std::error::Error for OpenError {}

/// Opens and validates a single safetensors file.
///
/// Messages name the path as given; the source itself is opened by its absolute path, so the daemon
/// can leave the working directory and metadata.json says where the data lives.
pub fn open_file(path: &Path) -> Result<OpenedShard, OpenError> {
    let name = path.display().to_string();
    let absolute = std::path::absolute(path).map_err(|e| OpenError::new(&name, describe_io(&e)))?;
    let file = LocalFile::open(&absolute).map_err(|e| OpenError::new(&name, describe_io(&e)))?;
    let source: Arc<dyn Source> = Arc::new(file);
    open_source_named(source, &name)
}

/// Reads and validates the header of an already opened source.
pub fn open_source(source: Arc<dyn Source>) -> Result<OpenedShard, OpenError> {
    let name = source.name().to_string();
    open_source_named(source, &name)
}

/// [`open_source`], naming the source `name` in messages.
fn open_source_named(source: Arc<dyn Source>, name: &str) -> Result<OpenedShard, OpenError> {
    let mut stream = source.open_reader().map_err(|e| OpenError::new(name, describe_io(&e)))?;
    let header = format::read_header(|buf, offset| stream.read_exact_at(buf, offset), source.len())
        .map_err(|e| OpenError::new(name, e))?;
    Ok(OpenedShard { source, header })
}

/// How to reach remote checkpoints.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Headers, token, timeouts and the counters for `http://` and `https://` sources.
    pub http: HttpOptions,
}

/// Whether `spec` names a remote object.
pub fn is_url(spec: &str) -> bool {
    spec.starts_with("http://") || spec.starts_with("https://")
}

/// Opens what the user named: a `.safetensors` file, a `*.index.json` of shards, a directory of
/// `*.safetensors` shards, or an `http(s)://` URL of a file or of an index.
pub fn open(spec: &str, options: &OpenOptions) -> Result<Checkpoint, OpenError> {
    if is_url(spec) {
        return if url_path(spec).ends_with(".json") {
            open_url_index(spec, options)
        } else {
            open_url(spec, options).map(single)
        };
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return open_dir(path);
    }
    if spec.ends_with(".json") {
        return open_index(path);
    }
    open_file(path).map(single)
}

fn single(shard: OpenedShard) -> Checkpoint {
    Checkpoint { shards: vec![shard] }
}

/// Every `*.safetensors` file of `dir`, in name order, as one checkpoint.
fn open_dir(dir: &Path) -> Result<Checkpoint, OpenError> {
    let name = dir.display().to_string();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| OpenError::new(&name, describe_io(&e)))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(OpenError::new(&name, "directory holds no *.safetensors files"));
    }
    let shards = open_all(&files, |f| open_file(f))?;
    checked(&name, shards, None)
}

/// The shards named by a local index file.
fn open_index(path: &Path) -> Result<Checkpoint, OpenError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| OpenError::new(&name, describe_io(&e)))?;
    let index = index::parse_index(&bytes).map_err(|e| OpenError::new(&name, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let files: Vec<_> = index.shards.iter().map(|f| dir.join(f)).collect();
    let opened = open_all(&files, |f| open_file(f))?;
    checked(&name, opened, Some(&index))
}

/// A single remote safetensors object.
fn open_url(url: &str, options: &OpenOptions) -> Result<OpenedShard, OpenError> {
    let source = HttpSource::open(url, options.http.clone())
        .map_err(|e| OpenError::new(crate::source::http::display_name(url), e))?;
    open_source(Arc::new(source))
}

/// A remote index whose shards are resolved relative to its URL.
fn open_url_index(url: &str, options: &OpenOptions) -> Result<Checkpoint, OpenError> {
    let shown = crate::source::http::display_name(url);
    let source = HttpSource::open(url, options.http.clone()).map_err(|e| OpenError::new(&shown, e))?;
    let len = usize::try_from(source.len()).unwrap_or(usize::MAX);
    if len > MAX_INDEX_SIZE {
        return Err(OpenError::new(&shown, format!("index of {len} bytes is over the limit of {MAX_INDEX_SIZE}")));
    }
    let mut bytes = vec![0; len];
    let mut stream = source.open_reader().map_err(|e| OpenError::new(&shown, describe_io(&e)))?;
    stream.read_exact_at(&mut bytes, 0).map_err(|e| OpenError::new(&shown, describe_io(&e)))?;
    let index = index::parse_index(&bytes).map_err(|e| OpenError::new(&shown, e))?;
    let base = match url.split(['?', '#']).next().and_then(|u| u.rfind('/')) {
        Some(i) => &url[..=i],
        None => url,
    };
    let urls: Vec<String> = index.shards.iter().map(|f| format!("{base}{f}")).collect();
    let opened = open_all(&urls, |url| open_url(url, options))?;
    checked(&shown, opened, Some(&index))
}

/// Shards opened at once, at most: opening one is a round trip on a network store (two behind a
/// hub's redirect, one or more on an NFS or gcsfuse mount), so a checkpoint of dozens of shards
/// mounts in a few round trips, not dozens.
const PARALLEL_SHARD_OPENS: usize = 8;

/// Opens every shard with `open` on up to [`PARALLEL_SHARD_OPENS`] threads, keeping their order.
/// On failure, the error of the first failing shard (in that order) among those tried; no new
/// shard is started after a failure.
fn open_all<T: Sync>(
    shards: &[T],
    open: impl Fn(&T) -> Result<OpenedShard, OpenError> + Sync,
) -> Result<Vec<OpenedShard>, OpenError> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<Mutex<Option<Result<OpenedShard, OpenError>>>> = shards.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_SHARD_OPENS.min(shards.len()) {
            scope.spawn(|| {
                while !failed.load(Relaxed) {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(shard) = shards.get(i) else { break };
                    let result = open(shard);
                    failed.fetch_or(result.is_err(), Relaxed);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                }
            });
        }
    });
    // Shards are claimed in order and every claimed one finishes, so one left untried comes after
    // a failed one, and collecting in order stops at the first failure before reaching it.
    (1..)
        .zip(results)
        .map(|(n, r)| {
            let result = r.into_inner().unwrap_or_else(|e| e.into_inner());
            result.unwrap_or_else(|| Err(OpenError::new(format!("shard {n}"), "was not opened")))
        })
        .collect()
}

/// Largest index file read: real ones are well under 10 MB even for thousands of tensors.
const MAX_INDEX_SIZE: usize = 64 << 20;

fn url_path(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

fn checked(name: &str, opened: Vec<OpenedShard>, index: Option<&index::Index>) -> Result<Checkpoint, OpenError> {
    let names: Vec<String> = opened.iter().map(|s| s.source.name().to_string()).collect();
    let headers: Vec<&Header> = opened.iter().map(|s| &s.header).collect();
    index::check_shards(&names, &headers, index).map_err(|e| OpenError::new(name, e))?;
    Ok(Checkpoint { shards: opened })
}
