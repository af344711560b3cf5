"""stfs.load's progress bar (issue 33): on a terminal a tqdm bar with the bytes load reads and their
throughput; none in a pipe, none with progress=False, none by default for a small local checkpoint.
The terminal is a real pseudo-terminal (pty.fork): the child's stderr is a TTY, as a person's is.
The bytes load reads itself here are an F4 tensor's (unpacked for NumPy); the same ticks come from
the CUDA staging ring and copies to other torch devices (test_torch.py runs those paths)."""
import json
import os
import pty
import select
import struct
import subprocess
import sys
import time

import pytest

from conftest import STFS, TIMEOUT, tool_missing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F4_BYTES = 3 << 20


@pytest.fixture(autouse=True)
def _tqdm_and_ml_dtypes():
    for module, why in (("tqdm", "the progress bar"), ("ml_dtypes", "F4 for NumPy")):
        try:
            __import__(module)
        except ImportError:
            tool_missing(module, f"pip install {module} ({why}; tests/python/requirements.txt)")


@pytest.fixture
def f4_checkpoint(tmp_path):
    """A checkpoint of one F4 tensor of F4_BYTES bytes (2 * F4_BYTES elements)."""
    header = json.dumps({"w": {"dtype": "F4", "shape": [2 * F4_BYTES], "data_offsets": [0, F4_BYTES]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "f4.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(range(256)) * (F4_BYTES // 256))
    return path


def child_code(checkpoint, arguments, min_bytes=None):
    lines = ["import stfs, stfs._load"]
    if min_bytes is not None:
        lines.append(f"stfs._load.PROGRESS_MIN_BYTES = {min_bytes}")
    lines.append(f"a = stfs.load({str(checkpoint)!r}{arguments})")
    lines.append("print('loaded', a['w'].size, flush=True)")
    return "\n".join(lines)


def child_env():
    env = dict(os.environ, STFS_BIN=STFS, PYTHONPATH=os.path.join(ROOT, "python"), COLUMNS="100", TERM="xterm")
    return env


def run_in_pty(code):
    """Runs python3 -c CODE with stdin, stdout and stderr on a pseudo-terminal; returns what the
    terminal showed and the exit status. Bounded by TIMEOUT."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdio is the pty
        try:
            os.execve(sys.executable, [sys.executable, "-c", code], child_env())
        finally:
            os._exit(127)
    out, deadline = b"", time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail(f"the child did not finish within {TIMEOUT} s: {out!r}")
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def shows_a_bar(text):
    return "stfs.load f4.safetensors" in text and "B/s" in text and "100%" in text


def test_a_terminal_shows_bytes_and_throughput(f4_checkpoint):
    text, code = run_in_pty(child_code(f4_checkpoint, ", progress=True"))
    assert code == 0, text
    assert f"loaded {2 * F4_BYTES}" in text, text
    assert shows_a_bar(text), text
    assert "3.00M/3.00M" in text, text  # the bytes read, of the bytes to read (unit_divisor 1024)


def test_by_default_a_terminal_shows_it_from_the_size_threshold_on(f4_checkpoint):
    text, code = run_in_pty(child_code(f4_checkpoint, "", min_bytes=F4_BYTES))
    assert code == 0 and shows_a_bar(text), text
    text, code = run_in_pty(child_code(f4_checkpoint, "", min_bytes=F4_BYTES + 1))
    assert code == 0 and f"loaded {2 * F4_BYTES}" in text, text
    assert "B/s" not in text, f"a small local checkpoint shows no bar by default: {text!r}"


def test_progress_false_shows_none_on_a_terminal(f4_checkpoint):
    text, code = run_in_pty(child_code(f4_checkpoint, ", progress=False", min_bytes=0))
    assert code == 0 and f"loaded {2 * F4_BYTES}" in text, text
    assert "B/s" not in text and "stfs.load f4" not in text, text


def test_a_pipe_shows_none_even_when_asked(f4_checkpoint):
    out = subprocess.run([sys.executable, "-c", child_code(f4_checkpoint, ", progress=True", min_bytes=0)],
                         capture_output=True, text=True, timeout=TIMEOUT, env=child_env())
    assert out.returncode == 0, out
    assert out.stdout == f"loaded {2 * F4_BYTES}\n", out
    assert out.stderr == "", out


def test_memmaps_show_none_they_are_read_when_touched(tmp_path):
    np = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    path = tmp_path / "plain.safetensors"
    save_file({"w": np.arange(1 << 20, dtype=np.float32)}, str(path))
    text, code = run_in_pty(child_code(path, ", progress=True", min_bytes=0))
    assert code == 0 and f"loaded {1 << 20}" in text, text
    assert "B/s" not in text, text
