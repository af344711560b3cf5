//! Secrets stay off the process list, and files stfs creates are never reached through a planted
//! link: a header and a presigned query read from `/proc/PID/cmdline` by another user (nobody),
//! `--header-file` and `STFS_HEADER_*` against an nginx that checks them, a link planted at
//! `stfs extract`'s temporary name, and a `--log-file` that is a link.

mod common;
#[path = "common/nginx.rs"]
mod nginx;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::users::as_nobody;
use common::*;
use nginx::Nginx;
use stfs::format::Dtype;

const TOKEN: &str = "tok_5ecret_bearer_value";
const SIGNATURE: &str = "sig0a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// An nginx whose `/private/` answers only requests carrying `Authorization: Bearer TOKEN` and,
/// as a presigned URL's signature, `?...&Signature=SIGNATURE`; None when nginx is missing.
fn private_nginx() -> Option<Nginx> {
    let nginx = Nginx::start_with_directives(&format!(
        "location /private/ {{
             if ($http_authorization != \"Bearer {TOKEN}\") {{ return 401; }}
             if ($arg_signature != \"{SIGNATURE}\") {{ return 403; }}
         }}"
    ))?;
    std::fs::create_dir(nginx.root.join("private")).unwrap();
    Some(nginx)
}

/// Whether setpriv and unshare (util-linux) are here; when not, [`tool_missing`] fails the test under
/// CI or says why it is skipped.
fn util_linux() -> bool {
    let missing = ["setpriv", "unshare"].into_iter().find(|tool| nginx::find_program(tool).is_none());
    if let Some(tool) = missing {
        tool_missing(tool, "apt-get install util-linux");
    }
    missing.is_none()
}

macro_rules! nginx_or_skip {
    () => {
        match private_nginx() {
            Some(n) => n,
            None => return tool_missing("nginx", "apt-get install nginx"),
        }
    };
}

fn fixture() -> Vec<T> {
    vec![T::new("a.weight", Dtype::F32, &[300, 129]), T::new("b.bias", Dtype::BF16, &[4097])]
}

/// The fixture, written as the private checkpoint the presigned URL names.
fn private_model(nginx: &Nginx) -> Vec<T> {
    let tensors = fixture();
    write_checkpoint(&nginx.root.join("private/m.safetensors"), &tensors, None);
    tensors
}

/// The presigned-style URL of the private checkpoint.
fn presigned(nginx: &Nginx) -> String {
    format!("{}?Expires=1893456000&Signature={SIGNATURE}", nginx.url("private/m.safetensors"))
}

