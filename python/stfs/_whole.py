"""stfs.load over the re-served checkpoint files: where the mount hands a shard's file to the kernel
(FUSE passthrough: root, a local file), each such shard is mapped once and its tensors are views of that
mapping (zero copy, as safetensors' load_file), since reading the mapping then runs at the local file's
speed. Only raw tensors qualify (a view such as ``as_="f32"`` serves other bytes); the caller loads the
rest its usual way.

From a cold page cache such a mapping would be read by its page faults, a little at a time; for torch
(whose stfs.load reads every byte anyway where nothing is handed over) read_ahead has one thread read
each mapped shard into the page cache, in file order, while the caller goes on using the tensors."""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

#: read_ahead moves this much per sendfile(2) call, so that a thread stopped at exit waits for little.
READ_AHEAD_STEP = 8 << 20


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
          mapped: Optional[Callable[[List[str]], None]] = None) -> Dict[str, Any]:
    """name -> view(flat bytes of the tensor, entry) for every raw tensor of a handed-over shard:
    `map_shard(path, size)` maps a shard once (a 1-D uint8 array or tensor), `view` types a slice of
    it; `mapped`, if given, is handed the path of every shard mapped, in shard order, once all are
    made. The rest are left out, for the caller to load."""
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
        mapped([shards[k][0] for k in sorted(maps)])
    return out


def read_ahead(paths: Sequence[str]) -> None:
    """Starts a daemon thread that reads each file into the page cache, in order: sendfile(2) of it
    to /dev/null, READ_AHEAD_STEP at a time, so the kernel's own sequential readahead reads it (large
    reads into large page-cache folios) and no byte is copied to this process. One thread, one
    stream: the MADV_WILLNEED pieces on 4 threads this replaced were as fast cold, but left the file
    in 4 KiB pages, and every later load of it from the page cache ran 1.5-8x slower
    (docs/notes/benchmarks.md). The files are opened here, before load detaches its mount. Best
    effort: an error ends the thread quietly."""
    try:
        sink = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    fds: List[int] = []
    for path in paths:
        try:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            break

    def run() -> None:
        try:
            for fd in fds:
                at = 0
                while True:
                    n = os.sendfile(sink, fd, at, READ_AHEAD_STEP)
                    if not n:
                        break
                    at += n
        except OSError:
            pass
        finally:
            for fd in fds + [sink]:
                os.close(fd)

    threading.Thread(target=run, name="stfs-read-ahead", daemon=True).start()


def torch_view(flat, dtype, shape):
    """The bytes `flat` (a slice of a shard's mapping) as a tensor of `dtype` and `shape`: a view, or a
    copy where the offset is not aligned to the element size (a view cannot start there)."""
    try:
        return flat.view(dtype).reshape(shape)
    except RuntimeError:
        return flat.clone().view(dtype).reshape(shape)
