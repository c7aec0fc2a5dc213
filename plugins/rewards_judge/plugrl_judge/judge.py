"""The ``judge`` reward: an LLM judge (generative reward model) behind an OpenAI-compatible API.

An ``async def`` reward: the kernel runs the judgements of a batch concurrently on its event loop (at most
``reward.max_concurrency``, each under ``reward.timeout_s``); ``reward.options.judge.concurrency`` bounds the
requests in flight to the judge's server. One judgement is one chat completion with ``n = samples`` replies, each
read by the parser; the verdicts that parse are reduced to the score.

A judgement that fails -- the server unreachable or erroring after the retries, or no reply holding a verdict -- is
counted (``judge/failures``, :func:`judge_stats`) and raises :class:`JudgeFailed`: the kernel scores the sample
``reward.error_score``, counts it in ``reward/errors`` and keeps the message in the sample's ``judge/error``. The
plugin logs the failures once a step, one line per kind (:func:`report_failures`); each one's traceback at DEBUG.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from plugrl.specs import reward

from .options import Options, parse_options
from .parsers import call_function, load_function, parse_json, parse_label, parse_number, reduce_scores
from .template import MissingField, render

log = logging.getLogger("plugrl.judge")

LOCAL_DUMMY_KEY = "EMPTY"  # what vLLM and friends accept when started without --api-key
# answers that come back the same on every attempt (a prompt over the context, an unknown model, a rejected key)
NO_RETRY_STATUS = frozenset({400, 401, 403, 404, 422})


class JudgeFailed(RuntimeError):
    """No verdict for a completion; the kernel scores it ``reward.error_score``."""


# ---------------------------------------------------------------------------- counts


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.judgements = self.failures = self.requests = 0
        # since the last report_failures(): the judgements, and the failures by kind: kind -> [count, first message]
        self.round_judgements = 0
        self.round_failures: dict[str, list[Any]] = {}


_COUNTS = _Counts()


def judge_stats() -> dict[str, int]:
    """Counts in this process so far: ``judgements`` (completions judged or tried), ``failures`` (scored
    ``reward.error_score``), ``requests`` (HTTP requests sent, retries included)."""
    with _COUNTS.lock:
        return {"judgements": _COUNTS.judgements, "failures": _COUNTS.failures, "requests": _COUNTS.requests}


_REPORTED = {"failures": 0, "judgements": 0, "requests": 0}  # judge_stats() at the previous step_deltas()


def reset_judge_stats() -> None:
    with _COUNTS.lock:
        _COUNTS.judgements = _COUNTS.failures = _COUNTS.requests = 0
        _COUNTS.round_judgements = 0
        _COUNTS.round_failures = {}
        _REPORTED.update(dict.fromkeys(_REPORTED, 0))


def step_deltas() -> dict[str, float] | None:
    """``judge/failures``, ``judge/judgements`` and ``judge/requests`` since the previous call (None: never judged)."""
    stats = judge_stats()
    if not stats["judgements"]:
        return None
    with _COUNTS.lock:
        out = {f"judge/{k}": float(stats[k] - _REPORTED[k]) for k in _REPORTED}
        _REPORTED.update({k: stats[k] for k in _REPORTED})
    return out


def _count(requests: int, failure: tuple[str, str] | None = None) -> None:
    """Count one judgement: its HTTP requests and, when it failed, ``(kind, message)``: what failed (an error's
    type, ``no verdict``, ...), to be reported by :func:`report_failures`, and the judgement's error message."""
    with _COUNTS.lock:
        _COUNTS.judgements += 1
        _COUNTS.round_judgements += 1
        _COUNTS.requests += requests
        if failure is None:
            return
        _COUNTS.failures += 1
        kind, message = failure
        entry = _COUNTS.round_failures.setdefault(kind, [0, message])
        entry[0] += 1


