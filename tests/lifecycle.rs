//! A mount's lifecycle next to other mounts at its mount point, as root: a signal to the daemon
//! unmounts its own mount and nothing else (not a tmpfs mounted over it, not a newer mount made
//! after `stfs umount -l`), and finds its mount where it is now (under a renamed parent); of
//! `stfs mount` runs racing on one mount point, exactly one succeeds and one mount stays.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::wedge::{mount_entry, mounts, process_gone, Holder};
use common::*;

/// `stfs mount FILE MP`, which must succeed; returns the pid of the daemon it started.
fn mount(file: &Path, mp: &Path) -> i32 {
    let before = daemon_pids(mp);
    let out = stfs(&["mount", file.to_str().unwrap(), mp.to_str().unwrap()]);
    assert!(out.status.success(), "stfs mount: {}", String::from_utf8_lossy(&out.stderr));
    daemon_pids(mp).into_iter().find(|pid| !before.contains(pid)).expect("the new daemon's pid")
}

fn terminate(pid: i32) {
    // SAFETY: signalling a daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM {pid}");
}

/// The filesystem types mounted at `path`, bottom up, from mountinfo alone.
fn stacked(path: &Path) -> Vec<String> {
    let want = std::fs::canonicalize(path.parent().unwrap()).unwrap().join(path.file_name().unwrap());
    mounts().into_iter().filter(|m| m.mount_point == want).map(|m| m.fs_type).collect()
}

#[test]
fn sigterm_leaves_a_tmpfs_mounted_over_the_mount_alone() {
    let (dir, file, _) = one_tensor_checkpoint();
    let mp = dir.path().join("m");
    std::fs::create_dir(&mp).unwrap();
    let _guard = DetachAll(vec![mp.clone()]);
    let pid = mount(&file, &mp);
    mount_tmpfs(&mp);
    std::fs::write(mp.join("keep"), b"still here").unwrap();
    terminate(pid);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not stop on SIGTERM");
    assert_eq!(stacked(&mp), ["fuse.stfs", "tmpfs"], "SIGTERM must unmount nothing but the daemon's own mount");
    assert_eq!(std::fs::read(mp.join("keep")).unwrap(), b"still here");
}

#[test]
fn sigterm_to_a_lazily_unmounted_daemon_leaves_the_newer_mount_alone() {
    let (dir, file, tensor) = one_tensor_checkpoint();
    let mp = dir.path().join("m");
    std::fs::create_dir(&mp).unwrap();
    let _guard = DetachAll(vec![mp.clone()]);
    let old = mount(&file, &mp);
    let holder = Holder::open(Command::new("sh"), &mp.join("w"));
    let out = stfs(&["umount", "-l", mp.to_str().unwrap()]);
    assert!(out.status.success(), "stfs umount -l: {}", String::from_utf8_lossy(&out.stderr));
    let new = mount(&file, &mp);
    terminate(old);
    assert!(wait_until(TIMEOUT, || process_gone(old)), "the old daemon did not stop on SIGTERM");
    assert_eq!(stacked(&mp), ["fuse.stfs"], "SIGTERM to the old daemon unmounted the newer mount");
    assert!(!process_gone(new), "the newer mount's daemon is gone");
    assert_eq!(std::fs::read(mp.join("w")).unwrap(), tensor.data);
    drop(holder);
    let out = unmount_retrying(|| stfs(&["umount", mp.to_str().unwrap()]));
    assert!(out.status.success(), "stfs umount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(TIMEOUT, || process_gone(new)), "the newer daemon did not exit after stfs umount");
}

#[test]
fn sigterm_unmounts_the_mount_where_a_renamed_parent_moved_it() {
    let (dir, file, _) = one_tensor_checkpoint();
    let (before, after) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(before.join("m")).unwrap();
    let _guard = DetachAll(vec![before.join("m"), after.join("m")]);
    let pid = mount(&file, &before.join("m"));
    std::fs::rename(&before, &after).unwrap();
    terminate(pid);
    assert!(wait_until(TIMEOUT, || mount_entry(&after.join("m")).is_none()), "SIGTERM left the moved mount");
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit");
}

#[test]
fn of_concurrent_mounts_on_one_mount_point_exactly_one_succeeds() {
    const RUNS: usize = 4;
    const ROUNDS: usize = 5;
    let (dir, file, tensor) = one_tensor_checkpoint();
    for round in 0..ROUNDS {
        let mp = dir.path().join(format!("m{round}"));
        std::fs::create_dir(&mp).unwrap();
        let _guard = DetachAll(vec![mp.clone()]);
        let runs: Vec<_> = (0..RUNS)
            .map(|_| {
                let mut command = Command::new(STFS);
                command.arg("mount").arg(&file).arg(&mp).stdin(Stdio::null()).stdout(Stdio::piped());
                command.stderr(Stdio::piped()).spawn().expect("spawn stfs mount")
            })
            .collect();
        let outs: Vec<Output> = runs.into_iter().map(|run| wait_output(run, TIMEOUT)).collect();
        let mounted = stacked(&mp);
        let succeeded = outs.iter().filter(|out| out.status.success()).count();
        assert_eq!(succeeded, 1, "round {round}: {succeeded} of {RUNS} mounts succeeded; mounted there: {mounted:?}");
        let refusal = format!("stfs: {}: something is already mounted there\n", mp.display());
        for out in outs.iter().filter(|out| !out.status.success()) {
            assert_eq!(String::from_utf8_lossy(&out.stderr), refusal, "round {round}");
        }
        assert_eq!(mounted, ["fuse.stfs"], "round {round}");
        assert_eq!(std::fs::read(mp.join("w")).unwrap(), tensor.data);
        let out = unmount_retrying(|| stfs(&["umount", mp.to_str().unwrap()]));
        assert!(out.status.success(), "stfs umount: {}", String::from_utf8_lossy(&out.stderr));
        assert!(wait_until(TIMEOUT, || daemon_pids(&mp).is_empty()), "round {round}: a daemon did not exit");
    }
}
