//! The link rule of a local model folder, on real mounts: a small file (in the root, in a
//! component's folder, beside an index) or a shard is served only if it resolves inside the
//! mounted folder or, in a Hugging Face cache snapshot, in its repository's `blobs/`. A small file
//! that resolves outside, loops, is a FIFO, cannot be read by the mounting user or may be read by
//! fewer users than the checkpoint is left out with a warning and the mount is made; a shard
//! outside is one line and nothing mounted. A served file is never readable by a user its target
//! does not let in (with `--allow-other`, nobody), and a shard is reopened by the path the rule
//! allowed, never by a link.

mod common;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use common::users::{as_nobody, nonroot_tools, stfs_as_nobody, DevFuseOpen, NOBODY};
use common::*;
use stfs::format::Dtype;

const CONFIG: &[u8] = br#"{"model_type": "llama"}"#;
const SECRET: &[u8] = b"root's own secret, mode 0600\n";
const REV: &str = "0123456789abcdef0123456789abcdef01234567";

fn write(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory other users may traverse (temp dirs are 0700).
fn open_dir(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A file only root may read (mode 0600), in a temp dir of its own: outside every model folder.
fn secret() -> (tempfile::TempDir, PathBuf) {
    let dir = workdir();
    open_dir(dir.path());
    let path = dir.path().join("secret");
    write(&path, SECRET, 0o600);
    (dir, path)
}

/// `cat PATH` as nobody.
fn cat_as_nobody(path: &Path) -> Output {
    as_nobody("cat").arg(path).output().expect("setpriv cat")
}

/// Where a mount serves a folder's small files.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// The mounted folder's own, beside its checkpoint.
    Root,
    /// A component's folder (`unet/`), the mounted folder holding no checkpoint of its own.
    Component,
    /// Beside the `*.index.json` that is mounted.
    BesideIndex,
}

const PLACES: [Place; 3] = [Place::Root, Place::Component, Place::BesideIndex];

/// A model folder (in `dir`, 0755) laid out for one [`Place`], its files 0644.
struct Model {
    dir: tempfile::TempDir,
    place: Place,
    tensor: T,
}

impl Model {
    fn new(place: Place) -> Model {
        let dir = workdir();
        open_dir(dir.path());
        let model = Model { dir, place, tensor: T::new("w", Dtype::F32, &[64]) };
        let shard = match place {
            Place::Root => model.root().join("model.safetensors"),
            Place::Component => model.root().join("unet/diffusion_pytorch_model.safetensors"),
            Place::BesideIndex => {
                let index = br#"{"weight_map": {"w": "model-00001-of-00001.safetensors"}}"#;
                write(&model.root().join("model.safetensors.index.json"), index, 0o644);
                model.root().join("model-00001-of-00001.safetensors")
            }
        };
        std::fs::create_dir_all(shard.parent().unwrap()).unwrap();
        write_checkpoint(&shard, std::slice::from_ref(&model.tensor), None);
        std::fs::set_permissions(&shard, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&model.small("config.json"), CONFIG, 0o644);
        for folder in [model.root(), model.small(".")] {
            open_dir(&folder);
        }
        model
    }

    /// The model folder.
    fn root(&self) -> PathBuf {
        self.dir.path().join("model")
    }

    /// What `stfs mount` is given.
    fn source(&self) -> PathBuf {
        match self.place {
            Place::BesideIndex => self.root().join("model.safetensors.index.json"),
            _ => self.root(),
        }
    }

    /// Where the small file `name` is in the folder.
    fn small(&self, name: &str) -> PathBuf {
        match self.place {
            Place::Component => self.root().join("unet").join(name),
            _ => self.root().join(name),
        }
    }

    /// Where the small file (or tensor) `name` is in a mount at `mount`.
    fn served(&self, mount: &Path, name: &str) -> PathBuf {
        match self.place {
            Place::Component => mount.join("unet").join(name),
            _ => mount.join(name),
        }
    }

    fn mount(&self, allow_other: bool, log: &Path) -> Mount {
        let mut args = vec!["--log-file", log.to_str().unwrap()];
        if allow_other {
            args.push("--allow-other");
        }
        let m = Mount::new(&self.source(), &args);
        open_dir(m.path.parent().unwrap());
        m
    }
}

/// The names in the mount's folder `folder`.
fn listed(folder: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(folder).unwrap();
    entries.map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
}

/// `name` is neither listed, nor found, nor named in metadata.json, in the mount's folder where
/// `model` serves its small files; the log says why, holding `reason`.
fn left_out(model: &Model, m: &Path, name: &str, log: &Path, reason: &str) {
    let what = format!("{:?} {name}", model.place);
    let folder = model.served(m, ".");
    assert!(!listed(&folder).contains(&name.to_string()), "{what}: listed: {:?}", listed(&folder));
    let err = std::fs::symlink_metadata(folder.join(name)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{what}");
    let metadata = std::fs::read_to_string(folder.join("metadata.json")).unwrap();
    assert!(!metadata.contains(&format!("\"{name}\"")), "{what}: named in metadata.json: {metadata}");
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let line = format!("{}: not served: {reason}", model.small(name).display());
    assert!(log.contains(&line), "{what}: {line:?} not in the log:\n{log}");
}

/// The folder's own `config.json` is served, to the mounting user and, with `allow_other`, to
/// nobody, and so is the tensor.
fn config_served(model: &Model, m: &Path, allow_other: bool) {
    let what = format!("{:?}", model.place);
    assert_eq!(std::fs::read(model.served(m, "config.json")).unwrap(), CONFIG, "{what}");
    assert_eq!(std::fs::read(model.served(m, "w")).unwrap(), model.tensor.data, "{what}");
    if allow_other {
        let out = cat_as_nobody(&model.served(m, "config.json"));
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, CONFIG, "{what}");
    }
}

/// The issue's case: links to root's private file, to the daemon's environment and to a file
/// every user may read, in each place small files are served, with and without `--allow-other`.
/// None is served, listed or named; with `--allow-other` nobody reads none of them.
#[test]
fn links_to_files_outside_the_folder_are_not_served() {
    if !nonroot_tools() {
        return;
    }
    let (_secret_dir, secret) = secret();
    let links: [(&str, &Path); 3] = [
        ("tokenizer_config.json", &secret),
        ("generation_config.json", Path::new("/proc/self/environ")),
        ("special_tokens_map.json", Path::new("/etc/passwd")),
    ];
    for place in PLACES {
        for allow_other in [false, true] {
            let model = Model::new(place);
            for (name, target) in links {
                symlink(target, model.small(name)).unwrap();
            }
            let log = model.dir.path().join("log");
            let m = model.mount(allow_other, &log);
            config_served(&model, &m.path, allow_other);
            for (name, _) in links {
                left_out(&model, &m.path, name, &log, "resolves outside the model's folder");
                if allow_other {
                    let out = cat_as_nobody(&model.served(&m.path, name));
                    assert!(!out.status.success() && out.stdout.is_empty(), "{place:?}: nobody read {name}");
                }
            }
        }
    }
}

/// A link that loops (on itself, or through a second link), and a FIFO, are left out with a
/// warning (the FIFO quietly: it is no file to serve); the mount is made at once.
#[test]
fn looping_links_and_fifos_are_left_out_and_the_mount_is_made() {
    for place in PLACES {
        for allow_other in [false, true] {
            if allow_other && !nonroot_tools() {
                return;
            }
            let model = Model::new(place);
            symlink("loop.json", model.small("loop.json")).unwrap();
            symlink("loop_b.json", model.small("loop_a.json")).unwrap();
            symlink("loop_a.json", model.small("loop_b.json")).unwrap();
            let fifo = std::ffi::CString::new(model.small("tokenizer.json").to_str().unwrap()).unwrap();
            // SAFETY: a valid C string.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
            let log = model.dir.path().join("log");
            let m = model.mount(allow_other, &log);
            config_served(&model, &m.path, allow_other);
            for name in ["loop.json", "loop_a.json", "loop_b.json"] {
                left_out(&model, &m.path, name, &log, "too many levels of symbolic links");
            }
            assert!(!listed(&model.served(&m.path, ".")).contains(&"tokenizer.json".to_string()), "{place:?}");
        }
    }
}

/// A small file of the folder that fewer users may read than the checkpoint (root's, mode 0600,
/// itself and through a link beside it) is left out, with a warning naming it, and narrows
/// nothing: the rest of the mount keeps the shards' modes, and with `--allow-other` nobody still
/// reads the tensors and `config.json` (one private README never locks every user out of the
/// model).
#[test]
fn a_file_fewer_users_may_read_is_left_out_and_narrows_nothing() {
    if !nonroot_tools() {
        return;
    }
    for place in PLACES {
        let model = Model::new(place);
        write(&model.small("tokenizer.json"), SECRET, 0o600);
        symlink("tokenizer.json", model.small("vocab.json")).unwrap();
        let log = model.dir.path().join("log");
        let m = model.mount(true, &log);
        config_served(&model, &m.path, true);
        let tensor = model.served(&m.path, "w");
        let mode = std::fs::metadata(&tensor).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444, "{place:?}: the tensor served {mode:o}");
        let out = cat_as_nobody(&tensor);
        assert_eq!(out.stdout, model.tensor.data, "{place:?}: {}", String::from_utf8_lossy(&out.stderr));
        let folder = model.served(&m.path, ".");
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        for name in ["tokenizer.json", "vocab.json"] {
            assert!(!listed(&folder).contains(&name.to_string()), "{place:?} {name}: listed");
            let shown = match place {
                Place::Component => format!("unet/{name}"),
                _ => name.to_string(),
            };
            let line = format!("{shown}: not served: readable by fewer users than the checkpoint");
            assert!(log.contains(&line), "{place:?}: {line:?} not in the log:\n{log}");
        }
    }
}

