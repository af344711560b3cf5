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


def test_cuda_without_a_gpu_is_one_clear_error(every_dtype, tmp_path):
    need_torch()
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the no-GPU error cannot happen here")
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


def test_cuda_load_bounds_pinned_memory_and_overlaps_reads_with_copies(tmp_path, monkeypatch):
    """The CUDA path reads each file into pinned host memory and copies it with non_blocking=True: the
    next file's read starts while that copy is still in flight, and the pinned memory alive at once
    stays under PINNED_IN_FLIGHT (plus the tensor that crossed it)."""
    target = need_device("cuda")
    from safetensors.torch import load_file, save_file

    block = 32 << 20  # bytes per tensor: a copy of this takes a millisecond or more
    gen = torch.Generator().manual_seed(3)
    tensors = {f"w.{i}": random_tensor(gen, torch.float16, (block // 2,)) for i in range(8)}
    ckpt = tmp_path / "model.safetensors"
    save_file(tensors, str(ckpt))
    want = load_file(str(ckpt))

    # Pinned host tensors alive at once, by the loader's own allocations (torch.empty(pin_memory=True)).
    live, peak = [0], [0]
    real_empty = torch.empty

    def tracking_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if kwargs.get("pin_memory"):
            n = t.numel() * t.element_size()
            live[0] += n
            peak[0] = max(peak[0], live[0])
            weakref.finalize(t, lambda: live.__setitem__(0, live[0] - n))
        return t

    # Whether the stream still had work queued (a copy in flight) when each read began.
    busy_at_read = []
    real_read = stfs._load._read_into

    def observed_read(path, tensor):
        busy_at_read.append(not torch.cuda.current_stream(target).query())
        return real_read(path, tensor)

    with mounted(ckpt) as mp:
        stfs.load(mp, framework="torch", device="cuda")  # warms the page cache and the pinned-block cache
        torch.cuda.synchronize()
        # The warm-up's pinned blocks are handed back to the allocator's free list (counted as active
        # until then) at its next allocation: one tiny allocation does it, so the peak starts from zero.
        torch.empty(1, pin_memory=True)
        monkeypatch.setattr(stfs._load, "PINNED_IN_FLIGHT", 3 * block)
        monkeypatch.setattr(torch, "empty", tracking_empty)
        monkeypatch.setattr(stfs._load, "_read_into", observed_read)
        torch.cuda.reset_peak_host_memory_stats()
        got = stfs.load(mp, framework="torch", device="cuda")
        monkeypatch.undo()
        assert_same(got, want, target)
    assert len(busy_at_read) == len(tensors)
    assert peak[0] > 0, "no pinned host memory was allocated: not the CUDA path"
    assert peak[0] <= 3 * block + block, f"{peak[0]} bytes of pinned memory alive at once"
    # The allocator's view: blocks handed out at once (a freed block counts until its copy is done).
    stats = torch.cuda.host_memory_stats()
    assert "active_bytes.peak" in stats, sorted(stats)
    assert 0 < stats["active_bytes.peak"] <= 3 * block + 2 * block, f"pinned allocator peak {stats['active_bytes.peak']} bytes"
    # Without overlap (a blocking copy, or a synchronize per tensor) no read would find a copy queued.
    assert sum(busy_at_read[1:]) >= 1, f"no read started while a copy was in flight: {busy_at_read}"


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
