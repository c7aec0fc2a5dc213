"""plugrl-vision, the package beside the kernel that knows images: the kernel finds it through the entry-point group
``plugrl.vision`` (:func:`plugrl.vlm.vision_support`), a text run never imports it, and without it a run that needs
it is refused at start, naming the package."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap

import pytest

import plugrl_vision
from plugrl.config import ConfigError, DataConfig, build_config
from plugrl.data import DataError, load_samples
from plugrl.specs import Registry
from plugrl.vlm import NoVisionSupport, VisionSupport, vision_support

INSTALL = (
    r"plugrl-vision, which is not installed: pip install plugrl-vision "
    r"\(in a plugrl checkout: pip install -e plugins/vision\)"
)


@pytest.fixture
def without_vision(hide_entry_points, without_config_fields):
    """As if plugrl-vision were not installed: its entry points and config keys are hidden (the kit's lookup is
    cached per process); plugrl.local_models is plugrl-commands' too (SmolLM2), which this test does not need."""
    hide_entry_points("plugrl.vision", "plugrl.local_models")
    without_config_fields("plugrl-vision")
    vision_support.cache_clear()
    yield
    vision_support.cache_clear()


def _text_row(content: str = "How many?", **extra) -> dict:
    return {"prompt": [{"role": "user", "content": content}], "ground_truth": "1", "data_source": "math", **extra}


def test_the_kernel_finds_plugrl_vision_and_it_has_every_call_of_the_seam():
    vision_support.cache_clear()
    assert vision_support() is plugrl_vision
    calls = [n for n, f in vars(VisionSupport).items() if not n.startswith("_") and inspect.isfunction(f)]
    assert {"row_images", "load_processor", "mrope_positions", "model_kwargs", "check_config"} <= set(calls)
    for name in calls:  # the same parameters, by name and order, as the kernel calls them
        wanted = list(inspect.signature(getattr(VisionSupport, name)).parameters)[1:]
        got = list(inspect.signature(getattr(plugrl_vision, name)).parameters)
        assert got[: len(wanted)] == wanted, name


def test_without_plugrl_vision_a_vision_language_model_is_refused_at_start_naming_it(without_vision, test_vlm):
    from plugrl.startup import load_processor

    with pytest.raises(NoVisionSupport, match=INSTALL):
        vision_support()
    cfg = build_config({"model": {"path": str(test_vlm)}, "data": {"train_files": ["x.jsonl"]}})
    with pytest.raises(ConfigError, match=rf"model.path={test_vlm} is a vision-language model: .*{INSTALL}"):
        load_processor(cfg)


def test_without_plugrl_vision_the_local_test_vlm_is_refused_naming_it(without_vision):
    from plugrl.models import resolve_model_path

    with pytest.raises(ConfigError, match=rf"model.path 'local:Idefics3-SmolLM2-135M-test': .*{INSTALL}"):
        resolve_model_path("local:Idefics3-SmolLM2-135M-test")


def test_without_plugrl_vision_data_image_key_is_refused_and_a_text_run_needs_nothing(without_vision, tiny_model):
    from plugrl.startup import load_processor

    tree = {"model": {"path": str(tiny_model)}, "data": {"train_files": ["x.jsonl"]}}
    assert load_processor(build_config(tree)) is None
    with pytest.raises(ConfigError, match=rf"data.image_key is a key of the package {INSTALL}"):
        build_config(tree | {"data": {"train_files": ["x.jsonl"], "image_key": "pictures"}})
    with pytest.raises(ConfigError, match=rf"actor.freeze_vision_tower is a key of the package {INSTALL}"):
        build_config(tree, ["actor.freeze_vision_tower=false"])


def test_without_plugrl_vision_text_rows_load_and_a_row_with_images_names_it(without_vision, tmp_path):
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps(_text_row()) + "\n")
    samples, _ = load_samples(DataConfig(train_files=[str(text)]), Registry())
    assert samples[0].images == []
    # a text prompt still may not mark a place it has no image for: the kernel counts the places itself
    text.write_text(json.dumps(_text_row("<image>How many?")) + "\n")
    with pytest.raises(DataError, match="marks 1 image place.* but the row has 0 image"):
        load_samples(DataConfig(train_files=[str(text)]), Registry())
    pictures = tmp_path / "pictures.jsonl"
    for row in (_text_row("<image>How many?", images=["a.png"]), _text_row("<image>How many?", image="a.png")):
        pictures.write_text(json.dumps(row) + "\n")
        with pytest.raises(DataError, match=rf"pictures.jsonl line 1: the row has images: .*{INSTALL}"):
            load_samples(DataConfig(train_files=[str(pictures)]), Registry())


def test_without_plugrl_vision_a_rollout_server_refuses_image_prompts_naming_it(without_vision):
    server = pytest.importorskip("plugrl_rollout_servers.server")
    with pytest.raises(server.RequestError, match=rf"prompts\[0\]: .*{INSTALL}"):
        server.prompt_from_json({"ids": [1, 2], "model_ids": [1, 2], "images": ["aGk="]}, 0)


def test_an_import_of_the_old_module_names_where_it_went():
    from plugrl import api

    with pytest.raises(ModuleNotFoundError) as e:
        __import__("plugrl.vision")
    assert "import plugrl_vision (package plugrl-vision)" in api.import_hint(e.value, "0.2.0")


def test_a_text_run_imports_only_plugrl_visions_config_keys(tiny_model, tmp_path):
    """Load a text run's data and processor, build the policy and run its packed forward: of plugrl-vision only its
    config keys are imported (only a vision-language model or a row with images reaches the rest)."""
    (tmp_path / "train.jsonl").write_text(json.dumps(_text_row()) + "\n")
    script = textwrap.dedent(
        f"""
        import sys, torch
        from plugrl.actor import PolicyModel, TrainBatch
        from plugrl.config import ActorConfig, ModelConfig, build_config
        from plugrl.data import load_samples
        from plugrl.specs import Registry
        from plugrl.startup import load_processor

        path, data = {str(tiny_model)!r}, {str(tmp_path / "train.jsonl")!r}
        cfg = build_config({{"model": {{"path": path}}, "data": {{"train_files": [data]}}}})
        assert load_processor(cfg) is None
        samples, _ = load_samples(cfg.data, Registry())
        policy = PolicyModel(path, ModelConfig(path=path, dtype="float32"), ActorConfig(), torch.device("cpu"))
        batch = TrainBatch.from_sequences([[1, 2, 3, 4], [1, 2, 5]], [2, 2], group_ids=[0, 0])
        out = policy.compute_logprobs(batch, temperature=1.0, token_budget=64)
        assert out.shape == (2, 2) and torch.isfinite(out).all()
        print("imported:", sorted(m for m in sys.modules if m.startswith("plugrl_vision")))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # its config keys (data.image_key, actor.freeze_vision_tower) join every run's config; nothing else loads
    assert "imported: ['plugrl_vision', 'plugrl_vision.fields']" in done.stdout
