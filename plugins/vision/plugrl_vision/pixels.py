"""Pixel inputs: the processor's outputs for one prompt's images as the model's forward takes them, packed rows'
images, Qwen2-VL's 3-D rotary positions, and the blank image of a forward that packs none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugrl_vision.families import attends_images_both_ways, image_block_token, uses_mrope
from plugrl_vision.towers import vision_side_parameters

if TYPE_CHECKING:
    import torch


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


def model_kwargs(parts: Sequence[PixelInputs], device: torch.device) -> dict[str, torch.Tensor]:
    """:meth:`PixelInputs.model_kwargs`: the kernel's call for a packed row's images (:mod:`plugrl.actor`)."""
    return PixelInputs.model_kwargs(parts, device)


def packing(model: Any) -> tuple[PixelInputs | None, int | None, tuple[int, int] | None]:
    """The kernel's call as a packed model starts (:class:`plugrl.actor.PackedModel`): (:func:`blank_pixels` where
    the vision encoder or connector trains, else None; :func:`image_block_token`; for Qwen2-VL's family, which takes
    3-D rotary positions over image tokens (:func:`mrope_positions`), (image token id, spatial merge size), else
    None)."""
    config = model.config
    trains = any(p.requires_grad for _, p in vision_side_parameters(model))
    mrope = (config.image_token_id, config.vision_config.spatial_merge_size) if uses_mrope(config) else None
    return blank_pixels(config) if trains else None, image_block_token(config), mrope
