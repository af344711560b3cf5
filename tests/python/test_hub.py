"""Cross-check of `hf://` names: repositories laid out as the hub serves them (the revision API's JSON,
`resolve/SHA/PATH` files) on a real nginx on loopback, reached through `HF_ENDPOINT`, files written by the
reference `safetensors` package, mounted with `stfs mount hf://...` and compared byte for byte."""
import json
import os

from safetensors.numpy import save_file

from conftest import mounted
from test_remote import nginx, reference_bytes, served_name, tensors  # noqa: F401 (nginx is a fixture)

SHA = "0123456789abcdef0123456789abcdef01234567"


def publish(root, repo, files):
    """Writes `files` ({path: writer(path)}) at commit SHA of `repo`, with `main` pointing at it."""
    base = root / repo / "resolve" / SHA
    siblings = []
    for name, write in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        siblings.append({"rfilename": name, "size": path.stat().st_size})
    api = root / "api" / "models" / repo / "revision"
    api.mkdir(parents=True)
    for revision in ("main", SHA):
        (api / revision).write_text(json.dumps({"id": repo, "sha": SHA, "siblings": siblings}))
    return base


def assert_exact(mp, files):
    for file in files:
        for name, (_, _, data) in reference_bytes(file).items():
            with open(os.path.join(mp, served_name(name)), "rb") as f:
                assert f.read() == data, name


def test_reference_repos_by_hub_name(nginx, monkeypatch):  # noqa: F811
    root, base, log = nginx
    monkeypatch.setenv("HF_ENDPOINT", base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(root / "no-home"))
    single = publish(root, "org/single", {
        "config.json": lambda p: p.write_text("{}"),
        "model.safetensors": lambda p: save_file(tensors("layer", 4), str(p), metadata={"format": "np"}),
    })
    with mounted("hf://org/single", "--block-size", "64K") as mp:
        assert_exact(mp, [single / "model.safetensors"])

    groups = {"model-00001-of-00002.safetensors": tensors("a", 3), "model-00002-of-00002.safetensors": tensors("b", 2)}
    weight_map = {name: file for file, group in groups.items() for name in group}
    files = {file: (lambda g: lambda p: save_file(g, str(p)))(group) for file, group in groups.items()}
    files["model.safetensors.index.json"] = lambda p: p.write_text(json.dumps({"weight_map": weight_map}))
    sharded = publish(root, "org/sharded", files)
    with mounted("hf://org/sharded@main", "--block-size", "64K") as mp:
        assert_exact(mp, [sharded / file for file in groups])
    assert f"/org/sharded/resolve/{SHA}/model-00002-of-00002.safetensors" in log.read_text()
