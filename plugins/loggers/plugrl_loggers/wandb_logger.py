"""The ``wandb`` logger (``trainer.logger: [..., wandb]``): each step's metrics, a table of samples now and then,
the run summary; a resumed run continues the same wandb run (its id is kept in ``RUN_DIR/wandb_id``).

:meth:`WandbLogger.problem` is asked before any model loads: the package imports, and wandb has a login or is
offline (else ``wandb.init`` would stop the run after the models load, asking for one).
"""

from __future__ import annotations

import configparser
import netrc
import os
import secrets
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugrl.tracking import MAX_TABLE_ROWS, SAMPLE_FIELDS, as_float, dumps_json

WANDB_ID_FILE = "wandb_id"
WANDB_HOST = "https://api.wandb.ai"
WANDB_LOCAL_MODES = ("offline", "dryrun", "disabled")  # modes that need no login


class WandbLogger:
    """One run's wandb run (rank 0 only: the tracker makes it there)."""

    name = "wandb"

    @staticmethod
    def prepare() -> None:
        """Import wandb: an ImportError naming the pip command when it is not installed."""
        _import_wandb()

    @staticmethod
    def problem(environ: Mapping[str, str]) -> str | None:
        """Why this logger cannot run here, in one line naming the fix; None when it can."""
        try:
            _import_wandb()
        except ImportError as e:
            return str(e)
        return wandb_login_problem(environ)

    def __init__(
        self, run_dir: Path, cfg_trainer: Any, *, config_dict: dict[str, Any] | None, start_step: int, **_: Any
    ) -> None:
        self.run_dir = Path(run_dir)
        self.wandb = _import_wandb()
        self.run = self.wandb.init(
            project=getattr(cfg_trainer, "project_name", "plugrl"),
            name=getattr(cfg_trainer, "experiment_name", None),
            config=config_dict,
            dir=str(self.run_dir),
            resume="allow",
            id=self._wandb_id(),
            # wandb's run metadata records the command line, where overrides may carry secrets
            settings=self.wandb.Settings(x_disable_meta=True, save_code=False, disable_code=True),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A table of the step's samples (the tracker calls this every ``trainer.table_freq`` steps and at the last)."""
        self.run.log({"samples": self._wandb_table(step, rows)}, step=step)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        for k, v in (summary or {}).items():
            if k not in ("timing", "episode_failures") and v is not None:
                self.run.summary[f"summary/{k}"] = v
        self.run.finish()

    def _wandb_id(self) -> str:
        """The run's wandb id, kept in ``run_dir/wandb_id`` so a resumed run continues the same wandb run."""
        path = self.run_dir / WANDB_ID_FILE
        if path.exists():
            run_id = path.read_text(encoding="utf-8").strip()
            if run_id:
                return run_id
        run_id = secrets.token_hex(4)
        path.write_text(run_id + "\n", encoding="utf-8")
        return run_id

    def _wandb_table(self, step: int, rows: list[dict[str, Any]]) -> Any:
        columns = ["step", *SAMPLE_FIELDS, "details"]
        data = []
        for row in rows[:MAX_TABLE_ROWS]:
            cells: list[Any] = [step]
            for k in SAMPLE_FIELDS:
                v = row.get(k)
                if k == "reward":
                    cells.append(as_float(v) if v is not None else None)
                else:
                    cells.append(v if isinstance(v, str) or v is None else dumps_json(v))
            details = {k: v for k, v in row.items() if k not in SAMPLE_FIELDS}
            cells.append(dumps_json(details) if details else "")
            data.append(cells)
        return self.wandb.Table(columns=columns, data=data)


def wandb_login_problem(environ: Mapping[str, str]) -> str | None:
    """Why ``wandb.init`` would stop for want of a login here (see :func:`logger_problem`), or None."""
    settings = _wandb_settings(environ)
    mode = (environ.get("WANDB_MODE") or settings.get("mode", "")).strip().lower()
    if mode in WANDB_LOCAL_MODES:
        return None
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE") or settings.get("api_key"):
        return None
    base_url = environ.get("WANDB_BASE_URL") or settings.get("base_url") or WANDB_HOST
    host = urllib.parse.urlparse(base_url).hostname or base_url
    netrc_path = _netrc_path(environ)
    if _netrc_key(netrc_path, host):
        return None
    return (
        f"trainer.logger includes 'wandb', but wandb has no API key here and is not offline (WANDB_API_KEY is "
        f"unset and {netrc_path} has no entry for {host}, which `wandb login` writes): run `wandb login` or set "
        "WANDB_API_KEY; or set WANDB_MODE=offline to keep the run on disk (upload it later with `wandb sync`); or "
        "remove 'wandb' from trainer.logger"
    )


def _wandb_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``[default]`` section of wandb's settings files, the workspace's (``WANDB_DIR`` or the working
    directory, ``wandb/settings``) over the user's (``WANDB_CONFIG_DIR``, else ``~/.config/wandb``, ``settings``)."""
    config_dir = environ.get("WANDB_CONFIG_DIR") or os.path.join(_home(environ), ".config", "wandb")
    workspace = os.path.join(environ.get("WANDB_DIR") or os.getcwd(), "wandb", "settings")
    merged: dict[str, str] = {}
    for path in (os.path.join(config_dir, "settings"), workspace):
        parser = configparser.ConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue  # wandb reads what it can too; an unreadable file sets nothing
        if parser.has_section("default"):
            merged.update(parser["default"])
    return merged


def _home(environ: Mapping[str, str]) -> str:
    return environ.get("HOME") or os.path.expanduser("~")


def _netrc_path(environ: Mapping[str, str]) -> str:
    """The netrc file wandb reads and ``wandb login`` writes: ``NETRC``, else ``~/.netrc`` (``~/_netrc`` if only
    that exists)."""
    if environ.get("NETRC"):
        return os.path.expanduser(environ["NETRC"])
    home = _home(environ)
    unix, windows = os.path.join(home, ".netrc"), os.path.join(home, "_netrc")
    return windows if not os.path.exists(unix) and os.path.exists(windows) else unix


def _netrc_key(path: str, host: str) -> str | None:
    """The password (wandb's API key) of ``host`` in the netrc file at ``path``, or None."""
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return entry[2] if entry and entry[2] else None


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "trainer.logger includes 'wandb' but the wandb package is not installed; "
            "install it with `pip install wandb` or remove 'wandb' from trainer.logger"
        ) from None
    return wandb
