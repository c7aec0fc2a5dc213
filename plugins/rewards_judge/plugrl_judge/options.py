"""The options of the ``judge`` reward (``reward.options.judge``), declared once: the pydantic model :class:`Options`.

The reward registers it (``@reward(..., options=Options)``), so the kernel validates ``reward.options.judge`` at
start-up, before any model loads, and hands the validated values to the reward as keywords. The reward and the
run hooks parse them again with :func:`parse_options` (cached per distinct value), which words a problem as an
:class:`OptionError` naming ``reward.options.judge.<key>``.

Fields are validated in the order declared: a check that depends on another option (``labels`` and ``key`` on
``parser``, ``base_url`` and ``launch_args`` on ``launch``) reads the value validated before it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from plugrl.options import (
    AboveZero,
    AtLeastZero,
    Count,
    EnvVarName,
    PluginOptions,
    PositiveCount,
)
from plugrl.options import InvalidOption as _Invalid
from plugrl.options import invalid_of as _invalid
from plugrl_model_servers.options import SERVER_OPTIONS, server_option

from .parsers import REDUCTIONS, load_function
from .template import check_template

WHERE = "reward.options.judge"
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
BUILTIN_PARSERS = ("number", "label", "json")
# request keys the judge sets itself: extra_body must not override them
OWN_REQUEST_KEYS = ("model", "messages", "n", "temperature", "max_tokens", "stream")

Reduce = Literal["mean", "median", "majority", "min", "max"]


class OptionError(ValueError):
    """An option of ``reward.options.judge`` is wrong; the message names it and says what it takes."""


def _bool(value: Any) -> bool:
    # launch: true or false only. TinyV's launch also takes yes/no, 1/0 and those as strings: the two plugins read it
    # differently on purpose, so each passes its own reading to plugrl.options.server_option (read_launch)
    if isinstance(value, bool):
        return value
    raise _Invalid("must be true or false")


class Options(PluginOptions):
    """The options of the ``judge`` reward (``reward.options.judge``); the plugin README says what each does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # first, so that a key pasted into the config is what parse_options reports
    api_key: None = Field(
        None, exclude=True, repr=False, description="refused: keys never go in the config (see api_key_env)"
    )
    model: str = Field(
        description="the model name the judge's server serves (with launch: true, a model path, hub id or "
        "local:NAME to start it with; requests name it the same)"
    )
    launch: bool = Field(False, description="start a local vLLM server for the judge for the run, stop it at the end")
    base_url: str = Field(
        DEFAULT_BASE_URL, description="the judge's OpenAI-compatible API; with launch: true, http://127.0.0.1:PORT/v1"
    )
    launch_args: tuple[str, ...] = Field(
        (), description="more arguments for the vLLM server launch starts (a list, or one string)"
    )
    launch_timeout_s: AboveZero = Field(300.0, description="how long a launched server may take to answer (> 0)")
    api_key_env: EnvVarName = Field(
        "OPENAI_API_KEY",
        description="the NAME of the environment variable holding the API key; unset: the dummy key local "
        "servers accept",
    )
    prompt_template: str = Field(
        description="the judge's prompt: a text with placeholders ({question}, {completion}, {ground_truth}, "
        "{extra_info.KEY}, ...), or the path of a file holding one"
    )
    system_prompt: str | None = Field(None, description="a system message before the prompt (none by default)")
    parser: str = Field(
        "number",
        description="how to read the verdict: number (the last number; see pattern, range), label (see labels), "
        "json (see key), or module:function, your own function(reply) -> score or None",
    )
    pattern: str | None = Field(
        None,
        description="a regular expression locating the verdict (number, label): its last match's first group, "
        "else the whole match",
    )
    labels: dict[str, float] | None = Field(
        None, validate_default=True, description="label -> score, for parser label (and json string values)"
    )
    key: str | None = Field(
        None, validate_default=True, description="the JSON key holding the verdict, for parser json (a.b: nested)"
    )
    range: tuple[float, float] | None = Field(
        None,
        description="[lo, hi]: a numeric verdict must lie in it and is scaled onto [0, 1]; outside: no verdict",
    )
    samples: PositiveCount = Field(1, description="judgements per completion (the request's n; >= 1)")
    reduce: Reduce = Field("mean", description="how the samples' scores become one: mean, median, majority, min, max")
    temperature: AtLeastZero = Field(0.0, description="the judge's sampling temperature (>= 0)")
    max_tokens: PositiveCount = Field(256, description="the judge's reply budget (>= 1)")
    timeout_s: AboveZero = Field(60.0, description="the time limit of one request (> 0)")
    retries: Count = Field(2, description="attempts after the first (>= 0), backoff_s x 2^i apart")
    backoff_s: AtLeastZero = Field(0.5, description="the first wait between attempts (>= 0)")
    concurrency: PositiveCount = Field(16, description="requests in flight to the judge at once, per process (>= 1)")
    max_completion_chars: PositiveCount = Field(
        16000, description="the completion's size bound in the prompt, in characters: its end is kept (>= 1)"
    )
    extra_body: dict[str, Any] | None = Field(
        None,
        description="more request fields, sent as given (e.g. vLLM's structured_outputs: {regex: ...}); not "
        + ", ".join(OWN_REQUEST_KEYS),
    )

    # ------------------------------------------------------------------ derived

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url)
        return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def prompt_text(self) -> str:
        return read_prompt_template(self.prompt_template)[0]

    @property
    def worst_case_s(self) -> float:
        """The longest one judgement can take: every attempt timing out, plus the waits between them."""
        waits = sum(self.backoff_s * 2**i for i in range(self.retries))
        return (self.retries + 1) * (self.timeout_s + 1.0) + waits

    @property
    def compiled_pattern(self) -> re.Pattern[str] | None:
        return _compile(self.pattern) if self.pattern is not None else None

    # ------------------------------------------------------------------ one check per option

    @field_validator(*SERVER_OPTIONS, mode="before")
    @classmethod
    def _server_option(cls, value: Any, info: ValidationInfo) -> Any:
        """model, launch (read by :func:`_bool`), base_url, launch_args, api_key: checked as by every plugin that
        may launch its model's server."""
        return server_option(
            value, info, where=WHERE, server="the judge's server", example=DEFAULT_BASE_URL, read_launch=_bool
        )

    @field_validator("prompt_template", mode="before")
    @classmethod
    def _prompt_template(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(
                "is required: the judge's prompt, a text with placeholders such as {question} and {completion}, "
                "or the path of a file holding one",
                form="{key} {text}",
            )
        text, source = read_prompt_template(value)
        problem = check_template(text)
        if problem:
            raise _Invalid(f"{source}{problem}", form="{key} {text}")
        return value

    @field_validator("parser", mode="before")
    @classmethod
    def _parser(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Invalid("must be number, label, json, or module:function")
        value = value.strip()
        if value in BUILTIN_PARSERS:
            return value
        if ":" not in value:
            raise _Invalid(
                "must be number, label, json, or module:function (your own function of the reply's text, "
                "returning a score or None)"
            )
        try:
            load_function(value)
        except Exception as e:  # the user's module: any import error is theirs to see
            raise _Invalid(
                f"names a function that cannot be loaded ({type(e).__name__}: {e}); check that the module is "
                "importable from the trainer (installed, or on PYTHONPATH) and that it defines the function"
            ) from None
        return value

    @field_validator("pattern", mode="before")
    @classmethod
    def _pattern(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise _Invalid("must be a regular expression, e.g. 'Score: (\\d+)'")
        try:
            compiled = _compile(value)
        except re.error as e:
            raise _Invalid(f"is not a valid regular expression ({e})") from None
        if compiled.groups > 1:
            raise _Invalid("must have at most one group (the verdict); make the others non-capturing: (?:...)")
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any, info: ValidationInfo) -> dict[str, float] | None:
        parser = info.data.get("parser")
        if value is None:
            if parser == "label":
                raise _Invalid(
                    "is required with parser label: a mapping of each label to its score, e.g. "
                    "{correct: 1, incorrect: 0}",
                    form="{key} {text}",
                )
            return None
        if not isinstance(value, Mapping) or not value:
            raise _Invalid("must be a mapping of label to score, e.g. {correct: 1, incorrect: 0}")
        out: dict[str, float] = {}
        for label, score in value.items():
            if not isinstance(label, str) or not label.strip():
                raise _Invalid(f"has a label that is not a word: {label!r}", form="{key} {text}")
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise _Invalid(
                    f"gives the label {label!r} the score {score!r}: scores are numbers", form="{key} {text}"
                )
            out[label.strip()] = float(score)
        return out

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any, info: ValidationInfo) -> str | None:
        if value is None:
            if info.data.get("parser") == "json":
                raise _Invalid(
                    'is required with parser json: the key holding the verdict, e.g. score for {"score": 7}',
                    form="{key} {text}",
                )
            return None
        if not isinstance(value, str) or not value.strip():
            raise _Invalid("must be a JSON key, e.g. score (a.b for a nested one)")
        return value.strip()

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, value: Any) -> tuple[float, float] | None:
        if value is None:
            return None
        ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
        if ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
            lo, hi = float(value[0]), float(value[1])
            if lo < hi:
                return lo, hi
        raise _Invalid("must be [lo, hi] with lo < hi, e.g. [0, 10] for a score out of 10")

    @field_validator("reduce", mode="before")
    @classmethod
    def _reduce(cls, value: Any) -> str:
        if value not in REDUCTIONS:
            raise _Invalid(f"must be one of {', '.join(REDUCTIONS)}")
        return value

    @field_validator("extra_body", mode="before")
    @classmethod
    def _extra_body(cls, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise _Invalid("must be a mapping of request fields, e.g. {structured_outputs: {regex: '[0-9]'}}")
        own = sorted(set(value) & set(OWN_REQUEST_KEYS))
        if own:
            raise _Invalid(
                f"must not set {', '.join(own)}: the judge sets them (model, samples, temperature, max_tokens)",
                form="{key} {text}",
            )
        try:
            json.dumps(dict(value))
        except (TypeError, ValueError) as e:
            raise _Invalid(f"must hold JSON values only ({e})", form="{key} {text}") from None
        return dict(value)


OPTION_NAMES = tuple(name for name, f in Options.model_fields.items() if not f.exclude)


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.DOTALL)