/// A user who mounts a folder holding a file they cannot read (root's, mode 0600, itself and
/// through a link) gets the mount without it, and the log says why.
#[test]
fn a_file_the_mounting_user_cannot_read_is_left_out() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    for place in PLACES {
        let model = Model::new(place);
        write(&model.small("tokenizer.json"), SECRET, 0o600);
        symlink("tokenizer.json", model.small("vocab.json")).unwrap();
        let mine = model.dir.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();
        let (mp, log) = (mine.join("m"), mine.join("log"));
        std::fs::create_dir(&mp).unwrap();
        std::os::unix::fs::chown(&mp, Some(NOBODY), Some(NOBODY)).unwrap();
        let source = model.source();
        let args = ["mount", source.to_str().unwrap(), mp.to_str().unwrap(), "--log-file", log.to_str().unwrap()];
        let out = stfs_as_nobody(&args);
        let _guard = Unmount(mp.clone());
        assert!(out.status.success(), "{place:?}: {}", String::from_utf8_lossy(&out.stderr));
        let out = as_nobody("cat").arg(model.served(&mp, "config.json")).output().unwrap();
        assert_eq!(out.stdout, CONFIG, "{place:?}: {}", String::from_utf8_lossy(&out.stderr));
        let out = as_nobody("ls").arg(model.served(&mp, ".")).output().unwrap();
        let names = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && names.lines().any(|l| l == "config.json"), "{place:?}: {names}");
        assert!(!names.lines().any(|l| l == "tokenizer.json" || l == "vocab.json"), "{place:?}: {names}");
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        for name in ["tokenizer.json", "vocab.json"] {
            let line = format!("{}: not served: permission denied", model.small(name).display());
            assert!(log.contains(&line), "{place:?}: {line:?} not in the log:\n{log}");
        }
    }
}

