"""`plugrl new-plugin`: every kind scaffolds a package that installs, passes its own tests (which check it with
`plugrl_testing`, and fail when it breaks a contract) and trains; docs/plugins.md carries the current hook
reference.

The packages are pip-installed into a private directory (never into the venv), as in
tests/third_party_plugin.py, and put on PYTHONPATH of the subprocesses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugrl_commands.scaffold import (
    BEGIN_MARK,
    END_MARK,
    ScaffoldError,
    extract_reference,
    hook_reference,
    plugin_files,
    plugrl_requirement,
    scaffold,
)
from third_party_plugin import env_with_site

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "plugins.md"
PLUGRL = [sys.executable, "-m", "plugrl.cli"]

REWARD = "my_task"  # a reward plugin, for data_source my_task
DATASET = "toy_data"  # a dataset whose rows have data_source my_task (--data-source)
TEMPLATE = "toy_prompt"
ADVANTAGE = "toy_adv"
ENVIRONMENT = "toy_guess"  # a multi-turn game: environment, dataset and reward, data_source toy_guess
NAMES = (REWARD, DATASET, TEMPLATE, ADVANTAGE, ENVIRONMENT)  # one package of each kind


# the checks of plugrl_testing that each kind's generated tests run (test function: check)
KIT_TESTS = {
    REWARD: {"test_the_kernel_scores_it": "check_reward", "test_the_plugin_keeps_the_contracts": "check_plugin"},
    DATASET: {"test_the_kernel_loads_it": "check_dataset"},
    TEMPLATE: {"test_the_kernel_renders_it": "check_template"},
    ADVANTAGE: {"test_the_kernel_can_use_it": "check_estimator"},
    ENVIRONMENT: {"test_the_kernel_plays_it": "check_environment", "test_rows_and_reward": "check_dataset"},
}


def pip_install(site: Path, *packages: Path) -> None:
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
        "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "--target", str(site),
        *map(str, packages),
    ]  # fmt: skip
    run(cmd)


def run(cmd: list[str], env=None, timeout=300, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> tuple[Path, Path]:
    """The five scaffolded packages (folder) and the directory they are pip-installed into."""
    base = tmp_path_factory.mktemp("scaffold")
    folder = base / "plugins"
    # the command itself for one of them, the function for the others
    proc = run([*PLUGRL, "new-plugin", REWARD, "--kind", "reward", "--dir", str(folder)])
    assert f"pip install -e {folder / REWARD}" in proc.stdout
    scaffold(DATASET, "dataset", folder, data_source=REWARD)
    scaffold(TEMPLATE, "template", folder)
    scaffold(ADVANTAGE, "advantage", folder)
    scaffold(ENVIRONMENT, "environment", folder)
    site = base / "site"
    pip_install(site, *(folder / name for name in NAMES))
    return folder, site


@pytest.mark.slow
def test_scaffolded_packages_install_and_pass_their_tests(plugins):
    folder, site = plugins
    for name in NAMES:
        assert (site / f"plugrl_{name}" / "__init__.py").is_file()
        dist_info = site / f"plugrl_{name}-0.1.0.dist-info"
        assert f"{name} = plugrl_{name}" in (dist_info / "entry_points.txt").read_text()
    tests = [str(folder / name / "tests") for name in NAMES]
    proc = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *tests], env=env_with_site(site))
    assert "FAILED" not in proc.stdout
    for name in NAMES:
        assert f"test_{name}.py::" in proc.stdout
        source = (folder / name / "tests" / f"test_{name}.py").read_text()
        for test, check in KIT_TESTS[name].items():  # the kit's checks ran, and passed as generated
            assert f"test_{name}.py::{test} PASSED" in proc.stdout
            assert f"{check}(" in source.split(f"def {test}(")[1].split("\ndef ")[0]
    # `plugrl plugins` lists them, with what they register
    listing = run([*PLUGRL, "plugins"], env=env_with_site(site)).stdout
    assert f"{REWARD}_reward -> {REWARD}" in listing and f"estimators: {ADVANTAGE}" in listing
    assert f"environments: {ENVIRONMENT}" in listing and f"{ENVIRONMENT}_reward -> {ENVIRONMENT}" in listing


@pytest.mark.slow
def test_scaffolded_tests_fail_on_a_broken_plugin(tmp_path):
    """The generated tests bite: a reward that returns a dict without `score` fails them with the kit's message."""
    made = scaffold("broken_task", "reward", tmp_path / "plugins")
    source = made.path / "plugrl_broken_task" / "__init__.py"
    text = source.read_text()
    source.write_text(text.replace("return 1.0 if got == want else 0.0", 'return {"value": float(got == want)}'))
    pip_install(tmp_path / "site", made.path)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(made.path / "tests")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_with_site(tmp_path / "site"), timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "FAILED" in proc.stdout and "test_the_kernel_scores_it" in proc.stdout
    assert "reward 'broken_task_reward' of plugin" in proc.stdout
    assert "returned a dict without 'score' (keys: value)" in proc.stdout


