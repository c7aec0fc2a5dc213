"""Wheels as users get them: the kernel and every plugin built as wheels, installed (not editable) into a fresh
virtual environment, then run from a directory outside the repository: ``plugrl --version``, ``plugrl plugins
--check`` and two training steps on a tiny model.

Building and installing is offline (``--no-build-isolation``, ``--no-index``, ``--no-deps``). Installing torch,
transformers and the plugins' libraries again would take minutes and gigabytes, so the fresh environment sees the
test venv's third-party packages through a filtered view of its site-packages: every entry but plugrl's own
(``plugrl``, ``plugrl-*``, ``plugrl_*``) and the editable installs (``__editable__*``, ``*.egg-link``, a
dist-info whose ``direct_url.json`` says editable), which would otherwise put the checkout back on ``sys.path``.
The test proves that plugrl and every plugin come from the fresh environment's site-packages, not the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

import plugrl

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))
SKIP_COPY = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".pytest_cache", "tests")


def _run(cmd: list[str], *, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


def _sources(dest: Path) -> list[Path]:
    """The kernel's and every plugin's sources copied out of the checkout (a build writes build/ and *.egg-info
    beside its pyproject.toml: not into the checkout others work in)."""
    kernel = dest / "plugrl"
    kernel.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, kernel / name)
    shutil.copytree(ROOT / "core", kernel / "core", ignore=SKIP_COPY)
    plugins = [shutil.copytree(p, dest / p.name, ignore=SKIP_COPY) for p in PLUGINS]
    return [kernel, *plugins]


def _is_editable(entry: Path) -> bool:
    direct_url = entry / "direct_url.json"
    if entry.name.endswith(".dist-info") and direct_url.is_file():
        try:
            return bool(json.loads(direct_url.read_text()).get("dir_info", {}).get("editable"))
        except (OSError, ValueError):
            return False
    return False


def _third_party_view(view: Path) -> None:
    """Symlinks to the test venv's site-packages entries, less plugrl's own and every editable install."""
    site = Path(sysconfig.get_paths()["purelib"])
    view.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        ours = name == "plugrl" or name.startswith(("plugrl-", "plugrl_", "_plugrl", "__editable__"))
        if ours or name.endswith(".egg-link") or _is_editable(entry):
            continue
        (view / entry.name).symlink_to(entry)


def _fresh_venv(root: Path, view: Path) -> tuple[Path, Path]:
    """A virtual environment without pip whose site-packages also reads ``view`` (its .pth files included, as
    the test venv's own: site.addsitedir); returns (python, site-packages)."""
    _run([sys.executable, "-m", "venv", "--without-pip", root])
    python = root / "bin" / "python"
    site = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    ).resolve()
    (site / "zz_third_party_view.pth").write_text(f"import site; site.addsitedir({str(view)!r})\n")
    return python, site


PROVENANCE = """
import importlib.metadata as md, importlib.util, json, sys
import plugrl
out = {"plugrl": plugrl.__file__, "dist": str(md.distribution("plugrl").locate_file("")), "plugins": {}}
for ep in md.entry_points(group="plugrl"):
    out["plugins"][ep.name] = {
        "origin": importlib.util.find_spec(ep.module).origin,
        "dist": ep.dist.name, "version": ep.dist.version, "location": str(ep.dist.locate_file("")),
        "requires": [r for r in ep.dist.requires or [] if r.lower().startswith("plugrl")],
        "editable": bool(json.loads(ep.dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable")),
    }
out["sys_path"] = sys.path
print(json.dumps(out))
"""


def _entry_points(sources: list[Path]) -> dict[str, str]:
    """entry-point name -> distribution, from every plugin's pyproject.toml."""
    tomllib = pytest.importorskip("tomllib")
    found = {}
    for src in sources[1:]:
        project = tomllib.loads((src / "pyproject.toml").read_text())["project"]
        # packages on other groups only (plugrl-commands, plugrl-compat) or none (plugrl-testing) are no plugins
        found.update(dict.fromkeys(project.get("entry-points", {}).get("plugrl", {}), project["name"]))
    return found


