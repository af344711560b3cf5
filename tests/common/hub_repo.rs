//! A hub repository laid out in a directory served as the hub (nginx on loopback, reached through
//! `HF_ENDPOINT`): its revision API answers and its resolve URLs' files.

#![allow(dead_code)] // shared by several test binaries, each using part of it

use std::path::Path;

/// Publishes commit `sha` of `repo` with `files` under `root`: each file at
/// `REPO/resolve/SHA/PATH` (under `cdn/` for a `redir/` repository, where the hub's redirect sends
/// it), the repository API answer at `api/models/REPO/info.json`, and the same answer at
/// `api/models/REPO/revision/REV` for `sha` and each of `revisions`.
pub fn publish(root: &Path, repo: &str, sha: &str, revisions: &[&str], files: &[(&str, Vec<u8>)]) {
    let cdn = if repo.starts_with("redir/") { "cdn/" } else { "" };
    let base = root.join(format!("{cdn}{repo}/resolve/{sha}"));
    let mut siblings = Vec::new();
    for (path, bytes) in files {
        let file = base.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, bytes).unwrap();
        siblings.push(serde_json::json!({"rfilename": path, "size": bytes.len()}));
    }
    let api = root.join(format!("api/models/{repo}"));
    std::fs::create_dir_all(api.join("revision")).unwrap();
    let info = serde_json::json!({"id": repo, "sha": sha, "siblings": siblings});
    std::fs::write(api.join("info.json"), info.to_string()).unwrap();
    for revision in revisions.iter().chain([&sha]) {
        std::fs::write(api.join("revision").join(revision), info.to_string()).unwrap();
    }
}
