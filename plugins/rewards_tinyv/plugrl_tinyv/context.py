"""The verifier's context length, asked from its server, and the prompt budget it leaves.

vLLM's OpenAI-compatible server reports each model's context in ``GET /v1/models`` (``max_model_len``, the
``--max-model-len`` it was started with). Unless ``reward.options.tinyv.max_prompt_tokens`` says otherwise,
prompts may fill that context minus the reply's ``max_tokens``; a server that does not report it (OpenAI's
own API, other servers) gets :data:`plugrl_tinyv.options.DEFAULT_MAX_PROMPT_TOKENS`, logged once.

The server is asked once per ``(base_url, model)`` and process: at run start when the server is local (or
launched), else at the first verification. An answer is kept for the process; a server that cannot be
reached is asked again, at most every :data:`RETRY_AFTER_S`, so that one that starts late is still measured.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from typing import Any

import plugrl_model_servers as servers

from .options import DEFAULT_MAX_PROMPT_TOKENS, MIN_TEXT_TOKENS, OptionError, Options
from .prompts import TEMPLATE_FIELDS, frame_tokens

log = logging.getLogger("plugrl.tinyv")

PROBE_TIMEOUT_S = 5.0  # the longest GET /models may take (a reward waits on it once)
RETRY_AFTER_S = 30.0  # an unreachable server is not asked again sooner: each verification would wait on it

_Key = tuple[str, str]
_ANSWERS: dict[_Key, int | None] = {}  # the server answered: its max_model_len, or None (not reported)
_FAILED_AT: dict[_Key, float] = {}
_LOCKS: dict[_Key, threading.Lock] = {}
_LOCK = threading.Lock()
_LOGGED: set[tuple[_Key, str]] = set()
MISSING = object()  # cached_context: nothing known yet


def cached_context(base_url: str, model: str) -> Any:
    """The context already known for ``(base_url, model)`` (an int or None), or ``MISSING``."""
    return _ANSWERS.get((base_url, model), MISSING)


def served_context(base_url: str, model: str, api_key: str, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The context the server at ``base_url`` serves ``model`` with, asked once (blocking; call it off the event
    loop); None when it does not report one or cannot be reached now."""
    key = (base_url, model)
    known = _ANSWERS.get(key, MISSING)
    if known is not MISSING:
        return known  # type: ignore[return-value]
    with _LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:  # one request per key: concurrent verifications wait for its answer
        known = _ANSWERS.get(key, MISSING)
        if known is not MISSING:
            return known  # type: ignore[return-value]
        failed = _FAILED_AT.get(key)
        if failed is not None and time.monotonic() - failed < RETRY_AFTER_S:
            return None
        try:
            value = servers.served_context(base_url, model, api_key, timeout_s)  # GET /models: max_model_len
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timeout, HTTP error: ask again later
            _FAILED_AT[key] = time.monotonic()
            log.debug("tinyv: GET %s/models failed (%s); the context is asked again later", base_url, e)
            return None
        _ANSWERS[key] = value
        _FAILED_AT.pop(key, None)
    if value is None:
        _log_once(
            key,
            "unknown",
            "tinyv: the server at %s does not report max_model_len for model %r (GET /models): prompts are bounded "
            "to %d tokens, the default for a 2048-token context. Set reward.options.tinyv.max_prompt_tokens to the "
            "server's context minus max_tokens to use more of it",
            base_url,
            model,
            DEFAULT_MAX_PROMPT_TOKENS,
        )
    return value


def reset_served_contexts() -> None:
    """Forget every context asked so far (and which messages were logged)."""
    with _LOCK:
        _ANSWERS.clear()
        _FAILED_AT.clear()
        _LOGGED.clear()


def least_prompt_tokens(opts: Options) -> int:
    """The smallest prompt budget that leaves room for the texts: the template, the chat markup, and
    :data:`MIN_TEXT_TOKENS` (the frame estimated, as :func:`plugrl_tinyv.prompts.frame_tokens` does)."""
    fields = dict.fromkeys(TEMPLATE_FIELDS[opts.template], "")
    return frame_tokens(opts.prompt_text, fields) + MIN_TEXT_TOKENS


def prompt_budget(opts: Options, context: int | None) -> int | None:
    """The prompt's token bound for ``opts`` when the server serves ``context`` tokens (None: not known).

    ``max_prompt_tokens: auto`` (the default): ``context - max_tokens``, or the default bound when the context
    is not known; null: no bound; a number: itself. An :class:`OptionError` naming the option to change when a
    request could need more than the context.
    """
    limit, reply = opts.max_prompt_tokens, opts.max_tokens
    where = f"the context of {context} tokens that the server at {opts.base_url} serves {opts.model!r} with"
    if limit is None:
        return None
    if limit != "auto":
        if context is not None and limit + reply > context:
            raise OptionError(
                f"reward.options.tinyv.max_prompt_tokens={limit} with max_tokens={reply} lets a request need "
                f"{limit + reply} tokens, over {where} (max_model_len in GET /models). Set max_prompt_tokens to at "
                f"most {context - reply}, or leave it out to take the server's context minus max_tokens"
            )
        return int(limit)
    if context is None:
        return DEFAULT_MAX_PROMPT_TOKENS
    budget, least = context - reply, least_prompt_tokens(opts)
    if budget < least:
        raise OptionError(
            f"reward.options.tinyv.max_tokens={reply} leaves {max(budget, 0)} tokens for the prompt in {where}, "
            f"and the {opts.template} template needs at least {least}: lower max_tokens to at most {context - least}, "
            "or serve the verifier with a larger --max-model-len"
        )
    _log_once(
        (opts.base_url, opts.model),
        f"budget {budget}",
        "tinyv: the verifier %r at %s serves a context of %d tokens: prompts up to %d tokens (max_tokens %d)",
        opts.model,
        opts.base_url,
        context,
        budget,
        reply,
    )
    return budget


def _log_once(key: _Key, what: str, message: str, *args: Any) -> None:
    with _LOCK:
        if (key, what) in _LOGGED:
            return
        _LOGGED.add((key, what))
    (log.warning if what == "unknown" else log.info)(message, *args)
