//! `s3://BUCKET/PREFIX/` and `gs://BUCKET/PREFIX/` ([`open_prefix`]): the prefix listed once, at
//! mount, within the limits of a local walk and of a hub listing, and laid out as an `hf://`
//! repository is (`listed`), every object read at the version the listing saw (its ETag with
//! `If-Match`, its generation).

use std::sync::Arc;

use super::error::{OpenError, OpenProblem};
use super::index_file::MAX_INDEX_SIZE;
use super::layout::{self, MAX_DEPTH};
use super::listed::{self, Repository};
use super::shard::{open_source, Checkpoint, OpenedShard};
use super::OpenOptions;
use crate::source::http::{HttpError, HttpSource};
use crate::source::hub::{self, Sibling};
use crate::source::object::{self, ListLimits, Listed, Listing};
use crate::source::Source;

/// Opens the prefix `spec` names as the model repository it holds: its own checkpoint, a component
/// in each folder with one, the small files of the folders a mount serves. A prefix with no
/// object, or with no `*.safetensors` object within [`MAX_DEPTH`] folders, is one line.
pub(super) fn open_prefix(spec: &str, options: &OpenOptions) -> Result<Checkpoint, OpenError> {
    let limits = ListLimits { objects: layout::MAX_WALKED_ENTRIES, bytes: hub::MAX_API_BYTES };
    let listing = object::list(spec, &options.http, &options.object, limits).map_err(|e| OpenError::new(spec, e))?;
    let shown = listing.prefix.shown();
    if listing.over_limit {
        return Err(OpenError::new(&shown, OpenProblem::TooManyEntries { limit: layout::MAX_WALKED_ENTRIES }));
    }
    if listing.objects.is_empty() {
        return Err(OpenError::new(&shown, OpenProblem::EmptyPrefix));
    }
    let scoped: Vec<Sibling> =
        listing.objects.iter().map(|o| Sibling { path: o.path.clone(), size: Some(o.size) }).collect();
    let has_folders = scoped.iter().any(|s| s.path.contains('/'));
    let repo = Objects { listing: &listing, options };
    let nothing = || {
        let problem =
            if has_folders { OpenProblem::NothingLoadable { depth: MAX_DEPTH } } else { OpenProblem::NoShardFiles };
        OpenError::new(&shown, problem)
    };
    listed::lay_out(&repo, "", &scoped, nothing, options.repo_files)
}

/// The objects of a listed prefix, each at the version listed.
struct Objects<'a> {
    listing: &'a Listing,
    options: &'a OpenOptions,
}

impl Objects<'_> {
    /// The object at `path` below the prefix, opened at its listed version.
    fn open(&self, path: &str) -> Result<HttpSource, OpenError> {
        let shown = self.listing.prefix.child(path).shown();
        let listed: &Listed = self
            .listing
            .objects
            .binary_search_by(|o| o.path.as_str().cmp(path))
            .ok()
            .map(|at| &self.listing.objects[at])
            .ok_or_else(|| OpenError::new(&shown, HttpError::Status { name: shown.clone(), status: 404 }))?;
        self.listing.open(listed, &self.options.http).map_err(|e| OpenError::new(&shown, e))
    }

    /// The whole object at `path` (its size was checked when it was listed or named).
    fn read_whole(&self, path: &str) -> Result<Vec<u8>, OpenError> {
        let shown = self.listing.prefix.child(path).shown();
        let source = self.open(path)?;
        let mut bytes = vec![0; source.len() as usize];
        let mut reader = source.open_reader().map_err(|e| OpenError::new(&shown, e))?;
        reader.read_exact_at(&mut bytes, 0).map_err(|e| OpenError::new(&shown, e))?;
        Ok(bytes)
    }
}

impl Repository for Objects<'_> {
    fn shown(&self) -> String {
        self.listing.prefix.shown()
    }

    fn open_shard(&self, path: &str) -> Result<OpenedShard, OpenError> {
        let source = Arc::new(self.open(path)?);
        let shard = open_source(Arc::clone(&source) as Arc<dyn Source>)?;
        source.opened();
        Ok(shard)
    }

    fn fetch_index(&self, path: &str, limit: usize) -> Result<Vec<u8>, OpenError> {
        let limit = limit.min(MAX_INDEX_SIZE);
        // The object is opened at its listed size: checked here, before it is read.
        let len = self.listing.objects.iter().find(|o| o.path == path).map_or(0, |o| o.size);
        if len > limit as u64 {
            let problem = OpenProblem::IndexTooLarge { len: len as usize, limit };
            return Err(OpenError::new(self.listing.prefix.child(path).shown(), problem));
        }
        self.read_whole(path)
    }

    fn fetch_small(&self, path: &str) -> Result<Vec<u8>, OpenError> {
        // Only objects listed within `hub::SMALL_FILE_LIMIT` are asked for (`hub::small_files_in`).
        self.read_whole(path)
    }
}