/// `/proc/PID/FILE` of the daemon serving `mp`, read as nobody: its bytes, or None if refused.
fn read_as_nobody(mp: &Path, file: &str) -> Option<Vec<u8>> {
    let pid = daemon_pid(mp).expect("the daemon of the mount");
    let out = wait_output(
        as_nobody("cat")
            .arg(format!("/proc/{pid}/{file}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        TIMEOUT,
    );
    out.status.success().then_some(out.stdout)
}

/// What other users see of the mount's daemon holds neither secret, and the mount serves every
/// tensor byte-exact (so the secrets did reach the server).
fn assert_hidden_and_served(m: &Mount, tensors: &[T]) {
    let cmdline = read_as_nobody(&m.path, "cmdline").expect("cmdline is readable by every user");
    let text = String::from_utf8_lossy(&cmdline);
    assert!(text.contains(m.path.to_str().unwrap()), "not the daemon's command line: {text}");
    assert!(!text.contains(TOKEN) && !text.contains(SIGNATURE), "a secret in the process list: {text}");
    assert_eq!(read_as_nobody(&m.path, "environ"), None, "nobody read the daemon's environment");
    for t in tensors {
        assert_eq!(std::fs::read(m.file(&t.name)).unwrap(), t.data, "{}", t.name);
    }
}

#[test]
fn a_header_and_a_presigned_query_on_the_command_line_leave_the_process_list() {
    if !util_linux() {
        return;
    }
    let nginx = nginx_or_skip!();
    let tensors = private_model(&nginx);
    let auth = format!("Authorization: Bearer {TOKEN}");
    let m = Mount::new(Path::new(&presigned(&nginx)), &["--header", &auth]);
    assert_hidden_and_served(&m, &tensors);
    // The same through -o, as an fstab line gives it, and in every other spelling clap takes.
    let list = format!("cache_size=8M,header={auth}");
    for spelling in [
        vec!["-o".to_string(), list.clone()],
        vec![format!("-o{list}")],
        vec![format!("-o={list}")],
        vec![format!("--header={auth}")],
        vec![format!("-o=header={auth}")],
        vec![format!("-o=npy,header={auth}")],
    ] {
        let extra: Vec<&str> = spelling.iter().map(String::as_str).collect();
        let m = Mount::new(Path::new(&presigned(&nginx)), &extra);
        assert_hidden_and_served(&m, &tensors);
    }
}

/// A foreground mount whose header came in a cluster of short flags (`-fo`): its one process is the
/// daemon, and other users never see the header in its command line.
#[test]
fn a_header_after_clustered_short_flags_leaves_the_process_list() {
    if !util_linux() {
        return;
    }
    let nginx = nginx_or_skip!();
    let tensors = private_model(&nginx);
    let dir = workdir();
    let mp = dir.path().join("m");
    std::fs::create_dir(&mp).unwrap();
    let _detach = DetachAll(vec![mp.clone()]);
    let header = format!("header=Authorization: Bearer {TOKEN}");
    let child = Command::new(STFS)
        .args(["mount", &presigned(&nginx), mp.to_str().unwrap(), "-fo", &header])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    assert!(wait_until(TIMEOUT, || is_mounted(&mp)), "the foreground mount never appeared");
    let m = Mount::adopt(dir, mp);
    assert_hidden_and_served(&m, &tensors);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = wait_output(child, TIMEOUT);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: a header value on the command line"));
}

#[test]
fn header_file_and_environment_headers_authenticate() {
    if !util_linux() {
        return;
    }
    let nginx = nginx_or_skip!();
    let tensors = private_model(&nginx);
    let dir = workdir();
    let file = dir.path().join("headers");
    std::fs::write(&file, format!("# for the private store\nX-Other: 1\nAuthorization: Bearer {TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = presigned(&nginx);
    let m = Mount::new(Path::new(&url), &["--header-file", file.to_str().unwrap()]);
    assert_hidden_and_served(&m, &tensors);
    let m = Mount::new(Path::new(&url), &["-o", &format!("header_file={}", file.display())]);
    assert_hidden_and_served(&m, &tensors);
    let env_path = PathBuf::from(format!("Authorization: Bearer {TOKEN}"));
    let m = Mount::with_env(Path::new(&url), &[], &[("STFS_HEADER_AUTH", &env_path)]);
    assert_hidden_and_served(&m, &tensors);

    // Without the header the server refuses: the headers above are what let the mounts in.
    let mp = workdir();
    let out = stfs(&["mount", &url, mp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    // A header file other users may read is refused in one line that names it and shows no value.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = stfs(&["mount", &url, mp.path().to_str().unwrap(), "--header-file", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("{}: header file is readable by other users", file.display())), "{err}");
    assert!(!err.contains(TOKEN) && !is_mounted(mp.path()), "{err}");
}

#[test]
fn a_link_planted_at_the_extract_partial_name_is_never_followed() {
    if !util_linux() {
        return;
    }
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &fixture(), None);
    let (out_dir, victim) = (dir.path().join("out"), dir.path().join("victim"));
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(&victim, b"precious").unwrap();
    // In a new PID namespace stfs is PID 1, so its temporary names are `.stfs-partial-1-INO`: plant
    // a link to the victim under every one a small checkpoint can use.
    for ino in 1..=64 {
        std::os::unix::fs::symlink(&victim, out_dir.join(format!(".stfs-partial-1-{ino}"))).unwrap();
    }
    let child = Command::new("unshare")
        .args(["--pid", "--fork", STFS, "extract", "--all", file.to_str().unwrap(), "-o", out_dir.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, TIMEOUT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the write went through the planted link: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("stfs: "), "{err}");
    assert!(err.contains(&format!("{}/.stfs-partial-1-", out_dir.display())), "{err}");
    assert!(err.contains("already exists"), "{err}");
    // Without the links the same extract writes every tensor.
    for entry in std::fs::read_dir(&out_dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let out = stfs(&["extract", "--all", file.to_str().unwrap(), "-o", out_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(out_dir.join("a.weight")).unwrap(), fixture()[0].data);
}

#[test]
fn a_log_file_that_is_a_link_is_refused_and_a_new_one_is_private() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &fixture(), None);
    let (victim, link) = (dir.path().join("victim"), dir.path().join("log"));
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let mp = workdir();
    let out =
        stfs(&["mount", file.to_str().unwrap(), mp.path().to_str().unwrap(), "--log-file", link.to_str().unwrap()]);
    let mounted = is_mounted(mp.path());
    if mounted {
        force_unmount(mp.path());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!mounted, "mounted with a log file that is a link");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end(), format!("stfs: {}: is a symbolic link; refused as a log file", link.display()));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    // A new log file is created 0600; an existing one is appended to.
    let log = dir.path().join("new.log");
    let m = Mount::new(&file, &["--log-file", log.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
    drop(m);
    std::fs::write(&victim, b"kept\n").unwrap();
    let m = Mount::new(&file, &["--log-file", victim.to_str().unwrap()]);
    drop(m);
    assert!(std::fs::read(&victim).unwrap().starts_with(b"kept\n"));
}
