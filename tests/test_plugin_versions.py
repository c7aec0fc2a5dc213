"""Plugins survive kernel upgrades: the kernel's version and plugin API, each plugin's plugrl range checked at
load, hooks checked against this kernel's forms, and a plugin written for the previous API (an estimator that
reads ``AdvantageBatch.extras``) still trains with a warning that names the new form.

Installed plugins are simulated by a ``*.dist-info`` folder (METADATA with ``Requires-Dist``, entry_points.txt)
beside a module in a temporary directory on ``sys.path``: what ``importlib.metadata`` reads of a real install.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet

import plugrl
from plugrl import api
from plugrl.algorithms import AdvantageBatch
from plugrl.cli import main
from plugrl.config import build_config
from plugrl.plugins import PluginError, check_config, installed_plugins, load_plugins

ROOT = Path(__file__).resolve().parents[1]
KERNEL = f"plugrl {plugrl.__version__} (plugin API {plugrl.PLUGIN_API})"


# --- the kernel's version ------------------------------------------------------------------------------------------


def test_version_is_single_sourced_and_printed(capsys):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "plugrl.__version__"}
    assert plugrl.__version__ == "0.2.0" and plugrl.PLUGIN_API == 2 and isinstance(plugrl.PLUGIN_API, int)
    assert importlib.metadata.version("plugrl") == plugrl.__version__, "stale install: run `pip install -e .`"
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == "plugrl 0.2.0 (plugin API 2)"


def test_every_first_party_plugin_declares_a_range_that_admits_this_kernel():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        declared = api.required_range(deps)
        assert declared, f"{pyproject}: declare plugrl{api.suggested_range(plugrl.__version__)}"
        assert SpecifierSet(declared).contains(plugrl.__version__), f"{pyproject}: {declared}"
        assert SpecifierSet(declared) == SpecifierSet(api.suggested_range(plugrl.__version__)), pyproject


def test_the_installed_first_party_plugins_declare_their_range():
    """What the loader reads is the installed metadata: an editable install from before the range was added
    would only be warned about."""
    dists = {p.distribution for p in installed_plugins() if p.distribution.startswith("plugrl-")}
    assert dists
    for dist in dists:
        declared = api.required_range(importlib.metadata.distribution(dist).requires)
        assert declared and SpecifierSet(declared).contains(plugrl.__version__), (
            f"{dist}: {declared!r}: reinstall it (make setup)"
        )


@pytest.mark.parametrize(
    ("requires", "expected"),
    [
        (["plugrl>=0.2,<0.3", "openai>=1.0"], "<0.3,>=0.2"),
        (["plugrl"], ""),
        (["Plugrl (>=0.2)"], ">=0.2"),
        (["torch", 'plugrl>=0.1; extra == "dev"'], None),
        (None, None),
    ],
)
def test_required_range_reads_requires_dist(requires, expected):
    assert api.required_range(requires) == expected


def test_suggested_range():
    assert api.suggested_range("0.2.0") == ">=0.2,<0.3"
    assert api.suggested_range("0.10.3.dev1") == ">=0.10,<0.11"
    assert api.suggested_range("1.4.2.dev1") == ">=1.4,<1.5"  # as `plugrl new-plugin` writes it


def test_range_problems_say_which_side_to_move():
    who, fix = "plugin 'x' (dist y 1.0)", "upgrade the plugin (pip install -U y) to a release"
    assert api.range_problem(">=0.2,<0.3", "0.2.0", who=who, fix_plugin=fix) is None
    assert api.range_problem(">=0.2,<0.3", "0.2.5.dev0", who=who, fix_plugin=fix) is None  # a dev kernel counts
    too_new = api.range_problem(">=0.1,<0.2", "0.2.0", who=who, fix_plugin=fix)
    assert too_new == (
        "plugin 'x' (dist y 1.0) requires plugrl<0.2,>=0.1; this is plugrl 0.2.0 (plugin API 2): upgrade the "
        "plugin (pip install -U y) to a release made for plugrl 0.2.x, or install a plugrl it supports "
        "(pip install 'plugrl<0.2,>=0.1')"
    )
    too_old = api.range_problem(">=0.3,<0.4", "0.2.0", who=who, fix_plugin=fix)
    assert too_old.startswith("plugin 'x' (dist y 1.0) requires plugrl<0.4,>=0.3; this is plugrl 0.2.0")
    assert "upgrade plugrl (pip install 'plugrl<0.4,>=0.3')" in too_old
    assert "upgrade plugrl" in api.range_problem("~=0.3.1", "0.2.0", who=who, fix_plugin=fix)
    bad = api.range_problem("0.2", "0.2.0", who=who, fix_plugin=fix)
    assert "'0.2', which is not a version range: write one such as '>=0.2,<0.3'" in bad


# --- installed plugins: the distribution's range, checked before the plugin is imported ---------------------------


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on sys.path where :func:`install` puts fake installed distributions."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    modules: list[str] = []

    def install(entry: str, source: str, requires: list[str], *, dist: str | None = None, version: str = "1.0"):
        module = f"{entry}_mod"
        dist = dist or f"{entry.replace('_', '-')}-dist"
        (path / f"{module}.py").write_text(textwrap.dedent(source))
        info = path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        requires_dist = "".join(f"Requires-Dist: {r}\n" for r in requires)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n{requires_dist}")
        (info / "entry_points.txt").write_text(f"[plugrl]\n{entry} = {module}\n")
        modules.append(module)
        return dist

    install.path = path
    yield install
    for module in modules:
        sys.modules.pop(module, None)


REWARD = """
import plugrl

