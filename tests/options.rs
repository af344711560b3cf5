//! Mount options as other tools treat them: a bad `-o` option is a usage error (exit 2) like a
//! bad flag, a misspelt `-o` name gets the closest option suggested, the last of a repeated `-o`
//! option wins (as in mount(8) and libfuse), sizes take decimals (`1.5G` is 1536M), and through
//! mount(8)'s helper (`mount.fuse.stfs`) a mount failure exits 32 and a usage error 1.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use stfs::format::Dtype;

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A small checkpoint and an empty mount point, in one temp directory.
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf, Vec<T>) {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = vec![T::new("w", Dtype::F32, &[1000]), T::new("b", Dtype::F16, &[77])];
    write_checkpoint(&file, &tensors, None);
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    (dir, file, mp, tensors)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `stfs mount FILE MP ARGS...` must be a usage error: exit 2, a message containing `needle`,
/// nothing mounted.
fn assert_usage_error(file: &Path, mp: &Path, args: &[&str], needle: &str) -> String {
    let mut all = vec!["mount", s(file), s(mp)];
    all.extend_from_slice(args);
    let out = stfs(&all);
    let err = stderr_of(&out);
    let mounted = is_mounted(mp);
    force_unmount(mp);
    assert!(!mounted, "{args:?} mounted something");
    assert_eq!(out.status.code(), Some(2), "{args:?} is a usage error: {err}");
    assert!(err.contains(needle), "{args:?}: expected {needle:?} in {err}");
    err
}

#[test]
fn a_bad_dash_o_option_exits_2_like_a_bad_flag() {
    let (_dir, file, mp, _) = setup();
    for (flag, option, needle) in [
        (&["--cache-size", "1Q"][..], "cache_size=1Q", "1Q"),
        (&["--bogus-opt", "1"][..], "bogus_opt=1", "bogus"),
        (&["--threads", "0"][..], "threads=0", "0"),
        (&["--block-size", "3M"][..], "block_size=3M", "3M"),
        (&["--layout", "deep"][..], "layout=deep", "deep"),
    ] {
        assert_usage_error(&file, &mp, flag, needle);
        assert_usage_error(&file, &mp, &["-o", option], needle);
    }
    assert_usage_error(&file, &mp, &["-o", "rw"], "read-only");
    assert_usage_error(&file, &mp, &["-o", "cache_size"], "needs a value");
}

#[test]
fn a_misspelt_dash_o_name_suggests_the_closest_option() {
    let (_dir, file, mp, _) = setup();
    for (typo, meant) in [
        ("cache_sise=1G", "cache_size"),
        ("cachesize=1G", "cache_size"),
        ("alow_other", "allow_other"),
        ("blocksize=64K", "block_size"),
        ("io_thread=2", "io_threads"),
        ("layuot=tree", "layout"),
    ] {
        let name = typo.split('=').next().unwrap();
        let err = assert_usage_error(&file, &mp, &["-o", typo], &format!("unknown mount option `{name}`"));
        assert!(err.contains(&format!("did you mean `{meant}`")), "{typo}: suggests {meant}: {err}");
        assert_eq!(err.lines().filter(|l| !l.trim().is_empty()).count(), 1, "one line: {err}");
    }
    // Nothing close: no suggestion.
    let err = assert_usage_error(&file, &mp, &["-o", "frobnicate=1"], "unknown mount option `frobnicate`");
    assert!(!err.contains("did you mean"), "{err}");
}

/// mount(8) and libfuse let the last of a repeated option win; stfs did the opposite.
#[test]
fn the_last_of_a_repeated_dash_o_option_wins() {
    let (_dir, file, mp, tensors) = setup();
    // The last value is invalid: refused, naming it.
    assert_usage_error(&file, &mp, &["-o", "block_size=64K,block_size=3M"], "3M");
    assert_usage_error(&file, &mp, &["-o", "block_size=64K", "-o", "block_size=3M"], "3M");
    // The last value is valid: mounted, although an earlier one was not.
    for args in [&["-o", "block_size=3M,block_size=64K"][..], &["-o", "layout=deep", "-o", "layout=flat"][..]] {
        let m = Mount::new(&file, args);
        assert_eq!(std::fs::read(m.file("w")).unwrap(), tensors[0].data, "{args:?}");
    }
}

#[test]
fn sizes_take_decimals() {
    let (_dir, file, mp, tensors) = setup();
    // 1.5G is 1536M: too small for two 1G blocks, and the message shows the size it understood.
    assert_usage_error(&file, &mp, &["--cache-size", "1.5G", "--block-size", "1G"], "cache size 1536M");
    assert_usage_error(&file, &mp, &["-o", "cache_size=1.5G,block_size=1G"], "cache size 1536M");
    assert_usage_error(&file, &mp, &["-o", "cache_size=0.75M,block_size=512K"], "cache size 768K");
    // Rounded down to whole bytes: 1.3K is 1331.2 bytes.
    assert_usage_error(&file, &mp, &["--cache-size", "1.3K"], "cache size 1331 ");
    for bad in ["1.5.2G", ".G", "1,5G", "-1.5G", "1.G"] {
        assert_usage_error(&file, &mp, &[&format!("--cache-size={bad}")], bad);
        if !bad.contains(',') {
            assert_usage_error(&file, &mp, &["-o", &format!("cache_size={bad}")], bad);
        }
    }
    let m = Mount::new(&file, &["--cache-size", "1.5M", "--block-size", "64K"]);
    assert_eq!(std::fs::read(m.file("w")).unwrap(), tensors[0].data);
    drop(m);
    let m = Mount::new(&file, &["-o", "cache_size=2.5M"]);
    assert_eq!(std::fs::read(m.file("b")).unwrap(), tensors[1].data);
}

/// mount(8)'s helper, run as it runs it: the binary under the name `mount.fuse.stfs` (a link in a
/// temp directory, the same program `stfs install-helper` links into /sbin).
fn helper(dir: &Path, args: &[&str]) -> Output {
    let link = dir.join("mount.fuse.stfs");
    if !link.exists() {
        std::os::unix::fs::symlink(STFS, &link).unwrap();
    }
    let child = Command::new(&link)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, TIMEOUT)
}

