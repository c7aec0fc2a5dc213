"""Plugin discovery and loading: entry points, `module:object`, hook styles, clashes, routing, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

import plugrl
from plugrl.plugin_errors import first_party
from plugrl.plugins import PluginError, build_registry, installed_plugins, load_plugins
from plugrl.rewards.routing import rewards_for
from plugrl.specs import DatasetSpec, EstimatorSpec, RewardSpec, TemplateSpec
from plugrl_commands.plugins_list import describe
from third_party_plugin import (
    DATA_SOURCE,
    DISTRIBUTION,
    PLUGIN_NAME,
    REWARD_NAME,
    VERSION,
    build_third_party_plugin,
    env_with_site,
)

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable  # the venv's interpreter


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "plugrl.cli", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


def cli_blocks(stdout: str) -> dict[str, list[str]]:
    """`plugrl plugins` output as {plugin header line: [indented lines]}."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line and not line.startswith(" "):
            current = line.strip()
            blocks[current] = []
        elif line.strip() and current is not None:
            blocks[current].append(line.strip())
    return blocks


def spec_names(specs) -> list[str]:
    return sorted(s.name for s in specs)


# --- installed first-party plugins -----------------------------------------------------------------------------


def test_load_installed_plugins():
    import plugrl_advantages
    import plugrl_countdown

    reg = load_plugins(["countdown", "advantages", "countdown"])  # a repeated name is loaded once
    assert set(reg.datasets) >= {"countdown"}
    assert set(reg.templates) >= {"countdown", "countdown_r1"}
    assert set(reg.estimators) >= {"grpo"}
    assert reg.datasets["countdown"].fn is plugrl_countdown.countdown_dataset
    assert reg.templates["countdown"].fn is plugrl_countdown.countdown_template
    assert reg.estimators["grpo"].fn is plugrl_advantages.grpo
    for spec in [*reg.datasets.values(), *reg.templates.values(), *reg.rewards]:
        assert spec.plugin == "countdown"
    assert reg.estimators["grpo"].plugin == "advantages"

    routed = rewards_for(reg, "countdown")
    assert [r.name for r in routed] == ["countdown_reward"]
    assert routed[0].fn is plugrl_countdown.countdown_reward
    assert routed[0].plugin == "countdown"

    assert reg.plugins == {
        "countdown": "plugrl-datasets-countdown (plugrl_countdown)",
        "advantages": "plugrl-advantages (plugrl_advantages)",
    }


def test_installed_plugins_lists_entry_points_without_importing():
    found = {p.name: p for p in installed_plugins()}
    assert found["countdown"].distribution == "plugrl-datasets-countdown"
    assert found["countdown"].value == "plugrl_countdown"
    assert found["advantages"].distribution == "plugrl-advantages"
    assert found["advantages"].value == "plugrl_advantages"
    assert PLUGIN_NAME not in found  # the third-party test package is never installed into the venv


def test_first_party_plugin_not_installed_names_its_package():
    FIRST_PARTY = first_party()
    assert FIRST_PARTY["gsm8k"] == ("plugrl-rewards-gsm8k", "plugins/rewards_gsm8k")
    # derived from plugins/*/pyproject.toml: every plugin folder of the repository, none forgotten (the kernel's
    # extension packages, such as plugins/commands, declare other groups: they are no plugins a run names)
    folders = {folder for _, folder in FIRST_PARTY.values()}
    pyprojects = Path(__file__).parents[1].glob("plugins/*/pyproject.toml")
    group = "[project.entry-points.plugrl]"
    assert folders == {f"plugins/{p.parent.name}" for p in pyprojects if group in p.read_text()}
    assert "plugins/commands" not in folders
    installed = {p.name for p in installed_plugins()}
    missing = [n for n in ("gsm8k", *FIRST_PARTY) if n not in installed]
    if not missing:
        pytest.skip("every first-party plugin is installed here")
    name = missing[0]
    dist, folder = FIRST_PARTY[name]
    with pytest.raises(PluginError) as info:
        load_plugins([name])
    msg = str(info.value)
    assert f"plugin {name!r} is not installed" in msg
    assert f"pip install {dist}" in msg
    assert f"pip install -e {folder}" in msg
    assert "Installed plugins:" in msg and "countdown" in msg and "advantages" in msg


