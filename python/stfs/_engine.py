"""The engine in this process (the extension module stfs._native): a source opened as `stfs mount` opens it
(same options, credential chains, limits and one-line errors), with no mount, no /dev/fuse and no root;
its tensors read into memory the caller owns. stfs.load uses it for every source that is not a mount, and
stfs.open is built on it."""
from __future__ import annotations

import math
import mmap
import os
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from ._direct import read_direct
from ._mount import PathLike, StfsError, _argument, _path, _utf8, mount_flags
from ._whole import ReadAhead, fault_in_ahead, sampled_cached

_native: Any = None


def _module() -> Any:
    """The extension module, imported when first needed (None where it is not built: a source checkout,
    where stfs.load then mounts)."""
    global _native
    if _native is None:
        try:
            from . import _native as module
        except ImportError:
            return None
        _native = module
    return _native

#: Threads that read at once, each taking a direct piece (an even share of the long runs) or a 16 MiB piece.
READ_THREADS = 16


def available() -> bool:
    """Whether the extension module is there (an installed wheel has it; a checkout has it once built)."""
    return _module() is not None


class Tensor(NamedTuple):
    """One tensor as the engine lists it: `dtype`/`byte_len` are what its file serves (F32 under
    ``as_="f32"``), `stored_dtype`/`stored_len` what the checkpoint holds, `start` its first byte in
    shard `shard`'s file, `path` its file's path in the tree a mount shows (component folder first)."""
    index: int
    name: str
    dtype: str
    shape: List[int]
    byte_len: int
    shard: int
    start: int
    stored_dtype: str
    stored_len: int
    path: str

    @property
    def raw(self) -> bool:
        """Whether its file serves the stored bytes (so a mapping of the shard holds them)."""
        return self.dtype == self.stored_dtype and self.byte_len == self.stored_len


def writable(buffer: Any) -> Any:
    """An object with the buffer protocol over `buffer`: itself (a NumPy array, a bytearray, a pinned
    buffer) or, for a contiguous CPU torch tensor, a view of its bytes. The native read checks it
    (writable, contiguous, large enough, not overlapping another) and holds it for the read.
    ValueError for a torch tensor it cannot read into."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "is_contiguous"):  # a torch tensor
        if buffer.device.type != "cpu" or not buffer.is_contiguous():
            raise ValueError("stfs: a torch tensor read into must be a contiguous CPU tensor")
        import torch

        buffer = buffer.reshape(-1).view(torch.uint8).numpy()
    return buffer


class _Shared:
    """The engines opened with share=True, by (source, flags, prefetch): one per key while any
    Checkpoint holds it, so threads of one process opening the same source (tensor-parallel ranks
    each taking its slice of every tensor) share its blocks, each fetched once, where engines of
    their own would each fetch every block their slices touch. Opening is done once per key: the
    others wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries: Dict[Tuple[Any, ...], List[Any]] = {}  # key -> [opening lock, opened or None, users]

    def take(self, key: Tuple[Any, ...], open_native) -> Any:
        with self.lock:
            entry = self.entries.setdefault(key, [threading.Lock(), None, 0])
            entry[2] += 1
        try:
            with entry[0]:
                if entry[1] is None:
                    entry[1] = open_native()
                return entry[1]
        except BaseException:
            self.give(key, None)
            raise

    def give(self, key: Tuple[Any, ...], opened: Any) -> None:
        """One user of `key` is done; the last one closes its engine (`opened`, None if its open failed)."""
        with self.lock:
            entry = self.entries[key]
            entry[2] -= 1
            last = entry[2] == 0
            if last:
                del self.entries[key]
        if last and entry[1] is not None:
            entry[1].close()


_SHARED = _Shared()


