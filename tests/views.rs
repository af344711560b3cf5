//! Tensor-aware views on real mounts: sharded checkpoints, `.npy` files, F32 conversion, tree layout.

mod common;

use std::collections::BTreeMap;

use common::*;
use stfs::format::Dtype;

#[test]
fn index_json_mounts_shards_as_one_namespace() {
    let dir = workdir();
    let a = vec![T::new("model.a", Dtype::F32, &[100]), T::new("model.b", Dtype::BF16, &[7, 9])];
    let b = vec![T::new("model.c", Dtype::I64, &[33]), T::new("lm_head", Dtype::F16, &[40, 3])];
    write_checkpoint(&dir.path().join("model-00001-of-00002.safetensors"), &a, None);
    write_checkpoint(&dir.path().join("model-00002-of-00002.safetensors"), &b, None);
    let index = serde_json::json!({
        "metadata": {"total_size": 12345678},   // wrong on purpose: stfs must not trust it
        "weight_map": {"model.a": "model-00001-of-00002.safetensors", "model.b": "model-00001-of-00002.safetensors",
                        "model.c": "model-00002-of-00002.safetensors", "lm_head": "model-00002-of-00002.safetensors"}
    });
    let index_path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).unwrap();
    for source in [index_path.clone(), dir.path().to_path_buf()] {
        let m = Mount::new(&source, &[]);
        for t in a.iter().chain(&b) {
            assert_eq!(std::fs::read(m.file(&t.name)).unwrap(), t.data, "{}", t.name);
        }
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap();
        let shard = doc["tensors"]["lm_head"]["shard"].as_u64().unwrap() as usize;
        assert!(doc["shards"][shard]["source"].as_str().unwrap().ends_with("model-00002-of-00002.safetensors"));
        let out = std::process::Command::new("getfattr")
            .args(["--only-values", "-n", "user.safetensors.shard"])
            .arg(m.file("model.a"))
            .output();
        match out {
            Ok(out) => assert!(String::from_utf8_lossy(&out.stdout).ends_with("model-00001-of-00002.safetensors")),
            Err(_) => tool_missing("getfattr", "apt-get install attr"),
        }
    }
}

