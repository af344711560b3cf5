"""The examples in examples/ run against a real mount of examples/sample.safetensors, and what they print
is checked against the reference `safetensors` package's reading of the same file."""
import math
import os
import re
import shutil
import subprocess

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for the reference reads)
import numpy as np
import pytest
from safetensors import safe_open

from conftest import ROOT, STFS, TIMEOUT, mounted, tool_missing

EXAMPLES = os.path.join(ROOT, "examples")
SAMPLE = os.path.join(EXAMPLES, "sample.safetensors")


@pytest.fixture(scope="module")
def reference():
    """Every tensor of the sample, as the reference implementation reads it."""
    with safe_open(SAMPLE, framework="numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


@pytest.fixture(scope="module")
def sample_mount():
    with mounted(SAMPLE, "--npy") as mp:
        yield mp


def run(args, **kwargs):
    out = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, **kwargs)
    assert out.returncode == 0, f"{args[0]} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def ref_sum(array):
    return float(array.astype(np.float64).sum())


def sums_by_tensor(stdout):
    """{name: sum} from the `ok NAME ... sum=X` lines the Python examples print."""
    found = {}
    for line in stdout.splitlines():
        m = re.match(r"ok (\S+) .* sum=(\S+)$", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def test_shell_example(sample_mount, reference):
    out = run(["bash", os.path.join(EXAMPLES, "shell.sh"), sample_mount, SAMPLE], env={**os.environ, "STFS": STFS})
    head = reference["lm_head.weight"].reshape(-1)
    assert f"lm_head.weight: {head.nbytes} bytes" in out
    first4 = [float(x) for x in re.search(r"first4: (.*)", out).group(1).split()]
    assert np.allclose(first4, head[:4], rtol=1e-6), first4
    assert "dd slice: ok" in out
    assert f"cmp against checkpoint: {len(reference)} tensors ok" in out


def test_readme_memmap_example(sample_mount, reference):
    """The README's np.memmap example takes dtype and shape from metadata.json and reads the tensor."""
    text = open(os.path.join(ROOT, "README.md")).read()
    block = next(b.split("```", 1)[0] for b in text.split("```python\n")[1:] if "np.memmap(" in b)
    scope = {}
    exec(block.replace('"/mnt/model"', repr(sample_mount)), scope)
    a = scope["a"]
    want = reference["lm_head.weight"]
    assert a.dtype == want.dtype and a.shape == want.shape and np.array_equal(a, want)
    del a, scope


def test_shell_example_fails_without_stfs(sample_mount):
    # Before: "0 tensors ok" and exit 0 when the binary was not there.
    for missing in ["/nonexistent/stfs", "stfs-not-installed"]:
        out = subprocess.run(["bash", os.path.join(EXAMPLES, "shell.sh"), sample_mount, SAMPLE],
                             env={**os.environ, "STFS": missing}, capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode != 0, out
        assert "tensors ok" not in out.stdout, out.stdout
        assert "not found" in out.stderr, out.stderr


def test_numpy_example(sample_mount, reference):
    out = run(["python3", os.path.join(EXAMPLES, "numpy_load.py"), sample_mount])
    sums = sums_by_tensor(out)
    assert sorted(sums) == sorted(reference), out
    for name, array in reference.items():
        assert math.isclose(sums[name], ref_sum(array), rel_tol=1e-12, abs_tol=1e-12), name
    # With the mount's --npy view, every tensor was also checked through np.load.
    assert out.count("+np.load(.npy)") == len(reference), out


def test_numpy_example_refuses_unknown_tensor(sample_mount):
    out = subprocess.run(["python3", os.path.join(EXAMPLES, "numpy_load.py"), sample_mount, "nope"], capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 1 and "nope" in out.stderr


def test_torch_example(sample_mount, reference):
    try:
        import torch
    except ImportError:
        tool_missing("torch", "pip install -r tests/python/requirements-torch.txt; examples/torch_load.py not run")
    out = run(["python3", os.path.join(EXAMPLES, "torch_load.py"), sample_mount, "--device", "cpu"])
    sums = sums_by_tensor(out)
    assert sorted(sums) == sorted(reference), out
    for name, array in reference.items():
        assert math.isclose(sums[name], ref_sum(array), rel_tol=1e-9, abs_tol=1e-9), name
    assert all("device=cpu" in line for line in out.splitlines() if line.startswith("ok ")), out
    if torch.cuda.is_available():
        out = run(["python3", os.path.join(EXAMPLES, "torch_load.py"), sample_mount, "lm_head.weight"])
        assert "device=cuda:" in out, out


def test_c_example(sample_mount, reference, tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        tool_missing("cc", "apt-get install gcc")
    binary = tmp_path / "read_tensor"
    run([cc, "-std=c11", "-D_XOPEN_SOURCE=700", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), os.path.join(EXAMPLES, "read_tensor.c")])
    for name, array in reference.items():
        if array.dtype != np.float32:
            continue
        flat = array.reshape(-1)
        first = len(flat) // 3
        out = run([str(binary), os.path.join(sample_mount, name), str(first), "3"])
        m = re.search(r": (\d+) bytes, (\d+) float32, sum=(\S+)", out)
        assert m, out
        assert (int(m.group(1)), int(m.group(2))) == (array.nbytes, flat.size)
        assert math.isclose(float(m.group(3)), ref_sum(array), rel_tol=1e-9, abs_tol=1e-9), name
        values = [float(x) for x in out.splitlines()[1].split(":", 1)[1].split()]
        assert np.array_equal(np.array(values, dtype=np.float32), flat[first : first + 3]), out
    # What it cannot sum as float32 is refused: BF16 bytes, a .npy view (its header), a file off the mount.
    bf16 = next(name for name, a in reference.items() if a.dtype != np.float32)
    f32 = next(name for name, a in reference.items() if a.dtype == np.float32)
    plain = tmp_path / "plain"
    shutil.copyfile(os.path.join(sample_mount, f32), plain)
    for path in [os.path.join(sample_mount, bf16), os.path.join(sample_mount, f32 + ".npy"), str(plain)]:
        out = subprocess.run([str(binary), path], capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode == 1 and out.stdout == "", (path, out)
        assert "not float32" in out.stderr or "not a tensor file" in out.stderr, out.stderr
    # Under --as f32 a BF16 tensor's file is float32, and is summed.
    with mounted(SAMPLE, "--as", "f32") as mp:
        out = run([str(binary), os.path.join(mp, bf16)])
        assert math.isclose(float(re.search(r"sum=(\S+)", out).group(1)), ref_sum(reference[bf16].astype(np.float32)))


def test_extract_and_cat_match_the_reference(reference, tmp_path):
    """`stfs extract --npy` files load with np.load, without any mount."""
    out_dir = tmp_path / "npy"
    run([STFS, "extract", "--all", "--npy", SAMPLE, "-o", str(out_dir)])
    for name, array in reference.items():
        loaded = np.load(out_dir / f"{name}.npy")
        if loaded.dtype != array.dtype:
            loaded = loaded.view(array.dtype)
        assert loaded.shape == array.shape and np.array_equal(loaded, array), name
    raw = subprocess.run([STFS, "cat", SAMPLE, "lm_head.weight"], capture_output=True, timeout=TIMEOUT, check=True).stdout
    assert raw == reference["lm_head.weight"].tobytes()