class Checkpoint:
    """A source opened in this process. `tensors` lists them in shard and offset order; `read` fills
    buffers the caller owns; `close()` (or the end of a ``with`` block) ends the engine, joining its
    threads and closing its descriptors. With `share`, Checkpoints of the same source, options and
    prefetch open at once in this process share one engine (its cache, its counters), closed with
    the last of them."""

    def __init__(self, source: PathLike, *, prefetch: bool = True, share: bool = False, **options: Any):
        native = _module()
        if native is None:
            raise StfsError("stfs: the extension module stfs._native is not built (pip install . builds it)")
        flags = mount_flags(options)
        self.source = _path(source)
        # UTF-8 only, as the binary takes its arguments: one that is not is refused naming it.
        text = _utf8(_argument(self.source), "")
        args = (text, [_utf8(f, "") if isinstance(f, str) else f for f in flags], prefetch)
        self._shared_key = (args[0], tuple(args[1]), prefetch) if share else None
        self._closed = False
        if self._shared_key is None:
            self._opened = native.Opened(*args)
        else:
            self._opened = _SHARED.take(self._shared_key, lambda: native.Opened(*args))
        listed = self._opened.tensors()
        self.tensors: List[Tensor] = [
            Tensor(i, name, served, list(shape), served_len, shard, start, dtype, length, path)
            for i, (name, dtype, shape, shard, start, length, path, served, served_len) in enumerate(listed)
        ]
        self.by_name: Dict[str, Tensor] = {t.name: t for t in self.tensors}
        self.shards: List[Tuple[str, Optional[Dict[str, str]]]] = self._opened.shards()
        #: Shards flat_bytes mapped though their file was cold (O_DIRECT refused or failed): the only
        #: ones a load reads ahead (cold_mapped_paths).
        self.mapped_cold: Set[int] = set()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._shared_key is None:
            self._opened.close()
        elif not self._closed:
            _SHARED.give(self._shared_key, self._opened)
        self._closed = True

    def tensor(self, name: str) -> Tensor:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"stfs: no tensor named {name!r} in {self.source}") from None

    def stats(self) -> Dict[str, int]:
        """A few of the engine's counters (stats.json's names): what was read, from where."""
        return dict(self._opened.stats())

    def shard_descriptor(self, shard: int) -> Optional[int]:
        """A new descriptor on shard `shard`'s local file, checked to be the file opened; None if remote
        or on a network or FUSE filesystem (see shard_is_mappable)."""
        return self._opened.shard_descriptor(shard)

    def shard_is_mappable(self, shard: int) -> bool:
        """Whether shard `shard` is a local file on a local filesystem, which a load maps (zero copy). A
        file on a network or FUSE filesystem is read through the engine instead: reads ahead of a
        mapping's faults do not land in the page cache those faults read there, so every byte would be
        fetched twice."""
        return self._opened.shard_is_mappable(shard)

    def read(self, reads: Sequence[Tuple[Tensor, int, Any]], threads: int = READ_THREADS, *,
             fresh: bool = False) -> None:
        """Fills each `(tensor, offset, buffer)`'s buffer with the bytes of the tensor's file from
        `offset`, all at once on up to `threads` threads, the GIL released: raw tensor bytes that join
        into long runs in their source straight from the store, in about one request per thread's
        share (one copy), the rest through the engine's blocks in pieces of at most 16 MiB. StfsError
        names a tensor whose read failed; Ctrl-C stops every thread before KeyboardInterrupt is
        raised. `fresh`: the buffers are new allocations not yet touched, which the kernel is then
        asked to back with huge pages (fewer first-touch faults)."""
        planned = []
        for tensor, offset, buffer in reads:
            buffer = writable(buffer)
            length = memoryview(buffer).nbytes
            if offset < 0 or offset + length > tensor.byte_len:
                raise ValueError(f"stfs: {tensor.name}: bytes {offset}..{offset + length} are outside its "
                                 f"{tensor.byte_len}")
            planned.append((tensor.index, offset, buffer, length))
        if planned:
            self._opened.read_into(planned, threads, fresh)


# --- stfs.load without a mount ---------------------------------------------------------------------

def _shard_maps(checkpoint: Checkpoint, ahead: Optional[ReadAhead] = None) -> Dict[int, Any]:
    """shard -> the bytes of its local file, writable (as load_file's tensors): a private mapping (zero
    copy, as safetensors' load_file) where the file is in the page cache (sampled:
    _whole.sampled_cached), else memory of its own read with O_DIRECT (_direct.read_direct), or a
    mapping where that is refused (those shards are listed in checkpoint.mapped_cold). Remote shards
    are left out. The descriptors are closed here. With `ahead`, the mappings of cached files are
    faulted in behind the caller's back by one of its threads (fault_in_ahead)."""
    files: Dict[int, Any] = {}
    cold: Dict[int, Any] = {}
    try:
        for shard in sorted({t.shard for t in checkpoint.tensors if t.raw and t.byte_len}):
            fd = checkpoint.shard_descriptor(shard)
            if fd is None:
                continue
            files[shard] = fd
            size = os.fstat(fd).st_size
            if not sampled_cached(fd, size):
                cold[shard] = (fd, size)
        maps: Dict[int, Any] = read_direct(cold) if cold else {}
        checkpoint.mapped_cold.update(shard for shard in cold if shard not in maps)
        for shard, fd in files.items():
            if shard not in maps:
                maps[shard] = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    finally:
        for fd in files.values():
            os.close(fd)
    if ahead is not None:
        fault_in_ahead([maps[shard] for shard in sorted(files) if shard not in cold], _module(), ahead)
    return maps


