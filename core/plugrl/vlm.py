"""Vision-language models: the seam between the text-only kernel and the package that knows images.

The kernel by itself trains text models. Images (reading them from rows, the processors that render image prompts,
pixel inputs, the model families' positions and masks, their vision towers) are plugrl-vision's: the object of the
entry point of group ``plugrl.vision`` (the module :mod:`plugrl_vision`), which :func:`vision_support` returns
and :class:`VisionSupport` describes. The kernel asks for it only where a model is a vision-language model
(:func:`plugrl.models.is_vision_model`) or a row holds images: a text run never imports it. A run that needs it
without it installed is refused at start, naming the package (:func:`plugrl.startup.load_processor`, and
:mod:`plugrl.data` for a row with images).

What stays here is what a text run needs too: ``<image>``, the place an image takes in a prompt's text
(:func:`count_places`): a text prompt must not mark places it has no images for.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from plugrl.plugin_errors import implementation, package_hint

if TYPE_CHECKING:
    import torch

VISION_GROUP = "plugrl.vision"
VISION_PACKAGE = "plugrl-vision"
IMAGE_PLACEHOLDER = "<image>"  # verl's place for an image in a prompt's text


class NoVisionSupport(RuntimeError):
    """No installed package handles images; the message names the one to install."""


class ImageError(ValueError):
    """An image that cannot be read; the message names the row and the image."""


def count_places(prompt: str | Sequence[Mapping[str, str]]) -> int:
    """The image places a validated prompt marks: ``<image>`` in its text (:func:`plugrl.data.validate_messages`
    writes each ``{"type": "image"}`` part so)."""
    texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
    return sum(t.count(IMAGE_PLACEHOLDER) for t in texts)


class Pixels(Protocol):
    """One prompt's pixel inputs, as the model's processor made them (plugrl-vision's ``PixelInputs``)."""

    image_grid_thw: torch.Tensor | None  # patch layouts (Qwen-VL): each image's (temporal, height, width) grid

    def batch_kwargs(self, k: int, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The forward's keyword arguments for ``k`` copies of the prompt (``generate`` samples them together)."""


class Processor(Protocol):
    """A vision-language model's processor: renders image prompts, makes their ids and pixel inputs."""

    def render(self, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None = None) -> str:
        """The chat-templated text of validated messages, one image token per ``<image>``."""

    def encode(
        self, text: str, images: Sequence[Any], *, add_special_tokens: bool = False
    ) -> tuple[list[int], list[int], Pixels]:
        """(the engine's ids: one image token per image, the model's ids: each expanded, the pixel inputs)."""

    def pixels(self, text: str, images: Sequence[Any], *, add_special_tokens: bool = False) -> Pixels:
        """:meth:`encode`'s pixel inputs alone, made again when a step needs them."""

    def save_pretrained(self, folder: Any) -> None: ...


class VisionSupport(Protocol):
    """What the kernel calls for images and vision-language models. ``config`` is a transformers config of a
    vision-language model, ``model`` a transformers image-text-to-text model (a critic's with its value head)."""

    def row_images(self, values: Sequence[tuple[Any, str]], prompt: Any, question: bool, base_dir: Path | None) -> list:
        """A row's images ``(value, where)``, kept as it holds them, checked to decode (``DataError`` naming ``where``;
        ``open()`` gives the RGB ``PIL.Image``), a place each before a plain ``question`` prompt that marks none."""

    def load_processor(self, path: str, trust_remote_code: bool) -> Processor: ...

    def check_config(self, cfg: Any, registry: Any) -> None:
        """Refuse (``ConfigError``, naming the key) what a vision-language model does not train with yet."""

    def check_trainable(self, config: Any, path: str) -> None:
        """Refuse (``ConfigError`` naming ``path``) a family plugrl cannot train yet: it would compute another model."""

    def add_value_head(self, model: Any, weights: bool) -> None:
        """Replace the LM head by a scalar one (a critic); on the meta device when not ``weights``."""

    def vision_tower(self, model: Any) -> Any: ...

    def vision_tower_name(self, model: Any) -> str: ...

    def vision_side_parameters(self, model: Any) -> list[tuple[str, Any]]:
        """(name, parameter) outside the language model and LM head: the vision encoder's and the connector's."""

    def connector_warning(self, model: Any, key: str) -> str | None:
        """What to say (``key``: the LoRA section) of a connector no adapter went on, left as loaded; else None."""

    def language_model(self, model: Any) -> Any:
        """The module holding the decoder layers (``.layers``)."""

    def image_token_types_keyword(self, config: Any) -> str | None:
        """The forward keyword by which ``generate`` learns which input tokens are image tokens, or None."""

    def packing(self, model: Any) -> tuple[Pixels | None, int | None, tuple[int, int] | None]:
        """(a blank image for a forward without images where the vision side trains, the image token of images that
        attend both ways, (image token id, spatial merge size) for :meth:`mrope_positions`), each or None."""

    def mrope_positions(
        self, ids: Sequence[int], image_token_id: int, grids: torch.Tensor | None, merge: int
    ) -> torch.Tensor:
        """The 3-D rotary positions [3, L] of one sequence ``ids`` [L] whose image runs have the patch ``grids``."""

    def blank_image_tokens(self, config: Any) -> list[int]:
        """The image tokens a row needs for :meth:`packing`'s blank image, by which every rank reduces the same
        gradients (FSDP2)."""

    def model_kwargs(self, parts: Sequence[Pixels], device: torch.device) -> dict[str, torch.Tensor]:
        """The forward's keyword arguments for a packed row whose images are ``parts``, in row order."""


@functools.cache
def vision_support() -> VisionSupport:
    """The installed implementation (the entry point of group ``plugrl.vision``: plugrl-vision), loaded once per
    process; :class:`NoVisionSupport` naming the package when none is installed."""
    missing = f"images and vision-language models are handled by the package {VISION_PACKAGE}, which is not installed: "
    return implementation(VISION_GROUP, NoVisionSupport(missing + package_hint(VISION_PACKAGE)))
