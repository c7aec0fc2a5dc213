"""The keys of vision-language runs, which this package adds to the run config (entry-point group
``plugrl.config_fields``): ``data.image_key``, where a row's images are, and ``actor.freeze_vision_tower``."""

from __future__ import annotations

from pydantic import Field

from plugrl.config import ConfigFields, Section


class DataImages(Section):
    image_key: str = Field(
        "images",
        description="Row field holding a sample's images (verl's key): a list, or one image; each a path (relative to "
        "the data file), bytes, a PIL image or a dict with 'bytes'/'path' (the datasets Image feature). With the "
        "default, a single 'image' column is read too. The prompt marks their places with {'type': 'image'} content "
        "parts or '<image>' in its text; a data.question_field question that marks none gets them in front of it. "
        "Needs a vision-language model (docs/vision.md).",
    )


class ActorVision(Section):
    freeze_vision_tower: bool = Field(
        True,
        description="Vision-language models: the vision encoder does not train (as TRL's VLM GRPO guide does); the "
        "connector and the language model do (with actor.lora: the encoder gets no adapters). No effect on a text "
        "model.",
    )


FIELDS = ConfigFields(sections={"data": DataImages, "actor": ActorVision})
