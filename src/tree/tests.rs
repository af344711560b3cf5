//! Tests of the tree: layouts, escaping and reserved names, the views' files, stable inode numbers,
//! and the metadata.json a built tree carries.

use super::metadata;
use super::namespace::*;
use crate::format::{parse_header, Dtype};

fn shard(names: &[&str]) -> Shard {
    let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> =
        names.iter().map(|n| (n.to_string(), Dtype::BF16, vec![2, 3], vec![0; 12])).collect();
    let bytes = crate::format::writer::serialize(&tensors, None).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = parse_header(&bytes[8..8 + n], bytes.len() as u64).unwrap();
    Shard { source: 0, name: "m.safetensors".into(), header, file: None }
}

fn paths(ns: &Namespace) -> Vec<(String, String)> {
    ns.tensors().iter().map(|t| (t.name.clone(), t.path.clone())).collect()
}

fn resolve(ns: &Namespace, path: &str) -> Option<Ino> {
    path.split('/').try_fold(ROOT_INO, |dir, part| ns.dir(dir)?.get(part))
}

#[test]
fn flat_layout_escapes_and_reserves() {
    let ns = Namespace::build(vec![shard(&["a/b", "metadata.json", "w"])], Vec::new(), Layout::Flat, Views::default())
        .unwrap();
    let root = ns.dir(ROOT_INO).unwrap();
    let names: Vec<&str> = root.entries().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["%6Detadata.json", ".stfs", "a%2Fb", "metadata.json", "w"]);
    for t in ns.tensors() {
        assert!(matches!(ns.node(resolve(&ns, &t.path).unwrap()).unwrap().kind, NodeKind::File { size: 12, .. }));
    }
}

#[test]
fn tree_layout_splits_on_dots_and_keeps_prefix_tensors() {
    let ns = Namespace::build(
        vec![shard(&["m.l.0.w", "m.l.0", "m.l.1.w", "top"])],
        Vec::new(),
        Layout::Tree,
        Views::default(),
    )
    .unwrap();
    let mut p = paths(&ns);
    p.sort();
    assert_eq!(
        p,
        [
            ("m.l.0".to_string(), "m/l/0/%self".to_string()),
            ("m.l.0.w".to_string(), "m/l/0/w".to_string()),
            ("m.l.1.w".to_string(), "m/l/1/w".to_string()),
            ("top".to_string(), "top".to_string()),
        ]
    );
    for t in ns.tensors() {
        assert!(resolve(&ns, &t.path).is_some(), "{}", t.path);
    }
    // The same rule whichever comes first in the file.
    let ns = Namespace::build(vec![shard(&["x", "x.y"])], Vec::new(), Layout::Tree, Views::default()).unwrap();
    assert!(ns.tensors().iter().all(|t| resolve(&ns, &t.path).is_some()));
}

#[test]
fn npy_view_adds_files_and_never_clashes() {
    let views = Views { npy: true, as_f32: false };
    let ns = Namespace::build(vec![shard(&["x", "x.npy"])], Vec::new(), Layout::Flat, views).unwrap();
    let root = ns.dir(ROOT_INO).unwrap();
    let names: Vec<&str> = root.entries().iter().map(|(n, _)| n.as_str()).collect();
    // Raw `x.npy` is escaped to `x%2Enpy`; its view is `x.npy.npy`; `x.npy` is the view of `x`.
    assert_eq!(names, [".stfs", "metadata.json", "x", "x%2Enpy", "x.npy", "x.npy.npy"]);
    let t = &ns.tensors()[0];
    let npy = resolve(&ns, t.npy_path.as_deref().unwrap()).unwrap();
    let NodeKind::File { content: Content::Npy { header, .. }, size } = &ns.node(npy).unwrap().kind else { panic!() };
    assert_eq!(*size, header.len() as u64 + 12);
}

