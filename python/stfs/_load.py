"""stfs.load: every tensor of a mount, as NumPy arrays or torch tensors, typed by metadata.json."""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Set

from ._mapping import mapped
from ._mount import DEFAULT_TIMEOUT, PathLike, StfsError, _mount, _path, _mount_info, _run, _utf8, is_mounted

# safetensors dtype -> NumPy dtype (little-endian, as the files are).
NUMPY_DTYPES = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
    "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8", "C64": "<c8",
}
# dtypes NumPy lacks, as the ml_dtypes package names them.
ML_DTYPES = {
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
    "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
# Sub-byte dtypes: several elements share a byte, so no array type maps the file element for element.
F4 = "F4"  # two per byte, the first element in the low nibble (torch's float4_e2m1fn_x2)
F6 = ("F6_E2M3", "F6_E3M2")  # four per three bytes; no NumPy or torch type holds them packed

#: With a CUDA device, host copies in flight are waited for once they add up to this many bytes, so
#: pinned memory stays bounded instead of growing to the size of the model.
PINNED_IN_FLIGHT = 256 << 20


class Entry(NamedTuple):
    """One tensor as a mount serves it (served dtype and size: --as f32 changes both)."""
    name: str
    dtype: str
    shape: List[int]
    byte_len: int
    path: str


def _stfs_mount_at(root: str) -> bool:
    """Whether the topmost mount at `root` is stfs's, by /proc/self/mountinfo: type ``fuse.stfs``, or
    ``fuse`` with the source ``stfs#...`` that a fusermount unable to set a subtype records."""
    return bool(_mount_info(root)["stfs"])


def is_mount_dir(path: PathLike) -> bool:
    """Whether `path` is the root of an stfs mount: a mount point (links to it followed) whose
    mount is stfs's (type ``fuse.stfs`` in /proc/self/mountinfo), holding the `.stfs` control
    directory and stfs's metadata.json. A plain directory is never one, even with a metadata.json
    copied out of a mount in it: its shards are mounted and read, not that file; nor is the root of
    another filesystem's mount (a tmpfs, a volume) holding such a copy."""
    root = os.path.realpath(_path(path))
    meta = os.path.join(root, "metadata.json")
    if not (_stfs_mount_at(root) and os.path.isdir(os.path.join(root, ".stfs")) and os.path.isfile(meta)):
        return False
    try:
        with open(meta, "rb") as f:  # UTF-8 JSON, whatever the locale
            return "stfs_metadata_version" in json.load(f)
    except (OSError, ValueError):
        return False


def entries(mountpoint: PathLike) -> List[Entry]:
    """Every tensor of the mount at `mountpoint`, in checkpoint order (shard, then offset)."""
    root = _path(mountpoint)
    real_root = os.path.realpath(root)
    with open(os.path.join(root, "metadata.json"), "rb") as f:  # UTF-8 JSON, whatever the locale
        meta = json.load(f)
    plain = _plain_children(root)
    ordered = sorted(meta["tensors"].items(), key=lambda kv: (kv[1].get("shard", 0), kv[1].get("offset", 0)))
    return [
        Entry(name, info.get("served_dtype", info["dtype"]), list(info["shape"]),
              int(info.get("served_byte_len", info["byte_len"])),
              tensor_path(root, name, info["path"], real_root, plain))
        for name, info in ordered
    ]


def _plain_children(root: str) -> Set[str]:
    """The names in `root` that are not symbolic links, from one listing (the entries' types, no
    stat each): a path that is one of them is inside `root` without resolving it, which would cost
    a lookup through the mount per tensor (84 tensors: 7 ms of a 41 ms first tensor from s3://).
    Empty if `root` cannot be listed: every path is then resolved."""
    try:
        with os.scandir(root) as listing:
            return {e.name for e in listing if not e.is_symlink()}
    except OSError:
        return set()


def tensor_path(root: str, name: str, path: Any, real_root: Optional[str] = None,
                plain: Optional[Set[str]] = None) -> str:
    """`root`/`path` for a tensor's metadata.json `path`, refused (StfsError) unless it names a file
    inside `root` once resolved: not absolute, no ``..`` out of it, no link leading out of it
    (`real_root`: os.path.realpath(root), when the caller has it; `plain`: names in `root` known
    not to be links, see _plain_children, taken as inside it without resolving them)."""
    if isinstance(path, str):
        # The mount names files by the UTF-8 bytes of the name; spelled for this process's
        # filesystem encoding (the same string under UTF-8; surrogate escapes under an ASCII or
        # latin-1 locale), the path names those bytes.
        with contextlib.suppress(UnicodeError):
            path = os.fsdecode(path.encode("utf-8"))
    if plain and isinstance(path, str) and path in plain:
        return os.path.join(root, path)
    real_root = real_root or os.path.realpath(root)
    if isinstance(path, str) and path and "\0" not in path and not os.path.isabs(path):
        joined = os.path.join(root, path)
        real = os.path.realpath(joined)
        if real != real_root and os.path.commonpath([real_root, real]) == real_root:
            return joined
    raise StfsError(f"stfs: {os.path.join(root, 'metadata.json')}: tensor {name!r} has path {path!r}, "
                    "which is not a file inside the mount")


def _check_size(entry: Entry, count: int, itemsize: float) -> None:
    if count * itemsize != entry.byte_len:
        raise StfsError(f"stfs: {entry.name}: metadata.json gives {entry.byte_len} bytes for {count} x {entry.dtype}")


def _warn_raw(names: List[str], framework: str) -> None:
    if names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        warnings.warn(f"stfs.load: {len(names)} tensor(s) of a packed sub-byte dtype no {framework} type holds "
                      f"are returned as their raw bytes (uint8): {shown}", stacklevel=3)


# --- NumPy -----------------------------------------------------------------------------------------

def _numpy_dtype(np, entry: Entry):
    if entry.dtype in NUMPY_DTYPES:
        return np.dtype(NUMPY_DTYPES[entry.dtype])
    if entry.dtype in ML_DTYPES or entry.dtype == F4:
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(f"stfs.load: tensor {entry.name!r} is {entry.dtype}, which NumPy has only through the "
                              "ml_dtypes package: pip install ml_dtypes (or pip install 'stfs[numpy]')") from None
        name = ML_DTYPES.get(entry.dtype, "float4_e2m1fn")
        kind = getattr(ml_dtypes, name, None)
        if kind is None:  # an ml_dtypes older than 0.5 (pulled in by another package) lacks the F8_E8M0 and F4 types
            raise ImportError(f"stfs.load: tensor {entry.name!r} is {entry.dtype}, which needs ml_dtypes.{name}, and "
                              f"ml_dtypes {getattr(ml_dtypes, '__version__', '?')} lacks it: pip install -U 'ml_dtypes>=0.5'")
        return np.dtype(kind)
    raise TypeError(f"stfs.load: tensor {entry.name!r} has dtype {entry.dtype}, unknown to stfs.load")


def _framework(name: str):
    """The module `name` ("numpy" or "torch"), or one ImportError saying what to install."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        extra = "numpy" if name == "numpy" else "torch"
        raise ImportError(f"stfs.load: framework={name!r} needs {'NumPy' if name == 'numpy' else 'PyTorch'}, which "
                          f"cannot be imported ({e}): pip install {name} (or pip install 'stfs[{extra}]')") from None


def _check_mappings(count: int, what: str) -> None:
    """Each tensor mapped (np.memmap, torch.from_file) is one memory mapping, and a process may hold
    only vm.max_map_count of them: past it mmap fails with a bare ENOMEM ("Cannot allocate memory")
    in the middle of the load. A checkpoint of that many tensors (a large mixture of experts holds
    ~90,000) is refused at once instead, saying what to change."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read().strip())
        with open("/proc/self/maps", "rb") as f:
            used = sum(1 for _ in f)
    except (OSError, ValueError):
        return
    headroom = 1024  # for the mappings the process itself goes on making (malloc arenas, libraries)
    if used + count + headroom > limit:
        raise OSError(f"stfs.load: {count} tensors mapped with {what} need {count} memory mappings, and this "
                      f"process has {used} of the {limit} vm.max_map_count allows: raise it (sysctl -w "
                      f"vm.max_map_count={2 * (used + count + headroom)}), or load a device other than the CPU "
                      "with framework='torch' (which maps nothing)")


def _numpy_device(device) -> None:
    if str(device) != "cpu":
        raise ValueError(f"stfs.load: NumPy arrays live on the CPU; device={device!r} needs framework='torch'")


def _load_numpy(items: List[Entry], device) -> Dict[str, Any]:
    import numpy as np

    _numpy_device(device)
    mapped = sum(1 for e in items if e.byte_len and e.dtype != F4)
    _check_mappings(mapped, "np.memmap")
    return _memmaps(np, items)


def _memmaps(np, items: List[Entry]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    raw: List[str] = []
    for e in items:
        count = math.prod(e.shape)
        if e.dtype in F6:
            _check_size(e, count, 0.75)
            raw.append(e.name)
            out[e.name] = mapped(np, e.path, np.uint8, (e.byte_len,), e.byte_len) if e.byte_len else _frozen(np.zeros(0, np.uint8))
            continue
        dtype = _numpy_dtype(np, e)
        if e.dtype == F4:
            # One byte per element in NumPy: unpacked into memory (low nibble first), not mapped.
            _check_size(e, count, 0.5)
            packed = np.fromfile(e.path, dtype=np.uint8, count=e.byte_len) if e.byte_len else np.zeros(0, np.uint8)
            if packed.size != e.byte_len:
                raise StfsError(f"stfs: {e.path}: {packed.size} bytes read, {e.byte_len} expected")
            nibbles = np.empty(2 * e.byte_len, dtype=np.uint8)
            nibbles[0::2] = packed & 0x0F
            nibbles[1::2] = packed >> 4
            out[e.name] = _frozen(nibbles.view(dtype).reshape(e.shape))
            continue
        _check_size(e, count, dtype.itemsize)
        if count == 0:
            out[e.name] = _frozen(np.zeros(e.shape, dtype))  # mmap cannot map zero bytes
        else:
            out[e.name] = mapped(np, e.path, dtype, tuple(e.shape), count * dtype.itemsize)
    _warn_raw(raw, "NumPy")
    return out


def _frozen(a):
    a.flags.writeable = False
    return a


# --- torch -----------------------------------------------------------------------------------------

def _torch_type(torch, e: Entry, raw: List[str]):
    """(torch dtype, shape) for the tensor: its own dtype and shape, F4 as float4_e2m1fn_x2 pairs along
    the last dimension, or uint8 bytes for packed dtypes this torch lacks."""
    if e.dtype == F4 or e.dtype in F6:
        x2 = getattr(torch, "float4_e2m1fn_x2", None) if e.dtype == F4 else None
        if x2 is not None and e.shape and e.shape[-1] % 2 == 0:
            return x2, e.shape[:-1] + [e.shape[-1] // 2]
        raw.append(e.name)
        return torch.uint8, [e.byte_len]
    dtype = getattr(torch, TORCH_DTYPES.get(e.dtype, "-"), None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"stfs.load: tensor {e.name!r} has dtype {e.dtype}, which torch {torch.__version__} lacks")
    return dtype, e.shape


def _read_into(path: str, tensor) -> None:
    """Reads the whole file into a contiguous CPU tensor of exactly its size, in large reads."""
    n = tensor.numel() * tensor.element_size()
    view = memoryview((ctypes.c_ubyte * n).from_address(tensor.data_ptr())).cast("B")
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < n:
            got = f.readinto(view[done:])
            if not got:
                raise StfsError(f"stfs: {path}: ended after {done} of {n} bytes")
            done += got


def _check_cuda(torch, target, device) -> None:
    """One clear error (StfsError, a RuntimeError), before anything is read, when the CUDA device asked
    for is not there (torch's own, from the first pinned allocation, names neither stfs.load nor the
    device)."""
    if not torch.cuda.is_available():
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a build without CUDA"
        raise StfsError(f"stfs.load: device={str(device)!r}, but no CUDA device is available "
                        f"(torch {torch.__version__} is {build}; torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    if target.index is not None and target.index >= count:
        raise StfsError(f"stfs.load: device={str(device)!r}, but this machine has {count} CUDA device(s)")


def _utf8_path(path: str) -> str:
    """`path` spelled for torch.from_file, which encodes a str as UTF-8 whatever the filesystem
    encoding (it refuses the surrogate escapes a path has under an ASCII locale)."""
    return _utf8(path, "which torch.from_file cannot open")


def _torch_device(device):
    """torch.device(device), checked: a string torch does not take, or a CUDA device that is not
    there, is one clear error."""
    torch = _framework("torch")

    try:
        target = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"stfs.load: device={device!r} is not a torch device: {str(e).splitlines()[0] if str(e) else e}") from None
    if target.type == "cuda":
        _check_cuda(torch, target, device)
    return target


def _load_torch(items: List[Entry], device) -> Dict[str, Any]:
    import torch

    target = _torch_device(device)
    cuda = target.type == "cuda"
    out: Dict[str, Any] = {}
    raw: List[str] = []
    in_flight: List[Any] = []
    in_flight_bytes = 0
    if target.type == "cpu":  # moved anywhere else, each mapping is gone once its tensor is copied
        _check_mappings(sum(1 for e in items if e.byte_len), "torch.from_file")
    for e in items:
        dtype, shape = _torch_type(torch, e, raw)
        count = math.prod(shape)
        _check_size(e, count, dtype.itemsize)
        # Every tensor is made with device="cpu" spelled out, so torch.set_default_device (or any
        # default-device context) cannot place it; then it goes exactly where it was asked to.
        if count == 0:
            t = torch.empty(shape, dtype=dtype, device="cpu")
            out[e.name] = t if target.type == "cpu" else t.to(target)
        elif cuda:
            # Read straight into pinned host memory, then copy without blocking: the next tensor's
            # read overlaps this one's transfer.
            host = torch.empty(e.byte_len, dtype=torch.uint8, device="cpu", pin_memory=True)
            _read_into(e.path, host)
            out[e.name] = host.view(dtype).reshape(shape).to(target, non_blocking=True)
            in_flight.append(host)
            in_flight_bytes += e.byte_len
            if in_flight_bytes >= PINNED_IN_FLIGHT:
                torch.cuda.synchronize(target)
                in_flight, in_flight_bytes = [], 0
        else:
            # A private mapping of the file: pages are read through the mount when first touched.
            t = torch.from_file(_utf8_path(e.path), shared=False, size=count, dtype=dtype, device="cpu").reshape(shape)
            out[e.name] = t if target.type == "cpu" else t.to(target)
    if cuda:
        torch.cuda.synchronize(target)  # every copy has landed before load returns
    _warn_raw(raw, "torch")
    return out


# --- load --------------------------------------------------------------------------------------------

FRAMEWORKS = {"numpy": "numpy", "np": "numpy", "torch": "torch", "pt": "torch", "pytorch": "torch"}


def load(path: PathLike, framework: str = "numpy", device: Any = "cpu", *, timeout: float = DEFAULT_TIMEOUT, **options) -> Dict[str, Any]:
    """Every tensor of a checkpoint, as a dict name -> array, in checkpoint order.

    `path` is either the root of an stfs mount, or a source stfs can mount (a .safetensors file, a
    *.index.json, a directory of shards, an http(s) URL); a source is mounted on a temporary directory,
    with `options` as mount flags (see stfs.mount). dtype and shape come from metadata.json (the served
    dtype under ``as_="f32"``).

    framework="numpy": read-only np.memmap's, so pages are read only when touched (each is a mapping
    that keeps no file descriptor open, so no limit on open files is raised or reached); BF16 and the F8 family through ml_dtypes; F4 unpacked into an in-memory ml_dtypes.float4_e2m1fn array (NumPy has
    one byte per element); F6 (no NumPy type) as its raw bytes, a uint8 memmap, with a warning. Only
    device="cpu".

    framework="torch": each tensor is created on the CPU explicitly (``device="cpu"``; a
    torch.set_default_device in force changes nothing), as a private mapping of its file
    (torch.from_file), and moved only to `device`. For a CUDA device it is read into pinned memory and
    copied with non_blocking=True; load synchronizes before returning. F4 is float4_e2m1fn_x2 (pairs
    along the last dimension) where torch has it; dtypes this torch lacks raise TypeError.

    Lifetime, when load mounts `path` itself: the mount is detached lazily (``stfs umount --lazy``)
    before load returns. It leaves the filesystem at once, while the kernel keeps it alive for as long as
    any returned array still maps one of its files; when the last one is freed, the daemon exits. So the
    arrays are valid for exactly as long as they are referenced, and there is nothing to close. (Arrays
    copied to a GPU map nothing, and the mount ends before load returns.) For a mount you made yourself
    (stfs.mount or the CLI), the arrays are valid while it is mounted; the end of the stfs.mount block,
    or stfs.unmount, while they map files detaches it lazily in the same way, and they stay valid.
    The CLI's `stfs umount` does not: it says the mount is busy and leaves it (`stfs umount -l`
    detaches it lazily).
    """
    path = _path(path)
    kind = FRAMEWORKS.get(str(framework).lower())
    if kind is None:
        raise ValueError(f"stfs.load: framework must be 'numpy' or 'torch', not {framework!r}")
    reader = _load_numpy if kind == "numpy" else _load_torch
    # The device is checked before anything is mounted: asking for one that is not there costs no
    # mount (of a remote source, seconds), and nothing is left to take down.
    if kind == "numpy":
        _framework("numpy")
        _numpy_device(device)
    else:
        _torch_device(device)
    if is_mount_dir(path):
        if options:
            raise TypeError(f"stfs.load: {path} is already a mount; mount options ({', '.join(options)}) apply only to a source")
        return reader(entries(path), device)
    binary, mp, made = _mount(path, None, timeout, options)
    try:
        result = reader(entries(mp), device)
    except BaseException:
        _detach(binary, mp, made, timeout, quiet=True)
        raise
    _detach(binary, mp, made, timeout, quiet=False)
    return result


def _detach(binary: str, mp: Path, made: Optional[str], timeout: float, quiet: bool) -> None:
    """Detaches load's own mount lazily and removes its directory. `quiet` (load is raising already):
    a failure here, the binary's timeout included, never replaces the exception load raises."""
    try:
        out = _run([binary, "umount", "--lazy", "--", str(mp)], timeout)
    except StfsError:
        if quiet:
            return
        raise
    if out.returncode != 0 and not quiet and is_mounted(mp, timeout=timeout, binary=binary):
        raise StfsError(out.stderr.strip().splitlines()[0] if out.stderr.strip() else f"stfs: {mp}: unmount failed",
                        returncode=out.returncode, stderr=out.stderr)
    if made is not None:
        with contextlib.suppress(OSError):
            os.rmdir(made)
