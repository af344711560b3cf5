#!/usr/bin/env python3
"""Quick side-by-side measurements for issue 34 (no torch on this machine: NumPy stands in for it).

seq:   the re-served checkpoint file read through a fresh --no-passthrough mount in 16 MiB reads, with
       fs.fuse.max_pages_limit set to 256, 1024 and 4096 pages (1, 4, 16 MiB requests, each mount asking
       for that size with --max-request-kb) in turn,
       interleaved per repetition; the sysctl is restored at the end. GiB/s, medians.
loads: the checkpoint in the page cache. Each variant maps a safetensors file the way load_file does
       (one private mapping of the file, every tensor a view), then "light" touches one byte per page of
       every tensor, "full" copies every byte into a buffer allocated before the clock. Variants: the
       local file itself; the re-served file on a mount with passthrough; the same on a mount with
       --no-passthrough; stfs.load(framework="numpy") on each of those mounts. Mounts are made before
       the clock (fresh per repetition), variants interleaved in rotated order. Seconds, medians, and
       the median of paired ratios to the local file. --cold: the file's pages are dropped
       (POSIX_FADV_DONTNEED) before every variant.
remote: the checkpoint served by nginx (started here, on --port); a first mount with --cache-dir reads
       the re-served file whole (blocks, then its whole-file extent, land in the cache), then per
       repetition the same light and full use of: a local copy (the file itself), the re-served file on a
       fresh mount with that --cache-dir, and the same with --no-passthrough (the cached blocks served by
       the daemon). As "loads", mounts made before the clock.
opens: the open-bound case that guards the local path: `cat` of every tensor file of a mount (SRC, or
       when not given a generated checkpoint of 2,000 tensors of 4 KiB: one open per file), fresh mount
       per repetition, passthrough on (as root; the re-served file can be handed over) against
       --no-passthrough, balanced order; seconds, medians, and the median [range] of the paired ratios
       on/off (a tensor file is never handed over: its open should cost the same either way). A third
       variant holds the re-served file open (handed over) during the `cat`: the mount then keeps
       answering every OPEN, so each tensor open is a round trip to the daemon, the cost it had before.
quick: the smoke run of scripts/test: each of the above once (remote only where nginx is installed) on
       a generated 16 MiB checkpoint of 64 F32 tensors (SRC not given), figures not judged.
The torch cases of the issue (fresh processes, fastsafetensors, Run:ai) are scripts/bench/loaders.py's
--use light/full."""
import argparse, json, mmap, os, shutil, statistics, struct, subprocess, sys, tempfile, time
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cargo_paths  # noqa: E402 - beside this script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = 4096


def mount(stfs, src, *opts):
    mp = tempfile.mkdtemp(prefix="near-mp-")
    subprocess.run([stfs, "mount", src, mp, *opts], check=True)
    return mp


def umount(stfs, mp):
    subprocess.run([stfs, "umount", mp], check=True)
    os.rmdir(mp)


def stats(mp):
    with open(os.path.join(mp, ".stfs", "stats.json")) as f:
        return json.load(f)


def read_file(path, buf):
    fd = os.open(path, os.O_RDONLY)
    n, view = 0, memoryview(buf)
    t = time.perf_counter()
    while True:
        got = os.preadv(fd, [view[:16 << 20]], n)
        if not got:
            break
        n += got
    t = time.perf_counter() - t
    os.close(fd)
    return n, t


