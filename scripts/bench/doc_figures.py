#!/usr/bin/env python3
"""Writes docs/bench-data/*.json: the latest documented figures, transcribed from the tables of
docs/notes/ into the shape `run.py --json` writes, so that `scripts/charts` draws the results page's
charts. The runs behind those tables kept no JSON in the repository, so these files hold each
series' median and, where the table gives it, min and max; "values" (the repetitions) is empty.
Each file's "from" names the table. A new run's own `--json` output replaces a file here.

    python3 scripts/bench/doc_figures.py && scripts/charts

docs/bench-data/loaders.json is not transcribed: it is loaders.py's own --json output of the runs
docs/performance.md quotes, merged (--loaders: every source of each file, its key the source, or
SOURCE-USE under --use light or full; the peers' time series under their readable names). An input
may be a merged document itself (the current loaders.json): a later input's source replaces an
earlier one's of the same key, so one new run redraws its own charts and keeps the others:

    python3 scripts/bench/doc_figures.py --loaders docs/bench-data/loaders.json light.json full.json remote.json
    python3 scripts/bench/doc_figures.py --loaders docs/bench-data/loaders.json docs/bench-data/loaders.json pagefull.json
"""

import argparse
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

}


#: loaders.py's peer names -> the names charted (the rows of docs/performance.md's loader table).
LOADER_NAMES = {"stfs.load": "stfs.load (no mount)", "runai": "Run:ai streamer", "fastsafe": "fastsafetensors",
                "load_file": "safetensors load_file", "stfs.load mounted": "stfs.load (mounted)",
                "ceiling": "ceiling: 16 curl range GETs, no loader",
                "touch floor mapped": "floor: no loader, pre-mapped"}


SHORT_SOURCES = {"page": "page cache", "cold": "not in the page cache", "slow": "slowfs", "s3": "S3 via the proxy"}


def merge_loaders(out, inputs):
    """One chartable document of several loaders.py --json files (or merged documents, as this
    writes): each source's peer time series, the last input's where two give the same source."""
    sources, charts, runs = {}, {}, {}
    for path in inputs:
        with open(path) as f:
            run = json.load(f)
        if "args" not in run:  # a merged document: its sources as they are, each with its run's note
            for name, source in run["sources"].items():
                sources[name] = source
                charts[name] = next(c for c in run["charts"] if c["key"] == name)
                runs[name] = source.get("run") or run["notes"][list(run["sources"]).index(name)]
            continue
        use = run["args"].get("use", "sum")
        note = f"{os.path.basename(path)}: {run['machine']}; args {json.dumps(run['args'], sort_keys=True)}"
        for key, result in run["sources"].items():
            name = key if use == "sum" else f"{key}-{use}"
            series = {LOADER_NAMES[k]: v for k, v in result["series"].items() if k in LOADER_NAMES}
            size = result["title"].split(",")[0]  # "2048 MiB"
            title = f"Loaders, {size}, {SHORT_SOURCES.get(key, key)}" + ("" if use == "sum" else f", {use} use")
            sources[name] = {"title": title, "series": series, "checks": result["checks"]}
            charts[name] = {"key": name, "name": name, "title": f"{title} (seconds, lower is faster)",
                            "series": [n for n in LOADER_NAMES.values() if n in series]}
            runs[name] = note
    for name, source in sources.items():
        source["run"] = runs[name]
    notes = list(dict.fromkeys(runs.values()))  # each run once, in the order of its first source
    doc = {"from": "scripts/bench/loaders.py --json, merged by doc_figures.py --loaders", "notes": notes,
           "sources": sources, "charts": list(charts.values()),
           "note": f"scripts/bench/loaders.py --unprivileged, 2026-12-02 and later; {VM}"}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(out)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loaders", nargs="+", metavar=("OUT", "RUN"), help="merge loaders.py --json runs into OUT")
    args = p.parse_args()
    if args.loaders:
        if len(args.loaders) < 2:
            p.error("--loaders OUT RUN...: at least one run")
        return merge_loaders(args.loaders[0], args.loaders[1:])
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
