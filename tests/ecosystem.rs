//! Fitting in: mount(8) and fstab through the `mount.fuse.stfs` helper, fuse3's `mount.fuse` calling
//! convention, `stfs install-helper`, `stfs extract` / `stfs cat` without a mount, and a mount
//! copied whole by `cp -a`, `cp -r`, `tar` and `rsync -a`.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use stfs::format::Dtype;
use stfs::tree::namespace::RESERVED;

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The file name a flat mount (and extract) gives tensor `name`.
fn file_name(name: &str) -> String {
    stfs::tree::names::escape(name, RESERVED)
}

/// A mount point on a fresh temp directory, unmounted on drop whatever mounted it.
struct MountPoint {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl MountPoint {
    fn new() -> MountPoint {
        let dir = tempfile::Builder::new().prefix("stfs-eco-").tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::create_dir(&path).unwrap();
        MountPoint { _dir: dir, path }
    }
}

impl Drop for MountPoint {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

/// Runs a system command (mount, umount) with the suite's deadline.
fn run(program: &str, args: &[&str]) -> Output {
    let child =
        Command::new(program).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    wait_output(child.unwrap_or_else(|e| panic!("{program}: {e}")), TIMEOUT)
}

/// `stfs ARGS...` whose stdout may be larger than a pipe holds (common's `stfs` would block on it).
fn stfs_large_output(args: &[&str]) -> Output {
    let mut child = Command::new(STFS)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout.read_to_end(&mut bytes).map(|_| bytes)
    });
    let mut out = wait_output(child, TIMEOUT);
    out.stdout = reader.join().unwrap().unwrap();
    out
}

fn assert_serves(mp: &Path, tensors: &[T]) {
    for t in tensors {
        assert_eq!(std::fs::read(mp.join(file_name(&t.name))).unwrap(), t.data, "tensor {:?}", t.name);
    }
}

fn mixed_checkpoint() -> (tempfile::TempDir, PathBuf, Vec<T>) {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = mixed_tensors();
    write_checkpoint(&file, &tensors, None);
    (dir, file, tensors)
}

/// /sbin/mount.fuse.stfs for the duration of a test: installed with `stfs install-helper` (and removed
/// afterwards) unless this binary is already installed there.
struct InstalledHelper {
    installed_here: bool,
}

const HELPER: &str = "/sbin/mount.fuse.stfs";

impl InstalledHelper {
    /// `None` (with a message) when another program already owns the helper name.
    fn get() -> Option<InstalledHelper> {
        let ours = std::fs::canonicalize(STFS).unwrap();
        match std::fs::read_link(HELPER) {
            Ok(target) if target == ours => return Some(InstalledHelper { installed_here: false }),
            Ok(_) => {
                eprintln!("skipping: {HELPER} belongs to another stfs build; not replacing it");
                return None;
            }
            Err(_) if Path::new(HELPER).exists() => {
                eprintln!("skipping: {HELPER} is not a link; not replacing it");
                return None;
            }
            Err(_) => {}
        }
        let out = stfs(&["install-helper"]);
        assert!(out.status.success(), "install-helper: {}", stderr_of(&out));
        assert_eq!(std::fs::read_link(HELPER).unwrap(), ours);
        Some(InstalledHelper { installed_here: true })
    }
}

impl Drop for InstalledHelper {
    fn drop(&mut self) {
        if self.installed_here {
            let out = stfs(&["install-helper", "--remove"]);
            assert!(out.status.success() || std::thread::panicking(), "{}", stderr_of(&out));
        }
    }
}

