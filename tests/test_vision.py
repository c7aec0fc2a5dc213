"""Vision-language GRPO: images in the data, the processor's prompts, the packed training forward with pixel
values, vLLM's multimodal sampling and weight sync, and a training run with images.

The model is `plugrl prepare-model Idefics3-SmolLM2-135M-test` (the ``test_vlm`` fixture): SmolLM2-135M's text
weights with a small randomly initialised vision encoder. It is for tests: no VLM weights are available offline.
"""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from PIL import Image

from plugrl.config import DataConfig
from plugrl.data import DataError, load_samples, row_to_sample
from plugrl.prompts import encode_prompts
from plugrl.specs import Registry
from plugrl_vision import PixelInputs, VisionProcessor, content_parts, count_places, load_image

QUESTION = "<image>How many red squares are there?"


def _image(color: str = "red", size: tuple[int, int] = (40, 30)) -> Image.Image:
    return Image.new("RGB", size, color)


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _row(images, prompt=None, **extra):
    return {
        "prompt": prompt or [{"role": "user", "content": QUESTION}],
        "images": images,
        "ground_truth": "1",
        "data_source": "math",
        **extra,
    }


def _cfg(**kw) -> DataConfig:
    return DataConfig(**kw)


# ---- data ------------------------------------------------------------------------------------


def test_an_image_reads_from_every_form_a_dataset_holds(tmp_path):
    img = _image("blue")
    (tmp_path / "pics").mkdir()
    img.save(tmp_path / "pics" / "a.png")
    forms = {
        "PIL": img,
        "bytes": _png(img),
        "relative path": "pics/a.png",
        "absolute path": str(tmp_path / "pics" / "a.png"),
        "datasets Image dict (bytes)": {"bytes": _png(img), "path": None},
        "datasets Image dict (path)": {"bytes": None, "path": "pics/a.png"},
    }
    for what, value in forms.items():
        got = load_image(value, what, base_dir=tmp_path)
        assert got.mode == "RGB" and got.size == (40, 30), what
        assert got.getpixel((3, 3)) == (0, 0, 255), what


def test_relative_image_paths_are_read_beside_the_file_each_row_came_from(tmp_path, monkeypatch):
    """data.train_files naming a directory whose files sit in subfolders: each row's relative paths are read in
    its own file's folder, whatever the working directory."""
    for sub, color in (("a", "red"), ("b", "green")):
        (tmp_path / "data" / sub / "pics").mkdir(parents=True)
        _image(color).save(tmp_path / "data" / sub / "pics" / "x.png")
        (tmp_path / "data" / sub / "train.jsonl").write_text(json.dumps(_row(["pics/x.png"])) + "\n")
    monkeypatch.chdir(tmp_path / "data" / "a")  # where a cwd-relative read would find the wrong picture
    samples, _ = load_samples(_cfg(train_files=[str(tmp_path / "data")]), Registry())
    assert [s.images[0].open().getpixel((1, 1)) for s in samples] == [(255, 0, 0), (0, 128, 0)]


def test_rows_carry_their_images_in_the_order_of_their_places(tmp_path):
    red, green = _image("red"), _image("green")
    red.save(tmp_path / "red.png")
    green.save(tmp_path / "green.png")
    rows = [
        _row(["red.png", {"path": "green.png"}], prompt=[{"role": "user", "content": "<image> and <image>: which?"}]),
        # TRL's VLM datasets: one `image` column, {"type": "image"} parts
        {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count."}]}],
            "image": green,
            "ground_truth": "1",
            "data_source": "math",
        },
        # the image written inside its content part
        {
            "prompt": [
                {"role": "user", "content": [{"type": "image", "image": _png(red)}, {"type": "text", "text": "?"}]}
            ],
            "ground_truth": "1",
            "data_source": "math",
        },
    ]
    (tmp_path / "train.jsonl").write_text(json.dumps(rows[0]) + "\n")
    samples, _ = load_samples(_cfg(train_files=[str(tmp_path / "train.jsonl")]), Registry())
    first = samples[0]
    assert [im.open().getpixel((0, 0)) for im in first.images] == [(255, 0, 0), (0, 128, 0)]
    assert first.prompt[0]["content"] == "<image> and <image>: which?"
    second = row_to_sample(rows[1], "mem row 1", _cfg())
    assert second.prompt[0]["content"] == "<image>Count." and len(second.images) == 1
    third = row_to_sample(rows[2], "mem row 2", _cfg())
    assert third.images[0].open().getpixel((0, 0)) == (255, 0, 0)
    # TRL's field mapping: a plain question and an image column; the image goes in front of the question
    mapped = row_to_sample(
        {"problem": "How many?", "image": red, "answer": "1", "data_source": "math"},
        "mem row 4",
        _cfg(question_field="problem", answer_field="answer"),
    )
    assert mapped.prompt == [{"role": "user", "content": "<image>How many?"}] and len(mapped.images) == 1
    text_only = row_to_sample({"prompt": "2+2?", "ground_truth": "4", "data_source": "math"}, "mem row 3", _cfg())
    assert text_only.images == []


