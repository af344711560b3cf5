//! The `metadata.json` file: the header's `__metadata__`, and for every tensor its dtype, shape,
//! offsets and the path it is served under.
//!
//! Schema (version 1):
//! ```text
//! { "stfs_metadata_version": 1,
//!   "shards": [ { "source": PATH, "file_size": N, "header_len": N, "data_start": N,
//!                 "metadata": {..} | null } ],
//!   "metadata": {..} | null,          // __metadata__ of the only shard (null when sharded)
//!   "tensors": { NAME: { "dtype": "BF16", "shape": [..], "byte_len": N,
//!                        "data_offsets": [BEGIN, END],  // relative to the shard's data section
//!                        "offset": N,                   // absolute offset in the shard file
//!                        "shard": I,                    // index into "shards"
//!                        "path": "escaped/file/name",
//!                        "served_dtype": "F32", "served_byte_len": N,   // only under -o as=f32
//!                        "npy_path": "name.npy" } },                    // only under -o npy
//!   "files": { PATH: NAME } }         // every served tensor path back to its tensor name
//! ```

use serde_json::{json, Map, Value};

use crate::namespace::Namespace;

/// Version of the schema above; bumped on incompatible changes.
pub const METADATA_VERSION: u64 = 1;

/// Renders metadata.json for a built namespace, pretty-printed with a final newline.
pub fn render(ns: &Namespace) -> Vec<u8> {
    let shards: Vec<Value> = ns
        .shards()
        .iter()
        .map(|s| {
            json!({
                "source": s.name,
                "file_size": s.header.file_len,
                "header_len": s.header.header_len,
                "data_start": s.header.data_start(),
                "metadata": s.header.metadata,
            })
        })
        .collect();
    let mut tensors = Map::new();
    let mut files = Map::new();
    for t in ns.tensors() {
        let shard = &ns.shards()[t.shard];
        let relative = t.start - shard.header.data_start();
        let mut entry = json!({
                "dtype": t.dtype.name(),
                "shape": t.shape,
                "byte_len": t.len,
                "data_offsets": [relative, relative + t.len],
                "offset": t.start,
                "shard": t.shard,
                "path": t.path,
        });
        if t.served_dtype != t.dtype {
            entry["served_dtype"] = json!(t.served_dtype.name());
            entry["served_byte_len"] = json!(t.served_len);
        }
        if let Some(npy) = &t.npy_path {
            entry["npy_path"] = json!(npy);
            files.insert(npy.clone(), Value::String(t.name.clone()));
        }
        tensors.insert(t.name.clone(), entry);
        files.insert(t.path.clone(), Value::String(t.name.clone()));
    }
    let metadata = match ns.shards() {
        [only] => json!(only.header.metadata),
        _ => Value::Null,
    };
    let doc = json!({
        "stfs_metadata_version": METADATA_VERSION,
        "shards": shards,
        "metadata": metadata,
        "tensors": tensors,
        "files": files,
    });
    let mut out = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    out.push(b'\n');
    out
}
