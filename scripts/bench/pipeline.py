#!/usr/bin/env python3
"""Seed 2 on its own layout (issue 36, item 5): a whole diffusers pipeline folder loaded from slow
storage, straight from the slow store against through `stfs mount PIPELINE_DIR`.

The pipeline (made once with random weights under --workdir: numpy + safetensors, no torch) is
`model_index.json`, `unet/` (config.json and a diffusion_pytorch_model.safetensors of --unet-mb,
1 GiB by default), `vae/`, `text_encoder/` (each a config and a checkpoint), `scheduler/` and
`tokenizer/`. The checkpoints lie behind slowfs (examples/slowfs: 200 MB/s per handle, 10 ms per
range request; a fresh slowfs mount per run, so no run profits from another), and the pipeline
folder links to them, as a Hugging Face cache snapshot links to its blobs (slowfs serves a flat
folder): the folder is a snapshot of a Hugging Face cache repository,
`models--stfs-bench--pipeline/snapshots/REV/`, whose checkpoints link to `../../blobs/` (where slowfs
is mounted), the layout stfs's link rule serves (docs/usage.md). stfs mounts that folder with the settings it picks for a folder on a network or FUSE
filesystem (--threads 16 --io-threads 16; the folder itself is local here).

The load is what `DiffusionPipeline.from_pretrained` does with the files, without torch: read
model_index.json and every component's config, `safe_open` every component's checkpoint and
`get_tensor` every tensor (numpy). Two modes, as scenario (c) of run.py: (i) one process, (ii) 4
workers forked after the `safe_open`s, sharing the handles, each loading every 4th tensor of every
component. Direct and stfs runs are interleaved (rotated per repetition) and the ratios paired.
Whole-process wall time; stfs runs include the mount. The stfs mount's re-served checkpoints are
checked against the sources (sha256) once per run of the script.

--loader diffusers is the real thing: a diffusers `DDPMPipeline` (a `UNet2DModel` with
block_out_channels (W, 2W, 4W, 4W), --unet-width W, 224 by default: 309.6 M parameters, a 1.15 GiB
fp32 checkpoint; and a `DDPMScheduler`), random weights, `save_pretrained(..., safe_serialization=True)`
once under --workdir with the torch virtualenv's python (--python, scripts/torch_venv makes it). Its
checkpoints go behind slowfs and the folder links to them, as above, and each run is one fresh process
doing `DiffusionPipeline.from_pretrained(FOLDER)`: one process only (the 4-worker scenario stays with
the file loader). Direct and stfs runs interleaved, ratios paired, both the whole process (torch and
diffusers imports included) and the `from_pretrained` call alone (stfs rows add the mount). Once per run
of the script, the pipeline loaded through `stfs mount` of a folder linking to the local blobs and the
pipeline loaded from that folder itself give every component's state_dict the same sha256.

  python3 scripts/bench/pipeline.py --reps 3               # stfs and slowfs: cargo's release builds
  python3 scripts/bench/pipeline.py --quick            # smoke: 32 MiB UNet, 1 repetition
  python3 scripts/bench/pipeline.py --loader diffusers --reps 3
  python3 scripts/bench/pipeline.py --loader diffusers --quick    # smoke: a 24 MiB UNet
  python3 scripts/bench/pipeline.py --clean            # delete the pipelines built under --workdir
"""

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cargo_paths  # noqa: E402
from checkpoint import file_sha256  # noqa: E402
import mounts  # noqa: E402
import report  # noqa: E402
from report import Results  # noqa: E402

