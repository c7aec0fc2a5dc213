"""Helpers for a plugin's options model (the pydantic model a decorator's ``options=`` declares).

:class:`PluginOptions` is a base for such a model: unknown keys are refused and a value refused with
``InvalidOption(..., echo=False)`` is never repeated in an error (it may be an API key pasted into the
wrong option). :func:`number` and :func:`env_var_name` are the checks every options model needs, and the
annotated types below apply them to a field by its type alone (``timeout_s: AboveZero = 30.0``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class InvalidOption(ValueError):
    """A refused option value, raised from a field validator. ``str()`` is the ``text`` that follows the
    option's key: the kernel reports ``<where>.<key>: <text> (got <value>)``; a plugin's own parser may word
    it as ``form`` says (placeholders ``where``, ``key``, ``text``, ``value``). ``echo=False``: the value is
    never repeated."""

    def __init__(self, text: str, *, form: str = "{key} {text}, got {value!r}", echo: bool = True):
        super().__init__(text)
        self.text, self.form, self.echo = text, form, echo


def invalid_of(err: Mapping[str, Any]) -> InvalidOption | None:
    """The :class:`InvalidOption` behind one of pydantic's errors (None for pydantic's own)."""
    error = (err.get("ctx") or {}).get("error")
    return error if isinstance(error, InvalidOption) else None


class PluginOptions(BaseModel):
    """Base of a plugin's options model: unknown keys refused, and values refused with ``echo=False``
    replaced by ``***`` in the errors, so that neither the kernel nor the plugin repeats them."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _hide_refused_values(cls, data: Any, handler: Any) -> Any:
        try:
            return handler(data)
        except ValidationError as e:
            errors = e.errors()
            if all(getattr(invalid_of(err), "echo", True) for err in errors):
                raise
            details = [
                InitErrorDetails(
                    type=err["type"],
                    loc=err["loc"],
                    input=err["input"] if getattr(invalid_of(err), "echo", True) else "***",
                    **({"ctx": err["ctx"]} if "ctx" in err else {}),  # type: ignore[typeddict-item]
                )
                for err in errors
            ]
            raise ValidationError.from_exception_data(e.title, details) from None


def number(value: Any, *, low: float, integer: bool = False, strict: bool = False) -> Any:
    """``value`` as a finite float (or a whole int) ``>= low`` (``> low`` when ``strict``); an
    :class:`InvalidOption` saying what it must be otherwise (booleans, inf and NaN included)."""
    if isinstance(value, bool):
        raise InvalidOption("must be a number")
    try:
        result = int(value) if integer else float(value)
        fractional = integer and float(value) != result
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf), float(10**400)
        raise InvalidOption("must be a number") from None
    if fractional:
        raise InvalidOption("must be a whole number")
    if result < low or (strict and result == low) or result != result or result == float("inf"):
        raise InvalidOption(f"must be {'>' if strict else '>='} {low:g}")
    return result


def env_var_name(value: Any) -> str:
    """``value`` if it can name an environment variable; an :class:`InvalidOption` that never echoes it
    otherwise (a key pasted where its variable's name belongs must not reach the logs)."""
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        raise InvalidOption(
            "must be the NAME of an environment variable holding the key (e.g. OPENAI_API_KEY), not the key itself",
            form="{key} {text}",
            echo=False,
        )
    return value


# Field types that check themselves (finite numbers; booleans, inf and NaN refused), with the same messages.
AtLeastZero = Annotated[float, BeforeValidator(lambda v: number(v, low=0.0))]
AboveZero = Annotated[float, BeforeValidator(lambda v: number(v, low=0.0, strict=True))]
Count = Annotated[int, BeforeValidator(lambda v: number(v, low=0, integer=True))]
PositiveCount = Annotated[int, BeforeValidator(lambda v: number(v, low=1, integer=True))]
EnvVarName = Annotated[str, BeforeValidator(env_var_name)]


# --------------------------------------------------------------------------- a server a plugin may launch

LOCAL_HOSTS = ("127.0.0.1", "localhost")
SERVER_ARGS = ("--host", "--port", "--model", "--served-model-name")  # what plugrl.servers.start sets itself


