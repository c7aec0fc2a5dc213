"""plugrl's vision-language models: images read from rows (:mod:`.images`), the processors that render image prompts
(:mod:`.processor`), pixel inputs and 3-D rotary positions (:mod:`.pixels`), what each model family takes
(:mod:`.families`), a model's vision tower and language model (:mod:`.towers`), and the settings a vision-language
run cannot use yet (:mod:`.checks`), and the small vision-language model for tests (:mod:`.test_model`).

This module is the entry point of group ``plugrl.vision``: the kernel calls the functions of
:class:`plugrl.vlm.VisionSupport` on it (:func:`plugrl.vlm.vision_support`), and only for a vision-language model
or a row with images. Its names are imported on first use: every run config imports :mod:`.fields` (the keys
``data.image_key`` and ``actor.freeze_vision_tower``), so this package imports nothing else on import.
"""

from plugrl.api import names_on_first_use

_HOME = {
    "IMAGE_BLOCK_MODELS": "families",
    "IMAGE_PLACEHOLDER": "images",
    "ImageError": "images",
    "MROPE_MODELS": "families",
    "PixelInputs": "pixels",
    "RowImage": "images",
    "VisionProcessor": "processor",
    "add_value_head": "towers",
    "attends_images_both_ways": "families",
    "blank_image_tokens": "pixels",
    "blank_pixels": "pixels",
    "check_config": "checks",
    "check_trainable": "families",
    "connector_warning": "towers",
    "content_parts": "images",
    "count_places": "images",
    "image_block_token": "families",
    "image_token_types_keyword": "families",
    "language_model": "towers",
    "load_image": "images",
    "load_processor": "processor",
    "model_kwargs": "pixels",
    "mrope_positions": "pixels",
    "packing": "pixels",
    "prepare_test_vlm": "test_model",
    "row_images": "images",
    "unsupported_family": "families",
    "uses_mrope": "families",
    "vision_side_parameters": "towers",
    "vision_tower": "towers",
    "vision_tower_name": "towers",
}
__all__ = sorted(_HOME)
__getattr__, __dir__ = names_on_first_use(__name__, _HOME)
