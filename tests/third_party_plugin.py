"""A tiny third-party plugrl plugin package, built and pip-installed into a private directory.

The package ``my-rewards`` declares the entry point ``my_rewards = "my_rewards"`` in group
``plugrl`` and registers one reward, ``exact``, for data_source ``my_task``. It is installed
with ``pip install --target`` (never into the venv itself); put the returned directory on
``PYTHONPATH`` of a subprocess (see :func:`env_with_site`) to make the plugin visible::

    site = build_third_party_plugin(tmp_path_factory.mktemp("third_party"))
    subprocess.run([sys.executable, "-m", "plugrl.cli", "plugins"], env=env_with_site(site))

Used by tests/test_plugins.py and by the end-to-end training test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLUGIN_NAME = "my_rewards"  # entry-point name, what a run config lists under `plugins:`
DISTRIBUTION = "my-rewards"
VERSION = "0.0.1"
DATA_SOURCE = "my_task"
REWARD_NAME = "exact"

PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{DISTRIBUTION}"
version = "{VERSION}"
description = "A third-party plugrl plugin used by the plugrl tests"
requires-python = ">=3.10"
dependencies = ["plugrl"]

[project.entry-points.plugrl]
{PLUGIN_NAME} = "{PLUGIN_NAME}"

[tool.setuptools]
packages = ["{PLUGIN_NAME}"]
"""

MODULE = f'''\
"""Third-party plugrl plugin: an exact-match reward for data_source `{DATA_SOURCE}`."""

import plugrl


@plugrl.reward("{DATA_SOURCE}")
def {REWARD_NAME}(completion, ground_truth):
    """1.0 when the completion, stripped, equals the ground truth, else 0.0."""
    return 1.0 if str(completion).strip() == str(ground_truth).strip() else 0.0
'''


def write_third_party_package(pkg_dir: Path) -> Path:
    """Write the package sources (pyproject.toml and the module) into ``pkg_dir``."""
    pkg_dir = Path(pkg_dir)
    (pkg_dir / PLUGIN_NAME).mkdir(parents=True, exist_ok=True)
    (pkg_dir / "pyproject.toml").write_text(PYPROJECT)
    (pkg_dir / PLUGIN_NAME / "__init__.py").write_text(MODULE)
    return pkg_dir


def build_third_party_plugin(tmp_dir: str | os.PathLike[str]) -> Path:
    """Build the package under ``tmp_dir`` and pip-install it into ``tmp_dir/site``; return that directory.

    Offline and without touching the venv: ``--no-deps --no-build-isolation --no-index --target``.
    Calling it again with the same ``tmp_dir`` reuses the installed copy.
    """
    tmp_dir = Path(tmp_dir)
    site = tmp_dir / "site"
    dist_info = f"{DISTRIBUTION.replace('-', '_')}-{VERSION}.dist-info"
    if (site / PLUGIN_NAME / "__init__.py").is_file() and (site / dist_info).is_dir():
        return site
    pkg = write_third_party_package(tmp_dir / "pkg")
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
        "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir",
        "--target", str(site), str(pkg),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"installing the test plugin failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}")
    return site


def env_with_site(site: str | os.PathLike[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: os.environ) with ``site`` first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    return env
