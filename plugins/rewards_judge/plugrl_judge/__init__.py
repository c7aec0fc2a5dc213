"""plugrl plugin: an LLM judge (generative reward model) behind any OpenAI-compatible API.

Registers the reward ``judge`` for the data source ``judge`` and every data source ending in ``_judge``; route
any other data source to it with ``reward.default: judge``. ``reward.options.judge`` (:class:`Options`) says
which model judges (``base_url``, ``model``), with which prompt (``prompt_template``: text or file, filled from
the sample), how its verdict is read (``parser``: a number, a label, JSON, or your own function), how many
judgements each completion gets and how they combine (``samples``, ``reduce``), and the request's limits.

With ``launch: true`` the plugin starts the judge's vLLM server for the run (the kernel's managed server,
:mod:`plugrl_model_servers`) in ``plugrl_run_start`` and stops it in ``plugrl_run_end``, also after a crash or Ctrl-C.
A failed judgement is scored ``reward.error_score`` by the kernel and counted: ``judge/failures`` per step, and
one warning per kind of failure per step (:func:`report_failures`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import plugrl_model_servers as servers
from plugrl.hookspecs import hookimpl
from plugrl.options import reward_options

from .judge import (
    JudgeFailed,
    build_messages,
    judge,
    judge_messages,
    judge_stats,
    report_failures,
    reset_judge_stats,
    step_deltas,
    verdict_reader,
)
from .options import OPTION_NAMES, WHERE, OptionError, Options, parse_options
from .parsers import parse_json, parse_label, parse_number, reduce_scores, strip_reasoning
from .template import FIELDS, check_template, render

log = logging.getLogger("plugrl.judge")
SERVER_LOG = "judge_server.log"  # in the run directory
QUIET_LOGGERS = ("httpx", "httpx2")  # the openai client logs every request at INFO: one line per sample

__all__ = [
    "FIELDS",
    "OPTION_NAMES",
    "JudgeFailed",
    "OptionError",
    "Options",
    "build_messages",
    "check_template",
    "judge",
    "judge_messages",
    "judge_stats",
    "parse_json",
    "parse_label",
    "parse_number",
    "parse_options",
    "plugrl_check_config",
    "plugrl_run_end",
    "plugrl_run_start",
    "plugrl_step_metrics",
    "reduce_scores",
    "render",
    "report_failures",
    "reset_judge_stats",
    "strip_reasoning",
    "verdict_reader",
]


def _needs_key(opts: Options) -> bool:
    host = opts.host_port[0].lower()
    return (host == "openai.com" or host.endswith(".openai.com")) and not os.environ.get(opts.api_key_env, "").strip()


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


@hookimpl
def plugrl_check_config(config: Any) -> list[str] | None:
    """OpenAI's own API without its key is a problem before any model loads (the values are the kernel's to check)."""
    raw = reward_options(config, "judge")
    try:
        opts = parse_options(raw) if raw is not None else None
    except OptionError:
        return None  # the kernel reports it, under the option's key
    if opts is not None and _needs_key(opts):
        return [
            f"the environment variable {opts.api_key_env} ({WHERE}.api_key_env) is not set: {opts.base_url} needs "
            "an API key. Export it, or point base_url at a local OpenAI-compatible server"
        ]
    return None


@hookimpl
def plugrl_run_start(config: Any, run_dir: Any) -> None:
    """Start the judge's server with ``launch: true`` (rank 0; the other ranks wait until it answers), else check
    that ``base_url`` answers: a judge that cannot be reached would score every sample ``reward.error_score``."""
    raw = reward_options(config, "judge")
    if raw is None:
        return
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    try:
        opts = parse_options(raw)
    except OptionError as e:
        raise OptionError(f"judge: {e}") from None
    if _needs_key(opts):
        raise OptionError(f"judge: {plugrl_check_config(config)[0]}")  # type: ignore[index]
    limit = getattr(getattr(config, "reward", None), "timeout_s", None)
    if isinstance(limit, (int, float)) and opts.worst_case_s > limit:
        log.warning(
            "judge: one judgement can take up to %.0fs (%d attempts of timeout_s=%g plus backoff), more than "
            "reward.timeout_s=%g, which then scores the sample reward.error_score. Raise reward.timeout_s or lower "
            "%s.timeout_s / retries",
            opts.worst_case_s,
            opts.retries + 1,
            opts.timeout_s,
            limit,
            WHERE,
        )
    if opts.samples > 1 and opts.temperature == 0:
        log.warning(
            "judge: samples=%d at temperature 0 asks for the same judgement %d times; set %s.temperature above 0 "
            "for independent samples",
            opts.samples,
            opts.samples,
            WHERE,
        )
    if opts.launch:
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
    elif not servers.reachable(opts.base_url, timeout_s=min(opts.timeout_s, 10.0), api_key=_key(opts)):
        raise servers.ServerError(
            f"judge: {WHERE}.base_url {opts.base_url} does not answer GET /models (refused, no answer in time, or "
            f"the key in ${opts.api_key_env} rejected): every sample would score reward.error_score. Start the "
            f"OpenAI-compatible server there, set {WHERE}.launch: true to have plugrl start a vLLM server for "
            f"{opts.model!r}, or point base_url at a server that runs"
        )
    log.info(
        "judge: %s at %s, parser %s, %d sample(s), %s",
        opts.model,
        opts.base_url,
        opts.parser,
        opts.samples,
        opts.reduce,
    )


def _key(opts: Options) -> str:
    from .judge import resolve_api_key

    return resolve_api_key(opts.api_key_env)


@hookimpl
def plugrl_step_metrics(step: int) -> dict[str, float] | None:
    """``judge/failures`` (judgements scored ``reward.error_score``), ``judge/judgements`` and ``judge/requests``
    during this step; None in runs that never judged. Logs the step's failures, one line per kind."""
    report_failures(f"in step {step}")
    return step_deltas()


@hookimpl
def plugrl_run_end(config: Any, run_dir: Any, error: Any) -> None:
    """Log the failures not reported yet, stop the server :func:`plugrl_run_start` launched (whatever ended the run)
    and log the run's counts. Never raises."""
    report_failures("since the last step")
    summary = "judge: %(judgements)d judgements, %(failures)d failed (scored reward.error_score), %(requests)d requests"
    servers.stop_launched(WHERE, summary, judge_stats(), logger=log)
