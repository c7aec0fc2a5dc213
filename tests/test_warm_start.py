"""tests/warm_start.py: a command forked from the warm process ends, prints and sees its environment as
`python -m plugrl.cli` does."""

from __future__ import annotations

import subprocess

import warm_start
from test_e2e import PLUGRL, ROOT


def _cold(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(PLUGRL + args, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_a_forked_command_exits_and_prints_as_a_new_interpreter(tmp_path):
    args = ["train", str(tmp_path / "missing.yaml")]
    warm, cold = warm_start.run(args, ROOT, 300), _cold(args)
    assert warm is not None and warm_start._started[0][0].poll() is None
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.returncode == 2 and "missing.yaml' does not exist" in warm.stderr


def test_a_changed_environment_starts_a_new_warm_process_whose_commands_see_it(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # argparse wraps --help at the width COLUMNS gives, else 80
    wide = warm_start.run(["train", "--help"], ROOT, 300)
    first = warm_start._started[0][0]
    monkeypatch.setenv("COLUMNS", "44")
    narrow = warm_start.run(["train", "--help"], ROOT, 300)
    assert warm_start._started[0][0] is not first and first.poll() is not None  # the first one was stopped
    assert narrow.stdout == _cold(["train", "--help"]).stdout != wide.stdout
