//! `stfs mount` and `stfs umount` as an unprivileged user (nobody, through setpriv), as on a desktop
//! distribution: fusermount3 installed and /dev/fuse open to every user. Unmounting goes through
//! `fusermount3 -u`; when a non-root mount cannot work, the one-line error says why and what to do.

mod common;

use std::process::{Command, Output};

use common::users::*;
use common::wedge::{listed, process_gone, run_bounded_unmount, Holder, Stopped};
use common::*;
use stfs::format::Dtype;

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One line `stfs: ...` on stderr, exit status 1.
fn assert_one_line_failure(out: &Output, what: &str) -> String {
    let err = stderr_of(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: expected one line, got {err:?}");
    assert!(err.starts_with("stfs: "), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    err
}

fn tensors() -> Vec<T> {
    vec![T::new("w", Dtype::F32, &[1000]), T::new("b", Dtype::BF16, &[33])]
}

/// Reads `path` as nobody (the mount admits only the user who made it).
fn read_as_nobody(path: &std::path::Path) -> Vec<u8> {
    let out = as_nobody("cat").arg(path).output().expect("setpriv cat");
    assert!(out.status.success(), "cat {} as nobody: {}", path.display(), stderr_of(&out));
    out.stdout
}

/// `stfs umount ARGS... MP` run as nobody, allowed 2 s.
fn umount_as_nobody(args: &[&str], mp: &std::path::Path) -> Output {
    let mut cmd = as_nobody(STFS);
    cmd.arg("umount").args(args).arg(mp);
    run_bounded_unmount(&mut cmd, &format!("stfs umount {args:?} as nobody"))
}

#[test]
fn a_user_mounts_reads_and_unmounts_through_fusermount3() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    let m = NobodyMount::new(&fixture);
    assert_eq!(read_as_nobody(&m.path.join("w")), t[0].data);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let out = umount_as_nobody(&[], &m.path);
    assert!(out.status.success(), "stfs umount as nobody: {}", stderr_of(&out));
    assert!(!listed(&m.path), "stfs umount as nobody exited 0 but the mount is still there");
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit");
}

/// Unmounts `path` when dropped (umount2, then a lazy detach), whatever the test did.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if listed(&self.0) {
            force_unmount(&self.0);
        }
    }
}

#[test]
fn a_user_is_told_a_mount_is_busy_and_detaches_it_lazily() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    let fixture = NobodyFixture::new(&tensors());
    let m = NobodyMount::new(&fixture);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let holder = Holder::open(as_nobody("sh"), &m.path.join("w"));
    let out = umount_as_nobody(&[], &m.path);
    let err = assert_one_line_failure(&out, "busy umount as nobody");
    assert!(err.contains("busy") && err.contains("--lazy"), "{err}");
    assert!(listed(&m.path), "a busy umount must leave the mount");
    let out = umount_as_nobody(&["--lazy"], &m.path);
    assert!(out.status.success(), "stfs umount --lazy as nobody: {}", stderr_of(&out));
    assert!(!listed(&m.path), "the lazy umount left the mount listed");
    drop(holder);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit after the last close");
}

#[test]
fn a_user_unmounts_a_stopped_daemon_within_2s() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    let fixture = NobodyFixture::new(&tensors());
    let m = NobodyMount::new(&fixture);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let stopped = Stopped::new(pid);
    let out = umount_as_nobody(&[], &m.path);
    assert!(out.status.success(), "stfs umount as nobody with a stopped daemon: {}", stderr_of(&out));
    assert!(!listed(&m.path), "the mount is still listed");
    drop(stopped);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit once continued");
}

#[test]
fn a_user_cannot_unmount_another_users_mount_and_root_can_unmount_a_users() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    // root's mount, on a directory nobody can reach and owns.
    let fixture = NobodyFixture::new(&tensors());
    let out = stfs(&["mount", fixture.file.to_str().unwrap(), fixture.mount_point.to_str().unwrap()]);
    let m = Unmount(fixture.mount_point.clone());
    assert!(out.status.success(), "stfs mount as root: {}", stderr_of(&out));
    let out = umount_as_nobody(&[], &m.0);
    let err = assert_one_line_failure(&out, "nobody unmounting root's mount");
    assert!(err.contains("mounted by uid 0"), "the message must say whose mount it is: {err}");
    assert!(listed(&m.0), "nobody unmounted root's mount");
    drop(m);
    // nobody's mount, unmounted by root.
    let fixture = NobodyFixture::new(&tensors());
    let m = NobodyMount::new(&fixture);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let mut cmd = Command::new(STFS);
    cmd.arg("umount").arg(&m.path);
    let out = run_bounded_unmount(&mut cmd, "root unmounting nobody's mount");
    assert!(out.status.success(), "root's stfs umount of nobody's mount: {}", stderr_of(&out));
    assert!(!listed(&m.path));
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit");
}

