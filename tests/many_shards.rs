//! A checkpoint of a thousand shards (an index and its shards, one small tensor each) under a limit
//! of 1,024 open files, as systemd gives a service: it mounts and every tensor reads back
//! byte-exact from a local directory, over HTTP (nginx) and from `s3://` (s3s-fs), and the daemon
//! holds a bounded number of descriptors after reading every shard (a shard's descriptors open at
//! its first read, not at mount, and those of shards read long ago are closed); a mount left idle
//! closes its connections and stream descriptors.
//! Skips when nginx or s3s-fs is missing (fails under `CI=true`).

mod common;
#[path = "common/nginx.rs"]
mod nginx;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;
#[macro_use]
#[path = "common/s3server.rs"]
mod s3server;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use s3server::S3Server;
use stfs::format::Dtype;

/// Shards in the checkpoint.
const SHARDS: usize = 1000;
/// The limit on open files the mount runs under.
const LIMIT: u64 = 1024;
/// Most descriptors the daemon may hold once every shard was read: well under [`LIMIT`].
const MOST_OPEN_AFTER: usize = 256;

/// Writes the checkpoint into `dir`: `SHARDS` shards of one tensor each, just over the 64 KiB an
/// HTTP source fetches when it opens (so reading it takes a request on a reader's own connection),
/// and their index. Returns the tensors and the index's file name.
fn write_sharded(dir: &Path) -> (Vec<T>, &'static str) {
    write_shards(dir, SHARDS)
}

