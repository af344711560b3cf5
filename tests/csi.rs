//! `stfs csi` driven as kubelet drives it (there is no kubelet here, as csi-sanity has none): a
//! real gRPC client on the plugin's unix socket. The node conformance checks (missing fields,
//! unsupported capabilities, idempotent publish and unpublish, the target made and removed, the
//! capabilities declared); bytes read through a published target against the reference reader
//! (Python safetensors) for a local file and `s3://` on the test S3 server; a "pod" (its own mount
//! namespace, nobody, no capability, `no_new_privs`, no /dev/fuse) reading every tensor of a bind
//! of the target; three pods sharing one daemon with the origin serving each byte once; the plugin
//! SIGKILLed while a pod reads, then a new plugin unpublishing; a killed daemon recovered by the
//! next publish; and secrets on no command line, in no log and in no error.
// The client's calls answer tonic::Status by value, as tonic does.
#![allow(clippy::result_large_err)]

mod common;
#[path = "common/hub_repo.rs"]
mod hub_repo;
#[macro_use]
#[path = "common/s3server.rs"]
mod s3server;
#[path = "common/nginx.rs"]
mod nginx;
#[path = "common/tinyhttp.rs"]
mod tinyhttp;

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bpfman_csi::v1 as csi;
use common::*;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use s3server::{S3Gate, S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};
use stfs::csi::daemon_process::DaemonProcess;
use tonic::transport::Channel;
use tonic::Code;

/// Longest a publish may take (a daemon opening its checkpoint included).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// A test's folder: readable by nobody (the daemons and the pods run as nobody), and on drop every
/// mount below it detached (found in mountinfo alone) and every daemon of its volumes stopped.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = workdir();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Node { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn state(&self) -> PathBuf {
        self.path().join("state")
    }

    /// A pod's target path (its parent made, as kubelet does; the target itself is the plugin's).
    fn target(&self, pod: &str) -> PathBuf {
        let parent = self.path().join("pods").join(pod);
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::set_permissions(self.path().join("pods"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        parent.join("mount")
    }

    /// The shared volumes in the state directory.
    fn volumes(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.state().join("volumes")) else { return Vec::new() };
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    /// The daemon serving volume `name`.
    fn daemon(&self, name: &str) -> Option<DaemonProcess> {
        DaemonProcess::find(name)
    }

    /// Every mount below this node's folder.
    fn mounts(&self) -> Vec<PathBuf> {
        stfs::mount::mountinfo::mounts()
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(self.path()))
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let volumes = self.volumes();
        for _ in 0..4 {
            let mounts = self.mounts();
            if mounts.is_empty() {
                break;
            }
            drop(DetachAll(mounts.into_iter().rev().collect()));
        }
        for name in volumes {
            if let Some(daemon) = DaemonProcess::find(&name) {
                daemon.stop(Duration::from_secs(2));
            }
        }
    }
}

/// A running `stfs csi`, killed on drop; its stderr goes to a file.
struct Plugin {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Plugin {
    fn start(node: &Node, extra_env: &[(&str, &str)]) -> Plugin {
        Plugin::start_with(node, extra_env, &[])
    }

    /// [`Plugin::start`] with more flags (`--cache-dir DIR`).
    fn start_with(node: &Node, extra_env: &[(&str, &str)], extra_args: &[&str]) -> Plugin {
        Plugin::start_in(node, extra_env, extra_args, None)
    }