#[test]
fn a_user_without_access_to_dev_fuse_is_told_why_and_what_to_do() {
    if !nonroot_tools() {
        return;
    }
    let fixture = NobodyFixture::new(&tensors());
    let out = stfs_as_nobody_without(
        Missing::DevFuseAccess,
        &["mount", fixture.file.to_str().unwrap(), fixture.mount_point.to_str().unwrap()],
    );
    let err = assert_one_line_failure(&out, "mount without access to /dev/fuse");
    assert!(err.contains("no access to /dev/fuse"), "the message must say why: {err}");
    assert!(err.contains("chmod 0666 /dev/fuse"), "the message must say what to do: {err}");
    assert!(!listed(&fixture.mount_point));
}

#[test]
fn a_user_without_fusermount3_is_told_to_install_fuse3() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    let fixture = NobodyFixture::new(&tensors());
    let (source, mp) = (fixture.file.to_str().unwrap(), fixture.mount_point.to_str().unwrap());
    let out = stfs_as_nobody_without(Missing::Fusermount, &["mount", source, mp]);
    let err = assert_one_line_failure(&out, "mount without fusermount3");
    assert!(err.contains("no fusermount3"), "the message must say why: {err}");
    assert!(err.contains("install the fuse3 package"), "the message must say what to install: {err}");
    assert!(!listed(&fixture.mount_point));
    // Unmounting a user's mount needs fusermount3 too; the namespace starts with a copy of this mount.
    let m = NobodyMount::new(&fixture);
    let out = stfs_as_nobody_without(Missing::Fusermount, &["umount", mp]);
    let err = assert_one_line_failure(&out, "umount without fusermount3");
    assert!(err.contains("no fusermount3") && err.contains("install the fuse3 package"), "{err}");
    assert!(listed(&m.path), "the mount outside the namespace must be untouched");
}

#[test]
fn a_users_disk_cache_serves_blocks_and_passes_nothing_through() {
    if !nonroot_tools() {
        return;
    }
    let _dev = DevFuseOpen::new();
    let t = vec![T::new("w", Dtype::F32, &[300, 1000]), T::new("b", Dtype::BF16, &[33])];
    let fixture = NobodyFixture::new(&t);
    let cache = fixture.dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let (file, mp) = (fixture.file.to_str().unwrap(), fixture.mount_point.to_str().unwrap());
    let load = |nth: &str| -> serde_json::Value {
        let out = stfs_as_nobody(&["mount", file, mp, "--cache-dir", cache.to_str().unwrap()]);
        let m = Unmount(fixture.mount_point.clone());
        assert!(out.status.success(), "{nth} mount as nobody: {}", stderr_of(&out));
        let pid = daemon_pid(&m.0).expect("daemon pid");
        assert_eq!(read_as_nobody(&m.0.join("w")), t[0].data);
        let stats = serde_json::from_slice(&read_as_nobody(&m.0.join(".stfs/stats.json"))).unwrap();
        let out = umount_as_nobody(&[], &m.0);
        assert!(out.status.success(), "stfs umount as nobody: {}", stderr_of(&out));
        assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit");
        stats
    };
    let first = load("first");
    assert_eq!(first["passthrough_opens"], 0, "{first}");
    // The second load reads the blocks from disk; without root nothing is passed to the kernel
    // and no whole-tensor file is kept.
    let second = load("second");
    assert_eq!((second["passthrough_opens"].as_u64(), second["backing_reads"].as_u64()), (Some(0), Some(0)));
    assert!(second["disk_cache_hits"].as_u64() > Some(0), "{second}");
    assert!(!cache.join("extents").exists(), "extent files written without passthrough");
}