@plugrl.reward("vx_task")
def vx_exact(completion, ground_truth):
    return float(completion == ground_truth)
"""
EXPLODES = "raise RuntimeError('the kernel imported a plugin it should have refused')\n"


def test_a_plugin_made_for_another_kernel_is_refused_before_it_is_imported(site):
    dist = site("vx_old", EXPLODES, ["plugrl>=0.1,<0.2", "numpy"])
    with pytest.raises(PluginError) as info:
        load_plugins(["vx_old"])
    assert str(info.value) == (
        f"plugin 'vx_old' (dist {dist} 1.0) requires plugrl<0.2,>=0.1; this is {KERNEL}: upgrade the plugin "
        f"(pip install -U {dist}) to a release made for plugrl 0.2.x, or install a plugrl it supports "
        "(pip install 'plugrl<0.2,>=0.1')"
    )
    assert "vx_old_mod" not in sys.modules


def test_a_plugin_that_needs_a_newer_kernel_says_upgrade_plugrl(site):
    site("vx_new", EXPLODES, ["plugrl>=0.3,<0.4"])
    with pytest.raises(PluginError, match=r"requires plugrl<0.4,>=0.3; this is plugrl 0.2.0 \(plugin API 2\): "):
        load_plugins(["vx_new"])
    with pytest.raises(PluginError, match=re.escape("upgrade plugrl (pip install 'plugrl<0.4,>=0.3')")):
        load_plugins(["vx_new"])


def test_a_plugin_in_range_loads_silently(site, caplog):
    site("vx_ok", REWARD, ["plugrl>=0.2,<0.3"])
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        reg = load_plugins(["vx_ok"])
    assert [r.name for r in reg.rewards] == ["vx_exact"] and not caplog.records


def test_a_plugin_without_a_range_is_warned_about_once(site, caplog):
    dist = site("vx_bare", REWARD, ["plugrl"])
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        load_plugins(["vx_bare"])
        load_plugins(["vx_bare"])
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        f"plugin 'vx_bare' (dist {dist} 1.0) declares no plugrl version range: add \"plugrl>=0.2,<0.3\" to the "
        "dependencies in its pyproject.toml, so that a plugrl it was not made for refuses it at start with a clear "
        f"message (this is {KERNEL})"
    ]


def test_an_installed_plugin_may_declare_its_range_in_its_module(site, caplog):
    site("vx_mod_range", 'PLUGRL_REQUIRES = ">=0.1,<0.2"\n', [])
    with pytest.raises(PluginError, match=r"plugin 'vx_mod_range' \(dist vx-mod-range-dist 1.0\) requires plugrl"):
        load_plugins(["vx_mod_range"])


def test_an_entry_point_that_fails_to_import_names_the_plugin(site):
    site("vx_broken", "import plugrl\nimport not_a_real_dependency_vx\n", ["plugrl>=0.2,<0.3"])
    with pytest.raises(PluginError) as info:
        load_plugins(["vx_broken"])
    msg = str(info.value)
    assert msg.startswith("plugin 'vx_broken' (vx_broken_mod) failed to import: ModuleNotFoundError: ")
    assert "not_a_real_dependency_vx" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        (
            "from plugrl.algorithms import grpo_outcome_advantage\n",
            "; plugrl.algorithms.grpo_outcome_advantage moved in plugin API 2: import "
            "plugrl_advantages.estimators.grpo.grpo_outcome_advantage (package plugrl-advantages)",
        ),
        (
            "import plugrl.algorithms\nGAE = plugrl.algorithms.gae_advantages\n",
            "; plugrl.algorithms.gae_advantages moved in plugin API 2: import "
            "plugrl_advantages.estimators.gae.gae_advantages (package plugrl-advantages)",
        ),
        (
            "from plugrl.tools import scaffold\n",  # plugrl.tools became plugrl.commands
            f"; {KERNEL} has no plugrl.tools: the plugin may be written for another plugrl: install a release of it "
            "made for this one",
        ),
    ],
)
def test_a_plugin_importing_a_name_an_api_change_moved_is_told_where_it_went(site, source, shown):
    site("vx_moved", source, [])  # no range: an old plugin, as 0.1 plugins were
    with pytest.raises(PluginError) as info:
        load_plugins(["vx_moved"])
    assert str(info.value).startswith("plugin 'vx_moved' (vx_moved_mod) failed to import: ")
    assert str(info.value).endswith(shown)


def test_without_plugrl_compat_a_moved_name_gets_the_plain_hint(monkeypatch):
    # the table of moved names is plugrl-compat's (group plugrl.moved_names); the kernel alone cannot say where
    monkeypatch.setattr(api, "moved_names", lambda: {})
    with pytest.raises(ImportError) as e:
        exec("from plugrl.algorithms import gae_advantages", {})
    assert api.import_hint(e.value, "0.2.0") == (
        "; plugrl 0.2.0 (plugin API 2) has no plugrl.algorithms.gae_advantages: the plugin may be written for "
        "another plugrl: install a release of it made for this one"
    )


def test_a_moved_names_table_that_fails_to_load_is_warned_about_and_left_out(monkeypatch):
    class Broken:
        value = "vx_moves:MOVED"

        def load(self):
            raise ImportError("No module named 'vx_moves'")

    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group=None: [Broken(), *real(group=group)] if group == api.MOVES_GROUP else real(group=group),
    )
    api.moved_names.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"the moved names of vx_moves:MOVED \(group plugrl.moved_names\) failed"):
            moved = api.moved_names()
        assert moved[("plugrl.algorithms", "gae_advantages")][1].endswith("(package plugrl-advantages)")
    finally:
        api.moved_names.cache_clear()


# --- local plugins: PLUGRL_REQUIRES ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('">=0.1,<0.2"', "plugin 'vl_range:' requires plugrl<0.2,>=0.1; this is plugrl 0.2.0 (plugin API 2): get a "),
        ('"0.2"', "plugin 'vl_range:' declares the plugrl range '0.2', which is not a version range: write one such"),
        ("(0, 2)", "plugin 'vl_range:': PLUGRL_REQUIRES must be a version range as a string, such as '>=0.2,<0.3'"),
    ],
)
def test_a_local_plugin_declares_its_range_with_plugrl_requires(local_plugin, value, expected):
    mod = local_plugin("vl_range", f"PLUGRL_REQUIRES = {value}\n{REWARD}")
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    assert str(info.value).startswith(expected)


def test_a_local_plugin_in_range_or_without_one_loads(local_plugin, caplog):
    fits = local_plugin("vl_fits", f'PLUGRL_REQUIRES = ">=0.2,<0.3"\n{REWARD}')
    assert [r.name for r in load_plugins([f"{fits}:"]).rewards] == ["vx_exact"]
    sys.modules.pop(fits)
    plain = local_plugin("vl_plain", REWARD)
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        assert [r.name for r in load_plugins([f"{plain}:"]).rewards] == ["vx_exact"]
    assert not caplog.records  # a local module needs no range


# --- hooks against this kernel's forms ------------------------------------------------------------------------------


def test_an_unknown_hook_names_the_plugin_the_kernel_and_the_closest_hook(local_plugin):
    mod = local_plugin("vh_typo", "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_check_configs(config):\n    pass\n")
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    msg = str(info.value)
    assert msg.startswith(
        f"plugin '{mod}:': plugrl_check_configs is not a hook of {KERNEL}; did you mean "
        "plugrl_check_config(config, registry, training) -> list[str] | None? Rename the function to one of "
        "plugrl_rewards, "
    )
    assert "\n" not in msg


def test_a_hook_argument_the_kernel_does_not_pass_names_the_hook_form(local_plugin):
    mod = local_plugin(
        "vh_arg",
        "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_run_end(config, run_dir, exc):\n    pass\n",
    )
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    assert str(info.value) == (
        f"plugin '{mod}:': hook plugrl_run_end(config, run_dir, exc) takes exc, which {KERNEL} does not pass; the "
        "hook is plugrl_run_end(config, run_dir, error) -> None: take any of its arguments, by those names"
    )


def test_a_hook_taking_a_subset_or_defaults_is_fine(local_plugin):
    mod = local_plugin(
        "vh_fine",
        "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_run_end(error, verbose=False):\n    pass\n\n"
        "class Hooks:\n    @plugrl.hookimpl\n    def plugrl_step_metrics(self, step):\n        return None\n\n"
        "hooks = Hooks()\n",
    )
    load_plugins([f"{mod}:", f"{mod}:hooks"])


def test_plugins_help_lists_every_hook_form(capsys):
    with pytest.raises(SystemExit):
        main(["plugins", "--help"])
    out = capsys.readouterr().out
    assert f"the hooks of {KERNEL}" in out
    assert "  plugrl_run_end(config, run_dir, error) -> None" in out
    assert "  plugrl_rewards() -> list[RewardSpec]" in out


CONFIG = {"model": {"path": "m"}, "data": {"train_files": ["rows.jsonl"]}}


def test_a_decorated_function_the_kernel_cannot_call_is_refused_at_start(local_plugin):
    mod = local_plugin(
        "vh_arity",
        "import plugrl\n\n@plugrl.advantage_estimator('one_arg')\ndef one_arg(batch):\n    return None\n",
    )
    cfg = build_config({**CONFIG, "plugins": [f"{mod}:"], "algorithm": {"adv_estimator": "one_arg"}})
    with pytest.raises(PluginError) as info:
        check_config(cfg, load_plugins(cfg.plugins))
    assert str(info.value) == (
        f"plugin '{mod}:': estimator 'one_arg' is called as fn(batch, config), but its signature is one_arg(batch): "
        f"give it the arguments shown, as {KERNEL} calls it"
    )


def test_options_filled_parameters_are_not_refused_at_start(local_plugin):
    """A reward that takes a required option after (completion, ground_truth) is called with it: not an error."""
    mod = local_plugin(
        "vh_options",
        "import plugrl\nfrom pydantic import BaseModel\n\nclass O(BaseModel):\n    threshold: float = 0.5\n\n"
        "@plugrl.reward('vh', options=O)\ndef graded(completion, ground_truth, threshold):\n    return 0.0\n",
    )
    cfg = build_config({**CONFIG, "plugins": [f"{mod}:"]})
    check_config(cfg, load_plugins(cfg.plugins))


# --- a plugin written for plugin API 1: AdvantageBatch.extras ------------------------------------------------------

# an estimator as plugrl 0.1 documented it: batch.extras["responses"] / batch.extras.get("baseline_scores")
OLD_ESTIMATOR = """
import torch

