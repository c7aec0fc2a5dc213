"""The options of the ``tinyv`` reward (``reward.options.tinyv``), declared once: the pydantic model :class:`Options`.

The reward registers it (``@reward(..., options=Options)``), so the kernel validates ``reward.options.tinyv``
at start-up, before any model loads, and passes the validated values to the reward as keywords. The reward
and the run hooks parse them again with :func:`parse_options` (cheap), which words a problem as an
:class:`OptionError` naming the option, for configs that did not go through the kernel's check.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from plugrl.options import AboveZero, AtLeastZero, Count, EnvVarName, PluginOptions
from plugrl.options import InvalidOption as _Invalid
from plugrl.options import invalid_of as _invalid
from plugrl.options import number as _number
from plugrl_model_servers.options import SERVER_OPTIONS, server_option

Setup = Literal["tinyv_only", "addon", "mixed"]
TemplateName = Literal["tinyv", "rubric"]
Fallback = Literal["rule", "zero"]
SETUPS, TEMPLATE_NAMES, FALLBACKS = get_args(Setup), get_args(TemplateName), get_args(Fallback)
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MAX_TOKENS = {"tinyv": 16, "rubric": 512}
# the prompt bound when the server does not report its context (max_prompt_tokens: auto): a 2,048-token
# verifier context (the README's CPU launch args) minus the rubric's 512 reply tokens
DEFAULT_MAX_PROMPT_TOKENS = 1536
MIN_TEXT_TOKENS = 128  # max_prompt_tokens must leave at least this much room for the texts
# max_question_chars / max_answer_chars when unset: a cut before the token bound that never keeps a text
# from filling the room it gets (ordinary text is ~4 characters a token), and 4,000 without a token bound
MAX_CHARS_PER_TOKEN = 8
DEFAULT_MAX_CHARS = 4000

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHERE = "reward.options.tinyv"

F = TypeVar("F", bound=Callable[..., Any])


class OptionError(ValueError):
    """An option of ``reward.options.tinyv`` is wrong; the message names it and says what it takes."""


def _bool(value: Any) -> bool:
    # launch: also yes/no, 1/0 and those as strings. The judge's launch takes true or false only: the two plugins
    # read it differently on purpose, so each passes its own reading to plugrl.options.server_option (read_launch)
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


class Options(PluginOptions):
    """The options of the ``tinyv`` reward (``reward.options.tinyv``); see the plugin README for what each does.

    Validated field by field, in the order declared: a check that depends on another option (``weight`` and
    ``fallback`` on ``setup``, ``prompt_template`` and ``max_tokens`` on ``template``, ``max_prompt_tokens`` on
    both templates, ``base_url`` and ``launch_args`` on ``launch``) reads the value validated before it, so each
    problem is reported under the option to change. The served context, which ``max_prompt_tokens`` must fit, is
    the server's to tell: :mod:`plugrl_tinyv.context` checks it at run start or at the first verification.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # first, so that a key pasted into the config is what parse_options reports
    api_key: None = Field(
        None, exclude=True, repr=False, description="refused: keys never go in the config (see api_key_env)"
    )
    setup: Setup = Field(
        "tinyv_only",
        description="tinyv_only (the default, as TinyV's verl fork): the verdict; addon: 1 when the rule says "
        "right, else verdict x weight; mixed: weight x verdict + (1 - weight) x rule",
    )
    weight: float = Field(1.0, description="TinyV's tinyv_weight (>= 0; at most 1 for setup mixed)")
    template: TemplateName = Field(
        "tinyv", description="the verifier prompt: tinyv (a True/False verdict) or rubric (a score out of 10)"
    )
    prompt_template: str | None = Field(
        None,
        description="the prompt's text in place of the template's built-in one: a text with {question}, "
        "{ground_truth}, {answer} (rubric: also {criteria}), or the path of a file holding one",
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
    wait_s: AtLeastZero = Field(
        500.0,
        description="how long the run start waits for a verifier server it does not launch to answer GET /models, "
        "with a progress line every 10 s (TinyV's script: 50 tries 10 s apart), before the run stops; 0: no wait",
    )
    probe: bool = Field(
        True,
        description="at the run start, ask the verifier one known question to check that its reply fits the "
        "template (a rubric reward model answering the tinyv template stops the run, naming the key to set)",
    )
    max_failures_in_a_row: Count = Field(
        32,
        description="stop the run, naming the server, when this many verifications in a row failed (server down, "
        "timeouts, HTTP errors, replies without a verdict); 0: never stop, score the fallback and train on",
    )
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
        None,  # type: ignore[assignment]  # filled in by setup
        validate_default=True,
        description="the score of a failed verification: zero (the default with setup tinyv_only, which never "
        "scores by the rule) or rule (the rule's score; the default with addon and mixed)",
    )
    max_question_chars: int | None = Field(
        None,
        description="the question's (and the reference's, the criteria's) size bound in the prompt, in "
        f"characters; unset: {MAX_CHARS_PER_TOKEN} a token of the prompt's token bound ({DEFAULT_MAX_CHARS} "
        "without one)",
    )
    max_answer_chars: int | None = Field(
        None, description="the answer's size bound in the prompt, in characters; unset: as max_question_chars"
    )
    max_prompt_tokens: int | Literal["auto"] | None = Field(
        "auto",
        description="the prompt's size bound in the verifier's tokens; auto: the context the server reports "
        f"(max_model_len in GET /v1/models) minus max_tokens, {DEFAULT_MAX_PROMPT_TOKENS} when it reports none; "
        "null: no token bound",
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
    def prompt_text(self) -> str:
        """The prompt's template text: ``prompt_template``'s (read from its file) or the built-in one."""
        from .prompts import TEMPLATES

        if self.prompt_template is None:
            return TEMPLATES[self.template]
        return read_prompt_template(self.prompt_template)[0]

    def char_bounds(self, max_prompt_tokens: int | None) -> tuple[int, int]:
        """(max_question_chars, max_answer_chars), the unset ones from the prompt's token bound."""
        derived = DEFAULT_MAX_CHARS if max_prompt_tokens is None else MAX_CHARS_PER_TOKEN * max_prompt_tokens
        return (
            derived if self.max_question_chars is None else self.max_question_chars,
            derived if self.max_answer_chars is None else self.max_answer_chars,
        )

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.hostname or "", port

    # ------------------------------------------------------------------ one check per option

    @field_validator("probe", mode="before")
    @classmethod
    def _probe(cls, value: Any) -> bool:
        return _bool(value)

    @field_validator("setup", mode="before")
    @classmethod
    def _setup(cls, value: Any) -> str:
        return _choice(value, SETUPS)

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, value: Any) -> str:
        return _choice(value, TEMPLATE_NAMES)

    @field_validator("prompt_template", mode="before")
    @classmethod
    def _prompt_template(cls, value: Any, info: ValidationInfo) -> str | None:
        if value is None:  # the template's built-in text
            return None
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(
                "must be a template text with placeholders such as {answer}, or the path of a file holding one; "
                "leave it out for the built-in template"
            )
        text, source = read_prompt_template(value)
        kind = info.data.get("template")
        if kind is None:  # the template is wrong: reported under its own name
            return value
        from .prompts import check_template

        problem = check_template(kind, text)
        if problem:
            raise _Invalid(f"{source}{problem}", form="{key} {text}")
        return value

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback(cls, value: Any, info: ValidationInfo) -> str:
        if value is None:  # tinyv_only never scores by the rule, so neither does its failure
            return "zero" if info.data.get("setup", "tinyv_only") == "tinyv_only" else "rule"
        return _choice(value, FALLBACKS)

    @field_validator("max_question_chars", "max_answer_chars", mode="before")
    @classmethod
    def _chars(cls, value: Any) -> int | None:
        if value is None:  # from the prompt's token bound
            return None
        return _number(value, low=1, integer=True)

    @field_validator("weight", mode="before")
    @classmethod
    def _weight(cls, value: Any, info: ValidationInfo) -> float:
        weight = _number(value, low=0.0)
        if info.data.get("setup") == "mixed" and weight > 1.0:
            raise _Invalid("must be in [0, 1] for setup mixed")
        return weight

    @field_validator(*SERVER_OPTIONS, mode="before")
    @classmethod
    def _server_option(cls, value: Any, info: ValidationInfo) -> Any:
        """model, launch (read by :func:`_bool`), base_url, launch_args, api_key: checked as by every plugin that
        may launch its model's server."""
        return server_option(
            value, info, where=_WHERE, server="the verifier server", example=DEFAULT_BASE_URL, read_launch=_bool
        )

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens(cls, value: Any, info: ValidationInfo) -> int:
        if value is None:  # by template
            return DEFAULT_MAX_TOKENS.get(info.data.get("template", "tinyv"), DEFAULT_MAX_TOKENS["tinyv"])
        return _number(value, low=1, integer=True)

    @field_validator("max_prompt_tokens", mode="before")
    @classmethod
    def _max_prompt_tokens(cls, value: Any, info: ValidationInfo) -> int | str | None:
        if value is None:  # null: no token bound (a server whose context outgrows the character bounds)
            return None
        if isinstance(value, str) and value.strip().lower() == "auto":  # the served context, asked at run time
            return "auto"
        try:
            limit = _number(value, low=1, integer=True)
        except _Invalid as e:
            if str(e) != "must be a number":
                raise
            raise _Invalid(
                "must be a number of tokens, auto (the server's context minus max_tokens) or null (no token bound)"
            ) from None
        template = info.data.get("template")
        if template is None or "prompt_template" not in info.data:  # reported under their own names
            return limit
        from .prompts import TEMPLATE_FIELDS, TEMPLATES, frame_tokens

        text = info.data["prompt_template"]
        text = TEMPLATES[template] if text is None else read_prompt_template(text)[0]
        least = frame_tokens(text, dict.fromkeys(TEMPLATE_FIELDS[template], "")) + MIN_TEXT_TOKENS
        if limit < least:
            raise _Invalid(
                f"leaves no room for the question and the answer: the {template} template and the chat markup "
                f"take up to {least - MIN_TEXT_TOKENS} tokens. Set it to the verifier server's context "
                "(--max-model-len) minus max_tokens, at least "
                f"{least}; or leave it out (auto: the context the server reports, minus max_tokens); or null for no "
                "token bound",
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


@functools.lru_cache(maxsize=32)
def _read_file(path: str) -> str:
    # read once per process: parse_options runs for every verification
    return Path(path).expanduser().read_text(encoding="utf-8")


def read_prompt_template(value: str) -> tuple[str, str]:
    """(the template's text, how an error names where it came from) for a ``prompt_template`` value: the path
    of a file holding the template (one line naming a file that exists), else the template's text (which has
    placeholders, ``{answer}`` at least). An :class:`InvalidOption` saying what to fix otherwise."""
    single = "\n" not in value and len(value) < 4096
    path = Path(value.strip()).expanduser() if single else None
    if path is not None and path.is_file():
        try:
            return _read_file(str(path)), f"names the file {value.strip()!r}, which "
        except (OSError, UnicodeDecodeError) as e:
            raise _Invalid(
                f"names the file {value.strip()!r}, which cannot be read as UTF-8 text ({type(e).__name__}: {e}): "
                "make it readable, or give the template's text instead",
                form="{key} {text}",
            ) from None
    if "{" in value:
        return value, ""
    why = "is a directory" if path is not None and path.is_dir() else "does not exist"
    if path is not None and not path.is_absolute():
        why += f" in {Path.cwd()}"
    raise _Invalid(
        "is neither a template (it has no placeholder such as {answer}) nor a readable file "
        f"({value.strip()[:200]!r} {why}): give the path of a file holding the template, or the template's text",
        form="{key} {text}",
    )


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
