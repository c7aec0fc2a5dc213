"""plugrl's vision-language models: images read from rows (:mod:`.images`), the processors that render image prompts
(:mod:`.processor`), pixel inputs and 3-D rotary positions (:mod:`.pixels`), what each model family takes
(:mod:`.families`), a model's vision tower and language model (:mod:`.towers`), and the settings a vision-language
run cannot use yet (:mod:`.checks`), and the small vision-language model for tests (:mod:`.test_model`).

This module is the entry point of group ``plugrl.vision``: the kernel calls the functions of
:class:`plugrl.vlm.VisionSupport` on it (:func:`plugrl.vlm.vision_support`), and only for a vision-language model
or a row with images.
"""

from plugrl.models import is_vision_model
from plugrl.vlm import IMAGE_PLACEHOLDER, ImageError, count_places
from plugrl_vision.checks import check_config
from plugrl_vision.families import (
    IMAGE_BLOCK_MODELS,
    MROPE_MODELS,
    attends_images_both_ways,
    check_trainable,
    image_block_token,
    image_token_types_keyword,
    unsupported_family,
    uses_mrope,
)
from plugrl_vision.images import RowImage, content_parts, load_image, row_images
from plugrl_vision.pixels import PixelInputs, blank_image_tokens, blank_pixels, model_kwargs, mrope_positions, packing
from plugrl_vision.processor import VisionProcessor, load_processor
from plugrl_vision.test_model import prepare_test_vlm
from plugrl_vision.towers import (
    add_value_head,
    connector_warning,
    language_model,
    vision_side_parameters,
    vision_tower,
    vision_tower_name,
)

__all__ = [
    "IMAGE_BLOCK_MODELS",
    "IMAGE_PLACEHOLDER",
    "MROPE_MODELS",
    "ImageError",
    "PixelInputs",
    "RowImage",
    "VisionProcessor",
    "add_value_head",
    "attends_images_both_ways",
    "blank_image_tokens",
    "blank_pixels",
    "check_config",
    "check_trainable",
    "connector_warning",
    "content_parts",
    "count_places",
    "image_block_token",
    "image_token_types_keyword",
    "is_vision_model",
    "language_model",
    "load_image",
    "load_processor",
    "model_kwargs",
    "mrope_positions",
    "packing",
    "prepare_test_vlm",
    "row_images",
    "unsupported_family",
    "uses_mrope",
    "vision_side_parameters",
    "vision_tower",
    "vision_tower_name",
]
