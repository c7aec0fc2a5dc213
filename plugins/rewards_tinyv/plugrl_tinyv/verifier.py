"""The ``tinyv`` reward: a rule-based math check, and an LLM verifier behind an OpenAI-compatible API.

Runs as an ``async def`` reward on the kernel's event loop (in the trainer process), at most
``reward.max_concurrency`` at a time, each under ``reward.timeout_s``. The rule check (math-verify,
CPU-bound) runs in a small thread pool so it never blocks the loop; the verifier request is an
``openai.AsyncOpenAI`` call. A request that cannot be made or answered (server unreachable, timeout,
HTTP error, a reply that holds no verdict) is retried with exponential backoff, then replaced by the
fallback; training never stops for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from plugrl.rewards import StopRun
from plugrl.specs import reward
from plugrl_math import extract_answer_tag, math_equal

from .context import MISSING, PROBE_TIMEOUT_S, cached_context, prompt_budget, served_context
from .options import OptionError, Options, parse_options, with_option_parameters
from .parsing import parse_rubric, parse_verdict, reply_form
from .prompts import build_messages, strip_reasoning, tail

log = logging.getLogger("plugrl.tinyv")

LOCAL_DUMMY_KEY = "EMPTY"  # what vLLM and friends accept when started without --api-key
MAX_RULE_CHARS = 1000  # the rule check reads at most this much of the extracted answer (bounded time)
RULE_TIME_LIMIT_S = 5.0  # a rule check that takes longer counts as wrong
RULE_THREADS = 2
LOG_EVERY_S = 60.0
# Client errors that come back the same on every attempt: no retry (a prompt over the context
# length, a model name the server does not serve, a rejected key).
NO_RETRY_STATUS = frozenset({400, 401, 403, 404, 422})

_BOXED = ("\\boxed", "\\fbox")

# ---------------------------------------------------------------------------- failure counts


class _Counts:
    """Process-wide counts of verifier calls and failures (the reward runs in the trainer process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.failures = 0
        self.requests = 0
        self.in_a_row = 0  # failures since the last verification that gave a verdict
        self.last_log = 0.0

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"calls": self.calls, "failures": self.failures, "requests": self.requests}


_COUNTS = _Counts()


def verifier_stats() -> dict[str, int]:
    """Counts in this process so far: ``calls`` (verifications wanted), ``failures`` (scored with the
    fallback), ``requests`` (HTTP requests sent, retries included)."""
    return _COUNTS.snapshot()


def reset_verifier_stats() -> None:
    with _COUNTS.lock:
        _COUNTS.calls = _COUNTS.failures = _COUNTS.requests = _COUNTS.in_a_row = 0
        _COUNTS.last_log = 0.0


def reset_failures_in_a_row() -> None:
    """Start a run's count of failures in a row afresh (another run in this process may have left some)."""
    with _COUNTS.lock:
        _COUNTS.in_a_row = 0


def _count_call(failed: bool, requests: int, reason: str | None, opts: Options) -> None:
    """Count one verification; :class:`StopRun` once ``max_failures_in_a_row`` have failed in a row."""
    now = time.monotonic()
    with _COUNTS.lock:
        _COUNTS.calls += 1
        _COUNTS.requests += requests
        if not failed:
            _COUNTS.in_a_row = 0
            return
        _COUNTS.failures += 1
        _COUNTS.in_a_row += 1
        in_a_row = _COUNTS.in_a_row
        first = _COUNTS.failures == 1
        due = first or now - _COUNTS.last_log >= LOG_EVERY_S
        if due:
            _COUNTS.last_log = now
        calls, failures = _COUNTS.calls, _COUNTS.failures
    limit = opts.max_failures_in_a_row
    if limit and in_a_row >= limit:
        raise StopRun(
            f"tinyv: the verifier {opts.model!r} at {opts.base_url} failed {in_a_row} verifications in a row "
            f"(reward.options.tinyv.max_failures_in_a_row={limit}); last: {reason}. The run stops here, before it "
            f"trains on fallback scores: check that the server is up and serves {opts.model!r} (GET "
            f"{opts.base_url.rstrip('/')}/models), or set max_failures_in_a_row: 0 to score the fallback "
            f"({opts.fallback}) and train on"
        )
    if due:
        log.warning(
            "tinyv verifier at %s failed %d of %d verifications so far (scored with fallback %r); last: %s",
            opts.base_url,
            failures,
            calls,
            opts.fallback,
            reason,
        )


