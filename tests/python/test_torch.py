"""PyTorch on real mounts: stfs.load(framework="torch") for every dtype torch has, on the CPU and on a
CUDA device, against safetensors.torch.load_file of the source; where tensors land with
torch.set_default_device in force; the re-served checkpoint read by safetensors' own torch loaders;
and a transformers model loaded with from_pretrained from a mount of its directory.

scripts/test runs this file in the virtualenv of tests/python/requirements-torch.txt (torch,
transformers). Without torch or transformers the tests skip, except under CI=true, where they fail.
The device="cuda" cases skip only when torch.cuda.is_available() is false, and fail then too under
STFS_REQUIRE_GPU=1 (scripts/test-gpu sets it, on a machine with a GPU).
"""
import contextlib
import json
import math
import os
import re
import sys
import weakref

import pytest

from conftest import ROOT, mounted, tool_missing

os.environ.setdefault("STFS_BIN", os.path.join(ROOT, "target", "debug", "stfs"))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package's source in this checkout
import stfs  # noqa: E402
import stfs._load  # noqa: E402

INSTALL = "scripts/test installs it into its virtualenv: pip install -r tests/python/requirements-torch.txt"
DEVICES = ["cpu", "cuda"]

try:
    import torch
except ImportError:
    torch = None


def need_torch():
    if torch is None:
        tool_missing("torch", INSTALL)
    return torch


def need_transformers():
    need_torch()
    try:
        import transformers
    except ImportError:
        tool_missing("transformers", INSTALL)
    return transformers


def need_device(device):
    """The device a test runs on: "cpu", or "cuda" where torch sees a GPU. Without one a CUDA case
    skips, or fails under STFS_REQUIRE_GPU=1 (scripts/test-gpu)."""
    need_torch()
    if device == "cuda" and not torch.cuda.is_available():
        why = (f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
               f"CUDA build {torch.version.cuda})")
        if os.environ.get("STFS_REQUIRE_GPU") == "1":
            pytest.fail(f"{why}, and STFS_REQUIRE_GPU=1 (scripts/test-gpu) requires a GPU")
        pytest.skip(f"{why}; scripts/test-gpu runs this case on a GPU")
    if device == "cuda":  # where device="cuda" puts tensors: the current device, by its index
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


@pytest.fixture
def meta_default():
    """torch.set_default_device("meta") in force for the test: any tensor made without a device
    spelled out lands on "meta"."""
    need_torch()
    torch.set_default_device("meta")
    assert torch.empty(1).device.type == "meta"
    try:
        yield
    finally:
        torch.set_default_device(None)


