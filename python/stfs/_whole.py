"""stfs.load over the re-served checkpoint files: where the mount hands a shard's file to the kernel
(FUSE passthrough: root, a local file), each such shard is mapped once and its tensors are views of that
mapping (zero copy, as safetensors' load_file), since reading the mapping then runs at the local file's
speed. Only raw tensors qualify (a view such as ``as_="f32"`` serves other bytes); the caller loads the
rest its usual way.

From a cold page cache such a mapping would be read by its page faults, a little at a time; for torch
(whose stfs.load reads every byte anyway where nothing is handed over) read_ahead asks the kernel to
read each mapped shard in, in file order, on a thread, while the caller goes on using the tensors."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: madvise(2)'s advice to read a range of a file mapping in (asynchronous readahead of the file).
MADV_WILLNEED = 3
#: read_ahead asks for this much at a time, so the pages nearest the caller's next touch come first.
#: 8 MiB (the kernel splits a request into readahead-sized pieces anyway): the threads then work
#: on neighbouring pieces, one stream to the disk, and the first tensor's pages are not queued
#: behind three other threads' 64 MiB. Cold, 2 GiB, paired with the 64 MiB before it in two runs
#: of 8: faster in all 16 (1.13 s against 2.04 s median; docs/notes/benchmarks.md).
READ_AHEAD_CHUNK = 8 << 20
#: read_ahead's threads, each asking for the next chunk not yet asked for: a disk serves several
#: requests at once faster than one after the other.
READ_AHEAD_THREADS = 4


#: The extended attribute an stfs file carries: "1" while its opens are handed to the kernel.
PASSTHROUGH_XATTR = "user.stfs.passthrough"


def handed_over(root: str) -> Dict[int, Any]:
    """shard index -> (path, size) of each re-served file the mount hands to the kernel: asked of the
    file itself while it is open (its PASSTHROUGH_XATTR is "1"), so no other process's opens can be
    taken for it. Empty where nothing is (not root, a remote source, --no-passthrough, an older
    stfs without the attribute)."""
    with open(os.path.join(root, "metadata.json"), "rb") as f:
        meta = json.load(f)
    files = [f for f in meta.get("checkpoint_files", []) if "shard" in f and f.get("size")]
    out: Dict[int, Any] = {}
    try:
        for f in files:
            path = os.path.join(root, f["path"])
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.getxattr(fd, PASSTHROUGH_XATTR) == b"1":
                    out[int(f["shard"])] = (path, int(f["size"]))
            finally:
                os.close(fd)
    except (OSError, ValueError, KeyError):
        return {}
    if out:
        out["tensors"] = meta["tensors"]
    return out


def views(root: str, items: List[Any], map_shard: Callable[[str, int], Any], view: Callable[[Any, Any], Any],
          mapped: Optional[Callable[[List[Any]], None]] = None) -> Dict[str, Any]:
    """name -> view(flat bytes of the tensor, entry) for every raw tensor of a handed-over shard:
    `map_shard(path, size)` maps a shard once (a 1-D uint8 array or tensor), `view` types a slice of
    it; `mapped`, if given, is handed every shard's mapping, in shard order, once all are made. The
    rest are left out, for the caller to load."""
    shards = handed_over(root)
    if not shards:
        return {}
    tensors = shards.pop("tensors")
    maps: Dict[int, Any] = {}
    out: Dict[str, Any] = {}
    for e in items:
        info = tensors.get(e.name, {})
        shard = info.get("shard")
        raw = info.get("served_dtype", info.get("dtype")) == info.get("dtype") and info.get("served_byte_len", e.byte_len) == info.get("byte_len")
        if shard not in shards or not raw or not e.byte_len:
            continue
        if shard not in maps:
            maps[shard] = map_shard(*shards[shard])
        start = int(info["offset"])
        out[e.name] = view(maps[shard][start:start + e.byte_len], e)
    if mapped is not None and maps:
        mapped([maps[k] for k in sorted(maps)])
    return out


def read_ahead(ranges: Sequence[Tuple[int, int, Any]]) -> None:
    """Starts a daemon thread that asks the kernel to read each (address, length, owner) mapping in,
    in order, READ_AHEAD_CHUNK at a time (madvise MADV_WILLNEED: the kernel queues the reads and
    returns; pages already in the page cache cost nothing). Each owner (what keeps the mapping alive)
    is held until its range has been asked for, so no address is advised after it was unmapped. Best
    effort: no libc, or a refusal, ends it quietly."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    chunks = [(at, min(READ_AHEAD_CHUNK, end - at), owner)
              for start, end, owner in ((a - a % mmap.PAGESIZE, a + n, o) for a, n, o in ranges if n > 0)
              for at in range(start, end, READ_AHEAD_CHUNK)]
    chunks.reverse()  # popped from the end: file order
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                if not chunks:
                    return
                at, length, _owner = chunks.pop()  # _owner: the mapping stays alive until advised
            if madvise(at, length, MADV_WILLNEED) != 0:
                with lock:
                    chunks.clear()
                return

    for _ in range(min(READ_AHEAD_THREADS, len(chunks))):
        threading.Thread(target=run, name="stfs-read-ahead", daemon=True).start()


def torch_view(flat, dtype, shape):
    """The bytes `flat` (a slice of a shard's mapping) as a tensor of `dtype` and `shape`: a view, or a
    copy where the offset is not aligned to the element size (a view cannot start there)."""
    try:
        return flat.view(dtype).reshape(shape)
    except RuntimeError:
        return flat.clone().view(dtype).reshape(shape)