    /// [`Plugin::start_with`] with the plugin's process in `container`'s cgroup from its start.
    fn start_in(node: &Node, extra_env: &[(&str, &str)], extra_args: &[&str], container: Option<&Cgroup>) -> Plugin {
        static STARTS: AtomicU64 = AtomicU64::new(0);
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let socket = node.path().join(format!("csi-{n}.sock"));
        let log = node.path().join(format!("plugin-{n}.log"));
        let mut command = Command::new(STFS);
        command
            .args(["csi", "--endpoint", &format!("unix://{}", socket.display()), "--node-id", "node-1"])
            .arg("--state-dir")
            .arg(node.state())
            .args(extra_args)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("RUST_LOG")
            .env_remove("HF_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (name, _) in std::env::vars() {
            if name.starts_with("AWS_") && name != "AWS_EC2_METADATA_DISABLED" {
                command.env_remove(name);
            }
        }
        command.envs(extra_env.iter().copied());
        let procs =
            container.map(|c| std::fs::OpenOptions::new().write(true).open(c.path.join("cgroup.procs")).unwrap());
        if let Some(procs) = &procs {
            let fd = std::os::fd::AsRawFd::as_raw_fd(procs);
            // SAFETY: the closure makes one system call (a write from a static buffer), as the
            // child of a multi-threaded test must.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("start stfs csi");
        drop(procs);
        let mut plugin = Plugin { child, socket, log };
        let ready = wait_until(TIMEOUT, || plugin.socket.exists());
        if !ready {
            let _ = plugin.child.kill();
            panic!("the plugin did not listen: {}", plugin.log_text());
        }
        plugin
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A pod reading every tensor of a target against the reference in a loop, on a thread of its own.
struct PodReading {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl PodReading {
    /// Starts the loop and lets it run 200 ms.
    fn start(target: &Path, expected: &Arc<HashMap<String, Vec<u8>>>) -> PodReading {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (target, expected, stopping) = (target.to_path_buf(), expected.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut passes = 0;
            while !stopping.load(Ordering::Relaxed) || passes < 2 {
                assert_reads_reference(&target, &expected);
                passes += 1;
            }
            passes
        });
        std::thread::sleep(Duration::from_millis(200));
        PodReading { stop, thread }
    }

    /// Lets it run 300 ms more, stops it, and checks that every pass (two at least) read the reference.
    fn finish(self) {
        std::thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::Relaxed);
        assert!(self.thread.join().expect("the pod's reads went on") >= 2);
    }
}

/// A cgroup v2 folder of the test's own, in this machine's cgroup2 hierarchy: a container's (the
/// plugin runs in one, and a runtime stopping the container kills every process in it), or the one
/// the daemons are told to join. On drop, whatever is left in it is killed and it is removed.
struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
    /// machine), or None.
    fn hierarchy() -> Option<PathBuf> {
        stfs::mount::mountinfo::mounts().into_iter().find(|m| m.fs_type == "cgroup2").map(|m| m.mount_point)
    }

    fn new(path: PathBuf) -> Cgroup {
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Cgroup { path }
    }

    fn pids(&self) -> Vec<i32> {
        let text = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }

    /// Ends every process in it, as a container runtime stopping the container does, and waits
    /// until none is left (false: some still are after [`TIMEOUT`]).
    fn kill_all(&self) -> bool {
        if std::fs::write(self.path.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                // SAFETY: kill with a pid and a signal number.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        wait_until(TIMEOUT, || self.pids().is_empty())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if self.path.exists() {
            // A killed process leaves it only once reaped (the plugin is, by its own drop).
            let _ = self.kill_all() && wait_until(TIMEOUT, || std::fs::remove_dir(&self.path).is_ok());
        }
    }
}

/// A CSI client on a plugin's socket (kubelet's side).
struct Client {
    runtime: tokio::runtime::Runtime,
    identity: IdentityClient<Channel>,
    node: NodeClient<Channel>,
}

impl Client {
    fn connect(plugin: &Plugin) -> Client {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // The socket's file appears at bind(2), a moment before listen(2): refused until then.
        let deadline = std::time::Instant::now() + TIMEOUT;
        let channel = loop {
            let socket = plugin.socket.clone();
            let connected = runtime.block_on(async {
                let endpoint = tonic::transport::Endpoint::try_from("http://[::]:50051").unwrap();
                let connect = endpoint.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    tokio::net::UnixStream::connect(socket.clone())
                }));
                tokio::time::timeout(TIMEOUT, connect).await
            });
            match connected {
                Ok(Ok(channel)) => break channel,
                _ if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                other => panic!("connect to the plugin: {other:?}"),
            }
        };
        Client { runtime, identity: IdentityClient::new(channel.clone()), node: NodeClient::new(channel) }
    }

    fn call<T>(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        self.runtime
            .block_on(async { tokio::time::timeout(PUBLISH_TIMEOUT, call).await })
            .expect("the plugin answered in time")
            .map(tonic::Response::into_inner)
    }

    fn publish(&mut self, request: csi::NodePublishVolumeRequest) -> Result<(), tonic::Status> {
        let mut node = self.node.clone();
        self.call(node.node_publish_volume(request)).map(|_| ())
    }

    fn unpublish(&mut self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        let request = csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: target.display().to_string(),
        };
        let mut node = self.node.clone();
        self.call(node.node_unpublish_volume(request)).map(|_| ())
    }
}

/// A publish request as kubelet makes one for a read-only volume.
fn publish_request(
    volume_id: &str,
    target: &Path,
    attributes: &[(&str, &str)],
    secrets: &[(&str, &str)],
) -> csi::NodePublishVolumeRequest {
    let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: Mode::SingleNodeReaderOnly as i32 }),
        }),
        readonly: true,
        secrets: map(secrets),
        volume_context: map(attributes),
        ..Default::default()
    }
}

/// A checkpoint of [`mixed_tensors`] in `node`'s folder, readable by nobody.
fn local_checkpoint(node: &Node) -> (PathBuf, Vec<T>) {
    let path = node.path().join("model.safetensors");
    let tensors = mixed_tensors();
    write_checkpoint(&path, &tensors, None);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (path, tensors)
}

/// `checkpoint` published by `plugin` as vol-a to pod-a's target: a client, the target, and the
/// shared volume's name.
fn publish_one_pod(node: &Node, plugin: &Plugin, checkpoint: &Path) -> (Client, PathBuf, String) {
    let mut client = Client::connect(plugin);
    let target = node.target("pod-a");
    client.publish(publish_request("vol-a", &target, &[("source", &checkpoint.display().to_string())], &[])).unwrap();
    let volume = node.volumes().remove(0);
    (client, target, volume)
}