/// Unmounts (umount2, then a lazy detach) when dropped, whatever the test did.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

/// A Hugging Face cache repository: `blobs/` holding every file by hash, `refs/main`, and the
/// snapshot `snapshots/REV/` of links into `blobs/`: a checkpoint and its config, an index, a
/// `unet/` component with its own, and a link to `refs/main` (in the cache, but not a blob).
struct Cache {
    dir: tempfile::TempDir,
    snapshot: PathBuf,
    tensor: T,
    unet: T,
}

fn cache() -> Cache {
    let dir = workdir();
    open_dir(dir.path());
    let repo = dir.path().join("hub/models--org--name");
    let snapshot = repo.join("snapshots").join(REV);
    let (tensor, unet) = (T::new("w", Dtype::F32, &[64]), T::new("conv.weight", Dtype::F16, &[8]));
    let index = br#"{"weight_map": {"w": "model.safetensors"}}"#;
    let blobs: [(&str, &str, Option<&T>, &[u8]); 5] = [
        ("model.safetensors", "aaaa", Some(&tensor), b""),
        ("config.json", "bbbb", None, CONFIG),
        ("model.safetensors.index.json", "cccc", None, index),
        ("unet/diffusion_pytorch_model.safetensors", "dddd", Some(&unet), b""),
        ("unet/config.json", "eeee", None, b"{\"_class_name\": \"UNet2DModel\"}"),
    ];
    for (name, hash, tensor, bytes) in blobs {
        let blob = repo.join("blobs").join(hash);
        match tensor {
            Some(t) => {
                std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
                write_checkpoint(&blob, std::slice::from_ref(t), None);
            }
            None => write(&blob, bytes, 0o644),
        }
        let link = snapshot.join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let up = "../".repeat(name.matches('/').count() + 2);
        symlink(format!("{up}blobs/{hash}"), &link).unwrap();
    }
    write(&repo.join("refs/main"), REV.as_bytes(), 0o644);
    symlink("../../refs/main", snapshot.join("refs.json")).unwrap();
    for path in [dir.path().join("hub"), repo.clone(), repo.join("blobs"), repo.join("snapshots"), snapshot.clone()] {
        open_dir(&path);
    }
    open_dir(&snapshot.join("unet"));
    Cache { dir, snapshot, tensor, unet }
}