def test_scaffolded_sources_are_ruff_clean(plugins):
    folder, _ = plugins
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    run([ruff, "check", "--no-cache", str(folder)])
    run([ruff, "format", "--check", "--no-cache", str(folder)])


def _train(tmp_path: Path, site: Path, name: str, config: str) -> list[dict]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(config + f"trainer: {{total_steps: 1, output_dir: {tmp_path}, experiment_name: {name}}}\n")
    run([*PLUGRL, "train", str(path)], env=env_with_site(site), timeout=600, cwd=ROOT)
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_scaffolded_reward_trains(plugins, tiny_model, tmp_path):
    _, site = plugins
    data = tmp_path / "my_task.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"Say {i}."}], "data_source": REWARD, "ground_truth": str(i)}
        for i in range(4)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = _train(
        tmp_path,
        site,
        "reward_run",
        f"plugins: [{REWARD}, advantages]\n"
        f"model: {{path: {tiny_model}}}\n"
        f"data: {{train_files: [{data}], train_batch_size: 2, max_response_length: 8}}\n"
        "rollout: {name: hf, n: 2}\n",
    )
    assert [x["step"] for x in m] == [1]
    assert f"reward/{REWARD}_reward/mean" in m[0]


@pytest.mark.slow
def test_scaffolded_dataset_template_and_estimator_train(plugins, tiny_model, tmp_path):
    """One run through all four: the dataset's rows, the template's prompts, the reward, the estimator."""
    _, site = plugins
    m = _train(
        tmp_path,
        site,
        "all_kinds",
        f"plugins: [{DATASET}, {REWARD}, {TEMPLATE}, {ADVANTAGE}]\n"
        f"model: {{path: {tiny_model}}}\n"
        f"data: {{dataset: {DATASET}, dataset_options: {{size: 4}}, template: {TEMPLATE}, "
        "train_batch_size: 2, max_response_length: 8}\n"
        "rollout: {name: hf, n: 2}\n"
        f"algorithm: {{adv_estimator: {ADVANTAGE}}}\n",
    )
    assert [x["step"] for x in m] == [1]
    assert f"reward/{REWARD}_reward/mean" in m[0] and "adv/mean" in m[0]
    samples = [
        json.loads(x) for x in (tmp_path / "all_kinds" / "rollouts" / "step_000001.jsonl").read_text().split("\n") if x
    ]
    assert len(samples) == 4
    for s in samples:
        assert s["data_source"] == REWARD and "Answer with the number only." in s["prompt"]
        assert "<answer> </answer> tags" in s["prompt"]  # the template's instruction


