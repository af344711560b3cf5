"""Secrets and paths through the Python API, against a real nginx on loopback and real mounts:
stfs.mount(header=[...]) and stfs.load(header=[...]) keep the header out of every process list (the
daemon's /proc/PID/cmdline read as nobody), and stfs.load refuses a metadata.json `path` that leads
out of the mount."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import ROOT, STFS, tool_missing, wait_port
from test_remote import find_nginx, free_port

os.environ.setdefault("STFS_BIN", STFS)
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package's source in this checkout
import stfs  # noqa: E402
import stfs._load  # noqa: E402
from stfs._load import tensor_path  # noqa: E402

TOKEN = "py_tok_5ecret_bearer_value"
SIGNATURE = "pysig0123456789abcdef"


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """nginx whose /private/ wants `Authorization: Bearer TOKEN` and `Signature=SIGNATURE`; yields
    (the served directory, the presigned URL of private/m.safetensors)."""
    program = find_nginx()
    if program is None:
        tool_missing("nginx", "apt-get install nginx")
    d = tmp_path_factory.mktemp("nginx")
    root = d / "www"
    (root / "private").mkdir(parents=True)
    port = free_port()
    (d / "nginx.conf").write_text(f"""
        daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log warn;
        events {{ worker_connections 64; }}
        http {{ access_log off;
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
               uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
               server {{ listen 127.0.0.1:{port}; root {root};
                        location /private/ {{
                            if ($http_authorization != "Bearer {TOKEN}") {{ return 401; }}
                            if ($arg_signature != "{SIGNATURE}") {{ return 403; }} }} }} }}""")
    proc = subprocess.Popen([program, "-e", "stderr", "-p", str(d), "-c", str(d / "nginx.conf")],
                            stdout=subprocess.DEVNULL)
    try:
        wait_port(port, "nginx", timeout=5)
        yield root, f"http://127.0.0.1:{port}/private/m.safetensors?Expires=1893456000&Signature={SIGNATURE}"
    finally:
        proc.kill()
        proc.wait()


def daemon_pid(mp):
    """The pid of the stfs daemon whose command line names mount point `mp`."""
    want = os.fsencode(str(mp))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if comm == "stfs" and want in argv:
            return int(pid)
    pytest.fail(f"no stfs daemon names {mp}")


def read_as_nobody(path):
    """`path` read by uid 65534 (setpriv): its bytes, or None when refused."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        tool_missing("setpriv", "apt-get install util-linux")
    out = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "cat", path],
                         capture_output=True, timeout=60)
    return out.stdout if out.returncode == 0 else None


def test_mount_header_never_reaches_a_command_line(private, monkeypatch):
    root, url = private
    data = {"w": np.arange(3000, dtype=np.float32).reshape(30, 100), "b": np.arange(7, dtype=np.int16)}
    save_file(data, str(root / "private" / "m.safetensors"))
    # Every command the package runs is recorded: none may carry the header (it would be in `ps`
    # from exec until the binary clears it).
    commands, run = [], subprocess.run

    def recording_run(command, *args, **kwargs):
        commands.append(list(command))
        return run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording_run)
    with stfs.mount(url, header=[f"Authorization: Bearer {TOKEN}"], block_size="64K") as mp:
        pid = daemon_pid(mp)
        cmdline = read_as_nobody(f"/proc/{pid}/cmdline")
        assert cmdline is not None and os.fsencode(str(mp)) in cmdline
        assert TOKEN.encode() not in cmdline and SIGNATURE.encode() not in cmdline, cmdline
        assert read_as_nobody(f"/proc/{pid}/environ") is None
        for name, array in data.items():
            assert (mp / name).read_bytes() == array.tobytes(), name
    loaded = stfs.load(url, header=f"Authorization: Bearer {TOKEN}")
    assert all(np.array_equal(loaded[name], array) for name, array in data.items())
    # A header in an -o list (`o="...,header=..."`, the fstab spelling) travels the same way: out of
    # the list, into the environment; the list's other options still apply, and a `\,` in a value is
    # a comma of the value, as the binary reads it.
    o = f"npy,header=Authorization: Bearer {TOKEN},header=X-Extra: a\\,b"
    with stfs.mount(url, o=o) as mp:
        cmdline = read_as_nobody(f"/proc/{daemon_pid(mp)}/cmdline")
        assert cmdline is not None and TOKEN.encode() not in cmdline and b"X-Extra" not in cmdline, cmdline
        assert (mp / "w.npy").exists() and (mp / "w").read_bytes() == data["w"].tobytes()
    assert any("mount" in c for c in commands) and not any(TOKEN in arg or "X-Extra" in arg for c in commands for arg in c), commands
    # Without it the server refuses: the header above is what let the mount in.
    with pytest.raises(stfs.StfsError, match="401"):
        with stfs.mount(url):
            pass


