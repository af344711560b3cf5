#!/usr/bin/env python3
"""GPU load benchmark: a whole checkpoint onto a CUDA device, stfs against the loaders people use.

Loaders, each in a fresh process whose torch and CUDA context are up before the clock starts (the time
is the load itself, ending once every tensor is on the device: torch.cuda.synchronize):

  stfs          stfs.load(CKPT, framework="torch", device=DEV): mounts CKPT (the mount is timed),
                reads each tensor file in pieces through a ring of pinned buffers, copied without blocking
  safetensors   safetensors.torch.load_file(CKPT, device=DEV)
  cpu-then-to   safetensors.torch.load_file(CKPT) on the CPU, then .to(DEV) tensor by tensor
  runai         Run:ai Model Streamer: SafetensorsStreamer().stream_file(CKPT, device=DEV)
                (pip installed by this script when missing, unless --no-install)

from two kinds of storage (--only):

  page          the checkpoint is a local file in the page cache (re-read before every run)
  slow          the checkpoint is behind slowfs, the slow-storage model of docs/notes/benchmarks.md
                (--slow-bandwidth-mbps per open file handle, --slow-latency-ms per range request), a
                fresh slowfs mount per run, so every run starts cold. slowfs has no total cap: its
                limit is per open file, which favours loaders that open many streams (the table says
                so, and counts each loader's opens)

Every repetition runs every loader once, in a balanced order (interleave.py); ratios are paired by
repetition (each loader's time over stfs's: above 1 means stfs is faster) and shown as median
[min-max]. Each run checks its tensors against the local file (every tensor below 1 GiB, else every
8th), so a fast wrong load fails the run. Targets (issue 25): from the page cache stfs >= 1.0x the best
of the others; from slow storage stfs >= 3x the reference (safetensors.torch.load_file).

The run exits 1, with one line per cause, when a target is missed or a loader asked for has no row (a
peer that cannot be imported, or a loader whose run failed): a summary that leaves a row out or misses
a target is never a success. Each table is printed as soon as its storage kind is done, and with
--out-dir written there too (gpu-table-KIND.txt), with every figure so far in gpu-bench.json (rewritten
after every run), so a run stopped part way keeps what it measured.

  python3 scripts/bench/gpu.py --stfs "$(scripts/cargo_bin --release --bin stfs)"                      # 4 GiB on cuda, 3 reps
  python3 scripts/bench/gpu.py --stfs "$(scripts/cargo_bin --release --bin stfs)" --size 8G --reps 5
  python3 scripts/bench/gpu.py --stfs "$(scripts/cargo_bin --release --bin stfs)" --device cpu --size small --reps 1   # smoke

With --device cpu (no GPU: the smoke scripts/test runs) the same loaders load to the CPU, each run
touching every page of what it loaded, and the targets are not judged. Needs root (mounts), torch,
safetensors and numpy: scripts/torch_venv makes a virtualenv with all of them.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
import interleave  # noqa: E402

LOADERS = ["stfs", "safetensors", "cpu-then-to", "runai"]
REFERENCE = "safetensors"
SMALL_MB = 64
STEP_TIMEOUT_S = 1800  # one measured run (a worker process), unless --run-timeout
RUNAI_PACKAGE = "runai-model-streamer"


def label(loader, device):
    return {
        "stfs": f"stfs.load(device={device!r})",
        "safetensors": f"safetensors load_file(device={device!r})",
        "cpu-then-to": f"load_file, then .to({device!r})",
        "runai": f"Run:ai streamer (device={device!r})",
    }[loader]


def parse_size_mb(text):
    if text == "small":
        return SMALL_MB
    units = {"M": 1, "G": 1024, "T": 1 << 20}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="where the tensors go (default cuda; cpu for a smoke run)")
    p.add_argument("--size", default="4G", help=f"checkpoint size: small ({SMALL_MB} MiB) or N[M|G] (default 4G)")
    p.add_argument("--slow-size", help="checkpoint size for the slow-storage runs (default: --size)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per loader (default 3)")
    p.add_argument("--only", default="page,slow", help="storage kinds to run: page, slow (default both)")
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"loaders to run (default {','.join(LOADERS)})")
    p.add_argument("--slow-bandwidth-mbps", type=float, default=200.0, help="slowfs MB/s per handle (default 200)")
    p.add_argument("--slow-latency-ms", type=float, default=10.0, help="slowfs cost per range request (default 10)")
    p.add_argument("--stfs", default=cargo_paths.binary("stfs"), help="stfs binary")
    p.add_argument("--slowfs", default=cargo_paths.binary("slowfs", example=True),
                   help="slowfs binary (built with cargo if missing)")
    p.add_argument("--workdir", default="/var/tmp/stfs-bench", help="where checkpoints are built once and reused")
    p.add_argument("--no-install", action="store_true", help=f"do not pip install {RUNAI_PACKAGE} when missing")
    p.add_argument("--json", help="write every figure here (rewritten after every run)")
    p.add_argument("--out-dir", help="write gpu-bench.json and each table (gpu-table-page.txt, gpu-table-slow.txt) here as each is done")
    p.add_argument("--run-timeout", type=float, default=STEP_TIMEOUT_S,
                   help=f"seconds one measured run may take (default {STEP_TIMEOUT_S})")
    p.add_argument("--worker", nargs=3, metavar=("LOADER", "PATH", "VERIFY_AGAINST"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- the measured process --------------------------------------------------------------------------

def load_with(loader, path, device):
    if loader == "stfs":
        import stfs
        return stfs.load(path, framework="torch", device=device)
    from safetensors.torch import load_file
    if loader == "safetensors":
        return load_file(path, device=str(device))
    if loader == "cpu-then-to":
        return {name: t.to(device) for name, t in load_file(path).items()}
    if loader == "runai":
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(path, device=str(device))
            return {name: t.to(device) for name, t in streamer.get_tensors()}
    raise ValueError(f"unknown loader {loader!r}")


def worker(loader, path, verify_against, device_name):
    """Loads `path` with `loader`, prints one JSON line: seconds, bytes, tensors, the device's name."""
    import torch
    from safetensors import safe_open

    sys.path.insert(0, os.path.join(REPO, "python"))
    if loader == "stfs":
        import stfs  # noqa: F401  (imported before the clock starts, like the others' modules)
    elif loader == "runai":
        import runai_model_streamer  # noqa: F401
    import safetensors.torch  # noqa: F401

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    if cuda:
        torch.empty(1, device=device)  # the CUDA context, before the clock
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    tensors = load_with(loader, path, device)
    if cuda:
        torch.cuda.synchronize(device)
    else:
        for t in tensors.values():  # a mapped tensor is loaded once its pages are: touch one byte of each
            flat = t.reshape(-1).view(torch.uint8)
            if flat.numel():
                flat[::4096].sum()
    seconds = time.perf_counter() - started

    with safe_open(verify_against, framework="pt") as ref:
        names = list(ref.keys())
        if sorted(names) != sorted(tensors):
            raise SystemExit(f"{loader}: loaded {len(tensors)} tensors, the checkpoint has {len(names)}")
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        step = 1 if total < (1 << 30) else 8
        for name in names[::step]:
            got, want = tensors[name], ref.get_tensor(name)
            if got.device.type != device.type or got.dtype != want.dtype or got.shape != want.shape:
                raise SystemExit(f"{loader}: {name} is {got.dtype} {tuple(got.shape)} on {got.device}, "
                                 f"expected {want.dtype} {tuple(want.shape)} on {device}")
            if not torch.equal(got.cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
                raise SystemExit(f"{loader}: {name} differs from the checkpoint")
    print(json.dumps({"seconds": seconds, "bytes": total, "tensors": len(tensors),
                      "device_name": torch.cuda.get_device_name(device) if cuda else "cpu"}))


# --- the driver ------------------------------------------------------------------------------------

def ensure_runai(install):
    """Whether Run:ai Model Streamer can be imported, pip installing it first when missing."""
    check = [sys.executable, "-c", "import runai_model_streamer"]
    if subprocess.run(check, capture_output=True, timeout=300).returncode == 0:
        return True
    if not install:
        print(f"{RUNAI_PACKAGE} is not installed (--no-install): its row is not measured", flush=True)
        return False
    print(f"pip install {RUNAI_PACKAGE}", flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", RUNAI_PACKAGE],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or subprocess.run(check, capture_output=True, timeout=300).returncode != 0:
        print(f"pip install {RUNAI_PACKAGE} failed: its row is not measured\n{done.stderr.strip()[-2000:]}", flush=True)
        return False
    return True


def measure(args, loader, path, verify_against):
    env = dict(os.environ, STFS_BIN=os.path.abspath(args.stfs))
    env.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")
    cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--worker", loader, path, verify_against]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=args.run_timeout)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{loader} on {path} failed (exit {done.returncode}):\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_storage(args, kind, ckpt, loaders, progress=None):
    """Every loader once per repetition, in a balanced order (interleave.py); returns {loader: [run,
    ...]}. `progress(runs)` is called after every run. A loader whose run fails is reported and left
    out of the later repetitions (its row is then incomplete: the summary counts it as dropped)."""
    import mounts

    runs = {loader: [] for loader in loaders}
    failed = {}
    for rep in range(args.reps):
        for loader in interleave.balanced(loaders, rep):
            if loader in failed:
                continue
            try:
                if kind == "page":
                    mounts.warm_page_cache([ckpt["checkpoint"]])
                    run = measure(args, loader, ckpt["checkpoint"], ckpt["checkpoint"])
                else:
                    mounts.warm_page_cache([ckpt["checkpoint"]])  # the local file behind slowfs: only slowfs's costs count
                    with mounts.slowfs(args.slowfs, ckpt["checkpoint_dir"], args.slow_bandwidth_mbps, args.slow_latency_ms) as slow:
                        path = os.path.join(slow.path, os.path.basename(ckpt["checkpoint"]))
                        before = mounts.slowfs_stats(slow.path)
                        run = measure(args, loader, path, ckpt["checkpoint"])
                        after = mounts.slowfs_stats(slow.path)
                    run["storage_bytes"] = after["bytes"] - before["bytes"]
                    run["range_requests"] = after["range_requests"] - before["range_requests"]
                    run["opens"] = after.get("opens", 0) - before.get("opens", 0)
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
                failed[loader] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                print(f"  {kind} rep {rep + 1}/{args.reps} {loader:12} FAILED: {e}", flush=True)
                continue
            runs[loader].append(run)
            print(f"  {kind} rep {rep + 1}/{args.reps} {loader:12} {run['seconds']:8.3f} s", flush=True)
            if progress:
                progress(runs)
    return runs, failed


def spread(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def report(args, kind, ckpt, runs, out=print):
    """One table (each loader's time, throughput and how many times slower than stfs it is, and the
    targets), printed through `out`; returns its figures. A loader with no run has a row saying so."""
    device = args.device
    size = ckpt["file_size"]
    name = next((r["device_name"] for rs in runs.values() for r in rs), device)
    if kind == "page":
        title = "from the page cache"
    else:
        title = (f"from slow storage (slowfs {args.slow_bandwidth_mbps:g} MB/s per open file, no total cap: "
                 f"favours loaders that open many streams; {args.slow_latency_ms:g} ms per range request, cold each run)")
    where = device if name == device else f"{device} ({name})"
    out(f"\n{size / (1 << 20):.0f} MiB checkpoint to {where}, {title}, {args.reps} rep(s):")
    out(f"  {'loader':44} {'seconds, median [min-max]':28} {'GB/s':>6}  {'time / stfs time':>22}")
    stfs_times = [r["seconds"] for r in runs.get("stfs", [])] if len(runs.get("stfs", [])) == args.reps else []
    ratios = {}
    for loader, rs in runs.items():
        times = [r["seconds"] for r in rs]
        if len(times) < args.reps:
            out(f"  {label(loader, device):44} no figure: {len(times)} of {args.reps} run(s) done (see above)")
            continue
        row = f"  {label(loader, device):44} {spread(times):28} {size / statistics.median(times) / 1e9:6.2f}"
        if stfs_times and loader != "stfs":
            ratios[loader] = [t / s for t, s in zip(times, stfs_times)]
            row += f"  {spread(ratios[loader]) + 'x':>22}"
        elif kind == "slow":
            row += " " * 24
        if kind == "slow":
            row += f"  storage bytes / file {statistics.median(r['storage_bytes'] for r in rs) / size:.2f}"
            row += f", opens {statistics.median(r.get('opens', 0) for r in rs):g}"
        out(row)
    verdicts = []
    if ratios:
        if kind == "page":
            best = min(ratios, key=lambda k: statistics.median(r["seconds"] for r in runs[k]))
            verdicts.append((f"stfs >= 1.0x the best of the others ({best})", statistics.median(ratios[best]), 1.0))
        elif REFERENCE in ratios:
            verdicts.append((f"stfs >= 3x the reference ({REFERENCE})", statistics.median(ratios[REFERENCE]), 3.0))
    judged_here = device == "cuda" or device.startswith("cuda:")
    targets = []
    for text, got, target in verdicts:
        judged = ("MET" if got >= target else "MISSED") if judged_here else "not judged (not a CUDA device: smoke run)"
        out(f"  target: {text}: {got:.2f}x  {judged}")
        targets.append({"target": text, "ratio": got, "needed": target, "verdict": judged})
    if judged_here and not verdicts:
        text = "stfs >= 1.0x the best of the others" if kind == "page" else f"stfs >= 3x the reference ({REFERENCE})"
        out(f"  target: {text}: MISSED (not measured: a row it needs is missing)")
        targets.append({"target": text, "ratio": None, "needed": None, "verdict": "MISSED"})
    return {"device": device, "device_name": name, "file_size": size, "runs": runs, "ratios_vs_stfs": ratios,
            "targets": targets}


def problems(asked, dropped, summary):
    """The lines that make the run fail: every loader asked for with no complete row (and why), and
    every target MISSED."""
    lines = [f"dropped row: {loader} ({why})" for loader, why in dropped.items()]
    for kind, table in summary.items():
        for loader in asked:
            if loader not in dropped and len(table["runs"].get(loader, [])) < table["reps"]:
                lines.append(f"dropped row: {loader} from {kind} ({len(table['runs'].get(loader, []))} of {table['reps']} runs)")
        lines += [f"target MISSED ({kind}): {t['target']}: " + (f"{t['ratio']:.2f}x" if t["ratio"] is not None else "not measured")
                  for t in table["targets"] if t["verdict"] == "MISSED"]
    return lines


def main():
    args = parse_args()
    if args.worker:
        return worker(*args.worker, args.device)

    import checkpoint
    import mounts  # noqa: F401

    # `timeout` (scripts/test) stops the run with SIGTERM: exit through the mount contexts, which unmount.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        sys.exit("scripts/bench/gpu.py: needs root (it mounts stfs and slowfs)")
    kinds = [k for k in args.only.split(",") if k]
    loaders = [x for x in args.loaders.split(",") if x]
    unknown = [k for k in kinds if k not in ("page", "slow")] + [x for x in loaders if x not in LOADERS]
    if unknown:
        sys.exit(f"scripts/bench/gpu.py: unknown --only or --loaders value(s): {', '.join(unknown)}")
    if "stfs" in loaders and not os.access(args.stfs, os.X_OK):
        sys.exit(f"scripts/bench/gpu.py: {args.stfs}: no stfs binary (cargo build --release)")
    probe = subprocess.run([sys.executable, "-c", f"import torch; torch.empty(1, device={args.device!r})"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        sys.exit(f"scripts/bench/gpu.py: device {args.device!r} is not usable here: "
                 f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    asked = list(loaders)
    dropped = {}
    if "runai" in loaders and not ensure_runai(not args.no_install):
        loaders.remove("runai")
        dropped["runai"] = f"{RUNAI_PACKAGE} cannot be imported"
    if "slow" in kinds and not os.access(args.slowfs, os.X_OK):
        if not shutil.which("cargo"):
            sys.exit(f"scripts/bench/gpu.py: {args.slowfs}: no slowfs binary, and no cargo to build it "
                     "(scripts/gpu-kit builds one into the kit)")
        print("building slowfs (cargo build --release --example slowfs)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--example", "slowfs"], cwd=REPO, check=True, timeout=STEP_TIMEOUT_S)

    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
    outputs = [p for p in (args.json, args.out_dir and os.path.join(args.out_dir, "gpu-bench.json")) if p]
    summary, partial = {}, {}

    def save():
        for path in outputs:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "x") as f:
                json.dump({"asked": asked, "dropped": dropped, "tables": summary, "in_progress": partial}, f, indent=1)
            os.replace(tmp, path)

    for kind in kinds:
        mb = parse_size_mb(args.slow_size if kind == "slow" and args.slow_size else args.size)
        print(f"preparing a {mb} MiB checkpoint in {args.workdir}", flush=True)
        ckpt = checkpoint.build(args.workdir, f"transformer-{mb}M", checkpoint.transformer_layout(mb << 20),
                                with_squashfs=False)

        def progress(runs, kind=kind):
            partial[kind] = runs
            save()

        runs, failed = run_storage(args, kind, ckpt, loaders, progress)
        for loader, why in failed.items():
            dropped.setdefault(loader, f"{kind}: {why}")
        lines = []

        def out(line):
            print(line, flush=True)
            lines.append(line)

        summary[kind] = dict(report(args, kind, ckpt, runs, out), reps=args.reps, table="\n".join(lines))
        partial.pop(kind, None)
        save()
        if args.out_dir:
            path = os.path.join(args.out_dir, f"gpu-table-{kind}.txt")
            with open(f"{path}.{os.getpid()}.tmp", "x") as f:
                f.write("\n".join(lines).lstrip("\n") + "\n")
            os.replace(f"{path}.{os.getpid()}.tmp", path)
    bad = problems(asked, dropped, summary)
    for line in bad:
        print(f"scripts/bench/gpu.py: {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
