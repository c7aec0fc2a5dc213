"""The options of the ``tinyv`` reward (``reward.options.tinyv``), declared once: the pydantic model :class:`Options`.

The reward registers it (``@reward(..., options=Options)``), so the kernel validates ``reward.options.tinyv``
at start-up, before any model loads, and passes the validated values to the reward as keywords. The reward
and the run hooks parse them again with :func:`parse_options` (cheap), which words a problem as an
:class:`OptionError` naming the option, for configs that did not go through the kernel's check.
"""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from plugrl.options import AboveZero, AtLeastZero, Count, EnvVarName, PluginOptions, PositiveCount
from plugrl.options import InvalidOption as _Invalid
from plugrl.options import invalid_of as _invalid
from plugrl.options import number as _number

Setup = Literal["tinyv_only", "addon", "mixed"]
TemplateName = Literal["tinyv", "rubric"]
Fallback = Literal["rule", "zero"]
SETUPS, TEMPLATE_NAMES, FALLBACKS = get_args(Setup), get_args(TemplateName), get_args(Fallback)
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MAX_TOKENS = {"tinyv": 16, "rubric": 512}
# a 2,048-token verifier context (the README's CPU launch args) minus the rubric's 512 reply tokens
DEFAULT_MAX_PROMPT_TOKENS = 1536
MIN_TEXT_TOKENS = 128  # max_prompt_tokens must leave at least this much room for the texts
LOCAL_HOSTS = ("127.0.0.1", "localhost")
SERVER_ARGS = ("--host", "--port", "--model", "--served-model-name")  # what launch sets itself

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHERE = "reward.options.tinyv"

F = TypeVar("F", bound=Callable[..., Any])


class OptionError(ValueError):
    """An option of ``reward.options.tinyv`` is wrong; the message names it and says what it takes."""


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _Invalid("must be true or false")


