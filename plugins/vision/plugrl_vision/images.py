"""Images: decoding those rows hold, and placing them in chat messages.

A sample's images come from the row's ``data.image_key`` column (verl's ``images``; a single ``image`` column as
TRL's VLM datasets have it is read too) or from its messages' image parts; :mod:`plugrl.data` finds them. Each may
be a PIL image, the bytes of an image file, a path (relative paths are read beside the data file), or a dict with
``bytes`` and/or ``path`` (the Hugging Face datasets ``Image`` feature, verl's parquet). Every image is decoded when
the row is loaded (:meth:`RowImage.checked`), so an image that cannot be read is an error naming the row at start,
never mid-step.

The images take the places the prompt marks: ``{"type": "image"}`` parts of a message's content (the chat format
of transformers' processors and TRL), or ``<image>`` in the text (verl's convention), which :func:`content_parts`
turns into such parts. The count of places must equal the count of images.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugrl.vlm import IMAGE_PLACEHOLDER, ImageError, count_places


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


def row_images(
    values: Sequence[tuple[Any, str]], prompt: str | list[dict[str, str]], question: bool, base_dir: Path | None
) -> list[RowImage]:
    """The kernel's call for the images a row holds (:mod:`plugrl.data`), each ``(value, where)``: each checked
    (:meth:`RowImage.checked`; a ``DataError`` naming ``where``). A plain question's prompt (``question``) that marks
    no place gets one per image before its text, as TRL's VLM scripts build the message."""
    from plugrl.data import DataError

    try:
        images = [RowImage.checked(value, where, base_dir) for value, where in values]
    except ImageError as e:
        raise DataError(str(e)) from None
    if question and prompt != "" and not count_places(prompt):
        prompt[0]["content"] = IMAGE_PLACEHOLDER * len(images) + prompt[0]["content"]
    return images


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