# ---------------------------------------------------------------------------- the rule check


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None (linear time)."""
    start, command = max((text.rfind(b), b) for b in _BOXED)
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0 or text[start + len(command) : open_at].strip():
        return None
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def rule_answer(completion: str) -> str:
    """What the rule check reads: the last ``\\boxed{}`` of the answer (the text after the reasoning),
    else its last ``<answer>...</answer>``, else the answer's end; at most :data:`MAX_RULE_CHARS`."""
    text = strip_reasoning(completion)
    boxed = last_boxed(text)
    if boxed is not None:
        return "\\boxed{" + boxed + "}" if len(boxed) <= MAX_RULE_CHARS else ""
    tagged = extract_answer_tag(text)
    if tagged is not None:
        return tagged[-MAX_RULE_CHARS:]
    return text[-MAX_RULE_CHARS:]


def _rule_sync(text: str, ground_truth: Any) -> float:
    try:
        return 1.0 if math_equal(text, ground_truth) else 0.0
    except Exception:  # a ground truth math-verify cannot use: the rule says "not correct"
        return 0.0


_RULE_POOL: cf.ThreadPoolExecutor | None = None
_RULE_POOL_LOCK = threading.Lock()


def _rule_pool() -> cf.ThreadPoolExecutor:
    global _RULE_POOL
    with _RULE_POOL_LOCK:
        if _RULE_POOL is None:
            _RULE_POOL = cf.ThreadPoolExecutor(RULE_THREADS, thread_name_prefix="plugrl-tinyv-rule")
        return _RULE_POOL


async def rule_score(completion: str, ground_truth: Any) -> float:
    """1.0 when the completion's final answer equals ``ground_truth`` (:func:`plugrl_math.math_equal`), else 0.0.

    Runs in a thread (math-verify is CPU-bound and would block the event loop); a check that runs
    over :data:`RULE_TIME_LIMIT_S` (from when it starts, not counting its wait for a free thread)
    counts as wrong.
    """
    text = rule_answer(completion if isinstance(completion, str) else "").strip()
    if not text:
        return 0.0
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def job() -> float:
        loop.call_soon_threadsafe(started.set)
        return _rule_sync(text, ground_truth)

    future = loop.run_in_executor(_rule_pool(), job)
    await started.wait()
    try:
        return await asyncio.wait_for(future, RULE_TIME_LIMIT_S)
    except asyncio.TimeoutError:
        log.warning("tinyv: the rule check took over %gs; counted as wrong", RULE_TIME_LIMIT_S)
        return 0.0


# ---------------------------------------------------------------------------- the verifier request

# clients per event loop (an AsyncOpenAI client's connections belong to the loop that made them)
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()
_CLIENTS_LOCK = threading.Lock()


def resolve_api_key(api_key_env: str) -> str:
    """The key from the environment variable named ``api_key_env``; ``"EMPTY"`` when it is unset (local servers)."""
    return os.environ.get(api_key_env, "").strip() or LOCAL_DUMMY_KEY


def get_client(base_url: str, api_key: str) -> Any:
    """This event loop's ``openai.AsyncOpenAI`` client for (base_url, key), made on first use.

    ``max_retries=0``: the reward retries itself, with its own backoff. Connections that a stopped
    server closed are dropped by the client's pool and opened again on the next request, so a
    restarted server is reached again by the same client.
    """
    loop = asyncio.get_running_loop()
    with _CLIENTS_LOCK:  # runners in several threads each have their own loop
        per_loop = _CLIENTS.setdefault(loop, {})
        client = per_loop.get((base_url, api_key))
        if client is None:
            import openai

            client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
            per_loop[(base_url, api_key)] = client
    return client


_COUNTERS: dict[str, Callable[[str], int]] = {}
_COUNTERS_LOCK = threading.Lock()


