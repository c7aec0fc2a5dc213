"""Images: reading them from rows, placing them in chat messages, and the pixel inputs a vision-language model takes.

A sample's images come from the row's ``data.image_key`` column (verl's ``images``; a single ``image`` column as
TRL's VLM datasets have it is read too). Each image may be a PIL image, the bytes of an image file, a path
(relative paths are read beside the data file), or a dict with ``bytes`` and/or ``path`` (the Hugging Face
datasets ``Image`` feature, verl's parquet). Every image is decoded when the row is loaded, so an image that
cannot be read is an error naming the row at start, never mid-step.

The images take the places the prompt marks: ``{"type": "image"}`` parts of a message's content (the chat
format of transformers' processors and TRL), or ``<image>`` in the text (verl's convention), which
:func:`content_parts` turns into such parts. The count of places must equal the count of images.

The model's side (:class:`VisionProcessor`): the processor's chat template renders the messages with one image
token per image; the engine gets those ids and the images (vLLM expands each image token itself); the trainer
trains on the processor's expansion of the same ids (an image token becomes the image's run of feature tokens)
with the pixel values (:class:`PixelInputs`) beside them.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

IMAGE_PLACEHOLDER = "<image>"  # verl's place for an image in a prompt's text


class ImageError(ValueError):
    """An image that cannot be read; the message names the row and the image."""


def load_image(value: Any, where: str, base_dir: Path | None = None):
    """``value`` decoded into an RGB ``PIL.Image``; raises :class:`ImageError` naming ``where``.

    Accepts a PIL image, image-file bytes, a path (relative to ``base_dir``, the data file's folder), or a
    dict with ``bytes`` (used first) or ``path``."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    source: Any = value
    if isinstance(value, Mapping):
        if value.get("bytes"):
            source = value["bytes"]
        elif value.get("path"):
            source = value["path"]
        else:
            raise ImageError(f"{where}: an image dict needs 'bytes' or 'path', got keys {sorted(value)}")
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, label = io.BytesIO(bytes(source)), f"{len(source)} bytes"
    elif isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise ImageError(f"{where}: image file {str(path)!r} does not exist")
        data, label = path, repr(str(path))
    else:
        raise ImageError(
            f"{where}: an image must be a PIL image, bytes, a path or a dict with 'bytes'/'path', "
            f"got {type(value).__name__}"
        )
    try:
        with Image.open(data) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ImageError(f"{where}: image {label} cannot be decoded ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class RowImage:
    """One image of a row, kept as the row holds it (a path, the file's bytes, a dict, a PIL image) and decoded
    each time it is used (:meth:`open`): a dataset's images are never all held decoded at once. :func:`checked`
    decodes it once when the row loads, so an image that cannot be read is an error naming the row at start.

    value: what the row holds; where: the row and field, for errors; base_dir: where a relative path is read.
    """

    value: Any
    where: str
    base_dir: Path | None = None

    def open(self):
        """The image decoded, as an RGB ``PIL.Image`` (:func:`load_image`)."""
        return load_image(self.value, self.where, self.base_dir)

    @classmethod
    def checked(cls, value: Any, where: str, base_dir: Path | None = None) -> RowImage:
        """A row image whose value decodes (the decoded pixels are not kept); :class:`ImageError` naming ``where``
        otherwise."""
        image = cls(value, where, base_dir)
        image.open()
        return image


def row_images(row: Mapping[str, Any], key: str, origin: str, base_dir: Path | None = None) -> list[RowImage]:
    """The images of a row, each checked to decode: its ``key`` column (one image or a list), else an ``image``
    column when ``key`` is the default ``images``; [] when the row has neither (or an empty/None value)."""
    value = row.get(key)
    field = key
    if value is None and key == "images" and row.get("image") is not None:
        value, field = row["image"], "image"
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return [RowImage.checked(v, f"{origin}: {field}[{i}]", base_dir) for i, v in enumerate(items)]


def inline_images(prompt: Any) -> list[Any]:
    """The images written inside a prompt's content parts (``{"type": "image", "image": ...}``), in order."""
    if not isinstance(prompt, (list, tuple)):
        return []
    found = []
    for m in prompt:
        content = m.get("content") if isinstance(m, Mapping) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, Mapping) and part.get("type") == "image" and part.get("image") is not None:
                found.append(part["image"])
    return found


def count_places(prompt: str | Sequence[Mapping[str, str]]) -> int:
    """The image places a validated prompt marks: ``<image>`` in its text (:func:`plugrl.data.validate_messages`
    writes each ``{"type": "image"}`` part so)."""
    texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
    return sum(t.count(IMAGE_PLACEHOLDER) for t in texts)


def content_parts(messages: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
    """Validated messages in the processors' chat format: each content a list of ``{"type": "text", "text": ...}``
    and ``{"type": "image"}`` parts, every ``<image>`` of the text an image part at its place (the pixels travel
    beside the text, never inside it)."""
    out = []
    for m in messages:
        parts: list[dict[str, Any]] = []
        for k, piece in enumerate(m["content"].split(IMAGE_PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
            if piece:
                parts.append({"type": "text", "text": piece})
        out.append({**m, "content": parts})
    return out


@dataclass
class PixelInputs:
    """The pixel inputs of one prompt's images, as the processor made them, in one of two layouts:

    - crops (Idefics3/SmolVLM, Gemma 3, LLaVA): ``pixel_values`` [N, C, H, W], N image crops (an image may be split
      into several), ``pixel_attention_mask`` [N, H, W] or None (models without one);
    - patches (Qwen2-VL, Qwen2.5-VL): ``pixel_values`` [P, D], the P flattened patches of all the prompt's
      images, and ``image_grid_thw`` [images, 3], each image's (temporal, height, width) patch grid.
    """

    pixel_values: torch.Tensor
    pixel_attention_mask: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    # crops: whether the model takes them with a batch axis, [1, N, C, H, W] (Idefics3/SmolVLM) or as [N, C, H, W]
    # (Gemma 3, LLaVA); the processor's output has the model's layout
    batched: bool = True

    @classmethod
    def from_processor(cls, enc: Mapping[str, Any]) -> PixelInputs:
        """The pixel inputs of one prompt from a processor's output for it (a batch of one)."""
        grid = enc.get("image_grid_thw")
        if grid is not None:  # patches: already one tensor for the prompt's images
            return cls(enc["pixel_values"], image_grid_thw=grid)
        pixels = enc["pixel_values"]
        mask = enc.get("pixel_attention_mask")
        batched = pixels.dim() == 5
        pixels = pixels.reshape(-1, *pixels.shape[-3:])  # [1, N, C, H, W] -> [N, C, H, W]
        if mask is not None:
            mask = mask.reshape(-1, *mask.shape[-2:])
        return cls(pixels, mask, batched=batched)

    @staticmethod
    def model_kwargs(parts: Sequence[PixelInputs], device: torch.device) -> dict[str, torch.Tensor]:
        """The keyword arguments of one forward over prompts whose images are ``parts``, in the order their image
        tokens appear in the row: crops ``pixel_values`` [1, N, C, H, W] (and ``pixel_attention_mask``); patches
        ``pixel_values`` [P, D] and ``image_grid_thw`` [images, 3], the parts' concatenated (crops without the batch
        axis, [N, C, H, W], for a model that takes them so)."""
        import torch

        if not parts:
            return {}
        if parts[0].image_grid_thw is not None:
            return {
                "pixel_values": torch.cat([p.pixel_values for p in parts]).to(device),
                "image_grid_thw": torch.cat([p.image_grid_thw for p in parts]).to(device),
            }
        pixels = torch.cat([p.pixel_values for p in parts])
        if not parts[0].batched:
            return {"pixel_values": pixels.to(device)}
        kwargs = {"pixel_values": pixels[None].to(device)}
        if parts[0].pixel_attention_mask is not None:
            kwargs["pixel_attention_mask"] = torch.cat([p.pixel_attention_mask for p in parts])[None].to(device)
        return kwargs

    def batch_kwargs(self, k: int, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The keyword arguments of a batch of ``k`` copies of this one prompt (``generate`` samples them
        together); floating-point pixels in ``dtype``."""
        if self.image_grid_thw is not None or not self.batched:  # the batch's images one after another
            kwargs = PixelInputs.model_kwargs([self] * k, device)
        else:
            kwargs = {n: t.expand(k, *t.shape[1:]) for n, t in PixelInputs.model_kwargs([self], device).items()}
        return {n: t.to(dtype) if t.is_floating_point() else t for n, t in kwargs.items()}


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


def mrope_positions(ids: Sequence[int], image_token_id: int, grids: torch.Tensor | None, merge: int) -> torch.Tensor:
    """Qwen2-VL's 3-D rotary positions of one sequence: [3, L] (temporal, height, width) for ``ids`` [L].

    A text token at text position p gets (p, p, p); p counts on by one. Image ``i`` (the i-th run of
    ``image_token_id`` in ``ids``; its patch grid ``grids[i]`` = (T, H, W), ``merge`` the spatial merge size, so
    T * (H / merge) * (W / merge) tokens) starting after text position s - 1 gets (s + t, s + h, s + w) for its
    token at merged grid cell (t, h, w) in row-major order; the text after it continues at
    s + max(H, W) / merge. (A still image has T = 1.) As transformers' ``get_rope_index`` computes it.
    """
    import torch

    out = torch.empty(3, len(ids), dtype=torch.long)
    pos, i, image = 0, 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            out[:, i] = pos
            pos, i = pos + 1, i + 1
            continue
        if grids is None or image >= len(grids):
            raise ValueError(f"image token run {image + 1} at position {i} has no image grid (image_grid_thw)")
        t, h, w = (int(v) for v in grids[image])
        h, w = h // merge, w // merge
        n = t * h * w
        if ids[i : i + n] != [image_token_id] * n:
            raise ValueError(f"image {image + 1} at position {i}: its grid {t}x{h}x{w} needs {n} image tokens")
        cell = torch.arange(n)
        out[0, i : i + n] = pos + cell // (h * w)
        out[1, i : i + n] = pos + (cell // w) % h
        out[2, i : i + n] = pos + cell % w
        pos, i, image = pos + max(h, w), i + n, image + 1
    if grids is not None and image != len(grids):
        raise ValueError(f"{len(grids)} image grids for {image} runs of image tokens")
    return out


def blank_pixels(config: Any) -> PixelInputs | None:
    """One blank image for a forward that packs no image, for Idefics3/SmolVLM, Gemma 3 and Qwen-VL (None for other
    models).

    Under FSDP2 every rank must reduce the gradients of the same parameters. A rank whose micro-batch has no image
    (a text row, or the dummy row of a rank without sequences) would leave the connector out while the others
    reduce its gradient, and the collectives would no longer match. With this image its vision encoder and
    connector run, their features are placed nowhere (the row has no image token), and the connector gets a zero
    gradient. The image is uniform, not all zero: the model drops all-zero images as padding."""
    import torch

    vc = getattr(config, "vision_config", None)
    if vc is None:
        return None
    if attends_images_both_ways(config):  # Gemma 3: the row gets a run of image tokens for it (blank_image_tokens)
        return PixelInputs(torch.ones(1, vc.num_channels, vc.image_size, vc.image_size), batched=False)
    if uses_mrope(config):  # Qwen-VL: the smallest grid, merge x merge patches: one image token (blank_image_tokens)
        m, t, p = vc.spatial_merge_size, vc.temporal_patch_size, vc.patch_size
        return PixelInputs(torch.ones(m * m, vc.in_channels * t * p * p), image_grid_thw=torch.tensor([[1, m, m]]))
    if getattr(config, "model_type", "") not in ("idefics3", "smolvlm"):
        return None
    side = vc.image_size
    return PixelInputs(torch.ones(1, vc.num_channels, side, side), torch.ones(1, side, side, dtype=torch.long))


def blank_image_tokens(config: Any) -> list[int]:
    """The image tokens a row needs for :func:`blank_pixels`' image: none for a model that takes images without
    tokens to place them at (Idefics3), one image's run for Gemma 3 and Qwen-VL (they check that every image has
    its tokens)."""
    if attends_images_both_ways(config):
        return [config.image_token_id] * config.mm_tokens_per_image
    if uses_mrope(config):
        return [config.image_token_id]
    return []


def is_vision_model(config: Any) -> bool:
    """Whether a transformers config is a vision-language model's (it has a vision sub-config)."""
    return getattr(config, "vision_config", None) is not None


_VISION_TOWERS = ("vision_model", "vision_tower", "visual")  # Idefics3/SmolVLM, LLaVA/Gemma 3, Qwen-VL


def vision_tower(model: Any) -> Any:
    """The vision encoder module of a transformers vision-language model."""
    for holder in (getattr(model, "model", None), model):
        for name in _VISION_TOWERS:
            tower = getattr(holder, name, None)
            if tower is not None:
                return tower
    raise ValueError(f"{type(model).__name__}: no vision encoder found (looked for {', '.join(_VISION_TOWERS)})")


def vision_side_parameters(model: Any) -> list[tuple[str, Any]]:
    """(name, parameter) of a vision-language model's parameters outside its language model and LM head: the vision
    encoder's and the connector's."""
    inside = {id(p) for p in language_model(model).parameters()}
    head = model.get_output_embeddings()
    inside |= {id(p) for p in head.parameters()} if head is not None else set()
    return [(n, p) for n, p in model.named_parameters() if id(p) not in inside]


def vision_tower_name(model: Any) -> str:
    """The module name of ``model``'s vision encoder (:func:`vision_tower`), as ``named_modules`` gives it."""
    tower = vision_tower(model)
    return next(name for name, module in model.named_modules() if module is tower)


def language_model(model: Any) -> Any:
    """The language model inside a transformers vision-language model: the module holding its decoder layers
    (``model.model.text_model`` in Idefics3/SmolVLM, ``model.model.language_model`` in LLaVA and Qwen-VL)."""
    inner = getattr(model, "model", model)
    for name in ("text_model", "language_model"):
        found = getattr(inner, name, None)
        if found is not None and getattr(found, "layers", None) is not None:
            return found
    raise ValueError(f"{type(model).__name__}: no language model found (looked for text_model, language_model)")


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
