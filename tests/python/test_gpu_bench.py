"""scripts/bench/gpu.py's summary, judged without a GPU: a missed target or a missing row makes the
run fail with a line naming it, a partial row says so instead of showing figures, and slowfs's limit
is labelled per open file. Pure functions of the runs: no torch, no mount."""
import importlib.util
import os
import sys
import types

from conftest import ROOT


def _import_gpu():
    """scripts/bench/gpu.py as a module, with sys.path left as it was: gpu.py puts scripts/bench first
    on it, where profile.py would shadow the standard library's (cProfile, which transformers imports,
    then breaks for every later test of the session)."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("stfs_bench_gpu", os.path.join(ROOT, "scripts", "bench", "gpu.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


gpu = _import_gpu()

SIZE = 1 << 30


def args(device="cuda", reps=2):
    return types.SimpleNamespace(device=device, reps=reps, slow_bandwidth_mbps=200.0, slow_latency_ms=10.0)


def runs(**seconds):
    return {loader: [{"seconds": s, "device_name": "H100", "storage_bytes": SIZE, "opens": 3} for s in times]
            for loader, times in seconds.items()}


def table(kind, rs, device="cuda", reps=2):
    lines = []
    figures = gpu.report(args(device, reps), kind, {"file_size": SIZE}, rs, lines.append)
    return dict(figures, reps=reps), "\n".join(lines)


def test_met_targets_and_every_row_pass():
    page, text = table("page", runs(stfs=[1.0, 1.0], safetensors=[1.2, 1.3], runai=[1.1, 1.4]))
    slow, _ = table("slow", runs(stfs=[1.0, 1.0], safetensors=[3.5, 3.1], runai=[2.0, 2.0]))
    assert "MET" in text and "MISSED" not in text, text
    assert gpu.problems(["stfs", "safetensors", "runai"], {}, {"page": page, "slow": slow}) == []


def test_a_missed_target_fails_naming_it():
    page, text = table("page", runs(stfs=[1.0, 1.0], safetensors=[0.8, 0.9]))
    slow, _ = table("slow", runs(stfs=[1.0, 1.0], safetensors=[2.0, 2.5]))
    bad = gpu.problems(["stfs", "safetensors"], {}, {"page": page, "slow": slow})
    assert any(line.startswith("target MISSED (page): stfs >= 1.0x the best of the others (safetensors)") for line in bad), bad
    assert any(line.startswith("target MISSED (slow): stfs >= 3x the reference (safetensors): 2.25x") for line in bad), bad
    assert "MISSED" in text


def test_a_dropped_peer_row_fails_naming_it():
    page, _ = table("page", runs(stfs=[1.0, 1.0], safetensors=[1.5, 1.5]))
    bad = gpu.problems(["stfs", "safetensors", "runai"], {"runai": "runai-model-streamer cannot be imported"}, {"page": page})
    assert bad == ["dropped row: runai (runai-model-streamer cannot be imported)"], bad


def test_a_row_cut_short_has_no_figures_and_fails():
    rs = runs(stfs=[1.0, 1.0], safetensors=[1.5])
    page, text = table("page", rs)
    assert "no figure: 1 of 2 run(s) done" in text, text
    assert gpu.problems(["stfs", "safetensors"], {}, {"page": page}) == [
        "dropped row: safetensors from page (1 of 2 runs)",
        "target MISSED (page): stfs >= 1.0x the best of the others: not measured",  # no complete peer to judge against
    ]
    # Without a complete stfs row no target can be judged on a GPU: that is a miss, not a pass.
    page, text = table("page", runs(stfs=[1.0], safetensors=[1.5, 1.5]))
    bad = gpu.problems(["stfs", "safetensors"], {}, {"page": page})
    assert any("MISSED (page)" in line and "not measured" in line for line in bad), bad


def test_the_cpu_smoke_run_judges_no_target_but_still_counts_rows():
    page, text = table("page", runs(stfs=[1.0, 1.0], safetensors=[0.1, 0.1]), device="cpu")
    assert "not judged" in text and "MISSED" not in text, text
    assert gpu.problems(["stfs", "safetensors"], {}, {"page": page}) == []
    assert gpu.problems(["stfs", "safetensors", "runai"], {"runai": "x"}, {"page": page}) == ["dropped row: runai (x)"]


def test_the_slow_table_says_the_limit_is_per_open_file_and_counts_opens():
    _, text = table("slow", runs(stfs=[1.0, 1.0], safetensors=[3.5, 3.5]))
    assert "per open file, no total cap: favours loaders that open many streams" in text, text
    assert "opens 3" in text, text
