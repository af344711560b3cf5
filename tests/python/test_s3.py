"""Cross-check over S3: a file written by the reference `safetensors` package, served by s3s-fs (a real
S3 server checking SigV4 signatures) on loopback, mounted with `stfs mount s3://...`, compared byte for
byte with what the reference reads."""
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

KEY_ID, SECRET = "AKIASTFSPYTEST000001", "stfs-python-test-secret-0000000000000"


def find_s3s_fs():
    home = os.path.expanduser("~/.cargo/bin/s3s-fs")
    return shutil.which("s3s-fs") or (home if os.path.exists(home) else None)


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """s3s-fs on a free loopback port with bucket `models`; yields the bucket's directory."""
    program = find_s3s_fs()
    if program is None:
        tool_missing("s3s-fs", "cargo install s3s-fs@0.14.1 --features binary --locked")
    (tmp_path / "store" / "models").mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([program, "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY_ID,
                             "--secret-key", SECRET, str(tmp_path / "store")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, "s3s-fs", timeout=10)
        for name in [k for k in os.environ if k.startswith("AWS_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        yield tmp_path / "store" / "models"
    finally:
        proc.kill()
        proc.wait()


def test_reference_file_by_s3_is_byte_exact(s3):
    rng = np.random.default_rng(16)
    group = {f"layer.{i}.weight": rng.standard_normal((129 + i, 257)).astype(np.float32) for i in range(5)}
    group["layer.bias"] = rng.integers(-1000, 1000, size=(301,), dtype=np.int16)
    group["scalar"] = np.array(2.5, dtype=np.float64)
    path = s3 / "model.safetensors"
    save_file(group, str(path), metadata={"origin": "reference"})
    with open(path, "rb") as f:
        ref = {name: bytes(v["data"]) for name, v in safetensors.deserialize(f.read())}
    with mounted("s3://models/model.safetensors", "--block-size", "64K") as mp:
        for name, data in ref.items():
            with open(os.path.join(mp, name), "rb") as f:
                assert f.read() == data, name
        meta = json.load(open(os.path.join(mp, "metadata.json")))
        assert meta["metadata"] == {"origin": "reference"}
        assert SECRET not in json.dumps(meta)
