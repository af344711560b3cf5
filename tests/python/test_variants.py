"""Every checkpoint of a model repository at its path (issue 45), loaded for real from a mount: a diffusers
DDPMPipeline saved with save_pretrained(dir) and, beside it, its UNet saved with variant="fp16" and a small
max_shard_size (a sharded fp16 component: diffusion_pytorch_model.safetensors.index.fp16.json and
diffusion_pytorch_model.fp16-0000N-of-0000M.safetensors), a tiny transformers GPT-2 saved plain, with
variant="fp16" and, sharded, with variant="bf16", and a repository with consolidated.safetensors beside its
shards. Each loads from the mount, with and without variant=, as from the folder (the same images, the same
logits, the same tensors), through `stfs mount DIR` and `stfs mount hf://ORG/REPO` (the test hub: nginx on
loopback, reached through HF_ENDPOINT); every other checkpoint's tensors are also files in
%.checkpoints/NAME/. Every model is made by the test (no download).

scripts/test runs this file in the virtualenv of tests/python/requirements-torch.txt (torch, diffusers,
transformers). Without them the tests skip, except under CI=true, where they fail.
"""
import json
import os

import pytest

from conftest import mounted
from test_layouts import files_under, need, offline, publish_folder, save_tiny_pipeline  # noqa: F401 (a fixture)
from test_remote import nginx  # noqa: F401 (a fixture)

FP16_SHARDS = ["unet/diffusion_pytorch_model.fp16-00001-of-00003.safetensors",
               "unet/diffusion_pytorch_model.fp16-00002-of-00003.safetensors",
               "unet/diffusion_pytorch_model.fp16-00003-of-00003.safetensors"]


@pytest.fixture
def variant_pipeline_dir(tmp_path):
    """A DDPMPipeline with a tiny random UNet2DModel saved as diffusers saves it, and its UNet in fp16
    saved beside it as the fp16 variant, in three shards."""
    torch = need("torch")
    saved = tmp_path / "pipe"
    pipe = save_tiny_pipeline(saved)
    pipe.unet.to(torch.float16).save_pretrained(saved / "unet", variant="fp16", max_shard_size="30KB")
    assert files_under(saved) == sorted([
        "model_index.json", "scheduler/scheduler_config.json", "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.safetensors.index.fp16.json",
        *FP16_SHARDS]), files_under(saved)
    return saved


def pipeline_run(path, **kwargs):
    """The images DDPMPipeline.from_pretrained(path, **kwargs) makes for a fixed seed, and its UNet's
    weights."""
    torch = need("torch")
    diffusers = need("diffusers")
    pipe = diffusers.DDPMPipeline.from_pretrained(str(path), **kwargs)
    out = pipe(batch_size=1, generator=torch.Generator().manual_seed(7), num_inference_steps=2, output_type="np")
    return out.images, pipe.unet.state_dict()


def same_state(got, want):
    torch = need("torch")
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


def check_variant_pipeline(mp, saved):
    np = need("numpy")
    torch = need("torch")
    for kwargs in [{}, {"variant": "fp16", "dtype": torch.float16}]:
        want, want_state = pipeline_run(saved, **kwargs)
        got, got_state = pipeline_run(mp, **kwargs)
        assert got.shape == want.shape == (1, 8, 8, 3)
        assert np.array_equal(got, want), kwargs
        same_state(got_state, want_state)
        if kwargs:
            assert next(iter(got_state.values())).dtype == torch.float16
            fp16_state = want_state
    # Every file of the component at its path, byte for byte; the variant's tensors in %.checkpoints/.
    for name in ["unet/diffusion_pytorch_model.safetensors.index.fp16.json", *FP16_SHARDS]:
        with open(os.path.join(mp, name), "rb") as f, open(saved / name, "rb") as g:
            assert f.read() == g.read(), name
    unet = json.loads(open(os.path.join(mp, "unet", "metadata.json")).read())
    assert [(c["path"], c["variant"]) for c in unet["checkpoints"]] == [
        (".", None), ("%.checkpoints/diffusion_pytorch_model.fp16", "fp16")], unet["checkpoints"]
    other = os.path.join(mp, "unet", "%.checkpoints", "diffusion_pytorch_model.fp16")
    meta = json.loads(open(os.path.join(other, "metadata.json")).read())
    assert len(meta["shards"]) == 3
    for name, info in meta["tensors"].items():
        assert info["dtype"] == "F16"
        with open(os.path.join(other, info["path"]), "rb") as f:
            data = f.read()
        assert data == fp16_state[name].contiguous().view(torch.uint8).numpy().tobytes(), name


def test_a_pipeline_with_a_sharded_fp16_variant_loads_from_a_mount(variant_pipeline_dir):
    with mounted(variant_pipeline_dir) as mp:
        check_variant_pipeline(mp, variant_pipeline_dir)


def tiny_gpt2(seed):
    """A tiny GPT-2 (its config made here), its random weights from `seed`."""
    torch = need("torch")
    transformers = need("transformers")
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


