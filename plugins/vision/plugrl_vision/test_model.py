"""The small vision-language model for tests, ``local:Idefics3-SmolLM2-135M-test`` (``plugrl prepare-model
Idefics3-SmolLM2-135M-test``): SmolLM2-135M-Instruct's text weights with a small random vision encoder."""

from __future__ import annotations

from pathlib import Path

from plugrl.models import cache_dir, publish, resolve_model_path, scratch_beside, write_clean_config

NAME = "Idefics3-SmolLM2-135M-test"

# the chat template of the test VLM: SmolLM2's ChatML, with {"type": "image"} content parts as the image token
_VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VLM_IMAGE_SIZE = 64  # pixels a side: 8x8 patches of 8, pixel-shuffled by 2 into 16 image tokens


def prepare_test_vlm(out: Path | None = None) -> Path:
    """Write a small vision-language model for tests into ``out`` (default: the cache, where ``model.path:
    local:Idefics3-SmolLM2-135M-test`` finds it: entry point of the group ``plugrl.local_models``); returns the
    folder.

    **For tests, not a trained VLM.** No VLM weights are available offline, so this is the Idefics3
    architecture (SmolVLM's) with SmolLM2-135M-Instruct's text weights and a small *randomly initialised*
    vision encoder (2 layers, 128 wide, 64x64 images in 8x8 patches, 16 image tokens each) and connector,
    seeded so every machine builds the same weights. Its processor is Idefics3's without image splitting,
    with SmolLM2's ChatML chat template (``{"type": "image"}`` parts become ``<image>``). Four tokens join the
    vocabulary (the image token and its delimiters), their embeddings the mean of SmolLM2's; the LM head is
    untied (a copy of the embedding), as SmolVLM's is.
    """
    out = Path(out) if out else cache_dir() / "models" / NAME
    if (out / "model.safetensors").is_file() and (out / "processor_config.json").is_file():
        return out
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    text_path = resolve_model_path("local:SmolLM2-135M-Instruct")  # plugrl-commands' local model
    tok = AutoTokenizer.from_pretrained(text_path)
    image_tokens = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tok.add_special_tokens({"additional_special_tokens": image_tokens})
    tok.chat_template = _VLM_CHAT_TEMPLATE
    text = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    text_cfg = text.config.to_dict()
    text_cfg.update(vocab_size=len(tok), tie_word_embeddings=False)
    patch, scale = 8, 2
    config = Idefics3Config(
        text_config=text_cfg,
        vision_config=dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=VLM_IMAGE_SIZE,
            patch_size=patch,
        ),
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Idefics3ForConditionalGeneration(config)
    weights = text.state_dict()
    embed = weights.pop("model.embed_tokens.weight")
    embed = torch.cat([embed, embed.mean(0, keepdim=True).expand(len(tok) - embed.shape[0], -1)])
    weights.pop("lm_head.weight", None)  # tied in SmolLM2: the embedding
    with torch.no_grad():
        lm = model.model.text_model
        lm.load_state_dict({k.removeprefix("model."): v for k, v in weights.items()}, strict=False)
        lm.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed)
    model.config.dtype = "float32"
    tokens_per_image = (VLM_IMAGE_SIZE // patch) ** 2 // scale**2
    side = {"longest_edge": VLM_IMAGE_SIZE}
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(do_image_splitting=False, size=side, max_image_size=side),
        tokenizer=tok,
        image_seq_len=tokens_per_image,
        chat_template=_VLM_CHAT_TEMPLATE,
    )
    tmp = scratch_beside(out)
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    write_clean_config(tmp)
    return publish(tmp, out)
