//! Serving without privilege (issue 46, item 1): a `/dev/fuse` descriptor mounted by root and served
//! as `stfs mount SOURCE /dev/fd/N` by nobody with no capability and `no_new_privs` (the library's
//! `premount` and `spawn_server`, as a CSI plugin calls them); `stfs mount --drop-privileges USER`
//! and mount(8)'s `-o drop_privileges`; a "pod" (its own mount namespace, no /dev/fuse, nobody with
//! no capability) mounting through a fusermount3 proxy; and bad descriptors refused in one line.
//! Every mount is real, and the serving process's /proc/PID/status is read to show what it may do.

mod common;

use std::ffi::OsString;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::users::{NobodyFixture, NOBODY};
use common::wedge::process_gone;
use common::*;
use stfs::format::Dtype;
use stfs::mount::premount::{premount, spawn_server, PremountOptions, ServerSpawn, SpawnError};
use stfs::mount::privileges::Identity;

fn tensors() -> Vec<T> {
    vec![T::new("w", Dtype::F32, &[5000]), T::new("b", Dtype::BF16, &[333]), T::new("i", Dtype::I64, &[77])]
}

/// The tests' checkpoint, laid out for nobody, and its tensors; `None` (the test returns) when this
/// is not root, who alone can mount for another user.
fn root_and_nobody_fixture() -> Option<(Vec<T>, NobodyFixture)> {
    if not_root("mounting for another user") {
        return None;
    }
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    Some((t, fixture))
}

