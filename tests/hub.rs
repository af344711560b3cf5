//! `hf://` names end to end against nginx on loopback laid out as the hub serves a repository
//! (`api/models/ORG/REPO/revision/REV` JSON, `ORG/REPO/resolve/SHA/PATH` files), reached through
//! `HF_ENDPOINT`: single-file, sharded (index, and several files without one) and folder
//! checkpoints, resolve URLs redirected to a "CDN" path, the revision pinned at mount time, the
//! token (variable and file) required by a private repository and never shown, one-line
//! refusals, and the repository's small files (configs, tokenizers) served beside the checkpoint
//! as a model directory. Skips when nginx is missing (fails under `CI=true`).

mod common;
#[path = "common/hub_repo.rs"]
mod hub_repo;
#[path = "common/nginx.rs"]
mod nginx;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::*;
use nginx::Nginx;
use stfs::format::Dtype;

const TOKEN: &str = "hf_sekret_token_123";

/// The hub's layout: the repository API answer for `ORG/REPO` at `/api/models/ORG/REPO` (stored
/// as `info.json`), the private org behind a bearer token, and the `redir` org's resolve URLs
/// redirected (302) to `/cdn/...`, as the hub sends large files to its CDN.
fn directives() -> String {
    let auth = format!("if ($http_authorization != \"Bearer {TOKEN}\") {{ return 401; }}");
    format!(
        "default_type application/json;
         location ~ ^/api/models/([^/]+)/([^/]+)$ {{ try_files /api/models/$1/$2/info.json =404; }}
         location /api/models/private/ {{ {auth} }}
         location /private/ {{ {auth} }}
         location /api/models/gated/ {{ add_header X-Error-Code GatedRepo always; return 403; }}
         location /redir/ {{ rewrite ^/redir/(.*)$ /cdn/redir/$1 redirect; }}"
    )
}

struct Hub {
    nginx: Nginx,
    home: tempfile::TempDir,
}

impl Hub {
    fn start() -> Option<Hub> {
        let nginx = Nginx::start_with_directives(&directives())?;
        Some(Hub { nginx, home: workdir() })
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.nginx.port)
    }

    /// Publishes commit `sha` of `repo` with `files`, and points each of `revisions` at it.
    fn publish(&self, repo: &str, sha: &str, revisions: &[&str], files: &[(&str, Vec<u8>)]) {
        hub_repo::publish(&self.nginx.root, repo, sha, revisions, files);
    }

    /// `stfs ARGS` with `HF_ENDPOINT` set, `HF_HOME` empty, and `extra` variables.
    fn stfs(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        let mut command = Command::new(STFS);
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.env_remove("HF_TOKEN").env_remove("HF_TOKEN_PATH").env("HF_ENDPOINT", self.endpoint());
        command.env("HF_HOME", self.home.path());
        for (name, value) in extra {
            command.env(name, value);
        }
        wait_output(command.spawn().expect("spawn stfs"), TIMEOUT)
    }

    fn mount(&self, spec: &str, extra: &[(&str, &str)]) -> HubMount {
        self.mount_with(spec, &[], extra)
    }

    /// [`Hub::mount`] with more arguments to `stfs mount`.
    fn mount_with(&self, spec: &str, args: &[&str], extra: &[(&str, &str)]) -> HubMount {
        let dir = workdir();
        let path = dir.path().join("m");
        std::fs::create_dir(&path).unwrap();
        let mut all = vec!["mount", "--block-size", "64K"];
        all.extend_from_slice(args);
        all.extend([spec, path.to_str().unwrap()]);
        let out = self.stfs(&all, extra);
        let guard = HubMount { _dir: dir, path };
        assert!(out.status.success(), "stfs mount {spec} failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(is_mounted(&guard.path));
        guard
    }

    /// `stfs mount SPEC` must fail with exit 1, one `stfs: SHOWN: ...` line holding `needle`, and
    /// no mount.
    fn refused(&self, spec: &str, extra: &[(&str, &str)], needle: &str) -> String {
        let mp = workdir();
        let out = self.stfs(&["mount", spec, mp.path().to_str().unwrap()], extra);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("stfs: hf://") && err.contains(needle), "{needle:?} not in {err}");
        assert!(!is_mounted(mp.path()));
        err
    }
}

