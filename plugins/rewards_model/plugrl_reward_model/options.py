"""The options of the ``reward_model`` reward (``reward.options.reward_model``), declared once: :class:`Options`.

The reward registers it (``@reward(..., options=Options)``), so the kernel validates
``reward.options.reward_model`` at start-up, before any model loads, and names the key of a bad value
(``reward.options.reward_model.max_tokens_per_batch: must be >= 1``); a missing ``path`` is reported as
required. What a value alone cannot tell (the model at ``path`` has one output) is checked by the
plugin's ``plugrl_check_config`` hook, also before any model loads.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from plugrl.options import AboveZero, InvalidOption, PluginOptions, PositiveCount

WHERE = "reward.options.reward_model"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
# the options that decide which model is loaded where: one loaded copy per distinct set of them
MODEL_KEYS = (
    "path",
    "tokenizer_path",
    "dtype",
    "device",
    "attn_implementation",
    "trust_remote_code",
    "process",
    "shard",
)


def _finite(value: Any) -> float:
    if isinstance(value, bool):
        raise InvalidOption("must be a number")
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidOption("must be a number") from None
    if not math.isfinite(result):
        raise InvalidOption("must be a finite number")
    return result


Finite = Annotated[float, BeforeValidator(_finite)]


class Options(PluginOptions):
    """``reward.options.reward_model``: which reward model scores the completions, and how."""

    path: str = Field(
        description="The reward model: a local directory, local:NAME, or a Hugging Face Hub id; a sequence "
        "classifier with one output (AutoModelForSequenceClassification, num_labels 1)."
    )
    tokenizer_path: str | None = Field(None, description="Its tokenizer, when not beside the weights at path.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The model's dtype: auto is bfloat16 where the device computes it natively, else float32."
    )
    device: str = Field(
        "auto", description="cpu, cuda, cuda:N, or auto: the trainer's current GPU when there is one, else cpu."
    )
    process: Literal["trainer", "separate"] = Field(
        "trainer",
        description="trainer: the model lives in the trainer's process (loaded once per process, kept across steps); "
        "separate: in a child process of its own, which holds its own memory and CUDA context.",
    )
    shard: bool = Field(
        False,
        description="Under torchrun, shard the model's weights over every rank with FSDP2 (rank 0 reads them, each "
        "rank keeps about 1/world of them): for a reward model too large for one device. Every rank then scores "
        "every round together (a collective). In a single process it has no effect (said once at start).",
    )
    max_tokens_per_batch: PositiveCount = Field(
        8192, description="Token budget of one forward pass: padded length x sequences (one longer sequence alone)."
    )
    max_length: PositiveCount | None = Field(
        None,
        description="Tokens kept of each (prompt, response) text, its end (where the score is read) kept; "
        "default: the model's max_position_embeddings.",
    )
    chat_template: bool = Field(
        True,
        description="Render chat prompts plus the response with the reward model's own chat template (when its "
        "tokenizer has one); false, or a tokenizer without one: 'role: content' lines.",
    )
    normalize: Literal["none", "running", "fixed"] = Field(
        "none",
        description="none: the raw score; running: (raw - mean) / std over every score seen so far in this "
        "process (this batch included); fixed: (raw - shift) / scale.",
    )
    shift: Finite = Field(0.0, description="With normalize: fixed, subtracted from the raw score.")
    scale: AboveZero = Field(1.0, description="With normalize: fixed, what the shifted score is divided by.")
    clip: AboveZero | None = Field(None, description="Clip the (normalised) score to [-clip, clip].")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None, description="transformers' attention implementation; default: transformers' choice (sdpa)."
    )
    trust_remote_code: bool = Field(False, description="Allow the model's own code (transformers' flag).")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise InvalidOption("must be auto, cpu, cuda or cuda:N")
        return value

    @model_validator(mode="after")
    def _fixed_only(self) -> Options:
        if self.normalize != "fixed" and (self.shift != 0.0 or self.scale != 1.0):
            raise ValueError(
                f"shift and scale apply only with normalize: fixed (normalize is {self.normalize!r}); "
                "set normalize: fixed, or remove them"
            )
        return self

    @model_validator(mode="after")
    def _shard_in_trainer(self) -> Options:
        if self.shard and self.process == "separate":
            raise ValueError(
                "shard: true shards the model over the trainer's ranks, but process: separate loads it in a child "
                "process outside them; set process: trainer, or shard: false"
            )
        return self

    def model_key(self) -> str:
        """What identifies the loaded model: the options that change which weights load, where and how."""
        return json.dumps({k: getattr(self, k) for k in MODEL_KEYS}, sort_keys=True)

    def key(self) -> str:
        """Every option: what identifies the running normalisation statistics."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def parse(raw: Any) -> Options:
    """``raw`` (a mapping, as the config holds it) validated; a ValueError naming ``reward.options.reward_model``."""
    from pydantic import ValidationError

    try:
        return Options.model_validate(dict(raw))
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            problems.append(f"{WHERE}{'.' + key if key else ''}: {err['msg'].removeprefix('Value error, ')}")
        raise ValueError("; ".join(problems)) from None
