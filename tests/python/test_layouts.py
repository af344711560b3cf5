"""Model repositories as they are laid out, loaded for real from a mount (issue 36): a diffusers pipeline
(DDPMPipeline: a tiny UNet2DModel with random weights in unet/, a DDPMScheduler in scheduler/) and a
sentence-transformers model (a tiny BERT with 1_Pooling/ and a 2_Dense/ module holding its own
safetensors), made by the test with save_pretrained / save (no download), mounted with `stfs mount DIR`
and `stfs mount hf://ORG/REPO` (the test hub: nginx on loopback, reached through HF_ENDPOINT), and loaded
with the libraries' own from_pretrained / SentenceTransformer(PATH): the same images for the same seed,
the same embeddings, as loaded from the folder.

scripts/test runs this file in the virtualenv of tests/python/requirements-torch.txt (torch, diffusers,
sentence-transformers). Without them the tests skip, except under CI=true, where they fail.
"""
import importlib
import json
import os
import shutil

import pytest

from conftest import mounted, tool_missing
from test_hub import SHA, publish
from test_remote import nginx  # noqa: F401 (a fixture)

INSTALL = "scripts/test installs it into its virtualenv: pip install -r tests/python/requirements-torch.txt"
SENTENCES = ["the cat sat on the mat", "a dog", "the mat sat on a cat"]


def need(module):
    try:
        return importlib.import_module(module)
    except ImportError:
        tool_missing(module, INSTALL)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing is ever fetched from the real hub: every model here is made by the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def save_tiny_pipeline(saved):
    """A DDPMPipeline with a tiny UNet2DModel, its random weights from a fixed seed, saved at `saved` with
    save_pretrained; returns the pipeline."""
    torch = need("torch")
    diffusers = need("diffusers")
    torch.manual_seed(1234)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4)
    pipe = diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(num_train_timesteps=10))
    pipe.save_pretrained(saved)
    return pipe


@pytest.fixture
def pipeline_dir(tmp_path):
    """A DDPMPipeline with a tiny random UNet2DModel, saved as diffusers saves it."""
    saved = tmp_path / "pipe"
    save_tiny_pipeline(saved)
    assert files_under(saved) == ["model_index.json", "scheduler/scheduler_config.json", "unet/config.json",
                                  "unet/diffusion_pytorch_model.safetensors"], files_under(saved)
    return saved


def images(path):
    """The images DDPMPipeline.from_pretrained(path) makes for a fixed seed."""
    torch = need("torch")
    diffusers = need("diffusers")
    pipe = diffusers.DDPMPipeline.from_pretrained(str(path))
    out = pipe(batch_size=2, generator=torch.Generator().manual_seed(7), num_inference_steps=4, output_type="np")
    return out.images, pipe


def check_pipeline(mp, saved):
    np = need("numpy")
    want, _ = images(saved)
    got, pipe = images(mp)
    assert got.shape == want.shape == (2, 8, 8, 3)
    assert np.array_equal(got, want)
    # The weights came from the mount's component, byte for byte.
    meta = json.loads(open(os.path.join(mp, "metadata.json")).read())
    assert meta["components"] == [{"path": "unet", "tensors": len(pipe.unet.state_dict()), "shards": 1}], meta
    unet_meta = json.loads(open(os.path.join(mp, "unet", "metadata.json")).read())
    assert set(unet_meta["tensors"]) == set(pipe.unet.state_dict())


@pytest.fixture
def st_dir(tmp_path):
    """A sentence-transformers model: a tiny random BERT (its tokenizer from a hand-written vocabulary),
    mean pooling (1_Pooling/) and a Dense module (2_Dense/, its own model.safetensors)."""
    torch = need("torch")
    transformers = need("transformers")
    st = need("sentence_transformers")
    st_models = need("sentence_transformers.sentence_transformer.modules")
    torch.manual_seed(99)
    bert = tmp_path / "bert"
    bert.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    (bert / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(bert / "vocab.txt"))
    config = transformers.BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    transformer = st_models.Transformer(str(bert))
    modules = [transformer, st_models.Pooling(transformer.get_embedding_dimension()),
               st_models.Dense(in_features=16, out_features=4)]
    saved = tmp_path / "st"
    st.SentenceTransformer(modules=modules, device="cpu").save(str(saved))
    listed = files_under(saved)
    for wanted in ["model.safetensors", "modules.json", "1_Pooling/config.json", "2_Dense/model.safetensors",
                   "2_Dense/config.json"]:
        assert wanted in listed, listed
    return saved


def embeddings(path):
    st = need("sentence_transformers")
    return st.SentenceTransformer(str(path), device="cpu").encode(SENTENCES)


def check_sentence_transformers(mp, saved):
    np = need("numpy")
    want = embeddings(saved)
    got = embeddings(mp)
    assert got.shape == want.shape == (len(SENTENCES), 4)
    assert np.array_equal(got, want)
    meta = json.loads(open(os.path.join(mp, "metadata.json")).read())
    assert meta["components"] == [{"path": "2_Dense", "tensors": 2, "shards": 1}], meta["components"]
    assert "1_Pooling/config.json" in [f["path"] for f in meta["repo_files"]], meta["repo_files"]


def test_a_diffusers_pipeline_loads_from_a_mount_of_its_folder(pipeline_dir):
    with mounted(pipeline_dir) as mp:
        check_pipeline(mp, pipeline_dir)


def test_a_sentence_transformers_model_loads_from_a_mount_of_its_folder(st_dir):
    with mounted(st_dir) as mp:
        check_sentence_transformers(mp, st_dir)


def test_the_dense_module_is_read_from_the_mount(st_dir):
    """The mount's 2_Dense/ is what the model is built from: changed weights in the source folder's
    2_Dense/model.safetensors give other embeddings through a new mount (so the equality above is
    not a model built from defaults)."""
    np = need("numpy")
    safetensors_torch = need("safetensors.torch")
    with mounted(st_dir) as mp:
        before = embeddings(mp)
    dense = st_dir / "2_Dense" / "model.safetensors"
    state = safetensors_torch.load_file(str(dense))
    safetensors_torch.save_file({k: v * 2 for k, v in state.items()}, str(dense))
    with mounted(st_dir) as mp:
        after = embeddings(mp)
    assert not np.array_equal(before, after)


def publish_folder(root, repo, folder):
    files = {}
    for relative in files_under(folder):
        files[relative] = (lambda src: lambda path: shutil.copyfile(src, path))(os.path.join(folder, relative))
    publish(root, repo, files)


def test_both_layouts_load_through_hf_names(pipeline_dir, st_dir, nginx, monkeypatch):  # noqa: F811
    root, base, _ = nginx
    monkeypatch.setenv("HF_ENDPOINT", base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    publish_folder(root, "org/pipe", pipeline_dir)
    publish_folder(root, "org/st", st_dir)
    with mounted("hf://org/pipe") as mp:
        check_pipeline(mp, pipeline_dir)
    with mounted(f"hf://org/st@{SHA}") as mp:
        check_sentence_transformers(mp, st_dir)