/// The file name a mount gives tensor `name`.
fn file_name(name: &str) -> String {
    stfs::tree::names::escape(name, stfs::tree::namespace::RESERVED)
}

/// The reference reader's tensors of the safetensors file at `path`: name -> bytes (Python's
/// safetensors.deserialize).
fn reference(path: &Path) -> HashMap<String, Vec<u8>> {
    let script = "import sys, safetensors\n\
                  for name, t in safetensors.deserialize(open(sys.argv[1], 'rb').read()):\n\
                  \x20   sys.stdout.write(name.encode().hex() + ' ' + bytes(t['data']).hex() + '\\n')\n";
    let out = match Command::new("python3").args(["-c", script]).arg(path).output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => panic!("the reference reader failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => panic!("python3 with safetensors (tests/python/requirements.txt): {e}"),
    };
    let hex =
        |s: &str| (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect::<Vec<u8>>();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, data) = line.split_once(' ').unwrap();
            (String::from_utf8(hex(name)).unwrap(), hex(data))
        })
        .collect()
}

/// Asserts that every tensor read under `dir` equals the reference reader's bytes.
fn assert_reads_reference(dir: &Path, reference: &HashMap<String, Vec<u8>>) {
    assert!(!reference.is_empty());
    for (name, bytes) in reference {
        let got = std::fs::read(dir.join(file_name(name))).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(&got == bytes, "{name}: the bytes read differ from the reference reader's");
    }
}

/// The status code of a refused call.
fn refused(result: Result<(), tonic::Status>) -> tonic::Status {
    result.expect_err("the call was refused")
}

/// Waits until nothing is mounted at `path`.
fn wait_unmounted(path: &Path) -> bool {
    wait_until(TIMEOUT, || !is_mounted(path))
}

#[test]
fn conformance_of_the_identity_and_node_services() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let plugin = Plugin::start(&node, &[]);
    let mut client = Client::connect(&plugin);

    let mut identity = client.identity.clone();
    let info = client.call(identity.get_plugin_info(csi::GetPluginInfoRequest {})).unwrap();
    assert_eq!(info.name, "stfs.csi.stfs.dev");
    assert!(!info.vendor_version.is_empty());
    let capabilities = client.call(identity.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})).unwrap();
    assert!(capabilities.capabilities.is_empty(), "a node-only plugin: no controller service");
    assert_eq!(client.call(identity.probe(csi::ProbeRequest {})).unwrap().ready, Some(true));
    let mut node_client = client.node.clone();
    assert_eq!(client.call(node_client.node_get_info(csi::NodeGetInfoRequest {})).unwrap().node_id, "node-1");
    let declared = client.call(node_client.node_get_capabilities(csi::NodeGetCapabilitiesRequest {})).unwrap();
    use csi::node_service_capability::{rpc::Type, Rpc, Type as Kind};
    assert_eq!(
        declared.capabilities,
        [csi::NodeServiceCapability { r#type: Some(Kind::Rpc(Rpc { r#type: Type::VolumeMountGroup as i32 })) }]
    );
    // Not declared, so not served.
    let staged = client.call(node_client.node_stage_volume(csi::NodeStageVolumeRequest::default()));
    assert_eq!(staged.unwrap_err().code(), Code::Unimplemented);

    let target = node.target("pod-a");
    let source = checkpoint.display().to_string();
    let good = || publish_request("vol-a", &target, &[("source", &source)], &[]);
    // Missing fields and unsupported capabilities: INVALID_ARGUMENT, nothing made.
    let mut cases: Vec<(&str, csi::NodePublishVolumeRequest)> = Vec::new();
    cases.push(("no volume id", csi::NodePublishVolumeRequest { volume_id: String::new(), ..good() }));
    cases.push(("no target", csi::NodePublishVolumeRequest { target_path: String::new(), ..good() }));
    cases.push(("no capability", csi::NodePublishVolumeRequest { volume_capability: None, ..good() }));
    let mut block = good();
    block.volume_capability.as_mut().unwrap().access_type = Some(AccessType::Block(BlockVolume {}));
    cases.push(("block", block));
    let mut writer = good();
    writer.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: Mode::SingleNodeWriter as i32 });
    writer.readonly = false;
    cases.push(("writable", writer));
    cases.push(("no source", publish_request("vol-a", &target, &[], &[])));
    cases.push((
        "unknown attribute",
        publish_request("vol-a", &target, &[("source", &source), ("cacheDir", "/etc")], &[]),
    ));
    cases.push((
        "unknown secret",
        publish_request("vol-a", &target, &[("source", &source)], &[("password", "hunter2-secret")]),
    ));
    for (case, request) in cases {
        let status = refused(client.publish(request));
        assert_eq!(status.code(), Code::InvalidArgument, "{case}: {status:?}");
        assert!(!status.message().contains("hunter2-secret"), "{case}: {status:?}");
        assert!(!target.exists(), "{case}: the target was made");
    }
    assert_eq!(refused(client.unpublish("", &target)).code(), Code::InvalidArgument);
    assert_eq!(refused(client.unpublish("vol-a", Path::new(""))).code(), Code::InvalidArgument);

    // A writer mode published read-only is what kubelet asks for an inline volume: taken.
    let mut inline = good();
    inline.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: Mode::SingleNodeWriter as i32 });
    client.publish(inline).expect("publish");
    assert!(is_mounted(&target), "the target was not mounted");
    client.publish(good()).expect("a second publish of the same volume is a success");
    assert_reads_reference(&target, &reference(&checkpoint));
    assert!(std::fs::write(target.join("new"), b"x").is_err(), "the target is read-only");
    assert_eq!(node.volumes().len(), 1);
    let volume = node.volumes().remove(0);
    let daemon = node.daemon(&volume).expect("the volume's daemon runs");
    // Another source at a published target: ALREADY_EXISTS (the spec's "incompatible").
    let other = publish_request("vol-a", &target, &[("source", &source), ("npy", "true")], &[]);
    assert_eq!(refused(client.publish(other)).code(), Code::AlreadyExists);

    client.unpublish("vol-a", &target).expect("unpublish");
    assert!(!is_mounted(&target) && !target.exists(), "the target was not removed");
    assert!(node.volumes().is_empty(), "the shared mount outlived its last target");
    assert!(wait_until(TIMEOUT, || !daemon.is_alive()), "the daemon outlived its mount");
    client.unpublish("vol-a", &target).expect("a second unpublish is a success");
    assert!(node.mounts().is_empty());
}

