"""``trainer.logger`` is checked at start, before any model loads (issue 41): wandb without a login and not offline,
tensorboard or wandb not installed, each one line naming what is missing and the fix. wandb's own sources of a
login and of its mode are read as wandb reads them (the real ``wandb`` CLI writes the settings file here, the real
``wandb.init`` fails where the check says it would); WANDB_MODE=offline/disabled keep working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from plugrl.tracking import logger_problem
from plugrl_loggers.wandb_logger import wandb_login_problem

ROOT = Path(__file__).resolve().parents[1]
WANDB_VARS = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL", "NETRC", "RANK")


@pytest.fixture
def no_login(tmp_path, monkeypatch) -> Path:
    """No wandb key anywhere: a fresh HOME (no ~/.netrc), wandb's config and workspace folders in tmp_path."""
    for var in WANDB_VARS:
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb_data"))
    monkeypatch.chdir(tmp_path)
    return home


def test_wandb_without_a_login_is_one_line_naming_the_ways_out_and_wandb_itself_would_stop(no_login):
    problem = logger_problem(["console", "wandb"])
    assert problem is not None and "\n" not in problem
    assert problem.startswith("trainer.logger includes 'wandb', but wandb has no API key here and is not offline")
    assert f"{no_login / '.netrc'} has no entry for api.wandb.ai" in problem
    for fix in ("`wandb login`", "WANDB_API_KEY", "WANDB_MODE=offline", "remove 'wandb' from trainer.logger"):
        assert fix in problem
    assert logger_problem(["console", "jsonl"]) is None
    # the real wandb.init, in the same environment and without a terminal, stops for the same reason
    code = "import wandb\nwandb.init(project='p', settings=wandb.Settings(x_disable_meta=True))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert proc.returncode != 0 and "No API key configured" in proc.stderr, proc.stderr[-2000:]


def _netrc(path: Path, host: str) -> Path:
    path.write_text(f"machine {host}\n  login user\n  password {'k' * 40}\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    "way",
    ["WANDB_MODE=offline", "WANDB_MODE=disabled", "WANDB_MODE=dryrun", "WANDB_API_KEY", "~/.netrc", "NETRC",
     "WANDB_BASE_URL + its netrc entry", "wandb offline", "wandb disabled"],
)  # fmt: skip
def test_each_way_wandb_runs_without_a_prompt_passes(no_login, monkeypatch, way):
    if way.startswith("WANDB_MODE="):
        monkeypatch.setenv("WANDB_MODE", way.partition("=")[2])
    elif way == "WANDB_API_KEY":
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    elif way == "~/.netrc":
        _netrc(no_login / ".netrc", "api.wandb.ai")
    elif way == "NETRC":
        monkeypatch.setenv("NETRC", str(_netrc(no_login / "elsewhere", "api.wandb.ai")))
    elif way == "WANDB_BASE_URL + its netrc entry":
        _netrc(no_login / ".netrc", "wandb.example.com")
        monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    else:  # the real wandb command line writes the workspace's settings file (WANDB_DIR, else here: wandb/settings)
        wandb_cli = Path(sys.executable).parent / "wandb"
        proc = subprocess.run([str(wandb_cli), way.split()[1]], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert (Path(os.environ["WANDB_DIR"]) / "wandb" / "settings").is_file()
    assert logger_problem(["console", "wandb"]) is None


def test_a_netrc_entry_for_another_host_is_no_login(no_login, monkeypatch):
    _netrc(no_login / ".netrc", "wandb.example.com")
    assert "has no entry for api.wandb.ai" in wandb_login_problem(os.environ)
    monkeypatch.setenv("RANK", "1")  # only the process that logs (rank 0) checks
    assert logger_problem(["wandb"]) is None


def test_a_logger_package_that_is_not_installed_is_named(monkeypatch):
    """The packages are installed here: their absence is simulated by a None entry in sys.modules, which makes
    their import fail as it would without them."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    problem = logger_problem(["console", "tensorboard"])
    assert problem == (
        "trainer.logger includes 'tensorboard' but the tensorboard package is not installed; install it with "
        "`pip install tensorboard` or remove 'tensorboard' from trainer.logger"
    )
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert "`pip install wandb`" in logger_problem(["wandb"])


def test_plugrl_train_stops_at_start_before_any_model_loads(no_login, tmp_path, monkeypatch, capsys):
    """`trainer.logger=[console,wandb]` without a login: exit 2 with the one line, no traceback, and neither a
    plugin, the data nor a model touched (it crashed after vLLM had started)."""
    from plugrl import cli, startup, trainer
    from plugrl.plugins import PluginError

    touched = []

    def plugins_reached(*args, **kwargs):
        touched.append("plugins")
        raise PluginError("the test stops here")

    monkeypatch.setattr(startup, "_load_run_plugins", plugins_reached)
    monkeypatch.setattr(trainer, "PolicyModel", lambda *a, **k: touched.append("model"))
    args = ["train", str(ROOT / "examples/countdown_grpo.yaml"), "trainer.logger=[console,wandb]"]
    assert cli.main([*args, f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("plugrl: error:")]
    assert len(lines) == 1 and "trainer.logger includes 'wandb', but wandb has no API key" in lines[0], err
    assert "Traceback" not in err and touched == []
    monkeypatch.setenv("WANDB_MODE", "offline")  # the same command, offline: past the check (to the plugins)
    assert cli.main([*args, f"trainer.output_dir={tmp_path}"]) == 2 and touched == ["plugins"]
    assert "the test stops here" in capsys.readouterr().err


def test_a_logger_whose_package_is_not_installed_is_named_with_the_package(monkeypatch, tmp_path):
    """wandb and tensorboard are plugrl-loggers' (entry-point group plugrl.loggers): without it, trainer.logger
    naming one is refused at start, and by the tracker, naming the package."""
    import importlib.metadata

    from plugrl.tracking import Tracker, installed_loggers

    assert {"wandb", "tensorboard"} <= set(installed_loggers())
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda **kw: [] if kw.get("group") == "plugrl.loggers" else real(**kw)
    )
    problem = logger_problem(["console", "wandb"], {})
    assert problem == (
        "trainer.logger: unknown logger(s) ['wandb']; use console, jsonl; 'wandb' is in the package plugrl-loggers, "
        "which is not installed: pip install plugrl-loggers (in a plugrl checkout: pip install -e plugins/loggers)"
    )
    assert "unknown logger(s) ['mlflow']; use console, jsonl" in logger_problem(["mlflow"], {})
    with pytest.raises(ValueError, match="pip install plugrl-loggers"):
        Tracker(tmp_path / "run", SimpleNamespace(logger=["tensorboard"]), total_steps=1)
    assert not (tmp_path / "run").exists()