/// The fixture's checkpoint made unreadable to nobody (mode 0600, owned by root).
fn hide_checkpoint_from_nobody(fixture: &NobodyFixture) {
    std::fs::set_permissions(&fixture.file, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `premount` of the fixture's mount point for nobody, with a guard that unmounts it.
fn premount_for_nobody(
    fixture: &NobodyFixture,
    fsname: String,
    allow_other: bool,
) -> (std::os::fd::OwnedFd, UnmountOnDrop) {
    let options = PremountOptions { fsname, uid: NOBODY, gid: NOBODY, allow_other, default_permissions: allow_other };
    let device = premount(&fixture.mount_point, &options).expect("premount");
    (device, UnmountOnDrop(fixture.mount_point.clone()))
}

/// `spawn_server` of the fixture's checkpoint on `device`, served by nobody.
fn serve_as_nobody(
    fixture: &NobodyFixture,
    device: &std::os::fd::OwnedFd,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
) -> Result<(), SpawnError> {
    spawn_server(&ServerSpawn {
        program: STFS.into(),
        source: fixture.file.clone().into(),
        args,
        device,
        identity: Identity { uid: NOBODY, gid: NOBODY, groups: Vec::new() },
        env,
        timeout: TIMEOUT,
        cgroup: None,
    })
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

/// The one stfs daemon whose command line names `named` (a mount point, or a source given on it),
/// or whose `STFS_SOURCE` is `named` (spawn_server keeps the source off the command line).
fn the_daemon(named: &Path) -> i32 {
    let want = format!("STFS_SOURCE={}", named.display()).into_bytes();
    let serving = || -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == want))
            })
            .collect()
    };
    let mut pids = Vec::new();
    assert!(wait_until(TIMEOUT, || {
        let by_command_line = daemon_pids(named);
        pids = serving().into_iter().filter(|p| !by_command_line.contains(p)).collect();
        pids.extend(by_command_line);
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

/// Every descriptor on /dev/fuse that process `pid` holds is close-on-exec: no helper the daemon
/// runs (gcloud, a credential process) inherits the FUSE connection.
fn assert_fuse_descriptors_close_on_exec(pid: i32) {
    let mut fuse_fds = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if target != Path::new("/dev/fuse") {
            continue;
        }
        fuse_fds += 1;
        let fd = entry.file_name().into_string().unwrap();
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).expect("flags in fdinfo").trim();
        let flags = u32::from_str_radix(flags, 8).unwrap();
        assert_ne!(flags & libc::O_CLOEXEC as u32, 0, "descriptor {fd} of the daemon on /dev/fuse: {info}");
    }
    assert!(fuse_fds > 0, "the daemon holds /dev/fuse");
}

#[test]
fn root_mounts_and_nobody_serves_the_descriptor_without_any_capability() {
    let Some((t, fixture)) = root_and_nobody_fixture() else { return };
    let mp = fixture.mount_point.clone();
    let (device, _guard) = premount_for_nobody(&fixture, fixture.file.display().to_string(), true);
    let entry = common::wedge::mount_entry(&mp).expect("the premount is listed");
    assert_eq!(entry.fs_type, "fuse.stfs");
    for option in ["user_id=65534", "group_id=65534", "allow_other", "default_permissions"] {
        assert!(entry.options.split(',').any(|o| o == option), "{option} in {entry:?}");
    }
    let path = vec![(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
    serve_as_nobody(&fixture, &device, vec!["-o".into(), "allow_other".into()], path).expect("the server starts");
    drop(device);
    assert_bytes_equal(&mp, &fixture, &t);
    let pid = the_daemon(&fixture.file);
    assert_unprivileged(pid, NOBODY);
    assert_fuse_descriptors_close_on_exec(pid);
    // The server ends with its connection: root unmounts, and it exits.
    force_unmount(&mp);
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the server did not exit after the unmount");
}

/// A failing server gives its own one line back; nothing is left waiting.
#[test]
fn a_server_that_cannot_read_the_checkpoint_says_why() {
    let Some((_, fixture)) = root_and_nobody_fixture() else { return };
    hide_checkpoint_from_nobody(&fixture);
    let (device, _guard) = premount_for_nobody(&fixture, "m".into(), false);
    let e = serve_as_nobody(&fixture, &device, Vec::new(), Vec::new()).unwrap_err().to_string();
    assert!(e.contains(fixture.file.to_str().unwrap()) && e.contains("permission denied"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn drop_privileges_mounts_as_root_and_serves_as_the_user() {
    let Some((t, fixture)) = root_and_nobody_fixture() else { return };
    let mp = fixture.mount_point.clone();
    let (file, at) = (fixture.file.to_str().unwrap(), mp.to_str().unwrap());
    let out = stfs(&["mount", "--drop-privileges", "nobody", "-o", "allow_other", file, at]);
    let _guard = UnmountOnDrop(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_bytes_equal(&mp, &fixture, &t);
    let pid = the_daemon(&mp);
    assert_unprivileged(pid, NOBODY);
    let entry = common::wedge::mount_entry(&mp).unwrap();
    assert!(entry.options.split(',').any(|o| o == "user_id=65534"), "{entry:?}");
    // Root unmounts it as any stfs mount; the daemon exits with its connection.
    let out = stfs(&["umount", at]);
    assert!(out.status.success(), "stfs umount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit after the unmount");
}

/// fuse3's mount.fuse form (`stfs SOURCE MP -o OPTS`, as `mount -t fuse.stfs` runs it): root's uid
/// is kept, every capability goes, as mount.fuse3's own `drop_privileges` does.
#[test]
fn the_mount_helper_drop_privileges_option_keeps_root_without_capabilities() {
    let Some((t, fixture)) = root_and_nobody_fixture() else { return };
    let mp = fixture.mount_point.clone();
    let out = stfs(&[fixture.file.to_str().unwrap(), mp.to_str().unwrap(), "-o", "rw,drop_privileges"]);
    let _guard = UnmountOnDrop(mp.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_bytes_equal(&mp, &fixture, &t);
    assert_unprivileged(the_daemon(&mp), 0);
}

#[test]
fn a_failed_drop_privileges_leaves_nothing_mounted() {
    let Some((_, fixture)) = root_and_nobody_fixture() else { return };
    hide_checkpoint_from_nobody(&fixture);
    let mp = fixture.mount_point.clone();
    let out = stfs(&["mount", "--drop-privileges", "nobody", fixture.file.to_str().unwrap(), mp.to_str().unwrap()]);
    let _guard = UnmountOnDrop(mp.clone());
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
        let out = stfs(&all);
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
        let out = output_within(Command::new("sh").args(["-c", &script, STFS, file]), TIMEOUT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mountpoint}: {err}");
        assert_eq!(err.lines().count(), 1, "{mountpoint}: {err}");
        assert!(err.starts_with(&format!("stfs: {mountpoint}: {needle}")), "{mountpoint}: {err}");
    }
    let out = stfs(&["mount", "--auto-unmount", file, "/dev/fd/1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--auto-unmount does not apply"), "{err}");
}

/// Stops what a pod test started, whatever happened: the daemons serving `source` (their mount
/// namespace, and the mount in it, go with the last of its processes), the pod, the proxy server.
struct PodGuard {
    source: PathBuf,
    children: Vec<std::process::Child>,
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        for pid in daemon_pids(&self.source) {
            // SAFETY: signalling a daemon this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs as root in the pod's new mount namespace: /dev becomes a tmpfs with null, zero and
/// urandom but no fuse, then the rest runs as nobody with no capability (bounding set empty),
/// no_new_privs and the shim's directory first on PATH. `$1`: the shim directory, `$2`: the proxy's
/// socket, `$3`: the script nobody runs, then its arguments.
const POD_SCRIPT: &str = r#"
bin=$1 sock=$2 inner=$3
shift 3
mount -t tmpfs -o mode=0755 pod-dev /dev || exit 99
for node in "null 1 3" "zero 1 5" "urandom 1 9"; do
  mknod -m 666 /dev/${node%% *} c ${node#* } || exit 99
done
exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \
  env -i PATH="$bin:/usr/bin:/bin" FUSE_PROXY_SOCKET="$sock" sh -c "$inner" "$@"
"#;

/// What nobody does in the pod: `$0` stfs, `$1` the checkpoint, `$2` the mount point, `$3` a
/// directory for what it reads, `$4` a FIFO the test writes to once it has looked at the daemon.
const IN_POD: &str = r#"
stfs=$0 file=$1 mp=$2 out=$3 go=$4
[ -e /dev/fuse ] && { echo "the pod has a /dev/fuse" >&2; exit 90; }
grep -E '^(Uid|CapEff|CapBnd|NoNewPrivs):' /proc/self/status > "$out/pod-status"
"$stfs" mount --log-file "$out/log" "$file" "$mp" || exit 91
for t in w b i model.safetensors; do cat "$mp/$t" > "$out/$t" || exit 92; done
: > "$out/read"
timeout 30 sh -c 'read x < "$0"' "$go" || exit 93
"$stfs" umount "$mp" || exit 94
"#;

#[test]
fn a_pod_without_dev_fuse_or_privilege_mounts_through_a_fusermount3_proxy() {
    if not_root("a mount namespace and a proxy server") {
        return;
    }
    for (tool, install) in [
        ("unshare", "apt-get install util-linux"),
        ("setpriv", "apt-get install util-linux"),
        ("python3", "apt-get install python3"),
    ] {
        if !Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success()) {
            return tool_missing(tool, install);
        }
    }
    let t = tensors();
    let fixture = NobodyFixture::new(&t);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let (bin, out) = (fixture.dir.path().join("bin"), fixture.dir.path().join("out"));
    for dir in [&bin, &out] {
        std::fs::create_dir(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let shim = bin.join("fusermount3");
    std::fs::copy(data.join("fusermount3_shim.py"), &shim).unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let go = out.join("go");
    let c_go = std::ffi::CString::new(go.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_go.as_ptr(), 0o666) }, 0);
    std::fs::set_permissions(&go, std::fs::Permissions::from_mode(0o666)).unwrap();
    let socket = fixture.dir.path().join("proxy.sock");
    let mut guard = PodGuard { source: fixture.file.clone(), children: Vec::new() };
    let mut server = Command::new("python3")
        .arg(data.join("fuse_proxy_server.py"))
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the proxy server starts");
    let said = server.stdout.take().unwrap();
    guard.children.push(server);
    let (ready, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(said), &mut line);
        let _ = ready.send(line);
    });
    assert_eq!(heard.recv_timeout(TIMEOUT).expect("the proxy server says ready").trim(), "ready");
    let pod = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", POD_SCRIPT, "pod"])
        .args([&bin, &socket].map(|p| p.as_os_str().to_owned()))
        .arg(IN_POD)
        .arg(STFS)
        .args([&fixture.file, &fixture.mount_point, &out, &go].map(|p| p.as_os_str().to_owned()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    guard.children.push(pod);
    let read_all =
        wait_until(TIMEOUT, || out.join("read").exists() || guard.children[1].try_wait().ok().flatten().is_some());
    let log = || std::fs::read_to_string(out.join("log")).unwrap_or_default();
    if !out.join("read").exists() {
        let pod = guard.children.remove(1);
        let said = wait_output(pod, TIMEOUT);
        panic!(
            "the pod did not read the mount (waited: {read_all}): {}; log: {}",
            String::from_utf8_lossy(&said.stderr),
            log()
        );
    }
    for t in &t {
        assert_eq!(std::fs::read(out.join(&t.name)).unwrap(), t.data, "tensor {} read in the pod", t.name);
    }
    let original = std::fs::read(&fixture.file).unwrap();
    assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), original, "the checkpoint file read in the pod");
    let pod_status = std::fs::read_to_string(out.join("pod-status")).unwrap();
    for line in
        ["Uid:\t65534\t65534\t65534\t65534", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"]
    {
        assert!(pod_status.lines().any(|l| l == line), "{line:?} in the pod's status: {pod_status}");
    }
    let pid = the_daemon(&fixture.file);
    assert_unprivileged(pid, NOBODY);
    // The descriptor the proxy passed back is close-on-exec, and the extra one the shim sends after
    // it (its own file) was closed.
    assert_fuse_descriptors_close_on_exec(pid);
    let held: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    assert!(!held.contains(&shim), "the daemon holds the extra descriptor the shim sent: {held:?}");
    // The pod goes on: it unmounts through the proxy (`fusermount3 -u`), and the daemon exits.
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&go) {
            Ok(mut fifo) => break std::io::Write::write_all(&mut fifo, b"go\n").unwrap(),
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("the pod is not waiting on {}: {e}", go.display()),
        }
    }
    let pod = guard.children.remove(1);
    let done = wait_output(pod, TIMEOUT);
    assert!(
        done.status.success(),
        "the pod: {:?}: {}; log: {}",
        done.status,
        String::from_utf8_lossy(&done.stderr),
        log()
    );
    assert!(wait_until(TIMEOUT, || process_gone(pid)), "the daemon did not exit after the pod unmounted");
}