def test_unknown_plugin_explains_the_entry_point():
    with pytest.raises(PluginError) as info:
        load_plugins(["no_such_plugin_xyz"])
    msg = str(info.value)
    assert "'no_such_plugin_xyz' is not installed" in msg
    assert "[project.entry-points.plugrl]" in msg
    assert 'no_such_plugin_xyz = "your_module"' in msg
    assert "module:object" in msg
    assert "Installed plugins:" in msg and "countdown" in msg and "advantages" in msg


def test_same_module_under_two_names_is_an_error():
    with pytest.raises(PluginError, match="plugrl_countdown:"):
        load_plugins(["countdown", "plugrl_countdown:"])


# --- module:object plugins -------------------------------------------------------------------------------------

DECORATED = """
    import plugrl

    @plugrl.reward("lp_task")
    def lp_exact(completion, ground_truth):
        return float(completion.strip() == ground_truth)

    @plugrl.dataset("lp_data")
    def lp_rows(split, size=2):
        return [{"prompt": f"q{i}", "data_source": "lp_task", "ground_truth": str(i)} for i in range(size)]

    @plugrl.template("lp_tmpl")
    def lp_template(sample):
        return "Q: " + sample.prompt

    @plugrl.advantage_estimator("lp_adv")
    def lp_estimator(batch, config):
        return None

    def not_registered():
        return 0
"""


def test_module_with_decorated_functions(local_plugin):
    mod = local_plugin("lp_decorated", DECORATED)
    name = f"{mod}:"  # an empty attribute names the module itself
    reg = load_plugins([name])
    assert spec_names(reg.rewards) == ["lp_exact"]
    assert list(reg.datasets) == ["lp_data"]
    assert list(reg.templates) == ["lp_tmpl"]
    assert list(reg.estimators) == ["lp_adv"]
    for spec in [*reg.rewards, *reg.datasets.values(), *reg.templates.values(), *reg.estimators.values()]:
        assert spec.plugin == name
    assert reg.plugins == {name: name}
    routed = rewards_for(reg, "lp_task")
    assert [r.name for r in routed] == ["lp_exact"]
    assert routed[0].fn("7 ", "7") == 1.0
    assert reg.datasets["lp_data"].fn("train", size=3)[2]["ground_truth"] == "2"


def test_module_object_names_one_decorated_function(local_plugin):
    mod = local_plugin("lp_single", DECORATED)
    reg = load_plugins([f"{mod}:lp_exact"])
    assert spec_names(reg.rewards) == ["lp_exact"]
    assert reg.rewards[0].plugin == f"{mod}:lp_exact"
    assert not reg.datasets and not reg.templates and not reg.estimators


def test_hookimpl_style_plugin(local_plugin):
    mod = local_plugin(
        "lp_hooks",
        """
        import plugrl
        from plugrl import DatasetSpec, RewardSpec


        def score(completion, ground_truth):
            return 1.0


        @plugrl.hookimpl
        def plugrl_rewards():
            return [RewardSpec(name="always_one", fn=score, data_sources=("hook_task", "hook_*"), weight=0.5)]


        @plugrl.hookimpl
        def plugrl_datasets():
            return [DatasetSpec(name="hook_data", fn=lambda split: [])]
        """,
    )
    reg = load_plugins([f"{mod}:"])
    (spec,) = reg.rewards
    assert (spec.name, spec.data_sources, spec.weight, spec.plugin) == (
        "always_one",
        ("hook_task", "hook_*"),
        0.5,
        f"{mod}:",
    )
    assert reg.datasets["hook_data"].plugin == f"{mod}:"
    assert rewards_for(reg, "hook_other") == [spec]


