"""Command line: `plugrl train CONFIG [key=value ...]` (or `--trl-config FILE`, or verl's overrides alone),
`plugrl plugins`, `plugrl prepare-model`, and the commands installed packages add (entry-point group
`plugrl.commands`: plugrl-commands' `eval`, `report`, `new-plugin`, `export`)."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from plugrl.plugin_errors import own_packages

if TYPE_CHECKING:
    from plugrl.readers import ConfigReader, TrainArguments


class _Parser(argparse.ArgumentParser):
    """argparse's errors on one line, as plugrl's own: ``plugrl: error: ...`` (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"plugrl: error: {message} (see `{self.prog} --help`)\n")


def one_line(text: str) -> str:
    """A message on one line: ``invalid config in X:\n  a\n  b`` becomes ``invalid config in X: a; b``."""
    head, *rest = text.splitlines() or [""]
    rest = [line.strip() for line in rest if line.strip()]
    return f"{head} {'; '.join(rest)}" if rest else head


def _train(args: argparse.Namespace) -> int:
    from plugrl.checkpoint import CheckpointError
    from plugrl.rewards import RewardError
    from plugrl.trainer import TrainingError, train

    if args.check:  # plugrl-commands' report (group plugrl.train_check: the parsed arguments -> the exit code)
        from plugrl.config import ConfigError
        from plugrl.plugin_errors import implementation, package_hint

        missing = "`plugrl train --check` is in the package plugrl-commands, which is not installed"
        return implementation(CHECK_GROUP, ConfigError(f"{missing}: {package_hint('plugrl-commands')}"))(args)
    cfg = _train_config(args)
    try:
        summary = train(cfg)
    except (RewardError, CheckpointError) as e:  # a failed upload (plugrl-hub) is a PluginError: main() says it
        print(f"plugrl: error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"plugrl: training stopped: {e}", file=sys.stderr)
        return 3
    first, last = summary.get("reward_first_mean"), summary.get("reward_last_mean")
    if first is not None and last is not None:
        window = summary.get("reward_window", 10)
        verdict = "went up" if last > first else "did NOT go up"
        print(
            f"mean reward: first {window} steps {first:.4f}, last {window} steps {last:.4f}: "
            f"{verdict} ({last - first:+.4f})"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun worker: end it so it cannot abort at exit
        from plugrl.dist import exit_worker

        exit_worker(0)
    return 0


def train_arguments(args: argparse.Namespace) -> TrainArguments:
    """``plugrl train``'s arguments: CONFIG (argparse gives it the first override when there is none), the
    overrides, and the files of the reader flags (``--trl-config``)."""
    from plugrl.config import ConfigError
    from plugrl.readers import READER_FLAGS, TrainArguments

    overrides = [args.config, *args.overrides] if args.config and "=" in args.config else list(args.overrides)
    config = args.config if args.config and "=" not in args.config else None
    flags = {flag: getattr(args, _dest(flag)) for flag in READER_FLAGS if getattr(args, _dest(flag), None)}
    for flag, path in flags.items():
        if config:
            raise ConfigError(f"train takes a CONFIG or {flag} FILE, not both (got {config!r} and {path!r})")
    return TrainArguments(config, tuple(overrides), flags)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def reader_of(train_args: TrainArguments) -> ConfigReader | None:
    """The installed config reader that claims the arguments, or None for a plugrl YAML; a :class:`ConfigError`
    naming the package to install for arguments only a reader that is not installed reads."""
    from plugrl.config import ConfigError
    from plugrl.readers import READER_FLAGS, claiming_reader, install_hint, missing_packages

    reader = claiming_reader(train_args)
    if reader is not None or train_args.config:
        return reader
    unread = [(flag, p) for flag in train_args.flags for p in missing_packages([READER_FLAGS[flag]])]
    if unread:
        flag, package = unread[0]
        raise ConfigError(f"{flag} is read by the package {package}, which is not installed: {install_hint(package)}")
    verl = "".join(
        f"; a command line of overrides only is a verl script, read by the package {p}, which is not installed: "
        f"{install_hint(p)}"
        for p in missing_packages(["verl"])
    )
    raise ConfigError(
        "train needs a CONFIG (a plugrl YAML), --trl-config FILE (a TRL GRPOConfig YAML), or key=value overrides "
        f"(a verl script's, on verl's defaults){verl}"
    )


def _train_config(args: argparse.Namespace):
    """The run's config from ``plugrl train``'s arguments: what an installed config reader claims (a TRL file,
    overrides only on verl's defaults), else a plugrl YAML and its overrides."""
    from plugrl.config import load_config

    train_args = train_arguments(args)
    reader = reader_of(train_args)
    return reader.load(train_args) if reader else load_config(train_args.config, list(train_args.overrides))


# commands of extension packages (entry-point group plugrl.commands); those of plugrl's own, by package
COMMANDS_GROUP = "plugrl.commands"
CHECK_GROUP = "plugrl.train_check"  # the report of `plugrl train --check`: plugrl-commands' plugrl_commands.check
KNOWN_COMMANDS = own_packages("command")


def _add_commands(sub: argparse._SubParsersAction) -> None:
    """Every installed command (``register(commands)`` of each entry point in group ``plugrl.commands``), and for a
    command of plugrl's own packages that is not installed, one that says which package to install."""
    import importlib.metadata

    found = set()
    for ep in sorted(importlib.metadata.entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except Exception as e:  # a broken command package must not take `plugrl train` down with it
            logging.getLogger("plugrl.cli").warning("command %r (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        found.add(ep.name)
    for name, package in KNOWN_COMMANDS.items():
        if name not in found:
            p = sub.add_parser(name, help=f"not installed: pip install {package}", add_help=False)
            p.add_argument("args", nargs=argparse.REMAINDER)
            p.set_defaults(fn=functools.partial(_not_installed, name, package))


def _not_installed(name: str, package: str, args: argparse.Namespace) -> int:
    from plugrl.plugin_errors import package_hint

    missing = f"`plugrl {name}` is in the package {package}, which is not installed"
    print(f"plugrl: error: {missing}: {package_hint(package)}", file=sys.stderr)
    return 2


def _import_from_cwd() -> None:
    """Local plugins (``plugins: ["my_rewards:"]``) import from the working directory, as with ``python -m
    plugrl.cli``: the ``plugrl`` script's own ``sys.path`` starts at its bin directory instead. The
    absolute path, so tool and reward worker processes, which get this ``sys.path``, find them too."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _version() -> str:
    """``plugrl 0.2.0 (plugin API 2)``: the kernel's version and the plugin contract's number."""
    import plugrl
    from plugrl.api import kernel

    return kernel(plugrl.__version__)


VERBOSE_HELP = "show vLLM's start-up report and every warning it repeats (rollout.engine_log_level=info)"


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="plugrl", description=__doc__)
    parser.add_argument("--version", action="version", version=_version(), help="the version and plugin API, then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train from a YAML config (or a TRL GRPOConfig YAML with --trl-config)")
    t.add_argument("config", nargs="?", help="the plugrl YAML config")
    t.add_argument(
        "--trl-config",
        metavar="FILE",
        default=None,
        help="train from a TRL GRPOConfig YAML instead (docs/coming_from_trl.md); overrides may then be TRL keys "
        "(learning_rate=1e-6) or plugrl keys (actor.optim.lr=1e-6)",
    )
    t.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides, e.g. rollout.n=8 trainer.total_steps=20; with no CONFIG, a verl script's keys on "
        "verl's defaults (docs/coming_from_verl.md)",
    )
    t.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    t.add_argument(
        "--check",
        action="store_true",
        help="resolve the config, plugins and data as training would, load no model, print what became of every "
        "key set, and exit 0 (it would train) or 2",
    )
    t.set_defaults(fn=_train)
    _add_commands(sub)
    args = parser.parse_args(argv)
    if getattr(args, "verbose", False):  # an override like any other, after the user's own
        args.overrides = [*args.overrides, "rollout.engine_log_level=info"]
    _import_from_cwd()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("vllm", "transformers", "httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from plugrl.config import ConfigError, RedactSecrets, redact_text

    for handler in logging.getLogger().handlers:  # a key in a URL or a header never reaches the log
        handler.addFilter(RedactSecrets())
    from plugrl.data import DataError
    from plugrl.plugins import PluginError
    from plugrl.signals import StopNow

    try:
        return args.fn(args)
    except (ConfigError, DataError, PluginError) as e:
        print(f"plugrl: error: {one_line(redact_text(str(e)))}", file=sys.stderr)
        return 2
    except StopNow as e:  # a second SIGTERM / SIGINT: the run's own cleanup is done, skip finalizing the heap
        from plugrl.dist import exit_now

        exit_now(int(e.code))


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    sys.exit(main())