def test_verl_parquet_rows_with_image_bytes_load(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [
            {
                "prompt": [{"role": "user", "content": QUESTION}],
                "images": [{"bytes": _png(_image("red")), "path": None}],
                "data_source": "math",
                "reward_model": {"ground_truth": "1", "style": "rule"},
            }
        ]
    )
    pq.write_table(table, tmp_path / "train.parquet")
    samples, _ = load_samples(_cfg(train_files=[str(tmp_path / "train.parquet")]), Registry())
    assert samples[0].images[0].open().getpixel((1, 1)) == (255, 0, 0)
    assert samples[0].ground_truth == "1"


@pytest.mark.parametrize(
    ("images", "prompt", "expected"),
    [
        (["missing.png"], None, "train.jsonl line 1: images\\[0\\]: image file .*missing.png' does not exist"),
        (["bad.png"], None, "train.jsonl line 1: images\\[0\\]: image .*bad.png' cannot be decoded"),
        ([123], None, "images\\[0\\]: an image must be a PIL image, bytes, a path"),
        ([{"note": 1}], None, "an image dict needs 'bytes' or 'path'"),
        ([], [{"role": "user", "content": "<image><image>Compare."}], "marks 2 image place.* but the row has 0 image"),
        (["ok.png", "ok.png"], None, "marks 1 image place.* but the row has 2 image"),
        (["ok.png"], [{"role": "user", "content": "No place for it."}], "marks 0 image place.* has 1 image"),
    ],
)
def test_bad_images_are_one_error_naming_the_file_and_row(tmp_path, images, prompt, expected):
    _image().save(tmp_path / "ok.png")
    (tmp_path / "bad.png").write_text("not an image")
    row = _row(images, prompt)
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=expected):
        load_samples(_cfg(train_files=[str(tmp_path / "train.jsonl")]), Registry())


def test_with_skip_invalid_a_bad_image_row_is_skipped_and_counted(tmp_path):
    _image().save(tmp_path / "ok.png")
    rows = [_row(["ok.png"]), _row(["missing.png"]), _row(["ok.png", "ok.png"]), _row(["ok.png"])]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples, counts = load_samples(_cfg(train_files=[str(tmp_path / "train.jsonl")], skip_invalid=True), Registry())
    assert len(samples) == 2 and counts["data/invalid_rows"] == 2


def test_an_image_key_no_row_has_is_an_error_and_freezing_a_text_models_tower_is_named(tmp_path, caplog, tiny_model):
    from plugrl.config import build_config
    from plugrl.startup import load_processor

    (tmp_path / "train.jsonl").write_text(json.dumps(_row([], prompt="How many?") | {"pics": ["a.png"]}) + "\n")
    cfg = _cfg(train_files=[str(tmp_path / "train.jsonl")], image_key="pictures")
    with pytest.raises(DataError, match="data.image_key='pictures': no row of .* has images in that field"):
        load_samples(cfg, Registry())
    tree = {"model": {"path": str(tiny_model)}, "data": {"train_files": ["x.jsonl"]}}
    run = build_config(tree | {"actor": {"freeze_vision_tower": False}})
    with caplog.at_level("WARNING", logger="plugrl.startup"):
        assert load_processor(run) is None
    assert "actor.freeze_vision_tower=false is not acted on" in caplog.text


def test_content_parts_place_the_images_where_the_text_marks_them():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A <image> then <image>."}]
    assert count_places(messages) == 2
    assert content_parts(messages)[1]["content"] == [
        {"type": "text", "text": "A "},
        {"type": "image"},
        {"type": "text", "text": " then "},
        {"type": "image"},
        {"type": "text", "text": "."},
    ]
    assert content_parts(messages)[0]["content"] == [{"type": "text", "text": "Be brief."}]


