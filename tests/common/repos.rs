//! Tiny model repositories as their loaders write them, to put in an object store under a prefix:
//! a diffusers pipeline (`model_index.json`, `unet/` with a checkpoint and its config,
//! `scheduler/scheduler_config.json`) and a sentence-transformers model (its own checkpoint,
//! `modules.json`, `1_Pooling/config.json`, `2_Dense/` with a checkpoint of its own), with the tree
//! a mount of each shows; and [`tree`], the paths under a mount.
#![allow(dead_code)] // each test file uses part of it

use std::path::Path;

use crate::common::*;
use stfs::format::Dtype;

/// A repository: its objects (key below the prefix, bytes), its tensors by file in the mount, and
/// the tree a mount of it shows.
pub struct Repo {
    pub objects: Vec<(String, Vec<u8>)>,
    pub tensors: Vec<(String, Vec<u8>)>,
    pub tree: Vec<&'static str>,
}

/// The bytes of a checkpoint of `tensors`.
fn checkpoint(tensors: &[T]) -> Vec<u8> {
    let dir = workdir();
    write_checkpoint(&dir.path().join("m.safetensors"), tensors, None)
}

fn files(pairs: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect()
}

pub fn diffusers() -> Repo {
    let unet = vec![T::new("conv_in.weight", Dtype::F32, &[32, 3, 3, 3]), T::new("conv_in.bias", Dtype::F16, &[32])];
    let mut objects = files(&[
        (
            "model_index.json",
            br#"{"_class_name": "DDPMPipeline", "_diffusers_version": "0.30.0",
                 "scheduler": ["diffusers", "DDPMScheduler"], "unet": ["diffusers", "UNet2DModel"]}"#,
        ),
        ("unet/config.json", br#"{"_class_name": "UNet2DModel", "sample_size": 8}"#),
        ("scheduler/scheduler_config.json", br#"{"_class_name": "DDPMScheduler", "num_train_timesteps": 1000}"#),
        ("README.md", b"# a pipeline\n"),
    ]);
    objects.push(("unet/diffusion_pytorch_model.safetensors".to_string(), checkpoint(&unet)));
    // Its fp16 variant beside it: served at its path, its tensors in unet/%.checkpoints/.
    let fp16 = vec![T::new("conv_in.weight", Dtype::F16, &[32, 3, 3, 3])];
    objects.push(("unet/diffusion_pytorch_model.fp16.safetensors".to_string(), checkpoint(&fp16)));
    let mut tensors: Vec<(String, Vec<u8>)> =
        unet.iter().map(|t| (format!("unet/{}", t.name), t.data.clone())).collect();
    let variant = "unet/%.checkpoints/diffusion_pytorch_model.fp16";
    tensors.extend(fp16.iter().map(|t| (format!("{variant}/{}", t.name), t.data.clone())));
    let tree = vec![
        "README.md",
        "metadata.json",
        "model_index.json",
        "scheduler/",
        "scheduler/scheduler_config.json",
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
    ];
    Repo { objects, tensors, tree }
}

pub fn sentence_transformers() -> Repo {
    let own = vec![T::new("embeddings.word_embeddings.weight", Dtype::F32, &[30, 8])];
    let dense = vec![T::new("linear.weight", Dtype::F32, &[4, 8])];
    let mut objects = files(&[
        ("config.json", br#"{"model_type": "bert"}"#),
        (
            "modules.json",
            br#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
        ),
        ("1_Pooling/config.json", br#"{"word_embedding_dimension": 8}"#),
        ("2_Dense/config.json", br#"{"in_features": 8, "out_features": 4}"#),
    ]);
    objects.push(("model.safetensors".to_string(), checkpoint(&own)));
    objects.push(("2_Dense/model.safetensors".to_string(), checkpoint(&dense)));
    let mut tensors: Vec<(String, Vec<u8>)> = own.iter().map(|t| (t.name.clone(), t.data.clone())).collect();
    tensors.extend(dense.iter().map(|t| (format!("2_Dense/{}", t.name), t.data.clone())));
    let tree = vec![
        "1_Pooling/",
        "1_Pooling/config.json",
        "2_Dense/",
        "2_Dense/config.json",
        "2_Dense/linear.weight",
        "2_Dense/metadata.json",
        "2_Dense/model.safetensors",
        "config.json",
        "embeddings.word_embeddings.weight",
        "metadata.json",
        "model.safetensors",
        "modules.json",
    ];
    Repo { objects, tensors, tree }
}

/// A prefix of small files only, in folders: nothing to mount.
pub fn configs_only() -> Vec<(String, Vec<u8>)> {
    files(&[("config.json", b"{}"), ("scheduler/scheduler_config.json", b"{}")])
}

/// Checks a mount of `repo` at `mount`: its tree, every tensor and every object it serves.
pub fn assert_mounted(mount: &Path, repo: &Repo) {
    assert_eq!(tree(mount), repo.tree);
    for (path, data) in &repo.tensors {
        assert!(&std::fs::read(mount.join(path)).unwrap() == data, "{path} differs");
    }
    for (key, bytes) in &repo.objects {
        if repo.tree.contains(&key.as_str()) {
            assert!(&std::fs::read(mount.join(key)).unwrap() == bytes, "{key} differs");
        }
    }
}

/// Every path under `root`, relative to it (folders with a `/`), sorted; `.stfs` left out.
pub fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            if relative == ".stfs" {
                continue;
            }
            if path.is_dir() {
                pending.push(path.clone());
                out.push(format!("{relative}/"));
            } else {
                out.push(relative);
            }
        }
    }
    out.sort();
    out
}
