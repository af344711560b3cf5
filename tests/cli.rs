//! The command line: exit codes, one-line errors naming the file, nothing left mounted, recovery.

mod common;

use std::path::Path;

use common::*;
use stfs::format::Dtype;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A bad input must give exit 1, exactly one `stfs: PATH: ...` line containing `needle`, and no mount.
fn assert_refused(source: &Path, needle: &str) {
    let mp = workdir();
    for args in [
        vec!["inspect", source.to_str().unwrap()],
        vec!["mount", source.to_str().unwrap(), mp.path().to_str().unwrap()],
    ] {
        let out = stfs(&args);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: expected one line, got {err:?}");
        assert!(err.starts_with(&format!("stfs: {}: ", source.display())), "{args:?}: {err}");
        assert!(err.to_lowercase().contains(needle), "{args:?}: expected {needle:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!is_mounted(mp.path()), "{args:?} left a mount behind");
    }
}

#[test]
fn every_corpus_file_is_refused_with_its_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let expected: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(root.join("expected.json")).unwrap()).unwrap();
    assert!(expected.len() >= 40, "corpus has {} files", expected.len());
    for (file, needle) in &expected {
        assert_refused(&root.join("bad").join(file), &needle.as_str().unwrap().to_lowercase());
    }
}

#[test]
fn non_files_are_refused() {
    let dir = workdir();
    assert_refused(dir.path(), "directory");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    assert_refused(&fifo, "not a regular file");
    assert_refused(&dir.path().join("missing.safetensors"), "no such file");
}

#[test]
fn unreadable_file_is_refused_for_a_non_root_user() {
    // As root every file is readable; check permission errors by dropping to nobody in a child.
    let dir = workdir();
    let file = dir.path().join("secret.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::F32, &[4])], None);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", STFS, "inspect"])
        .arg(&file)
        .output();
    let Ok(out) = out else { return tool_missing("setpriv", "apt-get install util-linux") };
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("permission denied"), "{}", stderr_of(&out));
}

#[test]
fn bad_mount_points_are_clear_errors() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::F32, &[4])], None);
    let f = file.to_str().unwrap();
    let missing = dir.path().join("nope");
    let out = stfs(&["mount", f, missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("mount point does not exist"), "{}", stderr_of(&out));
    let out = stfs(&["mount", f, f]);
    assert!(stderr_of(&out).contains("not a directory"), "{}", stderr_of(&out));
    let m = Mount::new(&file, &[]);
    let out = stfs(&["mount", f, m.path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("already mounted"), "{}", stderr_of(&out));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["mount", "--bogus", "a", "b"][..],
        &["frobnicate"][..],
        &["mount", "a"][..],
        &["mount", "--cache-size", "lots", "a", "b"][..],
    ] {
        let out = stfs(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr_of(&out));
    }
    // A bad `-o` option is a usage error too (tests/options.rs has the rest).
    let out = stfs(&["mount", "-o", "bogus_opt=1", "a", "b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("unknown mount option `bogus_opt`"));
    let out = stfs(&["--version"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn inspect_prints_the_table_and_json() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &mixed_tensors(), None);
    let out = stfs(&["inspect", file.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("model.layers.0.mlp.weight") && text.contains("BF16") && text.contains("[257, 333]"),
        "{text}"
    );
    assert!(text.contains(&format!("{} tensors", mixed_tensors().len())));
    let out = stfs(&["inspect", "--json", file.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["tensors"]["scale"]["shape"], serde_json::json!([]));
}

/// A full stdout (`/dev/full`) fails `inspect` and `cat` alike with one worded line, exit 1;
/// `inspect` used to print std's `No space left on device (os error 28)`.
#[test]
fn a_full_stdout_is_one_worded_line() {
    let (_dir, file, _) = one_tensor_checkpoint();
    for args in [&["inspect"][..], &["inspect", "--json"], &["cat"]] {
        let mut command = std::process::Command::new(STFS);
        command.args(args).arg(&file);
        if args == ["cat"] {
            command.arg("w");
        }
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let child = command.stdout(full).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let out = wait_output(child, TIMEOUT);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(stderr_of(&out), "stfs: writing to stdout: no space left on device\n", "{args:?}");
    }
}

/// `stfs umount` of another filesystem names its type and source from mountinfo, which its
/// mounter chose (any user may name a FUSE mount's source): an escape sequence there is shown
/// escaped, never sent to the terminal.
#[test]
fn umount_of_a_foreign_mount_escapes_its_source() {
    let dir = workdir();
    let mp = dir.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let _detach = DetachAll(vec![mp.clone()]);
    let c = |s: &[u8]| std::ffi::CString::new(s).unwrap();
    let (source, target, fs_type) = (c(b"ev\x1b[31mil"), c(mp.as_os_str().as_encoded_bytes()), c(b"tmpfs"));
    // SAFETY: every pointer is a valid NUL-terminated string (or null) that outlives the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fs_type.as_ptr(), 0, std::ptr::null()) };
    assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
    let out = stfs(&["umount", mp.to_str().unwrap()]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains('\x1b'), "{err:?}");
    assert!(err.contains("(source ev\\u{1b}[31mil)"), "{err}");
    assert!(is_mounted(&mp), "the foreign mount is left alone");
}

#[test]
fn killed_daemon_leaves_a_stale_mount_that_umount_clears() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    let tensors = [T::new("w", Dtype::F32, &[1000])];
    write_checkpoint(&file, &tensors, None);
    let m = Mount::new(&file, &[]);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    // SAFETY: sending a signal to a process we started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        wait_until(TIMEOUT, || std::fs::read_dir(&m.path).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN))
    );
    assert!(stfs::mount::mountpoint::is_stale(&m.path));
    // Mounting on it again names the problem.
    let out = stfs(&["mount", file.to_str().unwrap(), m.path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("stale"), "{}", stderr_of(&out));
    let out = unmount_retrying(|| stfs(&["umount", m.path.to_str().unwrap()]));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(!is_mounted(&m.path));
    // And a new mount on the same directory works.
    let out = stfs(&["mount", file.to_str().unwrap(), m.path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(m.path.join("w")).unwrap(), tensors[0].data);
}

#[test]
fn sigterm_unmounts_cleanly() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::F32, &[10])], None);
    let m = Mount::new(&file, &[]);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    // SAFETY: signalling our own daemon.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(wait_until(TIMEOUT, || !is_mounted(&m.path)), "SIGTERM did not unmount");
    assert!(wait_until(TIMEOUT, || !Path::new(&format!("/proc/{pid}")).exists()), "daemon did not exit");
}

#[test]
fn foreground_mount_serves_until_interrupted() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    let tensors = [T::new("w", Dtype::F32, &[10])];
    write_checkpoint(&file, &tensors, None);
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let child = std::process::Command::new(STFS)
        .args(["mount", "-f", file.to_str().unwrap(), mp.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let guard_mp = mp.clone();
    let _cleanup = scopeguard(move || force_unmount(&guard_mp));
    assert!(wait_until(TIMEOUT, || is_mounted(&mp)), "foreground mount never appeared");
    assert_eq!(std::fs::read(mp.join("w")).unwrap(), tensors[0].data);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = wait_output(child, TIMEOUT);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(!is_mounted(&mp));
}

/// Runs `f` on drop (a minimal scope guard for cleanup in tests).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct G<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for G<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f()
            }
        }
    }
    G(Some(f))
}

