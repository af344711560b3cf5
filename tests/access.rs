//! Who may enter a mount and what the permission bits say; hostile tensor names that must neither
//! escape the mount nor collide; and a header near the 100 MB limit mounting in bounded memory.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use common::*;
use stfs::format::Dtype;

/// Runs `cmd args...` as uid/gid 65534 (nobody) with no supplementary groups.
fn as_nobody(cmd: &str, args: &[&Path]) -> Output {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", cmd])
        .args(args)
        .output()
        .expect("setpriv (util-linux) is needed to test access by another user");
    out
}

/// A mount whose parent directories another user may traverse (temp dirs are 0700).
fn open_to_traversal(m: &Mount) {
    std::fs::set_permissions(m.path.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn small_checkpoint(dir: &Path, mode: u32) -> (PathBuf, T) {
    let file = dir.join("m.safetensors");
    let t = T::new("w", Dtype::F32, &[1000]);
    write_checkpoint(&file, std::slice::from_ref(&t), None);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    (file, t)
}

#[test]
fn by_default_only_the_mounting_user_gets_in() {
    let dir = workdir();
    let (file, t) = small_checkpoint(dir.path(), 0o644);
    let m = Mount::new(&file, &[]);
    open_to_traversal(&m);
    assert_eq!(std::fs::read(m.file("w")).unwrap(), t.data, "the owner reads");
    for (cmd, arg) in [("cat", m.file("w")), ("ls", m.path.clone()), ("stat", m.file("w"))] {
        let out = as_nobody(cmd, &[&arg]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd} as nobody succeeded on a private mount");
        assert!(err.contains("Permission denied"), "{cmd}: {err}");
        assert!(out.stdout.is_empty(), "{cmd} as nobody printed {:?}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn allow_other_lets_other_users_read() {
    for flag in [&["--allow-other"][..], &["-o", "allow_other"][..]] {
        let dir = workdir();
        let (file, t) = small_checkpoint(dir.path(), 0o644);
        let m = Mount::new(&file, flag);
        open_to_traversal(&m);
        let out = as_nobody("cat", &[&m.file("w")]);
        assert!(out.status.success(), "{flag:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, t.data, "{flag:?}");
        let opts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = opts.lines().find(|l| l.contains(m.path.to_str().unwrap())).unwrap().to_string();
        assert!(line.contains("default_permissions") && line.contains("allow_other"), "{flag:?}: {line}");
    }
}

#[test]
fn permission_bits_follow_the_backing_files_readability() {
    let dir = workdir();
    let (file, t) = small_checkpoint(dir.path(), 0o600);
    let m = Mount::new(&file, &["--allow-other"]);
    open_to_traversal(&m);
    let st = std::fs::metadata(m.file("w")).unwrap();
    assert_eq!(st.permissions().mode() & 0o777, 0o400);
    assert_eq!(std::fs::metadata(&m.path).unwrap().permissions().mode() & 0o777, 0o500);
    assert_eq!(std::fs::read(m.file("w")).unwrap(), t.data, "the owner still reads");
    // default_permissions makes the kernel enforce those bits: nobody may not read a 0600 model.
    let out = as_nobody("cat", &[&m.file("w")]);
    assert!(!out.status.success() && out.stdout.is_empty(), "nobody read a file whose backing file is 0600");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    // A group-readable file gives group-readable tensors, still never writable or executable.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let m2 = Mount::new(&file, &[]);
    assert_eq!(std::fs::metadata(m2.file("w")).unwrap().permissions().mode() & 0o777, 0o440);
    assert_eq!(std::fs::metadata(&m2.path).unwrap().permissions().mode() & 0o777, 0o550);
}

/// Names chosen to break path handling: traversal, separators, NUL, huge names, Unicode forms,
/// escape look-alikes, dot names, the root's reserved names, and long names alike up to the cut.
fn hostile_names() -> Vec<String> {
    let long_a = "a".repeat(4096);
    let mut long_b = "a".repeat(4095);
    long_b.push('b');
    let mut names: Vec<String> = [
        "../../etc/passwd",
        "/",
        "//",
        "/etc/passwd",
        "a\0b",
        "\0",
        "\u{e9}",
        "e\u{301}",
        "a/b",
        "a%2Fb",
        "a%252Fb",
        "%",
        "%25",
        "%2E",
        ".",
        "..",
        "...",
        "",
        "metadata.json",
        ".stfs",
        ".stfs/stats.json",
        "%6Detadata.json",
        "a\nb",
        " ",
        "ok",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.extend([long_a, long_b, format!("{}/..", "x".repeat(300)), "\u{1F600}".repeat(1000)]);
    // Escaped names of 252-255 bytes: with --npy, NAME.npy must still fit in 255 bytes.
    names.extend((252..=255).map(|n| "n".repeat(n)));
    names.push(format!("{}.npy", "v".repeat(250)));
    names
}

/// Checks one mount of the hostile checkpoint: every entry lies inside the mount, names are files
/// the kernel accepts, nothing collides, and metadata.json maps each path to its own bytes.
fn check_hostile_mount(m: &Mount, tensors: &[T], files_per_tensor: usize) {
    let root = std::fs::canonicalize(&m.path).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(m.file("metadata.json")).unwrap()).unwrap();
    let mut seen_paths = BTreeSet::new();
    for t in tensors {
        let path = doc["tensors"][&t.name]["path"].as_str().unwrap_or_else(|| panic!("no path for {:?}", t.name));
        assert!(!path.starts_with('/') && !path.contains('\0'), "{:?} -> {path:?}", t.name);
        assert!(
            path.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255),
            "{:?} -> {path:?}",
            t.name
        );
        assert_eq!(doc["files"][path], t.name.as_str(), "metadata.json maps {path:?} back");
        assert!(seen_paths.insert(path.to_string()), "two tensors share {path:?}");
        let served = m.path.join(path);
        let real = std::fs::canonicalize(&served).unwrap_or_else(|e| panic!("{:?} -> {path:?}: {e}", t.name));
        assert!(
            real.starts_with(&root) && real != root,
            "{:?} resolves to {} outside the mount",
            t.name,
            real.display()
        );
        assert_eq!(std::fs::read(&served).unwrap(), t.data, "{:?} reads another tensor's bytes", t.name);
    }
    // Walk the tree as readdir shows it: no entry name with a slash, every file accounted for.
    let mut files = 0;
    let mut stack = vec![m.path.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            let bytes = name.as_encoded_bytes();
            assert!(!bytes.contains(&b'/') && bytes != b"." && bytes != b"..", "readdir gave {name:?}");
            if e.file_type().unwrap().is_dir() {
                if dir != m.path || name != ".stfs" {
                    stack.push(e.path());
                }
            } else if !(dir == m.path
                && (name == "metadata.json" || name.as_encoded_bytes().ends_with(b".safetensors")))
            {
                files += 1;
            }
        }
    }
    assert_eq!(
        files,
        files_per_tensor * tensors.len(),
        "readdir shows a different number of tensor files in {}",
        m.path.display()
    );
    // /etc/passwd is untouched and is not what `../../etc/passwd` serves.
    let passwd = std::fs::read("/etc/passwd").unwrap();
    assert_ne!(tensors.iter().find(|t| t.name == "../../etc/passwd").unwrap().data, passwd);
}

#[test]
fn hostile_names_never_escape_or_collide() {
    let dir = workdir();
    let file = dir.path().join("hostile.safetensors");
    let tensors: Vec<T> = hostile_names().iter().map(|n| T::new(n, Dtype::U8, &[17])).collect();
    // Every tensor has distinct bytes, so a collision or a mix-up cannot go unnoticed.
    let distinct: BTreeSet<&Vec<u8>> = tensors.iter().map(|t| &t.data).collect();
    assert_eq!(distinct.len(), tensors.len());
    write_checkpoint(&file, &tensors, None);
    // With --npy each tensor also has its .npy file next to the raw one.
    for (options, files_per_tensor) in
        [(&["--layout", "flat"][..], 1), (&["--layout", "tree"][..], 1), (&["--npy"][..], 2)]
    {
        let m = Mount::new(&file, options);
        check_hostile_mount(&m, &tensors, files_per_tensor);
    }
}

/// Peak resident memory (VmHWM) of a process, in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Writes a checkpoint whose header is about `target` bytes of JSON: `count` one-byte U8 tensors
/// with 200-byte names, plus one metadata value padding the rest. Returns the header length.
fn write_big_header(path: &Path, count: usize, target: usize) -> usize {
    let mut json = String::with_capacity(target + 1024);
    json.push('{');
    let pad = "p".repeat(190);
    for i in 0..count {
        json.push_str(&format!(
            "\"{pad}{i:010}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{i},{}]}},",
            i + 1
        ));
    }
    let filler = target.saturating_sub(json.len() + 40);
    json.push_str(&format!("\"__metadata__\":{{\"note\":\"{}\"}}}}", "m".repeat(filler)));
    let header_len = json.len().next_multiple_of(8);
    while json.len() < header_len {
        json.push(' ');
    }
    let mut bytes = Vec::with_capacity(8 + header_len + count);
    bytes.extend_from_slice(&(header_len as u64).to_le_bytes());
    bytes.extend_from_slice(json.as_bytes());
    bytes.extend((0..count).map(|i| i as u8));
    std::fs::write(path, bytes).unwrap();
    header_len
}

/// Memory the daemon may use for a header of `len` bytes: the parsed header, the namespace and the
/// rendered metadata.json each cost about the header's size, plus the process baseline.
fn memory_bound(header_len: u64) -> u64 {
    MEMORY_FACTOR * header_len + (64 << 20)
}

/// Peak memory of the daemon per byte of header: measured 7.6 with the input below, where the
/// header, its parsed metadata and metadata.json (which repeats `__metadata__` twice) all stay
/// resident (see docs/reliability.md; headers of a million tiny tensors cost far more).
const MEMORY_FACTOR: u64 = 10;

/// A debug build parses and renders a 95 MB header in about 25 s: longer than the usual timeout.
const BIG_MOUNT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

#[test]
fn header_near_the_limit_mounts_in_bounded_memory() {
    let dir = workdir();
    let file = dir.path().join("big.safetensors");
    let count = std::env::var("STFS_BIG_HEADER_TENSORS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let header_len = write_big_header(&file, count, 95_000_000) as u64;
    assert!(header_len > 94_000_000 && header_len <= stfs::format::MAX_HEADER_SIZE);
    let mp = workdir();
    let started = Instant::now();
    let child = Command::new(STFS)
        .args(["mount", file.to_str().unwrap(), mp.path().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, BIG_MOUNT_TIMEOUT);
    let m = Unmount(mp.path().to_path_buf());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mount_time = started.elapsed();
    let pid = daemon_pid(&m.0).expect("daemon pid");
    let names = std::fs::read_dir(&m.0).unwrap().count();
    assert_eq!(names, count + 3, "every tensor, metadata.json, .stfs and big.safetensors");
    let meta = std::fs::metadata(m.0.join("metadata.json")).unwrap();
    let last = format!("{}{:010}", "p".repeat(190), count - 1);
    assert_eq!(std::fs::read(m.0.join(&last)).unwrap(), vec![(count - 1) as u8]);
    let peak = peak_rss(pid);
    eprintln!(
        "header {header_len} bytes, {count} tensors: mounted in {mount_time:?}, metadata.json {} bytes, daemon VmHWM {} MiB ({:.1}x header)",
        meta.len(),
        peak >> 20,
        peak as f64 / header_len as f64
    );
    assert!(peak <= memory_bound(header_len), "daemon peak memory {peak} bytes for a {header_len}-byte header");
}

#[test]
fn header_over_the_limit_is_refused_before_reading_it() {
    // The length field alone decides: 100 MB + 8 declared, with a (sparse) file really that long.
    let dir = workdir();
    let file = dir.path().join("over.safetensors");
    let declared = stfs::format::MAX_HEADER_SIZE + 8;
    let f = std::fs::File::create(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &declared.to_le_bytes(), 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"{}", 8).unwrap();
    f.set_len(8 + declared).unwrap();
    let mp = workdir();
    for args in
        [vec!["inspect", file.to_str().unwrap()], vec!["mount", file.to_str().unwrap(), mp.path().to_str().unwrap()]]
    {
        let out = stfs(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("header") && err.contains("100000000"), "{args:?}: {err}");
        assert!(!is_mounted(mp.path()));
    }
}

/// Unmounts a path on drop (for mounts made without [`Mount`]).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}
