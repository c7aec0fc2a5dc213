"""The ``openai`` solution classifier: one chat completion per prompt, through any OpenAI-compatible API."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any
from urllib.parse import urlsplit

from plugrl_advantages.classify import solution_classifier

from .options import WHERE, ClassifierOptions, _Invalid, check_env_name, parse_options
from .parsing import parse_groups
from .prompt import build_messages

log = logging.getLogger("plugrl.classifier_openai")

LOCAL_DUMMY_KEY = "EMPTY"  # what vLLM, SGLang and friends accept when started without --api-key

_CLIENTS: dict[tuple[str, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _needs_real_key(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host == "openai.com" or host.endswith(".openai.com")


def missing_key_problem(base_url: str, api_key_env: str) -> str | None:
    """What is wrong when ``base_url`` needs a key (OpenAI's own API) and ``$api_key_env`` is unset or empty;
    None when the key is there or the server needs none (a local server gets the dummy key)."""
    if os.environ.get(api_key_env, "").strip() or not _needs_real_key(base_url):
        return None
    return (
        f"the environment variable {api_key_env} ({WHERE}.api_key_env) is not set: the openai solution classifier "
        f"needs an API key for {base_url}. Export it (export {api_key_env}=...), or point {WHERE}.base_url at a "
        "local OpenAI-compatible server (it needs no key)"
    )


def resolve_api_key(base_url: str, api_key_env: str) -> str:
    """The API key from the environment variable named ``api_key_env``.

    When it is unset or empty: an error for OpenAI's own API; otherwise the dummy key ``"EMPTY"``,
    which local OpenAI-compatible servers started without ``--api-key`` accept. The key itself is
    never taken from the config.
    """
    try:
        check_env_name(api_key_env)
    except _Invalid as e:  # never echoes the value: a key pasted here by mistake must not reach the logs
        raise ValueError(f"{WHERE}.api_key_env {e}") from None
    key = os.environ.get(api_key_env, "").strip()
    if key:
        return key
    problem = missing_key_problem(base_url, api_key_env)
    if problem:
        raise RuntimeError(problem)
    return LOCAL_DUMMY_KEY


def get_client(base_url: str, api_key: str, timeout_s: float):
    """The process's ``openai.OpenAI`` client for (base_url, api_key), made on first use.

    ``max_retries=0``: the advantages plugin retries a failed prompt itself (``algorithm.classifier_retries``).
    Safe to call from its classifier threads.
    """
    key = (base_url, api_key)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import openai

            client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)
            _CLIENTS[key] = client
    return client


def groups_schema(n: int) -> dict[str, Any]:
    """The ``response_format`` for structured output: ``{"groups": [exactly n integers]}``."""
    groups = {"type": "array", "items": {"type": "integer"}, "minItems": n, "maxItems": n}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "solution_groups",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"groups": groups},
                "required": ["groups"],
                "additionalProperties": False,
            },
        },
    }


@solution_classifier("openai", options=ClassifierOptions)
def classify_strategies(prompt: str, responses: list[str], **options: Any) -> list[int]:
    """Group the ``responses`` to ``prompt`` by overarching method with one chat completion.

    ``options`` (``algorithm.classifier_options``) are declared, with their defaults and checks, by
    :class:`plugrl_classifier_openai.ClassifierOptions`: ``base_url`` of an OpenAI-compatible API
    (OpenAI, or a local vLLM server such as ``http://127.0.0.1:8000/v1``), ``model``, ``api_key_env``
    (the NAME of the environment variable holding the key; unset is fine for a local server),
    ``timeout_s`` per request, ``temperature``, ``max_tokens`` of the reply,
    ``max_chars_per_response`` (longer responses are cut in the request), and ``json_schema``: ask
    for structured output, a JSON schema of exactly n integers (``response_format``), which vLLM
    and OpenAI enforce while decoding, so even a small model returns a parseable grouping. The caller
    validates them at start-up; they are parsed again here (TypeError for an option it does not
    take, ``api_key`` included; ValueError for a value it refuses).

    Returns one group id per response (equal ids: same method). Raises ValueError when the reply
    holds no valid grouping, and lets connection, timeout and HTTP errors of the ``openai`` client
    through; the advantages plugin retries, then gives every response its own group.
    """
    opts = parse_options(options)
    n = len(responses)
    if n <= 1:
        return [0] * n  # nothing to compare
    messages = build_messages(prompt, list(responses), max_chars_per_response=opts.max_chars_per_response)
    client = get_client(opts.base_url, resolve_api_key(opts.base_url, opts.api_key_env), opts.timeout_s)
    extra: dict[str, Any] = {"response_format": groups_schema(n)} if opts.json_schema else {}
    completion = client.chat.completions.create(
        model=opts.model,
        messages=messages,
        temperature=opts.temperature,
        max_tokens=opts.max_tokens,
        timeout=opts.timeout_s,
        **extra,
    )
    choices = getattr(completion, "choices", None) or []
    content = choices[0].message.content if choices else None
    log.debug("classifier reply for %d responses: %r", n, content)
    return parse_groups(content, n)
