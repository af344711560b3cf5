//! [`Namespace::build`]: the tree laid out by `namespace`, then its `metadata.json` rendered by
//! `metadata` from it (kept here so that neither of those two imports the other).

use super::metadata;
use super::namespace::{Layout, NameClash, Namespace, Shard, Views};

impl Namespace {
    /// Builds the tree for `shards`, `metadata.json` included. Tensor names are unique across
    /// shards (checked by the caller). Each shard's tensor list is moved into
    /// [`Namespace::tensors`] (not copied: a header may hold a million entries), so the kept
    /// shards' `header.tensors` are empty.
    pub fn build(shards: Vec<Shard>, layout: Layout, views: Views) -> Result<Namespace, NameClash> {
        let mut ns = Namespace::lay_out(shards, layout, views)?;
        let json = metadata::render(&ns);
        ns.set_metadata(json);
        Ok(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{parse_header, writer::serialize, Dtype};
    use crate::tree::namespace::{Content, NodeKind, METADATA_NAME, ROOT_INO};

    #[test]
    fn metadata_json_is_rendered_into_the_root() {
        let bytes = serialize(&[("w".to_string(), Dtype::U8, vec![2], vec![1, 2])], None).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = parse_header(&bytes[8..8 + n], bytes.len() as u64).unwrap();
        let shard = Shard { source: 0, name: "m.safetensors".into(), header };
        let ns = Namespace::build(vec![shard], Layout::Flat, Views::default()).unwrap();
        let ino = ns.dir(ROOT_INO).and_then(|root| root.get(METADATA_NAME)).unwrap();
        let NodeKind::File { content: Content::Bytes(json), size } = &ns.node(ino).unwrap().kind else { panic!() };
        assert_eq!(*size, json.len() as u64);
        assert_eq!(&json[..], &metadata::render(&ns)[..]);
        let doc: serde_json::Value = serde_json::from_slice(json).unwrap();
        assert_eq!(doc["tensors"]["w"]["path"], "w");
    }
}
