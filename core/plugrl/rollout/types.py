"""What every rollout engine shares: a generated response, the sampling settings, the engine interface,
and the text the rewards score. The engines themselves import this, never the package that picks them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class Rollout:
    """One generated response.

    response_ids are the tokens the policy sampled, as it sampled them: they include the EOS token
    when generation stopped on it, and the tokens of a stop string (``SamplingSettings.stop``) up to
    the one that completed it, whatever ``include_stop_str_in_output`` says (as verl and TRL train
    on vLLM's ``token_ids``), so the policy learns to stop. That flag shapes the text the rewards
    score: :func:`response_texts`.
    logprobs: the engine's log-probability of each response token under the distribution it was sampled
    from (temperature, top-k and top-p applied; greedy: the model's), or None: vLLM reports them with
    ``rollout.calculate_log_probs``, the HF engine always.
    finish_reason: "stop" (EOS or a stop string) or "length" (hit max tokens).
    policy_mask: per response token, 1 where the policy sampled it, 0 where a tool or an environment
    wrote it (multi-turn episodes); None: every token is the policy's.
    steps: step-wise multi-turn runs (``rollout.step_wise``): each policy turn as its own rollout, its
    prompt the whole context that turn saw; these are the sequences trained on. None otherwise.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    policy_mask: list[int] | None = None
    steps: list[Rollout] | None = None


class ImagePrompt:
    """A prompt with images, as the engines take it (:mod:`plugrl.vlm`).

    ids: the token ids with one image token per image: vLLM expands each itself from the image.
    images: the decoded images (RGB ``PIL.Image``), in the order of their tokens.
    model_ids: the ids with each image token expanded by the model's processor: what the model reads,
        what the rollout's ``prompt_ids`` are (vLLM's expansion is checked against them) and what is trained on.
    pixels: the images' :class:`~plugrl.vlm.Pixels` (the HF engine feeds them), None, or a function of
        ``images`` that makes them when :attr:`pixels` is first read: the vLLM engine never reads them, so no
        processor runs for it.
    """

    def __init__(self, ids: list[int], images: list[Any], model_ids: list[int], pixels: Any = None):
        self.ids, self.images, self.model_ids = ids, images, model_ids
        self._pixels = pixels

    @property
    def pixels(self) -> Any:
        if callable(self._pixels):
            self._pixels = self._pixels(self.images)
        return self._pixels

    def continued(self, tail: Sequence[int]) -> ImagePrompt:
        """This prompt followed by ``tail``: text tokens after the images, the same ids for the engine and the model
        (a multi-turn episode's turns). The images are shared, and the pixel inputs are made once, by this prompt."""
        return ImagePrompt(self.ids + list(tail), self.images, self.model_ids + list(tail), lambda _: self.pixels)


def prompt_model_ids(prompt: list[int] | ImagePrompt) -> list[int]:
    """The token ids the model reads for an engine prompt (a text prompt's are its ids)."""
    return prompt.model_ids if isinstance(prompt, ImagePrompt) else prompt


@dataclass(frozen=True)
class SamplingSettings:
    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    # per call, for engines that seed each call (HF); vLLM ignores it: its engine is seeded once when built
    # (rollout.seed, see vllm_engine.engine_kwargs)
    seed: int | None = None


def sampling_settings(
    cfg: Any, mode: str, *, seed: int | None = None, n: int | None = None, temperature: float | None = None
) -> SamplingSettings:
    """The sampling of one kind of generation, from the run config (:class:`plugrl.config.Config`): the one
    place that maps config keys to :class:`SamplingSettings`.

    ``mode``: ``train`` (``rollout.n``, ``rollout.temperature``/``top_p``/``top_k``), ``validate``
    (``rollout.val_kwargs``, its seed ``rollout.seed``) or ``greedy`` (one response at temperature 0: ReMax's
    baseline). All share ``data.max_response_length`` and the stop strings. ``n`` and ``temperature``
    override the config's (``plugrl eval --n / --temperature``).
    """
    r = cfg.rollout
    if mode == "train":
        kind = {"n": r.n, "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "seed": seed}
    elif mode == "validate":
        vk = r.val_kwargs
        kind = {"n": vk.n, "temperature": vk.temperature, "top_p": vk.top_p, "top_k": vk.top_k, "seed": r.seed}
    elif mode == "greedy":
        kind = {"n": 1, "temperature": 0.0, "seed": seed}
    else:
        raise ValueError(f"sampling mode {mode!r}: expected train, validate or greedy")
    if n is not None:
        kind["n"] = n
    if temperature is not None:
        kind["temperature"] = temperature
    return SamplingSettings(
        max_tokens=cfg.data.max_response_length,
        stop=tuple(r.stop),
        include_stop_str_in_output=r.include_stop_str_in_output,
        **kind,
    )


def first_stop(text: str, stop: Iterable[str]) -> tuple[int, int] | None:
    """(start, end) of the stop string that completes earliest in ``text`` (ties: the first in ``stop``),
    or None: where vLLM's detokenizer stops."""
    best: tuple[int, int] | None = None
    for s in stop:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or i + len(s) < best[1]):
            best = (i, i + len(s))
    return best


def response_texts(tokenizer, rollouts: Iterable[Rollout], sampling: SamplingSettings) -> list[str]:
    """The text of each rollout that rewards score, the same for every engine.

    The response tokens decoded without special tokens, cut at the first stop string: before it when
    ``sampling.include_stop_str_in_output`` is false (vLLM's ``CompletionOutput.text``), after it when
    true. The trained tokens (``response_ids``) still hold the stop string's tokens either way.
    """
    texts = tokenizer.batch_decode([r.response_ids for r in rollouts], skip_special_tokens=True)
    if not sampling.stop:
        return texts
    out = []
    for t in texts:
        hit = first_stop(t, sampling.stop)
        out.append(t if hit is None else t[: hit[1] if sampling.include_stop_str_in_output else hit[0]])
    return out


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int] | ImagePrompt], sampling: SamplingSettings) -> list[list[Rollout]]:
        """``sampling.n`` rollouts for each prompt (token ids, or an :class:`ImagePrompt`), in prompt order; a
        rollout's ``prompt_ids`` are the ids the model read (an image prompt's ``model_ids``)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the policy's (HF parameter names), in memory."""

    def sleep(self) -> None:
        """Free generation memory while training (a no-op where it frees nothing)."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next generation."""

    def close(self) -> None: ...