def report_failures(when: str = "since the last report") -> None:
    """Log the failed judgements since the last report (``when`` says since when: ``in step 3``): one warning per
    kind of failure, saying what failed, how many of the judgements, and the first one's message. The hooks call it
    once a step (``plugrl_step_metrics``) and at the end of the run, so a judge that is down costs a line per step,
    not a line (or a traceback) per sample; each failure's own traceback is logged at DEBUG."""
    with _COUNTS.lock:
        judged, failed = _COUNTS.round_judgements, _COUNTS.round_failures
        _COUNTS.round_judgements, _COUNTS.round_failures = 0, {}
    for kind, (count, first) in failed.items():
        log.warning(
            "judge: %d of %d judgements %s failed: %s (scored reward.error_score); the first: %s",
            count,
            judged,
            when,
            kind,
            first,
        )


# ---------------------------------------------------------------------------- clients, per event loop

# an AsyncOpenAI client's connections belong to the loop that made them; so does a semaphore
_PER_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)
_PER_LOOP_LOCK = threading.Lock()


def resolve_api_key(api_key_env: str) -> str:
    """The key from the environment variable named ``api_key_env``; ``"EMPTY"`` when unset (local servers)."""
    return os.environ.get(api_key_env, "").strip() or LOCAL_DUMMY_KEY