@pytest.mark.slow
def test_scaffolded_environment_trains(plugins, tiny_model, tmp_path):
    """The generated example.yaml, shrunk to the tiny model and one step: multi-turn episodes of the game."""
    folder, site = plugins
    overrides = [
        f"model.path={tiny_model}",
        "rollout.name=hf",
        "rollout.n=2",
        "data.train_batch_size=2",
        "data.dataset_options.size=4",
        "data.max_response_length=48",  # room for two turns of 12 tokens and a hint between them
        "rollout.max_turn_tokens=12",
        "trainer.total_steps=1",
        f"trainer.output_dir={tmp_path}",
        "trainer.experiment_name=env_run",
    ]
    run([*PLUGRL, "train", str(folder / ENVIRONMENT / "example.yaml"), *overrides], env=env_with_site(site), cwd=ROOT)
    (m,) = [json.loads(line) for line in (tmp_path / "env_run" / "metrics.jsonl").read_text().splitlines()]
    assert m["step"] == 1 and m["env/turns_mean"] > 1.0 and m["env/errors"] == 0.0
    assert "env/info/guesses" in m and "timing/env" in m
    rows = [json.loads(x) for x in (tmp_path / "env_run" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert row["data_source"] == ENVIRONMENT and row["environment"].startswith(f"environment '{ENVIRONMENT}'")
        assert row["finish"] in ("done", "max_turns", "truncated") and row["env_info"]["guesses"] >= 1
        assert row["messages"][-1]["role"] in ("assistant", "user") and "whole number" in row["prompt"]
        assert row["segments"][0]["trained"]  # the policy's first turn, then what answered it (not trained on)
        if row["turns"] > 1:
            assert [s["trained"] for s in row["segments"]][:3] == [True, False, True]
            assert "Guess again." in row["segments"][1]["text"] or "not a number" in row["segments"][1]["text"]
        if row["env_reward"] is not None:  # the environment's reward wins over the reward plugin's
            assert row["reward"] == row["env_reward"] and row["details"] == {"environment": row["env_reward"]}


def test_names_are_validated_and_nothing_is_overwritten(tmp_path):
    for bad in ("My_Task", "my-task", "1task", "_task", "task_", "a__b", "", "x" * 33, "naïve"):
        with pytest.raises(ScaffoldError, match="invalid plugin name"):
            scaffold(bad, "reward", tmp_path)
    with pytest.raises(ScaffoldError, match="unknown plugin kind"):
        scaffold("ok", "critic", tmp_path)
    with pytest.raises(ScaffoldError, match="data_source"):
        scaffold("ok", "reward", tmp_path, data_source='a"b')
    with pytest.raises(ScaffoldError, match="applies to reward and dataset"):
        scaffold("ok", "template", tmp_path, data_source="x")
    assert list(tmp_path.iterdir()) == []
    made = scaffold("ok", "reward", tmp_path)
    before = {p: p.read_bytes() for p in made.path.rglob("*") if p.is_file()}
    (made.path / "plugrl_ok" / "__init__.py").write_text("# edited\n")
    with pytest.raises(ScaffoldError, match="already exists"):
        scaffold("ok", "dataset", tmp_path)
    assert (made.path / "plugrl_ok" / "__init__.py").read_text() == "# edited\n"
    assert len(before) == 4 and sorted(p.name for p in tmp_path.iterdir()) == ["ok"]  # no staging left over
    proc = subprocess.run(
        [*PLUGRL, "new-plugin", "Bad-Name", "--kind", "reward", "--dir", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "invalid plugin name 'Bad-Name'" in proc.stderr


def test_package_layout():
    files = plugin_files("my_task", "reward", data_source="openai/gsm8k")
    assert sorted(files) == ["README.md", "plugrl_my_task/__init__.py", "pyproject.toml", "tests/test_my_task.py"]
    toml = files["pyproject.toml"]
    assert 'name = "plugrl-my-task"' in toml and 'my_task = "plugrl_my_task"' in toml
    assert "[project.entry-points.plugrl]" in toml and f'dependencies = ["{plugrl_requirement()}"]' in toml
    assert "from plugrl_testing import check_plugin, check_reward" in files["tests/test_my_task.py"]
    assert '@plugrl.reward("openai/gsm8k")' in files["plugrl_my_task/__init__.py"]
    files = plugin_files("my_game", "environment")  # its episodes are plugrl-multiturn's to play
    assert f'dependencies = ["{plugrl_requirement()}", "plugrl-multiturn"]' in files["pyproject.toml"]
    assert sorted(files) == [
        "README.md",
        "example.yaml",
        "plugrl_my_game/__init__.py",
        "pyproject.toml",
        "tests/test_my_game.py",
    ]
    source = files["plugrl_my_game/__init__.py"]
    assert '@plugrl.environment("my_game", options=MyGameOptions)' in source and "class MyGameEnv(" in source
    assert '@plugrl.dataset("my_game")' in source and "@plugrl.reward(DATA_SOURCE)" in source
    assert "environment: my_game" in files["example.yaml"] and "max_turns: 4" in files["example.yaml"]
    with pytest.raises(ScaffoldError, match="applies to reward and dataset"):
        plugin_files("my_game", "environment", data_source="x")


def test_the_version_range_is_the_kernels_minor_version(monkeypatch):
    import plugrl

    monkeypatch.setattr(plugrl, "__version__", "0.2.0")
    assert plugrl_requirement() == "plugrl>=0.2,<0.3"
    monkeypatch.setattr(plugrl, "__version__", "1.4.2.dev1")
    assert plugrl_requirement() == "plugrl>=1.4,<1.5"


def test_docs_hold_the_current_hook_reference():
    doc = DOC.read_text(encoding="utf-8")
    assert BEGIN_MARK in doc and END_MARK in doc
    assert extract_reference(doc) == hook_reference(), (
        "docs/plugins.md is out of date with the hook specs; run "
        "`python -m plugrl_commands.scaffold --hook-reference --update docs/plugins.md`"
    )


def test_hook_reference_covers_every_hook_and_record():
    from plugrl import hookspecs, specs

    text = hook_reference()
    for name in dir(hookspecs):
        if name.startswith("plugrl_"):
            assert f"#### `{name}(" in text
    for cls in (
        specs.RewardSpec,
        specs.DatasetSpec,
        specs.TemplateSpec,
        specs.EstimatorSpec,
        specs.PolicyLossSpec,
    ):
        assert f"#### `plugrl.{cls.__name__}`" in text
    assert (
        "#### `@plugrl.reward(*data_sources: str, name: str | None = None, weight: float = 1.0, "
        "options: type[BaseModel] | None = None, casefold: bool = False, fields: Iterable[str] | None = None)`" in text
    )
    assert "#### `@plugrl.policy_loss(name: str, *, agg_mode: str | None = None)`" in text
    assert "'" not in text.split("#### `plugrl_rewards")[1].split("\n")[0]  # annotations unquoted