#[test]
fn f32_view_changes_sizes_and_dtypes() {
    let views = Views { npy: false, as_f32: true };
    let ns = Namespace::build(vec![shard(&["w"])], Vec::new(), Layout::Flat, views).unwrap();
    let t = &ns.tensors()[0];
    assert_eq!((t.served_dtype, t.served_len, t.len), (Dtype::F32, 24, 12));
    // Integer and bool tensors keep their bytes and dtype; metadata.json says what each file serves.
    let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = [(Dtype::I64, 8), (Dtype::U8, 1), (Dtype::BOOL, 1)]
        .into_iter()
        .map(|(d, size)| (d.name().to_lowercase(), d, vec![3], vec![1; 3 * size]))
        .chain([("h".to_string(), Dtype::F16, vec![3], vec![0; 6])])
        .collect();
    let bytes = crate::format::writer::serialize(&tensors, None).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = parse_header(&bytes[8..8 + n], bytes.len() as u64).unwrap();
    let ns = Namespace::build(
        vec![Shard { source: 0, name: "m".into(), header, file: None }],
        Vec::new(),
        Layout::Flat,
        views,
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&metadata::render(&ns)).unwrap();
    for (name, dtype, len) in [("i64", "I64", 24), ("u8", "U8", 3), ("bool", "BOOL", 3), ("h", "F32", 12)] {
        let t = &doc["tensors"][name];
        assert_eq!((t["served_dtype"].as_str(), t["served_byte_len"].as_u64()), (Some(dtype), Some(len)), "{name}");
    }
    // Without a view, every file serves its own dtype, and metadata.json says so too.
    let ns = Namespace::build(vec![shard(&["w"])], Vec::new(), Layout::Flat, Views::default()).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&metadata::render(&ns)).unwrap();
    assert_eq!(doc["tensors"]["w"]["served_dtype"], "BF16");
}

#[test]
fn inode_numbers_are_stable() {
    let a = Namespace::build(vec![shard(&["p", "q", "r"])], Vec::new(), Layout::Flat, Views::default()).unwrap();
    let b = Namespace::build(vec![shard(&["p", "q", "r"])], Vec::new(), Layout::Flat, Views::default()).unwrap();
    let inos = |ns: &Namespace| ns.tensors().iter().map(|t| resolve(ns, &t.path)).collect::<Vec<_>>();
    assert_eq!(inos(&a), inos(&b));
}

#[test]
fn metadata_json_is_rendered_into_the_root() {
    let bytes = crate::format::writer::serialize(&[("w".to_string(), Dtype::U8, vec![2], vec![1, 2])], None).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = parse_header(&bytes[8..8 + n], bytes.len() as u64).unwrap();
    let shard = Shard { source: 0, name: "m.safetensors".into(), header, file: None };
    let ns = Namespace::build(vec![shard], Vec::new(), Layout::Flat, Views::default()).unwrap();
    let ino = ns.dir(ROOT_INO).and_then(|root| root.get(METADATA_NAME)).unwrap();
    let NodeKind::File { content: Content::Bytes(json), size } = &ns.node(ino).unwrap().kind else { panic!() };
    assert_eq!(*size, json.len() as u64);
    assert_eq!(&json[..], &metadata::render(&ns)[..]);
    let doc: serde_json::Value = serde_json::from_slice(json).unwrap();
    assert_eq!(doc["tensors"]["w"]["path"], "w");
}

#[test]
fn checkpoint_files_take_their_names_before_tensors() {
    let mut s = shard(&["a", "m.safetensors", "metadata.json"]);
    s.file = Some("m.safetensors".into());
    let index =
        RootFile { name: "m.safetensors.index.json".into(), bytes: b"{}".to_vec().into(), kind: RootKind::Index };
    // An index file under a name already taken is left out.
    let taken = RootFile { name: "m.safetensors".into(), bytes: b"{}".to_vec().into(), kind: RootKind::Index };
    let ns = Namespace::build(vec![s], vec![index, taken], Layout::Flat, Views::default()).unwrap();
    let root = ns.dir(ROOT_INO).unwrap();
    let names: Vec<&str> = root.entries().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "%6D.safetensors",
            "%6Detadata.json",
            ".stfs",
            "a",
            "m.safetensors",
            "m.safetensors.index.json",
            "metadata.json"
        ]
    );
    let file_len = ns.shards()[0].header.file_len;
    let whole = ns.node(root.get("m.safetensors").unwrap()).unwrap();
    assert!(matches!(whole.kind, NodeKind::File { content: Content::Checkpoint(0), size } if size == file_len));
    let served: Vec<_> = ns.served_files().iter().map(|f| (f.name.as_str(), f.shard, f.size)).collect();
    assert_eq!(served, [("m.safetensors", Some(0), file_len), ("m.safetensors.index.json", None, 2)]);
    let doc: serde_json::Value = serde_json::from_slice(&metadata::render(&ns)).unwrap();
    assert_eq!(doc["checkpoint_files"][0], serde_json::json!({"path": "m.safetensors", "size": file_len, "shard": 0}));
    assert_eq!(doc["checkpoint_files"][1], serde_json::json!({"path": "m.safetensors.index.json", "size": 2}));
    assert_eq!(doc["files"].as_object().unwrap().len(), 3, "files maps tensor files only");
}

