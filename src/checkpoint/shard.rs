//! Opened shards: a source with its validated header, opened one by one or several at once, and the
//! check that several of them make one [`Checkpoint`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::confined::Confinement;
use super::error::{OpenError, OpenProblem};
use crate::format::index::{check_shards, Index};
use crate::format::{self, Header};
use crate::source::{LocalFile, Source};
use crate::util::lock;

/// One opened shard: its source and its header.
pub struct OpenedShard {
    /// The backing source, pinned.
    pub source: Arc<dyn Source>,
    /// The validated header.
    pub header: Header,
    /// The `st_mode` of a local shard, from the descriptor it was pinned by (never by its path
    /// again): a mount serves it no wider. `None` for a remote source.
    pub local_mode: Option<u32>,
}

/// A checkpoint ready to mount: one or more shards with unique tensor names.
pub struct Checkpoint {
    /// Shards in the order their tensors appear.
    pub shards: Vec<OpenedShard>,
    /// The index files that came with it (the `*.index.json` named, or those in a directory of
    /// shards), read whole at open: a mount re-serves them beside the shards.
    pub index_files: Vec<RootFile>,
    /// The small files of an `hf://` repository (or folder) a loader wants beside the checkpoint
    /// (`config.json`, tokenizer files), fetched whole at open when
    /// [`OpenOptions::repo_files`](super::OpenOptions::repo_files) asks for them. A file of a
    /// folder that is no component is named by its path from this checkpoint's folder
    /// (`scheduler/scheduler_config.json`).
    pub repo_files: Vec<RootFile>,
    /// The checkpoints of the folders below that hold one of their own (a diffusers pipeline's
    /// `unet/`, a sentence-transformers model's `2_Dense/`), in folder order; empty for a file,
    /// an index or a URL. When there are some, `shards` may be empty (a pipeline's root).
    pub components: Vec<Component>,
    /// Which checkpoint of its folder this is (`in_folder`'s rule): its name (`model`; empty for
    /// a file, an index or a URL named, and for a folder's files taken as shards) and its variant.
    pub name: String,
    /// Its variant (`fp16`), when its name is a standard one's or another checkpoint's with one.
    pub variant: Option<String>,
    /// The other checkpoints of its folder (variants, `consolidated.safetensors`, any other
    /// file), in name order: a mount serves their files beside this one's, their tensors in the
    /// folder's [`OTHERS_DIR`](super::OTHERS_DIR).
    pub others: Vec<OtherCheckpoint>,
}

/// Another checkpoint of a folder than the one a loader loads without `variant=`.
pub struct OtherCheckpoint {
    /// Its name, unique among the folder's other checkpoints (`model.fp16`, `consolidated`).
    pub name: String,
    /// Its variant (`fp16`), if it is one.
    pub variant: Option<String>,
    /// Its shards and index files (no small files, no components, no others of its own).
    pub checkpoint: Checkpoint,
}

/// A folder of a model repository that holds a checkpoint of its own.
pub struct Component {
    /// Its path relative to the mounted folder (`unet`, `a/b`).
    pub folder: String,
    /// Its checkpoint (with no components of its own: every component is listed at the top).
    pub checkpoint: Checkpoint,
}

impl Checkpoint {
    /// A checkpoint of `shards` alone.
    pub fn of(shards: Vec<OpenedShard>) -> Checkpoint {
        Checkpoint {
            shards,
            index_files: Vec::new(),
            repo_files: Vec::new(),
            components: Vec::new(),
            name: String::new(),
            variant: None,
            others: Vec::new(),
        }
    }

    /// The checkpoint of the named folder's own files, for a command that reads one checkpoint
    /// (`inspect`, `extract`, `cat`): its components and other checkpoints left aside; a folder with none of its own,
    /// only in folders below it, is [`OpenProblem::OnlyInFolders`] naming them (`shown`: the name
    /// as given).
    pub fn own(mut self, shown: &str) -> Result<Checkpoint, OpenError> {
        if self.shards.is_empty() && !self.components.is_empty() {
            let folders = self.components.iter().map(|c| c.folder.clone()).collect();
            return Err(OpenError::new(shown, OpenProblem::OnlyInFolders(folders)));
        }
        self.components.clear();
        self.others.clear();
        Ok(self)
    }