# ---- prompts ---------------------------------------------------------------------------------


def _image_prompts(test_vlm, images, **data):
    processor = VisionProcessor.load(str(test_vlm))
    samples = [row_to_sample(_row([im]), f"mem row {i}", _cfg(**data)) for i, im in enumerate(images)]
    return processor, encode_prompts(samples, _cfg(**data), processor.tokenizer, None, processor)[0]


def test_image_prompts_give_the_engine_one_token_per_image_and_the_model_its_expansion(test_vlm):
    processor, (prompt,) = _image_prompts(test_vlm, [_image()])
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert prompt.engine_ids.count(image_id) == 1
    assert prompt.ids.count(image_id) == 16  # (64 / 8)^2 patches, pixel-shuffled by 2
    assert len(prompt.ids) == len(prompt.engine_ids) + 18  # + the <fake_token_around_image><global-img> wrapping
    assert prompt.pixels.pixel_values.shape == (1, 3, 64, 64)
    assert prompt.engine_prompt.model_ids == prompt.ids and prompt.engine_prompt.ids == prompt.engine_ids
    assert "<|im_start|>user\n<image>How many" in prompt.text


def test_prompts_keep_image_paths_not_pixels_and_make_the_pixels_per_step(test_vlm, tmp_path):
    """A dataset's images are never all held decoded: a sample keeps each image as its row holds it (here a path),
    an encoded prompt keeps no tensor, and its pixel inputs are made again, the same, whenever a step asks."""
    (tmp_path / "pics").mkdir()
    _image("green").save(tmp_path / "pics" / "a.png")
    (tmp_path / "train.jsonl").write_text(json.dumps(_row(["pics/a.png"])) + "\n")
    samples, _ = load_samples(_cfg(train_files=[str(tmp_path / "train.jsonl")]), Registry())
    (image,) = samples[0].images
    assert image.value == "pics/a.png" and image.base_dir == tmp_path
    processor = VisionProcessor.load(str(test_vlm))
    (prompt,), _ = encode_prompts(samples, _cfg(), processor.tokenizer, None, processor)
    assert not [k for k, v in vars(prompt).items() if isinstance(v, torch.Tensor)]
    first, second = prompt.pixels, prompt.pixels
    assert first is not second and torch.equal(first.pixel_values, second.pixel_values)
    _, _, at_encode = processor.encode(prompt.text, [image.open()], add_special_tokens=prompt.special_tokens)
    assert torch.equal(first.pixel_values, at_encode.pixel_values)
    engine = prompt.engine_prompt
    assert engine.images[0].getpixel((1, 1)) == (0, 128, 0)
    assert torch.equal(engine.pixels.pixel_values, first.pixel_values)


def test_an_overlong_image_prompt_is_never_cut(test_vlm):
    with pytest.raises(DataError, match="a prompt with images is never cut"):
        _image_prompts(test_vlm, [_image()], max_prompt_length=40, filter_overlong_prompts=False, truncation="left")


def test_images_for_a_text_model_are_an_error_at_start(smol_tokenizer):
    sample = row_to_sample(_row([_image()]), "data.jsonl line 3", _cfg())
    with pytest.raises(DataError, match="data.jsonl line 3: the row has 1 image.*model.path is a text model"):
        encode_prompts([sample], _cfg(), smol_tokenizer, None)


# ---- the training forward ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vlm_policy(test_vlm):
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    return PolicyModel(
        str(test_vlm), ModelConfig(path=str(test_vlm), dtype="float32"), ActorConfig(), torch.device("cpu")
    )