/// The cache's layout stays served: a mount of the snapshot, with and without `--allow-other`,
/// serves its links into `blobs/` (configs, the re-served checkpoints, the component's) byte for
/// byte, and not its link to `refs/main`; a mount of the snapshot's index serves the config beside
/// it.
#[test]
fn a_hugging_face_cache_snapshot_serves_its_blobs() {
    if !nonroot_tools() {
        return;
    }
    let cache = cache();
    let blob = |name: &str| std::fs::read(cache.snapshot.join(name)).unwrap();
    for allow_other in [false, true] {
        let log = cache.dir.path().join(format!("log-{allow_other}"));
        let mut args = vec!["--log-file", log.to_str().unwrap()];
        if allow_other {
            args.push("--allow-other");
        }
        let m = Mount::new(&cache.snapshot, &args);
        open_dir(m.path.parent().unwrap());
        for name in ["config.json", "model.safetensors", "unet/config.json", "unet/diffusion_pytorch_model.safetensors"]
        {
            assert_eq!(std::fs::read(m.file(name)).unwrap(), blob(name), "{name}");
            if allow_other {
                assert_eq!(cat_as_nobody(&m.file(name)).stdout, blob(name), "{name} as nobody");
            }
        }
        assert_eq!(std::fs::read(m.file("w")).unwrap(), cache.tensor.data);
        assert_eq!(std::fs::read(m.file("unet/conv.weight")).unwrap(), cache.unet.data);
        assert!(!listed(&m.path).contains(&"refs.json".to_string()), "{:?}", listed(&m.path));
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        let line =
            format!("{}: not served: resolves outside the model's folder", cache.snapshot.join("refs.json").display());
        assert!(log.contains(&line), "{line:?} not in the log:\n{log}");
    }
    let m = Mount::new(&cache.snapshot.join("model.safetensors.index.json"), &[]);
    assert_eq!(std::fs::read(m.file("config.json")).unwrap(), CONFIG);
    assert_eq!(std::fs::read(m.file("model.safetensors.index.json")).unwrap(), blob("model.safetensors.index.json"));
    assert_eq!(std::fs::read(m.file("w")).unwrap(), cache.tensor.data);
}

/// `stfs mount SOURCE` must fail: exit 1, one line naming `shown`, holding `needle`, no mount.
fn refused(source: &Path, shown: &Path, needle: &str) {
    assert_eq!(refused_mount(source), format!("stfs: {}: {needle}\n", shown.display()));
}