def test_wheels_install_outside_the_checkout_and_train(tmp_path, tiny_model):
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = time.monotonic() - started - sum(phases.values())

    sources = _sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", wheels, *sources])
    built = sorted(wheels.glob("*.whl"))
    phase("build")
    assert len(built) == len(sources), [w.name for w in built]

    # the kernel's wheel carries the single-sourced version; every plugin's wheel its plugrl range
    kernel_wheel = wheels / f"plugrl-{plugrl.__version__}-py3-none-any.whl"
    assert kernel_wheel.is_file(), [w.name for w in built]
    with zipfile.ZipFile(kernel_wheel) as z:
        meta = z.read(f"plugrl-{plugrl.__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {plugrl.__version__}\n" in meta and "\nRequires-Dist: packaging>=22\n" in meta
    for wheel in built:
        if wheel != kernel_wheel:
            with zipfile.ZipFile(wheel) as z:
                meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            assert "\nRequires-Dist: plugrl<0.3,>=0.2\n" in meta, wheel.name

    view = tmp_path / "third_party"
    _third_party_view(view)
    python, site = _fresh_venv(tmp_path / "venv", view)
    _run([*pip, "--python", python, "install", "--no-deps", "--no-index", "-q", *built])
    phase("install")
    bin_dir = python.parent
    outside = tmp_path / "elsewhere"  # not the checkout, nor beneath it
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(python.parent.parent))

    # plugrl and every plugin are the installed wheels' files, in the fresh site-packages
    got = json.loads(_run([python, "-c", PROVENANCE], cwd=outside, env=env).stdout.strip().splitlines()[-1])
    assert not any(str(ROOT) in p for p in got["sys_path"]), got["sys_path"]
    assert Path(got["plugrl"]).resolve() == site / "plugrl" / "__init__.py"
    assert Path(got["dist"]).resolve() == site
    expected = _entry_points(sources)
    assert {name: p["dist"] for name, p in got["plugins"].items()} == expected
    for name, p in got["plugins"].items():
        assert Path(p["origin"]).resolve().is_relative_to(site), (name, p["origin"])
        assert Path(p["location"]).resolve() == site and not p["editable"], (name, p)
        assert "plugrl<0.3,>=0.2" in p["requires"], (name, p["requires"])
    phase("provenance")

    version = _run([bin_dir / "plugrl", "--version"], cwd=outside, env=env).stdout.strip()
    assert version == f"plugrl {plugrl.__version__} (plugin API {plugrl.PLUGIN_API})"

    check = _run([bin_dir / "plugrl", "plugins", "--check"], cwd=outside, env=env, timeout=300)
    headers = [line for line in check.stdout.splitlines() if line and not line.startswith(" ")]
    assert sorted(h.split()[0] for h in headers) == sorted(expected), check.stdout
    assert check.stdout.count("    check: ok") == len(expected), check.stdout
    assert "ERROR" not in check.stdout and "declares no plugrl version range" not in check.stderr, check.stderr
    phase("version+check")

    (outside / "run.yaml").write_text(
        f"""\
plugins: [countdown, advantages]
model: {{path: {tiny_model}, dtype: float32}}
data:
  dataset: countdown
  dataset_options: {{size: 64, seed: 0, min_numbers: 2, max_numbers: 2, max_number: 10, max_target: 20, ops: "+-"}}
  template: countdown
  train_batch_size: 2
  max_prompt_length: 256
  max_response_length: 16
rollout: {{name: hf, n: 2}}
actor: {{optim: {{lr: 1.0e-4}}}}
algorithm: {{adv_estimator: grpo}}
trainer: {{total_steps: 2, save_freq: 0, output_dir: runs, experiment_name: wheels, logger: [jsonl]}}
"""
    )
    _run([bin_dir / "plugrl", "train", "run.yaml"], cwd=outside, env=env)
    steps = [json.loads(line)["step"] for line in (outside / "runs/wheels/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    phase("train")
    print("wheels test:", ", ".join(f"{k} {v:.0f}s" for k, v in phases.items()), f"(total {sum(phases.values()):.0f}s)")