@functools.lru_cache(maxsize=32)
def _read_file(path: str) -> str:
    return Path(path).expanduser().read_text(encoding="utf-8")  # once per process: options parse on every call


def read_prompt_template(value: str) -> tuple[str, str]:
    """(the template's text, how an error names where it came from): the file a one-line value names when it
    exists, else the value itself when it has a placeholder; an error saying what to fix otherwise."""
    single = "\n" not in value and len(value) < 4096
    path = Path(value.strip()).expanduser() if single else None
    if path is not None and path.is_file():
        try:
            return _read_file(str(path)), f"names the file {value.strip()!r}, which "
        except (OSError, UnicodeDecodeError) as e:
            raise _Invalid(
                f"names the file {value.strip()!r}, which cannot be read as UTF-8 text ({type(e).__name__}: {e})",
                form="{key} {text}",
            ) from None
    if "{" in value:
        return value, ""
    why = "is a directory" if path is not None and path.is_dir() else "does not exist"
    if path is not None and not path.is_absolute():
        why += f" in {Path.cwd()}"
    raise _Invalid(
        "is neither a template (it has no placeholder such as {completion}) nor a readable file "
        f"({value.strip()[:200]!r} {why}): give the path of a file holding the template, or the template's text",
        form="{key} {text}",
    )


