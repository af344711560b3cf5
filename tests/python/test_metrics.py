"""The counters of `.stfs/stats.json` in the Prometheus text format, read by a real parser
(prometheus_client's): `stfs stats --prometheus`, the `--metrics-file` the daemon rewrites and the
`--metrics-addr` listener give every counter of stats.json under its documented name and type, with
equal values, labelled with the mount point and source; the backing read histogram counts every
block load. Bad metrics options fail `stfs mount` in one line with nothing mounted."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from safetensors import safe_open
from safetensors.numpy import save_file

from conftest import STFS, TIMEOUT, is_mounted, mounted

# stats.json key -> (metric family as the parser names it, type). The spec of docs/metrics.md.
COUNTERS = {
    "fuse_reads": "stfs_fuse_reads",
    "fuse_read_bytes": "stfs_fuse_read_bytes",
    "read_errors": "stfs_read_errors",
    "kernel_open_requests": "stfs_kernel_open_requests",
    "opens": "stfs_opens",
    "cache_hits": "stfs_cache_hits",
    "cache_misses": "stfs_cache_misses",
    "single_flight_waits": "stfs_single_flight_waits",
    "backing_reads": "stfs_backing_reads",
    "backing_read_bytes": "stfs_backing_read_bytes",
    "backing_errors": "stfs_backing_errors",
    "mapped_reads": "stfs_mapped_reads",
    "mapped_read_bytes": "stfs_mapped_read_bytes",
    "spliced_reads": "stfs_spliced_reads",
    "spliced_read_bytes": "stfs_spliced_read_bytes",
    "mapping_releases": "stfs_mapping_releases",
    "opening_reads": "stfs_opening_reads",
    "opening_read_bytes": "stfs_opening_read_bytes",
    "prefetched_bytes": "stfs_prefetched_bytes",
    "prefetch_unused_bytes": "stfs_prefetch_unused_bytes",
    "evictions": "stfs_cache_evictions",
    "http_requests": "stfs_http_requests",
    "http_bytes": "stfs_http_received_bytes",
    "http_retries": "stfs_http_retries",
    "disk_cache_hits": "stfs_disk_cache_hits",
    "disk_cache_hit_bytes": "stfs_disk_cache_hit_bytes",
    "disk_cache_misses": "stfs_disk_cache_misses",
    "disk_cache_written_bytes": "stfs_disk_cache_written_bytes",
    "disk_cache_evictions": "stfs_disk_cache_evictions",
    "disk_cache_errors": "stfs_disk_cache_errors",
    "disk_cache_corrupt": "stfs_disk_cache_corrupt",
    "disk_cache_write_drops": "stfs_disk_cache_write_drops",
    "disk_cache_extents_written": "stfs_disk_cache_extents_written",
    "passthrough_opens": "stfs_passthrough_opens",
    "passthrough_open_bytes": "stfs_passthrough_open_bytes",
    "passthrough_refused": "stfs_passthrough_refused",
    "passthrough_checkpoint_opens": "stfs_passthrough_checkpoint_opens",
    "passthrough_files_changed": "stfs_passthrough_files_changed",
    "io_uring_requests": "stfs_io_uring_requests",
}
GAUGES = {
    "resident_bytes": "stfs_cache_resident_bytes",
    "peak_resident_bytes": "stfs_cache_peak_resident_bytes",
    "streams": "stfs_readahead_streams",
    "window_bytes": "stfs_readahead_window_bytes",
    "disk_cache_bytes": "stfs_disk_cache_bytes",
    "disk_cache_limit": "stfs_disk_cache_limit_bytes",
    "passthrough_enabled": "stfs_passthrough_enabled",
    "max_request_bytes": "stfs_max_request_bytes",
    "io_uring_enabled": "stfs_io_uring_enabled",
}
# Gauges in seconds of a value in microseconds.
SECONDS_GAUGES = {"http_request_max_micros": "stfs_http_request_max_duration_seconds"}
# (buckets key, sum key in microseconds, family, bucket bound unit in seconds).
HISTOGRAMS = [
    ("backing_read_latency_us", "backing_read_micros", "stfs_backing_request_duration_seconds", 1e-6),
    ("http_request_latency_ms", "http_request_micros", "stfs_http_request_duration_seconds", 1e-3),
]
# The daemon's process (CPU microseconds and a counter of them in seconds; the rest gauges), under the
# names of Prometheus's standard process collector. Each is read when the document is taken.
PROCESS = {
    "process_cpu_micros": ("process_cpu_seconds", "counter", 1e-6),
    "process_cpu_system_micros": ("stfs_process_cpu_system_seconds", "counter", 1e-6),
    "process_resident_bytes": ("process_resident_memory_bytes", "gauge", 1),
    "process_open_fds": ("process_open_fds", "gauge", 1),
    "process_max_fds": ("process_max_fds", "gauge", 1),
    "process_start_time_seconds": ("process_start_time_seconds", "gauge", 1),
}
# Reading stats.json is itself a read of the mount: these move with every look (on FUSE over io_uring
# each of its requests is counted too), and so do the process figures.
MOVING = {"fuse_reads", "fuse_read_bytes", "io_uring_requests"} | set(PROCESS)


def stats_json(mp):
    with open(os.path.join(mp, ".stfs", "stats.json")) as f:
        return json.load(f)


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def plain_value(fams, family, labels):
    fam = fams[family]
    samples = [s for s in fam.samples if s.labels == labels]
    assert len(samples) == 1, (family, fam.samples)
    return samples[0].value


def check_against(text, before, after, labels):
    """Every number of stats.json is in `text` under its name and type; the values equal stats.json's
    (those that move with each look at stats.json lie between the documents read before and after)."""
    fams = families(text)
    keys = set(before)
    named = set(COUNTERS) | set(GAUGES) | set(SECONDS_GAUGES) | set(PROCESS) | {k for h in HISTOGRAMS for k in h[:2]}
    assert keys == named, f"stats.json keys without a metric in this test: {keys ^ named}"
    for key, family in COUNTERS.items():
        assert fams[family].type == "counter", family
        assert [s.name for s in fams[family].samples] == [family + "_total"], family
        got = plain_value(fams, family, labels)
        if key in MOVING:
            assert before[key] <= got <= after[key], (key, before[key], got, after[key])
        else:
            assert got == before[key] == after[key], (key, got, before[key])
    for key, (family, kind, unit) in PROCESS.items():
        assert fams[family].type == kind, family
        got = plain_value(fams, family, labels)
        if key in ("process_cpu_micros", "process_cpu_system_micros"):
            # CPU time only grows, and the rendering was taken between the two documents.
            assert before[key] * unit <= got + 1e-6 and got <= after[key] * unit + 1e-6, (key, before[key], got)
        elif key in ("process_max_fds", "process_start_time_seconds"):
            assert got == before[key] == after[key], (key, got, before[key])
        else:
            assert got > 0, (key, got)
    assert after["process_start_time_seconds"] <= time.time() + 1
    assert 0 < after["process_open_fds"] <= after["process_max_fds"]
    for key, family in GAUGES.items():
        assert fams[family].type == "gauge", family
        assert plain_value(fams, family, labels) == before[key] == after[key], key
    for key, family in SECONDS_GAUGES.items():
        assert fams[family].type == "gauge", family
        assert plain_value(fams, family, labels) == pytest.approx(before[key] / 1e6), key
    for buckets_key, sum_key, family, unit in HISTOGRAMS:
        fam = fams[family]
        assert fam.type == "histogram", family
        buckets = [(s.labels["le"], s.value) for s in fam.samples if s.name == family + "_bucket"]
        assert all({k: v for k, v in s.labels.items() if k != "le"} == labels for s in fam.samples), fam.samples
        want, total = [], 0
        for key, count in before[buckets_key].items():
            total += count
            want.append((float("inf") if key.startswith(">=") else float(key[1:]) * unit, total))
        assert [v for _, v in buckets] == [v for _, v in want], family
        assert [float(le) for le, _ in buckets] == pytest.approx([le for le, _ in want]), family
        count = [s.value for s in fam.samples if s.name == family + "_count"]
        assert count == [buckets[-1][1]] and buckets[-1][0] == "+Inf", family
        total_seconds = [s.value for s in fam.samples if s.name == family + "_sum"]
        assert total_seconds == [pytest.approx(before[sum_key] / 1e6)], family
    return fams


def quiet(mp):
    """Two stats.json documents a second apart that agree on everything but the moving counters:
    readahead has settled."""
    deadline = time.monotonic() + 30
    last = stats_json(mp)
    while time.monotonic() < deadline:
        time.sleep(1)
        now = stats_json(mp)
        if {k: v for k, v in now.items() if k not in MOVING} == {k: v for k, v in last.items() if k not in MOVING}:
            return now
        last = now
    pytest.fail(f"the counters never settled: {last}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return reply.read().decode()


def test_prometheus_text_matches_stats_json(tmp_path):
    source = tmp_path / "model.safetensors"
    rng = np.random.default_rng(24)
    data = {f"layer.{i}.weight": rng.standard_normal((256, 300 + i)).astype(np.float32) for i in range(12)}
    save_file(data, str(source))
    prom_dir = tmp_path / "textfile"
    prom_dir.mkdir()
    prom = prom_dir / "stfs.prom"
    # A link planted at the file's name is replaced, never written through.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, prom)
    port = free_port()
    # --no-map: every read goes through the block cache and its backing reads, which the
    # histogram times (a mapped file's prefetch is advice, not a timed read); --no-passthrough: as
    # root the kernel would read the re-served file itself, and the daemon would time nothing.
    args = ["--no-map", "--no-passthrough", "--block-size", "64K", "--metrics-file", str(prom), "-o", f"metrics_addr=127.0.0.1:{port}"]
    with mounted(source, *args) as mp:
        with safe_open(os.path.join(mp, "model.safetensors"), framework="numpy") as f:
            for name in data:
                assert np.array_equal(f.get_tensor(name), data[name]), name
        labels = {"mountpoint": os.path.realpath(mp), "source": str(source.resolve())}

        before = quiet(mp)
        out = subprocess.run([STFS, "stats", "--prometheus", mp], capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode == 0, out.stderr
        after = stats_json(mp)
        fams = check_against(out.stdout, before, after, labels)
        # The reads above were real block loads, each timed.
        assert before["backing_reads"] > 0 and before["cache_misses"] > 0
        backing = fams["stfs_backing_request_duration_seconds"]
        count = [s.value for s in backing.samples if s.name.endswith("_count")]
        assert count == [before["backing_reads"]], (count, before["backing_reads"])
        assert plain_value(fams, "stfs_backing_read_bytes", labels) >= source.stat().st_size - 8 - 1024

        # The listener answers with the same text as the command.
        before = stats_json(mp)
        text = scrape(port)
        check_against(text, before, stats_json(mp), labels)

        # The file: rewritten within a few seconds of a look at stats.json, then the same.
        assert not os.path.islink(prom) and victim.read_text() == "keep"
        assert oct(os.stat(prom).st_mode & 0o444) == oct(0o444)
        before = stats_json(mp)
        seen = time.time()
        deadline = time.monotonic() + 20
        while os.stat(prom).st_mtime <= seen and time.monotonic() < deadline:
            time.sleep(0.2)
        assert os.stat(prom).st_mtime > seen, "the metrics file was not rewritten within 20 s"
        check_against(prom.read_text(), before, stats_json(mp), labels)
        # The temporary files are hidden and gone: only the .prom file is in the collector's directory.
        assert os.listdir(prom_dir) == ["stfs.prom"]
    # Unmounted: the file goes with the mount, so no dead mount is reported as alive. The daemon
    # removes it as it exits, just after the unmount returns: waited for, within a bound.
    deadline = time.monotonic() + 10
    while prom.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not prom.exists(), "the metrics file outlived its mount by 10 s"
    assert victim.read_text() == "keep"


def run_mount(*args):
    return subprocess.run([STFS, "mount", *args], capture_output=True, text=True, timeout=TIMEOUT)


def test_bad_metrics_options_fail_in_one_line_before_mounting(tmp_path):
    source = tmp_path / "model.safetensors"
    save_file({"a": np.arange(10, dtype=np.float32)}, str(source))
    mp = tmp_path / "m"
    mp.mkdir()
    missing = tmp_path / "no" / "dir" / "stfs.prom"
    cases = [
        (["--metrics-file", str(missing)], 1, f"stfs: {missing}: cannot write the metrics file there: no such file or directory"),
        (["--metrics-addr", "0.0.0.0:9400"], 2, "stfs: --metrics-addr 0.0.0.0:9400: not a loopback address"),
        (["-o", "metrics_addr=localhost"], 2, "stfs: mount option `metrics_addr` needs an address and port"),
    ]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases.append((["--metrics-addr", f"127.0.0.1:{port}"], 1, f"stfs: --metrics-addr 127.0.0.1:{port}: cannot listen there"))
        for args, status, start in cases:
            try:
                out = run_mount(str(source), str(mp), *args)
            finally:
                if is_mounted(mp):
                    subprocess.run([STFS, "umount", "--lazy", str(mp)], capture_output=True, timeout=TIMEOUT)
            assert out.returncode == status, (args, out.stderr)
            assert out.stderr.startswith(start), (args, out.stderr)
            assert out.stderr.count("\n") == 1, out.stderr
            assert not is_mounted(mp), args


def test_stats_prometheus_of_something_not_mounted_fails_in_one_line(tmp_path):
    out = subprocess.run([STFS, "stats", "--prometheus", str(tmp_path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 1
    assert out.stderr.startswith(f"stfs: {tmp_path}: not an stfs mount"), out.stderr
    assert out.stderr.count("\n") == 1 and out.stdout == ""