/// A shard that resolves outside the folder is refused, naming it (a checkpoint is never served
/// without its tensors, nor with a file from elsewhere); another checkpoint of the folder (an
/// index, a file) that does is left out, with a warning, and the mount is made.
#[test]
fn a_shard_outside_the_folder_is_refused_and_an_index_outside_left_out() {
    let elsewhere = workdir();
    let outside = elsewhere.path().join("other.safetensors");
    write_checkpoint(&outside, &[T::new("x", Dtype::U8, &[4])], None);
    write(&elsewhere.path().join("other.safetensors.index.json"), br#"{"weight_map": {"w": "m.safetensors"}}"#, 0o644);
    for place in PLACES {
        let model = Model::new(place);
        let link = match place {
            // The root's checkpoint itself.
            Place::Root => model.small("model.safetensors"),
            // The component's checkpoint itself.
            Place::Component => model.small("diffusion_pytorch_model.safetensors"),
            // A shard the index names.
            Place::BesideIndex => {
                let index = br#"{"weight_map": {"w": "model-00001-of-00001.safetensors", "x": "extra.safetensors"}}"#;
                std::fs::remove_file(model.source()).unwrap();
                write(&model.source(), index, 0o644);
                model.small("extra.safetensors")
            }
        };
        std::fs::remove_file(&link).ok();
        symlink(&outside, &link).unwrap();
        refused(&model.source(), &link, "resolves outside the model's folder");
    }
    // Another checkpoint of the folder (an index beside the root's file, a file beside it) that
    // resolves outside is left out with a warning, and the mount is made without it.
    let model = Model::new(Place::Root);
    let index = model.root().join("model.safetensors.index.json");
    symlink(elsewhere.path().join("other.safetensors.index.json"), &index).unwrap();
    let extra = model.root().join("extra.safetensors");
    symlink(&outside, &extra).unwrap();
    let log = model.dir.path().join("log");
    let m = model.mount(false, &log);
    for name in ["model.safetensors.index.json", "extra.safetensors", "%.checkpoints"] {
        assert!(!listed(&m.path).contains(&name.to_string()), "{name}: {:?}", listed(&m.path));
    }
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    for file in [&index, &extra] {
        let line = format!("{}: not served: resolves outside the model's folder", file.display());
        assert!(log.contains(&line), "{line:?} not in the log:\n{log}");
    }
}

/// A FIFO at `path`, with a writer waiting in its open until something opens the FIFO for reading
/// (what [`FifoWatch::opened`] tells); released when dropped, so its thread ends either way.
struct FifoWatch {
    path: PathBuf,
    opened: std::sync::mpsc::Receiver<()>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl FifoWatch {
    fn new(path: &Path) -> FifoWatch {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
        let (tx, opened) = std::sync::mpsc::channel();
        let fifo = path.to_path_buf();
        let writer = std::thread::spawn(move || {
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
            let _ = tx.send(());
        });
        FifoWatch { path: path.to_path_buf(), opened, writer: Some(writer) }
    }

    /// Whether anything opened the FIFO for reading (its writer's open returned) within 300 ms.
    fn opened(&self) -> bool {
        self.opened.recv_timeout(std::time::Duration::from_millis(300)).is_ok()
    }
}

impl Drop for FifoWatch {
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&self.path);
        let _ = self.writer.take().map(std::thread::JoinHandle::join);
    }
}

/// `cat PATH` as the mounting user, given 20 s (a read that waits longer fails the test).
fn cat(path: &Path) -> Output {
    let child = std::process::Command::new("cat")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cat");
    wait_output(child, std::time::Duration::from_secs(20))
}

/// A shard that is a link inside the folder is reopened by the path the link rule allowed, never
/// by the link: the link pointed at a FIFO outside after the mount is never opened (root opening
/// whatever a writer of the folder points it at: a device, a hung network path), and the shard is
/// still served; the allowed path itself made a link to the FIFO is refused without being
/// followed: EIO at once.
#[test]
fn a_shard_link_swapped_after_the_mount_is_never_followed() {
    let dir = workdir();
    let root = dir.path().join("model");
    let tensor = T::new("w", Dtype::F32, &[64]);
    let real = root.join("data").join("weights");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    let bytes = write_checkpoint(&real, std::slice::from_ref(&tensor), None);
    symlink("data/weights", root.join("model.safetensors")).unwrap();
    let outside = workdir();
    let log = dir.path().join("log");
    let m = Mount::new(&root, &["--log-file", log.to_str().unwrap()]);
    let fifo = FifoWatch::new(&outside.path().join("fifo"));
    std::fs::remove_file(root.join("model.safetensors")).unwrap();
    symlink(&fifo.path, root.join("model.safetensors")).unwrap();
    for name in ["model.safetensors", "w"] {
        let out = cat(&m.file(name));
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let expected = if name == "w" { &tensor.data } else { &bytes };
        assert!(out.stdout == *expected, "{name}: other bytes served");
    }
    assert!(!fifo.opened(), "the link's new target was opened");
    // The allowed path itself made a link to the FIFO.
    std::fs::rename(&real, root.join("data").join("moved")).unwrap();
    symlink(&fifo.path, &real).unwrap();
    let out = cat(&m.file("model.safetensors"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Input/output error"), "served: {err}");
    assert!(!fifo.opened(), "the allowed path was followed");
}
