//! [`Namespace::build`]: the tree laid out by `namespace`, then its `metadata.json` rendered by
//! `metadata` from it (kept here so that neither of those two imports the other).

use super::metadata;
use super::namespace::{Component, Layout, NameClash, Namespace, RootFile, Shard, Views};

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
        let root = Component { folder: String::new(), shards, files: root_files, ..Component::default() };
        Namespace::build_components(vec![root], layout, views)
    }

    /// Builds the tree of a model repository: each of `components` laid out in its folder (the
    /// root's first; see [`Namespace::lay_out`]) with its own `metadata.json`, the root's listing
    /// the others. One component in the root builds exactly what [`Namespace::build`] does.
    pub fn build_components(components: Vec<Component>, layout: Layout, views: Views) -> Result<Namespace, NameClash> {
        let mut ns = Namespace::lay_out(components, layout, views)?;
        for i in 0..ns.components().len() {
            let json = metadata::render_component(&ns, i);
            ns.set_metadata(i, json);
        }
        Ok(ns)
    }
}