struct HubMount {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl HubMount {
    fn read(&self, tensor: &str) -> Vec<u8> {
        std::fs::read(self.path.join(tensor)).unwrap()
    }
}

impl Drop for HubMount {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

macro_rules! hub_or_skip {
    () => {
        match Hub::start() {
            Some(hub) => hub,
            None => return tool_missing("nginx", "apt-get install nginx"),
        }
    };
}

/// A checkpoint's bytes and its tensors.
fn checkpoint(names: &[&str], rows: u64) -> (Vec<u8>, Vec<T>) {
    let tensors: Vec<T> = names.iter().map(|n| T::new(n, Dtype::F32, &[rows, 1000])).collect();
    let dir = workdir();
    let bytes = write_checkpoint(&dir.path().join("x.safetensors"), &tensors, None);
    (bytes, tensors)
}

fn assert_exact(m: &HubMount, tensors: &[T]) {
    for t in tensors {
        assert!(m.read(&t.name) == t.data, "tensor {} differs", t.name);
    }
}

fn small(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

#[test]
fn a_single_file_repo_mounts_inspects_and_cats() {
    let hub = hub_or_skip!();
    let (bytes, tensors) = checkpoint(&["embed.weight", "lm_head.weight"], 100);
    let files = [("config.json", small("{}")), ("model.safetensors", bytes), ("pytorch_model.bin", small("x"))];
    hub.publish("org/single", SHA_A, &["main"], &files);
    let m = hub.mount("hf://org/single", &[]);
    assert_exact(&m, &tensors);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(mounts.contains("hf://org/single"), "the mount's source is the hub name");

    let out = hub.stfs(&["inspect", "--json", "hf://org/single"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["tensors"]["lm_head.weight"]["shape"], serde_json::json!([100, 1000]));
    let dir = workdir();
    let cat = dir.path().join("cat.out");
    let status = Command::new(STFS)
        .args(["cat", "hf://org/single@main/model.safetensors", "lm_head.weight"])
        .env("HF_ENDPOINT", hub.endpoint())
        .stdout(std::fs::File::create(&cat).unwrap())
        .status()
        .unwrap();
    assert!(status.success() && std::fs::read(&cat).unwrap() == tensors[1].data);
    let out =
        hub.stfs(&["extract", &format!("hf://org/single@{SHA_A}"), "--all", "-o", dir.path().to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(dir.path().join("embed.weight")).unwrap() == tensors[0].data);
}

#[test]
fn a_sharded_repo_with_an_index_mounts_through_the_cdn_redirect() {
    let hub = hub_or_skip!();
    let (one, first) = checkpoint(&["a.weight", "b.weight"], 70);
    let (two, second) = checkpoint(&["c.weight"], 90);
    let weight_map = serde_json::json!({"weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00001-of-00002.safetensors",
        "c.weight": "model-00002-of-00002.safetensors"}});
    let files = [
        ("model.safetensors.index.json", weight_map.to_string().into_bytes()),
        ("model-00001-of-00002.safetensors", one),
        ("model-00002-of-00002.safetensors", two),
        // A leftover single file: the index is preferred.
        ("other.safetensors", checkpoint(&["z"], 1).0),
    ];
    hub.publish("redir/sharded", SHA_A, &["main"], &files);
    let m = hub.mount("hf://redir/sharded", &[]);
    assert_exact(&m, &first);
    assert_exact(&m, &second);
    assert!(!m.path.join("z").exists());
    let log = hub.nginx.log();
    assert!(log.iter().any(|l| l.status == 302), "resolve URLs were redirected");
    assert!(log.iter().any(|l| l.status == 206 && l.request.contains("/cdn/redir/sharded/resolve/")), "{log:?}");
}

#[test]
fn several_files_without_an_index_and_a_folder_mount_as_shards() {
    let hub = hub_or_skip!();
    let (one, first) = checkpoint(&["x.weight"], 50);
    let (two, second) = checkpoint(&["y.weight"], 60);
    let (unet, third) = checkpoint(&["conv.weight"], 30);
    let files = [
        ("part-b.safetensors", two),
        ("part-a.safetensors", one),
        ("README.md", small("root")),
        ("unet/config.json", small("{\"unet\": 1}")),
        ("unet/diffusion_pytorch_model.safetensors", unet),
    ];
    hub.publish("org/several", SHA_B, &["v1"], &files);
    let m = hub.mount(&format!("hf://org/several@{SHA_B}"), &[]);
    assert_exact(&m, &first);
    assert_exact(&m, &second);
    assert!(!m.path.join("conv.weight").exists());
    assert_eq!(m.read("README.md"), b"root");
    assert!(!m.path.join("config.json").exists(), "a subfolder's files stay out of the root's mount");
    // A folder's mount is that folder as a model directory: its own files, not the root's.
    let m = hub.mount("hf://org/several@v1/unet", &[]);
    assert_exact(&m, &third);
    assert_eq!(m.read("config.json"), b"{\"unet\": 1}");
    assert!(!m.path.join("README.md").exists());
    // A file named in a folder brings that folder's files too.
    let m = hub.mount("hf://org/several@v1/unet/diffusion_pytorch_model.safetensors", &[]);
    assert_eq!(m.read("config.json"), b"{\"unet\": 1}");
}

#[test]
fn a_repo_mount_is_a_model_directory() {
    let hub = hub_or_skip!();
    // A tensor named like a config file: the repository's file keeps the name, the tensor is escaped.
    let (one, first) = checkpoint(&["config.json", "a.weight"], 30);
    let (two, second) = checkpoint(&["b.weight"], 40);
    let weight_map = serde_json::json!({"weight_map": {
        "config.json": "model-00001-of-00002.safetensors",
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors"}});
    let config = small(r#"{"model_type": "llama", "hidden_size": 64}"#);
    let tokenizer = small(r#"{"version": "1.0", "model": {"type": "BPE"}}"#);
    let big = vec![b' '; (32 << 20) + 1];
    let files = [
        ("model.safetensors.index.json", weight_map.to_string().into_bytes()),
        ("model-00001-of-00002.safetensors", one),
        ("model-00002-of-00002.safetensors", two),
        ("config.json", config.clone()),
        ("generation_config.json", small(r#"{"max_length": 20}"#)),
        ("tokenizer.json", tokenizer.clone()),
        (".gitattributes", small("*.bin filter=lfs")),
        ("pytorch_model.bin", small("pickled weights")),
        ("big.txt", big),
        ("onnx/model.json", small("{}")),
    ];
    hub.publish("org/llm", SHA_A, &["main"], &files);
    let m = hub.mount("hf://org/llm", &[]);
    assert_exact(&m, &second);
    assert!(m.read("%63onfig.json") == first[0].data && m.read("a.weight") == first[1].data);
    // Byte for byte from the pinned commit; weights in other formats, dotfiles, files over the
    // limit and subfolders' files are not served, nor fetched.
    assert_eq!(m.read("config.json"), config);
    assert_eq!(m.read("tokenizer.json"), tokenizer);
    assert_eq!(m.read("generation_config.json"), small(r#"{"max_length": 20}"#));
    for absent in [".gitattributes", "pytorch_model.bin", "big.txt", "onnx", "model.json"] {
        assert!(!m.path.join(absent).exists(), "{absent} is served");
    }
    let log = hub.nginx.log();
    for unfetched in [".gitattributes", "pytorch_model.bin", "big.txt", "onnx/"] {
        assert!(log.iter().all(|l| !l.request.contains(&format!("/{unfetched}"))), "{unfetched} fetched: {log:?}");
    }
    assert!(log.iter().any(|l| l.request.contains(&format!("/org/llm/resolve/{SHA_A}/config.json"))));
    // metadata.json lists them apart from the checkpoint's own files, and readdir shows them.
    let doc: serde_json::Value = serde_json::from_slice(&m.read("metadata.json")).unwrap();
    let listed: Vec<(&str, u64)> = doc["repo_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["size"].as_u64().unwrap()))
        .collect();
    let sizes = [config.len() as u64, 18, tokenizer.len() as u64];
    assert_eq!(listed, [("config.json", sizes[0]), ("generation_config.json", sizes[1]), ("tokenizer.json", sizes[2])]);
    assert_eq!(doc["checkpoint_files"].as_array().unwrap().len(), 3);
    assert_eq!(doc["tensors"]["config.json"]["path"], "%63onfig.json");
    let names: Vec<String> =
        std::fs::read_dir(&m.path).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.contains(&"tokenizer.json".to_string()), "{names:?}");
    // inspect --json is the mount's metadata.json.
    let out = hub.stfs(&["inspect", "--json", "hf://org/llm"], &[]);
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["repo_files"], doc["repo_files"]);
    drop(m);

    // -o no_checkpoint_file: tensors only, and nothing else fetched.
    let before = hub.nginx.log().len();
    let m = hub.mount_with("hf://org/llm", &["-o", "no_checkpoint_file"], &[]);
    assert!(!m.path.join("tokenizer.json").exists() && !m.path.join("model.safetensors.index.json").exists());
    assert!(m.read("config.json") == first[0].data, "the tensor takes its plain name back");
    let doc: serde_json::Value = serde_json::from_slice(&m.read("metadata.json")).unwrap();
    assert_eq!(doc["repo_files"], serde_json::json!([]));
    let log = hub.nginx.log();
    assert!(log[before..].iter().all(|l| !l.request.contains("/tokenizer.json")), "{log:?}");
}

#[test]
fn the_revision_is_pinned_at_mount_time() {
    let hub = hub_or_skip!();
    let (old, old_tensors) = checkpoint(&["w"], 40);
    hub.publish("org/moving", SHA_A, &["main"], &[("model.safetensors", old)]);
    let m = hub.mount("hf://org/moving", &[]);
    // main moves to a new commit with other bytes, same names and sizes.
    let new_tensors = vec![T::new("w2", Dtype::F32, &[40, 1000])];
    let dir = workdir();
    let mut new = write_checkpoint(&dir.path().join("n.safetensors"), &new_tensors, None);
    let at = new.windows(2).position(|w| w == b"w2").unwrap();
    new.remove(at + 1); // rename the tensor "w2" -> "w" ...
    new.insert(new.len() - new_tensors[0].data.len(), b' '); // ... keeping the header's length
    hub.publish("org/moving", SHA_B, &["main"], &[("model.safetensors", new)]);
    assert_exact(&m, &old_tensors);
    let fresh = hub.mount("hf://org/moving", &[]);
    assert!(fresh.read("w") == new_tensors[0].data, "a new mount sees the new commit");
    assert!(hub.nginx.log().iter().all(|l| !l.request.contains("/resolve/main/")), "reads name the commit");
}

#[test]
fn a_private_repo_needs_the_token_which_is_never_shown() {
    let hub = hub_or_skip!();
    let (bytes, tensors) = checkpoint(&["secret.weight"], 20);
    let files = [("model.safetensors", bytes), ("config.json", small("{\"private\": true}"))];
    hub.publish("private/model", SHA_A, &["main"], &files);
    let err = hub.refused("hf://private/model", &[], "repository not found");
    assert!(err.contains("HF_TOKEN"), "{err}");
    hub.refused("hf://private/model", &[("HF_TOKEN", "hf_wrong")], "the token was refused");
    let m = hub.mount("hf://private/model", &[("HF_TOKEN", TOKEN)]);
    assert_exact(&m, &tensors);
    assert_eq!(m.read("config.json"), b"{\"private\": true}", "small files are fetched with the token");
    let metadata = std::fs::read_to_string(m.path.join("metadata.json")).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!metadata.contains(TOKEN) && !mounts.contains(TOKEN));
    drop(m);
    // The token file huggingface_hub writes, under HF_HOME.
    std::fs::write(hub.home.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let m = hub.mount("hf://private/model", &[]);
    assert_exact(&m, &tensors);
    let out = hub.stfs(&["inspect", "hf://private/model"], &[("HF_TOKEN", "hf_wrong")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("hf_wrong"), "{err}");
}

#[test]
fn missing_repos_revisions_and_checkpoints_are_refused_with_one_line() {
    let hub = hub_or_skip!();
    hub.publish("org/docs", SHA_A, &["main"], &[("README.md", small("hello")), ("model.bin", small("x"))]);
    hub.refused("hf://org/nope", &[], "hf://org/nope: repository not found");
    hub.refused("hf://org/docs", &[], "hf://org/docs: the repository holds no *.safetensors files");
    hub.refused("hf://org/docs@v9", &[], "hf://org/docs@v9: revision not found: v9");
    hub.refused("hf://org/docs/sub", &[], "no file or folder sub at commit");
    hub.refused("hf://org", &[], "expected hf://ORG/REPO");
    hub.refused("hf://gated/model", &[("HF_TOKEN", TOKEN)], "hf://gated/model: gated repository");
    let (bytes, _) = checkpoint(&["w"], 1);
    hub.publish("org/broken", SHA_A, &["main"], &[("model.safetensors", bytes[..100].to_vec())]);
    hub.refused("hf://org/broken", &[], "hf://org/broken/model.safetensors:");
    // A small file listed but not served fails the mount (the model directory would be
    // incomplete); inspecting, which has no use for it, does not fetch it.
    let (bytes, _) = checkpoint(&["w"], 1);
    hub.publish("org/lost", SHA_A, &["main"], &[("model.safetensors", bytes), ("config.json", small("{}"))]);
    std::fs::remove_file(hub.nginx.root.join(format!("org/lost/resolve/{SHA_A}/config.json"))).unwrap();
    hub.refused("hf://org/lost", &[], "hf://org/lost/config.json: hub API: the file answered HTTP 404");
    assert!(hub.stfs(&["inspect", "hf://org/lost"], &[]).status.success());
    let out = hub.stfs(&["inspect", "hf://org/nope"], &[]);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stderr).lines().count()), (Some(1), 1));
}

/// A diffusers pipeline and a sentence-transformers model by name: the repository listed once,
/// at one commit, and laid out as a local folder is (a component in each folder with a checkpoint,
/// every checkpoint of a folder served, its variant's at its path and its tensors in
/// `%.checkpoints/`, the small files of the folders served, the others neither served nor
/// fetched); a folder of the
/// repository is laid out the same from it; a pipeline with nothing loadable is one line.
#[test]
fn a_pipeline_and_a_sentence_transformers_repo_mount_as_they_are_laid_out() {
    let hub = hub_or_skip!();
    let (unet, unet_tensors) = checkpoint(&["conv_in.weight"], 20);
    let (fp16, fp16_tensors) = checkpoint(&["conv_in.weight"], 3);
    let (vae1, vae_a) = checkpoint(&["encoder.w"], 10);
    let (vae2, vae_b) = checkpoint(&["decoder.w"], 12);
    let vae_index = serde_json::json!({"weight_map": {
        "encoder.w": "diffusion_pytorch_model-00001-of-00002.safetensors",
        "decoder.w": "diffusion_pytorch_model-00002-of-00002.safetensors"}});
    let model_index = small(
        r#"{"_class_name": "DDPMPipeline", "scheduler": ["diffusers", "DDPMScheduler"],
            "unet": ["diffusers", "UNet2DModel"], "vae": ["diffusers", "AutoencoderKL"]}"#,
    );
    let files = [
        ("model_index.json", model_index.clone()),
        ("README.md", small("a pipeline")),
        ("unet/config.json", small(r#"{"_class_name": "UNet2DModel"}"#)),
        ("unet/diffusion_pytorch_model.safetensors", unet.clone()),
        ("unet/diffusion_pytorch_model.fp16.safetensors", fp16.clone()),
        ("vae/config.json", small("{}")),
        ("vae/diffusion_pytorch_model.safetensors.index.json", vae_index.to_string().into_bytes()),
        ("vae/diffusion_pytorch_model-00001-of-00002.safetensors", vae1),
        ("vae/diffusion_pytorch_model-00002-of-00002.safetensors", vae2),
        ("scheduler/scheduler_config.json", small(r#"{"num_train_timesteps": 10}"#)),
        ("onnx/model.json", small("{}")),
    ];
    hub.publish("org/pipe", SHA_A, &["main"], &files);
    let m = hub.mount("hf://org/pipe", &[]);
    assert!(m.read("unet/conv_in.weight") == unet_tensors[0].data);
    assert!(m.read("vae/encoder.w") == vae_a[0].data && m.read("vae/decoder.w") == vae_b[0].data);
    assert!(m.read("unet/diffusion_pytorch_model.safetensors") == unet);
    assert_eq!(m.read("model_index.json"), model_index);
    assert_eq!(m.read("scheduler/scheduler_config.json"), small(r#"{"num_train_timesteps": 10}"#));
    assert_eq!(m.read("vae/config.json"), small("{}"));
    assert!(!m.path.join("onnx").exists());
    assert!(m.read("unet/diffusion_pytorch_model.fp16.safetensors") == fp16);
    assert!(m.read("unet/%.checkpoints/diffusion_pytorch_model.fp16/conv_in.weight") == fp16_tensors[0].data);
    let unet_doc: serde_json::Value = serde_json::from_slice(&m.read("unet/metadata.json")).unwrap();
    assert_eq!(unet_doc["checkpoints"][1]["variant"], "fp16");
    let doc: serde_json::Value = serde_json::from_slice(&m.read("metadata.json")).unwrap();
    assert_eq!(
        doc["components"],
        serde_json::json!([{"path": "unet", "tensors": 1, "shards": 1}, {"path": "vae", "tensors": 2, "shards": 2}])
    );
    let vae: serde_json::Value = serde_json::from_slice(&m.read("vae/metadata.json")).unwrap();
    assert_eq!(vae["files"], serde_json::json!({"decoder.w": "decoder.w", "encoder.w": "encoder.w"}));
    // One listing, one commit: every file read is of the pinned commit; onnx/ is never asked for.
    let log = hub.nginx.log();
    let api: Vec<_> = log.iter().filter(|l| l.request.contains("/api/models/")).collect();
    assert_eq!(api.len(), 1, "{log:?}");
    for l in log.iter().filter(|l| !l.request.contains("/api/models/")) {
        assert!(l.request.contains(&format!("/org/pipe/resolve/{SHA_A}/")), "{}", l.request);
        assert!(!l.request.contains("/onnx/"), "{}", l.request);
    }
    drop(m);
    // A folder of the repository is laid out from it: the vae alone.
    let m = hub.mount("hf://org/pipe/vae", &[]);
    assert!(m.read("encoder.w") == vae_a[0].data);
    assert_eq!(m.read("config.json"), small("{}"));
    drop(m);

    // sentence-transformers: a root checkpoint, a module config, a module with its own weights.
    let (own, own_tensors) = checkpoint(&["embeddings.weight", "1_Pooling"], 8);
    let (dense, dense_tensors) = checkpoint(&["linear.weight"], 4);
    let modules = small(
        r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
    );
    let files = [
        ("model.safetensors", own),
        ("config.json", small(r#"{"model_type": "bert"}"#)),
        ("modules.json", modules),
        ("1_Pooling/config.json", small(r#"{"word_embedding_dimension": 8}"#)),
        ("2_Dense/config.json", small(r#"{"in_features": 1000}"#)),
        ("2_Dense/model.safetensors", dense),
    ];
    hub.publish("org/st", SHA_B, &["main"], &files);
    let m = hub.mount("hf://org/st", &[]);
    assert!(m.read("embeddings.weight") == own_tensors[0].data && m.read("%31_Pooling") == own_tensors[1].data);
    assert!(m.read("2_Dense/linear.weight") == dense_tensors[0].data);
    assert_eq!(m.read("1_Pooling/config.json"), small(r#"{"word_embedding_dimension": 8}"#));
    assert_eq!(m.read("2_Dense/config.json"), small(r#"{"in_features": 1000}"#));
    let doc: serde_json::Value = serde_json::from_slice(&m.read("metadata.json")).unwrap();
    assert_eq!(doc["components"], serde_json::json!([{"path": "2_Dense", "tensors": 1, "shards": 1}]));
    drop(m);

    // Folders of small files only: nothing to mount, one line.
    hub.publish("org/configs", SHA_A, &["main"], &[("scheduler/scheduler_config.json", small("{}"))]);
    hub.refused("hf://org/configs", &[], "hf://org/configs: the repository holds no *.safetensors files");
}