#[test]
fn a_pod_with_no_fuse_and_no_privilege_reads_every_tensor() {
    if not_root("stfs csi mounts as root") || !users::nonroot_tools() {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let plugin = Plugin::start(&node, &[]);
    let mut client = Client::connect(&plugin);
    let target = node.target("pod-a");
    let mut request = publish_request("vol-a", &target, &[("source", &checkpoint.display().to_string())], &[]);
    if let Some(AccessType::Mount(mount)) = &mut request.volume_capability.as_mut().unwrap().access_type {
        mount.volume_mount_group = "4321".into();
    }
    client.publish(request).expect("publish");
    let expected = reference(&checkpoint);
    let names: Vec<String> = expected.keys().map(|n| file_name(n)).collect();
    // The pod: a mount namespace of its own with a /dev that has no fuse, the target bound into
    // it, then nobody with no capability and no_new_privs, hashing every tensor file.
    let inside = node.path().join("pod-root");
    std::fs::create_dir(&inside).unwrap();
    let script = format!(
        "set -e
         mount -t tmpfs -o mode=0755 pod-dev /dev
         mount --bind -o ro {target} {inside}
         cd {inside}
         exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all \
           --no-new-privs sh -c 'test ! -e /dev/fuse && echo no-fuse; grep -E \"^(CapEff|NoNewPrivs)\" /proc/self/status; \
           stat -c \"group %g\" \"$1\"; shift; sha256sum -- \"$@\"' pod \"$@\"",
        target = target.display(),
        inside = inside.display()
    );
    let first = names[0].clone();
    let mut pod = Command::new("unshare");
    pod.args(["-m", "--propagation", "private", "sh", "-c", &script, "pod", &first]).args(&names);
    let out = output_within(&mut pod, TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the pod failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("no-fuse\n"), "{text}");
    assert!(text.contains("CapEff:\t0000000000000000") && text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("group 4321"), "the pod's fsGroup is not the files' group: {text}");
    for (name, bytes) in &expected {
        let digest = stfs::csi::state::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
        let line = format!("{digest}  {}", file_name(name));
        assert!(text.lines().any(|l| l == line), "{name}: not read whole by the pod: {text}");
    }
    client.unpublish("vol-a", &target).expect("unpublish");
    assert!(wait_unmounted(&target));
}

/// The test S3 server with a gate in front counting the body bytes it serves.
struct CountingS3 {
    server: S3Server,
    gate: S3Gate,
    served: Arc<AtomicU64>,
}

impl CountingS3 {
    fn start(server: S3Server) -> CountingS3 {
        let served = Arc::new(AtomicU64::new(0));
        let (port, count) = (server.port, served.clone());
        let gate = S3Gate::start(port, move |request| {
            let response = s3server::forward(port, request);
            if request.method == "GET" {
                count.fetch_add(response.body.len() as u64, Ordering::Relaxed);
            }
            Some(response)
        });
        CountingS3 { server, gate, served }
    }

    /// Puts a checkpoint of `tensors` at `key`; returns its reference file (a local copy).
    fn put(&self, key: &str, tensors: &[T], node: &Node) -> PathBuf {
        let copy = node.path().join(key.replace('/', "_"));
        write_checkpoint(&copy, tensors, None);
        std::fs::copy(&copy, self.server.object(key)).unwrap();
        copy
    }

    fn attributes(&self, key: &str) -> Vec<(String, String)> {
        vec![
            ("source".into(), format!("s3://{BUCKET}/{key}")),
            ("endpointUrl".into(), self.gate.endpoint()),
            ("region".into(), "us-east-1".into()),
            ("blockSize".into(), "64K".into()),
        ]
    }
}

fn pairs(owned: &[(String, String)]) -> Vec<(&str, &str)> {
    owned.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[test]
fn three_pods_share_one_daemon_and_the_origin_serves_each_byte_once() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let s3 = CountingS3::start(s3_or_skip!());
    let node = Node::new();
    let checkpoint = s3.put("shared.safetensors", &s3server::fixture(), &node);
    let size = std::fs::metadata(&checkpoint).unwrap().len();
    let cache = node.path().join("node-cache");
    let plugin = Plugin::start_with(&node, &[], &["--cache-dir", cache.to_str().unwrap()]);
    let mut client = Client::connect(&plugin);
    let attributes = s3.attributes("shared.safetensors");
    let secrets = [("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)];
    let expected = reference(&checkpoint);
    let targets: Vec<PathBuf> = ["pod-a", "pod-b", "pod-c"].iter().map(|p| node.target(p)).collect();
    for (i, target) in targets.iter().enumerate() {
        client.publish(publish_request(&format!("vol-{i}"), target, &pairs(&attributes), &secrets)).expect("publish");
    }
    assert_eq!(node.volumes().len(), 1, "three pods of one source and options share one mount");
    let volume = node.volumes().remove(0);
    let daemon = node.daemon(&volume).expect("its daemon");
    let threads: Vec<_> = targets
        .iter()
        .map(|target| {
            let (target, expected) = (target.clone(), expected.clone());
            std::thread::spawn(move || assert_reads_reference(&target, &expected))
        })
        .collect();
    for thread in threads {
        thread.join().expect("a pod's reads");
    }
    let served = s3.served.load(Ordering::Relaxed);
    assert!(served >= size - 4096, "the origin served {served} bytes of {size}: not everything was read through it");
    assert!(
        served <= size + 128 * 1024,
        "the origin served {served} bytes for a {size}-byte checkpoint read by 3 pods"
    );
    // Each unpublish but the last leaves the mount to the others.
    for (i, target) in targets.iter().enumerate() {
        client.unpublish(&format!("vol-{i}"), target).expect("unpublish");
        assert!(!target.exists());
        let last = i == targets.len() - 1;
        assert_eq!(node.volumes().len(), if last { 0 } else { 1 });
        if !last {
            assert!(daemon.is_alive());
            assert_reads_reference(&targets[2], &expected);
        }
    }
    assert!(wait_until(TIMEOUT, || !daemon.is_alive()), "the daemon outlived its last pod");
    // A new pod after the churn: a new daemon, its blocks from the node's cache folder.
    let before = s3.served.load(Ordering::Relaxed);
    let target = node.target("pod-d");
    client.publish(publish_request("vol-d", &target, &pairs(&attributes), &secrets)).expect("publish");
    assert_reads_reference(&target, &expected);
    let again = s3.served.load(Ordering::Relaxed) - before;
    assert!(again <= 128 * 1024, "the origin served {again} bytes again despite the node cache");
    client.unpublish("vol-d", &target).expect("unpublish");
}

#[test]
fn an_hf_volume_reads_as_the_reference_reader() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    // The hub's layout on nginx: the revision API and the resolve URLs of one public repository.
    let Some(hub) = nginx::Nginx::start_with_directives("default_type application/json;") else {
        return tool_missing("nginx", "apt-get install nginx");
    };
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let (repo, sha) = ("org/model", "0123456789abcdef0123456789abcdef01234567");
    let bytes = std::fs::read(&checkpoint).unwrap();
    hub_repo::publish(&hub.root, repo, sha, &["main"], &[("model.safetensors", bytes)]);
    let endpoint = format!("http://127.0.0.1:{}", hub.port);
    let plugin = Plugin::start(&node, &[("HF_ENDPOINT", &endpoint)]);
    let mut client = Client::connect(&plugin);
    let target = node.target("pod-a");
    let attributes = [("source", "hf://org/model@main"), ("csi.storage.k8s.io/ephemeral", "true")];
    client.publish(publish_request("vol-a", &target, &attributes, &[])).expect("publish");
    assert_reads_reference(&target, &reference(&checkpoint));
    client.unpublish("vol-a", &target).expect("unpublish");
    assert!(!target.exists() && node.volumes().is_empty());
}

#[test]
fn a_killed_plugin_leaves_pods_reading_and_a_new_plugin_unpublishes_them() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let expected = Arc::new(reference(&checkpoint));
    let mut plugin = Plugin::start(&node, &[]);
    let (_client, target, volume) = publish_one_pod(&node, &plugin, &checkpoint);
    let daemon = node.daemon(&volume).unwrap();
    // A pod reading in a loop while the plugin is SIGKILLed.
    let reader = PodReading::start(&target, &expected);
    plugin.kill();
    reader.finish();
    assert!(daemon.is_alive(), "the daemon died with the plugin");
    assert!(is_mounted(&target));

    let successor = Plugin::start(&node, &[]);
    let mut client = Client::connect(&successor);
    client.unpublish("vol-a", &target).expect("the new plugin unpublishes");
    assert!(!target.exists() && node.volumes().is_empty());
    assert!(wait_until(TIMEOUT, || !daemon.is_alive()), "the daemon outlived its last pod");
    assert!(node.mounts().is_empty(), "left mounted: {:?}", node.mounts());
}

#[test]
fn a_restarted_plugin_container_leaves_the_daemons_serving() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let Some(hierarchy) = Cgroup::hierarchy() else {
        tool_missing("a cgroup v2 hierarchy", "mount -t cgroup2 none /sys/fs/cgroup");
        return;
    };
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let expected = Arc::new(reference(&checkpoint));
    let name = |what: &str| hierarchy.join(format!("stfs-test-{}-{what}", std::process::id()));
    // Dropped last: the daemons' cgroup outlives both containers.
    let daemons_cgroup = name("daemons");
    let flags = ["--daemon-cgroup", daemons_cgroup.to_str().unwrap()];
    let first_container = Cgroup::new(name("container-1"));
    let plugin = Plugin::start_in(&node, &[], &flags, Some(&first_container));
    let daemons = Cgroup { path: daemons_cgroup.clone() };
    let (_client, target, volume) = publish_one_pod(&node, &plugin, &checkpoint);
    let daemon = node.daemon(&volume).unwrap();
    assert_eq!(daemons.pids(), vec![daemon.pid], "the daemon is not in --daemon-cgroup alone");
    assert_eq!(first_container.pids(), vec![plugin.child.id() as i32], "the plugin is not in its container");
    // The container stops (an upgrade, a failed liveness probe) while a pod reads.
    let reader = PodReading::start(&target, &expected);
    assert!(first_container.kill_all(), "the container's processes outlived cgroup.kill");
    reader.finish();
    assert!(daemon.is_alive(), "the daemon died with the plugin's container");
    // The new container's plugin finds the volume, shares the running daemon with a new pod, and
    // ends it with the last pod.
    let second_container = Cgroup::new(name("container-2"));
    let successor = Plugin::start_in(&node, &[], &flags, Some(&second_container));
    let mut client = Client::connect(&successor);
    let second = node.target("pod-b");
    client.publish(publish_request("vol-b", &second, &[("source", &checkpoint.display().to_string())], &[])).unwrap();
    assert_eq!(node.daemon(&volume), Some(daemon), "a second daemon for the same volume");
    assert_reads_reference(&second, &expected);
    client.unpublish("vol-a", &target).expect("the new plugin unpublishes the old pod");
    client.unpublish("vol-b", &second).expect("unpublish");
    assert!(node.volumes().is_empty() && node.mounts().is_empty(), "left: {:?}", node.mounts());
    assert!(wait_until(TIMEOUT, || !daemon.is_alive()), "the daemon outlived its last pod");
}

