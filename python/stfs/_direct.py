"""Cold local shards read with O_DIRECT into memory of their own: what stfs.load does with a local file
that is not in the page cache, where a mapping of it would be filled through the page cache first.

A read with O_DIRECT goes from the disk straight into the caller's memory, sparing the page cache's
insertions and the mapping's faults after (Run:ai's streamer reads so). The memory is one private
anonymous mapping per shard, as large as the file, the tensors views of it (as they are of a mapping
of the file): nothing else is held, the page cache is left as it was, and the file is read once.

On the test VM (a Firecracker guest whose free memory is handed back to the host) such a load costs
the disk's time and the first touch of the new memory, which faults on the host: 2 GiB of it took
0.74-0.92 s to fault in single-threaded (MADV_POPULATE_WRITE) right after 2 GiB were freed, 2.0-4.8 s
once the host had taken the freed memory back (5 s later); the threads' reads spread that over the
CPUs. The memory is left in small pages: with MADV_HUGEPAGE the cold 2 GiB load was 1.51x slower,
paired, in every one of 6 runs (scripts/bench/loaders.py --before; perf: the kernel zeroing each
2 MiB page at once, clear_page_erms, in large free blocks, the ones the host takes back).

Where O_DIRECT is refused (ramfs, procfs, tmpfs before Linux 6.6, some FUSE and network
filesystems, a device whose blocks are larger than a page), or a read fails, the shard is mapped
instead, as from the page cache."""
from __future__ import annotations

import fcntl
import mmap
import os
import threading
from typing import Dict, List, Set, Tuple

from ._whole import memory_available

#: Each read asks for this many bytes: the test VM's disk's largest request (its max_sectors_kb), so
#: each read is one request to it, and a Ctrl-C waits for little...
DIRECT_STEP = 4 << 20
#: ...with this many threads reading at once (so this many requests in flight; Run:ai keeps about
#: 100), each taking the next DIRECT_STEP of the shards in turn. Each thread's read also faults in
#: (zeroes) the memory it lands in. 2 GiB cold, scripts/bench/loaders.py --use light, paired runs on
#: the 2-core test VM (2026-12-02): 32 x 4 MiB 0.85 s median beside 16 x 16 MiB 1.91 s (1.84x);
#: 64 x 2 MiB measured no better (1.14 s, Run:ai 0.87 s in the same runs).
DIRECT_THREADS = 32
#: Offsets, lengths and the memory read into are multiples of this (O_DIRECT asks for the device's
#: logical block size; a page covers every common one).
DIRECT_ALIGN = mmap.PAGESIZE
#: Shards are read this way only while their memory, all together, is at most this share of the
#: memory available (_whole.memory_available): past it, the rest are mapped (the page cache can give
#: pages back under pressure; memory of its own cannot, with no swap).
DIRECT_MEMORY_SHARE = 0.75

#: What the reads did, over the process's life (a test's and a benchmark's view; nothing reads them
#: back): "shards" and "bytes" read with O_DIRECT, "refused" shards mapped instead after O_DIRECT was
#: refused or a read failed.
counts: Dict[str, int] = {"shards": 0, "bytes": 0, "refused": 0}


def read_direct(files: Dict[int, Tuple[int, int]]) -> Dict[int, mmap.mmap]:
    """shard -> a private anonymous mapping holding the whole file of the shard, for each of `files`
    (shard -> (descriptor, size): the caller's, left open) that could be read with O_DIRECT; the
    others (refused, a read failed, a file shorter than its size, or past DIRECT_MEMORY_SHARE of the
    memory available) are left out, for the caller to map, their descriptors as they were.
    DIRECT_THREADS threads read DIRECT_STEP pieces of all the files in turn, the GIL released in each
    read; this returns once every byte is in. A Ctrl-C (or any exception) while it waits stops the
    threads after their current read, and waits for them, before it is raised."""
    buffers: Dict[int, mmap.mmap] = {}
    pieces: List[Tuple[int, int, int, int]] = []  # (shard, descriptor, offset, length)
    available = memory_available()
    room = None if available is None else int(available * DIRECT_MEMORY_SHARE)
    for shard, (fd, size) in files.items():
        if size <= 0 or (room is not None and size > room):
            continue
        if not _direct(fd):
            counts["refused"] += 1
            continue
        if room is not None:
            room -= size
        length = -(-size // DIRECT_ALIGN) * DIRECT_ALIGN
        buffer = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buffers[shard] = buffer
        pieces += [(shard, fd, at, min(DIRECT_STEP, length - at)) for at in range(0, length, DIRECT_STEP)]
    if not pieces:
        return buffers
    # Shards a read of failed (not kept: the exception, whose frames would hold views of the buffer).
    failed: Set[int] = set()
    stopping = threading.Event()
    turn = iter(pieces)
    taking = threading.Lock()
    views = {shard: memoryview(buffer) for shard, buffer in buffers.items()}

    def run() -> None:
        while not stopping.is_set():
            with taking:
                piece = next(turn, None)
            if piece is None:
                return
            shard, fd, at, length = piece
            if shard in failed:
                continue
            try:
                _read_piece(fd, views[shard], at, length, files[shard][1])
            except Exception:  # any: a piece left unread would be zeros in a tensor
                failed.add(shard)

    threads = [threading.Thread(target=run, name="stfs-direct-read", daemon=True)
               for _ in range(min(DIRECT_THREADS, len(pieces)))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stopping.set()  # Ctrl-C while waiting: no thread starts another read
        for t in threads:
            if t.ident is not None:
                t.join()
        for view in views.values():
            view.release()
    for shard in failed:
        del buffers[shard]  # freed with its last view
        _direct(files[shard][0], on=False)
        counts["refused"] += 1
    counts["shards"] += len(buffers)
    counts["bytes"] += sum(files[shard][1] for shard in buffers)
    return buffers


def _direct(fd: int, on: bool = True) -> bool:
    """Sets (or clears) O_DIRECT on `fd`; whether it took (EINVAL where the filesystem has no direct
    I/O: ramfs, procfs, tmpfs before Linux 6.6, some FUSE and network filesystems)."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT) == on
    except OSError:
        return False


def _read_piece(fd: int, view: memoryview, at: int, length: int, size: int) -> None:
    """Reads bytes `at`..`at + length` of the file (`size` bytes) into the same place of `view`, up to
    the end of the file; OSError if it ends sooner (a file cut short while read)."""
    end = min(at + length, size)
    while at < end:
        n = os.preadv(fd, [view[at:at + length]], at)
        if n <= 0:
            raise OSError(f"O_DIRECT read at {at}: the file ended before its {size} bytes")
        at += n
        length -= n
        if at < end and at % DIRECT_ALIGN:  # a short read off the alignment: O_DIRECT cannot go on
            raise OSError(f"O_DIRECT read stopped at {at}, off a {DIRECT_ALIGN}-byte boundary")