def token_counter(path: str) -> Callable[[str], int]:
    """A function counting the tokens of a text with the verifier's tokenizer at ``path`` (a local
    directory, or ``local:NAME``), loaded once per process; an :class:`OptionError` when it cannot load."""
    with _COUNTERS_LOCK:
        count = _COUNTERS.get(path)
        if count is not None:
            return count
        try:
            from transformers import AutoTokenizer

            from plugrl.models import resolve_model_path

            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path), local_files_only=True)
        except Exception as e:
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise OptionError(
                f"reward.options.tinyv.tokenizer_path={path!r}: no tokenizer could be loaded from it "
                f"({type(e).__name__}{': ' + why if why else ''}). Point it at a local directory holding the "
                "verifier's tokenizer files (tokenizer.json, tokenizer_config.json), e.g. the served model's "
                "directory, or leave it out to bound prompts by a worst-case estimate"
            ) from None

        lock = threading.Lock()  # prompts are built in threads; a fast tokenizer is not safe to share between them

        def count(text: str) -> int:
            with lock:
                return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

        _COUNTERS[path] = count
        return count


class NoVerdict(Exception):
    """The verifier's reply holds no verdict ("garbage")."""


class TemplateMismatch(NoVerdict):
    """The reply is a verdict of the other template (a rubric score asked for True/False): not retried."""


def mismatch_hint(template: str, form: str) -> str:
    """What to set when the verifier answers template ``template`` in the form of template ``form``."""
    what = "a rubric score (Total Score: x/10)" if form == "rubric" else "a True/False verdict"
    kind = "a rubric reward model" if form == "rubric" else "a True/False verifier"
    return (
        f"the verifier answers the {template} template with {what}: it is {kind}; set "
        f"reward.options.tinyv.template: {form}"
    )


def _describe(e: BaseException) -> str:
    status = getattr(e, "status_code", None)
    text = f"{type(e).__name__}" + (f" (HTTP {status})" if status else "")
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{text}: {msg[:200]}" if msg else text
    if status == 400 and "context length" in str(e).lower():
        text += (
            " -- the prompt is over the verifier's context: set reward.options.tinyv.max_prompt_tokens to the "
            "server's --max-model-len minus max_tokens (or leave it out: auto takes the context the server reports), "
            "and tokenizer_path to the verifier's tokenizer for an exact count (without it the count is a "
            "worst-case estimate)"
        )
    return text


def _retryable(e: BaseException) -> bool:
    return not isinstance(e, TemplateMismatch) and getattr(e, "status_code", None) not in NO_RETRY_STATUS


async def _ask(opts: Options, messages: list[dict[str, str]]) -> float:
    """One request; the verdict (1.0/0.0, or the rubric's fraction) or an exception."""
    client = get_client(opts.base_url, resolve_api_key(opts.api_key_env))
    response = await asyncio.wait_for(
        client.chat.completions.create(
            model=opts.model,
            messages=messages,
            temperature=opts.temperature,
            max_tokens=opts.max_tokens,
            timeout=opts.request_timeout_s,
        ),
        opts.request_timeout_s + 1.0,  # the client's own timeout is per read; this bounds the whole request
    )
    choices = getattr(response, "choices", None) or []
    content = choices[0].message.content if choices else None
    form = reply_form(content, opts.template)
    if form is not None and form != opts.template:
        raise TemplateMismatch(f"{mismatch_hint(opts.template, form)} (reply {tail(str(content), 120)!r})")
    if opts.template == "rubric":
        value = parse_rubric(content)
        if value is None:
            raise NoVerdict(f"no 'Total Score: x/10' in the reply {tail(str(content), 120)!r}")
        return value
    verdict = parse_verdict(content)
    if verdict is None:
        raise NoVerdict(f"no True/False verdict in the reply {tail(str(content), 120)!r}")
    return 1.0 if verdict else 0.0


async def verify(opts: Options, messages: list[dict[str, str]]) -> tuple[float | None, int, str | None]:
    """(verdict or None, requests made, the last failure or None), with retries and exponential backoff."""
    failure = None
    attempts = 0
    for attempt in range(opts.retries + 1):
        attempts += 1
        try:
            return await _ask(opts, messages), attempts, None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # connection, timeout, HTTP status, garbage: retried, then the fallback
            failure = _describe(e)
            if not _retryable(e) or attempt == opts.retries:
                break
        await asyncio.sleep(opts.backoff_s * 2**attempt)
    return None, attempts, failure


