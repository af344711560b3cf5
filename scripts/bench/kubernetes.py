#!/usr/bin/env python3
"""Kubernetes benchmark: a pod's start on a model through the stfs CSI volume against the usual init
step that downloads the whole checkpoint first, on S3 behind the latency proxy of s3.py.

The bench S3 server (scripts/bench/s3server) serves a generated checkpoint on loopback behind its
proxy (20 ms per request, 100 MiB/s per connection, counting the bytes it relays from the server).
`stfs csi` runs as on a node (started before the clock, as a DaemonSet's plugin is there before any
pod); the bench plays kubelet through its socket with a gRPC client (csi_client.py, from the vendored
csi.proto). Each variant, interleaved in every repetition, cold (a new mount; no node cache):

  csi          NodePublishVolume (s3://, keys as the volume's secret) to a pod's target, then the pod
               reads every tensor file in file order (1 MiB reads); timed to the first tensor's last
               byte and to every byte, from the publish call.
  init+load    the usual pattern: an init container downloads the whole object as aws-cli does
               (8 MiB ranged GETs, 10 at a time, of a presigned URL, written to a local file), then the
               app reads every tensor from it; timed the same, from the download's start.
  4 pods       four publishes of the same source on one node (four pods' volumes), then the four pods
               read every tensor at once: the origin's bytes (at the proxy) over the checkpoint's size.
               Four init containers would fetch it four times.

Targets (issue 46): first tensor >= 5x sooner, every byte >= 1.3x sooner than init+load; 4 pods on one
node: origin bytes <= 1.05x the checkpoint.
Needs root, /dev/fuse, cargo, rclone and curl (installed as s3.py installs them), and the
scripts/kubernetes_venv virtualenv's grpcio (this script runs itself in it when its python lacks it).

  python3 scripts/bench/kubernetes.py --stfs "$(scripts/cargo_bin --release --bin stfs)"            # 1 GiB, 3 repetitions
  python3 scripts/bench/kubernetes.py --stfs "$(scripts/cargo_bin --release --bin stfs)" --quick    # 32 MiB smoke run
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
from remote_options import add_remote_options  # noqa: E402

CHUNK = 1 << 20
AWS_PART = 8 << 20  # aws-cli's multipart_chunksize
AWS_CONCURRENCY = 10  # aws-cli's max_concurrent_requests
PLUGIN_START_S = 30


def in_kubernetes_venv():
    """Runs this script again in scripts/kubernetes_venv's python unless grpc imports here."""
    try:
        import grpc  # noqa: F401
        return
    except ImportError:
        pass
    python = subprocess.run([os.path.join(REPO, "scripts", "kubernetes_venv")], check=True, capture_output=True,
                            text=True, timeout=600).stdout.strip()
    os.execv(python, [python, *sys.argv])


class CountingProxy:
    """s3.py's Rust proxy with --count: `relayed()` is the server's body bytes relayed so far."""

    def __init__(self, upstream_port, latency, conn_rate):
        program = os.path.join(cargo_paths.target_dir(), "bench-s3server", "release", "stfs-bench-proxy")
        self.proc = subprocess.Popen([program, str(upstream_port), str(latency * 1000), str(conn_rate / 2**20), "--count"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def relayed(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Plugin:
    """`stfs csi` on a socket in `workdir`, with a state folder of its own and no node cache."""

    def __init__(self, stfs, workdir):
        import csi_client

        self.socket = os.path.join(workdir, "csi.sock")
        state = os.path.join(workdir, "state")
        os.makedirs(state)
        self.log = os.path.join(workdir, "plugin.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([stfs, "csi", "--endpoint", f"unix://{self.socket}", "--node-id", "bench",
                                          "--state-dir", state], stderr=log)
        deadline = time.monotonic() + PLUGIN_START_S
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"kubernetes.py: stfs csi did not make {self.socket} within {PLUGIN_START_S} s")
            time.sleep(0.01)
        self.client = csi_client.Client(f"unix://{self.socket}")

    def log_tail(self, lines=20):
        with open(self.log) as f:
            return "".join(f.readlines()[-lines:])

    def stop(self):
        if getattr(self, "client", None) is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def read_tensors(root, tensors, on_first=None):
    """Reads every tensor file under `root` in file order, 1 MiB at a time; calls `on_first()` once
    the first tensor's last byte is in. Returns the bytes read."""
    total = 0
    for i, (name, _, length) in enumerate(tensors):
        got = 0
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            while data := f.read(CHUNK):
                got += len(data)
        if got != length:
            raise RuntimeError(f"{name}: {got} bytes read, {length} expected")
        total += got
        if i == 0 and on_first is not None:
            on_first()
    return total


def read_from_checkpoint(path, tensors, on_first):
    """The app's load after the init step: every tensor's bytes from the downloaded checkpoint."""
    total = 0
    with open(path, "rb", buffering=0) as f:
        for i, (_, offset, length) in enumerate(tensors):
            at = 0
            while at < length:
                data = os.pread(f.fileno(), min(CHUNK, length - at), offset + at)
                if not data:
                    raise RuntimeError(f"{path}: ends inside a tensor")
                at += len(data)
            total += at
            if i == 0:
                on_first()
    return total


def download(url, path, size):
    """aws-cli's way: AWS_PART ranged GETs, AWS_CONCURRENCY at a time, each connection kept alive,
    written at their offsets into `path`."""
    parsed = urllib.parse.urlsplit(url)
    target = parsed.path + (f"?{parsed.query}" if parsed.query else "")
    parts = [(at, min(size, at + AWS_PART)) for at in range(0, size, AWS_PART)]
    local = threading.local()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)

        def fetch(part):
            start, end = part
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
            local.conn.request("GET", target, headers={"Range": f"bytes={start}-{end - 1}"})
            response = local.conn.getresponse()
            if response.status != 206:
                raise RuntimeError(f"ranged GET of {start}-{end - 1}: HTTP {response.status}")
            buf = bytearray(end - start)
            view, at = memoryview(buf), 0
            while at < len(buf):
                n = response.readinto(view[at:])
                if not n:
                    raise RuntimeError(f"ranged GET of {start}-{end - 1}: the body ended early")
                at += n
            os.pwrite(fd, buf, start)

        with ThreadPoolExecutor(AWS_CONCURRENCY) as pool:
            list(pool.map(fetch, parts))
    finally:
        os.close(fd)


