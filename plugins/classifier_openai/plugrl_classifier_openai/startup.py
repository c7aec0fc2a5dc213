"""What the plugin checks when a run that uses the ``openai`` classifier starts, so that a missing key or a
server that is down stops the run at once instead of turning every classification into a fallback (one group
per response, creativity weight 1) step after step.

- ``plugrl_check_config`` (before any model loads): the key's environment variable is set where a key is
  needed (OpenAI's own API).
- ``plugrl_run_start`` (before the first step; the kernel's contract keeps servers out of the config check):
  with ``launch: true``, start the classifier's vLLM server with the kernel's managed server
  (:mod:`plugrl_model_servers`; rank 0 starts it, the other ranks wait until it answers) and wait until it answers,
  up to ``launch_timeout_s``. Then one ``GET {base_url}/models`` with a short time limit. Refused, unknown host
  or no answer: the server is unreachable; HTTP 401/403: the key was rejected. Both stop the run with what to do.
- ``plugrl_run_end``: stop the server ``plugrl_run_start`` launched, however the run ended. Never raises.

They act only when ``algorithm.classifier`` is ``openai``: the advantages plugin leaves it None at start-up in runs that
classify nothing (``plugrl eval``, estimators that do not group by strategy).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import plugrl_model_servers as servers
from plugrl.hookspecs import hookimpl

from .classifier import LOCAL_DUMMY_KEY, missing_key_problem, resolve_api_key
from .options import WHERE, ClassifierOptions, parse_options

log = logging.getLogger("plugrl.classifier_openai")

NAME = "openai"
SERVER_LOG = "classifier_server.log"  # in the run directory
PROBE_TIMEOUT_S = 10.0  # at most: GET /models is cheap, and a server that needs longer for it is not ready
OFF_HINT = "or switch the classifier off with algorithm.classifier: off (every response its own group, weight 1)"


class ClassifierUnavailable(RuntimeError):
    """The classifier's server cannot be used: unreachable, or it rejected the key. The message says what to do."""


def options_in_use(config: Any) -> ClassifierOptions | None:
    """The run's ``algorithm.classifier_options`` when the run calls the ``openai`` classifier, else None (also
    when they are invalid: the advantages plugin reports those under the option's key)."""
    algorithm = getattr(config, "algorithm", None)
    if getattr(algorithm, "classifier", None) != NAME:
        return None
    try:
        return parse_options(getattr(algorithm, "classifier_options", None) or {})
    except (TypeError, ValueError):
        return None


def check_server(opts: ClassifierOptions) -> list[str]:
    """One ``GET {base_url}/models`` with the run's key: the ids of the models the server lists.

    Raises :class:`ClassifierUnavailable` when nothing answers in time (refused, unknown host, timeout) or the
    server answers 401/403; any other answer means it is there (a server without ``/models`` gets a warning).
    """
    key = resolve_api_key(opts.base_url, opts.api_key_env)  # the missing-key error of OpenAI's API, if any
    url = opts.base_url.rstrip("/") + "/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}", "Accept": "application/json"})
    timeout = min(opts.timeout_s, PROBE_TIMEOUT_S)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body = resp.read(4_000_000)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            sent = (
                f"the dummy key {LOCAL_DUMMY_KEY}, as {opts.api_key_env} is not set"
                if key == LOCAL_DUMMY_KEY and not os.environ.get(opts.api_key_env, "").strip()
                else f"the key in ${opts.api_key_env}"
            )
            raise ClassifierUnavailable(
                f"the openai solution classifier's server rejected its key: GET {url} answered HTTP {e.code} to "
                f"{sent} ({WHERE}.api_key_env names the variable). Set {opts.api_key_env} to a key that server "
                f"accepts, point {WHERE}.base_url at another server, {OFF_HINT}"
            ) from None
        log.warning(
            "classifier openai: GET %s answered HTTP %d; the server is there, its models are not checked", url, e.code
        )
        return []
    except (urllib.error.URLError, OSError, ValueError) as e:  # refused, unknown host, timeout, malformed URL
        reason = getattr(e, "reason", None) or e
        raise ClassifierUnavailable(
            f"the openai solution classifier cannot reach {WHERE}.base_url {opts.base_url}: GET {url} failed "
            f"({reason}; time limit {timeout:g}s). Start the OpenAI-compatible server there (e.g. python -m "
            f"vllm.entrypoints.openai.api_server --served-model-name {opts.model} ...) and wait until {url} answers, "
            f"set {WHERE}.launch: true to have plugrl start a local vLLM server for the model, point "
            f"{WHERE}.base_url at a server that runs, {OFF_HINT}"
        ) from None
    try:
        listed = json.loads(body).get("data") or []
        return [str(m["id"]) for m in listed if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError):
        return []


@hookimpl
def plugrl_check_config(config: Any) -> list[str] | None:
    """The key's environment variable is set where the server needs a key (OpenAI's API), before any model loads."""
    opts = options_in_use(config)
    if opts is None:
        return None
    problem = missing_key_problem(opts.base_url, opts.api_key_env)
    return [f"{problem}, {OFF_HINT}"] if problem else None


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def port_of(opts: ClassifierOptions) -> int:
    """The port of ``base_url`` (explicit with ``launch: true``; the scheme's default otherwise)."""
    parts = urlsplit(opts.base_url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def launch_server(opts: ClassifierOptions, run_dir: Any) -> None:
    """``launch: true``: start the classifier's vLLM server (rank 0) and return once it answers; the other ranks
    wait for rank 0's. :class:`plugrl_model_servers.ServerError`, naming this plugin's options, when it cannot start."""
    if _rank() != 0:
        servers.wait_for_url(opts.base_url, opts.launch_timeout_s, where=WHERE)
        return
    servers.start(
        opts.model,
        port_of(opts),
        args=opts.launch_args,
        log_path=None if run_dir is None else Path(run_dir) / SERVER_LOG,
        timeout_s=opts.launch_timeout_s,
        where=WHERE,
    )


@hookimpl
def plugrl_run_start(config: Any, run_dir: Any) -> None:
    """Start the classifier's server with ``launch: true``, then reach it once before training:
    :class:`ClassifierUnavailable` when it cannot be used."""
    if run_dir is None:  # plugrl eval: nothing is classified
        return
    opts = options_in_use(config)
    if opts is None:
        return
    if opts.launch:
        launch_server(opts, run_dir)  # returns once GET /v1/models answers
    models = check_server(opts)
    if models and opts.model not in models:  # a warning only: some servers answer to aliases they do not list
        log.warning(
            "classifier openai: %s does not list the model %r (%s.model); it lists %s. If requests fail with "
            "'model not found', set %s.model to one of them (a local server's --served-model-name)",
            opts.base_url,
            opts.model,
            WHERE,
            ", ".join(models[:10]) + (", ..." if len(models) > 10 else ""),
            WHERE,
        )
    log.info("classifier openai: model %s at %s (reachable)", opts.model, opts.base_url)


@hookimpl
def plugrl_run_end(config: Any, run_dir: Any, error: Any) -> None:
    """Stop the server :func:`plugrl_run_start` launched (``launch: true``), whatever ended the run. Never raises."""
    try:
        opts = options_in_use(config)
        if opts is None or not opts.launch:
            return
        server = servers.running().get(port_of(opts))
        if server is not None and server.where == WHERE:  # one another plugin launched there is theirs to stop
            servers.stop(server.port)
    except Exception as e:  # a run end must not raise
        log.warning("classifier openai: stopping the classifier's server failed: %s", e)