# The components: folder, checkpoint name, share of the non-UNet bytes, config.
COMPONENTS = [
    ("unet", "diffusion_pytorch_model.safetensors", {"_class_name": "UNet2DConditionModel"}),
    ("vae", "diffusion_pytorch_model.safetensors", {"_class_name": "AutoencoderKL"}),
    ("text_encoder", "model.safetensors", {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model"}),
]
MODES = {"i": ("(i) one process", 1), "ii": ("(ii) 4 workers forked after safe_open", 4)}
STFS_OPTS = ["--threads", "16", "--io-threads", "16"]
STEP_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 900
TORCH_PYTHON = os.path.expanduser("~/.cache/stfs/torch-venv/bin/python")


def tensor_shapes(total_bytes, prefix):
    """fp16 tensors of a UNet-like mix (large convolutions and projections, small norms) totalling
    `total_bytes` (the last one cut to fit)."""
    kinds = [("attn.to_q.weight", (1280, 1280)), ("attn.to_k.weight", (1280, 1280)),
             ("ff.proj.weight", (5120, 1280)), ("conv1.weight", (1280, 1280, 3, 1)),
             ("norm1.weight", (1280,)), ("norm1.bias", (1280,))]
    shapes, used, i = [], 0, 0
    while used < total_bytes:
        kind, shape = kinds[i % len(kinds)]
        n = 1
        for d in shape:
            n *= d
        if used + 2 * n > total_bytes:
            shape, n = ((total_bytes - used) // 2 or 1,), (total_bytes - used) // 2 or 1
        shapes.append((f"{prefix}.blocks.{i // len(kinds)}.{kind}", shape))
        used += 2 * n
        i += 1
    return shapes


def build(workdir, unet_mb):
    """The pipeline's blobs and small files under workdir/pipeline-{unet_mb}M (made once)."""
    import numpy as np
    from safetensors.numpy import save_file

    root = os.path.join(workdir, f"pipeline-{unet_mb}M")
    done = os.path.join(root, "done")
    if os.path.exists(done):
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "blobs"))
    rng = np.random.default_rng(36)
    sizes = {"unet": unet_mb << 20, "vae": max(1, unet_mb // 12) << 20, "text_encoder": max(1, unet_mb // 5) << 20}
    for folder, name, _ in COMPONENTS:
        tensors = {}
        for tensor, shape in tensor_shapes(sizes[folder], folder):
            tensors[tensor] = rng.integers(0, 1 << 15, size=shape, dtype=np.uint16).view(np.float16)
        print(f"writing {folder}: {sizes[folder] >> 20} MiB", flush=True)
        save_file(tensors, os.path.join(root, "blobs", f"{folder}.safetensors"))
    open(done, "w").close()
    return root


def small_files():
    """The pipeline's small files: path -> bytes."""
    index = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0",
             "scheduler": ["diffusers", "PNDMScheduler"], "tokenizer": ["transformers", "CLIPTokenizer"]}
    files = {"scheduler/scheduler_config.json": {"_class_name": "PNDMScheduler", "num_train_timesteps": 1000},
             "tokenizer/tokenizer_config.json": {"model_max_length": 77}}
    for folder, _, config in COMPONENTS:
        index[folder] = ["diffusers" if folder != "text_encoder" else "transformers", config.get("_class_name", "")]
        files[f"{folder}/config.json"] = config
    files["model_index.json"] = index
    return {path: json.dumps(doc, indent=1).encode() for path, doc in files.items()}


# A snapshot's name in the Hugging Face cache: a commit hash (any 40 hex digits).
SNAPSHOT_REV = "5eed2" + "0" * 35


@contextlib.contextmanager
def cache_repo():
    """A Hugging Face cache repository folder, models--stfs-bench--pipeline, made empty: yields its
    blobs/ folder (for the checkpoints, or a mount point for slowfs serving them) and its one
    snapshot folder; removed after (anything mounted on blobs/ must be unmounted first)."""
    root = tempfile.mkdtemp(prefix="stfs-bench-cache-")
    repo = os.path.join(root, "models--stfs-bench--pipeline")
    blobs, snapshot = os.path.join(repo, "blobs"), os.path.join(repo, "snapshots", SNAPSHOT_REV)
    os.makedirs(blobs)
    os.makedirs(snapshot)
    try:
        yield blobs, snapshot
    finally:
        shutil.rmtree(root, ignore_errors=True)


def link_blobs(src_dir, blobs, names):
    """The files `names` of src_dir put in blobs/: hard links where both are on one filesystem, else copies."""
    for name in names:
        try:
            os.link(os.path.join(src_dir, name), os.path.join(blobs, name))
        except OSError:
            shutil.copyfile(os.path.join(src_dir, name), os.path.join(blobs, name))


def link_in_snapshot(blobs, blob, path):
    """`path` (in the snapshot) made a relative link to blobs/`blob`, as the cache links its files."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(os.path.relpath(os.path.join(blobs, blob), os.path.dirname(path)), path)


def pipeline_dir(snapshot, blobs):
    """The pipeline folder in `snapshot`: its small files, and its checkpoints linking to
    blobs/{folder}.safetensors; returns the folder."""
    for path, data in small_files().items():
        os.makedirs(os.path.join(snapshot, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(snapshot, path), "wb") as f:
            f.write(data)
    for folder, name, _ in COMPONENTS:
        link_in_snapshot(blobs, f"{folder}.safetensors", os.path.join(snapshot, folder, name))
    return snapshot


def load(root, workers):
    """The loader, in this process: configs, then every component's tensors (see the docstring)."""
    from safetensors import safe_open

    started = time.perf_counter()
    with open(os.path.join(root, "model_index.json")) as f:
        index = json.load(f)
    for part in index:
        if not part.startswith("_"):
            for name in os.listdir(os.path.join(root, part)):
                if name.endswith(".json"):
                    with open(os.path.join(root, part, name)) as f:
                        json.load(f)
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(os.path.join(root, folder, name), framework="numpy"))
                   for folder, name, _ in COMPONENTS]
        work = [(h, key) for h in handles for key in h.keys()]
        children = []
        for index_ in range(workers):
            pid = os.fork() if workers > 1 else 0
            if pid == 0:
                for handle, key in work[index_::workers]:
                    handle.get_tensor(key)
                if workers > 1:
                    os._exit(0)
            else:
                children.append(pid)
        failed = [p for p in children if os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) != 0]
        if failed:
            raise RuntimeError(f"{len(failed)} worker(s) failed")
    return time.perf_counter() - started


