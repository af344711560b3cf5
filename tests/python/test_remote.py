"""Cross-check over HTTP: files written by the reference `safetensors` package, served by a real nginx on
loopback, mounted with `stfs mount http://...`, compared byte for byte with what the reference reads."""
import json
import os
import shutil
import socket
import subprocess

import numpy as np
import pytest
import safetensors
from safetensors.numpy import save_file

from conftest import mounted, tool_missing, wait_port

rng = np.random.default_rng(77)


def find_nginx():
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.path.exists(p)), None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    """A throwaway nginx on a free loopback port; yields (root dir, base URL, access log path)."""
    program = find_nginx()
    if program is None:
        tool_missing("nginx", "apt-get install nginx")
    d = tmp_path_factory.mktemp("nginx")
    root = d / "www"
    root.mkdir()
    port = free_port()
    (d / "nginx.conf").write_text(f"""
        daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log warn;
        events {{ worker_connections 64; }}
        http {{ log_format ranges '$status|$body_bytes_sent|$http_range|$request';
               access_log {d}/access.log ranges;
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
               uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
               server {{ listen 127.0.0.1:{port}; root {root}; }} }}""")
    proc = subprocess.Popen([program, "-e", "stderr", "-p", str(d), "-c", str(d / "nginx.conf")],
                            stdout=subprocess.DEVNULL)
    try:
        wait_port(port, "nginx", timeout=5)
        yield root, f"http://127.0.0.1:{port}", d / "access.log"
    finally:
        proc.kill()
        proc.wait()


def reference_bytes(path):
    with open(path, "rb") as f:
        return {name: (v["dtype"], list(v["shape"]), bytes(v["data"])) for name, v in safetensors.deserialize(f.read())}


def served_name(name):
    return name.replace("%", "%25").replace("/", "%2F")


def tensors(prefix, count):
    out = {}
    for i in range(count):
        out[f"{prefix}.{i}.weight"] = rng.standard_normal((97 + i, 301)).astype(np.float32)
        out[f"{prefix}.{i}.bias"] = rng.integers(-1000, 1000, size=(301,), dtype=np.int16)
        out[f"{prefix}.{i}.half"] = rng.standard_normal((33, 7)).astype(np.float16)
    out[f"{prefix}.scalar"] = np.array(3.5, dtype=np.float64)
    out[f"{prefix}.empty"] = np.zeros((0, 4), dtype=np.int32)
    return out


def test_reference_file_by_url_is_byte_exact(nginx, stfs_bin):
    root, base, _ = nginx
    path = root / "model.safetensors"
    save_file({**tensors("layer", 6), "odd/name%": np.arange(5, dtype=np.uint8)}, str(path),
              metadata={"format": "np", "origin": "reference"})
    ref = reference_bytes(path)
    url = f"{base}/model.safetensors"
    with mounted(url, "--block-size", "64K") as mp:
        for name, (_, _, data) in ref.items():
            with open(os.path.join(mp, served_name(name)), "rb") as f:
                assert f.read() == data, name
        meta = json.load(open(os.path.join(mp, "metadata.json")))
        assert meta["metadata"] == {"format": "np", "origin": "reference"}
        assert {n: (t["dtype"], t["shape"]) for n, t in meta["tensors"].items()} == \
            {n: (d, s) for n, (d, s, _) in ref.items()}
    out = subprocess.run([stfs_bin, "inspect", "--json", url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)["tensors"]) == set(ref)


def test_reference_shards_by_index_url(nginx):
    root, base, log = nginx
    repo = root / "repo"
    repo.mkdir()
    shards = {"model-00001-of-00002.safetensors": tensors("a", 3), "model-00002-of-00002.safetensors": tensors("b", 2)}
    weight_map = {}
    for file, group in shards.items():
        save_file(group, str(repo / file))
        weight_map.update({name: file for name in group})
    (repo / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with mounted(f"{base}/repo/model.safetensors.index.json", "--block-size", "64K") as mp:
        for file in shards:
            for name, (_, _, data) in reference_bytes(repo / file).items():
                with open(os.path.join(mp, name), "rb") as f:
                    assert f.read() == data, name
    requests = log.read_text()
    assert all(f"/repo/{file}" in requests for file in shards)


def test_missing_url_is_one_clear_line(nginx, stfs_bin, tmp_path):
    _, base, _ = nginx
    mp = tmp_path / "m"
    mp.mkdir()
    out = subprocess.run([stfs_bin, "mount", f"{base}/absent.safetensors", str(mp)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "404" in out.stderr, out.stderr
    assert not os.path.ismount(mp)
