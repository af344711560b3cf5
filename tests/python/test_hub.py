"""Cross-check of `hf://` names: repositories laid out as the hub serves them (the revision API's JSON,
`resolve/SHA/PATH` files) on a real nginx on loopback, reached through `HF_ENDPOINT`, files written by the
reference `safetensors` package, mounted with `stfs mount hf://...` and compared byte for byte; the mount as a
model directory (its `config.json` read with `json`, and with transformers' `AutoConfig` where transformers is
installed)."""
import importlib.util
import json
import os

import pytest
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


CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100, "architectures": ["LlamaForCausalLM"]}


def test_a_repo_mount_is_a_model_directory(nginx, monkeypatch):  # noqa: F811
    root, base, _ = nginx
    monkeypatch.setenv("HF_ENDPOINT", base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(root / "no-home"))
    source = publish(root, "org/llama", {
        "config.json": lambda p: p.write_text(json.dumps(CONFIG, indent=2)),
        "generation_config.json": lambda p: p.write_text(json.dumps({"max_length": 20})),
        "pytorch_model.bin": lambda p: p.write_bytes(b"not served"),
        ".gitattributes": lambda p: p.write_text("*.bin filter=lfs"),
        "model.safetensors": lambda p: save_file(tensors("model.layers", 2), str(p)),
    })
    with mounted("hf://org/llama", "--block-size", "64K") as mp:
        with open(os.path.join(mp, "config.json")) as f:
            assert json.load(f) == CONFIG
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            with open(os.path.join(mp, name), "rb") as f, open(source / name, "rb") as g:
                assert f.read() == g.read(), name
        assert not os.path.exists(os.path.join(mp, "pytorch_model.bin"))
        assert not os.path.exists(os.path.join(mp, ".gitattributes"))
        with open(os.path.join(mp, "metadata.json")) as f:
            listed = [file["path"] for file in json.load(f)["repo_files"]]
        assert listed == ["config.json", "generation_config.json"]
        if importlib.util.find_spec("transformers") is None:
            pytest.skip("transformers is not installed: AutoConfig.from_pretrained on the mount not tried "
                        "(the config.json checks above passed)")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(mp)
        assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 64, 2)
