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