def _direct_logprobs(model, prompt, response):
    """Log-probs of ``response`` after an image prompt, from one plain transformers forward."""
    ids = torch.tensor([prompt.ids + response])
    with torch.no_grad():
        logits = model(input_ids=ids, **PixelInputs.model_kwargs([prompt.pixels], torch.device("cpu"))).logits[0]
    logits = logits[len(prompt.ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_the_packed_forward_reads_each_prompts_own_pixels(test_vlm, vlm_policy):
    from plugrl.actor import TrainBatch

    _, prompts = _image_prompts(test_vlm, [_image("red"), _image("green", (20, 50))])
    responses = [[28, 339, 1230], [504, 17], [2, 11, 42, 7], [19]]
    owner = [0, 0, 1, 1]  # two responses per prompt: the packed row holds each prompt once
    batch = TrainBatch.from_sequences(
        [prompts[o].ids + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o].ids) for o in owner],
        group_ids=owner,
        pixels=[prompts[o].pixels for o in owner],
    )
    packed = vlm_policy.compute_logprobs(batch, temperature=1.0, token_budget=1024)
    model = vlm_policy.model
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        torch.testing.assert_close(packed[i, : len(r)], _direct_logprobs(model, prompts[o], r), atol=1e-4, rtol=0)
    # the pixels reach the model: the other image changes the log-probs of the same tokens
    swapped = TrainBatch.from_sequences(
        batch.sequences, batch.prompt_lens, group_ids=owner, pixels=[prompts[1 - o].pixels for o in owner]
    )
    other = vlm_policy.compute_logprobs(swapped, temperature=1.0, token_budget=1024)
    assert (other[0, :3] - packed[0, :3]).abs().max() > 1e-3


def test_a_forward_without_images_still_gives_the_connector_a_gradient(vlm_policy, test_vlm):
    """Under FSDP2 every rank reduces the gradients of the same parameters: a micro-batch without images (a text
    row, or the dummy row of a rank without sequences) runs one blank image through the encoder and connector,
    which changes no log-prob and leaves a zero gradient where there would be none."""
    from plugrl.actor import TrainBatch

    tok = VisionProcessor.load(str(test_vlm)).tokenizer
    ids = tok("What is 2 + 2?")["input_ids"]
    batch = TrainBatch.from_sequences([ids + [28, 339]], [len(ids)])
    model = vlm_policy.model
    with torch.no_grad():
        plain, _, _ = vlm_policy._run(batch, [0])  # no gradient: no blank image
    for idx in ([0], []):  # a text row, and the dummy row of a rank with nothing to train
        head, _, _ = vlm_policy._run(batch, idx)
        if idx:
            torch.testing.assert_close(head, plain, atol=1e-5, rtol=0)
        head.float().sum().backward()
        grad = dict(model.named_parameters())["model.connector.modality_projection.proj.weight"].grad
        assert grad is not None and not grad.any()
        model.zero_grad(set_to_none=True)


def test_the_vision_tower_does_not_train_unless_asked(test_vlm, vlm_policy):
    trained = {id(p) for group in vlm_policy.optimizer.param_groups for p in group["params"]}
    names = {n for n, p in vlm_policy.model.named_parameters() if id(p) in trained}
    assert not any(".vision_model." in n for n in names)
    assert any(".connector." in n for n in names) and any(".text_model." in n for n in names)
    assert "lm_head.weight" in names


# ---- vLLM ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vllm_samples_image_prompts_as_the_trainer_scores_them_also_after_a_sync(test_vlm):
    """vLLM expands the image token itself (one or two images a prompt): its prompt ids equal the processor's, its
    log-probs the training forward's (float32, as for text), and after a weight sync the image features come from
    the new weights (vLLM caches encoder outputs by image: the engine drops them at every sync)."""
    from transformers import AutoModelForImageTextToText

    from plugrl.rollout import SamplingSettings
    from test_vllm_engine import _vllm as small_vllm_engine

    processor, prompts = _image_prompts(test_vlm, [_image("red"), _image("green", (20, 50))])
    # and a prompt with two images
    two = row_to_sample(
        _row([_image("blue"), _image()], [{"role": "user", "content": "<image> or <image>?"}]), "r", _cfg()
    )
    prompts += encode_prompts([two], _cfg(), processor.tokenizer, None, processor)[0]
    engine = small_vllm_engine(test_vlm)
    greedy = SamplingSettings(n=1, max_tokens=6, temperature=0.0)
    model = AutoModelForImageTextToText.from_pretrained(test_vlm, dtype=torch.float32).eval()
    try:
        for prompt, (out,) in zip(prompts, engine.generate([p.engine_prompt for p in prompts], greedy), strict=True):
            assert out.prompt_ids == prompt.ids
            expected = _direct_logprobs(model, prompt, out.response_ids)
            torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)
        before = [g[0].response_ids for g in engine.generate([p.engine_prompt for p in prompts], greedy)]
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        torch.manual_seed(0)
        proj = "model.connector.modality_projection.proj.weight"
        weights[proj] = weights[proj] + 0.5 * torch.randn_like(weights[proj])
        engine.load_weights(weights.items())
        after = engine.generate([p.engine_prompt for p in prompts], greedy)
        model.load_state_dict(weights)
        for prompt, (out,) in zip(prompts, after, strict=True):
            expected = _direct_logprobs(model, prompt, out.response_ids)
            torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)
        assert [g[0].response_ids for g in after] != before
    finally:
        engine.close()


