//! Shared helpers for the real-mount tests: fixtures, a mount guard, and running the binary.
//!
//! Every mount lives on a fresh temp directory, is waited for with a deadline (never a fixed sleep),
//! and is unmounted by [`Mount`]'s `Drop`, falling back to a lazy detach, even when a test panics.
#![allow(dead_code, unused_imports)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use stfs::format::Dtype;

pub mod faultfs;
pub mod slowdisk;
pub mod tools;
pub mod users;
pub mod wedge;
pub use tools::{not_root, tool_missing};

/// The binary under test.
pub const STFS: &str = env!("CARGO_BIN_EXE_stfs");
/// Longest any wait in these tests may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A deterministic pseudo-random byte pattern (xorshift), so every byte of a fixture is checkable.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// One tensor of a fixture.
pub struct T {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl T {
    /// A tensor with patterned data of the right length for `dtype` and `shape`.
    pub fn new(name: &str, dtype: Dtype, shape: &[u64]) -> T {
        let bits: u64 = shape.iter().product::<u64>() * dtype.bitsize();
        let data = pattern(stfs::tree::names::fnv1a64(name.as_bytes()), (bits / 8) as usize);
        T { name: name.to_string(), dtype, shape: shape.to_vec(), data }
    }
}

/// Writes a safetensors file with the project's writer; returns the bytes written.
pub fn write_checkpoint(path: &Path, tensors: &[T], metadata: Option<&BTreeMap<String, String>>) -> Vec<u8> {
    let list: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> =
        tensors.iter().map(|t| (t.name.clone(), t.dtype, t.shape.clone(), t.data.clone())).collect();
    let bytes = stfs::format::writer::serialize(&list, metadata).expect("serialize fixture");
    std::fs::write(path, &bytes).expect("write fixture");
    bytes
}

/// A small mixed checkpoint: several dtypes, odd sizes, a scalar, an empty tensor, awkward names.
pub fn mixed_tensors() -> Vec<T> {
    vec![
        T::new("model.embed.weight", Dtype::F32, &[300, 129]),
        T::new("model.layers.0.mlp.weight", Dtype::BF16, &[257, 333]),
        T::new("model.layers.0.mlp.bias", Dtype::F16, &[333]),
        T::new("scale", Dtype::F64, &[]),
        T::new("empty", Dtype::I32, &[0, 7]),
        T::new("mask", Dtype::BOOL, &[1001]),
        T::new("q", Dtype::I8, &[3, 5, 7]),
        T::new("fp8", Dtype::F8_E4M3, &[4099]),
        T::new("packed4", Dtype::F4, &[6]),
        T::new("a/b", Dtype::U8, &[5]),
        T::new("..", Dtype::U16, &[9]),
        T::new("metadata.json", Dtype::I64, &[2]),
    ]
}

/// A temp directory holding fixtures, removed at the end of the test.
pub fn workdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("stfs-test-").tempdir().expect("tempdir")
}

/// A checkpoint of one tensor (`w`, 1000 F32) in a fresh directory: the directory, the file, the tensor.
pub fn one_tensor_checkpoint() -> (tempfile::TempDir, PathBuf, T) {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensor = T::new("w", Dtype::F32, &[1000]);
    write_checkpoint(&file, std::slice::from_ref(&tensor), None);
    (dir, file, tensor)
}

/// Runs `stfs ARGS...` to completion (with a timeout) and returns its output.
pub fn stfs(args: &[&str]) -> Output {
    output_within(Command::new(STFS).args(args), TIMEOUT)
}

/// Runs `command` with no stdin and its output captured, to completion within `timeout` (killed and
/// the test failed past it), and returns its output.
pub fn output_within(command: &mut Command, timeout: Duration) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", command.get_program()));
    wait_output(child, timeout)
}

/// Waits for a child with a deadline; kills it and panics if it overruns.
pub fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("command did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `path` is a mount point now (from /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    stfs::mount::mountpoint::is_mount_point(path)
}

/// A mounted stfs: unmounted on drop, whatever happened.
pub struct Mount {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Mount {
    /// `stfs mount SOURCE MP EXTRA...` in the default (background) mode; the command must exit 0
    /// and, by contract, the mount must answer as soon as it has.
    pub fn new(source: &Path, extra: &[&str]) -> Mount {
        Mount::with_env(source, extra, &[])
    }