def seq(a):
    import mounts
    buf = bytearray(16 << 20)
    res = {}
    with mounts.max_pages_limit() as set_limit:
        for rep in range(a.reps):
            for pages in (256, 1024, 4096)[rep % 3:] + (256, 1024, 4096)[:rep % 3]:
                set_limit(pages)
                mp = mount(a.stfs, a.src, "--no-passthrough", "--max-request-kb", str(pages * 4), *a.opts)
                try:
                    path = os.path.join(mp, os.path.basename(a.src))
                    n, t = read_file(path, buf)
                    s = stats(mp)
                    res.setdefault(pages, []).append((n / t / (1 << 30), s["max_request_bytes"],
                                                      s["fuse_read_bytes"] // max(1, s["fuse_reads"])))
                finally:
                    umount(a.stfs, mp)
    for pages, rows in sorted(res.items()):
        print(f"max_pages_limit {pages:5}: granted {rows[0][1] >> 10} KiB, mean read {rows[0][2] >> 10} KiB, "
              f"{statistics.median(r[0] for r in rows):.2f} GiB/s (runs: {', '.join(f'{r[0]:.2f}' for r in rows)})")


def views(path):
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    flat = np.frombuffer(m, np.uint8)
    n = struct.unpack("<Q", flat[:8].tobytes())[0]
    header = json.loads(flat[8:8 + n].tobytes())
    header.pop("__metadata__", None)
    start = 8 + n
    return [flat[start + v["data_offsets"][0]:start + v["data_offsets"][1]] for v in header.values()], m


def use(arrays, mode, out):
    if mode == "light":
        return sum(int(a[::PAGE].sum()) for a in arrays)
    at = 0
    for a in arrays:
        out[at:at + a.size] = a
        at += a.size
    return at


def loads(a):
    import stfs
    size = os.path.getsize(a.src)
    out = np.empty(size, np.uint8)
    out[::PAGE] = 0
    subprocess.run(["cat", a.src], stdout=subprocess.DEVNULL, check=True)
    base = os.path.basename(a.src)
    times = {}
    variants = ["local", "passthrough", "no-passthrough", "stfs.load pt", "stfs.load no-pt"]
    for rep in range(a.reps):
        for mode in ("light", "full"):
            on = mount(a.stfs, a.src, *a.opts)
            off = mount(a.stfs, a.src, "--no-passthrough", *a.opts)
            try:
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                for v in order:
                    if a.cold:  # the file's pages dropped before every variant (--cold)
                        fd = os.open(a.src, os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                    t = time.perf_counter()
                    if v.startswith("stfs.load"):
                        arrays = [x.reshape(-1).view(np.uint8) for x in stfs.load(on if v.endswith(" pt") else off).values()]
                        m = None
                    else:
                        path = {"local": a.src, "passthrough": os.path.join(on, base), "no-passthrough": os.path.join(off, base)}[v]
                        arrays, m = views(path)
                    use(arrays, mode, out)
                    times.setdefault((mode, v), []).append(time.perf_counter() - t)
                    del arrays
                    if m is not None:
                        try:
                            m.close()
                        except BufferError:
                            pass
                if rep == 0 and mode == "full":
                    print(f"opens of the re-served file handed to the kernel: {stats(on)['passthrough_checkpoint_opens']} "
                          f"on the passthrough mount, {stats(off)['passthrough_checkpoint_opens']} on the other")
            finally:
                umount(a.stfs, on)
                umount(a.stfs, off)
    for mode in ("light", "full"):
        ref = times[(mode, "local")]
        for v in variants:
            ts = times[(mode, v)]
            ratio = statistics.median(r / t for r, t in zip(ref, ts))
            print(f"{mode:5} {v:16} {statistics.median(ts):.3f} s  ({ratio:.2f}x the local file; runs {', '.join(f'{t:.3f}' for t in ts)})")


def timed_views(path, mode, out):
    t = time.perf_counter()
    arrays, m = views(path)
    use(arrays, mode, out)
    t = time.perf_counter() - t
    del arrays
    try:
        m.close()
    except BufferError:
        pass
    return t


def remote(a):
    work = tempfile.mkdtemp(prefix="near-remote-", dir=os.path.dirname(os.path.abspath(a.src)))
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"user root; daemon off; pid {work}/nginx.pid; error_log {work}/error.log; events {{}} http {{ access_log off; "
                f"server {{ listen 127.0.0.1:{a.port}; root {os.path.dirname(os.path.abspath(a.src))}; }} }}")
    nginx = subprocess.Popen(["nginx", "-c", conf, "-p", work])
    time.sleep(0.5)
    cache = os.path.join(work, "cache")
    url = f"http://127.0.0.1:{a.port}/{os.path.basename(a.src)}"
    base = os.path.basename(a.src)
    size = os.path.getsize(a.src)
    out = np.empty(size, np.uint8)
    out[::PAGE] = 0
    subprocess.run(["cat", a.src], stdout=subprocess.DEVNULL, check=True)
    times = {}
    try:
        mp = mount(a.stfs, url, "--cache-dir", cache, *a.opts)
        ready, start = 0, time.time()
        try:
            # Read whole (blocks land on disk), closed (the whole-file extent is assembled by the disk
            # tier's writer, seconds for 2 GiB), until an open is handed over; read again now and then
            # for blocks the write queue dropped.
            while not ready and time.time() - start < 300:
                subprocess.run(["cat", os.path.join(mp, base)], stdout=subprocess.DEVNULL, check=True)
                for _ in range(40):
                    with open(os.path.join(mp, base), "rb"):
                        ready = stats(mp)["passthrough_checkpoint_opens"]
                    if ready:
                        break
                    time.sleep(0.5)
        finally:
            umount(a.stfs, mp)
        print("whole-file extent handed over:", bool(ready))
        variants = ["local", "cache-dir passthrough", "cache-dir no-passthrough"]
        for rep in range(a.reps):
            for mode in ("light", "full"):
                on = mount(a.stfs, url, "--cache-dir", cache, *a.opts)
                off = mount(a.stfs, url, "--cache-dir", cache, "--no-passthrough", *a.opts)
                try:
                    for v in variants[rep % 3:] + variants[:rep % 3]:
                        path = {"local": a.src, "cache-dir passthrough": os.path.join(on, base),
                                "cache-dir no-passthrough": os.path.join(off, base)}[v]
                        times.setdefault((mode, v), []).append(timed_views(path, mode, out))
                finally:
                    umount(a.stfs, on)
                    umount(a.stfs, off)
    finally:
        nginx.terminate()
        nginx.wait()
        shutil.rmtree(work, ignore_errors=True)
    for mode in ("light", "full"):
        ref = times[(mode, "local")]
        for v in variants:
            ts = times[(mode, v)]
            ratio = statistics.median(r / t for r, t in zip(ref, ts))
            print(f"{mode:5} {v:26} {statistics.median(ts):.3f} s  ({ratio:.2f}x the local copy; runs {', '.join(f'{t:.3f}' for t in ts)})")


def opens(a):
    from interleave import balanced
    variants = ["passthrough", "no-passthrough", "passthrough, re-served file held"]
    times = {v: [] for v in variants}
    for rep in range(a.reps):
        for v in balanced(variants, rep):
            mp = mount(a.stfs, a.src, *(["--no-passthrough"] if v == "no-passthrough" else []), *a.opts)
            held = None
            try:
                with open(os.path.join(mp, "metadata.json")) as f:
                    meta = json.load(f)
                paths = [os.path.join(mp, t["path"]) for t in meta["tensors"].values()]
                if v.endswith("held"):
                    held = os.open(os.path.join(mp, meta["checkpoint_files"][0]["path"]), os.O_RDONLY)
                t = time.perf_counter()
                subprocess.run(["cat", *paths], check=True, stdout=subprocess.DEVNULL, timeout=600)
                times[v].append(time.perf_counter() - t)
                if rep == 0:
                    s = stats(mp)
                    print(f"{v}: passthrough_enabled {s['passthrough_enabled']}, opens seen by the daemon "
                          f"{s['kernel_open_requests']} of {len(paths)}, handed over {s['passthrough_opens']}")
            finally:
                if held is not None:
                    os.close(held)
                umount(a.stfs, mp)
    for v, ts in times.items():
        print(f"{v:32} cat of {len(paths)} tensor files: {statistics.median(ts):.3f} s "
              f"({statistics.median(ts) / len(paths) * 1e6:.1f} us per file; runs {', '.join(f'{t:.3f}' for t in ts)})")
    for v in variants[0], variants[2]:
        ratios = [on / off for on, off in zip(times[v], times["no-passthrough"])]
        print(f"{v} / --no-passthrough: {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] (n={len(ratios)}; 1.00x: an open costs the same)")


def quick(a):
    import checkpoint
    a.reps = 1
    given = a.src
    if not a.src:
        a.src = checkpoint.build(a.workdir, "f32-16M", checkpoint.f32_layout(16 << 20), with_squashfs=False)["checkpoint"]
    for what, cold in ((seq, False), (loads, False), (loads, True), (remote, False), (opens, False)):
        print(f"== near.py {what.__name__}{' --cold' if cold else ''} (smoke, 1 repetition, not judged)", flush=True)
        if what is remote and not shutil.which("nginx"):
            print("skipped: no nginx on this machine")
            continue
        a.cold = cold
        if what is opens and not given:
            a.src = small_files(a.workdir, 200)
        what(a)


def small_files(workdir, count):
    """A checkpoint of `count` tensors of 4 KiB each (float32 32x32): one open per 4 KiB file."""
    import checkpoint
    layout = [(f"model.layers.{i // 10}.block.{i % 10}.weight", np.float32, (32, 32)) for i in range(count)]
    return checkpoint.build(workdir, f"small4k-{count}", layout, with_squashfs=False)["checkpoint"]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("what", choices=["seq", "loads", "remote", "opens", "quick"])
    p.add_argument("--port", type=int, default=18734)
    p.add_argument("--cold", action="store_true", help="loads: drop the file's pages before every variant")
    p.add_argument("src", nargs="?", help="the checkpoint (quick: generated when not given)")
    p.add_argument("--workdir", default="/var/tmp/stfs-bench", help="quick, opens: where their checkpoint is built once")
    p.add_argument("--stfs", default=cargo_paths.binary("stfs"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--stfs-opts", default="", help="extra stfs mount arguments, space-separated")
    a = p.parse_args()
    a.opts = a.stfs_opts.split()
    if not a.src and a.what == "opens":
        a.src = small_files(a.workdir, 2000)
    elif not a.src and a.what != "quick":
        p.error(f"{a.what} needs SRC")
    sys.path.insert(0, os.path.join(REPO, "python"))
    os.environ.setdefault("STFS_BIN", a.stfs)
    {"seq": seq, "loads": loads, "remote": remote, "opens": opens, "quick": quick}[a.what](a)