def base_url(value: Any, *, launching: bool, example: str, server: str) -> str:
    """An OpenAI-compatible ``base_url`` option (no trailing slash). With ``launch: true`` (``launching``) it must be
    ``http://127.0.0.1:PORT/v1`` with an explicit port: plugrl starts ``server`` (e.g. "the judge's server") there,
    bound to 127.0.0.1 only. ``example``: a URL the error shows."""
    from urllib.parse import urlsplit

    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidOption(f"must be an http(s) URL such as {example}")
    if launching and (parts.hostname not in LOCAL_HOSTS or parts.scheme != "http" or parts.port is None):
        raise InvalidOption(
            f"must be http://127.0.0.1:PORT/v1 (with an explicit port) with launch: true, which starts {server} on "
            "this machine, bound to 127.0.0.1 only, on that port"
        )
    return value.rstrip("/")


def launch_args(value: Any, *, launching: bool) -> tuple[str, ...]:
    """A ``launch_args`` option: extra command-line arguments of the launched vLLM server (a list, or one string
    split as a shell would). With ``launch: true`` it may not set what plugrl sets itself (:data:`SERVER_ARGS`)."""
    import shlex
    from collections.abc import Sequence

    if value is None:
        return ()
    if isinstance(value, str):
        try:
            args = tuple(shlex.split(value))
        except ValueError as e:
            raise InvalidOption(f"cannot be split into arguments ({e})") from None
    elif isinstance(value, Sequence) and all(
        isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value
    ):
        args = tuple(str(v) for v in value)
    else:
        raise InvalidOption('must be a list of command-line arguments, e.g. [--max-model-len, "2048"]')
    taken = sorted({a.split("=", 1)[0] for a in args} & set(SERVER_ARGS))
    if launching and taken:
        raise InvalidOption(
            f"must not set {', '.join(taken)} with launch: true: the plugin starts the server bound to 127.0.0.1 on "
            "the port of base_url, serving the model named by model under that name"
        )
    return args


SERVER_OPTIONS = ("model", "launch", "base_url", "launch_args", "api_key")  # what server_option checks


def server_option(
    value: Any, info: ValidationInfo, *, where: str, server: str, example: str, read_launch: Callable[[Any], bool]
) -> Any:
    """The check of an option that the plugins whose model runs behind an OpenAI-compatible server they may launch
    share, by the option's name (``info.field_name``, one of :data:`SERVER_OPTIONS`), for their options model's
    ``@field_validator(*SERVER_OPTIONS, mode="before")`` (the fields declared in that order):

    - ``model``: required, the model name ``server`` serves (or, with ``launch: true``, starts); stripped;
    - ``launch``: ``read_launch(value)``, the plugin's own reading of true and false (plugins differ there);
    - ``base_url``: :func:`base_url`, and ``launch_args``: :func:`launch_args`, both by ``launch``;
    - ``api_key``: refused, never echoed: a key goes in the environment variable ``api_key_env`` names.

    ``where``: the options' section (``reward.options.<name>``); ``server``: how errors name the server (e.g. "the
    verifier server"); ``example``: the URL they show."""
    name, launching = info.field_name, bool(info.data.get("launch"))
    if name == "model":
        if not isinstance(value, str) or not value.strip():
            raise InvalidOption(
                f"is required: the model name {server} serves (with launch: true, a model path or local:NAME to "
                "start it with)",
                form="{key} {text}",
            )
        return value.strip()
    if name == "launch":
        return read_launch(value)
    if name == "base_url":
        return base_url(value, launching=launching, example=example, server=server)
    if name == "launch_args":
        return launch_args(value, launching=launching)
    if name == "api_key":
        raise InvalidOption(
            "keep keys out of configs; put it in an environment variable and name that variable in "
            f"{where}.api_key_env",
            form="{where} takes no api_key: {text}",
            echo=False,
        )
    raise ValueError(f"server_option checks {', '.join(SERVER_OPTIONS)}, not {name!r}")


def reward_options(config: Any, name: str) -> Mapping[str, Any] | None:
    """``reward.options.<name>`` of a run config, as a plugin's hooks read their reward's options (None when the
    config sets none). Hooks get the config whole; this is the one place that looks inside it."""
    options = getattr(getattr(config, "reward", None), "options", None)
    raw = options.get(name) if isinstance(options, Mapping) else None
    return raw if isinstance(raw, Mapping) else None