# ---- training --------------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_trains_on_images_with_vllm_checkpoints_the_processor_and_evaluates(tiny_vlm, tmp_path):
    """`plugrl train examples/vlm_grpo.yaml` on the tiny VLM with the real vLLM engine for 2 steps, then `plugrl
    eval` of its checkpoint and `plugrl report` of the run: the whole path a user takes."""
    from test_e2e import metrics, run_plugrl

    run_plugrl(
        [
            "train",
            "examples/vlm_grpo.yaml",
            f"model.path={tiny_vlm}",
            "model.dtype=float32",
            "data.train_batch_size=2",
            "rollout.n=4",
            "rollout.cpu_kv_cache_gb=0.25",
            "trainer.total_steps=2",
            "trainer.save_freq=2",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=vlm",
        ]
    )
    run = tmp_path / "vlm"
    m = metrics(run)
    assert [x["step"] for x in m] == [1, 2]
    assert all(x["actor/optimizer_steps"] >= 1 and x["prompt_length/mean"] > 18 for x in m)
    policy = run / "checkpoints" / "step_000002" / "policy"
    assert (policy / "processor_config.json").is_file() and (policy / "chat_template.jinja").is_file()
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert rows and all("How many red squares" in r["prompt"] for r in rows)
    out = run_plugrl(["eval", str(policy.parent), "data.dataset_options.size=4", "--split", "test"])
    assert re.search(r"val/all/prompts\s+4\.0000", out.stdout), out.stdout[-2000:]
    run_plugrl(["report", str(run)])
    assert (run / "report.png").is_file()