/// One test for everything that needs the fixed helper path, so nothing races over it.
#[test]
fn mount8_and_fstab_run_the_helper() {
    let Some(_helper) = InstalledHelper::get() else { return };
    let (dir, file, tensors) = mixed_checkpoint();

    // mount -t fuse.stfs with options, then umount(8).
    let mp = MountPoint::new();
    let out = run("mount", &["-t", "fuse.stfs", s(&file), s(&mp.path), "-o", "ro,cache_size=64M,block_size=64K"]);
    assert!(out.status.success(), "mount -t fuse.stfs: {}", stderr_of(&out));
    assert!(is_mounted(&mp.path), "mount(8) returned before the mount answered");
    assert_serves(&mp.path, &tensors);
    let out = unmount_retrying(|| run("umount", &[s(&mp.path)]));
    assert!(out.status.success(), "umount: {}", stderr_of(&out));
    assert!(!is_mounted(&mp.path));

    // Without `-o ro` mount(8) passes `rw`, which a read-only filesystem ignores.
    let out = run("mount", &["-t", "fuse.stfs", s(&file), s(&mp.path)]);
    assert!(out.status.success(), "mount without options: {}", stderr_of(&out));
    assert_serves(&mp.path, &tensors[..2]);
    force_unmount(&mp.path);

    // An unknown option is refused by name, with the closest one suggested, as a usage error
    // (mount(8) passes on its helper's status: 1), and nothing is mounted.
    let out = run("mount", &["-t", "fuse.stfs", s(&file), s(&mp.path), "-o", "ro,cache_sise=1G"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("unknown mount option `cache_sise`; did you mean `cache_size`?"),
        "{}",
        stderr_of(&out)
    );
    assert!(!is_mounted(&mp.path));
    // A mount that fails exits with mount(8)'s own code for it, 32.
    let out = run("mount", &["-t", "fuse.stfs", s(&dir.path().join("gone.safetensors")), s(&mp.path)]);
    assert_eq!(out.status.code(), Some(32), "{}", stderr_of(&out));
    assert!(!is_mounted(&mp.path));

    // mount -f (fake) checks and mounts nothing; a bad source fails even then.
    let out = run("mount", &["-f", "-t", "fuse.stfs", s(&file), s(&mp.path), "-o", "cache_size=64M"]);
    assert!(out.status.success(), "mount -f: {}", stderr_of(&out));
    assert!(!is_mounted(&mp.path));
    let missing = dir.path().join("missing.safetensors");
    let out = run("mount", &["-f", "-t", "fuse.stfs", s(&missing), s(&mp.path)]);
    assert!(!out.status.success() && stderr_of(&out).contains("missing.safetensors"), "{}", stderr_of(&out));

    // An fstab line, through util-linux's alternative fstab (-T).
    let fstab = dir.path().join("fstab");
    let line =
        format!("{} {} fuse.stfs ro,cache_size=64M,nofail,_netdev,x-systemd.automount 0 0\n", s(&file), s(&mp.path));
    std::fs::write(&fstab, format!("# stfs test\n{line}")).unwrap();
    let out = run("mount", &["-T", s(&fstab), s(&mp.path)]);
    assert!(out.status.success(), "mount -T fstab: {}", stderr_of(&out));
    assert_serves(&mp.path, &tensors);
    force_unmount(&mp.path);
}

/// Without the helper link, fuse3's mount.fuse runs `stfs SOURCE MOUNTPOINT -o OPTS` from PATH.
#[test]
fn fuse3_mount_fuse_calling_convention_mounts() {
    let (_dir, file, tensors) = mixed_checkpoint();
    let mp = MountPoint::new();
    let out = stfs(&[s(&file), s(&mp.path), "-o", "rw,nosuid,nodev,dev,suid,cache_size=64M"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(is_mounted(&mp.path));
    assert_serves(&mp.path, &tensors);
    force_unmount(&mp.path);
    // A first argument that is neither a subcommand nor an existing path is still a usage error.
    let out = stfs(&["/no/such/dir/model.safetensors", s(&mp.path)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}

#[test]
fn install_helper_links_replaces_only_when_forced_and_removes() {
    let dir = workdir();
    let prefix = s(dir.path());
    let link = dir.path().join("mount.fuse.stfs");
    let ours = std::fs::canonicalize(STFS).unwrap();
    for _ in 0..2 {
        let out = stfs(&["install-helper", "--prefix", prefix]);
        assert!(out.status.success(), "{}", stderr_of(&out));
        assert_eq!(std::fs::read_link(&link).unwrap(), ours);
    }
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("/bin/true", &link).unwrap();
    let out = stfs(&["install-helper", "--prefix", prefix]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("--force"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/bin/true"));
    let out = stfs(&["install-helper", "--force", "--prefix", prefix]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::read_link(&link).unwrap(), ours);
    let out = stfs(&["install-helper", "--remove", "--prefix", prefix]);
    assert!(out.status.success() && !link.exists() && std::fs::symlink_metadata(&link).is_err());
    // A regular file under the helper's name is never deleted.
    std::fs::write(&link, b"#!/bin/sh\n").unwrap();
    let out = stfs(&["install-helper", "--remove", "--prefix", prefix]);
    assert_eq!(out.status.code(), Some(1));
    assert!(link.exists());
    // Nothing else was left in the directory (no temporary links).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn extract_writes_every_tensor_as_the_mount_names_it() {
    let (dir, file, tensors) = mixed_checkpoint();
    let out_dir = dir.path().join("out");
    let out = stfs(&["extract", "--all", s(&file), "-o", s(&out_dir)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let mut expected: Vec<String> = tensors.iter().map(|t| file_name(&t.name)).collect();
    expected.sort();
    assert_eq!(listing(&out_dir), expected);
    for t in &tensors {
        assert_eq!(std::fs::read(out_dir.join(file_name(&t.name))).unwrap(), t.data, "tensor {:?}", t.name);
    }
}

#[test]
fn extract_npy_writes_header_then_bytes() {
    let (dir, file, tensors) = mixed_checkpoint();
    let out_dir = dir.path().join("npy");
    let picked: Vec<&T> =
        tensors.iter().filter(|t| ["model.embed.weight", "scale", "empty", "a/b"].contains(&t.name.as_str())).collect();
    let mut args = vec!["extract", "--npy", s(&file), "-o", s(&out_dir)];
    args.extend(picked.iter().map(|t| t.name.as_str()));
    let out = stfs(&args);
    assert!(out.status.success(), "{}", stderr_of(&out));
    for t in picked {
        let header = stfs::views::npy::npy_header(t.dtype, &t.shape).unwrap();
        let got = std::fs::read(out_dir.join(format!("{}.npy", file_name(&t.name)))).unwrap();
        assert_eq!(&got[..header.len()], &header[..], "header of {:?}", t.name);
        assert_eq!(&got[header.len()..], &t.data[..], "data of {:?}", t.name);
    }
}

#[test]
fn unknown_tensor_is_named_and_nothing_is_written() {
    let (dir, file, _) = mixed_checkpoint();
    let out_dir = dir.path().join("out");
    let out = stfs(&["extract", s(&file), "scale", "model.nope", "-o", s(&out_dir)]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr_of(&out);
    assert!(err.contains("\"model.nope\"") && err.lines().count() == 1, "{err}");
    assert!(!out_dir.exists(), "extract wrote output before checking every name");
    let out = stfs(&["cat", s(&file), "model.nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("\"model.nope\"") && out.stdout.is_empty());
    let out = stfs(&["extract", s(&file)]);
    assert_eq!(out.status.code(), Some(2), "no tensor and no --all is a usage error");
}

#[test]
fn cat_writes_raw_and_npy_bytes() {
    let (_dir, file, tensors) = mixed_checkpoint();
    for t in &tensors {
        let out = stfs_large_output(&["cat", s(&file), &t.name]);
        assert!(out.status.success(), "{}", stderr_of(&out));
        assert_eq!(out.stdout, t.data, "tensor {:?}", t.name);
    }
    let t = &tensors[1];
    let out = stfs_large_output(&["cat", "--npy", s(&file), &t.name]);
    let header = stfs::views::npy::npy_header(t.dtype, &t.shape).unwrap();
    assert_eq!(out.stdout, [header, t.data.clone()].concat());
}

#[test]
fn cat_into_a_closed_pipe_exits_quietly() {
    let dir = workdir();
    let file = dir.path().join("big.safetensors");
    write_checkpoint(&file, &[T::new("big", Dtype::U8, &[24 << 20])], None);
    let mut child = Command::new(STFS)
        .args(["cat", s(&file), "big"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4096];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take());
    let out = wait_output(child, TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(out.stderr.is_empty(), "{}", stderr_of(&out));
}

#[test]
fn extract_reads_sharded_checkpoints() {
    let dir = workdir();
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let first = [T::new("a.w", Dtype::F32, &[100, 3])];
    let second = [T::new("b.w", Dtype::BF16, &[77])];
    write_checkpoint(&shards.join("model-00001-of-00002.safetensors"), &first, None);
    write_checkpoint(&shards.join("model-00002-of-00002.safetensors"), &second, None);
    let out_dir = dir.path().join("out");
    let out = stfs(&["extract", s(&shards), "b.w", "a.w", "-o", s(&out_dir)]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(out_dir.join("a.w")).unwrap(), first[0].data);
    assert_eq!(std::fs::read(out_dir.join("b.w")).unwrap(), second[0].data);
}

/// docs/man is generated from the clap definitions (`cargo run --example gen_man`); it must match them.
#[test]
fn man_pages_match_the_command_line() {
    let generator = Path::new(STFS).parent().unwrap().join("examples").join("gen_man");
    if !generator.exists() {
        return tool_missing(&generator.display().to_string(), "cargo test builds the examples");
    }
    let dir = workdir();
    let out = Command::new(&generator).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/man");
    assert_eq!(listing(dir.path()), listing(&committed), "docs/man has other pages than the commands");
    for page in listing(dir.path()) {
        let fresh = std::fs::read(dir.path().join(&page)).unwrap();
        let old = std::fs::read(committed.join(&page)).unwrap();
        assert!(fresh == old, "docs/man/{page} is out of date: run `cargo run --example gen_man`");
    }
}

/// Every man page has EXIT STATUS, ENVIRONMENT and SEE ALSO, refers only to pages that exist, and
/// the synopsis names option values (`-o OPT[,OPT...]`); every subcommand's `-V` names the program.
#[test]
fn man_pages_are_complete_and_versions_name_stfs() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/man");
    let pages = listing(&committed);
    for page in &pages {
        let text = std::fs::read_to_string(committed.join(page)).unwrap();
        for section in [".SH \"EXIT STATUS\"", ".SH ENVIRONMENT", ".SH \"SEE ALSO\""] {
            assert!(text.contains(section), "{page} lacks {section}");
        }
        // Every stfs-NAME(1) it mentions has a page.
        for (at, _) in text.match_indices("stfs\\-") {
            let rest = &text[at..];
            if let Some(end) = rest.find("(1)").filter(|&end| end < 40) {
                let name = rest[..end].replace("\\fR", "").replace("\\-", "-");
                assert!(pages.contains(&format!("{name}.1")), "{page} refers to {name}(1)");
            }
        }
    }
    let mount = std::fs::read_to_string(committed.join("stfs-mount.1")).unwrap();
    let synopsis = mount.split(".SH SYNOPSIS").nth(1).unwrap().lines().nth(1).unwrap();
    assert!(synopsis.contains("[\\fB\\-o\\fR \\fIOPT[,OPT...]\\fR]"), "{synopsis}");
    for sub in ["mount", "umount", "inspect", "stats", "extract", "cat", "install-helper"] {
        let out = stfs(&[sub, "-V"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("stfs {}\n", env!("CARGO_PKG_VERSION")), "{sub}");
    }
    let help = String::from_utf8(stfs(&["install-helper", "--help"]).stdout).unwrap();
    assert!(help.contains("The options are those of `stfs mount`"), "{help}");
}

/// Whether `program` is on PATH.
fn installed(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// Issue 44, item 10: the common tools copy a whole mount, `.stfs/stats.json` included, exit 0
/// and say nothing, and every tensor file of the copy is the tensor's bytes (`cmp` against the
/// mount's file and against the fixture). Before, `cp -a` and `cp -r` failed on stats.json
/// ("skipping file ..., as it was replaced while being copied", exit 1): the lookup of the
/// open after cp's stat took a new snapshot under a new inode.
#[test]
fn the_common_tools_copy_a_whole_mount() {
    for (tool, package) in [("cp", "coreutils"), ("cmp", "diffutils"), ("tar", "tar"), ("rsync", "rsync")] {
        if !installed(tool) {
            return tool_missing(tool, &format!("apt-get install {package}"));
        }
    }
    let (_dir, source, tensors) = mixed_checkpoint();
    let m = Mount::new(&source, &[]);
    let out = workdir();
    let mp = s(&m.path);
    let dest = |name: &str| out.path().join(name).to_str().unwrap().to_string();
    let (archive, rsync_from) = (dest("copy.tar"), format!("{mp}/"));
    let (cp_a, cp_r, cp_a2, tar, rsync) = (dest("cp-a"), dest("cp-r"), dest("cp-a2"), dest("tar"), dest("rsync"));
    let copies: [(&str, Vec<Vec<&str>>, &str); 5] = [
        ("cp -a", vec![vec!["cp", "-a", mp, &cp_a]], &cp_a),
        ("cp -r", vec![vec!["cp", "-r", mp, &cp_r]], &cp_r),
        // Again: stats.json has been looked up and read since.
        ("cp -a again", vec![vec!["cp", "-a", mp, &cp_a2]], &cp_a2),
        ("tar", vec![vec!["tar", "-cf", &archive, "-C", mp, "."], vec!["tar", "-xf", &archive, "-C", &tar]], &tar),
        ("rsync -a", vec![vec!["rsync", "-a", &rsync_from, &rsync]], &rsync),
    ];
    std::fs::create_dir(&tar).unwrap();
    for (what, commands, copy) in &copies {
        let copy = Path::new(copy);
        for command in commands {
            let done = run(command[0], &command[1..]);
            assert!(done.status.success() && done.stderr.is_empty(), "{what}: {:?} {}", done.status, stderr_of(&done));
        }
        for t in &tensors {
            let (copied, served) = (copy.join(file_name(&t.name)), m.path.join(file_name(&t.name)));
            let same = run("cmp", &[s(&copied), s(&served)]);
            assert!(same.status.success(), "{what}: {} {}", t.name, String::from_utf8_lossy(&same.stdout));
            assert!(std::fs::read(&copied).unwrap() == t.data, "{what}: {} is not the tensor's bytes", t.name);
        }
        let same = run("cmp", &[s(&copy.join("model.safetensors")), s(&source)]);
        assert!(same.status.success(), "{what}: the re-served checkpoint differs from its source");
        let stats: serde_json::Value = serde_json::from_slice(&std::fs::read(copy.join(".stfs/stats.json")).unwrap())
            .unwrap_or_else(|e| panic!("{what}: stats.json copied whole: {e}"));
        assert!(stats["fuse_reads"].is_u64(), "{what}: {stats}");
    }
}
