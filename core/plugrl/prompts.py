"""Prompts: rendering samples to text and token ids, with the length limit enforced.

The order of rendering (:func:`render_prompt`):

1. The prompt: ``data.template`` (a plugin's, ``fn(sample) -> str | messages``) if set, winning over
   ``data.raw_template``; else ``data.raw_template`` filled from the row (``str.format_map`` over the row's fields
   plus ``prompt``, ``ground_truth``, ``data_source`` and ``extra_info``); else ``sample.prompt``.
2. Chat messages get ``data.system_prompt`` as a first system message unless they hold one (the data's own is
   never replaced); then, with ``data.apply_chat_template`` and a tokenizer that has a chat template,
   ``apply_chat_template(..., add_generation_prompt=True)``. With ``data.apply_chat_template: false`` they are
   written as ChatML by hand (:func:`chatml`) whatever the tokenizer, as single-file trainers for Qwen models do
   (no default system message, unlike Qwen's template). A tokenizer without a chat template gets plain
   ``role: content`` lines ending with ``assistant:``. Raw text gets ``data.system_prompt + "\\n"`` in front.
3. ``data.prefill`` is appended as is (the start of the assistant's turn).

Chat-templated text already holds its special tokens, so it is tokenized with ``add_special_tokens=False``; raw
text and hand-written ChatML get the tokenizer's defaults (a BOS token where it adds one), as
``tokenizer.encode(prompt)`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugrl.data import DataError, Sample, validate_messages

if TYPE_CHECKING:
    from plugrl.config import DataConfig
    from plugrl.rollout.types import ImagePrompt
    from plugrl.specs import Registry
    from plugrl.vlm import Pixels, Processor

log = logging.getLogger("plugrl.prompts")


@dataclass
class EncodedPrompt:
    """A sample with its rendered prompt text and token ids (``len(ids) <= data.max_prompt_length``); after
    truncation ``text`` is the truncated ids decoded."""

    sample: Sample
    text: str
    ids: list[int]
    # the chat messages the chat template rendered (system prompt included), or None for raw text:
    # a multi-turn episode's conversation starts with them
    messages: list[dict[str, str]] | None = None
    # a prompt with images (plugrl.vlm): ``ids`` are the model's (each image token expanded into the image's
    # feature tokens), ``engine_ids`` the engine's (one image token per image); ``processor`` makes the images'
    # pixel inputs when a step needs them (``special_tokens``: as the text was encoded)
    engine_ids: list[int] | None = None
    processor: Processor | None = None
    special_tokens: bool = False

    @property
    def pixels(self) -> Pixels | None:
        """The images' pixel inputs (None for a text prompt), made from the row's images each time they are asked
        for: a dataset's images are never all held decoded, nor their pixels (one step's at a time)."""
        if self.engine_ids is None or self.processor is None:
            return None
        return self._pixels([image.open() for image in self.sample.images])

    def _pixels(self, images: list[Any]) -> Pixels:
        assert self.processor is not None
        return self.processor.pixels(self.text, images, add_special_tokens=self.special_tokens)

    @property
    def engine_prompt(self) -> list[int] | ImagePrompt:
        """What a rollout engine generates from: the token ids, or for a prompt with images an
        :class:`~plugrl.rollout.types.ImagePrompt` (the images decoded for this call, their pixel inputs made when
        an engine reads them)."""
        if self.engine_ids is None:
            return self.ids
        from plugrl.rollout.types import ImagePrompt

        return ImagePrompt(self.engine_ids, [image.open() for image in self.sample.images], self.ids, self._pixels)


class _RowFields(dict):
    def __missing__(self, key: str) -> Any:
        raise KeyError(key)


def _prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """``{prompt}`` in a raw template: the text, or the last user message's content."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else "\n".join(m["content"] for m in prompt)


def _fill_raw_template(sample: Sample, raw_template: str) -> str:
    fields = _RowFields(sample.row)
    fields.update(
        prompt=_prompt_text(sample.prompt),
        ground_truth=sample.ground_truth,
        data_source=sample.data_source,
        extra_info=sample.extra_info,
    )
    try:
        return raw_template.format_map(fields)
    except KeyError as e:
        raise DataError(
            f"{sample.origin}: data.raw_template uses the placeholder {{{e.args[0]}}}, which the row does not have; "
            f"available fields: {', '.join(sorted(map(str, fields)))}. Write literal braces as {{{{ and }}}}"
        ) from None
    except (ValueError, IndexError, AttributeError, TypeError) as e:
        raise DataError(
            f"data.raw_template {raw_template!r} is not a valid template ({type(e).__name__}: {e}); use named "
            "placeholders such as {question} and write literal braces as {{ and }}"
        ) from None


def _template_spec(cfg: DataConfig, registry: Registry | None) -> Any:
    if not cfg.template:
        return None
    templates = registry.templates if registry is not None else {}
    spec = templates.get(cfg.template)
    if spec is None:
        known = ", ".join(sorted(templates)) or "none (load a plugin that provides one in `plugins:`)"
        raise DataError(f"unknown prompt template {cfg.template!r} (data.template); registered templates: {known}")
    return spec