def fake_mount(tmp_path, path, monkeypatch):
    """A directory that looks like an stfs mount, whose one tensor has metadata.json `path`: its
    `.stfs` directory, and the package's mountinfo check saying an stfs mount is there (stfs.load
    reads only an stfs mount's metadata.json; what is tested here is what it does with a hostile one)."""
    root = tmp_path / "fake"
    root.mkdir()
    (root / ".stfs").mkdir()
    real_check = stfs._load._stfs_mount_at
    monkeypatch.setattr(stfs._load, "_stfs_mount_at", lambda p: os.path.realpath(p) == str(root) or real_check(p))
    (tmp_path / "outside").write_bytes(b"not yours")
    meta = {"stfs_metadata_version": 1,
            "tensors": {"t": {"dtype": "U8", "shape": [9], "byte_len": 9, "path": path}}}
    (root / "metadata.json").write_text(json.dumps(meta))
    return root


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "link", "a/../../outside", ".", ""])
def test_load_refuses_a_path_outside_the_mount(tmp_path, path, monkeypatch):
    root = fake_mount(tmp_path, path, monkeypatch)
    os.symlink(tmp_path / "outside", root / "link")
    with pytest.raises(stfs.StfsError, match=r"^stfs: .*metadata\.json: tensor 't' has path .* not a file inside the mount$"):
        stfs.load(root)
    with pytest.raises(stfs.StfsError):
        tensor_path(str(root), "t", path)


def test_load_takes_a_path_inside_the_mount(tmp_path, monkeypatch):
    root = fake_mount(tmp_path, "sub/t", monkeypatch)
    (root / "sub").mkdir()
    (root / "sub" / "t").write_bytes(b"123456789")
    assert bytes(stfs.load(root)["t"]) == b"123456789"
    assert tensor_path(str(root), "t", "sub/./t") == os.path.join(str(root), "sub/./t")


def test_entries_resolve_only_what_may_be_a_link(tmp_path, monkeypatch):
    # A tensor file listed in the root as no link is inside it: no lookup per tensor through the
    # mount. A link is still resolved (and refused when it leads out).
    root = tmp_path / "fake"
    root.mkdir()
    (tmp_path / "outside").write_bytes(b"x")
    names = ["a", "b", "c"]
    tensors = {n: {"dtype": "U8", "shape": [1], "byte_len": 1, "path": n, "offset": i} for i, n in enumerate(names)}
    for n in names:
        (root / n).write_bytes(b"1")
    (root / "metadata.json").write_text(json.dumps({"stfs_metadata_version": 1, "tensors": tensors}))
    resolved = []
    realpath = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, *a, **k: resolved.append(os.fspath(p)) or realpath(p, *a, **k))
    assert [e.path for e in stfs.entries(root)] == [os.path.join(str(root), n) for n in names]
    assert resolved == [str(root)], resolved
    os.symlink(tmp_path / "outside", root / "d")
    tensors["d"] = {"dtype": "U8", "shape": [1], "byte_len": 1, "path": "d", "offset": 9}
    (root / "metadata.json").write_text(json.dumps({"stfs_metadata_version": 1, "tensors": tensors}))
    with pytest.raises(stfs.StfsError, match="tensor 'd' has path 'd', which is not a file inside the mount"):
        stfs.entries(root)