def _per_loop(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    loop = asyncio.get_running_loop()
    with _PER_LOOP_LOCK:
        table = _PER_LOOP.setdefault(loop, {})
        if key not in table:
            table[key] = make()
        return table[key]


def get_client(base_url: str, api_key: str) -> Any:
    """This loop's ``openai.AsyncOpenAI`` for (base_url, key); ``max_retries=0``: the judge retries itself."""

    def make() -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    return _per_loop(("client", base_url, api_key), make)


def _limit(opts: Options) -> asyncio.Semaphore:
    return _per_loop(
        ("limit", opts.base_url, opts.model, opts.concurrency), lambda: asyncio.Semaphore(opts.concurrency)
    )


# ---------------------------------------------------------------------------- one judgement


def verdict_reader(opts: Options) -> Callable[[str | None], float | None]:
    """The parser ``opts.parser`` names, bound to its options: reply -> score or None."""
    pattern = opts.compiled_pattern
    if opts.parser == "number":
        return lambda reply: parse_number(reply, pattern, opts.range)
    if opts.parser == "label":
        labels = opts.labels or {}
        return lambda reply: parse_label(reply, labels, pattern)
    if opts.parser == "json":
        key = opts.key or ""
        return lambda reply: parse_json(reply, key, opts.labels, opts.range)
    fn = load_function(opts.parser)  # imported once per module by Python; checked at start
    return lambda reply: call_function(fn, reply)


class _NoVerdict(Exception):
    """No reply of a request held a verdict."""


def _kind(e: BaseException) -> str:
    """What failed, as a failure's kind: the error's type, and the HTTP status it carries."""
    status = getattr(e, "status_code", None)
    return type(e).__name__ + (f" (HTTP {status})" if status else "")


def _describe(e: BaseException) -> str:
    text = _kind(e)
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{text}: {msg[:200]}" if msg else text


def _tail(text: Any, n: int = 120) -> str:
    s = str(text)
    return s if len(s) <= n else "..." + s[-n:]


async def _ask(opts: Options, messages: list[dict[str, str]]) -> tuple[list[float], list[str | None]]:
    """One request for ``samples`` replies: (the verdicts that parsed, every reply's text)."""
    client = get_client(opts.base_url, resolve_api_key(opts.api_key_env))
    extra = {"extra_body": dict(opts.extra_body)} if opts.extra_body else {}
    async with _limit(opts):
        response = await asyncio.wait_for(
            client.chat.completions.create(
                model=opts.model,
                messages=messages,
                n=opts.samples,
                temperature=opts.temperature,
                max_tokens=opts.max_tokens,
                timeout=opts.timeout_s,
                **extra,
            ),
            opts.timeout_s + 1.0,  # the client's timeout is per read; this bounds the whole request
        )
    replies = [getattr(c.message, "content", None) for c in (getattr(response, "choices", None) or [])]
    read = verdict_reader(opts)
    verdicts: list[float] = []
    for reply in replies:
        try:
            value = read(reply)
        except Exception as e:  # the user's parser raised: that reply holds no verdict
            log.debug("judge: the parser %s raised on a reply: %s", opts.parser, _describe(e), exc_info=True)
            value = None
        if value is not None:
            verdicts.append(value)
    return verdicts, replies


async def judge_messages(opts: Options, messages: list[dict[str, str]]) -> tuple[float, dict[str, Any]]:
    """The reduced score and what to log, with retries and exponential backoff; :class:`JudgeFailed` after the
    last attempt. Errors the server gives the same every time (400, 401, 403, 404, 422) are not retried, nor is
    a reply without a verdict at temperature 0 (the same prompt gets the same reply)."""
    requests, kind, failure = 0, "no attempt", "no attempt"
    for attempt in range(opts.retries + 1):
        requests += 1
        retry = True
        try:
            verdicts, replies = await _ask(opts, messages)
            if verdicts:
                score = reduce_scores(verdicts, opts.reduce)
                _count(requests)
                return score, {"verdicts": verdicts, "parsed": len(verdicts), "requests": requests}
            last = _tail(replies[-1] if replies else None)
            kind = f"no verdict ({opts.parser} parser)"
            failure = f"{kind} in {len(replies)} replies; last: {last!r}"
            retry = opts.temperature > 0
        except asyncio.CancelledError:  # the kernel's reward.timeout_s ran out: counted, then scored error_score
            why = f"judge {opts.model} at {opts.base_url}: cancelled (reward.timeout_s) after {requests} requests"
            _count(requests, ("cancelled (reward.timeout_s)", why))
            raise
        except Exception as e:  # connection, timeout, HTTP status
            kind, failure = _kind(e), _describe(e)
            retry = getattr(e, "status_code", None) not in NO_RETRY_STATUS
            log.debug("judge: request %d to %s failed", requests, opts.base_url, exc_info=True)
        if not retry or attempt == opts.retries:
            break
        await asyncio.sleep(opts.backoff_s * 2**attempt)
    message = f"judge {opts.model} at {opts.base_url}: {failure} (after {requests} requests)"
    _count(requests, (kind, message))
    raise JudgeFailed(message)


def build_messages(opts: Options, **fields: Any) -> list[dict[str, str]]:
    """The chat messages of one judgement: the system prompt, if any, and the filled template."""
    try:
        text = render(opts.prompt_text, max_completion_chars=opts.max_completion_chars, **fields)
    except MissingField as e:
        raise JudgeFailed(f"{e.args[0]} (reward.options.judge.prompt_template)") from None
    messages = [{"role": "system", "content": opts.system_prompt}] if opts.system_prompt else []
    return [*messages, {"role": "user", "content": text}]


# ---------------------------------------------------------------------------- the reward


@reward("judge", "*_judge", name="judge", options=Options)
async def judge(
    completion: str,
    ground_truth: Any = None,
    *,
    extra_info: Any = None,
    prompt: Any = None,
    sample: Any = None,
    data_source: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Score ``completion`` with the LLM judge ``reward.options.judge`` describes (:class:`plugrl_judge.Options`).

    Result: ``score`` (the reduced verdicts), ``verdicts`` (each parsed sample's score), ``parsed`` (how many of
    the ``samples`` replies held a verdict), ``requests`` (HTTP requests, retries included). Raises
    :class:`JudgeFailed` when no verdict came (the kernel scores ``reward.error_score``).
    """
    opts = parse_options(options)
    try:
        messages = build_messages(
            opts,
            completion=completion if isinstance(completion, str) else "",
            ground_truth=ground_truth,
            prompt=prompt,
            sample=sample,
            extra_info=extra_info,
            data_source=data_source,
        )
    except JudgeFailed as e:
        _count(0, ("a field prompt_template names is missing", str(e)))
        raise
    score, details = await judge_messages(opts, messages)
    return {"score": score, **details}


def _with_option_parameters() -> None:
    """Show one keyword parameter per option in place of ``**options``: the kernel passes a reward only the
    context keywords its signature names (not every column of the row, which ``**options`` would take)."""
    signature = inspect.signature(judge)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    for name, field in Options.model_fields.items():
        if not field.exclude:
            default = inspect.Parameter.empty if field.is_required() else field.default
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    judge.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]


_with_option_parameters()
