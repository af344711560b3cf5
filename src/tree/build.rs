//! [`Namespace::build`]: the tree laid out by `namespace`, then its `metadata.json` rendered by
//! `metadata` from it (kept here so that neither of those two imports the other).

use super::metadata;
use super::namespace::{Layout, NameClash, Namespace, RootFile, Shard, Views};

impl Namespace {
    /// Builds the tree for `shards`, `metadata.json` included, with the checkpoint's own files in
    /// the root: each shard with a [`Shard::file`] name, and `root_files` (index files, then the
    /// repository's files). Tensor names are unique across shards (checked by the caller). Each
    /// shard's tensor list is moved into [`Namespace::tensors`] (not copied: a header may hold a
    /// million entries), so the kept shards' `header.tensors` are empty.
    pub fn build(
        shards: Vec<Shard>,
        root_files: Vec<RootFile>,
        layout: Layout,
        views: Views,
    ) -> Result<Namespace, NameClash> {
        let mut ns = Namespace::lay_out(shards, root_files, layout, views)?;
        let json = metadata::render(&ns);
        ns.set_metadata(json);
        Ok(ns)
    }
}