    /// [`Mount::new`] with extra environment variables for `stfs mount` (and so for its daemon).
    pub fn with_env(source: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Mount {
        let dir = tempfile::Builder::new().prefix("stfs-mnt-").tempdir().expect("mount dir");
        let path = dir.path().join("m");
        std::fs::create_dir(&path).unwrap();
        let mut args = vec!["mount", source.to_str().unwrap(), path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut command = Command::new(STFS);
        command.args(&args).envs(env.iter().copied()).stdin(Stdio::null()).stdout(Stdio::piped());
        let out = wait_output(command.stderr(Stdio::piped()).spawn().expect("spawn stfs"), TIMEOUT);
        let guard = Mount { _dir: dir, path };
        assert!(out.status.success(), "stfs mount failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(is_mounted(&guard.path), "stfs mount returned 0 but nothing is mounted");
        guard
    }

    /// The mount already made at `path` (inside `dir`), to be unmounted when the guard drops.
    pub fn adopt(dir: tempfile::TempDir, path: PathBuf) -> Mount {
        Mount { _dir: dir, path }
    }

    /// Path of a file inside the mount.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

/// `stfs mount SOURCE` on a fresh mount point, which must be refused: exit 1, one line on stderr
/// (returned), nothing mounted (and anything mounted by mistake detached before the asserts).
pub fn refused_mount(source: &Path) -> String {
    let mp = workdir();
    let out = stfs(&["mount", source.to_str().unwrap(), mp.path().to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let mounted = is_mounted(mp.path());
    force_unmount(mp.path());
    assert!(!mounted, "mounted: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

/// Unmounts a mount point when dropped ([`force_unmount`]), whatever the test did.
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

/// Unmounts with umount2(2), falling back to MNT_DETACH; waits (bounded) until it is gone.
pub fn force_unmount(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    if is_mounted(path) {
        // SAFETY: c is a valid C string for the duration of the calls.
        unsafe {
            if libc::umount2(c.as_ptr(), 0) != 0 {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let deadline = Instant::now() + TIMEOUT;
    while is_mounted(path) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs an unmount (`stfs umount`, umount(8)) again while it fails with "busy", for a few seconds:
/// a child another test thread is starting holds, between its fork and exec, a copy of every
/// descriptor this process had open, including files on the mount this test just closed.
pub fn unmount_retrying(mut unmount: impl FnMut() -> Output) -> Output {
    let mut out = unmount();
    wait_until(Duration::from_secs(5), || {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("busy") {
            return true;
        }
        out = unmount();
        false
    });
    out
}

/// Polls `cond` until it holds or the deadline passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Pid of the stfs daemon serving `mp`, found by its command line in /proc.
pub fn daemon_pid(mp: &Path) -> Option<i32> {
    daemon_pids(mp).into_iter().next()
}

/// Pids of every stfs daemon whose command line names `mp` (one that serves a mount detached
/// lazily and the one of a newer mount there, say).
pub fn daemon_pids(mp: &Path) -> Vec<i32> {
    stfs_processes(mp, |comm| comm != "stfs-watch")
}

/// Pid of the `auto_unmount` watcher of the mount on `mp` (its name is stfs-watch).
pub fn watcher_pid(mp: &Path) -> Option<i32> {
    stfs_processes(mp, |comm| comm == "stfs-watch").into_iter().next()
}

/// Processes of the stfs binary whose command line names `mp` and whose name (comm) `comm_ok` takes.
fn stfs_processes(mp: &Path, comm_ok: impl Fn(&str) -> bool) -> Vec<i32> {
    let Some(want) = mp.to_str() else { return Vec::new() };
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if !comm_ok(comm.trim_end()) {
                return None;
            }
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            (args.first().is_some_and(|a| a.ends_with(b"stfs")) && args.contains(&want.as_bytes())).then_some(pid)
        })
        .collect()
}

/// Mounts a 1 MiB tmpfs on `path` (root only).
pub fn mount_tmpfs(path: &Path) {
    let c = |s: &[u8]| CString::new(s).unwrap();
    let (source, target, fs_type, data) = (c(b"tmpfs"), c(path.as_os_str().as_bytes()), c(b"tmpfs"), c(b"size=1m"));
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fs_type.as_ptr(), 0, data.as_ptr().cast()) };
    assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
}

/// Detaches everything mounted at each of its paths when dropped, one stacked mount after another
/// (MNT_DETACH, which asks no daemon), found in mountinfo alone: whatever the test did.
pub struct DetachAll(pub Vec<PathBuf>);

impl Drop for DetachAll {
    fn drop(&mut self) {
        for path in &self.0 {
            let c = CString::new(path.as_os_str().as_bytes()).unwrap();
            for _ in 0..16 {
                if !wedge::listed(path) {
                    break;
                }
                // SAFETY: c is a valid C string for the duration of the call.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
            }
        }
    }
}
