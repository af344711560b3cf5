//! Real mounts with the conventions other FUSE tools have (issue 15, item 9): `-o uid=,gid=,umask=,
//! fmask=,dmask=`, `allow_root`, `-d`/`--debug` and `--read-only`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use stfs::format::Dtype;

fn checkpoint(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("m.safetensors");
    write_checkpoint(&file, &[T::new("a.w", Dtype::F32, &[8]), T::new("b", Dtype::U8, &[3])], None);
    file
}

fn mode(path: &Path) -> (u32, u32, u32) {
    let m = std::fs::metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

#[test]
fn uid_gid_and_masks_set_owner_and_modes() {
    let dir = workdir();
    let file = checkpoint(dir.path());
    let m = Mount::new(&file, &["-o", "uid=1234,gid=5678,umask=027", "--read-only", "--layout", "tree"]);
    for name in ["b", "metadata.json", "a/w"] {
        assert_eq!(mode(&m.file(name)), (1234, 5678, 0o440), "{name}");
    }
    for name in ["", "a", ".stfs"] {
        assert_eq!(mode(&m.file(name)), (1234, 5678, 0o550), "{name:?}");
    }
    drop(m);
    // fmask and dmask each override umask for their kind.
    let m = Mount::new(&file, &["-o", "umask=0222,fmask=0077,ro"]);
    assert_eq!(mode(&m.file("b")).2, 0o400);
    assert_eq!(mode(&m.path).2, 0o555);
}

#[test]
fn allow_root_lets_root_in_but_not_other_users() {
    let dir = workdir();
    let file = checkpoint(dir.path());
    if not_root("to mount and to switch to another user") {
        return;
    }
    let read_as_nobody = |path: &Path| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    if Command::new("setpriv").arg("--version").output().is_err() {
        return tool_missing("setpriv", "apt-get install util-linux");
    }
    // The file's mode lets everyone read; only the session's ACL keeps others out.
    let m = Mount::new(&file, &["-o", "allow_root"]);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo.lines().find(|l| l.split(' ').nth(4) == m.path.to_str()).unwrap();
    assert!(line.contains("allow_other"), "{line}");
    assert_eq!(std::fs::read(m.file("b")).unwrap().len(), 3);
    // As with libfuse's allow_root, the daemon refuses others' lookups; a name root has just looked
    // up may be served from the kernel's caches, so try one root has not touched.
    let out = read_as_nobody(&m.file("a.w"));
    assert!(!out.status.success(), "another user read an allow_root mount");
    drop(m);
    let m = Mount::new(&file, &["--allow-other"]);
    let out = read_as_nobody(&m.file("a.w"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Kills the foreground daemon and unmounts, whatever happened.
struct Foreground {
    child: std::process::Child,
    mp: std::path::PathBuf,
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        force_unmount(&self.mp);
    }
}

#[test]
fn debug_stays_in_the_foreground_and_logs_debug_lines() {
    let dir = workdir();
    let file = checkpoint(dir.path());
    let mp = dir.path().join("m");
    std::fs::create_dir(&mp).unwrap();
    let log = dir.path().join("stderr");
    let child = Command::new(STFS)
        .args(["mount", "-d"])
        .arg(&file)
        .arg(&mp)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut fg = Foreground { child, mp: mp.clone() };
    assert!(wait_until(TIMEOUT, || is_mounted(&mp)), "stfs mount -d did not mount");
    // In the foreground: the command we started is the one serving.
    assert!(fg.child.try_wait().unwrap().is_none(), "stfs mount -d exited while mounted");
    assert_eq!(std::fs::read(mp.join("b")).unwrap().len(), 3);
    let out = unmount_retrying(|| stfs(&["umount", mp.to_str().unwrap()]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(TIMEOUT, || fg.child.try_wait().unwrap().is_some()), "the daemon did not exit");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("DEBUG"), "no debug line in:\n{text}");
}
