"""``plugrl rollout-serve MODEL``: a rollout server for a trainer with ``rollout.mode: server``
(entry point of the group ``plugrl.commands``)."""

from __future__ import annotations

import argparse

from plugrl.cli import VERBOSE_HELP


def register(commands: argparse._SubParsersAction) -> None:
    s = commands.add_parser(
        "rollout-serve",
        help="serve MODEL for a trainer with rollout.mode=server: generation, and new weights after each update",
    )
    s.add_argument("model", help="a model directory, a hub id or local:NAME (the policy's starting weights)")
    s.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1; 0.0.0.0: all)")
    s.add_argument("--port", type=int, default=8100, help="port (default 8100)")
    s.add_argument("--max-model-len", type=int, default=4096, help="prompt + response tokens (default 4096)")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda when present")
    s.add_argument("overrides", nargs="*", help="rollout.KEY=VALUE engine settings, e.g. rollout.dtype=float32")
    s.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    s.set_defaults(fn=rollout_serve)


def rollout_serve(args: argparse.Namespace) -> int:
    """Build the server's ``rollout`` settings from ``rollout.KEY=VALUE`` words (a word of another section is an
    error naming it) and serve until SIGTERM or SIGINT."""
    from pydantic import ValidationError

    from plugrl.config import ConfigError, RolloutConfig, parse_override
    from plugrl.dist import resolve_device
    from plugrl_rollout_servers.server import serve

    values = {}
    for text in args.overrides:
        key, value = parse_override(text)
        name = key.removeprefix("rollout.")
        if name not in RolloutConfig.model_fields:
            raise ConfigError(
                f"{key!r} is not a rollout key; rollout-serve takes rollout.KEY=VALUE (docs/configuration.md)"
            )
        values[name] = value
    try:
        rollout = RolloutConfig(**values)
    except ValidationError as e:
        raise ConfigError(f"rollout-serve: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}") from None
    serve(
        args.model, args.host, args.port, rollout, max_model_len=args.max_model_len, device=resolve_device(args.device)
    )
    return 0
