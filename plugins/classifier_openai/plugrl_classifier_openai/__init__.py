"""plugrl plugin: the ``openai`` solution classifier for creativity-weighted GRPO.

Registers the solution classifier ``openai``: it groups the responses to a prompt by overarching
method with one chat completion against any OpenAI-compatible API (OpenAI, or a local vLLM
server). Used by the estimators ``grpo_weighted_add`` / ``grpo_weighted_mul`` of the advantages
plugin through ``algorithm.classifier: openai``. The plugin loader collects the decorated function.
Its options (``algorithm.classifier_options``) are declared once, by :class:`ClassifierOptions`: the
kernel validates them at start-up, and the classifier parses its keywords with it on every call.
"""

from .classifier import classify_strategies, get_client, groups_schema, resolve_api_key
from .options import DEFAULT_BASE_URL, DEFAULT_MODEL, ClassifierOptions, parse_options
from .parsing import parse_groups
from .prompt import build_messages, truncate

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "ClassifierOptions",
    "build_messages",
    "classify_strategies",
    "get_client",
    "groups_schema",
    "parse_groups",
    "parse_options",
    "resolve_api_key",
    "truncate",
]