def _message(err: Mapping[str, Any]) -> str:
    key = f"{WHERE}.{'.'.join(str(p) for p in err['loc'])}"
    if err["type"] == "missing":
        field = Options.model_fields.get(str(err["loc"][0]))
        return f"{key} is required" + (f": {field.description}" if field and field.description else "")
    invalid = _invalid(err)
    if invalid is None:  # a check of pydantic's own
        return f"{key}: {err['msg']} (got {err.get('input')!r})"
    return invalid.form.format(where=WHERE, key=key, text=invalid.text, value=err.get("input"))


@functools.lru_cache(maxsize=64)
def _parse_json(given: str) -> Options:
    try:
        return Options.model_validate(json.loads(given))
    except ValidationError as e:
        raise OptionError(_message(e.errors()[0])) from None


def parse_options(raw: Mapping[str, Any] | None = None, **kwargs: Any) -> Options:
    """Validated :class:`Options` from ``raw`` (and keywords); :class:`OptionError` naming the option otherwise.
    Cached per distinct value: the reward parses its keywords on every call."""
    given = {**dict(raw or {}), **kwargs}
    unknown = sorted(str(k) for k in set(given) - set(Options.model_fields))
    if unknown:
        raise OptionError(f"unknown {WHERE}: {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}")
    try:
        key = json.dumps(given, sort_keys=True)
    except (TypeError, ValueError):  # not JSON (a config built in code): validate without the cache
        try:
            return Options.model_validate(given)
        except ValidationError as e:
            raise OptionError(_message(e.errors()[0])) from None
    return _parse_json(key)