#[test]
fn repo_files_take_their_names_before_tensors_and_are_listed_apart() {
    let repo =
        |name: &str, bytes: &[u8]| RootFile { name: name.into(), bytes: bytes.to_vec().into(), kind: RootKind::Repo };
    let index =
        RootFile { name: "m.safetensors.index.json".into(), bytes: b"{}".to_vec().into(), kind: RootKind::Index };
    // Given before the index: the index still takes its place first.
    let files = vec![repo("config.json", b"{\"a\": 1}"), repo("metadata.json", b"no"), index];
    let ns = Namespace::build(vec![shard(&["config.json", "w"])], files, Layout::Flat, Views::default()).unwrap();
    let root = ns.dir(ROOT_INO).unwrap();
    let names: Vec<&str> = root.entries().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["%63onfig.json", ".stfs", "config.json", "m.safetensors.index.json", "metadata.json", "w"]);
    let config = ns.node(root.get("config.json").unwrap()).unwrap();
    assert!(matches!(&config.kind, NodeKind::File { content: Content::Bytes(b), size: 8 } if &b[..] == b"{\"a\": 1}"));
    let doc: serde_json::Value = serde_json::from_slice(&metadata::render(&ns)).unwrap();
    // A repository file named metadata.json is not served: stfs's own keeps the name.
    assert_eq!(doc["repo_files"], serde_json::json!([{"path": "config.json", "size": 8}]));
    assert_eq!(doc["checkpoint_files"], serde_json::json!([{"path": "m.safetensors.index.json", "size": 2}]));
    assert_eq!(doc["tensors"]["config.json"]["path"], "%63onfig.json");
    assert!(doc["stfs_metadata_version"] == 1);
}

#[test]
fn checkpoint_extents_follow_tensors() {
    let ns = Namespace::build(vec![shard(&["a", "b", "c"])], Vec::new(), Layout::Flat, Views::default()).unwrap();
    let d = ns.shards()[0].header.data_start();
    let e = |r: std::ops::Range<u64>| ns.checkpoint_extent(0, r);
    // In the header: the header; inside a tensor: that tensor.
    assert_eq!(e(0..8), 0..d);
    assert_eq!(e(d + 13..d + 14), d + 12..d + 24);
    assert_eq!(e(d + 35..d + 36), d + 24..d + 36);
    // A read that takes in a tensor's first byte reads it from the start: the last one it takes in.
    assert_eq!(e(d + 12..d + 20), d + 12..d + 24);
    assert_eq!(e(0..d + 1), 0..d + 12);
    assert_eq!(e(d + 5..d + 30), d + 5..d + 36);
    // An unknown shard: the whole source.
    assert_eq!(ns.checkpoint_extent(3, 0..1), 0..u64::MAX);
}

/// Every entry name of every directory of `ns`.
fn all_entry_names(ns: &Namespace) -> Vec<String> {
    (ROOT_INO..)
        .map_while(|ino| ns.node(ino))
        .filter_map(|node| match &node.kind {
            NodeKind::Dir(d) => Some(d.entries().iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()),
            NodeKind::File { .. } => None,
        })
        .flatten()
        .collect()
}

const ALL_VIEWS: [Views; 4] = [
    Views { npy: false, as_f32: false },
    Views { npy: true, as_f32: false },
    Views { npy: false, as_f32: true },
    Views { npy: true, as_f32: true },
];