#[test]
fn inconsistent_shards_are_refused_at_mount_time() {
    let dir = workdir();
    write_checkpoint(&dir.path().join("s1.safetensors"), &[T::new("x", Dtype::F32, &[2])], None);
    write_checkpoint(&dir.path().join("s2.safetensors"), &[T::new("x", Dtype::F32, &[3])], None);
    let mp = workdir();
    let out = stfs(&["mount", dir.path().to_str().unwrap(), mp.path().to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("is in two shards"), "{err}");
    assert!(!is_mounted(mp.path()));
    for (map, needle) in [
        (r#"{"x":"s1.safetensors","y":"s3.safetensors"}"#, "s3.safetensors: no such file"),
        (r#"{"x":"s1.safetensors","nope":"s1.safetensors"}"#, "does not hold it"),
    ] {
        let idx = dir.path().join("bad.index.json");
        std::fs::write(&idx, format!(r#"{{"weight_map":{map}}}"#)).unwrap();
        let out = stfs(&["inspect", idx.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn npy_view_files_are_header_plus_bytes() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    let tensors = mixed_tensors();
    write_checkpoint(&file, &tensors, None);
    let m = Mount::new(&file, &["-o", "npy", "--block-size", "4K", "--cache-size", "16K"]);
    for t in &tensors {
        let raw_name = stfs::tree::names::escape(&t.name, stfs::tree::namespace::RESERVED);
        let npy = std::fs::read(m.file(&format!("{raw_name}.npy"))).unwrap();
        let header = stfs::views::npy::npy_header(t.dtype, &t.shape).unwrap();
        assert_eq!(npy.len(), header.len() + t.data.len(), "{}", t.name);
        assert_eq!(&npy[..header.len()], &header[..]);
        assert_eq!(&npy[header.len()..], &t.data[..]);
        assert_eq!(header.len() % 64, 0);
        // Reads that straddle the header/data boundary.
        let f = std::fs::File::open(m.file(&format!("{raw_name}.npy"))).unwrap();
        let mut buf = vec![0u8; 100];
        let n = std::os::unix::fs::FileExt::read_at(&f, &mut buf, header.len() as u64 - 50).unwrap();
        assert_eq!(&buf[..n], &npy[header.len() - 50..(header.len() + 50).min(npy.len())]);
    }
}

#[test]
fn f32_view_converts_and_keeps_f32_untouched() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    // BF16 values that convert exactly: bits << 16.
    let bf16: Vec<u16> = (0..1000u16).map(|i| 0x3f80 + i).collect();
    let bf16_bytes: Vec<u8> = bf16.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut tensors = vec![T::new("f32", Dtype::F32, &[17]), T::new("i8", Dtype::I8, &[5])];
    tensors.push(T { name: "bf16".into(), dtype: Dtype::BF16, shape: vec![1000], data: bf16_bytes });
    write_checkpoint(&file, &tensors, None);
    let m = Mount::new(&file, &["-o", "as=f32", "--block-size", "4K", "--cache-size", "8K"]);
    let got = std::fs::read(m.file("bf16")).unwrap();
    let want: Vec<u8> = bf16.iter().flat_map(|v| ((*v as u32) << 16).to_le_bytes()).collect();
    assert_eq!(got, want);
    assert_eq!(std::fs::metadata(m.file("bf16")).unwrap().len(), 4000);
    // Odd offsets inside an element.
    let f = std::fs::File::open(m.file("bf16")).unwrap();
    let mut buf = [0u8; 7];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 1001).unwrap();
    assert_eq!(&buf, &want[1001..1008]);
    assert_eq!(std::fs::read(m.file("f32")).unwrap(), tensors[0].data);
    // Integers are not floats: --as f32 serves them as they are (issue 15: an I64 became F32).
    assert_eq!(std::fs::read(m.file("i8")).unwrap(), tensors[1].data);
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap();
    let served = |name: &str| {
        let t = &doc["tensors"][name];
        (t["dtype"].as_str().unwrap(), t["served_dtype"].as_str().unwrap(), t["served_byte_len"].as_u64().unwrap())
    };
    assert_eq!(served("bf16"), ("BF16", "F32", 4000));
    assert_eq!(served("i8"), ("I8", "I8", 5));
    assert_eq!(served("f32"), ("F32", "F32", 68));
}

#[test]
fn tree_layout_makes_directories() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    let tensors = vec![
        T::new("model.layers.0.mlp.weight", Dtype::F32, &[3]),
        T::new("model.layers.0.mlp", Dtype::F32, &[2]),
        T::new("model.layers.1.mlp.weight", Dtype::F32, &[4]),
        T::new("lm_head", Dtype::U8, &[9]),
    ];
    write_checkpoint(&file, &tensors, Some(&BTreeMap::new()));
    let m = Mount::new(&file, &["-o", "layout=tree"]);
    assert_eq!(std::fs::read(m.file("model/layers/0/mlp/weight")).unwrap(), tensors[0].data);
    assert_eq!(std::fs::read(m.file("model/layers/0/mlp/%self")).unwrap(), tensors[1].data);
    assert_eq!(std::fs::read(m.file("model/layers/1/mlp/weight")).unwrap(), tensors[2].data);
    assert_eq!(std::fs::read(m.file("lm_head")).unwrap(), tensors[3].data);
    assert!(std::fs::metadata(m.file("model/layers")).unwrap().is_dir());
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap();
    assert_eq!(doc["files"]["model/layers/0/mlp/%self"], "model.layers.0.mlp");
    let mut found: Vec<String> = walk(&m.path)
        .into_iter()
        .filter(|p| !p.starts_with(".stfs") && p != "metadata.json" && p != "m.safetensors")
        .collect();
    found.sort();
    assert_eq!(
        found,
        ["lm_head", "model/layers/0/mlp/%self", "model/layers/0/mlp/weight", "model/layers/1/mlp/weight"]
    );
}

fn walk(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out
}