def flat_bytes(checkpoint: Checkpoint, new_buffer, from_map, tick=None,
               ahead: Optional[ReadAhead] = None) -> Dict[str, Any]:
    """name -> the bytes of every tensor's file, 1-D: a view of its shard's bytes (`from_map(map,
    start, length, tensor)`, which may type it as the tensor's dtype already; a mapping, or memory
    read with O_DIRECT where cold: _shard_maps) where the shard is a local file and the tensor raw,
    else a buffer made by
    `new_buffer(length)` and read into, all at once. The read-ahead of cold mapped shards is the
    caller's; the mappings of cached ones are faulted in by a thread of `ahead`'s where one is given."""
    maps = _shard_maps(checkpoint, ahead)
    out: Dict[str, Any] = {}
    reads = []
    for t in checkpoint.tensors:
        if t.shard in maps and t.raw and t.byte_len:
            out[t.name] = from_map(maps[t.shard], t.start, t.byte_len, t)
        else:
            out[t.name] = new_buffer(t.byte_len)
            if t.byte_len:
                reads.append((t, 0, out[t.name]))
    checkpoint.read(reads, fresh=True)
    if tick is not None:
        tick(sum(t.byte_len for t, _, _ in reads))
    return out


def cold_mapped_paths(checkpoint: Checkpoint) -> List[str]:
    """The local shard files flat_bytes mapped though they were cold, for read_ahead (in shard order):
    not those read with O_DIRECT, nor those found in the page cache (sampling those a second time cost
    0.3 ms of a 1.5 ms load of 2 GiB)."""
    return [name for shard, (name, _) in enumerate(checkpoint.shards) if shard in checkpoint.mapped_cold]


# --- stfs.open -------------------------------------------------------------------------------------

class _Slice:
    """``get_slice(name)``: the tensor's dtype and shape, and ``[...]`` reading only the bytes the
    selection covers (each contiguous run straight into the result)."""

    def __init__(self, handle: "SafeOpen", tensor: Tensor):
        self._handle, self._tensor = handle, tensor

    def get_shape(self) -> List[int]:
        return list(self._tensor.shape)

    def get_dtype(self) -> str:
        return self._tensor.dtype

    def __getitem__(self, index: Any):
        return self._handle._read_slice(self._tensor, index)


