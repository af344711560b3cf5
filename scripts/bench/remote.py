#!/usr/bin/env python3
"""Remote-mount benchmark: stfs over HTTP against download-then-read, through a latency-adding proxy.

nginx serves a generated checkpoint on loopback; a small threaded proxy in this script adds a fixed
latency to every request (20 ms by default), standing in for a distant object store. Measured, with a
fresh (cold) mount each time and the variants interleaved in every repetition:

  download   curl the whole file through the proxy to a local file, then read it back
  stfs 1st   stfs mount URL + first byte of one tensor (a middle one)
  stfs one   stfs mount URL + all bytes of that tensor
  stfs all   stfs mount URL + every tensor read in file order (1 MiB reads, one reader)
  disk 1st   the same with --cache-dir on an emptied cache directory (fills it)
  disk 2nd   the same again, a new mount on the filled directory (reads it, not the store)
  cat local  `cat` of the checkpoint as a local file (nginx's copy, in the page cache like the
             cache directory's files) to /dev/null: what the second load is held against

Targets (issue 7): one tensor in under 5% of the download time; the whole model at least as fast.
Targets (issue 17): the second --cache-dir load >= 5x faster than the first, within 2x of `cat`,
with no store byte beyond the opening request (the ranged GET that pins the object).
Needs nginx and curl; uses only the Python standard library.

  python3 scripts/bench/remote.py --stfs "$(scripts/cargo_bin --release --bin stfs)"            # 1 GiB, 5 repetitions
  python3 scripts/bench/remote.py --stfs "$(scripts/cargo_bin --release --bin stfs)" --quick    # 64 MiB smoke run
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

from remote_options import add_remote_options  # scripts/bench/, this file's folder

CHUNK = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port):
    deadline = time.monotonic() + 5
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"nothing listens on port {port}")
            time.sleep(0.02)


def write_checkpoint(path, size, tensor_mb):
    """A safetensors file of about `size` bytes: F32 tensors of about tensor_mb MiB (sizes vary a little
    so they do not align with blocks), random bytes. Returns [(name, offset, length)]."""
    count = max(1, size // (tensor_mb << 20))
    lengths = [((tensor_mb << 20) + (i % 7) * 4096 + 4 * i) // 4 * 4 for i in range(count)]
    header, start = {}, 0
    for i, length in enumerate(lengths):
        header[f"model.layers.{i}.weight"] = {"dtype": "F32", "shape": [length // 4], "data_offsets": [start, start + length]}
        start += length
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    base = 8 + len(blob)
    block = os.urandom(CHUNK)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for length in lengths:
            for at in range(0, length, CHUNK):
                f.write(block[: min(CHUNK, length - at)])
    return [(name, base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0]) for name, v in header.items()]


class Nginx:
    def __init__(self, root, workdir):
        program = shutil.which("nginx") or "/usr/sbin/nginx"
        self.port = free_port()
        conf = os.path.join(workdir, "nginx.conf")
        d = workdir
        with open(conf, "w") as f:
            f.write(f"""daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log warn;
                events {{ worker_connections 256; }}
                http {{ access_log off; keepalive_requests 100000; sendfile on;
                       client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
                       uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
                       server {{ listen 127.0.0.1:{self.port}; root {root}; }} }}""")
        self.proc = subprocess.Popen([program, "-e", "stderr", "-p", d, "-c", conf], stdout=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class LatencyProxy:
    """HTTP/1.1 keep-alive proxy adding `latency` seconds before forwarding each request and, with
    `conn_rate` (bytes per second, 0: none), pacing each connection's responses to that rate, as
    object stores and CDNs limit what one connection delivers."""

    def __init__(self, upstream_port, latency, conn_rate=0):
        self.upstream_port, self.latency, self.conn_rate = upstream_port, latency, conn_rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _head(reader):
        lines = []
        while True:
            line = reader.readline(65536)
            if not line:
                return None
            if line in (b"\r\n", b"\n"):
                return lines
            lines.append(line)

    def _serve(self, client):
        upstream = None
        try:
            requests = client.makefile("rb")
            while True:
                head = self._head(requests)
                if head is None:
                    return
                time.sleep(self.latency)
                if upstream is None:
                    upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                    responses = upstream.makefile("rb")
                upstream.sendall(b"".join(head) + b"\r\n")
                response = self._head(responses)
                if response is None:
                    return
                length = next((int(l.split(b":", 1)[1]) for l in response if l.lower().startswith(b"content-length:")), 0)
                status = response[0].split(b" ")[1] if response and len(response[0].split(b" ")) > 1 else b""
                if head[0].startswith(b"HEAD ") or status in (b"204", b"304"):
                    length = 0  # no body follows, whatever Content-Length says (s3fs and rclone send HEAD)
                client.sendall(b"".join(response) + b"\r\n")
                started, sent = time.monotonic(), 0
                while length > 0:
                    data = responses.read1(min(length, CHUNK))
                    if not data:
                        return
                    client.sendall(data)
                    length -= len(data)
                    sent += len(data)
                    if self.conn_rate:
                        ahead = started + sent / self.conn_rate - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
        except OSError:
            pass
        finally:
            client.close()
            if upstream is not None:
                upstream.close()


def clean_env():
    """The environment without proxy settings, so curl and stfs both go straight to our proxy URL."""
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def read_file(path, limit=None):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while limit is None or n < limit:
            data = f.read(CHUNK if limit is None else min(CHUNK, limit - n))
            if not data:
                break
            n += len(data)
    return n


def run_download(url, workdir, size):
    target = os.path.join(workdir, "download.safetensors")
    started = time.perf_counter()
    subprocess.run(["curl", "-sSf", "--noproxy", "*", "-o", target, url], check=True, env=clean_env())
    got = read_file(target)
    took = time.perf_counter() - started
    os.unlink(target)
    assert got == size, (got, size)
    return took


class Mounted:
    def __init__(self, stfs, url, workdir, extra):
        self.stfs, self.mp = stfs, tempfile.mkdtemp(prefix="mp-", dir=workdir)
        subprocess.run([stfs, "mount", url, self.mp, *extra], check=True, env=clean_env())

    def stats(self):
        with open(os.path.join(self.mp, ".stfs", "stats.json")) as f:
            return json.load(f)

    def close(self):
        subprocess.run([self.stfs, "umount", self.mp], check=True)
        os.rmdir(self.mp)

    def wait_daemon(self, timeout=60):
        """Waits until the unmounted daemon (whose command line names this mount point) has exited:
        it flushes its disk cache writes after the unmount. Returns the seconds waited."""
        started = time.perf_counter()
        needle = self.mp.encode()
        while time.perf_counter() - started < timeout:
            alive = False
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        alive = alive or needle in f.read().split(b"\0")
                except OSError:
                    pass
            if not alive:
                break
            time.sleep(0.01)
        return time.perf_counter() - started


def run_one(args, url, workdir, tensor):
    name, _, length = tensor
    started = time.perf_counter()
    m = Mounted(args.stfs, url, workdir, args.mount_arg)
    try:
        with open(os.path.join(m.mp, name), "rb", buffering=0) as f:
            assert len(f.read(1)) == 1
            first = time.perf_counter() - started
            rest = 1
            while rest < length:
                data = f.read(min(CHUNK, length - rest))
                assert data
                rest += len(data)
        return first, time.perf_counter() - started
    finally:
        m.close()


def run_all(args, url, workdir, tensors, extra=(), wait_daemon=False):
    started = time.perf_counter()
    m = Mounted(args.stfs, url, workdir, [*args.mount_arg, *extra])
    try:
        total = sum(read_file(os.path.join(m.mp, name)) for name, _, _ in tensors)
        took = time.perf_counter() - started
        assert total == sum(length for _, _, length in tensors)
        stats = m.stats()
    finally:
        m.close()
    if wait_daemon:
        stats["daemon_exit_wait"] = m.wait_daemon()
    return took, stats


def run_cat(path):
    started = time.perf_counter()
    subprocess.run(["cat", path], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def run_disk(args, url, workdir, tensors):
    """First and second whole-model loads through --cache-dir on an emptied cache directory."""
    cache = os.path.join(workdir, "cache")
    if os.path.isdir(cache):
        subprocess.run([args.stfs, "cache", "clear", cache], check=True, stdout=subprocess.DEVNULL)
    extra = ["--cache-dir", cache]
    # A restart: the second mount starts once the first daemon has exited (it finishes writing the
    # cache after the unmount; the wait is reported, not timed as part of either load).
    first, first_stats = run_all(args, url, workdir, tensors, extra, wait_daemon=True)
    second, stats = run_all(args, url, workdir, tensors, extra, wait_daemon=True)
    stats["first_load_write_drops"] = first_stats.get("disk_cache_write_drops")
    stats["first_daemon_exit_wait"] = first_stats["daemon_exit_wait"]
    return first, second, stats


def summary(values):
    return f"median {statistics.median(values):7.3f} s  (min {min(values):.3f}, max {max(values):.3f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    no_cap = (0, "cap each connection's response rate, in MiB/s, as object stores do [0: no cap]")
    add_remote_options(p, reps=5, quick="64 MiB, 3 repetitions: a smoke run", conn_mib_s=no_cap)
    p.add_argument("--mount-arg", action="append", default=[], help="extra `stfs mount` argument (repeatable)")
    p.add_argument("--no-disk-cache", action="store_true", help="skip the --cache-dir rows")
    p.add_argument("--disk-only", action="store_true",
                   help="only the --cache-dir rows and cat (the disk cache's targets)")
    p.add_argument("--json", help="also write every series (seconds per repetition) here")
    args = p.parse_args()
    if args.quick:
        global JUDGED
        JUDGED = False
        args.size_mb, args.reps, args.tensor_mb = 64, 3, min(args.tensor_mb, 4)
    if args.disk_only and args.no_disk_cache:
        sys.exit("--disk-only and --no-disk-cache leave nothing to measure")
    for tool in ("curl",):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    args.stfs = os.path.abspath(args.stfs)
    with tempfile.TemporaryDirectory(prefix="stfs-bench-remote-") as workdir:
        root = os.path.join(workdir, "www")
        os.mkdir(root)
        path = os.path.join(root, "model.safetensors")
        tensors = write_checkpoint(path, args.size_mb << 20, args.tensor_mb)
        size = os.path.getsize(path)
        nginx = Nginx(root, workdir)
        try:
            proxy = LatencyProxy(nginx.port, args.latency_ms / 1000, args.conn_mib_s * 2**20)
            url = f"http://127.0.0.1:{proxy.port}/model.safetensors"
            middle = tensors[len(tensors) // 2]
            print(f"checkpoint {size / 2**20:.0f} MiB, {len(tensors)} tensors of ~{args.tensor_mb} MiB; "
                  f"proxy adds {args.latency_ms:g} ms per request"
                  f"{f', {args.conn_mib_s:g} MiB/s per connection' if args.conn_mib_s else ''}; "
                  f"{args.reps} repetitions, interleaved; "
                  f"mount args {args.mount_arg or 'default'}")
            download, first, one, whole, last_stats = [], [], [], [], None
            disk_first, disk_second, cat, disk_stats = [], [], [], None
            for _ in range(args.reps):
                if not args.no_disk_cache:
                    f, sec, disk_stats = run_disk(args, url, workdir, tensors)
                    disk_first.append(f)
                    disk_second.append(sec)
                    cat.append(run_cat(path))
                if args.disk_only:
                    continue
                download.append(run_download(url, workdir, size))
                f, o = run_one(args, url, workdir, middle)
                first.append(f)
                one.append(o)
                w, last_stats = run_all(args, url, workdir, tensors)
                whole.append(w)
        finally:
            nginx.stop()
    if not args.disk_only:
        report_remote(download, first, one, whole, middle, size, last_stats)
    if disk_second:
        report_disk(disk_first, disk_second, cat, disk_stats, size)
    if args.json:
        series = {"download": download, "stfs 1st": first, "stfs one": one, "stfs all": whole,
                  "disk 1st": disk_first, "disk 2nd": disk_second, "cat local": cat}
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "series": {k: v for k, v in series.items() if v}}, f, indent=1)


# False in a smoke run (--quick): toy sizes on a busy machine say nothing about the targets, so the
# lines show the figures and "not judged", never MET or MISSED.
JUDGED = True


def verdict(ok):
    return ("MET" if ok else "MISSED") if JUDGED else "not judged (smoke run)"


def report_remote(download, first, one, whole, middle, size, last_stats):
    d = statistics.median(download)
    print(f"download (curl + local read)    {summary(download)}  {size / 2**20 / d:7.1f} MiB/s")
    print(f"stfs mount + first byte          {summary(first)}")
    print(f"stfs mount + one tensor ({middle[2] / 2**20:.1f} MiB) {summary(one)}")
    print(f"stfs mount + every tensor        {summary(whole)}  {size / 2**20 / statistics.median(whole):7.1f} MiB/s")
    ratio_one = statistics.median(one) / d
    speed = d / statistics.median(whole)
    print(f"one tensor / download   = {ratio_one:6.1%}   target < 5%    {verdict(ratio_one < 0.05)}")
    print(f"whole-model speed vs download = {speed:5.2f}x  target >= 1x  {verdict(speed >= 1)}")
    s = last_stats or {}
    if s.get("http_requests"):
        print(f"last whole read: {s['http_requests']} requests, {s['http_bytes'] / 2**20:.0f} MiB, "
              f"mean {s['http_request_micros'] / s['http_requests'] / 1000:.1f} ms per request, "
              f"prefetched {s.get('prefetched_bytes', 0) / 2**20:.0f} MiB, retries {s['http_retries']}")


def report_disk(disk_first, disk_second, cat, disk_stats, size):
    print(f"--cache-dir, first load          {summary(disk_first)}")
    print(f"--cache-dir, second load         {summary(disk_second)}  "
          f"{size / 2**20 / statistics.median(disk_second):7.1f} MiB/s")
    print(f"cat of the local file            {summary(cat)}  {size / 2**20 / statistics.median(cat):7.1f} MiB/s")
    faster = statistics.median(disk_first) / statistics.median(disk_second)
    vs_cat = statistics.median(disk_second) / statistics.median(cat)
    print(f"second load vs first = {faster:5.2f}x faster  target >= 5x  {verdict(faster >= 5)}")
    print(f"second load vs cat   = {vs_cat:5.2f}x slower  target <= 2x  {verdict(vs_cat <= 2)}")
    d = disk_stats or {}
    print(f"second load: {d.get('http_requests')} requests, {d.get('http_bytes')} store bytes "
          f"(the opening request's prefix), {d.get('backing_reads')} backing reads, "
          f"{d.get('disk_cache_hits')} disk hits ({d.get('disk_cache_hit_bytes', 0) / 2**20:.0f} MiB); "
          f"first load: {d.get('first_load_write_drops')} writes dropped (queue full); "
          f"passthrough opens {d.get('passthrough_opens')} ({d.get('passthrough_open_bytes', 0) / 2**20:.0f} MiB); "
          f"the first daemon exited {d.get('first_daemon_exit_wait', 0):.2f} s after its unmount (last repetition)")


if __name__ == "__main__":
    main()