def test_class_based_plugin_instance(local_plugin):
    mod = local_plugin(
        "lp_class",
        """
        import plugrl
        from plugrl import EstimatorSpec, TemplateSpec


        class Plugin:
            def __init__(self, suffix):
                self.suffix = suffix

            @plugrl.hookimpl
            def plugrl_advantage_estimators(self):
                return [EstimatorSpec(name="cls_" + self.suffix, fn=lambda batch, config: None, needs_critic=True)]

            @plugrl.hookimpl
            def plugrl_templates(self):
                return [TemplateSpec(name="cls_tmpl", fn=lambda sample: sample.prompt)]


        PLUGIN = Plugin("adv")
        """,
    )
    name = f"{mod}:PLUGIN"
    reg = load_plugins([name])
    assert list(reg.estimators) == ["cls_adv"]
    assert reg.estimators["cls_adv"].needs_critic is True
    assert reg.estimators["cls_adv"].plugin == name
    assert reg.templates["cls_tmpl"].plugin == name
    assert reg.plugins == {name: name}


def test_misspelled_hook_name(local_plugin):
    mod = local_plugin(
        "lp_typo",
        """
        import plugrl

        @plugrl.hookimpl
        def plugrl_reward():
            return []
        """,
    )
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    assert "plugrl_reward" in str(info.value)
    assert "plugrl plugins" in str(info.value)  # where to look up the hooks


def test_hookimpl_with_wrong_signature(local_plugin):
    mod = local_plugin(
        "lp_signature",
        """
        import plugrl

        @plugrl.hookimpl
        def plugrl_rewards(config):
            return []
        """,
    )
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    assert f"{mod}:" in str(info.value) and "config" in str(info.value)


@pytest.mark.parametrize(
    ("body", "got"),
    [
        ("return [DatasetSpec(name='d', fn=len)]", "DatasetSpec"),
        ("return [{'name': 'r', 'data_sources': ['x']}]", "dict"),
        ("return RewardSpec(name='r', fn=len, data_sources=('x',))", "RewardSpec"),  # not a list
        ("return 'countdown'", "str"),
        ("return 3", "int"),
    ],
)
def test_hook_returning_the_wrong_record_type(local_plugin, body, got):
    mod = local_plugin(
        f"lp_wrong_{zlib.crc32(body.encode())}",
        f"""
        import plugrl
        from plugrl import DatasetSpec, RewardSpec

        @plugrl.hookimpl
        def plugrl_rewards():
            {body}
        """,
    )
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    msg = str(info.value)
    assert f"plugin '{mod}:'" in msg and "plugrl_rewards" in msg and "RewardSpec" in msg and f"got {got}" in msg


def test_hook_that_raises(local_plugin):
    mod = local_plugin(
        "lp_raises",
        """
        import plugrl

        @plugrl.hookimpl
        def plugrl_datasets():
            raise KeyError("no such file")
        """,
    )
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    assert f"'{mod}:'" in str(info.value) and "KeyError" in str(info.value) and "no such file" in str(info.value)


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("import not_a_real_dependency_xyz\n", "not_a_real_dependency_xyz"),
        ("import plugrl\nraise RuntimeError('needs an API key at import')\n", "needs an API key at import"),
        ("def broken(:\n    pass\n", "SyntaxError"),
    ],
)
def test_import_error_inside_the_plugin(local_plugin, source, shown):
    mod = local_plugin(f"lp_broken_{zlib.crc32(source.encode())}", source)
    with pytest.raises(PluginError) as info:
        load_plugins([f"{mod}:"])
    assert f"plugin '{mod}:'" in str(info.value)
    assert shown in str(info.value)


