#!/usr/bin/env python3
"""S3 benchmark: stfs s3:// against s3fs and rclone mount (each with safetensors.safe_open) and
against downloading then loading, all through one latency-adding, per-connection-paced proxy.

s3s-fs's store (a real S3 server checking SigV4 signatures) serves a generated checkpoint on loopback;
a proxy adds a fixed latency to every request (20 ms) and paces each connection's responses
(100 MiB/s), standing in for a distant object store. Each measurement is a fresh (cold)
mount, mount time included, unmount excluded; the variants are interleaved in every repetition.
Each load runs in its own process (load.py), started before the clock: Python up, numpy and
safetensors imported, the header read; the clock then runs from the mount to the load's end, as
loaders.py times its loaders (the interpreter's start, measured too, is printed apart as "loader
start": no storage makes it shorter, and a serving process pays it long before it loads).

  stfs all       stfs mount s3://... + np.fromfile of every tensor file, in file order
  s3fs all       s3fs mount + safe_open(numpy) + get_tensor of every tensor
  rclone all     rclone mount (S3 remote, no VFS cache) + safe_open + every tensor
  download+load  rclone copy of the object to local disk + safe_open + every tensor
  stfs one       stfs mount + the middle tensor (~16 MiB)
  stfs 4w        stfs mount + 4 workers forked after opening, each loading every 4th tensor
  s3fs 4w        s3fs mount + safe_open, then 4 forked workers, each loading every 4th tensor
  stfs local     stfs mount of the local copy of the checkpoint (page cache) + the same load: the
                 daemon's cost of the FUSE hop alone, for the CPU table
  stfs again     a second load of every tensor on one mount, its page cache dropped in between (the
                 first load untimed): the steady-state CPU of a long-lived mount, for the CPU table
  ceiling        no mount: the object pulled through the proxy by 16 parallel ranged GETs of a
                 presigned URL (curl to /dev/null), the fastest any client gets it here; with the
                 per-connection pace, 16 connections are past the point where more stop helping
  ceiling 8      the same with 8 connections (a remote stream's lanes were 8 until issue 24; now 16)

Targets (issue 16): stfs all >= 3x faster than s3fs and rclone, >= 2x faster than download+load;
one tensor < 5% of the download time; 4 workers >= 10x faster than through s3fs. Issue 24: stfs all
within 0.6x of the ceiling's speed (ceiling time / stfs time, paired by repetition); the stfs
daemon's CPU-seconds per GiB of the checkpoint (process_cpu_micros from its stats.json after the
load, before the unmount) is reported beside the same figure for s3fs's and rclone's daemons (from
/proc/PID/stat), for stfs on the local copy (the FUSE hop alone) and for the ceiling's curls (the
receive alone).
The harness is built here with cargo (scripts/bench/s3server, into target/bench-s3server), cheap
enough not to be what the variants measure on a 2-vCPU machine: the server is s3s-fs's store with
a GET body read 1 MiB at a time (the `s3s-fs` binary reads it 4 KiB at a time and then caps every
client at ~240 MiB/s over all connections), and the proxy is remote.py's LatencyProxy in Rust,
relaying bodies with splice (0.34 CPU-seconds per GiB, the Python one 0.65). `--server s3s-fs`
and `--proxy python` run the old ones.
Needs cargo, s3fs and rclone (Debian: installed here with apt-get when run as root), python3 with
numpy and safetensors.

  python3 scripts/bench/s3.py --stfs "$(scripts/cargo_bin --release --bin stfs)"                   # 1 GiB, 5 repetitions
  python3 scripts/bench/s3.py --stfs "$(scripts/cargo_bin --release --bin stfs)" --quick           # 32 MiB smoke run
"""
import argparse
import json
import os
import resource
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
from mounts import is_mounted, wait_mounted  # noqa: E402
import remote  # noqa: E402
from remote_options import add_remote_options  # noqa: E402
from remote import LatencyProxy, free_port, summary, wait_port, write_checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
SERVER_CRATE = os.path.join(HERE, "s3server")
BUCKET = "bench"
KEY_ID, SECRET = "AKIASTFSBENCH0000001", "stfs-bench-secret-key-000000000000000"
LOAD = os.path.join(HERE, "load.py")