def run_load(root, workers):
    """Whole-process wall seconds of the loader run in a fresh interpreter."""
    started = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--load", root, "--workers", str(workers)], check=True,
                   stdout=subprocess.DEVNULL, timeout=STEP_TIMEOUT_S)
    return time.perf_counter() - started


def one_run(args, built, impl, workers):
    """One load through a fresh slowfs mount: directly, or through stfs's mount of the folder."""
    out = {}
    with cache_repo() as (blobs, snapshot), mounts.slowfs(args.slowfs, os.path.join(built, "blobs"),
                                                          args.slow_bandwidth_mbps, args.slow_latency_ms,
                                                          at=blobs) as slow:
        folder = pipeline_dir(snapshot, slow.path)
        before = mounts.slowfs_stats(slow.path)
        if impl == "direct":
            out["total"] = run_load(folder, workers)
        else:
            with stfs_mount(args.stfs, folder) as (mnt, seconds):
                out["total"] = seconds + run_load(mnt, workers)
        after = mounts.slowfs_stats(slow.path)
    out["bytes"] = after["bytes"] - before["bytes"]
    out["requests"] = after["range_requests"] - before["range_requests"]
    return out


@contextlib.contextmanager
def stfs_mount(binary, folder):
    """`stfs mount FOLDER MNT` (returns once ready), timed; unmounted after."""
    with mounts.temp_mountpoint("stfs") as mnt:
        started = time.perf_counter()
        subprocess.run([binary, "mount", folder, mnt, *STFS_OPTS], check=True, timeout=120,
                       stdout=subprocess.DEVNULL)
        try:
            yield mnt, time.perf_counter() - started
        finally:
            mounts.force_unmount(mnt, [binary, "umount", mnt])


def verify(args, built):
    """Every re-served checkpoint of a mount of the pipeline hashes like its blob."""
    sources = os.path.join(built, "blobs")
    with cache_repo() as (blobs, snapshot):
        link_blobs(sources, blobs, [f"{folder_}.safetensors" for folder_, _, _ in COMPONENTS])
        with stfs_mount(args.stfs, pipeline_dir(snapshot, blobs)) as (mnt, _):
            verify_mount(mnt, sources)


def verify_mount(mnt, sources):
    """Raises unless every component's re-served checkpoint in `mnt` hashes like its source."""
    for folder_, name, _ in COMPONENTS:
        if file_sha256(os.path.join(mnt, folder_, name)) != file_sha256(os.path.join(sources, f"{folder_}.safetensors")):
                raise RuntimeError(f"{folder_}/{name}: the re-served checkpoint differs from the source")


# --loader diffusers: a real DDPMPipeline, loaded by diffusers itself.