    /// Adds a small file of the repository at `path` (from this checkpoint's folder): to the
    /// component whose folder holds it directly, by its name, else to this checkpoint, by `path`.
    pub fn add_repo_file(&mut self, path: String, bytes: Vec<u8>, local_mode: Option<u32>) {
        let folder = path.rsplit_once('/').map_or("", |(folder, _)| folder);
        match self.components.iter_mut().find(|c| c.folder == folder) {
            Some(c) => {
                let name = path[folder.len() + 1..].to_string();
                c.checkpoint.repo_files.push(RootFile { name, bytes, local_mode });
            }
            None => self.repo_files.push(RootFile { name: path, bytes, local_mode }),
        }
    }

    /// Every shard, the other checkpoints' and the components' (and theirs) too.
    pub fn all_shards(&self) -> Box<dyn Iterator<Item = &OpenedShard> + '_> {
        let others = self.others.iter().flat_map(|o| o.checkpoint.all_shards());
        let components = self.components.iter().flat_map(|c| c.checkpoint.all_shards());
        Box::new(self.shards.iter().chain(others).chain(components))
    }
}

/// A small file served in a mount's root as it was read at open: an index file, or a file of the
/// repository.
#[derive(Debug, Clone)]
pub struct RootFile {
    /// Its file name (the last segment of its path or URL).
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The mode of the local file it was read from (`st_mode`, from the descriptor it was read
    /// through): a mount serves it no wider (its read bits bound the mount's, as a local shard's
    /// do). `None` for a file of a remote source.
    pub local_mode: Option<u32>,
}

impl RootFile {
    /// A file fetched from a remote source (no local mode to respect).
    pub fn remote(name: String, bytes: Vec<u8>) -> RootFile {
        RootFile { name, bytes, local_mode: None }
    }
}

/// The name a checkpoint file takes in a mount's root: the last segment of its path or URL (a
/// URL's percent-escapes decoded when that gives a plain name), or `None` when there is none.
pub fn file_name(path_or_url: &str) -> Option<String> {
    let path = path_or_url.split(['?', '#']).next().unwrap_or(path_or_url);
    let last = path.rsplit('/').next().unwrap_or(path);
    let decoded = if super::is_url(path_or_url) { crate::util::percent_decode(last) } else { None };
    let name = decoded.filter(|d| !d.contains(['/', '\0'])).unwrap_or_else(|| last.to_string());
    (!name.is_empty() && name != "." && name != "..").then_some(name)
}

/// Opens and validates a single safetensors file.
///
/// Messages name the path as given; the source itself is opened by its absolute path, so the daemon
/// can leave the working directory and metadata.json says where the data lives.
pub fn open_file(path: &Path) -> Result<OpenedShard, OpenError> {
    open_local(path, None)
}

/// [`open_file`] for a shard of a mounted folder: opened by the folder's link rule
/// ([`Confinement::open`]), so a shard that resolves outside the folder is an error naming it.
/// It is named by the path given (its name in the mount and in metadata.json) and pinned as the
/// file the rule allowed, by its canonical path: every later descriptor is opened by that path,
/// following no link, and must be that very file.
pub(super) fn open_confined(path: &Path, rule: &Confinement) -> Result<OpenedShard, OpenError> {
    open_local(path, Some(rule))
}

fn open_local(path: &Path, rule: Option<&Confinement>) -> Result<OpenedShard, OpenError> {
    let name = path.display().to_string();
    let absolute = std::path::absolute(path).map_err(|e| OpenError::new(&name, e))?;
    let file = match rule {
        None => LocalFile::open(&absolute),
        Some(rule) => {
            rule.open_resolved(&absolute).map(|(real, file, meta)| LocalFile::pin(&absolute, &real, &file, &meta))
        }
    };
    let file = file.map_err(|e| OpenError::new(&name, e))?;
    let local_mode = Some(file.mode());
    let mut opened = open_source_named(Arc::new(file), &name)?;
    opened.local_mode = local_mode;
    Ok(opened)
}

/// Reads and validates the header of an already opened source.
pub fn open_source(source: Arc<dyn Source>) -> Result<OpenedShard, OpenError> {
    let name = source.name().to_string();
    open_source_named(source, &name)
}

/// [`open_source`], naming the source `name` in messages.
fn open_source_named(source: Arc<dyn Source>, name: &str) -> Result<OpenedShard, OpenError> {
    let mut reader = source.open_reader().map_err(|e| OpenError::new(name, e))?;
    let header = format::read_header(|buf, offset| reader.read_exact_at(buf, offset), source.len())
        .map_err(|e| OpenError::new(name, e))?;
    Ok(OpenedShard { source, header, local_mode: None })
}

/// Shards opened at once, at most: opening one is a round trip on a network store (two behind a
/// hub's redirect, one or more on an NFS or gcsfuse mount), so a checkpoint of dozens of shards
/// mounts in a few round trips, not dozens.
const PARALLEL_SHARD_OPENS: usize = 8;

/// Opens every shard with `open` on up to [`PARALLEL_SHARD_OPENS`] threads, keeping their order.
/// On failure, the error of the first failing shard (in that order) among those tried; no new
/// shard is started after a failure.
pub(super) fn open_all<T: Sync>(
    shards: &[T],
    open: impl Fn(&T) -> Result<OpenedShard, OpenError> + Sync,
) -> Result<Vec<OpenedShard>, OpenError> {
    in_parallel(shards, PARALLEL_SHARD_OPENS, open)
}

/// `work` done on every item on up to `threads` threads, the results in the items' order. On
/// failure, the error of the first failing item (in that order) among those tried; no new item is
/// started after a failure.
pub(super) fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&T) -> Result<R, OpenError> + Sync,
) -> Result<Vec<R>, OpenError> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<Mutex<Option<Result<R, OpenError>>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.min(items.len()) {
            scope.spawn(|| {
                while !failed.load(Relaxed) {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let result = work(item);
                    failed.fetch_or(result.is_err(), Relaxed);
                    *lock(&results[i]) = Some(result);
                }
            });
        }
    });
    // Items are claimed in order and every claimed one finishes, so one left untried comes after
    // a failed one, and collecting in order stops at the first failure before reaching it.
    (1..)
        .zip(results)
        .map(|(n, r)| {
            lock(&r).take().unwrap_or_else(|| Err(OpenError::new(format!("item {n}"), OpenProblem::NotOpened)))
        })
        .collect()
}

