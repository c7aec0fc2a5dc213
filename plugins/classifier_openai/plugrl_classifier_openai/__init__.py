"""plugrl plugin: the ``openai`` solution classifier for creativity-weighted GRPO.

Registers the solution classifier ``openai``: it groups the responses to a prompt by overarching
method with one chat completion against any OpenAI-compatible API (OpenAI, or a local vLLM
server). Used by the estimators ``grpo_weighted_add`` / ``grpo_weighted_mul`` of the advantages
plugin through ``algorithm.classifier: openai``. The plugin loader collects the decorated function.
Its options (``algorithm.classifier_options``) are declared once, by :class:`ClassifierOptions`: the
advantages plugin validates them at start-up, and the classifier parses its keywords with it on every call.
``openai`` is also the advantages plugin's default classifier for those estimators (``algorithm.classifier`` unset),
with the model ``gpt-4o-mini`` at ``https://api.openai.com/v1`` unless the options say otherwise.

Its hooks (:mod:`plugrl_classifier_openai.startup`) stop a run that calls it at start: a missing key
(``plugrl_check_config``, before any model loads), a server that cannot be reached or rejects the key
(``plugrl_run_start``, one ``GET {base_url}/models`` before the first step). With ``launch: true`` in its options
the plugin starts the classifier's vLLM server for the run with plugrl-model-servers (:mod:`plugrl_model_servers`)
in ``plugrl_run_start``, waits until it answers, and stops it in ``plugrl_run_end``.
"""

from .classifier import classify_strategies, get_client, groups_schema, missing_key_problem, resolve_api_key
from .options import DEFAULT_BASE_URL, DEFAULT_MODEL, ClassifierOptions, parse_options
from .parsing import parse_groups
from .prompt import build_messages, truncate
from .startup import ClassifierUnavailable, check_server, plugrl_check_config, plugrl_run_end, plugrl_run_start

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "ClassifierOptions",
    "ClassifierUnavailable",
    "build_messages",
    "check_server",
    "classify_strategies",
    "get_client",
    "groups_schema",
    "missing_key_problem",
    "parse_groups",
    "parse_options",
    "plugrl_check_config",
    "plugrl_run_end",
    "plugrl_run_start",
    "resolve_api_key",
    "truncate",
]