#[test]
fn a_host_user_reaches_no_volume_through_the_state_directory_nor_the_daemons_memory() {
    if not_root("stfs csi mounts as root") || !users::nonroot_tools() {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let plugin = Plugin::start(&node, &[]);
    let (mut client, target, volume) = publish_one_pod(&node, &plugin, &checkpoint);
    let daemon = node.daemon(&volume).unwrap();
    let shared = node.state().join("volumes").join(&volume).join("mount");
    let log = node.state().join("private").join(&volume).join("daemon.log");
    // As the daemons' own user (nobody: also a pod's here), and as another host user.
    for uid in ["65534", "4242"] {
        let as_user = |args: &[&str]| {
            let mut command = Command::new("setpriv");
            command.args(["--reuid", uid, "--regid", uid, "--clear-groups", "--"]).args(args);
            output_within(&mut command, TIMEOUT)
        };
        let listed = as_user(&["ls", shared.to_str().unwrap()]);
        assert!(
            !listed.status.success(),
            "uid {uid} lists the shared mount: {}",
            String::from_utf8_lossy(&listed.stdout)
        );
        let environ = format!("/proc/{}/environ", daemon.pid);
        let read = as_user(&["cat", &environ]);
        assert!(!read.status.success(), "uid {uid} reads the daemon's environment");
        let through_target = as_user(&["ls", target.to_str().unwrap()]);
        assert!(through_target.status.success(), "a pod's user no longer reads its target");
    }
    // The daemon still writes its log in its own folder, which only it and root enter.
    assert!(log.exists(), "no daemon log at {}", log.display());
    let private = std::fs::metadata(log.parent().unwrap()).unwrap();
    assert_eq!((private.uid(), private.mode() & 0o777), (65534, 0o700));
    client.unpublish("vol-a", &target).expect("unpublish");
    assert!(!log.parent().unwrap().exists(), "the daemon's folder outlived the volume");
}

#[test]
fn a_killed_daemon_is_recovered_by_the_next_publish() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let expected = reference(&checkpoint);
    let plugin = Plugin::start(&node, &[]);
    let mut client = Client::connect(&plugin);
    let source = checkpoint.display().to_string();
    let (first, second) = (node.target("pod-a"), node.target("pod-b"));
    client.publish(publish_request("vol-a", &first, &[("source", &source)], &[])).unwrap();
    let volume = node.volumes().remove(0);
    let dead = node.daemon(&volume).unwrap();
    // SAFETY: kill with a pid and a signal number.
    unsafe { libc::kill(dead.pid, libc::SIGKILL) };
    assert!(wait_until(TIMEOUT, || !dead.is_alive()));
    client.publish(publish_request("vol-b", &second, &[("source", &source)], &[])).expect("the publish recovers");
    let revived = node.daemon(&volume).expect("a new daemon");
    assert_ne!(revived.pid, dead.pid);
    assert_reads_reference(&second, &expected);
    assert!(plugin.log_text().contains("daemon is gone"), "{}", plugin.log_text());
    // The dead daemon's target is detached without being asked anything (it would answer ENOTCONN).
    client.unpublish("vol-a", &first).expect("unpublish the dead target");
    assert!(!first.exists());
    assert_reads_reference(&second, &expected);
    client.unpublish("vol-b", &second).expect("unpublish");
    assert!(node.volumes().is_empty() && node.mounts().is_empty(), "left: {:?}", node.mounts());
    assert!(wait_until(TIMEOUT, || !revived.is_alive()));
}

