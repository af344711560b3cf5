"""stfs.load: every tensor of a mount, as NumPy arrays or torch tensors, typed by metadata.json."""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set

from . import _engine
from ._mapping import mapped
from ._whole import ReadAhead, read_ahead, torch_view, views as _whole_views
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

#: With a CUDA device, tensors are staged through a ring of this many pinned host buffers of (at most)
#: PINNED_SLOT_BYTES each, reused across tensors: the pinned host memory of a load is bounded by
#: PINNED_SLOTS * PINNED_SLOT_BYTES (128 MiB), whatever the size of the model or of its largest tensor.
PINNED_SLOTS = 4
PINNED_SLOT_BYTES = 32 << 20


#: With progress=None (the default), the bar shows on a terminal for a remote source, or when load itself
#: reads at least this many bytes (copies to a device, F4 unpacked); progress=True shows it on a terminal
#: whatever the size. NumPy memmaps and CPU torch tensors are mappings: load reads none of their bytes.
PROGRESS_MIN_BYTES = 256 << 20
REMOTE_PREFIXES = ("http://", "https://", "s3://", "gs://", "hf://")

#: Called with the bytes read since its last call.
Tick = Callable[[int], None]


def _no_tick(_: int) -> None:
    pass


class _Bar:
    """tqdm's bar, in bytes with their throughput, on stderr: what load reads as it reads it."""

    def __init__(self, total: int, desc: str):
        from tqdm import tqdm

        try:
            size = os.get_terminal_size(sys.stderr.fileno())
        except OSError:
            size = os.terminal_size((0, 0))
        # A terminal that reports no size (a fresh pty, `script`) gets 100 x 24, not a bar tqdm hides.
        sized = size.columns > 0 and size.lines > 0
        self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                        file=sys.stderr, mininterval=0.2, leave=True, dynamic_ncols=sized,
                        ncols=None if sized else 100, nrows=None if sized else 24)

    def tick(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def _bar(progress: Optional[bool], total: int, remote: bool, desc: str) -> Optional[_Bar]:
    """The bar for a load that reads `total` bytes, or None: never with progress=False, in a pipe (stderr
    not a terminal), or with nothing to read; with progress=None only for a remote source or at least
    PROGRESS_MIN_BYTES; without tqdm installed, none (it comes with the numpy and torch extras)."""
    if progress is False or total <= 0 or not sys.stderr.isatty():
        return None
    if progress is None and not (remote or total >= PROGRESS_MIN_BYTES):
        return None
    try:
        return _Bar(total, desc)
    except ImportError:
        return None


def _read_during_load(items: List["Entry"], kind: str, device: Any) -> int:
    """The bytes load itself reads (the rest are mapped, read when touched): F4 tensors for NumPy (they
    are unpacked), everything for torch on a device other than the CPU."""
    if kind == "numpy":
        return sum(e.byte_len for e in items if e.dtype == F4)
    return 0 if str(device).split(":")[0] == "cpu" else sum(e.byte_len for e in items)


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
    # A file or a URL (what load is mostly given) is told apart without running the binary: realpath
    # has already looked at `root` itself, and its mount-info costs a process start (milliseconds,
    # counted in every load from the page cache).
    if not (os.path.isdir(root) and _stfs_mount_at(root) and os.path.isdir(os.path.join(root, ".stfs"))
            and os.path.isfile(meta)):
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


def _load_numpy(items: List[Entry], device, root: str, tick: Tick = _no_tick) -> Dict[str, Any]:
    import numpy as np

    _numpy_device(device)
    # Shards the mount hands to the kernel: one mapping each, every tensor a view (still lazy).
    plain = [e for e in items if e.dtype != F4 and e.dtype not in F6]
    whole = _whole_views(root, plain, lambda path, size: mapped(np, path, np.uint8, (size,), size),
                         lambda flat, e: _frozen(flat.view(_numpy_dtype(np, e)).reshape(e.shape).view(np.memmap)))
    rest = [e for e in items if e.name not in whole]
    if rest:
        _check_mappings(sum(1 for e in rest if e.byte_len and e.dtype != F4), "np.memmap")
    out = _memmaps(np, rest, tick)
    return {e.name: whole[e.name] if e.name in whole else out[e.name] for e in items}


def _memmaps(np, items: List[Entry], tick: Tick = _no_tick) -> Dict[str, Any]:
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
            tick(e.byte_len)
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


def _torch_flat(torch, mapping: Any, at: int, length: int, dtype_name: str):
    """The `length` bytes at `at` of a shard's mapping as a 1-D tensor: of the tensor's own torch dtype
    where torch has it and the bytes are aligned to it (made so by one frombuffer, with no view to
    type it after: each first use of a view costs torch 0.1 ms in a process), else as uint8."""
    dtype = getattr(torch, TORCH_DTYPES.get(dtype_name, "-"), None)
    if isinstance(dtype, torch.dtype) and at % dtype.itemsize == 0 and length % dtype.itemsize == 0:
        try:
            return torch.frombuffer(mapping, dtype=dtype, count=length // dtype.itemsize, offset=at)
        except (TypeError, ValueError, RuntimeError):  # a dtype this torch's frombuffer refuses
            pass
    return torch.frombuffer(mapping, dtype=torch.uint8, count=length, offset=at)


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


def _read_full(f, view) -> int:
    """Fills `view` (a writable byte memoryview) from the file object `f`'s position, in as many reads
    as it takes; returns how many bytes it got (fewer only at the end of the file)."""
    done, n = 0, len(view)
    while done < n:
        got = f.readinto(view[done:])
        if not got:
            break
        done += got
    return done


class StagingRing:
    """A fixed ring of `slots` host buffers of `slot_bytes` each, through which files are copied to a
    device: a file is read in pieces into the buffers, each piece copied out without blocking, and a
    buffer is refilled only after the event recorded behind its copies has completed.

    Pure of CUDA, so that it is tested on the CPU: `alloc(nbytes)` gives one buffer (a 1-D uint8
    tensor: pinned host memory for CUDA, plain memory in a test), `new_event()` an object with
    ``record()`` (on the stream the copies go to) and ``synchronize()`` (waits until every copy queued
    before that record is done). Buffers are made when first used and never more than `slots` of
    them, so the host memory a load holds is at most ``bound == slots * slot_bytes``, however many
    and however large the tensors are. Small pieces share a buffer (packed one after another); a
    buffer's event is recorded when the ring moves on to the next buffer, and `finish` records the
    last, waits for every event and drops the buffers."""

    def __init__(self, slots: int, slot_bytes: int, alloc, new_event):
        if slots < 2 or slot_bytes < 1:
            raise ValueError(f"StagingRing: needs at least 2 slots of at least 1 byte, not {slots} x {slot_bytes}")
        self.slots, self.slot_bytes = slots, slot_bytes
        self._alloc, self._new_event = alloc, new_event
        self._buffers: List[Any] = []
        self._events: List[Any] = []
        self._recorded = [False] * slots  # whether the slot's event stands behind copies not yet waited for
        self._slot = -1  # the buffer being filled; -1 before the first
        self._fill = 0  # bytes of it handed out since it was last refilled
        self.allocated_bytes = 0  # host memory the ring allocated over its life (at most `bound`)
        self.waits = 0  # times a buffer was waited for before its reuse

    @property
    def bound(self) -> int:
        """The most host memory the ring ever holds: a pure function of its size."""
        return self.slots * self.slot_bytes

    def take(self, want: int):
        """A buffer piece of min(`want`, slot_bytes) bytes, free to fill: the rest of the current
        buffer if that much is left in it, else the next buffer of the ring, once the copies out of
        it queued on its last use are done."""
        n = min(want, self.slot_bytes)
        if n <= 0:
            raise ValueError(f"StagingRing.take: {want} bytes")
        if self._slot < 0 or self._fill + n > self.slot_bytes:
            self._advance()
        start = self._fill
        self._fill += n
        return self._buffers[self._slot][start:start + n]

    def _advance(self) -> None:
        self._close()
        self._slot = (self._slot + 1) % self.slots
        self._fill = 0
        if self._slot == len(self._buffers):
            self._buffers.append(self._alloc(self.slot_bytes))
            self._events.append(self._new_event())
            self.allocated_bytes += self.slot_bytes
        elif self._recorded[self._slot]:
            self._events[self._slot].synchronize()  # its copies are done: the buffer may be refilled
            self._recorded[self._slot] = False
            self.waits += 1

    def _close(self) -> None:
        """Records the current buffer's event behind the copies queued out of it."""
        if self._slot >= 0 and self._fill and not self._recorded[self._slot]:
            self._events[self._slot].record()
            self._recorded[self._slot] = True

    def finish(self) -> None:
        """Waits for every copy out of the ring, then drops its buffers."""
        try:
            self._close()
            for i, event in enumerate(self._events):
                if self._recorded[i]:
                    event.synchronize()
                    self._recorded[i] = False
        finally:
            self._buffers.clear()
            self._events.clear()
            self._slot, self._fill = -1, 0


#: Fills a ring buffer piece (a 1-D uint8 CPU tensor) with a tensor's bytes from an offset.
Fill = Callable[[int, Any], None]


@contextlib.contextmanager
def _file_pieces(entry: Entry):
    """A Fill reading the tensor's file at `entry.path` (a mount's), in order from its start."""
    with open(entry.path, "rb", buffering=0) as f:
        def fill(at: int, piece) -> None:
            got = _read_full(f, memoryview((ctypes.c_ubyte * piece.numel()).from_address(piece.data_ptr())).cast("B"))
            if got != piece.numel():
                raise StfsError(f"stfs: {entry.path}: ended after {at + got} of {entry.byte_len} bytes")

        yield fill


def _engine_pieces(checkpoint) -> Callable[[Entry], Any]:
    """Fills for the tensors of `checkpoint` (an stfs._engine.Checkpoint, no mount): each piece read by
    the engine straight into the ring buffer (large pieces on several of its threads)."""
    def pieces(entry: Entry):
        tensor = checkpoint.tensor(entry.name)
        return contextlib.nullcontext(lambda at, piece: checkpoint.read([(tensor, at, piece)]))

    return pieces


def _stage(fill: Fill, dst, ring: StagingRing, copy, tick: Tick = _no_tick) -> None:
    """Copies a tensor's bytes into `dst` (a contiguous 1-D uint8 tensor of exactly its size, on any
    device) through `ring`: `fill` a piece of a ring buffer, `copy(dst_piece, buffer_piece)` (a
    non-blocking copy_), and on to the next piece while that copy is in flight."""
    n = dst.numel()
    done = 0
    while done < n:
        piece = ring.take(n - done)
        fill(done, piece)
        copy(dst[done:done + piece.numel()], piece)
        done += piece.numel()
        tick(piece.numel())


def _load_staged(torch, items: List[Entry], target, ring: StagingRing, copy, raw: List[str],
                 tick: Tick = _no_tick, pieces: Callable[[Entry], Any] = _file_pieces) -> Dict[str, Any]:
    """Every tensor of `items` on `target`, each allocated there as bytes, filled through `ring` by
    `copy`, and viewed as its dtype and shape. `pieces(entry)` is a context giving the entry's Fill:
    its file on a mount (the default) or the engine's read (_engine_pieces). The caller finishes the
    ring (waits for the copies)."""
    out: Dict[str, Any] = {}
    for e in items:
        dtype, shape = _torch_type(torch, e, raw)
        count = math.prod(shape)
        _check_size(e, count, dtype.itemsize)
        if count == 0:
            out[e.name] = torch.empty(shape, dtype=dtype, device=target)
            continue
        dst = torch.empty(e.byte_len, dtype=torch.uint8, device=target)
        with pieces(e) as fill:
            _stage(fill, dst, ring, copy, tick)
        out[e.name] = dst.view(dtype).reshape(shape)
    return out


def _slot_bytes(items: List[Entry]) -> int:
    """PINNED_SLOT_BYTES, or less for a checkpoint smaller than one slot (the smallest power of two
    that holds it: torch's pinned allocator rounds up to one anyway)."""
    total = sum(e.byte_len for e in items)
    return max(1, min(PINNED_SLOT_BYTES, 1 << max(0, total - 1).bit_length()))


def _empty_host_cache(torch) -> None:
    """Hands torch's cached pinned blocks back to the driver (where this torch can), so the ring's
    pinned memory is freed at the end of the load, not kept for the life of the process."""
    for owner, name in ((getattr(torch.cuda, "memory", None), "empty_host_cache"), (torch._C, "_host_emptyCache")):
        fn = getattr(owner, name, None)
        if callable(fn):
            fn()
            return


def _load_cuda(torch, items: List[Entry], target, raw: List[str], tick: Tick = _no_tick,
               pieces: Callable[[Entry], Any] = _file_pieces) -> Dict[str, Any]:
    """The CUDA path: everything under torch.cuda.device(target), so no other GPU gets a context
    (device="cuda:1" makes none on GPU 0); a StagingRing of pinned buffers with one CUDA event each,
    recorded on the target's current stream, instead of a device-wide synchronize. `pieces`: where
    the bytes come from (a mount's files, or the engine with no mount: _engine_pieces)."""
    with torch.cuda.device(target):
        stream = torch.cuda.current_stream(target)

        class _Event:
            def __init__(self):
                self.event = torch.cuda.Event()

            def record(self):
                self.event.record(stream)

            def synchronize(self):
                self.event.synchronize()

        def alloc(nbytes):
            return torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=True)

        def copy(dst, src):
            dst.copy_(src, non_blocking=True)

        ring = StagingRing(PINNED_SLOTS, _slot_bytes(items), alloc, _Event)
        try:
            out = _load_staged(torch, items, target, ring, copy, raw, tick, pieces)
        finally:
            ring.finish()  # every copy has landed before load returns (or raises)
            del ring
            _empty_host_cache(torch)
    return out


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


def _load_torch(items: List[Entry], device, root: str, tick: Tick = _no_tick) -> Dict[str, Any]:
    import torch

    target = _torch_device(device)
    raw: List[str] = []
    if target.type == "cuda":
        if target.index is None:  # "cuda": the current device, named, so the guard and the tensors agree
            target = torch.device("cuda", torch.cuda.current_device())
        out = _load_cuda(torch, items, target, raw, tick)
        _warn_raw(raw, "torch")
        return out
    # Shards the mount hands to the kernel (passthrough): each mapped once (a private mapping, on the
    # CPU), every tensor a view of it, as safetensors' load_file makes them; read in by the kernel
    # meanwhile (read_ahead), as the tensors of the other path are read before load returns.
    # A load that fails from here on (Ctrl-C included) stops the read-ahead before it raises: its
    # threads would go on reading, and hold the mount (load's own, detached lazily) and its daemon.
    # The ReadAhead is made before any thread starts, so a Ctrl-C anywhere in here stops them all.
    ahead = ReadAhead()
    try:
        whole = _whole_views(root, items, lambda path, size: torch.from_file(
            _utf8_path(path), shared=False, size=size, dtype=torch.uint8, device="cpu"),
            lambda flat, e: torch_view(flat, *_torch_type(torch, e, [])),
            lambda paths: read_ahead(paths, ahead))
        return _torch_tensors(torch, items, whole, target, raw, tick)
    except BaseException:
        ahead.stop()
        raise


def _torch_tensors(torch, items: List[Entry], whole: Dict[str, Any], target, raw: List[str],
                   tick: Tick) -> Dict[str, Any]:
    """Every tensor of `items` on `target` (the CPU or a device other than CUDA): the views in `whole`,
    the rest each a private mapping of its file."""
    out: Dict[str, Any] = {}
    mapped_files = sum(1 for e in items if e.byte_len and e.name not in whole)
    if target.type == "cpu" and mapped_files:  # moved anywhere else, each mapping is gone once its tensor is copied
        _check_mappings(mapped_files, "torch.from_file")
    for e in items:
        dtype, shape = _torch_type(torch, e, raw)
        count = math.prod(shape)
        _check_size(e, count, dtype.itemsize)
        # Every tensor is made with device="cpu" spelled out, so torch.set_default_device (or any
        # default-device context) cannot place it; then it goes exactly where it was asked to.
        if e.name in whole:
            t = whole[e.name]
        elif count == 0:
            t = torch.empty(shape, dtype=dtype, device="cpu")
        else:
            # A private mapping of the file: pages are read through the mount when first touched.
            # Measured against reading each file whole into a new tensor (issue 34): the mapping was
            # 2.2-3.5x faster from the page cache, as root with --no-passthrough and as non-root.
            t = torch.from_file(_utf8_path(e.path), shared=False, size=count, dtype=dtype, device="cpu").reshape(shape)
        if target.type != "cpu":
            t = t.to(target)
        if e.name not in whole or target.type != "cpu":
            tick(e.byte_len)
        out[e.name] = t
    _warn_raw(raw, "torch")
    return out


# --- load --------------------------------------------------------------------------------------------

FRAMEWORKS = {"numpy": "numpy", "np": "numpy", "torch": "torch", "pt": "torch", "pytorch": "torch"}


def load(path: PathLike, framework: str = "numpy", device: Any = "cpu", *, timeout: float = DEFAULT_TIMEOUT,
         progress: Optional[bool] = None, mount: Optional[bool] = None, **options) -> Dict[str, Any]:
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
    (torch.from_file), and moved only to `device`; where the mount hands a shard's re-served file to
    the kernel (root, a local file), its tensors are instead views of one private mapping of that file
    (zero copy, as load_file), which up to 64 threads read into the page cache meanwhile (none where the
    file is cached already). For a CUDA device each tensor is allocated there and
    filled through a ring of PINNED_SLOTS pinned host buffers of PINNED_SLOT_BYTES (128 MiB of pinned
    memory at most, freed at the end), read in pieces and copied with non_blocking=True, one CUDA
    event per buffer; all of it under torch.cuda.device(device), so no other GPU gets a context, and
    every copy has landed when load returns. F4 is float4_e2m1fn_x2 (pairs
    along the last dimension) where torch has it; dtypes this torch lacks raise TypeError.

    Without a mount (the default for a source, where the extension module stfs._native is there, for
    NumPy, for torch on the CPU and on CUDA): the engine runs in this process (no /dev/fuse, no root; `options`
    as for a mount, `timeout` unused: the source's own timeouts apply), and the arrays are views of a
    private mapping of each local shard in the page cache (zero copy, as load_file), of memory of
    their own that a cold local shard was read into with O_DIRECT before load returns (32 threads;
    the page cache is left as it was; mapped instead where O_DIRECT is refused), or, for a remote
    source, of memory of their own the engine read into, all tensors at once on several threads. NumPy arrays are then plain read-only
    ndarrays, not np.memmap's. A CUDA device needs no mount either: the engine reads each tensor
    into the pinned ring's buffers (the ring as above), each piece copied to the device without
    blocking. ``mount=True`` mounts `path` as below instead (and any other torch device does).

    Lifetime, when load mounts `path` itself: the mount is detached lazily (``stfs umount --lazy``)
    before load returns. It leaves the filesystem at once, while the kernel keeps it alive for as long as
    any returned array still maps one of its files; when the last one is freed, the daemon exits. So the
    arrays are valid for exactly as long as they are referenced, and there is nothing to close. (Arrays
    copied to a GPU map nothing, and the mount ends before load returns.) For a mount you made yourself
    (stfs.mount or the CLI), the arrays are valid while it is mounted; the end of the stfs.mount block,
    or stfs.unmount, while they map files detaches it lazily in the same way, and they stay valid.
    The CLI's `stfs umount` does not: it says the mount is busy and leaves it (`stfs umount -l`
    detaches it lazily).

    Progress: where load itself reads the bytes (a CUDA or other non-CPU torch device; F4 unpacked for
    NumPy), a tqdm bar on stderr shows bytes read and throughput, as huggingface_hub's downloads do:
    with progress=None (the default) when stderr is a terminal and the source is remote or load reads at
    least PROGRESS_MIN_BYTES; with progress=True on a terminal whatever the size; never with
    progress=False or when stderr is not a terminal (a pipe, a log file). Memmaps and CPU tensors are
    mappings read when touched, so they show none. Needs tqdm (the numpy and torch extras bring it).
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
    remote = str(path).startswith(REMOTE_PREFIXES)

    def read(mountpoint) -> Dict[str, Any]:
        items = entries(mountpoint)
        bar = _bar(progress, _read_during_load(items, kind, device), remote, f"stfs.load {os.path.basename(str(path).rstrip('/'))}")
        if bar is None:
            return reader(items, device, str(mountpoint))
        try:
            return reader(items, device, str(mountpoint), bar.tick)
        finally:
            bar.close()

    if is_mount_dir(path):
        if options:
            raise TypeError(f"stfs.load: {path} is already a mount; mount options ({', '.join(options)}) apply only to a source")
        return read(path)
    if not mount and _engine.available() and (kind == "numpy" or _torch_device(device).type in ("cpu", "cuda")):
        return _load_unmounted(path, kind, device, progress, remote, options)
    binary, mp, made = _mount(path, None, timeout, options)
    try:
        result = read(mp)
    except BaseException:
        _detach(binary, mp, made, timeout, quiet=True)
        raise
    _detach(binary, mp, made, timeout, quiet=False)
    return result


def _load_unmounted(path: str, kind: str, device: Any, progress: Optional[bool], remote: bool,
                    options: Dict[str, Any]) -> Dict[str, Any]:
    """load() of a source with no mount: the engine in this process (stfs._native) opens it as a mount
    would (same options and errors). Tensors of a local shard are views of one private mapping of its
    file (zero copy, as safetensors' load_file) where it is in the page cache, else of memory of its
    own read with O_DIRECT (_direct.read_direct; where that is refused, the mapping, read into the
    page cache meanwhile by read_ahead's threads); every other tensor (a remote shard's, a converted
    view's) is read by the engine straight into its own memory, all of them at once on several threads,
    the GIL released: raw bytes straight from the store in about one request per thread's share
    (Checkpoint.read), views through the engine's blocks. The
    engine is closed before load returns (its threads joined, its descriptors closed); the arrays hold
    nothing of it. A mapping of a cached file is faulted into the page tables by a thread at
    SCHED_IDLE meanwhile (_whole.fault_in_ahead), which may outlive the call by a few ms. For a CUDA
    device the engine reads every tensor into the pinned ring (_load_cuda with _engine_pieces): no
    mapping, no read-ahead."""
    ahead = ReadAhead()
    try:
        target = _torch_device(device) if kind == "torch" else None
        on_cuda = target is not None and target.type == "cuda"
        # The engine's own prefetch reads ahead of reads it serves: a remote source's, or every tensor
        # copied to a GPU. A local shard on the CPU is mapped or read with O_DIRECT instead, and a
        # prefetch of it measured as pure cost: its threads fault the file in beside
        # read_ahead's, and joining them took 10-90 ms of a 2 GiB load from the page cache (2026-12-02).
        prefetch = remote or on_cuda
        # A local file on a network or FUSE filesystem is not mapped but read through the engine,
        # whose demand reads of the pieces, all at once, fetch each byte once (with its prefetch on
        # as well, 1.11-1.16x the file was fetched from slowfs, for no gain in time).
        with _engine.Checkpoint(path, prefetch=prefetch, **options) as checkpoint:
            items = [Entry(t.name, t.dtype, t.shape, t.byte_len, t.path) for t in checkpoint.tensors]
            # What the engine reads (the rest, raw tensors of a mapped shard, is mapped, not read).
            reads = sum(t.byte_len for t in checkpoint.tensors
                        if on_cuda or not t.raw or not checkpoint.shard_is_mappable(t.shard))
            bar = _bar(progress, reads, remote, f"stfs.load {os.path.basename(str(path).rstrip('/'))}")
            try:
                if on_cuda:
                    import torch

                    if target.index is None:  # "cuda": the current device, named, as with a mount
                        target = torch.device("cuda", torch.cuda.current_device())
                    raw: List[str] = []
                    out = _load_cuda(torch, items, target, raw, bar.tick if bar else _no_tick,
                                     _engine_pieces(checkpoint))
                    _warn_raw(raw, "torch")
                    return out
                if kind == "numpy":
                    import numpy as np

                    flats = _engine.flat_bytes(checkpoint, lambda n: np.empty(n, np.uint8),
                                               lambda m, at, n, _: np.frombuffer(m, np.uint8, n, at),
                                               bar.tick if bar else None, ahead)
                    read_ahead(_engine.cold_mapped_paths(checkpoint), ahead)
                    return _typed_numpy(np, items, flats)
                import torch

                flats = _engine.flat_bytes(checkpoint, lambda n: torch.empty(n, dtype=torch.uint8, device="cpu"),
                                           lambda m, at, n, t: _torch_flat(torch, m, at, n, t.dtype),
                                           bar.tick if bar else None, ahead)
                read_ahead(_engine.cold_mapped_paths(checkpoint), ahead)
                return _typed_torch(torch, items, flats)
            finally:
                if bar is not None:
                    bar.close()
    except BaseException:
        ahead.stop()
        raise


def _typed_numpy(np, items: List[Entry], flats: Dict[str, Any]) -> Dict[str, Any]:
    """Every tensor's bytes as its NumPy dtype and shape, read-only, as the mount's memmaps are typed: F4
    unpacked (one byte per element), F6 as its raw bytes with a warning."""
    out: Dict[str, Any] = {}
    raw: List[str] = []
    for e in items:
        flat, count = flats[e.name], math.prod(e.shape)
        if e.dtype in F6:
            _check_size(e, count, 0.75)
            raw.append(e.name)
            out[e.name] = _frozen(flat)
            continue
        dtype = _numpy_dtype(np, e)
        if e.dtype == F4:
            _check_size(e, count, 0.5)
            nibbles = np.empty(2 * e.byte_len, dtype=np.uint8)
            nibbles[0::2] = flat & 0x0F
            nibbles[1::2] = flat >> 4
            out[e.name] = _frozen(nibbles.view(dtype).reshape(e.shape))
            continue
        _check_size(e, count, dtype.itemsize)
        out[e.name] = _frozen(flat.view(dtype).reshape(e.shape) if count else np.zeros(e.shape, dtype))
    _warn_raw(raw, "NumPy")
    return out


def _typed_torch(torch, items: List[Entry], flats: Dict[str, Any]) -> Dict[str, Any]:
    """Every tensor's bytes as its torch dtype and shape on the CPU (F4 as float4_e2m1fn_x2 pairs, packed
    dtypes this torch lacks as raw bytes with a warning)."""
    out: Dict[str, Any] = {}
    raw: List[str] = []
    for e in items:
        dtype, shape = _torch_type(torch, e, raw)
        count = math.prod(shape)
        _check_size(e, count, dtype.itemsize)
        out[e.name] = torch_view(flats[e.name], dtype, shape) if count else torch.empty(shape, dtype=dtype, device="cpu")
    _warn_raw(raw, "torch")
    return out


#: umount2(2) flags: detach lazily, and never through a symbolic link.
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8


def _detach_directly(mp: Path) -> bool:
    """As root, detaches load's own mount with one umount2(2) call (what `stfs umount --lazy` does
    as root), sparing a process start on every load; False where that is not possible (not root,
    no libc, a refusal), for the caller to go through the binary."""
    if os.geteuid() != 0:
        return False
    try:
        umount2 = ctypes.CDLL(None, use_errno=True).umount2
    except (OSError, AttributeError):
        return False
    umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    umount2.restype = ctypes.c_int
    return umount2(os.fsencode(str(mp)), MNT_DETACH | UMOUNT_NOFOLLOW) == 0


def _detach(binary: str, mp: Path, made: Optional[str], timeout: float, quiet: bool) -> None:
    """Detaches load's own mount lazily and removes its directory. `quiet` (load is raising already):
    a failure here, the binary's timeout included, never replaces the exception load raises; it
    always goes through `stfs umount --lazy`, the mount it made being in an unknown state."""
    if not quiet and _detach_directly(mp):
        if made is not None:
            with contextlib.suppress(OSError):
                os.rmdir(made)
        return
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