def chatml(messages: Sequence[dict[str, str]]) -> str:
    """``messages`` written as ChatML, ending with the opened assistant turn (``data.apply_chat_template:
    false``). The same text as Qwen's and SmolLM2's chat templates give for messages that start with a system
    message."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def _has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _render(
    sample: Sample,
    cfg: DataConfig,
    tokenizer: Any,
    registry: Registry | None,
    processor: Processor | None = None,
) -> tuple[str, bool, list[dict[str, str]] | None]:
    """The prompt text, whether a chat template made it (then it already holds its special tokens), and the
    messages it rendered (None for raw text). A sample with images renders through the model's processor
    (``processor``): its chat template gets the ``<image>`` places as image parts."""
    spec = _template_spec(cfg, registry)
    result: str | list[dict[str, str]]
    if spec is not None:
        where = f"{sample.origin}: template '{spec.name}'" + (f" (plugin {spec.plugin})" if spec.plugin else "")
        try:
            result = spec.fn(sample)
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"{where} raised {type(e).__name__}: {e}") from e
        if not isinstance(result, str):
            result = validate_messages(result, f"{where} returned invalid messages: messages")
    elif cfg.raw_template:
        result = _fill_raw_template(sample, cfg.raw_template)
    else:
        result = sample.prompt

    templated = False
    messages = None
    if isinstance(result, str):
        if not result.strip():
            raise DataError(
                f"{sample.origin}: the prompt is empty"
                + (f" (template {cfg.template!r} returned no text)" if spec else "")
            )
        text = f"{cfg.system_prompt}\n{result}" if cfg.system_prompt else result
    else:
        messages = [dict(m) for m in result]
        if cfg.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        if sample.images and processor is not None and cfg.apply_chat_template:
            try:
                text = processor.render(messages)
            except Exception as e:
                raise DataError(
                    f"{sample.origin}: the processor's chat template failed on these messages "
                    f"({type(e).__name__}: {e}); check the message roles and order"
                ) from e
            templated = True
        elif cfg.apply_chat_template and _has_chat_template(tokenizer):
            try:
                text = tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **cfg.apply_chat_template_kwargs
                )
            except Exception as e:
                raise DataError(
                    f"{sample.origin}: the tokenizer's chat template failed on these messages "
                    f"({type(e).__name__}: {e}); check the message roles and order"
                ) from e
            templated = True
        elif not cfg.apply_chat_template:
            text = chatml(messages)
        else:
            text = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
    if cfg.prefill:
        text += cfg.prefill
    return text, templated, messages if templated else None


def render_prompt(sample: Sample, cfg: DataConfig, tokenizer: Any, registry: Registry | None) -> str:
    """The full prompt text for ``sample``: template, system prompt, chat template, prefill (module doc)."""
    return _render(sample, cfg, tokenizer, registry)[0]


_Rendered = tuple[Sample, str, bool, "list[dict[str, str]] | None"]


def _render_all(
    samples: Sequence[Sample],
    cfg: DataConfig,
    tokenizer: Any,
    registry: Registry | None,
    processor: Processor | None = None,
) -> tuple[list[_Rendered], int]:
    """``(sample, text, templated, messages)`` for each sample that renders, and how many were skipped
    (data.skip_invalid)."""
    rendered: list[_Rendered] = []
    invalid = 0
    for s in samples:
        try:
            text, templated, messages = _render(s, cfg, tokenizer, registry, processor)
        except DataError as e:
            if not cfg.skip_invalid:
                raise
            invalid += 1
            if invalid <= 3:
                log.warning("skipping a prompt that cannot be rendered (data.skip_invalid): %s", e)
            continue
        rendered.append((s, text, templated, messages))
    return rendered, invalid


def _tokenize_rendered(rendered: Sequence[_Rendered], tokenizer: Any) -> list[list[int] | None]:
    """Token ids of each rendered text, in order: chat-templated texts without the tokenizer's special tokens
    (they hold theirs already), raw texts with them; one tokenizer call per kind."""
    ids: list[list[int] | None] = [None] * len(rendered)
    for special in (False, True):
        pos = [i for i, r in enumerate(rendered) if r[2] != special]
        if pos:
            enc = tokenizer([rendered[i][1] for i in pos], add_special_tokens=special)["input_ids"]
            for i, e in zip(pos, enc, strict=True):
                ids[i] = list(e)
    return ids


def _encode_images(
    rendered: Sequence[_Rendered], processor: Processor | None
) -> list[tuple[list[int], list[int], Pixels] | None]:
    """For each rendered prompt with images, (engine ids, model ids, pixel inputs) (:meth:`Processor.encode`);
    None for text prompts. Raises :class:`DataError` for images without a vision-language model, and for images
    whose places the rendered text does not hold."""
    out: list[tuple[list[int], list[int], Pixels] | None] = []
    for s, text, templated, _ in rendered:
        if not s.images:
            out.append(None)
            continue
        if processor is None:
            raise DataError(
                f"{s.origin}: the row has {len(s.images)} image(s) but model.path is a text model (no vision "
                "config, no processor); train a vision-language model (docs/vision.md), or leave the images out "
                "(data.image_key names the column)"
            )
        try:
            out.append(processor.encode(text, [image.open() for image in s.images], add_special_tokens=not templated))
        except Exception as e:
            raise DataError(
                f"{s.origin}: the processor could not place the {len(s.images)} image(s) in the prompt "
                f"({type(e).__name__}: {e}); give every image one '<image>' place in the prompt"
            ) from e
    return out


def truncate_ids(ids: list[int], limit: int, side: str) -> list[int]:
    """An overlong prompt's ids cut to ``limit`` as verl's ``data.truncation`` cuts them: ``left`` keeps the last
    ``limit``, ``right`` the first, ``middle`` the first ``limit // 2`` and the last ``limit - limit // 2``."""
    if len(ids) <= limit:
        return list(ids)
    if side == "left":
        return list(ids[len(ids) - limit :])
    if side == "middle":
        head = limit // 2
        return list(ids[:head]) + list(ids[len(ids) - (limit - head) :])
    return list(ids[:limit])


