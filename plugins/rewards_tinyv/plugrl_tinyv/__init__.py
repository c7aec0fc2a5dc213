"""plugrl plugin: TinyV, an LLM verifier that catches the false negatives of rule-based math checking.

Registers the reward ``tinyv`` for every data source holding ``_tinyv`` (``@reward("*_tinyv*")``, as
TinyV's verl fork checks ``'_tinyv' in data_source``): math-verify's rule-based check, combined with the
verdict of a verifier model behind an OpenAI-compatible API (a local vLLM server, or any other) as
``reward.options.tinyv.setup`` says: ``tinyv_only`` (the default: the verdict alone), ``addon`` (the
verifier is asked only when the rule says wrong) or ``mixed``. With ``reward.options.tinyv.launch: true``
the plugin starts the verifier server itself for the run (the ``plugrl_run_start`` / ``plugrl_run_end``
hooks below) and stops it at the end, also after a crash or Ctrl-C. Prompts are bounded by the context the
server reports (``max_prompt_tokens: auto``, :mod:`plugrl_tinyv.context`).

The options are declared once, by the pydantic model :class:`Options` the reward registers with: the kernel
validates ``reward.options.tinyv`` against it at start-up, before any model loads.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import plugrl_model_servers as servers
from plugrl.hookspecs import hookimpl
from plugrl.options import reward_options
from plugrl_model_servers.options import LOCAL_HOSTS

from .context import prompt_budget, reset_served_contexts, served_context
from .options import OPTION_NAMES, OptionError, Options, parse_options
from .parsing import parse_rubric, parse_verdict
from .prompts import build_messages, question_text, strip_reasoning
from .readiness import probe_template, wait_for_verifier
from .verifier import (
    combine,
    last_boxed,
    reset_failures_in_a_row,
    reset_verifier_stats,
    resolve_api_key,
    rule_answer,
    rule_score,
    tinyv,
    token_counter,
    verifier_stats,
)

log = logging.getLogger("plugrl.tinyv")
WHERE = "reward.options.tinyv"
SERVER_LOG = "verifier_server.log"  # in the run directory
QUIET_LOGGERS = ("httpx", "httpx2")

__all__ = [
    "OPTION_NAMES",
    "OptionError",
    "Options",
    "build_messages",
    "combine",
    "last_boxed",
    "parse_options",
    "parse_rubric",
    "parse_verdict",
    "plugrl_run_end",
    "plugrl_run_start",
    "prompt_budget",
    "question_text",
    "reset_served_contexts",
    "reset_verifier_stats",
    "rule_answer",
    "rule_score",
    "served_context",
    "strip_reasoning",
    "tinyv",
    "token_counter",
    "verifier_stats",
]


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


@hookimpl
def plugrl_check_config(config: Any) -> list[str] | None:
    """Load the verifier's tokenizer (``reward.options.tinyv.tokenizer_path``) before any model loads.

    The option values themselves are the kernel's to check (the reward declares :class:`Options`); this
    checks only what a value cannot tell: that the tokenizer at the path loads (once per process).
    """
    raw = reward_options(config, "tinyv")
    if raw is None:
        return None
    try:
        opts = parse_options(raw)
    except OptionError:
        return None  # the kernel reports it, under the option's key
    if opts.tokenizer_path:
        try:
            token_counter(opts.tokenizer_path)
        except OptionError as e:
            return [str(e)]
    return None


@hookimpl
def plugrl_run_start(config: Any, run_dir: Any) -> None:
    """Check ``reward.options.tinyv`` before training; with ``launch: true`` start the verifier server
    (rank 0 of a torchrun job; the other ranks wait until it answers), else wait for it (``wait_s``); then check
    that its replies fit the template (``probe``, :mod:`plugrl_tinyv.readiness`)."""
    raw = reward_options(config, "tinyv")
    if raw is None:
        return
    for name in QUIET_LOGGERS:  # the openai client logs every request at INFO: one line per sample
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    try:
        opts = parse_options(raw)
    except OptionError as e:
        raise OptionError(f"tinyv: {e}") from None
    if opts.tokenizer_path:  # load it now: a wrong path stops the run here, not every verification
        try:
            token_counter(opts.tokenizer_path)
        except OptionError as e:
            raise OptionError(f"tinyv: {e}") from None
    host, _ = opts.host_port
    if (host == "openai.com" or host.endswith(".openai.com")) and not os.environ.get(opts.api_key_env, "").strip():
        raise OptionError(
            f"tinyv: the environment variable {opts.api_key_env} (reward.options.tinyv.api_key_env) is not set: "
            f"{opts.base_url} needs an API key. Export it, or point base_url at a local OpenAI-compatible server"
        )
    limit = getattr(getattr(config, "reward", None), "timeout_s", None)
    if isinstance(limit, (int, float)) and opts.worst_case_s > limit:
        log.warning(
            "tinyv: one verification can take up to %.0fs (%d attempts of request_timeout_s=%g plus backoff), "
            "more than reward.timeout_s=%g: a sample that runs out of time scores reward.error_score instead of "
            "the %r fallback. Raise reward.timeout_s or lower reward.options.tinyv.request_timeout_s / retries",
            opts.worst_case_s,
            opts.retries + 1,
            opts.request_timeout_s,
            limit,
            opts.fallback,
        )
    if (
        opts.launch
    ):  # the kernel's managed server (plugrl_model_servers): bound to 127.0.0.1, stopped however the run ends
        if _rank() != 0:
            servers.wait_for_url(opts.base_url, opts.launch_timeout_s, where=WHERE)
        else:
            servers.start(
                opts.model,
                opts.host_port[1],
                args=opts.launch_args,
                log_path=None if run_dir is None else Path(run_dir) / SERVER_LOG,
                timeout_s=opts.launch_timeout_s,
                where=WHERE,
            )
    else:
        wait_for_verifier(opts)  # a server someone else starts: waited for (wait_s), as TinyV's script does
    _check_served_context(opts)
    if opts.probe:
        probe_template(opts)  # its replies fit the template: a rubric model under template tinyv stops the run here
    reset_failures_in_a_row()


def _check_served_context(opts: Options) -> None:
    """Ask a local (or launched) server for its context now, so that options it cannot hold stop the run here;
    a remote one, or one not up yet, is asked at the first verification (which then reports the same error)."""
    if opts.max_prompt_tokens is None or opts.host_port[0] not in LOCAL_HOSTS:
        return
    context = served_context(opts.base_url, opts.model, resolve_api_key(opts.api_key_env))
    try:
        prompt_budget(opts, context)
    except OptionError as e:
        raise OptionError(f"tinyv: {e}") from None


_reported = {"failures": 0, "requests": 0}  # verifier_stats() at the previous plugrl_step_metrics


@hookimpl
def plugrl_step_metrics(step: int) -> dict[str, float] | None:
    """``verifier/failures`` (verifications scored with the fallback) and ``verifier/requests`` (HTTP
    requests, retries included) during this step; None in runs that never called the verifier."""
    stats = verifier_stats()
    if not stats["calls"]:
        return None
    if any(stats[k] < _reported[k] for k in _reported):  # reset_verifier_stats() ran since the last call
        _reported.update(failures=0, requests=0)
    out = {f"verifier/{k}": float(stats[k] - _reported[k]) for k in _reported}
    _reported.update({k: stats[k] for k in _reported})
    return out


@hookimpl
def plugrl_run_end(config: Any, run_dir: Any, error: Any) -> None:
    """Stop the verifier server :func:`plugrl_run_start` launched (whatever ended the run) and log the run's counts.
    Never raises."""
    summary = "tinyv: %(calls)d verifications, %(failures)d failed (fallback used), %(requests)d requests"
    servers.stop_launched(WHERE, summary, verifier_stats(), logger=log)
