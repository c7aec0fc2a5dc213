"""On the CPU (not skipped without CUDA): every run of the GPU suite, as gpu_runs.py builds it, loads through
plugrl's config loader, holds the values the tests mean it to, and passes the plugin checks and data loading
the trainer does before it loads a model. A mistyped key fails here, not on the GPU box."""

from __future__ import annotations

import pytest
from gpu_runs import DATASET_SIZE, PROMPTS_PER_STEP, ROLLOUT_N, SCENARIOS, Scenario, dotted


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
@pytest.mark.parametrize("steps", [1, 2])
def test_gpu_run_config_loads_and_passes_the_trainers_checks(request, tmp_path, scenario: Scenario, steps: int):
    from plugrl.config import load_config
    from plugrl.data import load_samples
    from plugrl.plugins import check_algorithm, check_config, load_plugins
    from plugrl.rewards import check_routes

    model = tmp_path / "model"
    # the reward model's folder is checked by its plugin (a config.json must load): the tiny one stands in
    reward_model = request.getfixturevalue("tiny_rm") if scenario.needs_reward_model else None
    cfg = load_config(scenario.config, scenario.overrides(model, tmp_path, steps, reward_model))
    expect = {
        "model.path": str(model),
        "model.dtype": "auto",
        "trainer.device": "auto",
        "rollout.n": ROLLOUT_N,
        "data.train_batch_size": PROMPTS_PER_STEP,
        "data.dataset_options.size": DATASET_SIZE,
        "actor.entropy_coeff": 0.01,
        "trainer.total_steps": steps,
        "trainer.output_dir": str(tmp_path),
        "trainer.experiment_name": scenario.name,
        **scenario.expect,
    }
    for key, want in expect.items():
        assert dotted(cfg, key) == want, f"{scenario.name}: {key} = {dotted(cfg, key)!r}, want {want!r}"
    # nothing the overrides set landed as an unknown `algorithm` extra (that section accepts any key)
    assert not cfg.algorithm.model_extra, cfg.algorithm.model_extra
    # what the trainer checks first, before any model or process group
    registry = load_plugins(cfg.plugins)
    estimator = check_algorithm(cfg.algorithm, registry)
    assert estimator.needs_critic == (cfg.algorithm.adv_estimator == "gae")
    check_config(cfg, registry)
    samples, _ = load_samples(cfg.data, registry)
    assert len(samples) == DATASET_SIZE  # the dataset took data.dataset_options.size
    check_routes(registry, {s.data_source for s in samples})


def test_the_required_module_list_matches_pyproject():
    """conftest.REQUIRED_MODULES (what the GPU suite checks before it runs) is plugrl's dependency list."""
    import re

    tomllib = pytest.importorskip("tomllib")
    from gpu_runs import REQUIRED_MODULES, ROOT

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    assert names == set(REQUIRED_MODULES), names ^ set(REQUIRED_MODULES)