def encode_prompts(
    samples: Sequence[Sample],
    cfg: DataConfig,
    tokenizer: Any,
    registry: Registry | None,
    processor: Processor | None = None,
) -> tuple[list[EncodedPrompt], dict[str, int]]:
    """Render and tokenize ``samples``, enforcing ``data.max_prompt_length``: an overlong prompt is dropped and
    counted with ``data.filter_overlong_prompts``, else ``data.truncation`` decides (``error`` raises
    :class:`DataError`; else :func:`truncate_ids`). A prompt with images needs the model's ``processor``, counts
    its images' feature tokens and is never cut (the cut could split an image). A sample whose prompt cannot be
    rendered raises, or with ``data.skip_invalid`` is skipped and counted.

    Counts: ``data/prompts`` (kept), ``data/filtered_overlong``, ``data/truncated``, ``data/invalid_prompts``,
    ``data/prompt_tokens_max`` (longest kept prompt).
    """
    _template_spec(cfg, registry)  # an unknown template name fails before any row
    if cfg.template and cfg.raw_template:
        log.warning("both data.template (%r) and data.raw_template are set; using data.template", cfg.template)
    if (
        cfg.apply_chat_template
        and not _has_chat_template(tokenizer)
        and any(not isinstance(s.prompt, str) for s in samples)
    ):
        log.warning("the tokenizer has no chat template; chat messages are rendered as 'role: content' lines")

    rendered, invalid = _render_all(samples, cfg, tokenizer, registry, processor)
    ids = _tokenize_rendered(rendered, tokenizer)
    with_images = _encode_images(rendered, processor)

    limit = cfg.max_prompt_length
    out: list[EncodedPrompt] = []
    filtered = truncated = 0
    longest = 0
    for (s, text, templated, messages), tok, image_ids in zip(rendered, ids, with_images, strict=True):
        assert tok is not None
        engine_ids = None
        if image_ids is not None:  # the pixel inputs are dropped: made again when a step needs them
            engine_ids, tok, _ = image_ids
        if len(tok) > limit:
            if cfg.filter_overlong_prompts:
                filtered += 1
                continue
            if image_ids is not None:
                raise DataError(
                    f"{s.origin}: the prompt is {len(tok)} tokens with its images' tokens, more than "
                    f"data.max_prompt_length={limit}; a prompt with images is never cut (the cut could split an "
                    "image): raise data.max_prompt_length, or turn on data.filter_overlong_prompts"
                )
            if cfg.truncation == "error":
                raise DataError(
                    f"{s.origin}: the prompt is {len(tok)} tokens, more than data.max_prompt_length={limit}; "
                    f"raise data.max_prompt_length, turn on data.filter_overlong_prompts to drop such prompts, "
                    f"or set data.truncation to left/right/middle"
                )
            tok = truncate_ids(tok, limit, cfg.truncation)
            text = tokenizer.decode(tok, skip_special_tokens=False)
            truncated += 1
        longest = max(longest, len(tok))
        vision = {"processor": processor, "special_tokens": not templated} if engine_ids is not None else {}
        out.append(EncodedPrompt(s, text, tok, messages, engine_ids=engine_ids, **vision))

    if samples and not out:
        raise DataError(
            f"no prompts left of {len(samples)}: {filtered} longer than data.max_prompt_length={limit} were "
            f"filtered and {invalid} could not be rendered; raise data.max_prompt_length or fix the data"
        )
    if filtered:
        log.info("filtered %d prompts longer than %d tokens (data.filter_overlong_prompts)", filtered, limit)
    counts = {
        "data/prompts": len(out),
        "data/filtered_overlong": filtered,
        "data/truncated": truncated,
        "data/invalid_prompts": invalid,
        "data/prompt_tokens_max": longest,
    }
    return out, counts