def _off_bench_path():
    """Drops this folder from sys.path before torch is imported: its profile.py would shadow the
    standard library's, which torch._dynamo imports through cProfile."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

def build_ddpm(root, width):
    """In the torch python: a DDPMPipeline with random weights saved under root/tree, its checkpoints
    moved to root/blobs (root/links.json: path in the tree -> blob name)."""
    _off_bench_path()
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(36)
    unet = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=2,
                       block_out_channels=(width, 2 * width, 4 * width, 4 * width),
                       down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"))
    print(f"UNet2DModel: {sum(p.numel() for p in unet.parameters()) / 1e6:.1f} M parameters", flush=True)
    tree = os.path.join(root, "tree")
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler()).save_pretrained(tree, safe_serialization=True)
    os.makedirs(os.path.join(root, "blobs"))
    links = {}
    for dirpath, _, names in os.walk(tree):
        for name in names:
            if name.endswith(".safetensors"):
                rel = os.path.relpath(os.path.join(dirpath, name), tree)
                links[rel] = rel.replace("/", "--")
                os.rename(os.path.join(tree, rel), os.path.join(root, "blobs", links[rel]))
    with open(os.path.join(root, "links.json"), "w") as f:
        json.dump(links, f, indent=1)


def built_ddpm(args):
    """The DDPM pipeline under workdir/pipeline-ddpm-w{width} (built once, in a fresh torch process)."""
    root = os.path.join(args.workdir, f"pipeline-ddpm-w{args.unet_width}")
    if os.path.exists(os.path.join(root, "done")):
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    subprocess.run([args.python, __file__, "--build-ddpm", root, "--unet-width", str(args.unet_width)],
                   check=True, timeout=BUILD_TIMEOUT_S)
    open(os.path.join(root, "done"), "w").close()
    return root


def ddpm_dir(built, snapshot, blobs):
    """A copy of the DDPM pipeline's tree in `snapshot`, its checkpoints linking to their blobs in
    blobs/ (a cache repository's, cache_repo); returns the folder."""
    shutil.rmtree(snapshot)
    shutil.copytree(os.path.join(built, "tree"), snapshot)
    for rel, blob in ddpm_links(built).items():
        link_in_snapshot(blobs, blob, os.path.join(snapshot, rel))
    return snapshot


def ddpm_links(built):
    """The DDPM pipeline's checkpoints: path in the tree -> blob name (links.json)."""
    with open(os.path.join(built, "links.json")) as f:
        return json.load(f)


def load_diffusers(folder, digest):
    """In the torch python: `DiffusionPipeline.from_pretrained(folder)`, timed, then every weight read
    once (one byte per 4 KiB page of every state_dict tensor: safetensors maps the checkpoint, so
    from_pretrained returns before most of it is read, and the rest comes from storage on first use),
    timed; with `digest`, the sha256 of every component's state_dict (names and bytes, in name order)."""
    _off_bench_path()
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging

    logging.disable_progress_bar()
    started = time.perf_counter()
    pipe = DiffusionPipeline.from_pretrained(folder)
    out = {"seconds": time.perf_counter() - started}
    modules = {name: c for name, c in sorted(pipe.components.items()) if isinstance(c, torch.nn.Module)}
    for component in modules.values():
        for tensor in component.state_dict().values():
            int(tensor.detach().contiguous().view(-1).view(torch.uint8)[::4096].sum())
    out["touched seconds"] = time.perf_counter() - started
    if digest:
        for name, component in modules.items():
            h = hashlib.sha256()
            state = component.state_dict()
            for key in sorted(state):
                h.update(key.encode())
                h.update(state[key].detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
            out[f"{name} sha256"] = h.hexdigest()
            out[f"{name} tensors"] = len(state)
    return out


def run_diffusers(args, folder, digest=False):
    """(whole-process wall seconds, the loader's JSON) of a fresh from_pretrained process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", DIFFUSERS_VERBOSITY="error", TRANSFORMERS_VERBOSITY="error")
    cmd = [args.python, __file__, "--load-diffusers", folder] + (["--digest"] if digest else [])
    started = time.perf_counter()
    proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env, timeout=STEP_TIMEOUT_S)
    seconds = time.perf_counter() - started
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def verify_diffusers(args, built):
    """The pipeline from `stfs mount` of a folder linking to the local blobs and from the folder itself
    give every component's state_dict the same sha256."""
    with cache_repo() as (blobs, snapshot):
        link_blobs(os.path.join(built, "blobs"), blobs, list(ddpm_links(built).values()))
        folder = ddpm_dir(built, snapshot, blobs)
        _, direct = run_diffusers(args, folder, digest=True)
        with stfs_mount(args.stfs, folder) as (mnt, _):
            _, mounted = run_diffusers(args, mnt, digest=True)
    digests = {k: v for k, v in direct.items() if not k.endswith("seconds")}
    if digests != {k: v for k, v in mounted.items() if not k.endswith("seconds")} or not digests:
        raise RuntimeError(f"from_pretrained through the mount differs: {mounted} vs {direct}")
    return digests


def one_diffusers_run(args, built, impl):
    """One from_pretrained through a fresh slowfs mount: directly, or through stfs's mount of the folder."""
    out = {}
    with cache_repo() as (blobs, snapshot), mounts.slowfs(args.slowfs, os.path.join(built, "blobs"),
                                                          args.slow_bandwidth_mbps, args.slow_latency_ms,
                                                          at=blobs) as slow:
        folder = ddpm_dir(built, snapshot, slow.path)
        before = mounts.slowfs_stats(slow.path)
        if impl == "direct":
            wall, loaded = run_diffusers(args, folder)
            out["process"], out["call"], out["touched"] = wall, loaded["seconds"], loaded["touched seconds"]
        else:
            with stfs_mount(args.stfs, folder) as (mnt, seconds):
                wall, loaded = run_diffusers(args, mnt)
                out["process"], out["call"] = seconds + wall, seconds + loaded["seconds"]
                out["touched"] = seconds + loaded["touched seconds"]
                out["mount"] = seconds
        after = mounts.slowfs_stats(slow.path)
    out["bytes"] = after["bytes"] - before["bytes"]
    out["requests"] = after["range_requests"] - before["range_requests"]
    return out


def main_diffusers(args):
    args.unet_width = args.unet_width or (32 if args.quick else 224)
    if not os.access(args.python, os.X_OK):
        raise SystemExit(f"pipeline.py: {args.python}: no torch virtualenv (scripts/torch_venv makes one)")
    built = built_ddpm(args)
    with open(os.path.join(built, "links.json")) as f:
        blobs = list(json.load(f).values())
    total = sum(os.path.getsize(os.path.join(built, "blobs", b)) for b in blobs)
    res = Results("p-diffusers",
                  f"DiffusionPipeline.from_pretrained of a DDPMPipeline folder (UNet2DModel, width "
                  f"{args.unet_width}, fp32), {total / 2**20:.0f} MiB of checkpoints, slowfs "
                  f"{args.slow_bandwidth_mbps:g} MB/s per handle, {args.slow_latency_ms:g} ms per request")
    digests = verify_diffusers(args, built)
    res.note(f"from_pretrained through the mount and from the folder: equal state_dict sha256 {digests}")
    for rep in range(args.reps):
        for impl in (["direct", "stfs"] if rep % 2 == 0 else ["stfs", "direct"]):
            run = one_diffusers_run(args, built, impl)
            res.add(f"{impl} whole process", run["process"])
            res.add(f"{impl} from_pretrained call", run["call"])
            res.add(f"{impl} from_pretrained + every weight read", run["touched"])
            if "mount" in run:
                res.add(f"{impl} mount (in the rows above)", run["mount"])
            res.add(f"{impl} range requests", run["requests"], "")
            res.add(f"{impl} storage bytes / checkpoint bytes", run["bytes"] / total, "")
            print(f"rep {rep + 1} {impl}: {run['process']:.2f} s process, {run['call']:.2f} s from_pretrained, "
                  f"{run['touched']:.2f} s with every weight read, {run['requests']} requests", flush=True)
    res.ratio_check("whole process, stfs vs direct (speed-up)", "direct whole process", "stfs whole process", 1.0)
    res.ratio_check("from_pretrained + every weight read, stfs vs direct (speed-up)",
                    "direct from_pretrained + every weight read", "stfs from_pretrained + every weight read", 1.0)
    res.ratio_check("from_pretrained call alone, stfs vs direct (speed-up)", "direct from_pretrained call",
                    "stfs from_pretrained call", 1.0)
    res.note("stfs rows add the mount; 'whole process' (fresh interpreter: torch and diffusers imports, "
             "from_pretrained, every weight read, exit) is the headline")
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loader", choices=["file", "diffusers"], default="file",
                   help="file: the numpy safe_open loader (default); diffusers: DiffusionPipeline.from_pretrained")
    p.add_argument("--unet-mb", type=int, help="UNet checkpoint size in MiB (default 1024; --quick: 32)")
    p.add_argument("--unet-width", type=int,
                   help="--loader diffusers: the UNet's first block_out_channels (default 224, a 1.15 GiB "
                        "fp32 checkpoint; --quick: 32)")
    p.add_argument("--python", default=TORCH_PYTHON, help="--loader diffusers: a python with torch and diffusers")
    p.add_argument("--reps", type=int, help="repetitions (default 3; --quick: 1)")
    p.add_argument("--quick", action="store_true", help="smoke run: small UNet, one repetition, not judged")
    p.add_argument("--slow-bandwidth-mbps", type=float, default=200.0)
    p.add_argument("--slow-latency-ms", type=float, default=10.0)
    p.add_argument("--stfs", default=cargo_paths.binary("stfs"))
    p.add_argument("--slowfs", default=cargo_paths.binary("slowfs", example=True))
    p.add_argument("--workdir", default="/var/tmp/stfs-bench")
    p.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    p.add_argument("--clean", action="store_true", help="delete the pipelines built under --workdir and exit")
    p.add_argument("--load", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--build-ddpm", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--load-diffusers", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--digest", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.load:
        print(json.dumps({"seconds": load(args.load, args.workers)}))
        return
    if args.build_ddpm:
        build_ddpm(args.build_ddpm, args.unet_width)
        return
    if args.load_diffusers:
        print(json.dumps(load_diffusers(args.load_diffusers, args.digest)))
        return
    if args.clean:
        for name in os.listdir(args.workdir) if os.path.isdir(args.workdir) else []:
            if name.startswith("pipeline-"):
                shutil.rmtree(os.path.join(args.workdir, name))
        return
    args.reps = args.reps or (1 if args.quick else 3)
    report.JUDGED = not args.quick
    for tool in (args.stfs, args.slowfs):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"pipeline.py: {tool}: not built (cargo build --release --bin stfs --example slowfs)")
    if args.loader == "diffusers":
        res = main_diffusers(args)
        report.print_results(res, sys.stdout)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "results": res.to_json()}, f, indent=1)
        return
    args.unet_mb = args.unet_mb or (32 if args.quick else 1024)
    built = build(args.workdir, args.unet_mb)
    total = sum(os.path.getsize(os.path.join(built, "blobs", f"{f}.safetensors")) for f, _, _ in COMPONENTS)
    res = Results("p", f"diffusers pipeline folder, UNet {args.unet_mb} MiB, {total / 2**20:.0f} MiB of checkpoints, "
                       f"slowfs {args.slow_bandwidth_mbps:g} MB/s per handle, {args.slow_latency_ms:g} ms per request")
    verify(args, built)
    res.note("every re-served checkpoint's sha256 equals its source's")
    for rep in range(args.reps):
        for mode, (label, workers) in MODES.items():
            impls = ["direct", "stfs"] if rep % 2 == 0 else ["stfs", "direct"]
            for impl in impls:
                run = one_run(args, built, impl, workers)
                name = f"{impl} {label}"
                res.add(name, run["total"])
                res.add(f"{name} range requests", run["requests"], "")
                res.add(f"{name} storage bytes / checkpoint bytes", run["bytes"] / total, "")
                print(f"rep {rep + 1} {name}: {run['total']:.2f} s, {run['requests']} requests", flush=True)
    for mode, (label, _) in MODES.items():
        res.ratio_check(f"({mode}) stfs vs direct (speed-up)", f"direct {label}", f"stfs {label}",
                        1.5 if mode == "i" else 10.0)
    res.note("whole-process wall seconds of the loader; stfs rows add the mount")
    report.print_results(res, sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": res.to_json()}, f, indent=1)


if __name__ == "__main__":
    main()
