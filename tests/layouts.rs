//! Model repositories as they are laid out, mounted for real from a local folder: a diffusers
//! pipeline (no checkpoint of its own, one per folder, a sharded one among them) and a
//! sentence-transformers model (a checkpoint in the root and in `2_Dense/`, a module config in
//! `1_Pooling/`). Each component appears in its folder with its tensors, its metadata.json and its
//! re-served checkpoint; the small files of the folders served appear at their paths; a tensor
//! named like a folder is escaped; a folder with nothing loadable, or with too many components, is
//! one line with nothing mounted.

mod common;
#[path = "common/repos.rs"]
mod repos;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use repos::tree;
use stfs::format::Dtype;

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `stfs mount SOURCE` must fail: exit 1, one `stfs: SHOWN: ` line holding `needle`, no mount.
fn refused(source: &Path, shown: &Path, needle: &str) {
    let err = refused_mount(source);
    assert!(
        err.starts_with(&format!("stfs: {}: ", shown.display())) && err.contains(needle),
        "{needle:?} not in {err}"
    );
}

/// A diffusers pipeline as `save_pretrained` writes it, with a sharded VAE and the folders a
/// repository also holds (`onnx/`, `.git/`), which a mount leaves out.
struct Pipeline {
    dir: tempfile::TempDir,
    unet: Vec<T>,
    vae: Vec<T>,
}