#[test]
fn secrets_are_on_no_command_line_in_no_log_and_in_no_error() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let s3 = CountingS3::start(s3_or_skip!());
    let node = Node::new();
    let checkpoint = s3.put("private.safetensors", &s3server::fixture(), &node);
    // Debug logging everywhere: the daemons inherit RUST_LOG.
    let plugin = Plugin::start(&node, &[("RUST_LOG", "stfs=debug")]);
    let mut client = Client::connect(&plugin);
    let attributes = s3.attributes("private.safetensors");
    let good = [("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)];
    let target = node.target("pod-a");
    client.publish(publish_request("vol-a", &target, &pairs(&attributes), &good)).expect("publish");
    assert_reads_reference(&target, &reference(&checkpoint));
    // A wrong secret: refused by the store, the error names no value.
    let wrong_secret = "wrong-secret-Zq81/never+shown";
    let wrong = [("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", wrong_secret)];
    let other = node.target("pod-b");
    let status = refused(client.publish(publish_request("vol-b", &other, &pairs(&attributes), &wrong)));
    assert!(!status.message().contains(wrong_secret), "{status:?}");
    assert!(status.message().contains("private.safetensors"), "the error names the object: {status:?}");
    for secret in [SECRET_KEY, wrong_secret] {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            // The test's own S3 server is given the right key on its command line.
            if cmdline.split(|&b| b == 0).next().is_some_and(|program| program.ends_with(b"s3s-fs")) {
                continue;
            }
            assert!(
                !cmdline.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "a secret on the command line of {:?}",
                entry.file_name()
            );
        }
        let mut logs = vec![plugin.log.clone()];
        for volume in node.volumes() {
            logs.push(node.state().join("volumes").join(volume).join("private/daemon.log"));
        }
        assert!(logs.len() >= 2, "no daemon log: {logs:?}");
        for log in &logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(!text.contains(secret), "a secret in {}", log.display());
        }
    }
    client.unpublish("vol-a", &target).expect("unpublish");
    client.unpublish("vol-b", &other).expect("unpublish a failed publish");
    assert!(node.volumes().is_empty() && node.mounts().is_empty());
}

