//! Serving without privilege (issue 46, item 1): a `/dev/fuse` descriptor mounted by root and served
//! as `stfs mount SOURCE /dev/fd/N` by nobody with no capability and `no_new_privs` (the library's
//! `premount` and `spawn_server`, as a CSI plugin calls them); `stfs mount --drop-privileges USER`
//! and mount(8)'s `-o drop_privileges`; and bad descriptors refused in one line. Every mount is real,
//! and the serving process's /proc/PID/status is read to show what it may do.

mod common;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::users::{NobodyFixture, NOBODY};
use common::wedge::process_gone;
use common::*;
use stfs::format::Dtype;
use stfs::mount::premount::{premount, spawn_server, PremountOptions, ServerSpawn};
use stfs::mount::privileges::Identity;

fn tensors() -> Vec<T> {
    vec![T::new("w", Dtype::F32, &[5000]), T::new("b", Dtype::BF16, &[333]), T::new("i", Dtype::I64, &[77])]
}

/// Unmounts the mount point when dropped (umount2, then a lazy detach), whatever the test did.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

/// Every tensor file and the re-served checkpoint file read through `mp` equal the fixture's bytes.
fn assert_bytes_equal(mp: &Path, fixture: &NobodyFixture, tensors: &[T]) {
    for t in tensors {
        assert_eq!(std::fs::read(mp.join(&t.name)).unwrap(), t.data, "tensor {}", t.name);
    }
    let original = std::fs::read(&fixture.file).unwrap();
    assert_eq!(std::fs::read(mp.join("model.safetensors")).unwrap(), original, "the re-served checkpoint file");
}

/// The fields of /proc/PID/status that say what a process may do.
struct Privileges {
    uid: String,
    cap_eff: String,
    cap_bnd: String,
    no_new_privs: String,
}

fn privileges_of(pid: i32) -> Privileges {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {status}"));
        line[name.len()..].split_whitespace().collect::<Vec<_>>().join(" ")
    };
    Privileges {
        uid: field("Uid:"),
        cap_eff: field("CapEff:"),
        cap_bnd: field("CapBnd:"),
        no_new_privs: field("NoNewPrivs:"),
    }
}

/// The one stfs daemon whose command line names `named`.
fn the_daemon(named: &Path) -> i32 {
    let mut pids = Vec::new();
    assert!(wait_until(TIMEOUT, || {
        pids = daemon_pids(named);
        pids.len() == 1
    }));
    pids[0]
}

fn assert_unprivileged(pid: i32, uid: u32) {
    let p = privileges_of(pid);
    assert_eq!(p.uid, format!("{uid} {uid} {uid} {uid}"), "the server's uids");
    assert_eq!(p.cap_eff, "0000000000000000", "the server's effective capabilities");
    assert_eq!(p.cap_bnd, "0000000000000000", "the server's bounding set");
    assert_eq!(p.no_new_privs, "1", "the server's no_new_privs");
}

#[test]
fn root_mounts_and_nobody_serves_the_descriptor_without_any_capability() {
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    let mp = fixture.mount_point.clone();
    let options = PremountOptions {
        fsname: fixture.file.display().to_string(),
        uid: NOBODY,
        gid: NOBODY,
        allow_other: true,
        default_permissions: true,
    };
    let device = premount(&mp, &options).expect("premount");
    let _guard = Unmount(mp.clone());
    let entry = common::wedge::mount_entry(&mp).expect("the premount is listed");
    assert_eq!(entry.fs_type, "fuse.stfs");
    for option in ["user_id=65534", "group_id=65534", "allow_other", "default_permissions"] {
        assert!(entry.options.split(',').any(|o| o == option), "{option} in {entry:?}");
    }
    let spawn = ServerSpawn {
        program: STFS.into(),
        source: fixture.file.clone().into(),
        args: vec!["-o".into(), "allow_other".into()],
        device: &device,
        identity: Identity { uid: NOBODY, gid: NOBODY, groups: Vec::new() },
        env: vec![(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))],
        timeout: TIMEOUT,
    };
    spawn_server(&spawn).expect("the server starts");
    drop(device);
    assert_bytes_equal(&mp, &fixture, &t);
    let pid = the_daemon(&fixture.file);
    assert_unprivileged(pid, NOBODY);
    // The server ends with its connection: root unmounts, and it exits.
    force_unmount(&mp);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the server did not exit after the unmount");
}