/// [`write_sharded`] with `count` shards.
fn write_shards(dir: &Path, count: usize) -> (Vec<T>, &'static str) {
    std::fs::create_dir_all(dir).unwrap();
    let mut weight_map = serde_json::Map::new();
    let mut all = Vec::new();
    for i in 0..count {
        let shard = format!("model-{:05}-of-{count:05}.safetensors", i + 1);
        let tensor = T::new(&format!("model.layers.{i}.weight"), Dtype::U8, &[70_000 + (i as u64 % 7)]);
        write_checkpoint(&dir.join(&shard), std::slice::from_ref(&tensor), None);
        weight_map.insert(tensor.name.clone(), shard.into());
        all.push(tensor);
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    let name = "model.safetensors.index.json";
    std::fs::write(dir.join(name), index.to_string()).unwrap();
    (all, name)
}

/// Runs `command` (an `stfs mount`) with its open-files limit set to [`LIMIT`]: the soft one only,
/// or both (`hard`: then the daemon cannot raise it and its own budget must keep it under).
fn limited(mut command: Command, hard: bool) -> Command {
    // SAFETY: only setrlimit, async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = LIMIT.min(limit.rlim_max);
            if hard {
                limit.rlim_max = limit.rlim_cur;
            }
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// A mount made by [`mount`]; unmounted when dropped.
struct Mounted {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

/// Mounts through `command` (which lacks only the mount point) and checks it succeeded.
fn mount(mut command: Command) -> Mounted {
    let dir = workdir();
    let path = dir.path().join("m");
    std::fs::create_dir(&path).unwrap();
    command.arg(&path).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = wait_output(command.spawn().expect("spawn stfs"), TIMEOUT);
    let mounted = Mounted { _dir: dir, path };
    assert!(out.status.success(), "stfs mount failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(&mounted.path), "stfs mount returned 0 but nothing is mounted");
    mounted
}

/// Descriptors the process `pid` holds.
fn open_descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Sockets the process `pid` holds (its connections to a server).
fn open_sockets(pid: i32) -> usize {
    let links = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    links
        .filter_map(|l| std::fs::read_link(l.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("socket:"))
        .count()
}

/// The soft and hard open-files limits of the process `pid`.
fn open_files_limits(pid: i32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

/// Reads every tensor of `m` and checks it byte for byte, then checks the daemon holds at most
/// [`MOST_OPEN_AFTER`] descriptors.
fn read_all_and_count(m: &Mounted, tensors: &[T]) {
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let at_mount = open_descriptors(pid);
    assert!(at_mount < 64, "{at_mount} descriptors open right after mounting {SHARDS} shards");
    let mut most = at_mount;
    for (i, t) in tensors.iter().enumerate() {
        let got = std::fs::read(m.path.join(&t.name)).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert!(got == t.data, "{} differs", t.name);
        if i % 50 == 49 {
            most = most.max(open_descriptors(pid));
        }
    }
    let after = open_descriptors(pid);
    assert!(
        most.max(after) <= MOST_OPEN_AFTER,
        "the daemon held {} descriptors while reading {SHARDS} shards ({after} at the end)",
        most.max(after)
    );
}

#[test]
fn a_local_index_of_a_thousand_shards_mounts_and_reads_under_a_soft_limit_of_1024() {
    if not_root("mounting FUSE") {
        return;
    }
    let work = workdir();
    let (tensors, index) = write_sharded(&work.path().join("ckpt"));
    let mut command = Command::new(STFS);
    command.arg("mount").arg(work.path().join("ckpt").join(index));
    let m = mount(limited(command, false));
    // The daemon raised its soft limit to what its descriptor budget needs, within the hard one.
    let (soft, hard) = open_files_limits(daemon_pid(&m.path).unwrap());
    let want = stfs::mount::limits::DESCRIPTORS_NEEDED.min(hard.parse().unwrap());
    assert_eq!(soft, want.to_string(), "the soft limit was raised to the budget (hard {hard})");
    read_all_and_count(&m, &tensors);

    // With the hard limit at 1,024 too, nothing can be raised: the mount's own budget carries it.
    let mut command = Command::new(STFS);
    command.arg("mount").arg(work.path().join("ckpt").join(index));
    let m = mount(limited(command, true));
    assert_eq!(open_files_limits(daemon_pid(&m.path).unwrap()), (LIMIT.to_string(), LIMIT.to_string()));
    read_all_and_count(&m, &tensors);
}

#[test]
fn an_http_index_of_a_thousand_shards_mounts_and_reads_under_a_limit_of_1024() {
    if not_root("mounting FUSE") {
        return;
    }
    let Some(nginx) = nginx::Nginx::start() else {
        return tool_missing("nginx", "apt-get install nginx");
    };
    let (tensors, index) = write_sharded(&nginx.root.join("ckpt"));
    let mut command = Command::new(STFS);
    command.args(["mount", "--block-size", "64K", &nginx.url(&format!("ckpt/{index}"))]);
    // Hard limit too: every keep-alive connection of every shard read would pass it.
    let m = mount(limited(command, true));
    read_all_and_count(&m, &tensors);
}

#[test]
fn an_s3_index_of_a_thousand_shards_mounts_and_reads_under_a_soft_limit_of_1024() {
    if not_root("mounting FUSE") {
        return;
    }
    let server = s3_or_skip!();
    let home = workdir();
    let (tensors, index) = write_sharded(&server.object("ckpt"));
    let url = format!("s3://{}/ckpt/{index}", s3server::BUCKET);
    let vars = s3server::env_keys(&server.endpoint(), s3server::SECRET_KEY);
    let mut command = s3server::command(&["mount", "--block-size", "64K", &url], home.path(), &vars);
    command.stdout(Stdio::piped());
    let m = mount(limited(command, false));
    read_all_and_count(&m, &tensors);
}

#[test]
fn an_idle_mount_closes_its_keep_alive_connections_and_stream_descriptors() {
    if not_root("mounting FUSE") {
        return;
    }
    let Some(nginx) = nginx::Nginx::start() else {
        return tool_missing("nginx", "apt-get install nginx");
    };
    let (tensors, index) = write_shards(&nginx.root.join("ckpt"), 8);
    let mut command = Command::new(STFS);
    command.args(["mount", "--block-size", "64K", &nginx.url(&format!("ckpt/{index}"))]);
    let m = mount(command);
    let pid = daemon_pid(&m.path).expect("daemon pid");
    let at_mount = open_descriptors(pid);
    for t in &tensors {
        assert!(std::fs::read(m.path.join(&t.name)).unwrap() == t.data, "{} differs", t.name);
    }
    let (after_reads, sockets) = (open_descriptors(pid), open_sockets(pid));
    assert!(sockets > 0 && after_reads > at_mount, "reading kept no connection open: {after_reads} descriptors");
    // Idle for 30 s (IDLE_DESCRIPTORS_AFTER), seen by a sweep every 5 s: every source closes what
    // it holds, and the daemon is back to what it held at mount, with no connection left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while (open_sockets(pid) > 0 || open_descriptors(pid) > at_mount) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert_eq!(open_sockets(pid), 0, "connections still open after 60 s idle ({sockets} after the reads)");
    assert!(
        open_descriptors(pid) <= at_mount,
        "{} descriptors after 60 s idle, {at_mount} at mount",
        open_descriptors(pid)
    );
    // And the next read opens what it needs again.
    assert!(std::fs::read(m.path.join(&tensors[3].name)).unwrap() == tensors[3].data);
}
