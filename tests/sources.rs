//! Where the checkpoint lives: a mount that would hide its own backing file is refused, and an
//! index that names one shard file under two spellings opens that file once.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::wedge::listed;
use common::*;
use stfs::format::Dtype;

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Unmounts `path` when dropped (umount2, then a lazy detach), whatever the test did.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if listed(&self.0) {
            force_unmount(&self.0);
        }
    }
}

/// `stfs mount SOURCE MP` must fail with one line naming the file it would hide, and mount nothing.
fn assert_mount_refused_as_hiding(source: &Path, mp: &Path, hidden: &Path) {
    // mount(2) follows a symbolic link to the mount point: guard and check the directory itself.
    let real_mp = std::fs::canonicalize(mp).unwrap();
    let _guard = Unmount(real_mp.clone());
    let out = stfs(&["mount", source.to_str().unwrap(), mp.to_str().unwrap()]);
    let err = stderr_of(&out);
    let what = format!("mount {} on {}", source.display(), mp.display());
    assert_eq!(out.status.code(), Some(1), "{what} must be refused: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: expected one line, got {err:?}");
    assert!(err.starts_with("stfs: "), "{what}: {err}");
    assert!(err.contains("would hide"), "{what}: {err}");
    let hidden = std::fs::canonicalize(hidden).unwrap();
    assert!(err.contains(hidden.to_str().unwrap()), "{what}: the message must name {}: {err}", hidden.display());
    assert!(!listed(&real_mp), "{what} left a mount behind");
}

#[test]
fn a_mount_that_would_hide_its_own_backing_file_is_refused() {
    let dir = workdir();
    let d = dir.path().join("d");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    let file = d.join("model.safetensors");
    let tensor = T::new("w", Dtype::F32, &[100]);
    write_checkpoint(&file, std::slice::from_ref(&tensor), None);
    // On the directory that holds the file, and on one above it.
    assert_mount_refused_as_hiding(&file, &d, &file);
    assert_mount_refused_as_hiding(&file, dir.path(), &file);
    // Named through a symbolic link that lives outside the mount point.
    let elsewhere = workdir();
    let link = elsewhere.path().join("link.safetensors");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert_mount_refused_as_hiding(&link, &d, &file);
    // The mount point named through a symbolic link to it.
    let mp_link = elsewhere.path().join("mp");
    std::os::unix::fs::symlink(&d, &mp_link).unwrap();
    assert_mount_refused_as_hiding(&file, &mp_link, &file);
    // A directory of shards mounted on itself, and an index whose shard is under the mount point.
    assert_mount_refused_as_hiding(&d, &d, &file);
    // (A shard must lie in its index's folder: one linked from elsewhere is refused before this
    // check, as tests/links.rs shows.)
    let index = d.join("model.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map":{"w":"model.safetensors"}}"#).unwrap();
    assert_mount_refused_as_hiding(&index, &d, &file);
    assert_mount_refused_as_hiding(&index, dir.path(), &file);
    std::fs::remove_file(&index).unwrap();
    // A mount point beside the file, or below it, hides nothing and works.
    let m = Mount::new(&file, &[]);
    assert_eq!(std::fs::read(m.file("w")).unwrap(), tensor.data);
    drop(m);
    let sub = d.join("sub");
    let _guard = Unmount(sub.clone());
    let out = stfs(&["mount", file.to_str().unwrap(), sub.to_str().unwrap()]);
    assert!(out.status.success(), "mounting on a subdirectory of the file's directory: {}", stderr_of(&out));
    assert_eq!(std::fs::read(sub.join("w")).unwrap(), tensor.data);
}

/// Shards a (w, v) and b (u), and an index over them written as `map`.
fn sharded(map: &str) -> (tempfile::TempDir, PathBuf, Vec<T>) {
    let dir = workdir();
    let tensors = vec![T::new("w", Dtype::F32, &[10]), T::new("v", Dtype::I8, &[7]), T::new("u", Dtype::F16, &[5])];
    write_checkpoint(
        &dir.path().join("a.safetensors"),
        &[T::new("w", Dtype::F32, &[10]), T::new("v", Dtype::I8, &[7])],
        None,
    );
    write_checkpoint(&dir.path().join("b.safetensors"), &[T::new("u", Dtype::F16, &[5])], None);
    std::os::unix::fs::symlink("a.safetensors", dir.path().join("link.safetensors")).unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index, format!(r#"{{"metadata":{{}},"weight_map":{map}}}"#)).unwrap();
    (dir, index, tensors)
}

#[test]
fn an_index_naming_one_shard_two_ways_opens_it_once() {
    for map in [
        r#"{"w":"a.safetensors","v":"./a.safetensors","u":"b.safetensors"}"#,
        r#"{"w":"./a.safetensors","v":"a.safetensors","u":"./b.safetensors"}"#,
        r#"{"w":"a.safetensors","v":"link.safetensors","u":"b.safetensors"}"#,
    ] {
        let (dir, index, tensors) = sharded(map);
        let out = stfs(&["inspect", "--json", index.to_str().unwrap()]);
        assert!(out.status.success(), "{map}: {}", stderr_of(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let shards = doc["shards"].as_array().unwrap();
        assert_eq!(shards.len(), 2, "{map}: one shard per file: {shards:?}");
        let a = std::fs::canonicalize(dir.path().join("a.safetensors")).unwrap();
        let a_index = shards.iter().position(|s| Path::new(s["source"].as_str().unwrap()) == a);
        assert!(a_index.is_some(), "{map}: shard a is listed by its canonical path: {shards:?}");
        assert_eq!(doc["tensors"]["w"]["shard"], doc["tensors"]["v"]["shard"], "{map}");
        let m = Mount::new(&index, &[]);
        for t in &tensors {
            assert_eq!(std::fs::read(m.file(&t.name)).unwrap(), t.data, "{map}: {}", t.name);
        }
    }
}

#[test]
fn a_tensor_in_two_shard_files_names_both_files() {
    // b also holds w: two different files, however the index spells them.
    let (dir, index, _) = sharded(r#"{"w":"./a.safetensors","v":"a.safetensors","u":"b.safetensors"}"#);
    write_checkpoint(
        &dir.path().join("b.safetensors"),
        &[T::new("u", Dtype::F16, &[5]), T::new("w", Dtype::F32, &[10])],
        None,
    );
    let out = stfs(&["inspect", index.to_str().unwrap()]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("two shards"), "{err}");
    assert!(err.contains("a.safetensors") && err.contains("b.safetensors"), "both files must be named: {err}");
}