fn pipeline() -> Pipeline {
    let dir = workdir();
    let root = dir.path();
    write(
        &root.join("model_index.json"),
        br#"{"_class_name": "DDPMPipeline", "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "DDPMScheduler"], "unet": ["diffusers", "UNet2DModel"],
             "vae": ["diffusers", "AutoencoderKL"], "tokenizer": ["transformers", "CLIPTokenizer"]}"#,
    );
    let unet = vec![T::new("conv_in.weight", Dtype::F32, &[32, 3, 3, 3]), T::new("conv_in.bias", Dtype::F16, &[32])];
    std::fs::create_dir_all(root.join("unet")).unwrap();
    write_checkpoint(&root.join("unet/diffusion_pytorch_model.safetensors"), &unet, None);
    // A variant beside it is another checkpoint: served beside it, its tensors in %.checkpoints/.
    let fp16 = [T::new("conv_in.weight", Dtype::F16, &[32, 3, 3, 3])];
    write_checkpoint(&root.join("unet/diffusion_pytorch_model.fp16.safetensors"), &fp16, None);
    write(&root.join("unet/config.json"), br#"{"_class_name": "UNet2DModel"}"#);
    let vae = vec![T::new("encoder.w", Dtype::BF16, &[64, 9]), T::new("decoder.w", Dtype::F32, &[17])];
    std::fs::create_dir_all(root.join("vae")).unwrap();
    write_checkpoint(&root.join("vae/diffusion_pytorch_model-00001-of-00002.safetensors"), &vae[..1], None);
    write_checkpoint(&root.join("vae/diffusion_pytorch_model-00002-of-00002.safetensors"), &vae[1..], None);
    let index = serde_json::json!({"weight_map": {
        "encoder.w": "diffusion_pytorch_model-00001-of-00002.safetensors",
        "decoder.w": "diffusion_pytorch_model-00002-of-00002.safetensors"}});
    write(&root.join("vae/diffusion_pytorch_model.safetensors.index.json"), index.to_string().as_bytes());
    write(&root.join("vae/config.json"), br#"{"_class_name": "AutoencoderKL"}"#);
    write(&root.join("scheduler/scheduler_config.json"), br#"{"num_train_timesteps": 1000}"#);
    write(&root.join("tokenizer/vocab.json"), br#"{"a": 0}"#);
    write(&root.join("tokenizer/merges.txt"), b"#version: 0.2\n");
    write(&root.join("onnx/model.json"), b"{}");
    write(&root.join(".git/HEAD"), b"ref: refs/heads/main\n");
    write(&root.join(".git/x.safetensors"), b"not looked at");
    Pipeline { dir, unet, vae }
}

#[test]
fn a_diffusers_pipeline_mounts_with_a_component_in_each_folder() {
    let p = pipeline();
    let root = p.dir.path();
    let m = Mount::new(root, &[]);
    assert_eq!(
        tree(&m.path),
        [
            "metadata.json",
            "model_index.json",
            "scheduler/",
            "scheduler/scheduler_config.json",
            "tokenizer/",
            "tokenizer/merges.txt",
            "tokenizer/vocab.json",
            "unet/",
            "unet/%.checkpoints/",
            "unet/%.checkpoints/diffusion_pytorch_model.fp16/",
            "unet/%.checkpoints/diffusion_pytorch_model.fp16/conv_in.weight",
            "unet/%.checkpoints/diffusion_pytorch_model.fp16/metadata.json",
            "unet/config.json",
            "unet/conv_in.bias",
            "unet/conv_in.weight",
            "unet/diffusion_pytorch_model.fp16.safetensors",
            "unet/diffusion_pytorch_model.safetensors",
            "unet/metadata.json",
            "vae/",
            "vae/config.json",
            "vae/decoder.w",
            "vae/diffusion_pytorch_model-00001-of-00002.safetensors",
            "vae/diffusion_pytorch_model-00002-of-00002.safetensors",
            "vae/diffusion_pytorch_model.safetensors.index.json",
            "vae/encoder.w",
            "vae/metadata.json",
        ]
    );
    // Every byte as in the folder: tensors, the re-served checkpoints, the small files.
    for (folder, tensors) in [("unet", &p.unet), ("vae", &p.vae)] {
        for t in tensors.iter() {
            assert!(std::fs::read(m.file(&format!("{folder}/{}", t.name))).unwrap() == t.data, "{folder}/{}", t.name);
        }
    }
    for file in [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "tokenizer/vocab.json",
        "tokenizer/merges.txt",
        "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors",
        "unet/diffusion_pytorch_model.fp16.safetensors",
        "vae/diffusion_pytorch_model-00002-of-00002.safetensors",
        "vae/diffusion_pytorch_model.safetensors.index.json",
    ] {
        assert!(std::fs::read(m.file(file)).unwrap() == std::fs::read(root.join(file)).unwrap(), "{file} differs");
    }
    let fp16 = T::new("conv_in.weight", Dtype::F16, &[32, 3, 3, 3]);
    assert!(
        std::fs::read(m.file("unet/%.checkpoints/diffusion_pytorch_model.fp16/conv_in.weight")).unwrap() == fp16.data
    );
    // The root's metadata.json lists the components and the other folders' small files; each
    // component's tells its tensor files from its other files, paths relative to its folder.
    let top = json(&m.file("metadata.json"));
    assert_eq!(
        top["components"],
        serde_json::json!([{"path": "unet", "tensors": 2, "shards": 1}, {"path": "vae", "tensors": 2, "shards": 2}])
    );
    let repo_files: Vec<&str> =
        top["repo_files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(
        repo_files,
        ["model_index.json", "scheduler/scheduler_config.json", "tokenizer/merges.txt", "tokenizer/vocab.json"]
    );
    assert_eq!((&top["tensors"], top["shards"].as_array().unwrap().len()), (&serde_json::json!({}), 0));
    let vae = json(&m.file("vae/metadata.json"));
    assert_eq!(vae["files"], serde_json::json!({"decoder.w": "decoder.w", "encoder.w": "encoder.w"}));
    assert_eq!(vae["tensors"]["decoder.w"]["shard"], 1);
    assert_eq!(vae["checkpoint_files"].as_array().unwrap().len(), 3);
    assert_eq!(vae["repo_files"], serde_json::json!([{"path": "config.json", "size": 32}]));
    assert!(vae.get("components").is_none());
    let unet = json(&m.file("unet/metadata.json"));
    let source = root.join("unet/diffusion_pytorch_model.safetensors");
    assert_eq!(unet["shards"][0]["source"], source.to_str().unwrap());
    drop(m);

    // Without the checkpoint's files: the components' tensors and metadata.json only.
    let m = Mount::new(root, &["-o", "no_checkpoint_file"]);
    assert_eq!(
        tree(&m.path),
        [
            "metadata.json",
            "unet/",
            "unet/%.checkpoints/",
            "unet/%.checkpoints/diffusion_pytorch_model.fp16/",
            "unet/%.checkpoints/diffusion_pytorch_model.fp16/conv_in.weight",
            "unet/%.checkpoints/diffusion_pytorch_model.fp16/metadata.json",
            "unet/conv_in.bias",
            "unet/conv_in.weight",
            "unet/metadata.json",
            "vae/",
            "vae/decoder.w",
            "vae/encoder.w",
            "vae/metadata.json",
        ]
    );
    drop(m);

    // The tree layout splits names inside each component's folder.
    let m = Mount::new(root, &["--layout", "tree"]);
    assert!(std::fs::read(m.file("vae/encoder/w")).unwrap() == p.vae[0].data);
    assert_eq!(json(&m.file("vae/metadata.json"))["tensors"]["encoder.w"]["path"], "encoder/w");

    // A command that reads one checkpoint names the folders instead.
    let out = stfs(&["inspect", root.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        err.trim_end(),
        format!(
            "stfs: {}: holds no checkpoint of its own, only in its folders (unet, vae): name one of them",
            root.display()
        )
    );
    let out = stfs(&["inspect", root.join("vae").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A sentence-transformers model: its own checkpoint in the root, a module config in
/// `1_Pooling/`, a module with its own checkpoint in `2_Dense/`; the root's tensors named like
/// those folders are escaped, as one named like `config.json` always was.
#[test]
fn a_sentence_transformers_model_mounts_with_its_modules() {
    let dir = workdir();
    let root = dir.path();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let own = vec![
        T::new("embeddings.word_embeddings.weight", Dtype::F32, &[30, 8]),
        T::new("1_Pooling", Dtype::U8, &[3]),
        T::new("2_Dense", Dtype::U8, &[5]),
        T::new("config.json", Dtype::U8, &[7]),
    ];
    write_checkpoint(&root.join("model.safetensors"), &own, Some(&meta));
    write(&root.join("config.json"), br#"{"model_type": "bert"}"#);
    write(
        &root.join("modules.json"),
        br#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
    );
    write(&root.join("1_Pooling/config.json"), br#"{"word_embedding_dimension": 8}"#);
    let dense = vec![T::new("linear.weight", Dtype::F32, &[4, 8])];
    std::fs::create_dir_all(root.join("2_Dense")).unwrap();
    write_checkpoint(&root.join("2_Dense/model.safetensors"), &dense, None);
    write(&root.join("2_Dense/config.json"), br#"{"in_features": 8}"#);

    let m = Mount::new(root, &[]);
    for (path, data) in [
        ("embeddings.word_embeddings.weight", &own[0].data),
        ("%31_Pooling", &own[1].data),
        ("%32_Dense", &own[2].data),
        ("%63onfig.json", &own[3].data),
        ("2_Dense/linear.weight", &dense[0].data),
    ] {
        assert!(&std::fs::read(m.file(path)).unwrap() == data, "{path}");
    }
    for file in
        ["config.json", "modules.json", "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors"]
    {
        assert!(std::fs::read(m.file(file)).unwrap() == std::fs::read(root.join(file)).unwrap(), "{file} differs");
    }
    let top = json(&m.file("metadata.json"));
    assert_eq!(top["components"], serde_json::json!([{"path": "2_Dense", "tensors": 1, "shards": 1}]));
    assert_eq!(top["tensors"]["1_Pooling"]["path"], "%31_Pooling");
    assert_eq!(top["files"]["%32_Dense"], "2_Dense");
    assert_eq!(top["metadata"], serde_json::json!({"format": "pt"}));
    let repo_files: Vec<&str> =
        top["repo_files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(repo_files, ["1_Pooling/config.json", "config.json", "modules.json"]);
    assert_eq!(json(&m.file("2_Dense/metadata.json"))["files"], serde_json::json!({"linear.weight": "linear.weight"}));
    // The folder's own checkpoint is what inspect reads.
    let out = stfs(&["inspect", root.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("4 tensors"), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn folders_with_nothing_loadable_or_too_much_are_one_line_and_nothing_mounted() {
    // Small files only, in the folder and below it.
    let dir = workdir();
    write(&dir.path().join("config.json"), b"{}");
    write(&dir.path().join("1_Pooling/config.json"), b"{}");
    write(&dir.path().join("a/b/c/d/e/deep.safetensors"), b"five folders down: not looked at");
    refused(dir.path(), dir.path(), "holds no *.safetensors files, in it or in its folders (looked 4 folders down)");

    // More folders with a checkpoint than one mount takes.
    let dir = workdir();
    let t = [T::new("w", Dtype::U8, &[1])];
    for i in 0..65 {
        std::fs::create_dir(dir.path().join(format!("c{i:02}"))).unwrap();
        write_checkpoint(&dir.path().join(format!("c{i:02}/model.safetensors")), &t, None);
    }
    refused(
        dir.path(),
        dir.path(),
        "holds 65 folders with a checkpoint (the root's own included), over the limit of 64",
    );

    // A component that cannot be opened fails the mount, naming its file.
    let p = pipeline();
    let broken = p.dir.path().join("vae/diffusion_pytorch_model-00002-of-00002.safetensors");
    std::fs::write(&broken, [0u8; 3]).unwrap();
    refused(p.dir.path(), &broken, "");

    // Two indexes in one folder, no standard name: which is meant is not guessed. (With shards
    // of a standard name beside them, those are the main checkpoint and the indexes others.)
    let p = pipeline();
    let vae = p.dir.path().join("vae");
    for (from, to) in
        [("diffusion_pytorch_model-00001-of-00002", "s1"), ("diffusion_pytorch_model-00002-of-00002", "s2")]
    {
        std::fs::rename(vae.join(format!("{from}.safetensors")), vae.join(format!("{to}.safetensors"))).unwrap();
    }
    let index = serde_json::json!({"weight_map": {"encoder.w": "s1.safetensors", "decoder.w": "s2.safetensors"}});
    std::fs::remove_file(vae.join("diffusion_pytorch_model.safetensors.index.json")).unwrap();
    write(&vae.join("a.safetensors.index.json"), index.to_string().as_bytes());
    write(&vae.join("b.safetensors.index.json"), index.to_string().as_bytes());
    refused(
        p.dir.path(),
        &vae,
        "several checkpoints in one folder (vae/a.safetensors.index.json, vae/b.safetensors.index.json)",
    );
}

/// A folder with variants beside its checkpoint, as transformers' `save_pretrained(dir,
/// variant=...)` writes them (a file, and a sharded one with its index), and a
/// `consolidated.safetensors` beside them: every file is served at its path, byte for byte; the
/// main checkpoint's tensors are files in the folder, each other checkpoint's in
/// `%.checkpoints/NAME/` with its own metadata.json; the folder's metadata.json lists them all.
/// (Before, such a folder was refused: "tensor "w" is in two shards".)
#[test]
fn a_folder_with_variants_serves_every_checkpoint_at_its_path() {
    let dir = workdir();
    let root = dir.path();
    // A tensor named like a variant's file: the file keeps the name, the tensor is escaped.
    let main = vec![T::new("w", Dtype::F32, &[8, 4]), T::new("model.fp16.safetensors", Dtype::F32, &[2])];
    write_checkpoint(&root.join("model.safetensors"), &main, None);
    let fp16 = vec![T::new("w", Dtype::F16, &[8, 4]), T::new("model.fp16.safetensors", Dtype::F16, &[2])];
    write_checkpoint(&root.join("model.fp16.safetensors"), &fp16, None);
    let bf16 = vec![T::new("w", Dtype::BF16, &[8, 4]), T::new("model.fp16.safetensors", Dtype::BF16, &[2])];
    write_checkpoint(&root.join("model.bf16-00001-of-00002.safetensors"), &bf16[..1], None);
    write_checkpoint(&root.join("model.bf16-00002-of-00002.safetensors"), &bf16[1..], None);
    let index = serde_json::json!({"metadata": {}, "weight_map": {
        "w": "model.bf16-00001-of-00002.safetensors",
        "model.fp16.safetensors": "model.bf16-00002-of-00002.safetensors"}});
    write(&root.join("model.safetensors.index.bf16.json"), index.to_string().as_bytes());
    let consolidated = vec![T::new("layers.0.w", Dtype::F32, &[3])];
    write_checkpoint(&root.join("consolidated.safetensors"), &consolidated, None);
    write(&root.join("config.json"), br#"{"model_type": "llama"}"#);
    let m = Mount::new(root, &[]);
    assert_eq!(
        tree(&m.path),
        [
            "%.checkpoints/",
            "%.checkpoints/consolidated/",
            "%.checkpoints/consolidated/layers.0.w",
            "%.checkpoints/consolidated/metadata.json",
            "%.checkpoints/model.bf16/",
            "%.checkpoints/model.bf16/metadata.json",
            "%.checkpoints/model.bf16/model.fp16.safetensors",
            "%.checkpoints/model.bf16/w",
            "%.checkpoints/model.fp16/",
            "%.checkpoints/model.fp16/metadata.json",
            "%.checkpoints/model.fp16/model.fp16.safetensors",
            "%.checkpoints/model.fp16/w",
            "%6Dodel.fp16.safetensors",
            "config.json",
            "consolidated.safetensors",
            "metadata.json",
            "model.bf16-00001-of-00002.safetensors",
            "model.bf16-00002-of-00002.safetensors",
            "model.fp16.safetensors",
            "model.safetensors",
            "model.safetensors.index.bf16.json",
            "w",
        ]
    );
    for file in [
        "config.json",
        "consolidated.safetensors",
        "model.bf16-00001-of-00002.safetensors",
        "model.bf16-00002-of-00002.safetensors",
        "model.fp16.safetensors",
        "model.safetensors",
        "model.safetensors.index.bf16.json",
    ] {
        assert!(std::fs::read(m.file(file)).unwrap() == std::fs::read(root.join(file)).unwrap(), "{file} differs");
    }
    let read = |path: &str| std::fs::read(m.file(path)).unwrap();
    assert!(read("w") == main[0].data && read("%6Dodel.fp16.safetensors") == main[1].data);
    for (folder, tensors) in [("model.fp16", &fp16), ("model.bf16", &bf16)] {
        for t in tensors.iter() {
            assert!(read(&format!("%.checkpoints/{folder}/{}", t.name)) == t.data, "{folder}/{}", t.name);
        }
    }
    assert!(read("%.checkpoints/consolidated/layers.0.w") == consolidated[0].data);
    // The folder's metadata.json: its tensor files in `files` as ever, every checkpoint in
    // `checkpoints`, the others' files in `checkpoint_files` with the checkpoint they are of.
    let top = json(&m.file("metadata.json"));
    assert_eq!(top["files"], serde_json::json!({"%6Dodel.fp16.safetensors": "model.fp16.safetensors", "w": "w"}));
    assert_eq!(
        top["checkpoints"],
        serde_json::json!([
            {"path": ".", "name": "model", "variant": null, "tensors": 2, "shards": 1},
            {"path": "%.checkpoints/consolidated", "name": "consolidated", "variant": null, "tensors": 1, "shards": 1},
            {"path": "%.checkpoints/model.bf16", "name": "model.bf16", "variant": "bf16", "tensors": 2, "shards": 2},
            {"path": "%.checkpoints/model.fp16", "name": "model.fp16", "variant": "fp16", "tensors": 2, "shards": 1},
        ])
    );
    let size = |name: &str| std::fs::metadata(root.join(name)).unwrap().len();
    let listed: Vec<(String, Option<u64>, Option<String>)> = top["checkpoint_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (f["path"].as_str().unwrap().to_string(), f["shard"].as_u64(), f["checkpoint"].as_str().map(str::to_string))
        })
        .collect();
    let entry = |path: &str, shard: Option<u64>, of: Option<&str>| (path.to_string(), shard, of.map(str::to_string));
    assert_eq!(
        listed,
        [
            entry("model.safetensors", Some(0), None),
            entry("consolidated.safetensors", None, Some("consolidated")),
            entry("model.bf16-00001-of-00002.safetensors", None, Some("model.bf16")),
            entry("model.bf16-00002-of-00002.safetensors", None, Some("model.bf16")),
            entry("model.safetensors.index.bf16.json", None, Some("model.bf16")),
            entry("model.fp16.safetensors", None, Some("model.fp16")),
        ]
    );
    assert_eq!(top["checkpoint_files"][5]["size"], size("model.fp16.safetensors"));
    assert!(top.get("components").is_none(), "another checkpoint is no component");
    // Each other checkpoint's own metadata.json: its tensors, its files up in the folder.
    let bf16_meta = json(&m.file("%.checkpoints/model.bf16/metadata.json"));
    assert_eq!(bf16_meta["tensors"]["w"]["dtype"], "BF16");
    assert_eq!(bf16_meta["tensors"]["w"]["path"], "w");
    assert_eq!(bf16_meta["checkpoint_files"][0]["path"], "../../model.bf16-00001-of-00002.safetensors");
    assert_eq!(bf16_meta["checkpoint_files"][0]["shard"], 0);
    let up = m.file("%.checkpoints/model.bf16/../../model.bf16-00001-of-00002.safetensors");
    assert!(std::fs::read(up).unwrap() == std::fs::read(root.join("model.bf16-00001-of-00002.safetensors")).unwrap());
    drop(m);

    // A command that reads one checkpoint reads the main one.
    let out = stfs(&["inspect", root.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("F32") && !shown.contains("BF16"), "{shown}");

    // A variant that cannot be opened leaves the folder served without it (loaders read it
    // without that variant); the main one cannot.
    std::fs::write(root.join("model.bf16-00002-of-00002.safetensors"), [0u8; 3]).unwrap();
    let m = Mount::new(root, &[]);
    assert!(!m.path.join("%.checkpoints/model.bf16").exists() && m.path.join("%.checkpoints/model.fp16/w").exists());
    drop(m);
    std::fs::write(root.join("model.safetensors"), [0u8; 3]).unwrap();
    refused(root, &root.join("model.safetensors"), "");
}
