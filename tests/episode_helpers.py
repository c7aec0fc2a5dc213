"""What the environment tests share: a scripted reply's tool call in the chat template's (hermes) spelling, and a
config of one environment checked as the run start checks it."""

from __future__ import annotations

import json

from plugrl.config import Config
from plugrl.plugins import check_config, load_plugins


def tool_call(name: str, **arguments) -> str:
    """A reply's tool call as SmolLM2's template (hermes) writes it: ``<tool_call>{json}</tool_call>``."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def environment_config(environment: str, options: dict | None = None, **extra) -> tuple[Config, object]:
    """The config of a run of ``environment`` under the plugin ``verifiers``, and its registry, past the start's
    check."""
    cfg = Config.model_validate(
        {
            "model": {"path": "unused"},
            "plugins": ["verifiers"],
            "environment": environment,
            "environment_options": options or {},
            **extra,
        }
    )
    registry = load_plugins(cfg.plugins)
    check_config(cfg, registry)
    return cfg, registry