@pytest.fixture
def variant_transformers_dir(tmp_path):
    """A tiny random GPT-2 (its config made here) saved plain, as the fp16 variant, and as the bf16 variant
    in shards."""
    torch = need("torch")
    model = tiny_gpt2(seed=5)
    saved = tmp_path / "gpt2"
    model.save_pretrained(saved)
    model.to(torch.float16).save_pretrained(saved, variant="fp16")
    model.to(torch.bfloat16).save_pretrained(saved, variant="bf16", max_shard_size="4KB")
    listed = files_under(saved)
    assert "model.fp16.safetensors" in listed and "model.safetensors.index.bf16.json" in listed, listed
    assert any(name.startswith("model.bf16-00002-of-") for name in listed), listed
    return saved


def logits(path, **kwargs):
    torch = need("torch")
    transformers = need("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    with torch.no_grad():
        return model(torch.tensor([[1, 2, 3, 4]])).logits, model.state_dict()


def check_variant_transformers(mp, saved):
    torch = need("torch")
    for kwargs in [{}, {"variant": "fp16"}, {"variant": "bf16"}, {"variant": "fp16", "dtype": torch.float16}]:
        want, want_state = logits(saved, **kwargs)
        got, got_state = logits(mp, **kwargs)
        assert torch.equal(got, want), kwargs
        same_state(got_state, want_state)
    top = json.loads(open(os.path.join(mp, "metadata.json")).read())
    variants = {c["name"]: c["variant"] for c in top["checkpoints"]}
    assert variants == {"model": None, "model.bf16": "bf16", "model.fp16": "fp16"}, top["checkpoints"]
    # metadata.json's rule still holds: `files` maps the folder's tensor files, `checkpoint_files` every
    # other file it serves (a shard of its own with "shard", another checkpoint's with "checkpoint").
    served = {f["path"]: f for f in top["checkpoint_files"]}
    for name in files_under(saved):
        if name.endswith(".safetensors") or name.endswith(".json") and ".safetensors.index." in name:
            assert name in served, (name, served)
            with open(os.path.join(mp, name), "rb") as f, open(saved / name, "rb") as g:
                assert f.read() == g.read(), name
    assert [f["path"] for f in top["checkpoint_files"] if "shard" in f] == ["model.safetensors"]
    for path in top["files"]:
        assert os.path.isfile(os.path.join(mp, path)) and path not in served


def test_transformers_variants_load_from_a_mount(variant_transformers_dir):
    with mounted(variant_transformers_dir) as mp:
        check_variant_transformers(mp, variant_transformers_dir)


@pytest.fixture
def consolidated_dir(tmp_path):
    """A repository as Mistral's ship: the transformers checkpoint in shards with its index, and
    consolidated.safetensors (the same weights under other names) beside them."""
    safetensors_torch = need("safetensors.torch")
    model = tiny_gpt2(seed=6)
    saved = tmp_path / "mistralish"
    model.save_pretrained(saved, max_shard_size="8KB")
    consolidated = {f"layers.{name}": t.clone().contiguous() for name, t in model.state_dict().items()
                    if name != "lm_head.weight"}
    safetensors_torch.save_file(consolidated, str(saved / "consolidated.safetensors"))
    assert "model.safetensors.index.json" in files_under(saved), files_under(saved)
    return saved


def check_consolidated(mp, saved):
    torch = need("torch")
    safetensors_torch = need("safetensors.torch")
    want, _ = logits(saved)
    got, _ = logits(mp)
    assert torch.equal(got, want)
    # Both checkpoints served: consolidated.safetensors at its path, byte for byte, and its tensors.
    with open(os.path.join(mp, "consolidated.safetensors"), "rb") as f, open(saved / "consolidated.safetensors", "rb") as g:
        assert f.read() == g.read()
    reference = safetensors_torch.load_file(str(saved / "consolidated.safetensors"))
    other = os.path.join(mp, "%.checkpoints", "consolidated")
    meta = json.loads(open(os.path.join(other, "metadata.json")).read())
    assert set(meta["tensors"]) == set(reference)
    for name, info in meta["tensors"].items():
        with open(os.path.join(other, info["path"]), "rb") as f:
            assert f.read() == reference[name].view(torch.uint8).numpy().tobytes(), name
    top = json.loads(open(os.path.join(mp, "metadata.json")).read())
    assert [(c["path"], c["variant"]) for c in top["checkpoints"]] == [(".", None), ("%.checkpoints/consolidated", None)]


def test_consolidated_beside_shards_serves_both(consolidated_dir):
    with mounted(consolidated_dir) as mp:
        check_consolidated(mp, consolidated_dir)


def test_every_checkpoint_loads_through_hf_names(variant_pipeline_dir, variant_transformers_dir, consolidated_dir,
                                                  nginx, monkeypatch):  # noqa: F811
    root, base, _ = nginx
    monkeypatch.setenv("HF_ENDPOINT", base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    publish_folder(root, "org/pipe16", variant_pipeline_dir)
    publish_folder(root, "org/gpt2", variant_transformers_dir)
    publish_folder(root, "org/mistralish", consolidated_dir)
    with mounted("hf://org/pipe16") as mp:
        check_variant_pipeline(mp, variant_pipeline_dir)
    with mounted("hf://org/gpt2") as mp:
        check_variant_transformers(mp, variant_transformers_dir)
    with mounted("hf://org/mistralish") as mp:
        check_consolidated(mp, consolidated_dir)