def test_missing_module_or_attribute(local_plugin):
    with pytest.raises(PluginError, match="cannot import module 'lp_does_not_exist'"):
        load_plugins(["lp_does_not_exist:thing"])
    mod = local_plugin("lp_attr", DECORATED)
    with pytest.raises(PluginError, match=f"module '{mod}' has no attribute 'nope'"):
        load_plugins([f"{mod}:nope"])


# --- clashes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decorator", "name"),
    [("reward('shared_task')", "shared_task"), ("advantage_estimator('rloo')", "rloo")],
)
def test_two_local_plugins_claim_one_name(local_plugin, decorator, name):
    mods = [
        local_plugin(f"lp_clash_{name}_{i}", f"import plugrl\n\n@plugrl.{decorator}\ndef f{i}(c, g):\n    return 0.0\n")
        for i in range(2)
    ]
    with pytest.raises(PluginError) as info:
        load_plugins([f"{m}:" for m in mods])
    msg = str(info.value)
    assert f"'{name}'" in msg and all(f"'{m}:'" in msg for m in mods)


@pytest.mark.parametrize(
    ("decorator", "kind"),
    [
        ("advantage_estimator('grpo')", "advantage estimator"),
        ("dataset('countdown')", "dataset"),
        ("template('countdown')", "template"),
    ],
)
def test_name_registered_by_two_plugins(local_plugin, decorator, kind):
    mod = local_plugin(
        f"lp_dup_{kind.split()[-1]}",
        f"import plugrl\n\n@plugrl.{decorator}\ndef mine(*args, **kwargs):\n    return None\n",
    )
    installed = "advantages" if kind == "advantage estimator" else "countdown"
    with pytest.raises(PluginError) as info:
        load_plugins([installed, f"{mod}:"])
    msg = str(info.value)
    assert msg.startswith(kind) and f"'{installed}'" in msg and f"'{mod}:'" in msg


def test_one_plugin_with_two_rewards_for_one_data_source(local_plugin):
    mod = local_plugin(
        "lp_two_rewards",
        """
        import plugrl

        @plugrl.reward("openai/gsm8k", weight=0.1)
        def format_reward(completion, ground_truth):
            return float("####" in completion)

        @plugrl.reward("openai/gsm8k")
        def accuracy_reward(completion, ground_truth):
            return float(completion.rsplit("####", 1)[-1].strip() == ground_truth)
        """,
    )
    reg = load_plugins([f"{mod}:"])
    routed = rewards_for(reg, "openai/gsm8k")
    assert sorted((r.name, r.weight) for r in routed) == [("accuracy_reward", 1.0), ("format_reward", 0.1)]
    assert {r.plugin for r in routed} == {f"{mod}:"}


def test_one_plugin_registering_one_reward_twice(local_plugin):
    mod = local_plugin(
        "lp_twice",
        """
        import plugrl
        from plugrl import RewardSpec

        @plugrl.hookimpl
        def plugrl_rewards():
            spec = RewardSpec(name="r", fn=len, data_sources=("t",))
            return [spec, spec]
        """,
    )
    with pytest.raises(PluginError, match="registers reward 'r' twice"):
        load_plugins([f"{mod}:"])


# --- routing ---------------------------------------------------------------------------------------------------


def reward_spec(plugin: str, name: str, *patterns: str) -> RewardSpec:
    return RewardSpec(name=name, fn=lambda c, g: 0.0, data_sources=patterns, plugin=plugin)


def test_exact_name_beats_glob():
    exact = reward_spec("gsm8k", "gsm8k_accuracy", "openai/gsm8k")
    fallback = reward_spec("grade", "judge", "*")
    reg = build_registry([fallback, exact], {"gsm8k": "x", "grade": "y"})
    assert rewards_for(reg, "openai/gsm8k") == [exact]
    assert rewards_for(reg, "anything/else") == [fallback]


def test_glob_routing():
    tinyv = reward_spec("tinyv", "tinyv_verify", "*_tinyv")
    reg = build_registry([tinyv], {"tinyv": "x"})
    assert rewards_for(reg, "math_tinyv") == [tinyv]
    assert rewards_for(reg, "tinyv_math") == []
    assert rewards_for(reg, "math_TINYV") == []  # case-sensitive