def _choice(value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise _Invalid(f"must be one of {', '.join(choices)}", form="{key} {text}; got {value!r}")
    return value


def _args(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, Sequence) and all(isinstance(v, (str, int, float)) for v in value):
        return tuple(str(v) for v in value)
    raise _Invalid("must be a list of command-line arguments")


class Options(PluginOptions):
    """The options of the ``tinyv`` reward (``reward.options.tinyv``); see the plugin README for what each does.

    Validated field by field, in the order declared: a check that depends on another option (``weight`` on
    ``setup``, ``max_tokens`` and ``max_prompt_tokens`` on ``template``, ``base_url`` and ``launch_args`` on
    ``launch``) reads the value validated before it, so each problem is reported under the option to change.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # first, so that a key pasted into the config is what parse_options reports
    api_key: None = Field(
        None, exclude=True, repr=False, description="refused: keys never go in the config (see api_key_env)"
    )
    setup: Setup = Field(
        "addon",
        description="tinyv_only: the verdict; addon: 1 when the rule says right, else verdict x weight; "
        "mixed: weight x verdict + (1 - weight) x rule",
    )
    weight: float = Field(1.0, description="TinyV's tinyv_weight (>= 0; at most 1 for setup mixed)")
    template: TemplateName = Field(
        "tinyv", description="the verifier prompt: tinyv (a True/False verdict) or rubric (a score out of 10)"
    )
    model: str = Field(
        description="the model name the verifier server serves (with launch: true, a model path or local:NAME "
        "to start it with)"
    )
    launch: bool = Field(False, description="start the verifier server for the run (and stop it at the end)")
    base_url: str = Field(
        DEFAULT_BASE_URL,
        description="the verifier's OpenAI-compatible API; with launch: true, http://127.0.0.1:PORT/v1",
    )
    launch_args: tuple[str, ...] = Field(
        (), description="more arguments for the server launch starts (a list, or one string)"
    )
    launch_timeout_s: AboveZero = Field(300.0, description="how long a launched server may take to answer (> 0)")
    api_key_env: EnvVarName = Field(
        "OPENAI_API_KEY",
        description="the NAME of the environment variable holding the API key; unset: the dummy key local "
        "servers accept",
    )
    temperature: AtLeastZero = Field(0.0, description="the verifier's sampling temperature (>= 0)")
    max_tokens: int = Field(
        None,  # type: ignore[assignment]  # filled in by template (DEFAULT_MAX_TOKENS)
        validate_default=True,
        description="the verifier's reply budget (>= 1); default 16 for template tinyv, 512 for rubric",
    )
    request_timeout_s: AboveZero = Field(30.0, description="the time limit of one request (> 0)")
    retries: Count = Field(3, description="attempts after the first (>= 0), backoff_s x 2^i apart")
    backoff_s: AtLeastZero = Field(0.5, description="the first wait between attempts (>= 0)")
    fallback: Fallback = Field(
        "rule", description="the score of a failed verification: rule (the rule's score) or zero"
    )
    max_question_chars: PositiveCount = Field(
        4000, description="the question's size bound in the prompt, in characters"
    )
    max_answer_chars: PositiveCount = Field(4000, description="the answer's size bound in the prompt, in characters")
    max_prompt_tokens: int | None = Field(
        DEFAULT_MAX_PROMPT_TOKENS,
        description="the prompt's size bound in the verifier's tokens: the server's context (--max-model-len) "
        "minus max_tokens; null: no token bound",
    )
    tokenizer_path: str | None = Field(
        None,
        description="the verifier's tokenizer (a local directory, or local:NAME), to count prompt tokens "
        "exactly; without it the count is a worst-case estimate",
    )

    @property
    def worst_case_s(self) -> float:
        """The longest one verification can take: every attempt timing out, plus the waits between them."""
        waits = sum(self.backoff_s * 2**i for i in range(self.retries))
        return (self.retries + 1) * self.request_timeout_s + waits

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.hostname or "", port

    # ------------------------------------------------------------------ one check per option

    @field_validator("setup", mode="before")
    @classmethod
    def _setup(cls, value: Any) -> str:
        return _choice(value, SETUPS)

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, value: Any) -> str:
        return _choice(value, TEMPLATE_NAMES)

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback(cls, value: Any) -> str:
        return _choice(value, FALLBACKS)

    @field_validator("weight", mode="before")
    @classmethod
    def _weight(cls, value: Any, info: ValidationInfo) -> float:
        weight = _number(value, low=0.0)
        if info.data.get("setup") == "mixed" and weight > 1.0:
            raise _Invalid("must be in [0, 1] for setup mixed")
        return weight

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(
                "is required: the model name the verifier server serves (with launch: true, a model path or "
                "local:NAME to start it with)",
                form="{key} {text}",
            )
        return value.strip()

    @field_validator("launch", mode="before")
    @classmethod
    def _launch(cls, value: Any) -> bool:
        return _bool(value)

    @field_validator("base_url", mode="before")
    @classmethod
    def _base_url(cls, value: Any, info: ValidationInfo) -> str:
        parts = urlsplit(value) if isinstance(value, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Invalid(f"must be an http(s) URL such as {DEFAULT_BASE_URL}")
        if info.data.get("launch") and (
            parts.hostname not in LOCAL_HOSTS or parts.scheme != "http" or parts.port is None
        ):
            raise _Invalid(
                "must be http://127.0.0.1:PORT/v1 (with an explicit port) with launch: true, which starts the "
                "verifier server on this machine, bound to 127.0.0.1 only"
            )
        return value.rstrip("/")

    @field_validator("launch_args", mode="before")
    @classmethod
    def _launch_args(cls, value: Any, info: ValidationInfo) -> tuple[str, ...]:
        args = _args(value)
        taken = sorted({a.split("=", 1)[0] for a in args} & set(SERVER_ARGS))
        if info.data.get("launch") and taken:
            raise _Invalid(
                f"must not set {', '.join(taken)} with launch: true: the plugin starts the server bound to "
                "127.0.0.1 on the port of base_url, serving the model named by model under that name"
            )
        return args

    @field_validator("api_key", mode="before")
    @classmethod
    def _api_key(cls, value: Any) -> None:
        raise _Invalid(
            "keep keys out of configs; put it in an environment variable and name that variable in "
            f"{_WHERE}.api_key_env",
            form="{where} takes no api_key: {text}",
            echo=False,
        )

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens(cls, value: Any, info: ValidationInfo) -> int:
        if value is None:  # by template
            return DEFAULT_MAX_TOKENS.get(info.data.get("template", "tinyv"), DEFAULT_MAX_TOKENS["tinyv"])
        return _number(value, low=1, integer=True)

    @field_validator("max_prompt_tokens", mode="before")
    @classmethod
    def _max_prompt_tokens(cls, value: Any, info: ValidationInfo) -> int | None:
        if value is None:  # null: no token bound (a server whose context outgrows the character bounds)
            return None
        limit = _number(value, low=1, integer=True)
        template = info.data.get("template")
        if template is None:  # the template is wrong: reported under its own name
            return limit
        from .prompts import frame_tokens

        fields = {k: "" for k in ("question", "ground_truth", "answer", "criteria")}
        if template == "tinyv":
            fields.pop("criteria")
        least = frame_tokens(template, fields) + MIN_TEXT_TOKENS
        if limit < least:
            raise _Invalid(
                f"leaves no room for the question and the answer: the {template} template and the chat markup "
                f"take up to {least - MIN_TEXT_TOKENS} tokens. Set it to the verifier server's context "
                f"(--max-model-len) minus max_tokens, at least {least} (default {DEFAULT_MAX_PROMPT_TOKENS}, for "
                "a 2048-token context), or null for no token bound",
                form="{key}={value} {text}",
            )
        return limit

    @field_validator("tokenizer_path", mode="before")
    @classmethod
    def _tokenizer_path(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(
                "must be a local directory (or local:NAME) holding the verifier's tokenizer; leave it out to "
                "bound prompts by a worst-case estimate"
            )
        return value.strip()


OPTION_NAMES = tuple(name for name, f in Options.model_fields.items() if not f.exclude)


def _message(err: Mapping[str, Any]) -> str:
    """One pydantic error of :class:`Options` as :func:`parse_options` words it."""
    key = f"{_WHERE}.{'.'.join(str(p) for p in err['loc'])}"
    if err["type"] == "missing":
        field = Options.model_fields.get(str(err["loc"][0]))
        return f"{key} is required" + (f": {field.description}" if field and field.description else "")
    invalid = _invalid(err)
    if invalid is None:  # a check of pydantic's own (none is expected: every option has its own check)
        return f"{key}: {err['msg']} (got {err.get('input')!r})"
    return invalid.form.format(where=_WHERE, key=key, text=invalid.text, value=err.get("input"))


def parse_options(raw: Mapping[str, Any] | None = None, **kwargs: Any) -> Options:
    """Validated :class:`Options` from ``raw`` (and keywords); raises :class:`OptionError` naming the option.

    ``raw`` may be what the kernel validated (``Options.model_dump(mode="json")``: lists for tuples, the
    defaults filled in): that parses to the same options.
    """
    given = {**dict(raw or {}), **kwargs}
    unknown = sorted(str(k) for k in set(given) - set(Options.model_fields))
    if unknown:
        raise OptionError(f"unknown {_WHERE}: {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}")
    try:
        return Options.model_validate(given)
    except ValidationError as e:
        raise OptionError(_message(e.errors()[0])) from None


def with_option_parameters(fn: F) -> F:
    """``fn(completion, ground_truth, *, <context>, **options)``, shown with one keyword parameter per option
    of :class:`Options` in place of ``**options`` (``fn.__signature__``; the function is unchanged).

    The kernel's reward runner passes a reward only the keywords its signature declares and refuses options
    it does not take; this way the declaration stays :class:`Options` alone.
    """
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    for name, field in Options.model_fields.items():
        if field.exclude:
            continue
        default = inspect.Parameter.empty if field.is_required() else field.default
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    fn.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return fn
