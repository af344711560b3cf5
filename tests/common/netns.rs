//! Private namespaces for tests that must serve a fixed address (a metadata server's port 80, ECS's
//! 169.254.170.2): the test re-runs one of its ignored tests in new network, mount and PID
//! namespaces (`unshare`), where it may bring up loopback, add an address to it and bind-mount
//! over system files without touching the machine's.

#![allow(dead_code)] // shared by several test binaries, each using part of it

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use crate::common::{not_root, tool_missing, wait_output, TIMEOUT};

/// Runs the ignored test `inner` of this test binary in new network, mount and PID namespaces,
/// with `marker` set to this process's namespaces (so `inner` can check it is elsewhere), and
/// asserts it passed and printed `finished`. Killing `unshare` (on a timeout) kills its child,
/// the PID namespace's first process, and with it everything in the namespace, daemons included.
/// Returns without running when it may not (not root, no `unshare`: a failure under `CI=true`).
pub fn run_in_namespaces(inner: &str, marker: &str, finished: &str) {
    if not_root("network and mount namespaces") {
        return;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        return tool_missing("unshare", "apt-get install util-linux");
    }
    let child = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", inner, "--nocapture", "--test-threads=1"])
        .env(marker, namespaces())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    let out = wait_output(child, 4 * TIMEOUT);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}");
    assert!(out.status.success(), "inside the namespaces:\n{stdout}\n{stderr}");
    assert!(stdout.contains(finished), "the test inside the namespaces did not run:\n{stdout}\n{stderr}");
}

/// Inside [`run_in_namespaces`]: `Some(())` once it is sure this process is in new namespaces
/// (never touch the machine's network or files otherwise), `None` when run directly (the ignored
/// test then does nothing).
pub fn inside(marker: &str) -> Option<()> {
    let Ok(outside) = std::env::var(marker) else {
        println!("runs only inside the namespaces its outer test makes");
        return None;
    };
    let here = namespaces();
    for (mine, theirs) in here.split(' ').zip(outside.split(' ')) {
        assert_ne!(mine, theirs, "not in a private namespace ({here} vs {outside})");
    }
    assert_eq!(std::process::id(), 1, "not the first process of a new PID namespace");
    loopback_up();
    Some(())
}

/// This process's mount and network namespaces, as `/proc/self/ns` names them.
fn namespaces() -> String {
    let link = |ns: &str| std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap().display().to_string();
    format!("{} {}", link("mnt"), link("net"))
}

/// `struct ifreq` with its flags member (40 bytes on Linux).
#[repr(C)]
struct IfreqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// `struct ifreq` with its address member.
#[repr(C)]
struct IfreqAddr {
    name: [u8; 16],
    addr: libc::sockaddr_in,
    _rest: [u8; 8],
}

fn interface_name(name: &str) -> [u8; 16] {
    let mut out = [0; 16];
    out[..name.len()].copy_from_slice(name.as_bytes());
    out
}

/// Runs `ioctl(request, arg)` on a fresh AF_INET socket, asserting success.
fn socket_ioctl<T>(request: libc::c_ulong, arg: &mut T) {
    // SAFETY: a socket this function owns and closes; `arg` is an ifreq-shaped value the ioctl
    // reads and writes within its size.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let rc = libc::ioctl(fd, request, arg as *mut T);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(rc, 0, "ioctl {request:#x}: {error}");
    }
}

/// Brings up `lo` in this (new) network namespace, as `ip link set lo up` does.
fn loopback_up() {
    let mut request = IfreqFlags { name: interface_name("lo"), flags: 0, _rest: [0; 22] };
    socket_ioctl(libc::SIOCGIFFLAGS, &mut request);
    request.flags |= libc::IFF_UP as libc::c_short;
    socket_ioctl(libc::SIOCSIFFLAGS, &mut request);
}

/// Adds `address` to loopback as the alias `lo:1` (`ip addr add ADDRESS/32 dev lo`), so a server
/// can listen on it; only inside [`run_in_namespaces`].
pub fn add_loopback_address(address: Ipv4Addr) {
    // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_addr = libc::in_addr { s_addr: u32::from(address).to_be() };
    let mut request = IfreqAddr { name: interface_name("lo:1"), addr, _rest: [0; 8] };
    socket_ioctl(libc::SIOCSIFADDR, &mut request);
}