class Bench:
    def __init__(self, args, workdir, plugin, proxy, endpoint, presigned, size, tensors):
        self.args, self.workdir, self.plugin, self.proxy = args, workdir, plugin, proxy
        self.endpoint, self.presigned, self.size, self.tensors = endpoint, presigned, size, tensors
        self.volumes = 0

    def attributes(self):
        return {"source": f"s3://{BUCKET}/model.safetensors", "endpointUrl": self.endpoint, "region": "us-east-1"}

    def secrets(self):
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}

    def target(self):
        """A pod's volume folder, as kubelet makes it (pods/UID/volumes/.../mount)."""
        self.volumes += 1
        path = os.path.join(self.workdir, "pods", f"pod-{self.volumes}", "mount")
        os.makedirs(path)
        return f"bench-{self.volumes}", path

    def publish(self):
        volume, path = self.target()
        self.plugin.client.publish(volume, path, self.attributes(), self.secrets())
        return volume, path

    def unpublish(self, volume, path):
        self.plugin.client.unpublish(volume, path)  # removes the target, as the spec has it

    def csi(self):
        first = []
        started = time.perf_counter()
        volume, path = self.publish()
        self.published = time.perf_counter() - started
        try:
            read_tensors(path, self.tensors, lambda: first.append(time.perf_counter() - started))
            return first[0], time.perf_counter() - started
        finally:
            self.unpublish(volume, path)

    def init_and_load(self):
        path = os.path.join(self.workdir, "init-download.safetensors")
        first = []
        started = time.perf_counter()
        try:
            download(self.presigned, path, self.size)
            self.downloaded = time.perf_counter() - started
            read_from_checkpoint(path, self.tensors, lambda: first.append(time.perf_counter() - started))
            return first[0], time.perf_counter() - started
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def pods(self, count=4):
        """`count` publishes of one source, then `count` readers at once: (seconds to the last
        reader's end, origin bytes / checkpoint size)."""
        before = self.proxy.relayed()
        started = time.perf_counter()
        published = []
        try:
            for _ in range(count):
                published.append(self.publish())
            errors = []

            def pod(path):
                try:
                    read_tensors(path, self.tensors)
                except Exception as e:  # reported below: a failed pod fails the run
                    errors.append(e)
            readers = [threading.Thread(target=pod, args=(path,)) for _, path in published]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join(timeout=600)
            if errors or any(r.is_alive() for r in readers):
                raise RuntimeError(f"a pod's read failed: {errors or 'still reading after 600 s'}")
            took = time.perf_counter() - started
        finally:
            for volume, path in published:
                self.unpublish(volume, path)
        return took, (self.proxy.relayed() - before) / self.size


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_remote_options(p, reps=3, quick="32 MiB, 1 repetition: a smoke run")
    args = p.parse_args()
    in_kubernetes_venv()
    import remote
    import s3
    from remote import summary, wait_port, write_checkpoint

    global BUCKET, KEY_ID, SECRET
    BUCKET, KEY_ID, SECRET = s3.BUCKET, s3.KEY_ID, s3.SECRET
    if args.quick:
        remote.JUDGED = False
        args.size_mb, args.reps, args.tensor_mb = 32, 1, min(args.tensor_mb, 4)
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        sys.exit("kubernetes.py: the CSI plugin mounts: run as root, with /dev/fuse")
    s3.need_tools()
    server = s3.server_command("bench")
    args.stfs = os.path.abspath(args.stfs)
    with tempfile.TemporaryDirectory(prefix="stfs-bench-kube-") as workdir:
        os.chmod(workdir, 0o755)  # the mount daemons run as nobody and reach their state folder through it
        root = os.path.join(workdir, "store")
        os.makedirs(os.path.join(root, BUCKET))
        header = os.path.join(workdir, "model.safetensors")
        tensors = write_checkpoint(header, args.size_mb << 20, args.tensor_mb)
        size = os.path.getsize(header)
        port, proxy, plugin = remote.free_port(), None, None
        store = subprocess.Popen([*server, "--port", str(port), "--access-key", KEY_ID, "--secret-key", SECRET, root],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port)
            subprocess.run(["rclone", "copyto", header, f"b:{BUCKET}/model.safetensors", "--s3-upload-cutoff", "5G"],
                           check=True, env=s3.rclone_env(f"http://127.0.0.1:{port}"), stderr=subprocess.DEVNULL)
            os.unlink(header)  # the store's copy is the only one: every byte read comes through the proxy
            proxy = CountingProxy(port, args.latency_ms / 1000, args.conn_mib_s * 2**20)
            endpoint = f"http://127.0.0.1:{proxy.port}"
            presigned = subprocess.run(["rclone", "link", f"b:{BUCKET}/model.safetensors", "--expire", "1h"], check=True,
                                       env=s3.rclone_env(endpoint), capture_output=True, text=True).stdout.strip()
            plugin = Plugin(args.stfs, workdir)
            bench = Bench(args, workdir, plugin, proxy, endpoint, presigned, size, tensors)
            print(f"checkpoint {size / 2**20:.0f} MiB, {len(tensors)} tensors of ~{args.tensor_mb} MiB on the bench S3 "
                  f"server; the proxy adds {args.latency_ms:g} ms per request, {args.conn_mib_s:g} MiB/s per connection; "
                  f"{args.reps} repetitions, interleaved; plugin {plugin.client.plugin_info()}", flush=True)
            runs = {name: [] for name in ("csi publish", "csi first", "csi all", "init+load first", "init+load all", "download",
                                          "4 pods", "4 pods origin")}
            for rep in range(args.reps):
                first, every = bench.csi()
                runs["csi publish"].append(bench.published)
                runs["csi first"].append(first)
                runs["csi all"].append(every)
                first, every = bench.init_and_load()
                runs["init+load first"].append(first)
                runs["init+load all"].append(every)
                runs["download"].append(bench.downloaded)
                took, origin = bench.pods()
                runs["4 pods"].append(took)
                runs["4 pods origin"].append(origin)
                print(f"  rep {rep + 1}: csi {runs['csi first'][-1]:.3f} s to the first tensor, {runs['csi all'][-1]:.3f} s "
                      f"to every byte; init+load {runs['init+load first'][-1]:.3f} s, {runs['init+load all'][-1]:.3f} s; "
                      f"4 pods {took:.3f} s, origin {origin:.3f}x", flush=True)
        except BaseException:
            if plugin is not None:
                print(f"the plugin's last log lines:\n{plugin.log_tail()}", file=sys.stderr)
            raise
        finally:
            if plugin is not None:
                plugin.stop()
            if proxy is not None:
                proxy.stop()
            store.terminate()
            store.wait()
    for name, values in runs.items():
        if name != "4 pods origin":
            print(f"{name:16} {summary(values)}")
    pairs = {k: [b / a for a, b in zip(runs[f"csi {k}"], runs[f"init+load {k}"])] for k in ("first", "all")}

    def target(label, ratio, goal):
        print(f"{label:44} {ratio:6.2f}x  target >= {goal}x  {remote.verdict(ratio >= goal)}")
    target("first tensor: init+load / csi (paired)", statistics.median(pairs["first"]), 5)
    target("every byte: init+load / csi (paired)", statistics.median(pairs["all"]), 1.3)
    origin = max(runs["4 pods origin"])
    print(f"{'4 pods on one node: origin bytes / checkpoint':44} {origin:6.3f}x  target <= 1.05x  "
          f"{remote.verdict(origin <= 1.05)}  (4 init downloads: 4x)")
    print(json.dumps({k: round(statistics.median(v), 4) for k, v in runs.items()}))


if __name__ == "__main__":
    main()
