"""bench/vs_trl.py's guard on CPUs without bf16 kernels (no training runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _vs_trl():
    sys.path.insert(0, str(BENCH))  # the script imports bench/_common.py
    spec = importlib.util.spec_from_file_location("bench_vs_trl", BENCH / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bf16_runs_are_refused_where_the_cpu_has_no_bf16_kernels(monkeypatch, capsys):
    """TRL's default bf16 run would take hours there: the script stops before any run and names --fp32-only.
    The CPU's answer is substituted (this machine has one)."""
    from plugrl import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    with pytest.raises(SystemExit) as stop:
        _vs_trl().main(["--steps", "2"])
    assert stop.value.code == 2
    assert "--fp32-only" in capsys.readouterr().err