/// A loopback TCP server that accepts connections and never answers: a source that never opens.
/// Counts the connections; they are kept open until the process ends.
fn silent_server() -> (String, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/never.safetensors", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::Relaxed);
            open.push(stream);
        }
    });
    (url, accepted)
}

#[test]
fn a_source_that_never_answers_holds_up_no_other_volume() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let expected = reference(&checkpoint);
    let plugin = Plugin::start(&node, &[]);
    let (url, accepted) = silent_server();
    let stuck_target = node.target("pod-stuck");
    let stuck = {
        let mut client = Client::connect(&plugin);
        let request = publish_request("vol-stuck", &stuck_target, &[("source", &url), ("timeout", "40s")], &[]);
        std::thread::spawn(move || client.publish(request).is_ok())
    };
    assert!(wait_until(TIMEOUT, || accepted.load(Ordering::Relaxed) > 0), "the daemon never connected");
    let mut client = Client::connect(&plugin);
    let started = std::time::Instant::now();
    let target = node.target("pod-a");
    let source = checkpoint.display().to_string();
    client.publish(publish_request("vol-a", &target, &[("source", &source)], &[])).expect("publish");
    assert_reads_reference(&target, &expected);
    client.unpublish("vol-a", &target).expect("unpublish");
    let took = started.elapsed();
    assert!(!stuck.is_finished(), "the silent source's publish ended already: the test proves nothing");
    assert!(took < Duration::from_secs(20), "another volume waited {took:?} behind a source that never answers");
    assert!(!stuck.join().unwrap_or(false), "a source that never answers was published");
    client.unpublish("vol-stuck", &stuck_target).expect("unpublish the failed publish");
}