def test_globs_of_two_plugins_matching_one_name():
    """The most specific glob decides (the most literal characters); equally specific globs of two plugins
    are an error naming both."""
    tinyv = reward_spec("tinyv", "tinyv_verify", "*_tinyv")
    math = reward_spec("math", "math_verify", "math_*")
    mat = reward_spec("mat", "mat_verify", "math_t*")
    reg = build_registry([tinyv, math], {"tinyv": "x", "math": "y"})
    assert rewards_for(reg, "math_tinyv") == [tinyv]  # 6 literal characters against 5
    assert rewards_for(reg, "gsm_tinyv") == [tinyv]  # only one plugin matches: fine
    assert rewards_for(reg, "math_lighteval") == [math]
    reg = build_registry([tinyv, mat], {"tinyv": "x", "mat": "y"})
    with pytest.raises(PluginError) as info:
        rewards_for(reg, "math_tinyv")
    msg = str(info.value)
    assert "'math_tinyv'" in msg and "mat, tinyv" in msg


def test_equally_specific_globs_of_one_plugin_combine():
    a = reward_spec("p", "fmt", "*_tinyv")
    b = reward_spec("p", "acc", "math_t*")
    c = reward_spec("p", "any", "*")
    reg = build_registry([a, b, c], {"p": "x"})
    assert rewards_for(reg, "math_tinyv") == [a, b]  # the catch-all of the same plugin is less specific


def test_same_glob_in_two_plugins_fails_at_load():
    with pytest.raises(PluginError, match="claimed by two plugins: 'a' and 'b'"):
        build_registry([reward_spec("a", "x", "*"), reward_spec("b", "y", "*")], {})


def test_no_reward_for_a_data_source():
    reg = load_plugins(["countdown"])
    assert rewards_for(reg, "openai/gsm8k") == []
    assert rewards_for(build_registry([], {}), "countdown") == []


def test_glob_clash_between_loaded_local_plugins(local_plugin):
    a = local_plugin("lp_glob_a", "import plugrl\n\n@plugrl.reward('*_tinyv')\ndef a(c, g):\n    return 0.0\n")
    b = local_plugin("lp_glob_b", "import plugrl\n\n@plugrl.reward('math_t*')\ndef b(c, g):\n    return 0.0\n")
    reg = load_plugins([f"{a}:", f"{b}:"])  # loading is fine: the patterns differ
    with pytest.raises(PluginError) as info:
        rewards_for(reg, "math_tinyv")
    assert f"{a}:" in str(info.value) and f"{b}:" in str(info.value)


# --- describe and the CLI --------------------------------------------------------------------------------------


def test_describe():
    out = describe(load_plugins(["countdown", "advantages"]))
    assert out["countdown"]["rewards"] == ["countdown_reward -> countdown"]
    assert out["countdown"]["datasets"] == ["countdown"]
    assert sorted(out["countdown"]["templates"]) == ["countdown", "countdown_r1"]
    assert list(out["advantages"]) == ["estimators", "policy losses"] and "grpo" in out["advantages"]["estimators"]
    assert sorted(out["advantages"]["policy losses"]) == ["cispo", "gspo", "luspo", "sapo"]  # vanilla: the kernel's
    assert describe(build_registry([], {"empty": "x"})) == {"empty": {}}


def test_describe_and_check_registry_list_a_plugins_rollout_engine():
    from plugrl.plugins import check_registry
    from plugrl.specs import EngineSpec

    registry = build_registry([EngineSpec("sglang", lambda **_: None, plugin="engines")], {"engines": "x"})
    assert describe(registry) == {"engines": {"rollout engines": ["sglang"]}}
    assert check_registry(registry) == []  # an engine's factory takes keywords: nothing to check positionally