#[test]
fn through_mount8_a_failure_exits_32_and_a_usage_error_1() {
    let (dir, file, mp, tensors) = setup();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let missing = dir.path().join("missing.safetensors");
    let not_safetensors = dir.path().join("notes.txt");
    std::fs::write(&not_safetensors, "just some text, not a checkpoint\n".repeat(10)).unwrap();
    // Mount failures: mount(8)'s code 32.
    for (args, needle) in [
        (vec![s(&missing), s(&mp)], "missing.safetensors"),
        (vec![s(&not_safetensors), s(&mp)], "notes.txt"),
        (vec![s(&file), "/no/such/mount/point"], "mount point does not exist"),
        (vec!["-f", s(&missing), s(&mp)], "missing.safetensors"),
    ] {
        let out = helper(&bin, &args);
        let _unmount = Unmount(mp.clone());
        assert_eq!(out.status.code(), Some(32), "{args:?}: a mount failure: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains(needle), "{args:?}: {}", stderr_of(&out));
        assert!(!is_mounted(&mp));
    }
    // Usage errors: 1, as other helpers do.
    for args in [
        vec![s(&file)],
        vec![s(&file), s(&mp), "-o", "bogus_opt=1"],
        vec![s(&file), s(&mp), "-o", "cache_size=1Q"],
        vec![s(&file), s(&mp), "-o", "block_size=3M"],
        vec![s(&file), s(&mp), "-x"],
        vec![s(&file), s(&mp), "-t", "ext4"],
    ] {
        let out = helper(&bin, &args);
        let _unmount = Unmount(mp.clone());
        assert_eq!(out.status.code(), Some(1), "{args:?}: a usage error: {}", stderr_of(&out));
        assert!(!is_mounted(&mp));
    }
    // And success is 0, with the mount answering.
    let out = helper(&bin, &[s(&file), s(&mp), "-o", "ro,cache_size=1.5M"]);
    let _unmount = Unmount(mp.clone());
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(mp.join("w")).unwrap(), tensors[0].data);
}

/// Unmounts a path on drop.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}
