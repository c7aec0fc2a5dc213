"""``plugrl train --check`` under random input (issue 41, point 6): random overrides on a real run's start (a tiny
model, the countdown dataset plugin), as a plugrl config and as a verl command line. Whatever is typed, the check
ends in exit 0 or 2, never a traceback; a failed check names what to fix: a key (as typed, or plugrl's), a file,
a plugin, or the data's row."""

from __future__ import annotations

import re

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from plugrl import cli
from plugrl_compat.verl_keys import RULES
from test_property_inputs import OVERRIDES, PLAUSIBLE, fixed

# verl's spellings beside plugrl's: keys of the rules (a pattern's literal head), typed with plausible values
VERL_KEYS = [r.pattern.split("*")[0].rstrip(".") for r in RULES]
VERL_OVERRIDES = st.builds(
    lambda k, v: f"{k}={v}",
    st.sampled_from(VERL_KEYS),
    st.sampled_from(["1", "0", "-1", "true", "false", "null", "fsdp", "megatron", "2", "[a]", "{}", "x", "1e-6"]),
)
NAMED = re.compile(r"[A-Za-z_]\w*\.[\w.]+|override '|/|plugin|row|data_source|\.yaml|\.parquet|\.jsonl")


@pytest.fixture
def base(tiny_model, tmp_path) -> list[str]:
    run = tmp_path / "run"
    return [
        f"model.path={tiny_model}",
        "plugins=[countdown, advantages]",
        "data.dataset=countdown",
        "data.dataset_options={size: 8}",
        "data.train_batch_size=2",
        "data.max_response_length=8",
        "rollout.n=2",
        f"trainer.default_local_dir={run}",
    ]


def _check(argv: list[str], capsys) -> None:
    code = cli.main(["train", "--check", *argv])  # an exception escaping here is the failure hypothesis reports
    out = capsys.readouterr().out
    assert code in (0, 2), out
    verdict = out.strip().splitlines()[-1]
    if code == 0:
        event("check: ok")
        assert verdict.startswith("check: ok")
        return
    assert verdict.startswith("check: FAILED: "), verdict
    event(f"FAILED: {verdict[15:55]}")
    assert NAMED.search(verdict[15:]), f"the failure names nothing to fix: {verdict}"


@pytest.mark.slow
@fixed(40)
@given(overrides=st.lists(st.one_of(OVERRIDES, VERL_OVERRIDES, st.builds(lambda kv: f"{kv[0]}={kv[1]}", PLAUSIBLE)),
                          max_size=3))  # fmt: skip
@example(overrides=[])
@example(overrides=["actor_rollout_ref.rollout.n=three"])
@example(overrides=["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=nope"])
def test_random_overrides_on_a_plugrl_config_check_or_name_the_fix(base, overrides, capsys, monkeypatch, tmp_path):
    """A plugrl config file (plugrl's defaults) with the overrides after it."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text("\n".join(f"{k}: {v}" if "." not in k else "" for k, v in (o.split("=", 1) for o in base)))
    _check([str(config), *base, *overrides], capsys)


@pytest.mark.slow
@fixed(25)
@given(overrides=st.lists(VERL_OVERRIDES, max_size=4))
@example(overrides=["trainer.save_freq=-1", "actor_rollout_ref.actor.strategy=megatron"])
def test_random_verl_keys_on_a_verl_command_line_check_or_name_the_fix(base, overrides, capsys, monkeypatch, tmp_path):
    """Overrides only: verl's defaults under them (no plugins given, so the installed ones are chosen)."""
    monkeypatch.chdir(tmp_path)
    verl = [o for o in base if not o.startswith("plugins=")] + [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1"
    ]
    _check([*verl, *overrides], capsys)