/// The environment of process `pid`: its `NAME=VALUE` entries.
fn environment_of(pid: i32) -> Vec<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    bytes.split(|&b| b == 0).map(|e| String::from_utf8_lossy(e).into_owned()).collect()
}

#[test]
fn daemons_use_the_nodes_cloud_identity_only_when_the_plugin_allows_it() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let switches = ["AWS_EC2_METADATA_DISABLED=true", "STFS_NO_AMBIENT_CREDENTIALS=1"];
    for allowed in [false, true] {
        let node = Node::new();
        let (checkpoint, _) = local_checkpoint(&node);
        let flags: &[&str] = if allowed { &["--allow-node-credentials"] } else { &[] };
        // The plugin's own environment says the metadata server may be asked.
        let plugin = Plugin::start_with(&node, &[("AWS_EC2_METADATA_DISABLED", "false")], flags);
        let mut client = Client::connect(&plugin);
        let target = node.target("pod-a");
        let source = checkpoint.display().to_string();
        client.publish(publish_request("vol-a", &target, &[("source", &source)], &[])).expect("publish");
        let daemon = node.daemon(&node.volumes()[0]).expect("a daemon");
        let environment = environment_of(daemon.pid);
        for switch in switches {
            assert_eq!(environment.iter().any(|e| e == switch), !allowed, "{switch} (allowed: {allowed})");
        }
        client.unpublish("vol-a", &target).expect("unpublish");
    }
}

#[test]
fn a_signed_urls_query_is_on_no_command_line() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let expected = reference(&checkpoint);
    let bytes = std::fs::read(&checkpoint).unwrap();
    let server = tinyhttp::TinyHttp::start(move |request| {
        let Some((first, last)) = tinyhttp::parse_range(request.headers.get("range"), bytes.len()) else {
            return tinyhttp::Response::new(200, bytes.clone());
        };
        tinyhttp::Response::new(206, bytes[first..=last].to_vec())
            .header("Content-Range", format!("bytes {first}-{last}/{}", bytes.len()))
            .header("ETag", "\"fixed\"")
    });
    let signature = "X-Amz-Signature=secret-Qz71never-shown";
    let url = format!("{}/model.safetensors?{signature}", server.url());
    let plugin = Plugin::start(&node, &[]);
    let mut client = Client::connect(&plugin);
    let target = node.target("pod-a");
    client.publish(publish_request("vol-a", &target, &[("source", &url)], &[])).expect("publish");
    assert_reads_reference(&target, &expected);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        assert!(
            !cmdline.windows(signature.len()).any(|w| w == signature.as_bytes()),
            "the signature on the command line of {:?}",
            entry.file_name()
        );
    }
    client.unpublish("vol-a", &target).expect("unpublish");
}

#[test]
fn a_folder_the_daemon_user_planted_does_not_stop_the_plugin_from_starting() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    // A volume left without users, whose daemon's user made folders in its private folder.
    let volume = node.state().join("volumes").join("0123456789abcdef0123456789abcdef");
    let private = node.state().join("private").join("0123456789abcdef0123456789abcdef");
    let planted = private.join("planted/deeper");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(planted.join("file"), b"x").unwrap();
    std::fs::create_dir_all(volume.join("mount")).unwrap();
    std::fs::create_dir_all(volume.join("users")).unwrap();
    let plugin = Plugin::start(&node, &[]);
    let mut client = Client::connect(&plugin);
    assert!(wait_until(TIMEOUT, || !volume.exists()), "the unused volume was not ended: {}", plugin.log_text());
    assert!(!private.exists(), "its daemon's folder was left");
    let (checkpoint, _) = local_checkpoint(&node);
    let target = node.target("pod-a");
    let source = checkpoint.display().to_string();
    client.publish(publish_request("vol-a", &target, &[("source", &source)], &[])).expect("publish");
    assert_reads_reference(&target, &reference(&checkpoint));
    client.unpublish("vol-a", &target).expect("unpublish");
}

#[test]
fn a_target_that_is_a_symbolic_link_is_refused_and_removed_unfollowed() {
    if not_root("stfs csi mounts as root") {
        return;
    }
    let node = Node::new();
    let (checkpoint, _) = local_checkpoint(&node);
    let plugin = Plugin::start(&node, &[]);
    let mut client = Client::connect(&plugin);
    let elsewhere = node.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("kept"), b"x").unwrap();
    let target = node.target("pod-a");
    std::os::unix::fs::symlink(&elsewhere, &target).unwrap();
    let source = checkpoint.display().to_string();
    let status = refused(client.publish(publish_request("vol-a", &target, &[("source", &source)], &[])));
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(!is_mounted(&elsewhere), "the link was followed");
    client.unpublish("vol-a", &target).expect("unpublish");
    assert!(std::fs::symlink_metadata(&target).is_err(), "the link is left");
    assert!(elsewhere.join("kept").exists(), "the link's destination was touched");
    assert!(node.mounts().is_empty(), "left: {:?}", node.mounts());
}