#[test]
fn names_near_name_max_fit_with_the_npy_extension() {
    // 252-255 bytes escaped used to give NAME.npy of 256-259 bytes.
    for len in 240..=260 {
        for name in ["x".repeat(len), format!("{}.npy", "y".repeat(len - 4)), format!("{}%", "z".repeat(len - 3))] {
            for layout in [Layout::Flat, Layout::Tree] {
                for views in ALL_VIEWS {
                    let ns = Namespace::build(vec![shard(&[&name])], Vec::new(), layout, views).unwrap();
                    for n in all_entry_names(&ns) {
                        assert!(n.len() <= crate::tree::names::NAME_MAX, "{layout:?} {views:?}: {} bytes", n.len());
                    }
                    let t = &ns.tensors()[0];
                    assert!(resolve(&ns, &t.path).is_some());
                    assert!(t.npy_path.as_deref().is_none_or(|p| resolve(&ns, p).is_some()));
                }
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn every_name_of_every_view_and_layout_fits_name_max(
        names in proptest::collection::btree_set("[a-z%/.é]{0,12}|[a-zé%.]{120,300}|[a-z]{245,260}(\\.npy)?", 1..6),
    ) {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for layout in [Layout::Flat, Layout::Tree] {
            for views in ALL_VIEWS {
                // The tree layout refuses some sets of names (a clash): nothing is served then.
                let Ok(ns) = Namespace::build(vec![shard(&names)], Vec::new(), layout, views) else { continue };
                for n in all_entry_names(&ns) {
                    proptest::prop_assert!(n.len() <= crate::tree::names::NAME_MAX, "{:?} {:?}: {}", layout, views, n);
                }
                for t in ns.tensors() {
                    proptest::prop_assert!(resolve(&ns, &t.path).is_some(), "{}", t.path);
                    if let Some(p) = &t.npy_path {
                        proptest::prop_assert!(resolve(&ns, p).is_some(), "{}", p);
                    }
                }
            }
        }
    }
}

/// metadata.json (and `stfs inspect --json`) never hands a terminal a character that does not print
/// as itself: DEL, C1 controls, separators, bidirectional overrides and tags in tensor names and in
/// `__metadata__` are `\u` escapes (a surrogate pair above U+FFFF), and the JSON reads back as the
/// same strings. Plain non-ASCII (`é`, a combining mark after a letter, an emoji) stays as it is.
#[test]
fn metadata_json_escapes_what_does_not_print_as_itself() {
    let odd = ["a\u{7f}b", "c\u{9b}31m", "evil\u{202e}gpj", "x\u{2028}y", "t\u{e0041}", "caf\u{e9}e\u{301}\u{1f600}"];
    let mut s = shard(&odd);
    let meta = std::collections::BTreeMap::from([("k\u{9b}".to_string(), "v\u{1b}]0;t\u{7}\u{85}".to_string())]);
    s.header.metadata = Some(meta.clone());
    let ns = Namespace::build(vec![s], Vec::new(), Layout::Flat, Views::default()).unwrap();
    let json = metadata::render(&ns);
    let text = std::str::from_utf8(&json).unwrap();
    for raw in ['\u{7f}', '\u{9b}', '\u{202e}', '\u{2028}', '\u{e0041}', '\u{1b}', '\u{85}'] {
        assert!(!text.contains(raw), "{raw:?} raw in {text}");
    }
    for escaped in
        [r"a\u007fb", r"c\u009b31m", r"evil\u202egpj", r"x\u2028y", r"t\udb40\udc41", "caf\u{e9}e\u{301}\u{1f600}"]
    {
        assert!(text.contains(escaped), "{escaped} missing from {text}");
    }
    let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    for name in odd {
        assert_eq!(doc["tensors"][name]["dtype"], "BF16", "{name:?} does not read back");
        assert_eq!(doc["files"][name], name);
    }
    assert_eq!(doc["metadata"], serde_json::to_value(&meta).unwrap());
}

/// A repository laid out in folders: each component in its folder with its own metadata.json
/// (paths relative to it), the small files of other folders at their paths, and the root's
/// metadata.json listing the components.
#[test]
fn components_are_laid_out_in_their_folders() {
    let repo =
        |name: &str, bytes: &[u8]| RootFile { name: name.into(), bytes: bytes.to_vec().into(), kind: RootKind::Repo };
    let mut unet = shard(&["conv.weight", "metadata.json"]);
    unet.file = Some("diffusion_pytorch_model.safetensors".into());
    let components = vec![
        Component {
            folder: "unet".into(),
            shards: vec![unet],
            files: vec![repo("config.json", b"{}"), repo("metadata.json", b"theirs")],
            ..Component::default()
        },
        Component { folder: "vae".into(), shards: vec![shard(&["conv.weight"])], ..Component::default() },
        Component {
            folder: String::new(),
            shards: Vec::new(),
            files: vec![repo("model_index.json", b"{\"unet\": 1}"), repo("scheduler/scheduler_config.json", b"s")],
            ..Component::default()
        },
    ];
    let ns = Namespace::build_components(components, Layout::Flat, Views::default()).unwrap();
    let root = ns.dir(ROOT_INO).unwrap();
    let names: Vec<&str> = root.entries().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [".stfs", "metadata.json", "model_index.json", "scheduler", "unet", "vae"]);
    for path in [
        "scheduler/scheduler_config.json",
        "unet/metadata.json",
        "unet/%6Detadata.json",
        "unet/config.json",
        "unet/conv.weight",
        "unet/diffusion_pytorch_model.safetensors",
        "vae/conv.weight",
        "vae/metadata.json",
    ] {
        assert!(resolve(&ns, path).is_some(), "{path} missing");
    }
    let doc = |ino: Ino| -> serde_json::Value {
        let NodeKind::File { content: Content::Bytes(json), .. } = &ns.node(ino).unwrap().kind else { panic!() };
        serde_json::from_slice(json).unwrap()
    };
    let top = doc(resolve(&ns, "metadata.json").unwrap());
    assert_eq!(
        top["components"],
        serde_json::json!([{"path": "unet", "tensors": 2, "shards": 1}, {"path": "vae", "tensors": 1, "shards": 1}])
    );
    assert_eq!(top["repo_files"][1], serde_json::json!({"path": "scheduler/scheduler_config.json", "size": 1}));
    assert_eq!((top["tensors"].as_object().unwrap().len(), top["shards"].as_array().unwrap().len()), (0, 0));
    // A component's metadata.json is a flat mount's of its folder: paths relative to it, its
    // shards only, its files; a repository file named metadata.json is not served.
    let unet = doc(resolve(&ns, "unet/metadata.json").unwrap());
    assert_eq!(unet["tensors"]["metadata.json"]["path"], "%6Detadata.json");
    assert_eq!(unet["files"]["conv.weight"], "conv.weight");
    assert_eq!(unet["checkpoint_files"][0]["path"], "diffusion_pytorch_model.safetensors");
    assert_eq!(unet["repo_files"], serde_json::json!([{"path": "config.json", "size": 2}]));
    assert!(unet.get("components").is_none());
    let vae = doc(resolve(&ns, "vae/metadata.json").unwrap());
    assert_eq!(
        (vae["tensors"]["conv.weight"]["shard"].as_u64(), vae["shards"].as_array().unwrap().len()),
        (Some(0), 1)
    );
    // Every tensor file is where its component's metadata.json says.
    for c in &ns.components()[1..] {
        for t in &ns.tensors()[c.tensors.clone()] {
            let local = c.relative(&t.path);
            assert_eq!(resolve(&ns, &format!("{}/{local}", c.folder)), resolve(&ns, &t.path));
        }
    }
}

/// The collision rule: a folder's name (a component's, or one a small file is in) is reserved in
/// the directory it is in, as a small file's name is: a tensor named like it gets its first byte
/// escaped, in the flat layout and for the first directory of the tree layout alike.
#[test]
fn a_tensor_named_like_a_folder_is_escaped() {
    let repo = |name: &str| RootFile { name: name.into(), bytes: b"{}".to_vec().into(), kind: RootKind::Repo };
    for layout in [Layout::Flat, Layout::Tree] {
        let root = Component {
            folder: String::new(),
            shards: vec![shard(&["2_Dense", "1_Pooling", "1_Pooling.x", "w"])],
            files: vec![repo("1_Pooling/config.json"), repo("config.json")],
            ..Component::default()
        };
        let dense =
            Component { folder: "2_Dense".into(), shards: vec![shard(&["linear.weight"])], ..Component::default() };
        let ns = Namespace::build_components(vec![root, dense], layout, Views::default()).unwrap();
        let mut p = paths(&ns);
        p.sort();
        let expected: [(&str, &str); 5] = match layout {
            Layout::Flat => [
                ("1_Pooling", "%31_Pooling"),
                ("1_Pooling.x", "1_Pooling.x"),
                ("2_Dense", "%32_Dense"),
                ("linear.weight", "2_Dense/linear.weight"),
                ("w", "w"),
            ],
            Layout::Tree => [
                ("1_Pooling", "%31_Pooling/%self"),
                ("1_Pooling.x", "%31_Pooling/x"),
                ("2_Dense", "%32_Dense"),
                ("linear.weight", "2_Dense/linear/weight"),
                ("w", "w"),
            ],
        };
        let expected: Vec<(String, String)> = expected.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        assert_eq!(p, expected, "{layout:?}");
        for t in ns.tensors() {
            assert!(resolve(&ns, &t.path).is_some(), "{}", t.path);
        }
        assert!(resolve(&ns, "1_Pooling/config.json").is_some() && resolve(&ns, "2_Dense/metadata.json").is_some());
    }
}
