"""Helpers for a plugin's options model (the pydantic model a decorator's ``options=`` declares).

:class:`PluginOptions` is a base for such a model: unknown keys are refused and a value refused with
``InvalidOption(..., echo=False)`` is never repeated in an error (it may be an API key pasted into the
wrong option). :func:`number` and :func:`env_var_name` are the checks every options model needs, and the
annotated types below apply them to a field by its type alone (``timeout_s: AboveZero = 30.0``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
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


def reward_options(config: Any, name: str) -> Mapping[str, Any] | None:
    """``reward.options.<name>`` of a run config, as a plugin's hooks read their reward's options (None when the
    config sets none). Hooks get the config whole; this is the one place that looks inside it."""
    options = getattr(getattr(config, "reward", None), "options", None)
    raw = options.get(name) if isinstance(options, Mapping) else None
    return raw if isinstance(raw, Mapping) else None