# ---------------------------------------------------------------------------- the reward


async def resolve_prompt_budget(opts: Options) -> int | None:
    """The prompt's token bound (:func:`plugrl_tinyv.context.prompt_budget`), asking the server for its
    context the first time (off the event loop); an :class:`OptionError` when the options do not fit it."""
    if opts.max_prompt_tokens is None:
        return None
    context = cached_context(opts.base_url, opts.model)
    if context is MISSING:
        api_key = resolve_api_key(opts.api_key_env)
        timeout_s = min(PROBE_TIMEOUT_S, opts.request_timeout_s)
        context = await asyncio.to_thread(served_context, opts.base_url, opts.model, api_key, timeout_s)
    return prompt_budget(opts, context)


def combine(setup: str, rule: float, verdict: float, weight: float) -> float:
    """The score of a verified sample: ``tinyv_only`` the verdict; ``addon`` 1 when the rule says
    correct, else verdict x weight; ``mixed`` weight x verdict + (1 - weight) x rule."""
    if setup == "tinyv_only":
        return verdict
    if setup == "addon":
        return 1.0 if rule >= 1.0 else verdict * weight
    if setup == "mixed":
        return weight * verdict + (1.0 - weight) * rule
    raise ValueError(f"unknown setup {setup!r}")


# '_tinyv' anywhere in the data source, as TinyV's verl fork checks it ('_tinyv' in data_source)
@reward("*_tinyv*", name="tinyv", options=Options)
@with_option_parameters
async def tinyv(
    completion: str,
    ground_truth: Any,
    *,
    extra_info: Any = None,
    sample: Any = None,
    prompt: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """TinyV for data sources holding ``_tinyv``: the rule-based check, corrected by an LLM verifier.

    Result: ``score``; ``rule`` (1.0/0.0 from math-verify); ``verdict`` (the verifier's 1.0/0.0, or
    the rubric's Total Score / 10; None when not asked or failed); ``verifier_failed`` (True when
    the verifier could not give a verdict after the retries and the fallback scored the sample);
    ``setup``; ``requests`` (HTTP requests made); ``failure`` (why it failed, or None). The kernel
    logs these per sample in the rollouts. ``options``: ``reward.options.tinyv``, declared by
    :class:`plugrl_tinyv.Options` (see the README); the signature lists them one by one
    (:func:`plugrl_tinyv.options.with_option_parameters`).
    """
    opts = parse_options(options)
    completion = completion if isinstance(completion, str) else ""
    rule = await rule_score(completion, ground_truth)
    result: dict[str, Any] = {
        "score": rule,
        "rule": rule,
        "verdict": None,
        "verifier_failed": False,
        "setup": opts.setup,
        "requests": 0,
        "failure": None,
    }
    if opts.setup == "addon" and rule >= 1.0:
        result["score"] = 1.0  # the rule already says correct: no request
        return result
    budget = await resolve_prompt_budget(opts)
    question_chars, answer_chars = opts.char_bounds(budget)
    messages = await asyncio.to_thread(  # counting tokens of long texts would hold up the event loop
        build_messages,
        opts.template,
        completion,
        ground_truth,
        extra_info=extra_info,
        sample=sample,
        prompt=prompt,
        max_question_chars=question_chars,
        max_answer_chars=answer_chars,
        max_prompt_tokens=budget,
        count_tokens=token_counter(opts.tokenizer_path) if opts.tokenizer_path else None,
        prompt_template=opts.prompt_text,
    )
    verdict, requests, failure = await verify(opts, messages)
    _count_call(verdict is None, requests, failure, opts)
    result["requests"] = requests
    if verdict is None:
        result.update(score=rule if opts.fallback == "rule" else 0.0, verifier_failed=True, failure=failure)
        return result
    result.update(score=combine(opts.setup, rule, verdict, opts.weight), verdict=verdict)
    return result
