"""The options of the ``openai`` solution classifier (``algorithm.classifier_options``), declared once:
the pydantic model :class:`ClassifierOptions`.

The classifier registers it (``@solution_classifier("openai", options=ClassifierOptions)``), so the advantages plugin
validates ``algorithm.classifier_options`` at start-up, before any model loads; the classifier parses its
keywords with the same model on every call (:func:`parse_options`), for callers that skip that check.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from plugrl.options import (
    AboveZero,
    AtLeastZero,
    EnvVarName,
    PluginOptions,
    PositiveCount,
    env_var_name,
)
from plugrl.options import InvalidOption as _Invalid
from plugrl.options import invalid_of as _invalid
from plugrl_model_servers.options import base_url, launch_args

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
WHERE = "algorithm.classifier_options"
LAUNCH_URL = "http://127.0.0.1:PORT/v1"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_name(value: Any) -> str:
    """``value`` if it can name an environment variable; an :class:`_Invalid` that never echoes it otherwise."""
    return env_var_name(value)


class ClassifierOptions(PluginOptions):
    """The options of the ``openai`` classifier (``algorithm.classifier_options``); see the plugin README."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # first, so that a key pasted into the config is what parse_options reports
    api_key: None = Field(
        None, exclude=True, repr=False, description="refused: keys never go in the config (see api_key_env)"
    )
    # before model, base_url and launch_args: their checks read it (fields are validated in the order declared)
    launch: bool = Field(
        False, description="start a local vLLM server for the classifier for the run (model, base_url), stop it after"
    )
    model: str = Field(
        DEFAULT_MODEL,
        validate_default=True,
        description="the model name (a local server's --served-model-name); with launch: true also what the "
        "server loads: a path, a hub id or local:NAME",
    )
    base_url: str = Field(
        DEFAULT_BASE_URL,
        validate_default=True,
        description="the OpenAI-compatible API's base URL, e.g. http://127.0.0.1:8000/v1 for a local vLLM server; "
        f"with launch: true {LAUNCH_URL}",
    )
    launch_args: tuple[str, ...] = Field(
        (), description="more arguments for the vLLM server launch starts (a list, or one string)"
    )
    launch_timeout_s: AboveZero = Field(
        300.0, description="how long a launched server may take to answer GET /v1/models (> 0)"
    )
    api_key_env: EnvVarName = Field(
        "OPENAI_API_KEY",
        description="the NAME of the environment variable holding the key; unset or empty: an error for "
        "*.openai.com, the dummy key EMPTY for any other server",
    )
    timeout_s: AboveZero = Field(60.0, description="the time limit of one request, in seconds (> 0)")
    temperature: AtLeastZero = Field(0.0, description="the sampling temperature (>= 0)")
    max_tokens: PositiveCount = Field(512, description="the reply's token budget (>= 1)")
    max_chars_per_response: PositiveCount = Field(
        2000, description="longer responses are cut in the request (>= 1); the problem at 4x this"
    )
    json_schema: bool = Field(
        False,
        description="ask for structured output (response_format: a JSON schema of exactly n integers), which vLLM "
        "and OpenAI enforce while decoding",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _api_key(cls, value: Any) -> None:
        raise _Invalid(
            f"keep keys out of configs and name the environment variable that holds it in {WHERE}.api_key_env",
            form="the openai classifier takes no api_key option: {text}",
            echo=False,
        )

    @field_validator("launch", mode="before")
    @classmethod
    def _launch(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _Invalid("must be true or false")
        return value

    @field_validator("base_url", mode="before")
    @classmethod
    def _base_url(cls, value: Any, info: ValidationInfo) -> str:
        example = "http://127.0.0.1:8000/v1 or https://api.openai.com/v1"
        return base_url(
            value, launching=bool(info.data.get("launch")), example=example, server="the classifier's server"
        )

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any, info: ValidationInfo) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Invalid("must name the model the server serves")
        if info.data.get("launch") and value == DEFAULT_MODEL:
            raise _Invalid(
                f"must name the model the launched server loads with launch: true (a local directory, a hub id or "
                f"local:NAME); the default {DEFAULT_MODEL} is OpenAI's and cannot be served locally",
                form="{key} {text}",
            )
        return value

    @field_validator("launch_args", mode="before")
    @classmethod
    def _launch_args(cls, value: Any, info: ValidationInfo) -> tuple[str, ...]:
        return launch_args(value, launching=bool(info.data.get("launch")))

    @field_validator("json_schema", mode="before")
    @classmethod
    def _json_schema(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _Invalid("must be true or false")
        return value


OPTION_NAMES = tuple(name for name, f in ClassifierOptions.model_fields.items() if not f.exclude)


def parse_options(options: Mapping[str, Any]) -> ClassifierOptions:
    """The classifier's keywords validated by :class:`ClassifierOptions`.

    Raises TypeError for a keyword it does not take (``api_key`` included: keys never go in a config) and
    ValueError naming ``algorithm.classifier_options.<key>`` for a value it refuses.
    """
    unknown = sorted(str(k) for k in set(options) - set(ClassifierOptions.model_fields))
    if unknown:
        raise TypeError(
            f"unknown {WHERE} for the openai classifier: {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}"
        )
    try:
        return ClassifierOptions.model_validate(dict(options))
    except ValidationError as e:
        err = e.errors()[0]
        key = f"{WHERE}.{'.'.join(str(p) for p in err['loc'])}"
        invalid = _invalid(err)
        if invalid is None:  # a check of pydantic's own (none is expected: every option has its own check)
            raise ValueError(f"{key}: {err['msg']} (got {err.get('input')!r})") from None
        message = invalid.form.format(key=key, text=invalid.text, value=err.get("input"))
        raise (TypeError if err["loc"] == ("api_key",) else ValueError)(message) from None
