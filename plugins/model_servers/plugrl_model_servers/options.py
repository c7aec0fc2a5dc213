"""The options a plugin whose model runs behind an OpenAI-compatible server it may launch declares (a verifier,
a judge, a classifier): ``base_url``, ``launch_args`` and the shared check of ``model``, ``launch``, ``base_url``,
``launch_args`` and ``api_key`` (:func:`server_option`), for the plugin's pydantic options model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationInfo

from plugrl.options import InvalidOption

LOCAL_HOSTS = ("127.0.0.1", "localhost")
SERVER_ARGS = ("--host", "--port", "--model", "--served-model-name")  # what plugrl_model_servers.start sets itself


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
