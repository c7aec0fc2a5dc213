"""Before the first step: the verifier server answers, and its replies fit the template.

TinyV's script starts ``vllm serve`` beside training and waits for it (``curl /v1/models``, 50 tries 10 s apart),
exiting when it never answers. :func:`wait_for_verifier` does the same for a server the plugin does not launch
(``wait_s``, a progress line every 10 s), and stops the run with an error naming ``base_url`` when it does not
come. :func:`probe_template` then asks the verifier one known question in the configured template (``probe``): a
rubric reward model asked for True/False still writes ``Total Score: 7/10``, which the ``tinyv`` template cannot
read (every sample would score the fallback), so the run stops at start naming ``reward.options.tinyv.template``
and the value to set. A reply of neither form is only logged: a small verifier may get one question wrong, and
``max_failures_in_a_row`` stops a run whose verifications keep failing.
"""

from __future__ import annotations

import logging

import plugrl_model_servers as servers

from .options import DEFAULT_MAX_TOKENS, OptionError, Options
from .parsing import reply_form
from .prompts import build_messages, tail
from .verifier import mismatch_hint, resolve_api_key

log = logging.getLogger("plugrl.tinyv")

WAIT_EVERY_S = 10.0
# the probe: a question whose reference and answer agree, so a verifier of either kind answers with a clear verdict
PROBE_QUESTION = "What is 7 + 5?"
PROBE_TRUTH = "12"
PROBE_ANSWER = "7 + 5 = 12, so the answer is \\boxed{12}."
OTHER = {"tinyv": "rubric", "rubric": "tinyv"}


def wait_for_verifier(opts: Options) -> None:
    """Return once ``GET base_url/models`` answers; :class:`OptionError` naming ``base_url`` when it has not within
    ``wait_s`` (0: one try, no wait)."""
    url = opts.base_url.rstrip("/")

    def progress(attempt: int, attempts: int) -> None:
        log.info(
            "tinyv: waiting for the verifier server at %s to answer GET /models... (%d/%d)", url, attempt, attempts
        )

    api_key = resolve_api_key(opts.api_key_env)
    if servers.wait_until_reachable(url, opts.wait_s, api_key=api_key, every_s=WAIT_EVERY_S, progress=progress):
        return
    waited = f"within {opts.wait_s:g}s (reward.options.tinyv.wait_s)" if opts.wait_s else "(wait_s: 0, no wait)"
    raise OptionError(
        f"tinyv: the verifier server at {url} (reward.options.tinyv.base_url) did not answer GET /models {waited}. "
        f"Start it first (e.g. vllm serve MODEL --served-model-name {opts.model} --port PORT), point base_url at it, "
        "raise wait_s for a server that takes longer to start, or set launch: true to have the run start it"
    )


def _ask(opts: Options, template: str, max_tokens: int) -> str:
    """The verifier's reply to the probe question in ``template``; raises what the request raised."""
    import openai

    messages = build_messages(
        template,
        PROBE_ANSWER,
        PROBE_TRUTH,
        prompt=PROBE_QUESTION,
        prompt_template=None if template != opts.template else opts.prompt_text,
    )
    with openai.OpenAI(base_url=opts.base_url, api_key=resolve_api_key(opts.api_key_env), max_retries=0) as client:
        response = client.chat.completions.create(
            model=opts.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=opts.temperature,
            max_tokens=max_tokens,
            timeout=opts.request_timeout_s,
        )
    choices = getattr(response, "choices", None) or []
    return str(choices[0].message.content if choices else "")


def probe_template(opts: Options) -> str | None:
    """Ask the probe question in the configured template; :class:`OptionError` naming the template to set when the
    reply (or, when it holds no verdict, the reply to the other template) has the other template's form. Returns the
    form found (None: neither, logged). A request that fails is logged, not raised: the verifications report it."""
    try:
        reply = _ask(opts, opts.template, opts.max_tokens)
    except Exception as e:  # the server answered GET /models: a failing request is the verifications' to count
        log.warning("tinyv: the probe request to %s failed (%s: %s)", opts.base_url, type(e).__name__, e)
        return None
    form = reply_form(reply, opts.template)
    if form is None:  # e.g. a rubric model cut at the tinyv template's 16 tokens: ask in the other form
        other = OTHER[opts.template]
        try:
            other_reply = _ask(opts, other, DEFAULT_MAX_TOKENS[other])
        except Exception:
            other_reply = ""
        if reply_form(other_reply, other) == other:
            form, reply = other, other_reply
    if form == opts.template:
        log.info("tinyv: the verifier %r answers the %s template (probe: %r)", opts.model, form, tail(reply, 80))
        return form
    if form is not None:
        raise OptionError(
            f"tinyv: {mismatch_hint(opts.template, form)} (the probe's reply: {tail(reply, 120)!r}). With template "
            f"{opts.template} every verification would fail and score the fallback. Or set probe: false to skip "
            "this check"
        )
    log.warning(
        "tinyv: the verifier %r at %s answered the probe question with no verdict of either form (%r): check "
        "reward.options.tinyv.template and max_tokens; verifications without a verdict score the fallback, and "
        "max_failures_in_a_row of them in a row stop the run",
        opts.model,
        opts.base_url,
        tail(reply, 120),
    )
    return None
