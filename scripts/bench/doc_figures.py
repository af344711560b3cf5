#!/usr/bin/env python3
"""Writes docs/bench-data/*.json: the latest documented figures, transcribed from the tables of
docs/notes/ into the shape `run.py --json` writes, so that `scripts/charts` draws the results page's
charts. The runs behind those tables kept no JSON in the repository, so these files hold each
series' median and, where the table gives it, min and max; "values" (the repetitions) is empty.
Each file's "from" names the table. A new run's own `--json` output replaces a file here.

    python3 scripts/bench/doc_figures.py && scripts/charts
"""

import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VM = "2-vCPU AMD EPYC VM, shared"


def s(median, lo=None, hi=None):
    return {"unit": "s", "values": [], "median": median, "min": lo, "max": hi}


FILES = {
    "s3": {
        "from": "docs/notes/remote-benchmarks.md, 'The whole model from a ready loader' (2026-11-26)",
        "note": f"python3 scripts/bench/s3.py --reps 5; 1 GiB, S3 on loopback, 20 ms/request, 100 MiB/s per connection; {VM}; 2026-11-26",
        # The headline chart leaves out rclone mount (65 s) and the one-tensor row, which would flatten it.
        "charts": [{"key": "whole", "name": "whole", "title": "Whole 1 GiB model from S3, fresh mount (seconds, lower is faster)",
                    "series": ["stfs s3://", "ceiling: 16 curl range GETs, no mount", "rclone copy, then load", "s3fs + safe_open"]}],
        "scenarios": {"whole": {"title": "Whole 1 GiB model from S3, fresh mount (lower is faster)", "series": {
            "stfs s3://": s(1.226, 1.155, 1.326),
            "stfs, one 16 MiB tensor": s(0.099),
            "ceiling: 16 curl range GETs, no mount": s(0.781, 0.741, 0.864),
            "rclone copy, then load": s(4.707),
            "s3fs + safe_open": s(9.288, 9.185, 9.417),
            "rclone mount + safe_open": s(65.068, 64.493, 65.631),
        }}},
    },
    "slow": {
        "from": "docs/notes/benchmarks.md, 'Loaders on the re-served checkpoint file' (2026-11-23)",
        "note": f"python3 scripts/bench/run.py --reps 3 --only g --slow-size-mb 1024; slowfs 200 MB/s, 10 ms/request; {VM}",
        "scenarios": {
            "file-order": {"title": "safe_open of every tensor, 1 GiB on slow storage, one process", "series": {
                "stfs (re-served model.safetensors)": s(2.16, 1.88, 2.19),
                "safe_open directly on the slow mount": s(6.52, 6.44, 8.48),
            }},
            "workers": {"title": "the same, 4 workers forked after safe_open", "series": {
                "stfs (re-served model.safetensors)": s(3.04, 3.02, 3.09),
                "safe_open directly on the slow mount": s(53.4, 52.1, 56.0),
            }},
        },
    },
    "loaders": {
        "from": "docs/notes/benchmarks.md, 'Loader peers, side by side', the rerun after the readahead fixes (2026-11-25, main at 81422c0)",
        "note": f"$(scripts/torch_venv) scripts/bench/loaders.py --size-mb 256 --reps 5; 253 MiB into CPU torch tensors; {VM}",
        "scenarios": {
            "slowfs": {"title": "Loaders, 253 MiB from slow storage (slowfs 200 MB/s, 10 ms/request)", "series": {
                "stfs.load": s(1.057, 0.915, 1.134),
                "Run:ai streamer": s(3.295, 3.201, 4.215),
                "fastsafetensors": s(7.239),
                "safetensors load_file": s(8.938),
            }},
            "s3": {"title": "Loaders, 253 MiB from S3 (20 ms/request, 100 MiB/s per connection)", "series": {
                "stfs.load": s(0.984, 0.919, 0.991),
                "Run:ai streamer": s(1.394, 1.293, 1.529),
            }},
            "page": {"title": "Loaders, 253 MiB from the page cache", "series": {
                "stfs.load": s(0.740, 0.622, 0.774),
                "safetensors load_file": s(0.611, 0.507, 0.674),
                "fastsafetensors": s(0.898),
                "Run:ai streamer": s(1.072, 0.790, 1.224),
            }},
        },
    },
}


def main():
    out = os.path.join(REPO, "docs", "bench-data")
    os.makedirs(out, exist_ok=True)
    for name, doc in FILES.items():
        for result in doc["scenarios"].values():
            for series in result["series"].values():
                series["median"] = float(series["median"])
        path = os.path.join(out, f"{name}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