/// The opened shards as one checkpoint, once their tensor names are unique and, for an index, each
/// tensor is where the index says; `name` (the directory or index) is named in messages, and a
/// shard the index spells several ways is named with every spelling.
pub(super) fn checked(
    name: &str,
    opened: Vec<OpenedShard>,
    index: Option<&Index>,
    index_files: Vec<RootFile>,
) -> Result<Checkpoint, OpenError> {
    let spellings = index.map(Index::spellings).unwrap_or_default();
    let names: Vec<String> = (0..)
        .zip(&opened)
        .map(|(i, s)| match spellings.get(i) {
            Some(spellings) if spellings.len() > 1 => {
                format!("{} (listed as {})", s.source.name(), spellings.join(" and "))
            }
            _ => s.source.name().to_string(),
        })
        .collect();
    let headers: Vec<&Header> = opened.iter().map(|s| &s.header).collect();
    check_shards(&names, &headers, index).map_err(|e| OpenError::new(name, e))?;
    Ok(Checkpoint { index_files, ..Checkpoint::of(opened) })
}

#[cfg(test)]
mod tests {
    use super::file_name;

    #[test]
    fn file_names_are_the_last_segment() {
        assert_eq!(file_name("/data/m/model.safetensors").as_deref(), Some("model.safetensors"));
        assert_eq!(file_name("model.safetensors").as_deref(), Some("model.safetensors"));
        assert_eq!(file_name("https://h/r/resolve/main/m.safetensors?x=1").as_deref(), Some("m.safetensors"));
        assert_eq!(file_name("https://h/a/my%20model.safetensors#f").as_deref(), Some("my model.safetensors"));
        // An escape that would make a path is kept escaped; no segment, no name.
        assert_eq!(file_name("https://h/a%2Fb.safetensors").as_deref(), Some("a%2Fb.safetensors"));
        assert_eq!(file_name("https://h/"), None);
        assert_eq!(file_name("https://h/x/.."), None);
    }
}
