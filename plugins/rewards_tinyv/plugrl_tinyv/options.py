"""The options of the ``tinyv`` reward (``reward.options.tinyv``), validated in one place.

The reward validates them on every call (cheap) and the ``plugrl_run_start`` hook once before
training, so a typo stops the run before the first step rather than failing every sample.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

SETUPS = ("tinyv_only", "addon", "mixed")
TEMPLATE_NAMES = ("tinyv", "rubric")
FALLBACKS = ("rule", "zero")
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MAX_TOKENS = {"tinyv": 16, "rubric": 512}
# a 2,048-token verifier context (the README's CPU launch args) minus the rubric's 512 reply tokens
DEFAULT_MAX_PROMPT_TOKENS = 1536
MIN_TEXT_TOKENS = 128  # max_prompt_tokens must leave at least this much room for the texts
LOCAL_HOSTS = ("127.0.0.1", "localhost")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHERE = "reward.options.tinyv"


class OptionError(ValueError):
    """An option of ``reward.options.tinyv`` is wrong; the message names it and says what it takes."""


@dataclass(frozen=True)
class Options:
    """The validated options; see the plugin README for what each one does."""

    setup: str = "addon"
    weight: float = 1.0
    template: str = "tinyv"
    base_url: str = DEFAULT_BASE_URL
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 16
    request_timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    fallback: str = "rule"
    launch: bool = False
    launch_args: tuple[str, ...] = ()
    launch_timeout_s: float = 300.0
    max_question_chars: int = 4000
    max_answer_chars: int = 4000
    max_prompt_tokens: int | None = DEFAULT_MAX_PROMPT_TOKENS
    tokenizer_path: str | None = None

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


OPTION_NAMES = tuple(f.name for f in fields(Options))


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise OptionError(f"{_WHERE}.{name} must be true or false, got {value!r}")


def _number(name: str, value: Any, *, low: float, integer: bool = False, strict: bool = False) -> Any:
    if isinstance(value, bool):
        raise OptionError(f"{_WHERE}.{name} must be a number, got {value!r}")
    try:
        number = int(value) if integer else float(value)
        fractional = integer and float(value) != number
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf), float(10**400)
        raise OptionError(f"{_WHERE}.{name} must be a number, got {value!r}") from None
    if fractional:
        raise OptionError(f"{_WHERE}.{name} must be a whole number, got {value!r}")
    if number < low or (strict and number == low) or number != number or number == float("inf"):
        raise OptionError(f"{_WHERE}.{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")
    return number


def _choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise OptionError(f"{_WHERE}.{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _args(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, Sequence) and all(isinstance(v, (str, int, float)) for v in value):
        return tuple(str(v) for v in value)
    raise OptionError(f"{_WHERE}.launch_args must be a list of command-line arguments, got {value!r}")


def _max_prompt_tokens(value: Any, template: str) -> int | None:
    if value is None:  # null: no token bound (a server whose context outgrows the character bounds)
        return None
    from .prompts import frame_tokens

    fields = {k: "" for k in ("question", "ground_truth", "answer", "criteria")}
    if template == "tinyv":
        fields.pop("criteria")
    least = frame_tokens(template, fields) + MIN_TEXT_TOKENS
    limit = _number("max_prompt_tokens", value, low=1, integer=True)
    if limit < least:
        raise OptionError(
            f"{_WHERE}.max_prompt_tokens={limit} leaves no room for the question and the answer: the "
            f"{template} template and the chat markup take up to {least - MIN_TEXT_TOKENS} tokens. Set it to the "
            f"verifier server's context (--max-model-len) minus max_tokens, at least {least} "
            f"(default {DEFAULT_MAX_PROMPT_TOKENS}, for a 2048-token context), or null for no token bound"
        )
    return limit


def _tokenizer_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise OptionError(
            f"{_WHERE}.tokenizer_path must be a local directory (or local:NAME) holding the verifier's "
            f"tokenizer, got {value!r}; leave it out to bound prompts by a worst-case estimate"
        )
    return value.strip()


def parse_options(raw: Mapping[str, Any] | None = None, **kwargs: Any) -> Options:
    """Validated :class:`Options` from ``raw`` (and keywords); raises :class:`OptionError` naming the option."""
    given = {**dict(raw or {}), **kwargs}
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        if "api_key" in unknown:
            raise OptionError(
                f"{_WHERE} takes no api_key: keep keys out of configs; put it in an environment variable "
                f"and name that variable in {_WHERE}.api_key_env"
            )
        raise OptionError(f"unknown {_WHERE}: {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}")
    d = Options()
    setup = _choice("setup", given.get("setup", d.setup), SETUPS)
    template = _choice("template", given.get("template", d.template), TEMPLATE_NAMES)
    fallback = _choice("fallback", given.get("fallback", d.fallback), FALLBACKS)
    weight = _number("weight", given.get("weight", d.weight), low=0.0)
    if setup == "mixed" and weight > 1.0:
        raise OptionError(f"{_WHERE}.weight must be in [0, 1] for setup mixed, got {weight!r}")
    model = given.get("model")
    if not isinstance(model, str) or not model.strip():
        raise OptionError(
            f"{_WHERE}.model is required: the model name the verifier server serves "
            "(with launch: true, a model path or local:NAME to start it with)"
        )
    base_url = given.get("base_url", d.base_url)
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise OptionError(f"{_WHERE}.base_url must be an http(s) URL such as {DEFAULT_BASE_URL}, got {base_url!r}")
    api_key_env = given.get("api_key_env", d.api_key_env)
    if not isinstance(api_key_env, str) or not _ENV_NAME.match(api_key_env):
        # never echo the value: a key pasted here by mistake must not reach the logs
        raise OptionError(
            f"{_WHERE}.api_key_env must be the NAME of an environment variable holding the key "
            "(e.g. OPENAI_API_KEY), not the key itself"
        )
    max_tokens = given.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS[template] if max_tokens is None else max_tokens
    launch = _bool("launch", given.get("launch", d.launch))
    opts = Options(
        setup=setup,
        weight=weight,
        template=template,
        base_url=base_url.rstrip("/"),
        model=model.strip(),
        api_key_env=api_key_env,
        temperature=_number("temperature", given.get("temperature", d.temperature), low=0.0),
        max_tokens=_number("max_tokens", max_tokens, low=1, integer=True),
        request_timeout_s=_number("request_timeout_s", given.get("request_timeout_s", 30.0), low=0.0, strict=True),
        retries=_number("retries", given.get("retries", d.retries), low=0, integer=True),
        backoff_s=_number("backoff_s", given.get("backoff_s", d.backoff_s), low=0.0),
        fallback=fallback,
        launch=launch,
        launch_args=_args(given.get("launch_args")),
        launch_timeout_s=_number("launch_timeout_s", given.get("launch_timeout_s", 300.0), low=0.0, strict=True),
        max_question_chars=_number("max_question_chars", given.get("max_question_chars", 4000), low=1, integer=True),
        max_answer_chars=_number("max_answer_chars", given.get("max_answer_chars", 4000), low=1, integer=True),
        max_prompt_tokens=_max_prompt_tokens(given.get("max_prompt_tokens", d.max_prompt_tokens), template),
        tokenizer_path=_tokenizer_path(given.get("tokenizer_path")),
    )
    if launch:
        host, _ = opts.host_port
        if host not in LOCAL_HOSTS or parts.scheme != "http" or parts.port is None:
            raise OptionError(
                f"{_WHERE}.launch starts a server on this machine, bound to 127.0.0.1 only: base_url must be "
                f"http://127.0.0.1:PORT/v1 (with an explicit port), got {base_url!r}"
            )
        taken = sorted(
            {a.split("=", 1)[0] for a in opts.launch_args} & {"--host", "--port", "--model", "--served-model-name"}
        )
        if taken:
            raise OptionError(
                f"{_WHERE}.launch_args must not set {', '.join(taken)}: the server binds 127.0.0.1 on the port "
                "of base_url and serves the model named by model, under that name"
            )
    return opts