def test_cli_lists_installed_plugins(tmp_path):
    proc = run_cli("plugins", cwd=tmp_path)
    blocks = cli_blocks(proc.stdout)
    countdown = blocks["countdown  (plugrl-datasets-countdown 0.1.0, plugrl_countdown)"]
    assert "rewards: countdown_reward -> countdown" in countdown
    assert "datasets: countdown" in countdown
    assert any(line.startswith("templates: ") and "countdown_r1" in line for line in countdown)
    advantages = blocks["advantages  (plugrl-advantages 0.1.0, plugrl_advantages)"]
    assert len(advantages) == 2 and advantages[0].startswith("estimators: ") and "grpo" in advantages[0]
    assert advantages[1] == "policy losses: cispo, gspo, luspo, sapo"
    # a broken plugin some other package installed would make the status 1, shown as ERROR under it
    broken = [h for h, lines in blocks.items() if any(line.startswith("ERROR") for line in lines)]
    assert proc.returncode == (1 if broken else 0), proc.stderr


# --- a third-party package, pip-installed into a private directory -----------------------------------------------


@pytest.fixture(scope="module")
def third_party_site(tmp_path_factory) -> Path:
    return build_third_party_plugin(tmp_path_factory.mktemp("third_party"))


def test_third_party_package_listed_by_cli(third_party_site, tmp_path):
    script = Path(PYTHON).parent / "plugrl"
    cmd = [str(script), "plugins"] if script.exists() else [PYTHON, "-m", "plugrl.cli", "plugins"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env=env_with_site(third_party_site), cwd=tmp_path
    )
    blocks = cli_blocks(proc.stdout)
    header = f"{PLUGIN_NAME}  ({DISTRIBUTION} {VERSION}, {PLUGIN_NAME})"
    assert header in blocks, proc.stdout + proc.stderr
    assert blocks[header] == [f"rewards: {REWARD_NAME} -> {DATA_SOURCE}"]
    assert any(h.startswith("countdown  (") for h in blocks)  # the venv's plugins are still there


def test_third_party_package_loads_and_routes(third_party_site, tmp_path):
    code = textwrap.dedent(
        f"""
        import json
        from plugrl.plugins import installed_plugins, load_plugins
        from plugrl.rewards.routing import rewards_for

        reg = load_plugins([{PLUGIN_NAME!r}])
        routed = rewards_for(reg, {DATA_SOURCE!r})
        dist = {{p.name: p.distribution for p in installed_plugins()}}[{PLUGIN_NAME!r}]
        print(json.dumps({{
            "routed": [[r.name, r.plugin, r.fn.__module__] for r in routed],
            "scores": [routed[0].fn(" 42 ", "42"), routed[0].fn("41", "42")],
            "source": reg.plugins[{PLUGIN_NAME!r}],
            "dist": dist,
        }}))
        """
    )
    proc = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, timeout=120, env=env_with_site(third_party_site),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["routed"] == [[REWARD_NAME, PLUGIN_NAME, PLUGIN_NAME]]
    assert result["scores"] == [1.0, 0.0]
    assert result["source"] == f"{DISTRIBUTION} ({PLUGIN_NAME})"
    assert result["dist"] == DISTRIBUTION


def test_third_party_helper_reuses_the_install(third_party_site):
    again = build_third_party_plugin(third_party_site.parent)
    assert again == third_party_site
    assert (again / PLUGIN_NAME / "__init__.py").read_text().startswith('"""Third-party plugrl plugin')


def test_plugrl_top_level_exports_what_plugins_use():
    assert plugrl.reward and plugrl.dataset and plugrl.template and plugrl.advantage_estimator and plugrl.hookimpl
    assert plugrl.RewardSpec is RewardSpec and plugrl.DatasetSpec is DatasetSpec
    assert plugrl.TemplateSpec is TemplateSpec and plugrl.EstimatorSpec is EstimatorSpec