def env():
    """No proxy settings, the bench's keys, no instance metadata lookups."""
    e = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("AWS_")}
    e.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
             AWS_EC2_METADATA_DISABLED="true")
    return e


def rclone_env(endpoint):
    e = env()
    e.update(RCLONE_CONFIG_B_TYPE="s3", RCLONE_CONFIG_B_PROVIDER="Other", RCLONE_CONFIG_B_ENDPOINT=endpoint,
             RCLONE_CONFIG_B_ACCESS_KEY_ID=KEY_ID, RCLONE_CONFIG_B_SECRET_ACCESS_KEY=SECRET,
             RCLONE_CONFIG_B_FORCE_PATH_STYLE="true", RCLONE_CONFIG_B_REGION="us-east-1")
    return e


def load(mode, target, header, workers=1):
    """An untimed load: the whole load.py process."""
    cmd = [sys.executable, LOAD, mode, target, "--header", header, "--workers", str(workers)]
    subprocess.run(cmd, check=True, env=env(), stdout=subprocess.DEVNULL, timeout=600)


class Loader:
    """A load.py process started before the clock: once it says "ready", Python is up, numpy (and
    safetensors) imported and the header read, so `go` times the load alone. `start` is the seconds
    that took (the part of a cold process's time no storage changes)."""

    def __init__(self, mode, target, header, workers=1):
        cmd = [sys.executable, LOAD, mode, target, "--header", header, "--workers", str(workers), "--wait-go"]
        began = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env(), text=True)
        try:
            if not select.select([self.proc.stdout], [], [], 60)[0] or self.proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"load.py {mode} did not say ready within 60 s")
        except BaseException:
            self.close()
            raise
        self.start = time.perf_counter() - began

    def go(self):
        """Runs the load and waits for it (at most 600 s)."""
        self.proc.communicate("go\n", timeout=600)
        if self.proc.returncode != 0:
            raise RuntimeError(f"load.py failed (exit {self.proc.returncode})")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def process_cpu(pid):
    """CPU-seconds (user + system, system) a live process has used, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    utime, stime = int(fields[14 - 3]), int(fields[15 - 3])
    return (utime + stime) / ticks, stime / ticks


def busy_cpu_seconds():
    """Seconds of CPU time the whole machine has spent busy (every state but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def pids_of(name):
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def unmount(mp):
    for cmd in (["fusermount", "-u", mp], ["umount", mp], ["umount", "-l", mp]):
        if not is_mounted(mp):
            break
        subprocess.run(cmd, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while is_mounted(mp) and time.monotonic() < deadline:
            time.sleep(0.05)


class Bench:
    def __init__(self, args, workdir, endpoint, header, tensors):
        self.args, self.workdir, self.endpoint, self.header, self.tensors = args, workdir, endpoint, header, tensors
        self.passwd = os.path.join(workdir, "passwd-s3fs")
        with open(self.passwd, "w") as f:
            f.write(f"{KEY_ID}:{SECRET}\n")
        os.chmod(self.passwd, 0o600)

    def mountpoint(self):
        return tempfile.mkdtemp(prefix="mp-", dir=self.workdir)

    def timed(self, mount, work=None, cpu=None, loader=None):
        """Seconds to mount and run `work(mp)`, or with `loader` (mp -> load.py's mode, target, header
        [, workers]) to mount and load in a Loader started before the clock; with `cpu` (a name), the
        mount daemon's CPU-seconds of the run (total, system) go to self.cpu[cpu], read once the work
        is done (not timed): stfs's from its stats.json, s3fs's and rclone's from /proc/PID/stat."""
        mp = self.mountpoint()
        ready = None
        try:
            if loader is not None:
                ready = Loader(*loader(mp))
                self.last_start = ready.start
                work = lambda _: ready.go()  # noqa: E731
            busy = busy_cpu_seconds()
            started = time.perf_counter()
            mount(mp)
            work(mp)
            took = time.perf_counter() - started
            if cpu is not None:
                self.busy.setdefault(cpu, []).append((busy_cpu_seconds() - busy) / took)
                if mount in (self.stfs_mount, self.stfs_local_mount):
                    with open(os.path.join(mp, ".stfs", "stats.json")) as f:
                        stats = json.load(f)
                    used = stats["process_cpu_micros"] / 1e6, stats["process_cpu_system_micros"] / 1e6
                elif mount == self.s3fs_mount:
                    used = process_cpu(self.s3fs_pid) if self.s3fs_pid else None  # None: not told apart
                else:
                    used = process_cpu(self.rclone.pid)
                if used is not None:
                    self.cpu.setdefault(cpu, []).append(used)
            return took
        finally:
            if ready is not None:
                ready.close()
            unmount(mp)
            os.rmdir(mp)
            if getattr(self, "rclone", None) is not None:
                self.rclone.wait(timeout=30)
                self.rclone = None

    def stfs_mount(self, mp):
        url = f"s3://{BUCKET}/model.safetensors"
        subprocess.run([self.args.stfs, "mount", url, mp, "--endpoint-url", self.endpoint, *self.args.stfs_opts],
                       check=True, env=env())

    def stfs_local_mount(self, mp):
        subprocess.run([self.args.stfs, "mount", self.header, mp, *self.args.stfs_opts], check=True, env=env())

    def s3fs_mount(self, mp):
        before = set(pids_of("s3fs"))
        subprocess.run(["s3fs", BUCKET, mp, "-o", f"url={self.endpoint}", "-o", "use_path_request_style",
                        "-o", f"passwd_file={self.passwd}", "-o", "endpoint=us-east-1", "-o", "ro"],
                       check=True, env=env())
        wait_mounted(mp)
        started = set(pids_of("s3fs")) - before
        self.s3fs_pid = started.pop() if len(started) == 1 else None

    def rclone_mount(self, mp):
        # In the foreground, stopped by unmount (rclone's --daemon lost its mounts here).
        self.rclone = subprocess.Popen(["rclone", "mount", f"b:{BUCKET}", mp, "--read-only", "--vfs-cache-mode", "off"],
                                       env=rclone_env(self.endpoint), stderr=subprocess.DEVNULL)
        wait_mounted(mp, self.rclone)

    def stfs_all(self):
        return self.timed(self.stfs_mount, cpu="stfs all", loader=lambda mp: ("files", mp, self.header))

    def stfs_again(self):
        """A second whole-model load on one mount, timed alone: the mount and a first load (untimed),
        every tensor file's pages dropped from the kernel's cache (POSIX_FADV_DONTNEED), then the
        same load again. The 512 MiB cache holds only the end of the model and a sequential pass
        evicts it ahead of itself, so the second pass fetches every block again, now into reused
        buffers: the daemon's CPU per GiB of a long-lived mount, without the fresh memory a new
        mount faults in as its cache first fills."""
        mp = self.mountpoint()
        try:
            self.stfs_mount(mp)
            load("files", mp, self.header)
            for name, *_ in self.tensors:
                fd = os.open(os.path.join(mp, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            stats_path = os.path.join(mp, ".stfs", "stats.json")
            ready = Loader("files", mp, self.header)
            try:
                with open(stats_path) as f:
                    before = json.load(f)
                started = time.perf_counter()
                ready.go()
                took = time.perf_counter() - started
            finally:
                ready.close()
            self.last_start = ready.start
            with open(stats_path) as f:
                after = json.load(f)
            used = tuple((after[k] - before[k]) / 1e6 for k in ("process_cpu_micros", "process_cpu_system_micros"))
            self.cpu.setdefault("stfs again", []).append(used)
            self.refetched.append((after["backing_read_bytes"] - before["backing_read_bytes"]) / os.path.getsize(self.header))
            return took
        finally:
            unmount(mp)
            os.rmdir(mp)

    def stfs_local(self):
        """The same load from a local copy of the checkpoint in the page cache: what the FUSE hop
        alone costs the daemon (its replies are spliced from the file, one kernel copy each)."""
        return self.timed(self.stfs_local_mount, cpu="stfs local", loader=lambda mp: ("files", mp, self.header))

    def stfs_one(self):
        name = self.tensors[len(self.tensors) // 2][0]

        def work(mp):
            with open(os.path.join(mp, name), "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass
        return self.timed(self.stfs_mount, work)

    def stfs_workers(self):
        return self.timed(self.stfs_mount, loader=lambda mp: ("files", mp, self.header, 4))

    def s3fs_all(self):
        return self.timed(self.s3fs_mount, cpu="s3fs all",
                          loader=lambda mp: ("ref", os.path.join(mp, "model.safetensors"), self.header))

    def s3fs_workers(self):
        return self.timed(self.s3fs_mount, loader=lambda mp: ("ref", os.path.join(mp, "model.safetensors"), self.header, 4))

    def rclone_all(self):
        return self.timed(self.rclone_mount, cpu="rclone all",
                          loader=lambda mp: ("ref", os.path.join(mp, "model.safetensors"), self.header))

    def ceiling(self, connections=16):
        if getattr(self, "presigned", None) is None:
            self.presigned = subprocess.run(["rclone", "link", f"b:{BUCKET}/model.safetensors", "--expire", "1h"],
                                            check=True, env=rclone_env(self.endpoint), capture_output=True,
                                            text=True).stdout.strip()
        size = os.path.getsize(self.header)
        part = -(-size // connections)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        curls = [subprocess.Popen(["curl", "-sf", "-o", "/dev/null", "-r", f"{i * part}-{min(size, (i + 1) * part) - 1}",
                                   self.presigned]) for i in range(connections)]
        if any(c.wait() != 0 for c in curls):
            raise RuntimeError("a ranged GET of the presigned URL failed")
        took = time.perf_counter() - started
        # The curls' CPU (the only children waited for in between): receiving the object, no more.
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.setdefault("ceiling" if connections == 16 else f"ceiling {connections}", []).append((after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime,
                                                   after.ru_stime - children.ru_stime))
        return took

    def download_load(self):
        target = os.path.join(self.workdir, "dl")
        ready = Loader("ref", os.path.join(target, "model.safetensors"), self.header)
        try:
            started = time.perf_counter()
            subprocess.run(["rclone", "copy", f"b:{BUCKET}/model.safetensors", target], check=True,
                           env=rclone_env(self.endpoint), stderr=subprocess.DEVNULL, timeout=600)
            downloaded = time.perf_counter() - started
            ready.go()
            took = time.perf_counter() - started
        finally:
            ready.close()
        self.last_start = ready.start
        shutil.rmtree(target)
        return took, downloaded


def need_tools():
    """s3fs, rclone and curl, installed with apt-get when missing (as root on Debian), else one line and exit."""
    missing = [tool for tool in ("s3fs", "rclone", "curl") if shutil.which(tool) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {' '.join(missing)} with apt-get", flush=True)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", *missing], env=env, **quiet).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, **quiet)
            subprocess.run(["apt-get", "install", "-y", *missing], env=env, **quiet)
        missing = [tool for tool in missing if shutil.which(tool) is None]
    if missing:
        sys.exit(f"s3.py: {' and '.join(missing)} not installed (Debian: apt-get install -y s3fs rclone curl)")


def server_command(kind):
    """The S3 server's command line up to its options: the bench server (built here) or s3s-fs."""
    if kind == "s3s-fs":
        server = shutil.which("s3s-fs") or os.path.expanduser("~/.cargo/bin/s3s-fs")
        if not os.path.exists(server):
            sys.exit("s3.py: s3s-fs not installed (cargo install s3s-fs@0.14.1 --features binary --locked)")
        return [server, "--host", "127.0.0.1"]
    target = os.path.join(cargo_paths.target_dir(), "bench-s3server")
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    build = [cargo, "build", "--release", "--locked", "--manifest-path",
             os.path.join(SERVER_CRATE, "Cargo.toml"), "--target-dir", target]
    if subprocess.run(build).returncode != 0:
        sys.exit(f"s3.py: cannot build the bench's S3 server ({' '.join(build)})")
    return [os.path.join(target, "release", "stfs-bench-s3server")]


class RustProxy:
    """The bench's proxy (scripts/bench/s3server/src/bin/stfs-bench-proxy.rs): LatencyProxy's model."""

    def __init__(self, upstream_port, latency, conn_rate, count=False):
        program = os.path.join(cargo_paths.target_dir(), "bench-s3server", "release", "stfs-bench-proxy")
        self.proc = subprocess.Popen([program, str(upstream_port), str(latency * 1000), str(conn_rate / 2**20)]
                                     + (["--count"] if count else []),
                                     stdin=subprocess.PIPE if count else None, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def relayed(self):
        """The server's body bytes relayed so far (the origin's bytes); needs count=True."""
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_remote_options(p, reps=5, quick="32 MiB, 1 repetition: a smoke run")
    p.add_argument("--stfs-opts", default="", metavar="ARGS",
                   help="extra arguments for every stfs mount, e.g. \"--io-threads 16\" (default: none)")
    p.add_argument("--skip", action="append", default=[],
                   help="skip a variant (s3fs, rclone, download, workers, ceiling, local, again)")
    p.add_argument("--server", choices=("bench", "s3s-fs"), default="bench",
                   help="the S3 server: s3s-fs's store with 1 MiB body reads, or the s3s-fs binary [bench]")
    p.add_argument("--proxy", choices=("rust", "python"), default="rust",
                   help="the latency proxy: stfs-bench-proxy, or remote.py's LatencyProxy [rust]")
    args = p.parse_args()
    args.stfs_opts = shlex.split(args.stfs_opts)
    if args.quick:
        remote.JUDGED = False
        args.size_mb, args.reps, args.tensor_mb = 32, 1, min(args.tensor_mb, 4)
    need_tools()
    server = server_command(args.server)
    args.stfs = os.path.abspath(args.stfs)
    with tempfile.TemporaryDirectory(prefix="stfs-bench-s3-") as workdir:
        root = os.path.join(workdir, "store")
        os.makedirs(os.path.join(root, BUCKET))
        header = os.path.join(workdir, "model.safetensors")
        tensors = write_checkpoint(header, args.size_mb << 20, args.tensor_mb)
        size = os.path.getsize(header)
        port, proxy = free_port(), None
        s3 = subprocess.Popen([*server, "--port", str(port), "--access-key", KEY_ID,
                               "--secret-key", SECRET, root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port)
            # Uploaded with one PUT, straight to the server: s3s-fs then keeps the object's ETag (for a
            # file dropped into its directory it hashes the whole file on every GET and HEAD).
            subprocess.run(["rclone", "copyto", header, f"b:{BUCKET}/model.safetensors", "--s3-upload-cutoff", "5G"],
                           check=True, env=rclone_env(f"http://127.0.0.1:{port}"), stderr=subprocess.DEVNULL)
            proxy_kind = RustProxy if args.proxy == "rust" else LatencyProxy
            if args.proxy == "rust" and args.server != "bench":
                server_command("bench")  # builds the proxy too
            proxy = proxy_kind(port, args.latency_ms / 1000, args.conn_mib_s * 2**20)
            bench = Bench(args, workdir, f"http://127.0.0.1:{proxy.port}", header, tensors)
            bench.cpu, bench.refetched, bench.busy, bench.last_start = {}, [], {}, None
            starts = {}
            print(f"checkpoint {size / 2**20:.0f} MiB, {len(tensors)} tensors of ~{args.tensor_mb} MiB on "
                  f"{'the bench S3 server' if args.server == 'bench' else 's3s-fs'}; "
                  f"{args.proxy} proxy adds {args.latency_ms:g} ms per request, {args.conn_mib_s:g} MiB/s per connection; "
                  f"{args.reps} repetitions, interleaved", flush=True)
            runs = {name: [] for name in ("stfs all", "s3fs all", "rclone all", "download+load", "download",
                                          "stfs one", "stfs 4w", "s3fs 4w", "ceiling", "ceiling 8", "stfs local", "stfs again")}
            for rep in range(args.reps):
                def measure(name, run):
                    runs[name].append(run())
                    if bench.last_start is not None:
                        starts.setdefault(name, []).append(bench.last_start)
                        bench.last_start = None
                    print(f"  rep {rep + 1}: {name} {runs[name][-1]:.3f} s", flush=True)
                measure("stfs all", bench.stfs_all)
                if "local" not in args.skip:
                    measure("stfs local", bench.stfs_local)
                if "again" not in args.skip:
                    measure("stfs again", bench.stfs_again)
                if "s3fs" not in args.skip:
                    measure("s3fs all", bench.s3fs_all)
                if "rclone" not in args.skip:
                    measure("rclone all", bench.rclone_all)
                if "download" not in args.skip:
                    both, downloaded = bench.download_load()
                    runs["download"].append(downloaded)
                    measure("download+load", lambda: both)
                measure("stfs one", bench.stfs_one)
                if "workers" not in args.skip:
                    measure("stfs 4w", bench.stfs_workers)
                    if "s3fs" not in args.skip:
                        measure("s3fs 4w", bench.s3fs_workers)
                if "ceiling" not in args.skip:
                    measure("ceiling", bench.ceiling)
                    measure("ceiling 8", lambda: bench.ceiling(8))
        finally:
            if proxy is not None and hasattr(proxy, "stop"):
                proxy.stop()
            s3.terminate()
            s3.wait()
    for name, values in runs.items():
        if values:
            print(f"{name:14} {summary(values)}")
    every_start = [s for values in starts.values() for s in values]
    if every_start:
        print(f"{'loader start':14} {summary(every_start)} (not in the times above: a load.py process from its "
              "spawn until ready, Python up and numpy imported)")
    med = {k: statistics.median(v) for k, v in runs.items() if v}

    def target(label, ratio, goal):
        print(f"{label:40} {ratio:6.2f}x  target >= {goal}x  {remote.verdict(ratio >= goal)}")
    for other, goal in (("s3fs all", 3), ("rclone all", 3), ("download+load", 2)):
        if other in med:
            target(f"whole model: {other} / stfs all", med[other] / med["stfs all"], goal)
    if "download" in med:
        share = med["stfs one"] / med["download"]
        print(f"{'one tensor / download':40} {share:6.1%}   target < 5%    {remote.verdict(share < 0.05)}")
    if "s3fs 4w" in med:
        target("4 workers: s3fs 4w / stfs 4w", med["s3fs 4w"] / med["stfs 4w"], 10)
    print("CPU-seconds per GiB of the checkpoint, by the process that moved it (median [min-max], system share):")
    gib = size / 2**30
    for name, who in (("stfs all", "stfs daemon, s3://"), ("stfs again", "stfs daemon, s3://, a second load"), ("stfs local", "stfs daemon, local file (the FUSE hop alone)"),
                      ("s3fs all", "s3fs"), ("rclone all", "rclone mount"), ("ceiling", "curl x16 (receive only)")):
        used = bench.cpu.get(name)
        if used:
            per = [u / gib for u, _ in used]
            # A smoke run's small loads can take less than a clock tick of CPU: no share to show then.
            shares = [s / u for u, s in used if u]
            system = f"{statistics.median(shares):.0%}" if shares else "-"
            print(f"  {who:44} {statistics.median(per):.3f} [{min(per):.3f}-{max(per):.3f}]  system {system}")
            med[f"{name} CPU-s/GiB"] = statistics.median(per)
    cores = os.cpu_count()
    for name, used in bench.busy.items():
        print(f"  during {name}: the machine's {cores} cores busy {statistics.median(used):.2f} on average "
              f"[{min(used):.2f}-{max(used):.2f}] (every process: store, proxy, daemon, reader)")
    if bench.refetched:
        print(f"  (the second load fetched {min(bench.refetched):.2f}-{max(bench.refetched):.2f}x the checkpoint again)")
    if "ceiling" in med:
        print(f"{'transfer ceiling (16 GETs, no mount)':40} {med['ceiling']:6.3f} s; stfs all is {med['stfs all'] / med['ceiling']:.2f}x it")
        paired = [c / a for c, a in zip(runs["ceiling"], runs["stfs all"])]
        target("whole model: ceiling / stfs all (paired)", statistics.median(paired), 0.6)
        if len(starts.get("stfs all", [])) == len(runs["stfs all"]):
            cold = [c / (a + s) for c, a, s in zip(runs["ceiling"], runs["stfs all"], starts["stfs all"])]
            print(f"{'  with its loader start timed too':40} {statistics.median(cold):6.2f}x  (the clock before "
                  "loaders started ready: the interpreter's start is no storage's cost, and the ceiling has none)")
        print(f"{'  the same with 8 connections':40} {med['ceiling 8']:6.3f} s; the 0.6x target needs stfs all "
              f"<= {med['ceiling'] / 0.6:.3f} s")
        for other, goal in (("s3fs all", 3), ("s3fs 4w", 10)):
            if other in med:
                need = med[other] / goal
                print(f"  {other} / {goal} = {need:.3f} s: {'under' if need < med['ceiling'] else 'over'} the ceiling")
    print(json.dumps({k: round(v, 4) for k, v in med.items()}))


if __name__ == "__main__":
    main()