/// An argument that is not UTF-8 (a checkpoint path in Latin-1) is one usage line naming it, its
/// bytes escaped, exit 2: clap's own message named no argument and ran to several lines. A mount
/// point is a path of any bytes and still mounts.
#[test]
fn an_argument_that_is_not_utf8_is_one_line_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    let (dir, file, t) = one_tensor_checkpoint();
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9\x1b[31m.safetensors"));
    std::fs::copy(&file, &odd).unwrap();
    for command in ["inspect", "mount"] {
        let mut cmd = std::process::Command::new(STFS);
        cmd.arg(command).arg(&odd);
        if command == "mount" {
            cmd.arg(dir.path());
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        assert_eq!(err.lines().count(), 1, "{command}: {err}");
        assert!(err.starts_with("stfs: ") && err.contains("caf\\xe9\\x1b[31m.safetensors: not UTF-8"), "{err}");
        assert!(!err.contains('\x1b'), "{err:?}");
    }
    let mp = dir.path().join(std::ffi::OsStr::from_bytes(b"mp-\xe9"));
    std::fs::create_dir(&mp).unwrap();
    let _detach = DetachAll(vec![mp.clone()]);
    let out = std::process::Command::new(STFS).arg("mount").arg(&file).arg(&mp).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mp.join(&t.name)).unwrap(), t.data);
    let out = std::process::Command::new(STFS).arg("umount").arg(&mp).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `stfs mount-info PATH`: what is mounted there, from mountinfo alone, as one JSON line (the Python
/// package's one reading of mountinfo): an stfs mount, another filesystem, nothing, a missing path.
#[test]
fn mount_info_says_what_is_mounted_at_a_path() {
    let info = |path: &std::path::Path| {
        let out = stfs(&["mount-info", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (_dir, file, _) = one_tensor_checkpoint();
    let m = Mount::new(&file, &[]);
    let v = info(&m.path);
    assert_eq!((v["mounted"].as_bool(), v["stfs"].as_bool()), (Some(true), Some(true)), "{v}");
    assert_eq!(v["fs_type"], "fuse.stfs");
    assert_eq!(v["source"], file.to_str().unwrap());
    let v = info(std::path::Path::new("/proc"));
    assert_eq!(
        (v["mounted"].as_bool(), v["stfs"].as_bool(), v["fs_type"].as_str()),
        (Some(true), Some(false), Some("proc"))
    );
    let plain = workdir();
    let v = info(plain.path());
    assert_eq!((v["mounted"].as_bool(), v["fs_type"].is_null()), (Some(false), true), "{v}");
    let v = info(&plain.path().join("no/such"));
    assert_eq!(v["mounted"].as_bool(), Some(false), "{v}");
}

/// In the background, a source named by a relative path is opened in the caller's directory (the
/// daemon opens it after the fork, and leaves that directory only then), and a missing one is
/// refused in one line naming it as given, exit 1, nothing mounted.
#[test]
fn a_relative_source_is_opened_and_named_as_given_in_the_background() {
    let (dir, path, t) = one_tensor_checkpoint();
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let mp = workdir();
    let mount = |source: &str| {
        let mut command = std::process::Command::new(STFS);
        command.current_dir(dir.path()).args(["mount", source, mp.path().to_str().unwrap()]);
        command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        wait_output(command.spawn().unwrap(), TIMEOUT)
    };
    let out = mount("missing.safetensors");
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("stfs: missing.safetensors: "), "{err}");
    assert!(!is_mounted(mp.path()));
    let out = mount(&name);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let read = std::fs::read(mp.path().join(&t.name));
    force_unmount(mp.path());
    assert!(read.unwrap() == t.data, "{} differs", t.name);
}