import plugrl
from plugrl.algorithms import AdvantageResult, group_mean_std


def _lengths(batch):
    return torch.tensor([float(len(r)) for r in batch.extras["responses"]])


@plugrl.advantage_estimator("short_bonus_v1")
def short_bonus_v1(batch, config):
    scores = batch.scores - 0.01 * _lengths(batch)
    assert batch.extras.get("baseline_scores") is None and len(batch.extras["prompts"]) == len(scores)
    mean, _, _ = group_mean_std(scores, batch.group_ids)
    return AdvantageResult(advantages=(scores - mean)[:, None] * batch.response_mask)
"""

NEW_ESTIMATOR = """
import torch

import plugrl
from plugrl.algorithms import AdvantageResult, group_mean_std


@plugrl.advantage_estimator("short_bonus_v2")
def short_bonus_v2(batch, config):
    scores = batch.scores - 0.01 * torch.tensor([float(len(r)) for r in batch.responses])
    mean, _, _ = group_mean_std(scores, batch.group_ids)
    return AdvantageResult(advantages=(scores - mean)[:, None] * batch.response_mask)
"""


def _batch() -> AdvantageBatch:
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    return AdvantageBatch(
        token_level_rewards=rewards,
        response_mask=torch.ones(4, 3),
        group_ids=torch.tensor([0, 0, 1, 1]),
        prompts=["p0", "p0", "p1", "p1"],
        responses=["a", "bbbb", "cc", "ddddddd"],
    )


def test_an_estimator_reading_extras_is_warned_about_at_load_naming_the_new_form(local_plugin):
    mod = local_plugin("va_old_estimator", OLD_ESTIMATOR)
    with pytest.warns(plugrl.PluginAPIWarning) as caught:
        load_plugins([f"{mod}:"])
    messages = [str(w.message) for w in caught]
    assert messages == [
        f"plugin '{mod}:': advantage estimator 'short_bonus_v1' reads AdvantageBatch.extras, a form of plugin API 1 "
        f"that {KERNEL} still accepts and plugrl 0.3 removes: read the typed fields batch.prompts, batch.responses "
        'and batch.baseline_scores (batch.extras["responses"] is batch.responses) instead'
    ]
    assert issubclass(plugrl.PluginAPIWarning, DeprecationWarning)


def test_an_estimator_in_the_new_form_loads_without_a_warning(local_plugin):
    mod = local_plugin("va_new_estimator", NEW_ESTIMATOR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_plugins([f"{mod}:"])


def test_the_old_form_still_computes_what_the_new_one_does(local_plugin):
    old = local_plugin("va_old_run", OLD_ESTIMATOR)
    new = local_plugin("va_new_run", NEW_ESTIMATOR)
    with pytest.warns(plugrl.PluginAPIWarning):
        reg = load_plugins([f"{old}:", f"{new}:"])
    with pytest.warns(plugrl.PluginAPIWarning) as caught:
        got = reg.estimators["short_bonus_v1"].fn(_batch(), None)
    assert all("va_old_run._lengths reads AdvantageBatch.extras" in str(w.message) for w in caught[:1])
    assert caught[0].filename.endswith("va_old_run.py")  # the warning points at the plugin's line
    want = reg.estimators["short_bonus_v2"].fn(_batch(), None)
    torch.testing.assert_close(got.advantages, want.advantages)


def test_extras_holds_what_plugrl_0_1_put_there():
    batch = _batch()
    batch.baseline_scores = torch.tensor([0.5, 0.5, 1.0, 1.0])
    with pytest.warns(plugrl.PluginAPIWarning, match="test_plugin_versions.test_extras_holds_what_plugrl_0_1"):
        extras = batch.extras
    assert set(extras) == {"prompts", "responses", "baseline_scores"}
    assert extras["responses"] is batch.responses and extras["baseline_scores"] is batch.baseline_scores


def test_warnings_of_old_forms_are_shown_outside_main():
    """Python hides DeprecationWarning outside __main__; the person running training must see this one."""
    code = (
        "import warnings, plugrl\n"
        "from plugrl.algorithms import AdvantageBatch\n"
        "import torch\n"
        "AdvantageBatch(torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1)).extras\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "PluginAPIWarning: __main__.<module> reads AdvantageBatch.extras" in proc.stderr


@pytest.mark.slow
def test_a_plugin_written_for_api_1_trains(local_plugin, tiny_model, tmp_path):
    """Two training steps with the 0.1-form estimator: it runs (a warning, no TypeError inside a step)."""
    from plugrl.config import load_config
    from plugrl.trainer import train

    mod = local_plugin("va_old_train", OLD_ESTIMATOR)
    (tmp_path / "run.yaml").write_text(f"plugins: [countdown, '{mod}:']\nmodel: {{path: {tiny_model}}}\n")
    overrides = [
        "data.dataset=countdown",
        "data.template=countdown",
        "model.dtype=float32",
        "rollout.name=hf",
        "rollout.n=2",
        "data.train_batch_size=2",
        "data.max_response_length=8",
        "algorithm.adv_estimator=short_bonus_v1",
        "trainer.total_steps=2",
        "trainer.save_freq=0",
        "trainer.logger=[jsonl]",
        f"trainer.output_dir={tmp_path}",
        "trainer.experiment_name=old_form",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", plugrl.PluginAPIWarning)
        train(load_config(tmp_path / "run.yaml", overrides))
    assert len((tmp_path / "old_form" / "metrics.jsonl").read_text().splitlines()) == 2
    told = {str(w.message).split(" reads ")[0] for w in caught if issubclass(w.category, plugrl.PluginAPIWarning)}
    # at load, naming the plugin and the estimator; in each step, naming the function that reads it
    at_load = f"plugin '{mod}:': advantage estimator 'short_bonus_v1'"
    assert told == {at_load, f"{mod}._lengths", f"{mod}.short_bonus_v1"}


# --- bad input through the command line: one line, before any model loads -------------------------------------------


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plugrl: error: plugin "), err
    return err[0]


def _run_config(tmp_path: Path, plugin: str) -> str:
    path = tmp_path / "run.yaml"
    # the model does not exist: a plugin problem must be found before it would be looked for
    path.write_text(
        f"plugins: [countdown, advantages, '{plugin}']\nmodel: {{path: {tmp_path}/no_model}}\n"
        "data: {dataset: countdown}\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("entry", "source", "requires", "expected"),
    [
        ("vc_range", EXPLODES, ["plugrl>=0.1,<0.2"], "plugin 'vc_range' (dist vc-range-dist 1.0) requires plugrl<0.2"),
        ("vc_import", "import not_installed_vc\n", ["plugrl>=0.2,<0.3"], "plugin 'vc_import' (vc_import_mod) failed"),
        (
            "vc_hook",
            "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_rewards(config):\n    return []\n",
            ["plugrl>=0.2,<0.3"],
            "plugin 'vc_hook': hook plugrl_rewards(config) takes config, which plugrl 0.2.0 (plugin API 2) does not",
        ),
        (
            "vc_arity",
            "import plugrl\n\n@plugrl.template('vc')\ndef vc():\n    return ''\n",
            ["plugrl>=0.2,<0.3"],
            "plugin 'vc_arity': template 'vc' is called as fn(sample), but its signature is vc(): give it",
        ),
    ],
)
def test_bad_plugins_are_one_line_at_start(site, tmp_path, capsys, entry, source, requires, expected):
    site(entry, source, requires)
    line = _one_line_error(capsys, ["train", _run_config(tmp_path, entry)])
    assert line.startswith(f"plugrl: error: {expected}"), line


def test_a_plugin_that_registers_nothing_is_one_warning_line_at_start(site, tmp_path, capsys, caplog):
    site("vc_idle", "def reward(completion, ground_truth):\n    return 1.0\n", ["plugrl>=0.2,<0.3"])
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        assert main(["train", _run_config(tmp_path, "vc_idle")]) == 2  # then the missing model stops it
    warned = [r.getMessage() for r in caplog.records if r.name == "plugrl.plugins"]
    assert len(warned) == 1 and warned[0].startswith("plugin 'vc_idle' (vc-idle-dist (vc_idle_mod)) registers nothing")
    assert "Decorate its functions" in warned[0]
    assert "model.path" in capsys.readouterr().err  # it went on to the next check


def test_plugrl_plugins_lists_an_incompatible_plugin_as_an_error(site, capsys):
    site("vc_listed", EXPLODES, ["plugrl>=0.1,<0.2"])
    assert main(["plugins"]) == 1
    out = capsys.readouterr().out
    assert "vc_listed  (vc-listed-dist 1.0, vc_listed_mod)\n    ERROR: plugin 'vc_listed' (dist vc-listed-dist " in out
    assert "countdown  (plugrl-datasets-countdown " in out  # the others are still listed