def test_check_registry_flags_functions_that_cannot_be_called_as_the_kernel_will(local_plugin):
    from plugrl.plugins import check_registry

    mod = local_plugin(
        "lp_bad_signatures",
        "import plugrl\n\n"
        "@plugrl.template('t')\ndef t(sample, extra):\n    return ''\n\n"
        "@plugrl.reward('r')\ndef r():\n    return 0.0\n\n"
        "@plugrl.advantage_estimator('e')\ndef e(batch, config, *, scale=1.0):\n    return None\n",
    )
    problems = check_registry(load_plugins([f"{mod}:"]))
    assert len(problems) == 2
    assert any("template 't' is called as fn(sample)" in p for p in problems)
    assert any("reward 'r' is called as fn(completion, ground_truth, **context)" in p for p in problems)
    assert check_registry(load_plugins(["countdown", "advantages"])) == []


def test_lifecycle_hooks_are_called_around_a_run(local_plugin):
    mod = local_plugin(
        "lp_lifecycle",
        "import plugrl\n\nCALLS = []\n\n"
        "@plugrl.hookimpl\ndef plugrl_run_start(config, run_dir):\n    CALLS.append(('start', run_dir))\n\n"
        "@plugrl.hookimpl\ndef plugrl_run_end(config, run_dir, error):\n    CALLS.append(('end', error))\n",
    )
    registry = load_plugins([f"{mod}:"])
    registry.hooks.plugrl_run_start(config=None, run_dir="d")
    registry.hooks.plugrl_run_end(config=None, run_dir="d", error=None)
    import importlib

    assert importlib.import_module(mod).CALLS == [("start", "d"), ("end", None)]


def test_check_config_lists_every_plugins_problems_at_once(local_plugin):
    """plugrl_check_config: problems of all plugins in one ConfigError, in `plugins:` order, each after its
    plugin's name; a hook may take no argument; None or [] means all is well."""
    from plugrl.config import ConfigError
    from plugrl.plugins import check_config

    first = local_plugin(
        "lp_check_a",
        "import plugrl\n\n"
        "@plugrl.hookimpl\ndef plugrl_check_config(config):\n"
        "    return [f'reward.options.a.x must be > 0, got {config}', 'reward.options.a.y is required']\n",
    )
    second = local_plugin(
        "lp_check_b", "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_check_config():\n    return ['b.z is wrong']\n"
    )
    fine = local_plugin(
        "lp_check_ok", "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_check_config(config):\n    return []\n"
    )
    with pytest.raises(ConfigError) as info:
        check_config(-1, load_plugins([f"{fine}:", f"{first}:", f"{second}:"]))
    assert str(info.value).splitlines() == [
        "invalid config (found by the plugins' checks, before any model was loaded):",
        f"  plugin '{first}:': reward.options.a.x must be > 0, got -1",
        f"  plugin '{first}:': reward.options.a.y is required",
        f"  plugin '{second}:': b.z is wrong",
    ]
    check_config(-1, load_plugins([f"{fine}:", "countdown"]))  # no problems, and plugins without the hook
    check_config(-1, build_registry([], {}))  # a registry built by hand has no hooks to ask


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    raise KeyError('x')", "hook plugrl_check_config raised KeyError: 'x' (it must return the problems"),
        ("    return 'a.b is wrong'", "hook plugrl_check_config must return a list of messages or None, got str"),
        ("    return [1]", "hook plugrl_check_config must return messages (str), got int"),
    ],
)
def test_a_broken_check_config_hook_names_its_plugin(local_plugin, body, message):
    from plugrl.plugins import check_config

    source = f"import plugrl\n\n@plugrl.hookimpl\ndef plugrl_check_config(config):\n{body}\n"
    mod = local_plugin("lp_check_broken", source)
    with pytest.raises(PluginError, match=re.escape(f"plugin '{mod}:': {message}")):
        check_config(None, load_plugins([f"{mod}:"]))