def train_on_two_ranks(tiny_vlm, tmp_path, *overrides: str) -> list[dict]:
    """`plugrl train examples/vlm_grpo.yaml` for 2 steps under torchrun with 2 gloo ranks (4 prompts a step) and
    ``overrides``; checks each step took one optimizer step and returns the run's metrics."""
    import subprocess

    from test_e2e import ROOT, metrics, tiny_overrides
    from test_fsdp import TORCHRUN

    cmd = [
        *TORCHRUN,
        "-m",
        "plugrl.cli",
        "train",
        "examples/vlm_grpo.yaml",
        *tiny_overrides(tiny_vlm, tmp_path, 2),
        "data.train_batch_size=4",
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [1, 2] and all(x["actor/optimizer_steps"] == 1 for x in m)
    return m


@pytest.mark.slow
def test_two_fsdp2_ranks_train_on_images(tiny_vlm, tmp_path):
    """torchrun with 2 gloo ranks: FSDP2 shards the tiny VLM's text layers (the vision encoder and connector in the
    root unit), each rank generates and trains on its half of the prompts with their images."""
    train_on_two_ranks(tiny_vlm, tmp_path)
    assert len((tmp_path / "e2e" / "rollouts" / "step_000001.jsonl").read_text().splitlines()) == 16
    assert (tmp_path / "e2e" / "checkpoints" / "step_000002" / "policy" / "processor_config.json").is_file()


@pytest.mark.slow
def test_images_train_one_step_off_policy(tiny_vlm, tmp_path):
    """trainer.off_policy_steps=1 with vLLM: the image prompts of step s+1 are generated on the rollout thread while
    step s trains (their pixels travel with the prompts), and the rollout correction weighs the one-step lag."""
    from test_e2e import metrics, run_plugrl, tiny_overrides

    overrides = ["trainer.off_policy_steps=1", "rollout.name=vllm", "rollout.cpu_kv_cache_gb=0.25"]
    run_plugrl(["train", "examples/vlm_grpo.yaml", *tiny_overrides(tiny_vlm, tmp_path, 3), *overrides])
    m = metrics(tmp_path / "e2e")
    assert [(x["step"], x["rollout/policy_lag"]) for x in m] == [(1, 0.0), (2, 1.0), (3, 1.0)]
    assert all(x["actor/optimizer_steps"] == 1 and "rollout_corr/logp_abs_diff_mean" in x for x in m)


# ---- rollout servers -----------------------------------------------------------------------------


def test_image_prompts_cross_the_wire_losslessly_and_bad_ones_are_refused_by_index():
    import base64

    from plugrl.rollout.types import ImagePrompt
    from plugrl_rollout_servers.server import RequestError, prompt_from_json, prompt_to_json

    img = Image.effect_noise((24, 16), 40).convert("RGB")  # every pixel differs: a lossy codec would show
    sent = prompt_to_json(ImagePrompt(ids=[1, 9, 2], images=[img, _image()], model_ids=[1, 9, 9, 9, 2], pixels=None))
    back = prompt_from_json(json.loads(json.dumps(sent)), 0)
    assert back.ids == [1, 9, 2] and back.model_ids == [1, 9, 9, 9, 2] and back.pixels is None
    assert back.images[0].tobytes() == img.tobytes() and back.images[0].size == (24, 16)
    assert prompt_from_json([5, 6], 1) == [5, 6] and prompt_to_json([5, 6]) == [5, 6]
    bad = [
        ({**sent, "images": ["not base64!"]}, r"prompts\[3\]: images\[0\] is not base64"),
        (
            {**sent, "images": [base64.b64encode(b"GIF89a junk").decode()]},
            r"prompts\[3\]: images\[0\]: image .* cannot",
        ),
        ({**sent, "images": []}, r"prompts\[3\]: 'images' must be a non-empty list"),
        ({"ids": [1], "images": sent["images"]}, r"prompts\[3\] must be a non-empty list of token ids, or an object"),
        ([], r"prompts\[3\] must be"),
    ]
    for body, message in bad:
        with pytest.raises(RequestError, match=message):
            prompt_from_json(body, 3)


@pytest.mark.slow
def test_a_server_without_a_vision_model_refuses_image_prompts_naming_its_engine(tiny_model, tmp_path):
    import plugrl_model_servers as servers
    from plugrl.rollout.types import ImagePrompt, SamplingSettings
    from plugrl_rollout_servers.remote import RemoteEngine, RemoteEngineError
    from plugrl_rollout_servers.server import prompt_to_json
    from test_rollout_server import _start

    server = _start(tiny_model, tmp_path)
    url = f"http://127.0.0.1:{server.port}"
    try:
        prompt = ImagePrompt(ids=[1, 2], images=[_image()], model_ids=[1, 2], pixels=None)
        assert prompt_to_json(prompt)["images"]
        with pytest.raises(RemoteEngineError, match=r"400: image prompts need a vision-language model .* hf engine"):
            RemoteEngine([url]).generate([prompt], SamplingSettings(n=1, max_tokens=2))
    finally:
        servers.stop(server.port)


@pytest.mark.slow
def test_a_vllm_rollout_server_samples_image_prompts_as_the_trainer_scores_them_across_updates(tiny_vlm, tmp_path):
    """rollout.mode=server with `plugrl rollout-serve` running vLLM on the tiny VLM (float32): the image prompts
    travel as PNGs, the weights after every update through shared memory; the server's sampled log-probs match
    the trainer's recomputed ones to float tolerance at every step while the policy moves."""
    import os

    import plugrl_model_servers as servers
    from plugrl.cli import main
    from test_e2e import ROOT, metrics, tiny_overrides
    from test_rollout_server import _start

    server = _start(tiny_vlm, tmp_path, "rollout.name=vllm", "rollout.cpu_kv_cache_gb=0.25")
    url = f"http://127.0.0.1:{server.port}"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        args = [
            "train",
            "examples/vlm_grpo.yaml",
            *tiny_overrides(tiny_vlm, tmp_path, 3),
            "trainer.save_freq=0",
            "actor.optim.lr=1e-3",
            "rollout.mode=server",
            "rollout.name=vllm",
            f"rollout.server_urls=[{url}]",
            "algorithm.rollout_correction.mode=monitor",
        ]
        assert main(args) == 0
        health = json.loads(__import__("urllib.request").request.urlopen(url + "/health", timeout=10).read())
    finally:
        os.chdir(cwd)
        servers.stop(server.port)
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [1, 2, 3] and all(x["actor/optimizer_steps"] == 1 for x in m)
    assert all(x["prompt_length/mean"] > 18 for x in m)  # the image tokens are in the trained prompts
    diffs = [x["rollout_corr/logp_abs_diff_mean"] for x in m]
    assert max(diffs) < 1e-4, diffs
    assert health["engine"] == "vllm" and health["weights_version"] == 4