/// A failing server gives its own one line back; nothing is left waiting.
#[test]
fn a_server_that_cannot_read_the_checkpoint_says_why() {
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    std::fs::set_permissions(&fixture.file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mp = fixture.mount_point.clone();
    let options = PremountOptions {
        fsname: "m".into(),
        uid: NOBODY,
        gid: NOBODY,
        allow_other: false,
        default_permissions: false,
    };
    let device = premount(&mp, &options).expect("premount");
    let _guard = Unmount(mp.clone());
    let spawn = ServerSpawn {
        program: STFS.into(),
        source: fixture.file.clone().into(),
        args: Vec::new(),
        device: &device,
        identity: Identity { uid: NOBODY, gid: NOBODY, groups: Vec::new() },
        env: Vec::new(),
        timeout: TIMEOUT,
    };
    let e = spawn_server(&spawn).unwrap_err().to_string();
    assert!(e.contains(fixture.file.to_str().unwrap()) && e.contains("permission denied"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

fn run_stfs(args: &[&str]) -> Output {
    let child = Command::new(STFS)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stfs");
    wait_output(child, TIMEOUT)
}

#[test]
fn drop_privileges_mounts_as_root_and_serves_as_the_user() {
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    let mp = fixture.mount_point.clone();
    let (file, at) = (fixture.file.to_str().unwrap(), mp.to_str().unwrap());
    let out = run_stfs(&["mount", "--drop-privileges", "nobody", "-o", "allow_other", file, at]);
    let _guard = Unmount(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_bytes_equal(&mp, &fixture, &t);
    let pid = the_daemon(&mp);
    assert_unprivileged(pid, NOBODY);
    let entry = common::wedge::mount_entry(&mp).unwrap();
    assert!(entry.options.split(',').any(|o| o == "user_id=65534"), "{entry:?}");
    // Root unmounts it as any stfs mount; the daemon exits with its connection.
    let out = run_stfs(&["umount", at]);
    assert!(out.status.success(), "stfs umount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit after the unmount");
}

/// fuse3's mount.fuse form (`stfs SOURCE MP -o OPTS`, as `mount -t fuse.stfs` runs it): root's uid
/// is kept, every capability goes, as mount.fuse3's own `drop_privileges` does.
#[test]
fn the_mount_helper_drop_privileges_option_keeps_root_without_capabilities() {
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    let mp = fixture.mount_point.clone();
    let out = run_stfs(&[fixture.file.to_str().unwrap(), mp.to_str().unwrap(), "-o", "rw,drop_privileges"]);
    let _guard = Unmount(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_bytes_equal(&mp, &fixture, &t);
    assert_unprivileged(the_daemon(&mp), 0);
}

#[test]
fn a_failed_drop_privileges_leaves_nothing_mounted() {
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    std::fs::set_permissions(&fixture.file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mp = fixture.mount_point.clone();
    let out = run_stfs(&["mount", "--drop-privileges", "nobody", fixture.file.to_str().unwrap(), mp.to_str().unwrap()]);
    let _guard = Unmount(mp.clone());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(!common::wedge::listed(&mp), "the mount made for the daemon is still there");
    for (args, needle) in [
        (&["--drop-privileges", "no-such-user-stfs"][..], "no user `no-such-user-stfs`"),
        (&["--drop-privileges", "nobody", "-f"][..], "does not go with -f"),
        (&["--drop-privileges", "nobody", "--auto-unmount"][..], "--auto-unmount does not apply"),
    ] {
        let mut all = vec!["mount"];
        all.extend(args);
        all.extend([fixture.file.to_str().unwrap(), mp.to_str().unwrap()]);
        let out = run_stfs(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.lines().count() == 1 && err.contains(needle), "{args:?}: {err}");
        assert!(!common::wedge::listed(&mp), "{args:?} left a mount");
    }
}

/// `stfs mount SOURCE /dev/fd/N` with N holding something that cannot be served: one line each.
#[test]
fn a_descriptor_that_cannot_be_served_is_one_line() {
    let (_dir, file, _) = one_tensor_checkpoint();
    let file = file.to_str().unwrap();
    for (open, mountpoint, needle) in [
        ("", "/dev/fd/97", "descriptor 97 is not open"),
        ("exec 7</dev/null;", "/dev/fd/7", "descriptor 7 is not /dev/fuse"),
        ("exec 7<>/dev/fuse;", "/proc/self/fd/7", "descriptor 7 is /dev/fuse but not mounted"),
    ] {
        let script = format!("{open} exec \"$0\" mount \"$1\" {mountpoint}");
        let child = Command::new("sh")
            .args(["-c", &script, STFS, file])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(child, TIMEOUT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mountpoint}: {err}");
        assert_eq!(err.lines().count(), 1, "{mountpoint}: {err}");
        assert!(err.starts_with(&format!("stfs: {mountpoint}: {needle}")), "{mountpoint}: {err}");
    }
    let out = run_stfs(&["mount", "--auto-unmount", file, "/dev/fd/1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--auto-unmount does not apply"), "{err}");
}
