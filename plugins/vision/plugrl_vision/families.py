"""Vision-language model families: which positions, masks and image tokens each takes, and which plugrl cannot
train yet. Each function reads a transformers config of a vision-language model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# models whose language model takes 3-D rotary positions (temporal, height, width) over image tokens
MROPE_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


# models whose image tokens attend to each other both ways: each image's run of tokens is one block, every token of
# it sees the whole run (transformers builds the mask from token_type_ids, vLLM's "mm_prefix" attention); all other
# attention is causal. See :func:`plugrl.attention.layer_masks`.
IMAGE_BLOCK_MODELS = ("gemma3",)

# vision-language families whose packed forward plugrl does not build yet: each would train with the wrong mask
_UNSUPPORTED = {
    "paligemma": "its whole prompt, text and image, attends both ways (a prefix LM), a mask the packed forward "
    "does not build",
}


def unsupported_family(config: Any) -> str | None:
    """Why plugrl cannot train the vision-language model of ``config`` yet (it would silently compute another model:
    wrong positions or mask), or None."""
    model_type = getattr(config, "model_type", "")
    if model_type in _UNSUPPORTED:
        return f"{model_type}: {_UNSUPPORTED[model_type]}"
    text = getattr(config, "text_config", None) or config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, Mapping) and "mrope_section" in rope and model_type not in MROPE_MODELS:
        return f"{model_type}: its 3-D rotary positions are not Qwen2-VL's, the ones the packed forward builds"
    return None


def check_trainable(config: Any, path: str) -> None:
    """The kernel's call as it builds a vision-language model (:func:`plugrl.actor.build_model`): a ``ConfigError``
    naming ``path`` for a family plugrl cannot train yet (:func:`unsupported_family`)."""
    from plugrl.config import ConfigError

    unsupported = unsupported_family(config)
    if unsupported:
        raise ConfigError(
            f"{path} is a vision-language model plugrl cannot train yet ({unsupported}); docs/vision.md lists the "
            "families it trains"
        )


def uses_mrope(config: Any) -> bool:
    """Whether a transformers config's model takes Qwen2-VL's 3-D rotary positions (:func:`mrope_positions`)."""
    return getattr(config, "model_type", "") in MROPE_MODELS


def attends_images_both_ways(config: Any) -> bool:
    """Whether a transformers config's model lets an image's tokens attend to each other both ways
    (:data:`IMAGE_BLOCK_MODELS`, :func:`plugrl.attention.layer_masks`)."""
    return getattr(config, "model_type", "") in IMAGE_BLOCK_MODELS


def image_token_types_keyword(config: Any) -> str | None:
    """The forward keyword by which a model learns which of its input tokens are image tokens (1) when it
    generates: Qwen2-VL's family places 3-D positions by it, Gemma 3 builds its both-ways image mask from it."""
    if uses_mrope(config):
        return "mm_token_type_ids"
    if attends_images_both_ways(config):
        return "token_type_ids"
    return None


def image_block_token(config: Any) -> int | None:
    """The image token of a model whose image tokens attend to each other both ways (:data:`IMAGE_BLOCK_MODELS`),
    else None (:class:`plugrl.attention.RowMasks`)."""
    return config.image_token_id if attends_images_both_ways(config) else None
