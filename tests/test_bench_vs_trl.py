"""bench/vs_trl.py's guard on CPUs without bf16 kernels (no training runs)."""

from __future__ import annotations

import pytest

from bench_scripts import load


def test_bf16_runs_are_refused_where_the_cpu_has_no_bf16_kernels(monkeypatch, capsys):
    """TRL's default bf16 run would take hours there: the script stops before any run and names --fp32-only.
    The CPU's answer is substituted (this machine has one)."""
    from plugrl import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    with pytest.raises(SystemExit) as stop:
        load("vs_trl").main(["--steps", "2"])
    assert stop.value.code == 2
    assert "--fp32-only" in capsys.readouterr().err


def test_without_trl_the_script_names_the_install_command(monkeypatch, capsys):
    """Without TRL the script stops before any set-up with the pip command, not the worker's traceback. Whether
    TRL is importable is substituted (it is not installed here unless the bench extra is)."""
    import importlib.util

    from plugrl import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(SystemExit) as stop:
        load("vs_trl").main(["--steps", "2"])
    assert stop.value.code == 2
    assert "pip install -e '.[bench]'" in capsys.readouterr().err
