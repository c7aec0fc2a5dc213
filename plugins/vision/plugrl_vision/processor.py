"""The model's side of image prompts: the processor's chat template renders the messages with one image token per
image; the engine gets those ids and the images (vLLM expands each image token itself); the trainer trains on the
processor's expansion of the same ids (an image token becomes the image's run of feature tokens) with the pixel
values (:class:`~plugrl_vision.pixels.PixelInputs`) beside them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from plugrl.vlm import IMAGE_PLACEHOLDER
from plugrl_vision.images import content_parts
from plugrl_vision.pixels import PixelInputs


class VisionProcessor:
    """A model's processor (``AutoProcessor``): renders image prompts and makes their pixel inputs."""

    def __init__(self, processor: Any):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token = getattr(processor, "image_token", IMAGE_PLACEHOLDER)

    @classmethod
    def load(cls, path: str, trust_remote_code: bool = False) -> VisionProcessor:
        from transformers import AutoProcessor

        return cls(AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code))

    def render(self, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None = None) -> str:
        """The chat-templated text of ``messages`` (content parts), one image token per image; with the tools'
        schemas when given (a multi-turn episode's tools)."""
        extra = {"tools": tools} if tools else {}
        return self.processor.apply_chat_template(content_parts(messages), add_generation_prompt=True, **extra)

    def encode(
        self, text: str, images: Sequence[Any], *, add_special_tokens: bool = False
    ) -> tuple[list[int], list[int], PixelInputs]:
        """(the engine's ids: one image token per image, the model's ids: each image token expanded, the pixel
        inputs) of a rendered prompt. ``add_special_tokens``: false for chat-templated text (it holds them)."""
        engine_ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        enc = self._process(text, images, add_special_tokens)
        return list(engine_ids), enc["input_ids"][0].tolist(), PixelInputs.from_processor(enc)

    def pixels(self, text: str, images: Sequence[Any], *, add_special_tokens: bool = False) -> PixelInputs:
        """The pixel inputs of a rendered prompt (:meth:`encode`'s third part), made again when a step needs them."""
        return PixelInputs.from_processor(self._process(text, images, add_special_tokens))

    def _process(self, text: str, images: Sequence[Any], add_special_tokens: bool) -> Any:
        return self.processor(
            text=[text], images=[list(images)], add_special_tokens=add_special_tokens, return_tensors="pt"
        )

    def save_pretrained(self, folder: Any) -> None:
        self.processor.save_pretrained(folder)


def load_processor(path: str, trust_remote_code: bool) -> VisionProcessor:
    """The processor saved with the model at ``path`` (the kernel's call, :func:`plugrl.startup.load_processor`)."""
    return VisionProcessor.load(path, trust_remote_code)