def as_bytes(t):
    """The tensor's bytes as a flat uint8 CPU tensor (NaN-safe, and defined for every dtype)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


def assert_same(got, want, device=None):
    """`got` (name -> tensor) equals `want` (the reference loader's, on the CPU): same names, dtype,
    shape and bytes; with `device`, every tensor of `got` is there."""
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        if device is not None:
            assert g.device == device, (name, g.device, device)
        assert torch.equal(as_bytes(g), as_bytes(w)), name


def mounted_paths():
    with open("/proc/self/mountinfo") as f:
        return {line.split(" ")[4] for line in f}


# --- checkpoints ---------------------------------------------------------------------------------

# Every safetensors dtype torch has, by the torch name: stfs.load must give each as itself.
DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
    "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",
}
# A scalar, an empty tensor, odd sizes, and one of a few MiB (several of the mount's blocks).
SHAPES = [(), (0, 3), (7,), (3, 5, 2), (33, 129), (1024, 1536)]


def random_tensor(gen, dtype, shape):
    """Random bits of `dtype` (every bit pattern, NaNs included: compared as bytes)."""
    count = math.prod(shape)
    raw = torch.randint(0, 256, (count * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        return (raw > 127).reshape(shape)
    return raw.view(dtype).reshape(shape)


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    """A checkpoint written by safetensors.torch.save_file with every dtype of DTYPES in every shape
    of SHAPES (F4 as float4_e2m1fn_x2: pairs along the last dimension)."""
    need_torch()
    from safetensors.torch import save_file

    missing = [n for n in DTYPES.values() if not isinstance(getattr(torch, n, None), torch.dtype)]
    assert not missing, f"torch {torch.__version__} lacks {missing}: pin a torch that has them"
    gen = torch.Generator().manual_seed(25)
    tensors = {}
    for code, name in DTYPES.items():
        for j, shape in enumerate(SHAPES):
            if name == "float4_e2m1fn_x2" and not shape:
                continue  # no scalar of a packed pair
            tensors[f"{code}.{j}"] = random_tensor(gen, getattr(torch, name), shape)
    path = tmp_path_factory.mktemp("torch") / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    # The file holds every dtype under its safetensors name (so none was silently converted).
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == set(DTYPES)
    return path


def sharded_checkpoint(directory, parts=3, per_part=4, seed=7):
    """`parts` shards written with save_file and an index, as save_pretrained lays them out."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    os.makedirs(directory, exist_ok=True)
    for p in range(parts):
        shard = f"model-{p + 1:05d}-of-{parts:05d}.safetensors"
        tensors = {f"layers.{p}.{i}.weight": random_tensor(gen, [torch.bfloat16, torch.float32, torch.int64][i % 3], (17 + i, 40))
                   for i in range(per_part)}
        save_file(tensors, os.path.join(directory, shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name in tensors})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    return weight_map


# --- stfs.load ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_load_gives_every_dtype_equal_to_the_reference(every_dtype, device):
    target = need_device(device)
    from safetensors.torch import load_file

    want = load_file(str(every_dtype))
    with mounted(every_dtype) as mp:
        got = stfs.load(mp, framework="torch", device=device)
        assert_same(got, want, target)
        del got
    # A source (not a mount): load mounts it itself and detaches the mount before returning.
    before = mounted_paths()
    got = stfs.load(every_dtype, framework="torch", device=device)
    assert mounted_paths() <= before
    assert_same(got, want, target)


class Placements(torch.overrides.TorchFunctionMode if torch else object):
    """Counts, by device type, every tensor any torch function returns while it is in force (on top of
    the default-device mode torch.set_default_device installs, so it sees where tensors really land)."""

    def __init__(self):
        super().__init__()
        self.devices = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.devices[t.device.type] = self.devices.get(t.device.type, 0) + 1
        return out


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_asked_for_wins_over_a_meta_default_device(every_dtype, meta_default, device):
    target = need_device(device)
    from safetensors.torch import load_file

    with torch.device("cpu"):
        want = load_file(str(every_dtype))
    for source in ("mount", "file"):
        with mounted(every_dtype) if source == "mount" else contextlib.nullcontext(every_dtype) as path:
            with Placements() as seen:
                got = stfs.load(path, framework="torch", device=device)
            assert "meta" not in seen.devices, (source, seen.devices)
            assert seen.devices.get(target.type), (source, seen.devices)  # the mode did see the tensors
            assert_same(got, want, target)
            del got
    # With no device, load's own default is "cpu", not the default device.
    got = stfs.load(every_dtype, framework="torch")
    assert {t.device.type for t in got.values()} == {"cpu"}


def test_cuda_without_a_gpu_is_one_clear_error(every_dtype, tmp_path, request):
    need_torch()
    if torch.cuda.is_available():
        # A machine with a GPU: the same test in a process that sees none (CUDA_VISIBLE_DEVICES empty).
        import subprocess

        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", STFS_REQUIRE_GPU="0")
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                             cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0 and re.search(r"^1 passed", out.stdout, re.M), out.stdout[-3000:] + out.stderr[-2000:]
        return
    before = mounted_paths()
    for device in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(stfs.StfsError) as err:
            stfs.load(every_dtype, framework="torch", device=device)
        message = str(err.value)
        assert message.startswith(f"stfs.load: device='{device}', but no CUDA device is available"), message
        assert "\n" not in message and "torch.cuda.is_available() is False" in message, message
        assert mounted_paths() <= before  # the mount load made is gone
    with mounted(every_dtype) as mp:
        with pytest.raises(stfs.StfsError, match=r"^stfs\.load: device='cuda', but no CUDA device"):
            stfs.load(mp, framework="torch", device="cuda")


def test_cuda_device_index_past_the_last_gpu_is_one_clear_error(every_dtype):
    need_device("cuda")
    count = torch.cuda.device_count()
    with pytest.raises(stfs.StfsError, match=rf"^stfs\.load: device='cuda:{count}', but this machine has {count} CUDA device"):
        stfs.load(every_dtype, framework="torch", device=f"cuda:{count}")


def test_cuda_load_stages_through_a_pinned_ring_with_events_under_the_device_guard(tmp_path, monkeypatch):
    """The CUDA path allocates each tensor on the device and fills it through the StagingRing: the
    pinned host memory of the load is the ring's (PINNED_SLOTS buffers, each made once and reused),
    reads overlap the non-blocking copies, no device-wide torch.cuda.synchronize is called, every
    read runs with the target as the current device, and the ring's blocks are handed back at the end."""
    target = need_device("cuda")
    from safetensors.torch import load_file, save_file

    block = 32 << 20  # bytes per tensor: a copy of this takes a millisecond or more
    gen = torch.Generator().manual_seed(3)
    tensors = {f"w.{i}": random_tensor(gen, torch.float16, (block // 2,)) for i in range(8)}
    ckpt = tmp_path / "model.safetensors"
    save_file(tensors, str(ckpt))
    want = load_file(str(ckpt))
    slots, slot_bytes = 3, 4 << 20

    # Pinned host tensors alive at once, and how many were made, by the loader's own allocations.
    live, peak, made = [0], [0], [0]
    real_empty = torch.empty

    def tracking_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if kwargs.get("pin_memory"):
            n = t.numel() * t.element_size()
            live[0] += n
            made[0] += 1
            peak[0] = max(peak[0], live[0])
            weakref.finalize(t, lambda: live.__setitem__(0, live[0] - n))
        return t

    # Whether the stream still had work queued (a copy in flight) when each read began, and the
    # current device then.
    busy_at_read, device_at_read = [], set()
    real_read = stfs._load._read_full

    def observed_read(f, view):
        busy_at_read.append(not torch.cuda.current_stream(target).query())
        device_at_read.add(torch.cuda.current_device())
        return real_read(f, view)

    def no_synchronize(*args, **kwargs):
        raise AssertionError("stfs.load called torch.cuda.synchronize (device-wide): the ring's events should do")

    with mounted(ckpt) as mp:
        stfs.load(mp, framework="torch", device="cuda")  # warms the page cache
        torch.cuda.synchronize()
        before_load = torch.cuda.host_memory_stats()["allocated_bytes.current"]
        monkeypatch.setattr(stfs._load, "PINNED_SLOTS", slots)
        monkeypatch.setattr(stfs._load, "PINNED_SLOT_BYTES", slot_bytes)
        monkeypatch.setattr(torch, "empty", tracking_empty)
        monkeypatch.setattr(torch.cuda, "synchronize", no_synchronize)
        monkeypatch.setattr(stfs._load, "_read_full", observed_read)
        got = stfs.load(mp, framework="torch", device="cuda")
        monkeypatch.undo()
        assert_same(got, want, target)
    assert made[0] == slots, f"{made[0]} pinned buffers made for {len(tensors)} tensors: the ring holds {slots}"
    assert peak[0] == slots * slot_bytes, f"{peak[0]} bytes of pinned memory alive at once, the ring's bound is {slots * slot_bytes}"
    assert live[0] == 0, f"{live[0]} bytes of the ring still referenced after load"
    assert device_at_read == {target.index}, device_at_read
    assert len(busy_at_read) == len(tensors) * block // slot_bytes
    # Without overlap (a blocking copy, or a synchronize per piece) no read would find a copy queued.
    assert sum(busy_at_read[1:]) >= 1, f"no read started while a copy was in flight: {busy_at_read}"
    # The ring's blocks went back to the driver, not to torch's pinned cache kept for the process:
    # the allocator owns (active + cached) no more pinned bytes than before the load.
    after = torch.cuda.host_memory_stats()["allocated_bytes.current"]
    assert after <= before_load, f"{after - before_load} bytes of pinned memory kept after the load"


def test_cuda_load_to_the_second_gpu_makes_no_context_on_the_first(every_dtype, tmp_path):
    """device="cuda:1" on a machine of two GPUs: GPU 0 gets no CUDA context (a fresh process, so
    nothing else made one). Needs two GPUs; the GPU machines lent so far have one, so scripts/test-gpu
    names this test among the skips it allows."""
    need_device("cuda")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    import subprocess

    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'python')!r})\n"
        "import stfs\n"
        f"got = stfs.load({str(every_dtype)!r}, framework='torch', device='cuda:1')\n"
        "assert all(t.device == torch.device('cuda', 1) for t in got.values())\n"
        "import ctypes\n"
        "lib = ctypes.CDLL('libcuda.so.1')\n"
        "flags, active = ctypes.c_uint(), ctypes.c_int()\n"
        "assert lib.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0\n"
        "print('gpu0-active', active.value)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "gpu0-active 0" in out.stdout, out.stdout


# --- the staging ring, on the CPU ------------------------------------------------------------------

class FakeStream:
    """A stand-in for a CUDA stream that runs nothing until it is waited for: each copy is queued and
    done only when an event recorded after it is synchronized (or at drain), reading its source then,
    as a real asynchronous copy does. A buffer refilled before its copies ran corrupts them."""

    def __init__(self):
        self.queue = []
        self.copies = 0

    def copy(self, dst, src):
        assert dst.numel() == src.numel() and src.numel() > 0
        self.queue.append(("copy", dst, src))

    def run_until(self, marker):
        while self.queue:
            op = self.queue.pop(0)
            if op[0] == "copy":
                op[1].copy_(op[2])
                self.copies += 1
            elif op[1] is marker:
                return

    def drain(self):
        self.run_until(None)


class FakeEvent:
    def __init__(self, stream, waits=True):
        self.stream, self.waits, self.marker = stream, waits, None

    def record(self):
        self.marker = object()
        self.stream.queue.append(("mark", self.marker))

    def synchronize(self):
        if self.waits:
            self.stream.run_until(self.marker)


def staged_load(mp, slots, slot_bytes, waits=True):
    """stfs._load's staged path on the CPU: every tensor of the mount through a StagingRing of
    `slots` x `slot_bytes`, copied by a FakeStream; returns (tensors, ring, stream, allocation log)."""
    stream = FakeStream()
    allocs = []

    def alloc(nbytes):
        allocs.append(nbytes)
        return torch.full((nbytes,), 0xA5, dtype=torch.uint8, device="cpu")

    ring = stfs._load.StagingRing(slots, slot_bytes, alloc, lambda: FakeEvent(stream, waits))
    got = stfs._load._load_staged(torch, stfs.entries(mp), torch.device("cpu"), ring, stream.copy, [])
    ring.finish()
    return got, ring, stream, allocs


@pytest.mark.parametrize("slots,slot_bytes", [(2, 1 << 20), (3, 300_007), (4, 64 << 10)])
def test_the_staging_ring_bounds_host_memory_by_its_size_and_waits_before_reuse(every_dtype, slots, slot_bytes):
    """Every dtype and shape (tensors from 0 bytes to 12 MiB, most larger than a slot) through a ring
    whose copies run only when waited for: the bytes arrive intact, so no buffer was refilled while a
    copy out of it was pending; the ring made `slots` buffers of `slot_bytes` and no more (its bound,
    a function of its size alone), and nothing is left queued after finish."""
    need_torch()
    from safetensors.torch import load_file

    want = load_file(str(every_dtype))
    total = sum(t.numel() * t.element_size() for t in want.values())
    assert total > 8 * slots * slot_bytes  # the ring is reused many times over
    with mounted(every_dtype) as mp:
        got, ring, stream, allocs = staged_load(mp, slots, slot_bytes)
    assert not stream.queue, f"{len(stream.queue)} operations still queued after finish"
    assert_same(got, want, torch.device("cpu"))
    assert allocs == [slot_bytes] * slots, allocs
    assert ring.bound == slots * slot_bytes == ring.allocated_bytes
    assert ring.waits >= total // (slots * slot_bytes) - 1, ring.waits
    assert stream.copies >= total // slot_bytes


def test_a_ring_that_does_not_wait_for_its_events_corrupts_the_copies(every_dtype):
    """The check above can fail: the same ring with events whose synchronize waits for nothing
    refills buffers under pending copies, and the tensors come out wrong."""
    need_torch()
    from safetensors.torch import load_file

    want = load_file(str(every_dtype))
    with mounted(every_dtype) as mp:
        got, ring, stream, _ = staged_load(mp, 2, 1 << 20, waits=False)
    stream.drain()
    wrong = [n for n, w in want.items() if w.numel() and not torch.equal(as_bytes(got[n]), as_bytes(w))]
    assert len(wrong) > len(want) // 2, f"only {len(wrong)} of {len(want)} tensors differ"


def test_small_tensors_share_a_ring_buffer_and_a_small_checkpoint_gets_a_small_ring(tmp_path):
    """Tensors smaller than a slot are packed into one buffer (no wait per tensor), and the slot size
    shrinks to the checkpoint: a 4 KiB checkpoint does not pin 4 x 32 MiB."""
    need_torch()
    from safetensors.torch import load_file

    sharded = tmp_path / "sharded"
    sharded_checkpoint(sharded)  # 12 tensors of 2.7 to 4.5 KB
    with mounted(sharded) as mp:
        items = stfs.entries(mp)
        total = sum(e.byte_len for e in items)
        slot = stfs._load._slot_bytes(items)
        assert total <= slot < 2 * total, (total, slot)
        got, ring, stream, allocs = staged_load(mp, stfs._load.PINNED_SLOTS, slot)
    want = {}
    for shard in sorted(sharded.glob("*.safetensors")):
        want.update(load_file(str(shard)))
    assert_same(got, want, torch.device("cpu"))
    assert allocs == [slot] and ring.waits == 0, (allocs, ring.waits)
    assert stfs._load._slot_bytes([stfs._load.Entry("w", "U8", [1 << 40], 1 << 40, "-")]) == stfs._load.PINNED_SLOT_BYTES
    with pytest.raises(ValueError, match="at least 2 slots"):
        stfs._load.StagingRing(1, 1 << 20, None, None)


# --- the re-served checkpoint ---------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_safetensors_torch_loaders_on_the_reserved_checkpoint(every_dtype, tmp_path, device):
    target = need_device(device)
    from safetensors import safe_open
    from safetensors.torch import load_file

    sharded = tmp_path / "sharded"
    sharded_checkpoint(sharded)
    cases = [(every_dtype, {"model.safetensors": every_dtype})]
    cases.append((sharded, {p.name: p for p in sorted(sharded.glob("*.safetensors"))}))
    for source, files in cases:
        with mounted(source) as mp:
            for name, original in files.items():
                served = os.path.join(mp, name)
                want = load_file(str(original))
                assert_same(load_file(served, device=device), want, target)
                with safe_open(served, framework="pt", device=device) as got, safe_open(str(original), framework="pt") as ref:
                    assert got.metadata() == ref.metadata()
                    assert sorted(got.keys()) == sorted(want)
                    assert_same({k: got.get_tensor(k) for k in got.keys()}, want, target)
                    k = next(k for k in want if want[k].dim() == 2 and want[k].shape[0] > 2)
                    part = got.get_slice(k)[1:3]
                    assert torch.equal(as_bytes(part), as_bytes(want[k][1:3])), k
            if source == sharded:
                with open(os.path.join(mp, "model.safetensors.index.json")) as f, open(sharded / "model.safetensors.index.json") as g:
                    assert json.load(f) == json.load(g)


# --- transformers -------------------------------------------------------------------------------

def tiny_model(transformers):
    """A two-layer Llama with random weights, made here from a config (nothing downloaded)."""
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():  # some weights start as constants (norms): make every one distinct
        for p in model.parameters():
            p.normal_()
    return config, model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shard", [None, "40KB"], ids=["one-file", "sharded"])
def test_from_pretrained_loads_a_model_from_a_mount(tmp_path, monkeypatch, shard, device):
    transformers = need_transformers()
    target = need_device(device)
    from safetensors.torch import load_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    config, model = tiny_model(transformers)
    saved = tmp_path / "model"
    model.save_pretrained(saved, **({"max_shard_size": shard} if shard else {}))
    shards = sorted(p.name for p in saved.glob("*.safetensors"))
    assert (len(shards) > 1) == bool(shard), shards
    source = {}
    for name in shards:
        source.update(load_file(str(saved / name)))

    with mounted(saved) as mp:
        meta = json.loads(open(os.path.join(mp, "metadata.json")).read())
        served = sorted(f["path"] for f in meta["checkpoint_files"] if "shard" in f)
        assert served == shards, served
        # The directory's config.json comes along beside the checkpoint, as an hf:// mount's does.
        assert "config.json" in [f["path"] for f in meta["repo_files"]], meta["repo_files"]
        loaded = transformers.AutoModel.from_pretrained(mp, device_map=device)
        state = loaded.state_dict()
        assert set(source) <= set(state), sorted(set(source) - set(state))
        for name, want in source.items():
            got = state[name]
            assert got.device == target, (name, got.device)
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), name
        for name, p in model.state_dict().items():
            assert torch.equal(state[name].cpu(), p), name
        del loaded, state
