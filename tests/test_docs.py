"""The docs never rot: every shell command in README.md and docs/**/*.md runs, for real, and every
relative link in them (and in the plugins' READMEs) resolves.

Convention for writers of docs:

- Commands are the lines of ```bash (or ```sh) fenced blocks. A line ending in ``\\`` continues on
  the next; ``#`` starts a comment. Show output in ```text blocks.
- Untagged ``` blocks are read too: a line there that starts with a command word (``plugrl``,
  ``python``, ``pip``, ``make``, ``torchrun``, ...) is a command like any other, so a command cannot
  escape the test by its fence.
- A block tagged ``<lang> file=PATH`` (```yaml file=my_task.yaml) is a file the reader is asked to
  write: the test writes it to PATH before running the commands that follow it.
- A command that cannot run here goes in ``SKIP`` below, with the reason.

Each document runs top to bottom in a scratch directory of its own (a copy of ``examples/`` and an empty
``plugins/``, nothing beside it), so its commands see each other's
outputs as a reader following the page does. To fit in a few minutes on 2 CPU cores the test shortens
what it runs, always by appending or replacing overrides, never by changing a command's shape:

- ``plugrl train``: the tiny random llama (``tiny_model``) on the HF engine in float32, 2 prompts x
  2 samples of 8 tokens, 8 rows of data, rule-based rewards inline, ``trainer.total_steps`` a tenth
  of the documented value (1 when the doc leaves it to the config);
- ``plugrl eval``: the HF engine and 2 prompts (and the tiny model when the target is a config);
- ``RUN/checkpoints/step_N`` is the run's newest checkpoint, since training was shortened;
- OpenAI-compatible servers (the TinyV verifier, the creativity classifier) are a stub in this
  process instead of SmolLM2 on vLLM: the URL is overridden, the plugins' real code runs;
- ``pip install -e DIR`` installs into a private ``--target`` directory put on the path of the
  later commands, never into the venv; ``WANDB_MODE`` is ``offline`` (no network here).

``plugrl`` commands run in this process through ``plugrl.cli.main``, the function behind the console
script (it saves ~10 s of imports per command on this machine); the others run in bash with the
venv's ``bin/`` first on ``PATH``. Each must exit 0, and the files it is documented to produce must
exist: a training run's ``metrics.jsonl`` with its last step and a checkpoint, ``plugrl report``'s
``report.png``/``report.html``, ``plugrl eval --out``'s JSON, ``plugrl new-plugin``'s package.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fixture_paths import GSM8K_FIXTURE

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK_DOCS = sorted([*DOCS, *(ROOT / "plugins").glob("*/README.md")])
VENV_BIN = Path(sys.executable).parent

COMMAND_WORDS = ("plugrl", "python", "python3", "pip", "make", "torchrun", "accelerate", "pytest", "wandb", ".")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FIRST_PARTY = "|".join(sorted(p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml")))

# (pattern matched against the whole command, reason it does not run here)
SKIP: list[tuple[str, str]] = [
    (
        r"^make\b",
        "`make setup` installs into .venv and `make test` / `make test-all` are this suite; `make train` is "
        "`plugrl train examples/countdown_grpo.yaml`, which runs here",
    ),
    (r"^(\.|source) \.venv/bin/activate$", "the test runs with .venv/bin first on PATH"),
    (r"^python3? -m venv\b", "a second venv would need the internet for its packages"),
    (r"^pip install torch\b", "downloads torch: no internet here (make setup installed the CPU build)"),
    (r"^pip install -e '\.\[", "downloads vLLM / wandb / tensorboard: no internet here (make setup installed them)"),
    (
        r"^torchrun\b",
        "several training processes (GPUs, or minutes on 2 shared cores); FSDP2 over gloo is "
        "tested by tests/test_fsdp.py",
    ),
    (
        r"^accelerate launch\b",
        "several training processes (8 GPUs, or several nodes); accelerate launch with 2 "
        "processes is tested by tests/test_fsdp.py",
    ),
    (
        r"^plugrl train algorithm\.adv_estimator=",
        "a verl script as written: verl's GSM8K parquet files in ~/data and a 3B model; tests/test_verl_scripts.py "
        "runs the same keys on a local model and data (--check, and a training step)",
    ),
    (
        r"^python3? -m vllm\.entrypoints\.openai\.api_server\b",
        "a vLLM server takes 1-2 min to start here: the "
        "test serves a stub OpenAI-compatible API instead; the real server is tested by "
        "tests/plugins/test_classifier_openai.py and tests/plugins/test_tinyv.py",
    ),
    (r"^python3? bench/", "benchmarks: tens of minutes each, run by hand (docs/performance.md)"),
    (r"^twine upload\b", "uploads to PyPI: an account and the network; `twine check` runs on the same files"),
    (
        r"^(pip install 'verifiers==0\.2\.0'|plugrl train vf_guess\.yaml)$",
        "verifiers' classic API needs verifiers 0.2.0, in an environment of its own (make setup installs 0.4): "
        "tests/test_envs_verifiers_v1.py installs it in a scratch environment and trains classic environments there",
    ),
    (
        rf"^pip install( -e plugins/({FIRST_PARTY})/?)+$",
        "plugins of this repository: make setup installed them "
        "into the venv, and a second copy would declare their entry points twice",
    ),
]

TRAIN = {
    "model.dtype": "float32",
    "rollout.name": "hf",
    "rollout.n": "2",
    "data.train_batch_size": "2",
    "data.max_response_length": "8",
    "data.max_samples": "8",
    "actor.ppo_mini_batch_size": "null",
    "reward.num_workers": "0",
    "reward.overlong_buffer.len": "4",
    "trainer.critic_warmup": "0",
}
EVAL = {"rollout.name": "hf", "data.max_samples": "2", "data.max_response_length": "8"}


def _per_config(stub_url: str) -> dict[str, dict[str, str]]:
    return {
        "tinyv_rrm.yaml": {
            "reward.options.tinyv.launch": "false",
            "reward.options.tinyv.base_url": stub_url,
            "reward.options.tinyv.request_timeout_s": "5",
            "reward.options.tinyv.retries": "0",
        },
        "creativity_grpo_weighted.yaml": {"algorithm.classifier_options.base_url": stub_url},
        # openai/gsm8k comes from the hub; no network here: its rows from the test fixture
        "gsm8k_grpo.yaml": {"data.dataset_options.path": str(GSM8K_FIXTURE)},
        "gsm8k_tools.yaml": {"data.dataset_options.path": str(GSM8K_FIXTURE)},
        "gsm8k_grpo_rm.yaml": {"data.dataset_options.path": str(GSM8K_FIXTURE)},
    }


# --------------------------------------------------------------------------- reading the docs


@dataclass
class Step:
    doc: Path
    line: int
    command: str | None = None  # a shell command, or
    file: str | None = None  # a file to write, with
    content: str = ""


def _fences(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number of the first content line, info string, lines) of every fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        yield i + 2, info, body
        i = j + 1


def _commands(first_line: int, body: list[str], every_line: bool) -> Iterator[tuple[int, str]]:
    buf, start = "", first_line
    for k, raw in enumerate(body):
        line = raw.rstrip()
        if not buf:
            start = first_line + k
        if line.endswith("\\"):
            buf += line[:-1].strip() + " "
            continue
        cmd = (buf + line.strip()).strip()
        buf = ""
        if not cmd or cmd.startswith("#"):
            continue
        if every_line or cmd.split()[0] in COMMAND_WORDS or ENV_ASSIGN.match(cmd.split()[0]):
            yield start, cmd


def doc_steps(doc: Path) -> list[Step]:
    steps = []
    for first, info, body in _fences(doc.read_text()):
        words = info.split()
        lang = words[0] if words else ""
        target = next((w[len("file=") :] for w in words[1:] if w.startswith("file=")), None)
        if target:
            steps.append(Step(doc, first, file=target, content="\n".join(body) + "\n"))
        elif lang in ("bash", "sh", "shell") or lang == "":
            steps += [Step(doc, n, command=c) for n, c in _commands(first, body, every_line=bool(lang))]
    return steps


def skip_reason(command: str) -> str | None:
    return next((reason for pattern, reason in SKIP if re.search(pattern, command)), None)


def _rel(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


RUNNABLE = [d for d in DOCS if any(s.command for s in doc_steps(d))]
# pages whose commands take 10 s or more on 2 cores (--durations): in `make test-slow` and CI, not `make test`
SLOW_DOCS = {
    "docs/environments.md",
    "docs/plugins.md",
    "docs/quickstart.md",
    "docs/examples/vlm_grpo.md",
    "docs/examples/rubric_grade.md",
}


# --------------------------------------------------------------------------- a stub OpenAI-compatible server


class StubOpenAI:
    """Answers chat completions as a perfect verifier / classifier would, without a model: a
    structured-output request gets ``{"groups": [0, ..., 0]}`` of the schema's length, any other
    request ``True``."""

    def __init__(self) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._send({"object": "list", "data": [{"id": "stub", "object": "model"}]})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
                n = ((schema.get("properties") or {}).get("groups") or {}).get("minItems")
                content = json.dumps({"groups": [0] * n}) if n else "True"
                self._send(
                    {
                        "id": "chatcmpl-stub",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "stub"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                )

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def stub_openai() -> Iterator[StubOpenAI]:
    stub = StubOpenAI()
    yield stub
    stub.httpd.shutdown()


# --------------------------------------------------------------------------- running a document


class Runner:
    def __init__(self, scratch: Path, tiny_model: Path, stub: StubOpenAI, monkeypatch, caplog, fixture=None) -> None:
        self.cwd = scratch
        self.caplog = caplog
        caplog.set_level(logging.INFO, logger="plugrl")
        self.tiny = tiny_model
        self.fixture = fixture  # pytest's getfixturevalue: models built only for a page that trains with them
        self.stub = stub
        self.mp = monkeypatch
        self.site = scratch.parent / "site"  # where `pip install -e` goes
        self.site.mkdir()
        self.env = dict(
            os.environ,
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONPATH=str(self.site),
            WANDB_MODE="offline",
            WANDB_SILENT="true",
            WANDB_CONFIG_DIR=str(scratch.parent / "wandb_config"),
            WANDB_CACHE_DIR=str(scratch.parent / "wandb_cache"),
            WANDB_DATA_DIR=str(scratch.parent / "wandb_data"),
        )
        monkeypatch.chdir(scratch)
        monkeypatch.syspath_prepend(str(self.site))
        for key in ("WANDB_MODE", "WANDB_SILENT", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            monkeypatch.setenv(key, self.env[key])

    # -- helpers
    def _model_for(self, config: str) -> Path:
        """The tiny VLM for a config that trains a vision-language model, else the tiny llama."""
        path = self.cwd / config
        text = path.read_text() if path.is_file() else ""
        return self.fixture("tiny_vlm") if "Idefics3" in text and self.fixture is not None else self.tiny

    def _built_models(self, config: str) -> dict[str, str]:
        """Overrides that point a config at models the tests build (the reward model of gsm8k_grpo_rm.yaml)."""
        if Path(config).name == "gsm8k_grpo_rm.yaml" and self.fixture is not None:
            rm = self.fixture("tiny_rm")
            return {"reward.options.reward_model.path": str(rm), "reward.options.reward_model.dtype": "float32"}
        return {}

    def _newest_checkpoint(self, token: str) -> str:
        m = re.match(r"^(.*checkpoints)/step_\d+/?$", token)
        if not m or (self.cwd / token).exists():
            return token
        found = sorted((self.cwd / m.group(1)).glob("step_*"))
        assert found, f"{token}: the run wrote no checkpoint"
        return f"{m.group(1)}/{found[-1].name}"

    @staticmethod
    def _merge(args: list[str], forced: dict[str, str]) -> list[str]:
        """The doc's own overrides (minus keys the test sets), then the test's."""
        kept = [a for a in args if not ("=" in a and not a.startswith("-") and a.split("=", 1)[0] in forced)]
        return kept + [f"{k}={v}" for k, v in forced.items()]

    # -- plugrl, in process
    def plugrl(self, argv: list[str], env: dict[str, str]) -> None:
        from plugrl.cli import main

        cmd, rest = argv[0], argv[1:]
        checks = []
        if cmd == "train":
            config, args = rest[0], rest[1:]
            steps = 1
            for a in args:
                if a.startswith(("trainer.total_steps=", "trainer.total_training_steps=")):
                    steps = max(1, int(a.split("=", 1)[1]) // 10)
            forced = {"model.path": str(self._model_for(config)), **TRAIN, "trainer.total_steps": str(steps)}
            forced |= _per_config(self.stub.base_url).get(Path(config).name, {}) | self._built_models(config)
            args = [a for a in args if not a.startswith("trainer.total_training_steps=")]
            rest = [config, *self._merge(args, forced)]
            checks.append(("train", config, rest[1:], steps, self._has_checkpoint(config, rest[1:])))
        elif cmd == "eval":
            target = self._newest_checkpoint(rest[0])
            # overrides go right after the target: `--data` takes every word after it
            i = next((k for k, a in enumerate(rest[1:], 1) if a.startswith("-")), len(rest))
            forced = dict(EVAL)
            if not Path(target).is_dir():
                forced = {"model.path": str(self._model_for(target)), "model.dtype": "float32", **forced}
                forced |= _per_config(self.stub.base_url).get(Path(target).name, {})
            else:  # a checkpoint evaluates with its run's config: the same overrides as the config's runs
                for name, extra in _per_config(self.stub.base_url).items():
                    if Path(name).stem in Path(target).parts:
                        forced |= extra
            rest = [target, *self._merge(rest[1:i], forced), *rest[i:]]
            if "--out" in rest:
                checks.append(("file", rest[rest.index("--out") + 1]))
        elif cmd == "report":
            dirs = [a for a in rest if not a.startswith("-")]
            out = rest[rest.index("--out") + 1] if "--out" in rest else dirs[0]
            checks += [("file", f"{out}/report.png"), ("file", f"{out}/report.html")]
        elif cmd == "new-plugin":
            folder = rest[rest.index("--dir") + 1] if "--dir" in rest else "plugins"
            valued = {i + 1 for i, a in enumerate(rest) if a in ("--kind", "--dir", "--data-source")}
            name = next(a for i, a in enumerate(rest) if not a.startswith("-") and i not in valued)
            checks.append(("file", f"{folder}/{name}/pyproject.toml"))
        self.caplog.clear()
        with self.mp.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            importlib.invalidate_caches()
            try:
                rc = main([cmd, *rest])
            except SystemExit as e:  # argparse's --version and --help exit, as the console script does
                rc = e.code or 0
        assert rc == 0, f"plugrl {shlex.join([cmd, *rest])} exited {rc}"
        for check in checks:
            if check[0] == "file":
                assert (self.cwd / check[1]).is_file(), f"plugrl {cmd}: {check[1]} was not written"
            else:
                self._check_run(*check[1:])

    def _run_dir(self, config: str, overrides: list[str]):
        from plugrl.config import load_config

        cfg = load_config(config, overrides)
        return cfg, self.cwd / cfg.trainer.output_dir / cfg.trainer.experiment_name

    def _has_checkpoint(self, config: str, overrides: list[str]) -> bool:
        cfg, run_dir = self._run_dir(config, overrides)
        return cfg.trainer.resume == "auto" and bool(list(run_dir.glob("checkpoints/step_*")))

    def _check_run(self, config: str, overrides: list[str], steps: int, resumes: bool) -> None:
        cfg, run_dir = self._run_dir(config, overrides)
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["step"] == steps, f"{run_dir}: last logged step is not {steps}"
        assert (run_dir / "config.yaml").is_file() and list((run_dir / "rollouts").glob("step_*.jsonl"))
        held = [*(run_dir / "checkpoints").glob("step_*/policy/config.json")]
        held += (run_dir / "checkpoints").glob("step_*/policy_adapter/adapter_config.json")  # a LoRA run's
        assert held, f"{run_dir}: no checkpoint"
        if resumes:  # the same command again continues the run
            assert "resumed from" in self.caplog.text, f"{run_dir}: the run did not resume from its checkpoint"
        if "tensorboard" in cfg.trainer.logger:
            assert list((run_dir / "tensorboard").glob("events.out.tfevents.*")), f"{run_dir}: no TensorBoard events"
        if "wandb" in cfg.trainer.logger:
            assert list(run_dir.glob("wandb/offline-run-*/*.wandb")), f"{run_dir}: no offline wandb run"

    # -- anything else, in bash
    def shell(self, command: str, env: dict[str, str]) -> None:
        words = shlex.split(command, comments=True)
        if words[:3] == ["pip", "install", "-e"]:  # into the private site, never the venv
            command = shlex.join(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--no-build-isolation",
                    "--no-index",
                    "--target",
                    str(self.site),
                    *words[3:],
                ]
            )
        proc = subprocess.run(
            ["bash", "-c", command], cwd=self.cwd, env={**self.env, **env}, capture_output=True, text=True, timeout=600
        )
        out = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{out}"

    def run(self, step: Step) -> None:
        if step.file is not None:
            path = self.cwd / step.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(step.content)
            return
        words = shlex.split(step.command, comments=True)
        env = {}
        while words and ENV_ASSIGN.match(words[0]):
            k, v = words.pop(0).split("=", 1)
            env[k] = v
        if words and words[0] == "plugrl":
            self.plugrl(words[1:], env)
        else:
            self.shell(shlex.join(words), env)


def _scratch(base: Path) -> Path:
    """A repository-shaped working directory: examples/ copied, plugins/ empty, nothing beside it."""
    work = base / "main"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    (work / "plugins").mkdir()
    return work


@pytest.fixture
def unimport():
    """Unimports, after the test, the modules a page's steps imported from ``folder`` (its ``my_agents.py``): a later
    test of this process that writes a module of that name must import its own."""
    folders: list[Path] = []
    yield folders.append
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and any(Path(file).resolve().is_relative_to(f.resolve()) for f in folders):
            del sys.modules[name]


@pytest.mark.parametrize(
    "doc", [pytest.param(d, marks=[pytest.mark.slow] if _rel(d) in SLOW_DOCS else []) for d in RUNNABLE], ids=_rel
)
def test_documented_commands_run(doc, tiny_model, stub_openai, tmp_path, monkeypatch, caplog, request, unimport):
    unimport(tmp_path)
    runner = Runner(_scratch(tmp_path), tiny_model, stub_openai, monkeypatch, caplog, request.getfixturevalue)
    skipped, ran = [], 0
    for step in doc_steps(doc):
        if step.command is not None and (reason := skip_reason(step.command)):
            skipped.append(f"{_rel(doc)}:{step.line}: {step.command!r}: {reason}")
            continue
        t0 = time.monotonic()
        try:
            runner.run(step)
        except AssertionError as e:
            raise AssertionError(f"{_rel(doc)}:{step.line}: {step.command or step.file}\n{e}") from None
        if step.command is not None:
            ran += 1
            print(f"{_rel(doc)}:{step.line}: {time.monotonic() - t0:5.1f}s  {step.command}")
    print("\n".join(["skipped:", *skipped]) if skipped else "skipped: none")
    if not ran:
        pytest.skip("every command of this page is in the skip table:\n" + "\n".join(skipped))


def test_every_doc_with_a_command_is_run():
    """The convention is followed: commands sit in bash blocks or are recognised, and none is
    written in a way the runner cannot read."""
    for doc in DOCS:
        for step in doc_steps(doc):
            if step.command is not None:
                words = shlex.split(step.command, comments=True)
                assert words, f"{_rel(doc)}:{step.line}: {step.command!r} is empty after comments"
    assert ROOT / "README.md" in RUNNABLE and ROOT / "docs" / "quickstart.md" in RUNNABLE


def test_skip_table_matches_real_commands():
    """Every skip reason is used by some command in the docs, so the table cannot go stale."""
    commands = [s.command for d in DOCS for s in doc_steps(d) if s.command]
    unused = [p for p, _ in SKIP if not any(re.search(p, c) for c in commands)]
    assert not unused, f"skip patterns matching no documented command (remove them): {unused}"


# --------------------------------------------------------------------------- links

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _links(doc: Path) -> Iterator[tuple[int, str]]:
    in_fence = False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield n, m.group(1) or m.group(2)


@pytest.mark.parametrize("doc", LINK_DOCS, ids=_rel)
def test_relative_links_resolve(doc):
    broken = []
    for n, target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s), mailto: not checked offline; anchors within the page
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(f"{_rel(doc)}:{n}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)
