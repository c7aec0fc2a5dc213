"""A plugin whose module name is shadowed on ``sys.path``: the README's reward-plugin snippet, pip-installed in
editable mode (the real pip, offline, into a private prefix: the test venv is not touched) and trained from the
folder that holds its project folder ``my_rewards/``. ``plugrl`` puts the working directory first on ``sys.path``,
so ``import my_rewards`` finds the project folder (a namespace package) instead of the installed package; a
stray ``my_rewards.py`` there shadows it the same way. plugrl must name what it imported and what shadows it,
not say that the plugin "registers nothing ... decorate its functions"."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
PLUGIN = textwrap.dedent(
    """
    import plugrl

    @plugrl.reward("my_task")
    def exact(completion: str, ground_truth: str) -> float:
        return float(completion.strip().endswith(ground_truth))
    """
)
PYPROJECT = textwrap.dedent(
    """
    [build-system]
    requires = ["setuptools>=61"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "my-rewards"
    version = "0.1.0"
    dependencies = ["plugrl>=0.2,<0.3"]

    [project.entry-points.plugrl]
    my_rewards = "my_rewards"
    """
)
CONFIG = textwrap.dedent(
    """
    plugins: [my_rewards, advantages]
    model: {path: "local:SmolLM2-135M-Instruct"}
    data: {train_files: [rows.jsonl], prompt_key: question, answer_field: answer, data_source: my_task}
    trainer: {total_steps: 1, save_freq: 0, logger: [jsonl]}
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """``work/my_rewards/`` (pyproject.toml + my_rewards/__init__.py, the README's snippet), installed with
    ``pip install -e my_rewards`` from ``work`` into a private prefix; a ``sitecustomize`` on PYTHONPATH adds that
    prefix's site-packages (with its .pth files, which put the editable finder in place) to every process."""
    root = tmp_path_factory.mktemp("shadowing")
    work = root / "work"
    (work / "my_rewards" / "my_rewards").mkdir(parents=True)
    (work / "my_rewards" / "pyproject.toml").write_text(PYPROJECT)
    (work / "my_rewards" / "my_rewards" / "__init__.py").write_text(PLUGIN)
    prefix = root / "prefix"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
    offline = ["--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "--prefix", str(prefix)]
    proc = subprocess.run([*pip, *offline, "-e", "my_rewards"], cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    assert any(site.glob("__editable__*my_rewards*.pth")), sorted(p.name for p in site.iterdir())
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    return {"work": work, "hook": hook, "project": work / "my_rewards"}


def _plugrl(cwd: Path, hook: Path, *args: str) -> subprocess.CompletedProcess:
    """The ``plugrl`` console script (its sys.path starts at its bin folder; plugrl adds the working directory)."""
    env = {**os.environ, "PYTHONPATH": str(hook)}
    return subprocess.run(
        [str(VENV_BIN / "plugrl"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _train(cwd: Path, hook: Path) -> subprocess.CompletedProcess:
    (cwd / "run.yaml").write_text(CONFIG)
    (cwd / "rows.jsonl").write_text('{"question": "Say 4.", "answer": "4"}\n')
    return _plugrl(cwd, hook, "train", "run.yaml")


def test_the_project_folder_in_the_working_directory_is_named_as_what_shadows_the_plugin(installed):
    proc = _train(installed["work"], installed["hook"])
    err = proc.stderr
    assert proc.returncode == 2, err[-2000:]
    line = next(x for x in err.splitlines() if x.startswith("plugrl: error:"))
    project = installed["project"]
    assert f"plugin 'my_rewards': `import my_rewards` finds the folder {project}, which has no __init__.py" in line
    assert "(a namespace package" in line and "my-rewards 0.1.0 installed (editable, from" in line
    assert f"the working directory ({installed['work']}) comes first on sys.path and shadows it" in line
    assert "Run plugrl from another directory, or rename that folder" in line
    assert "registers nothing" not in err and "Decorate its functions" not in err and "Traceback" not in err


def test_a_stray_module_file_in_the_working_directory_is_named(installed, tmp_path):
    (tmp_path / "my_rewards.py").write_text("# an old copy\n" + PLUGIN)
    proc = _train(tmp_path, installed["hook"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("plugrl: error:"))
    stray = tmp_path / "my_rewards.py"
    assert f"`import my_rewards` finds {stray}, not the package my-rewards 0.1.0 installed (editable, from" in line
    assert f"{stray} in the working directory ({tmp_path}) comes first on sys.path" in line
    assert f"rename or remove {stray}" in line


@pytest.mark.slow
def test_from_another_directory_the_installed_plugin_loads(installed, tmp_path):
    proc = _plugrl(tmp_path, installed["hook"], "plugins")
    lines = proc.stdout.splitlines()
    at = lines.index("my_rewards  (my-rewards 0.1.0, my_rewards)")
    assert lines[at + 1].strip() == "rewards: exact -> my_task", proc.stdout
    assert "shadows" not in proc.stdout + proc.stderr
    shadowed = _plugrl(installed["work"], installed["hook"], "plugins")
    assert "shadows it" in shadowed.stdout + shadowed.stderr