def _normalized(index: Any, shape: List[int]) -> Tuple[List[Tuple[int, int, int]], List[bool]]:
    """(start, stop, step) per dimension for a basic index (ints, slices, Ellipsis), and which
    dimensions an int dropped."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (len(shape) - len(index) + 1) + index[at + 1:]
    if len(index) > len(shape):
        raise IndexError(f"stfs: {len(index)} indices for a tensor of {len(shape)} dimensions")
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    ranges, dropped = [], []
    for i, n in zip(index, shape):
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step < 1:
                raise IndexError("stfs: get_slice takes steps of 1 or more")
            ranges.append((start, max(start, stop), step))
            dropped.append(False)
        elif isinstance(i, int) or hasattr(i, "__index__"):
            k = int(i)
            k = k + n if k < 0 else k
            if not 0 <= k < n:
                raise IndexError(f"stfs: index {int(i)} is out of range for a dimension of {n}")
            ranges.append((k, k + 1, 1))
            dropped.append(True)
        else:
            raise TypeError(f"stfs: get_slice takes ints and slices, not {type(i).__name__}")
    return ranges, dropped


class SafeOpen:
    """``stfs.open(source)``: shaped as safetensors' ``safe_open``: keys(), metadata(), get_tensor(name),
    get_slice(name)[...]; every read goes through the engine, so a slice reads only the bytes it needs
    (plus the rest of the engine's blocks at its ends)."""

    def __init__(self, source: PathLike, framework: str = "numpy", device: Any = "cpu", **options: Any):
        from ._load import FRAMEWORKS

        kind = FRAMEWORKS.get(str(framework).lower())
        if kind is None:
            raise ValueError(f"stfs.open: framework must be 'numpy' or 'torch', not {framework!r}")
        self._kind, self._device = kind, device
        # A slice reads its own bytes: nothing is fetched ahead of them (its runs are read in parallel).
        # Handles open at once on the same source and options share one engine: ranks in threads
        # slicing the same tensors fetch each block once.
        self._checkpoint = Checkpoint(source, prefetch=False, share=True, **options)

    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._checkpoint.close()

    def keys(self) -> List[str]:
        return [t.name for t in self._checkpoint.tensors]

    def metadata(self) -> Optional[Dict[str, str]]:
        """The first shard's ``__metadata__`` (safe_open opens one file; of an index or a folder, the
        first shard's)."""
        shards = self._checkpoint.shards
        return dict(shards[0][1]) if shards and shards[0][1] is not None else None

    def stats(self) -> Dict[str, int]:
        return self._checkpoint.stats()

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self, self._checkpoint.tensor(name))

    def get_tensor(self, name: str):
        return self._read_slice(self._checkpoint.tensor(name), ())

    def _read_slice(self, tensor: Tensor, index: Any):
        import numpy as np

        from ._load import F4, F6, _numpy_dtype, _torch_type

        if tensor.dtype == F4 or tensor.dtype in F6:
            raise TypeError(f"stfs.open: tensor {tensor.name!r} is {tensor.dtype}, packed below a byte: "
                            "use stfs.load")
        if self._kind == "torch":
            import torch

            dtype, _ = _torch_type(torch, tensor, [])
            itemsize = dtype.itemsize
        else:
            dtype = _numpy_dtype(np, tensor)
            itemsize = dtype.itemsize
        shape = list(tensor.shape)
        ranges, dropped = _normalized(index, shape)
        cut, stepped = _run_start(ranges, shape)
        # Dimensions before `cut` are walked index by index; from `cut` on, each run is contiguous.
        covering = [r if d < cut else (r[0], r[1], 1) for d, r in enumerate(ranges)]
        sizes = [len(range(*r)) for r in covering]
        run = itemsize * math.prod(sizes[cut:])
        strides = [itemsize * math.prod(shape[d + 1:]) for d in range(len(shape))]
        runs = list(np.ndindex(*sizes[:cut])) if math.prod(sizes[:cut]) else []
        flat = np.empty(run * len(runs), dtype=np.uint8)
        reads = []
        for k, outer in enumerate(runs):
            offset = sum((covering[d][0] + outer[d] * covering[d][2]) * strides[d] for d in range(cut))
            offset += covering[cut][0] * strides[cut] if cut < len(shape) else 0
            reads.append((tensor, offset, flat[k * run:(k + 1) * run]))
        self._checkpoint.read([r for r in reads if r[2].nbytes])
        if self._kind == "torch":
            out = torch.from_numpy(flat).view(dtype).reshape(sizes)
        else:
            out = flat.view(dtype).reshape(sizes)
        if stepped:
            out = out[(slice(None),) * (len(shape) - 1) + (slice(None, None, ranges[-1][2]),)]
        out = out[tuple(0 if drop else slice(None) for drop in dropped)]
        if self._kind == "torch":
            return out.contiguous().to(self._device)
        return np.ascontiguousarray(out) if stepped else out


def _run_start(ranges: List[Tuple[int, int, int]], shape: List[int]) -> Tuple[int, bool]:
    """(cut, stepped): the first dimension of the contiguous runs a selection is read as (every
    dimension after it whole, it and they with step 1), and whether the last dimension's step had to
    be read over (a stepped last dimension is read whole between its ends and picked after)."""
    stepped = bool(shape) and ranges[-1][2] != 1
    cut = len(shape) - 1 if stepped else len(shape)
    while cut > 0:
        start, stop, step = ranges[cut - 1]
        inner_whole = all(ranges[d][:2] == (0, shape[d]) for d in range(cut, len(shape))) and not stepped
        if step != 1 or (cut < len(shape) and not inner_whole):
            break
        cut -= 1
    return cut, stepped


def open(source: PathLike, framework: str = "numpy", device: Any = "cpu", **options: Any) -> SafeOpen:
    """A ``safe_open``-shaped handle on `source` (any source stfs mounts; `options` as stfs.mount's), read
    by the engine in this process: no mount. Use it in a ``with`` block, or close() it."""
    return SafeOpen(source, framework, device, **options)
