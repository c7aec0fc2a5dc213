"""The kernel's import structure: acyclic, in layers, with the user commands on top.

Every ``import`` of a ``plugrl`` module counts, also inside functions (a lazy import still ties two modules
together); only imports under ``if TYPE_CHECKING:`` are left out. A module may import only modules of its own
or a lower layer, and the modules of one layer must not import each other in a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"

# Lowest first. A new module goes into the lowest layer whose modules' imports it needs.
LAYERS: list[set[str]] = [
    # foundations: no plugrl imports
    {
        "api",
        "specs",
        "readers",
        "config",
        "options",
        "algorithms",
        "attention",
        "precision",
        "placement",
        "autocast_inputs",
        "hostmem",
        "tracking",
        "rewards.outcomes",
        "rollout.tools",
        "rollout.environment",
        "vlm",
        "plugin_errors",
    },
    # contracts and small kernels built on them
    {
        "hookspecs",
        "parallel",
        "policy_losses",
        "rollout_correction",
        "models",
        "rollout.types",
        "rewards.adapters",
        "data",
        "",
        "rollout.episode_kit",
        "rollouts_ahead",
        "rollout.adapters",
        "model_adapters",
        "plugin_options",
        "rollout.routing",
        "rewards.routing",
    },
    {
        "plugins",
        "dist",
        "sharding",
        "prompts",
        "rollout.hf_engine",
        "rollout.engines",
        "rollout.vllm_engine",
        "rollout",
        "rollout.multiturn",
    },
    {
        "rewards.pool",
        "rewards.runner",
        "plugin_choice",
        "rewards",
        "checkpoint",
        "resume_check",
        "actor",
        "signals",
        "episodes",
        "rollout.play",
    },
    {"critic", "startup"},
    {"evaluate"},
    {"trainer"},
    # what users run: the command line (its commands are the packages of group plugrl.commands)
    {"cli"},
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE / "plugrl").with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    return skipped


def imports_of(path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "plugrl":
            base = node.module.removeprefix("plugrl").lstrip(".")
            names = [f"{base}.{a.name}".lstrip(".") for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name.removeprefix("plugrl").lstrip(".") for a in node.names if a.name.split(".")[0] == "plugrl"]
        for name in names:
            if name in known:
                found.add(name)
                break  # `from plugrl.rollout import types` is the submodule, not also the package
    return found - {module_name(path)}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in (CORE / "plugrl").rglob("*.py")}
    return {name: imports_of(path, set(paths)) for name, path in paths.items()}


def test_every_kernel_module_has_a_layer():
    placed = [m for layer in LAYERS for m in layer]
    assert len(placed) == len(set(placed)), "a module is in two layers"
    assert set(graph()) == set(placed), "put new modules into LAYERS (lowest layer that works)"


def test_no_module_imports_from_a_higher_layer():
    layer_of = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    upward = [
        f"{m} (layer {layer_of[m]}) imports {d} (layer {layer_of[d]})"
        for m, deps in graph().items()
        for d in deps
        if layer_of[d] > layer_of[m]
    ]
    assert not upward, "\n".join(upward)


def test_the_import_graph_is_acyclic():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d) :] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_no_kernel_module_imports_the_command_line():
    """Only the command line reaches the commands, through entry points (group plugrl.commands)."""
    bad = [f"{m} imports cli" for m, deps in graph().items() if m != "cli" and "cli" in deps]
    assert not bad, "\n".join(bad)


def test_the_rollout_and_rewards_packages_do_not_import_the_loader():
    """Which environment plays a sample's episodes and which rewards score it are routed beside the code that uses
    them (rollout.routing, rewards.routing): no module of the rollout or rewards packages imports the plugin loader,
    even lazily."""
    bad = [
        f"{m} imports plugins"
        for m, deps in graph().items()
        if m.split(".")[0] in ("rollout", "rewards") and "plugins" in deps
    ]
    assert not bad, "\n".join(bad)


def _packages_beside_the_kernel() -> dict[str, str]:
    """Every top-level module of the packages under plugins/ (``plugrl_commands``, ``plugrl_compat``, ...) -> its
    folder."""
    found = {}
    for project in (CORE.parent / "plugins").glob("*/pyproject.toml"):
        for entry in project.parent.iterdir():
            if entry.name.startswith("plugrl_") and (entry.suffix == ".py" or (entry / "__init__.py").is_file()):
                found[entry.name.removesuffix(".py")] = project.parent.name
    return found


def test_the_kernel_imports_no_package_beside_it():
    """The commands, the compatibility readers, the rollout servers and the plugins reach the kernel only through
    entry points (plugrl.commands, plugrl.config_readers, plugrl.extensions, plugrl): no kernel module imports
    one of their modules, even lazily."""
    packages = _packages_beside_the_kernel()
    assert {
        "plugrl_commands",
        "plugrl_compat",
        "plugrl_rollout_servers",
        "plugrl_testing",
        "plugrl_model_servers",
        "plugrl_lora",
        "plugrl_off_policy",
    } <= set(packages)
    bad = []
    for path in (CORE / "plugrl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{path.relative_to(CORE)} imports {n}" for n in names if n.split(".")[0] in packages]
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- no plugin's name in the kernel

# The names the kernel may still say, each on purpose: (file under core/plugrl, or "*" for any; the name; the string
# that says it: the whole string when it is the name alone, else a part of it) -> why. Nothing else is let through:
# a string reworded or moved is looked at again, and this list stays as short as it is.
NAMED_ON_PURPOSE: dict[tuple[str, str, str], str] = {
    ("config.py", "grpo", "grpo"): "the default of algorithm.adv_estimator: a config written for verl's GRPO names it",
    ("config.py", "grpo", "group std in grpo"): "verl's key norm_adv_by_std_in_grpo's epsilon: GRPO, the algorithm",
    ("config.py", "grpo", "TRL's grpo script"): "TRL's script, whose reward names reward.reward_funcs takes",
    ("startup.py", "gae", "verl's default is gae"): "verl's default estimator: why a verl PPO command sets critic keys",
    ("data.py", "reward_model", "reward_model"): "verl's data column reward_model.ground_truth",
    ("specs.py", "countdown", "@plugrl.reward('countdown')"): "a data_source in the decorator's own usage example",
    ("*", "verl_default", "with the verl_default plugin"): "the hint for verl's data sources that nothing routes",
    # plugin names that are also words of the kernel's own, used as those words
    ("actor.py", "advantages", "advantages"): "TrainBatch's field",
    ("*", "advantages", "old_logprob, advantages, response_mask"): "a policy loss's argument, in its signature",
    ("config.py", "advantages", "negative advantages"): "the word",
    ("config.py", "verifiers", "such as a verifiers tool"): "the verifiers library, whose tools an environment runs",
}


def _plugin_names() -> set[str]:
    """The name of every plugin under plugins/: its ``[project.entry-points.plugrl]`` entries."""
    import tomllib

    names: set[str] = set()
    for project in (CORE.parent / "plugins").glob("*/pyproject.toml"):
        names |= set(tomllib.loads(project.read_text()).get("project", {}).get("entry-points", {}).get("plugrl", {}))
    return names


def _estimator_names() -> set[str]:
    """The name of every estimator and policy loss plugins/advantages registers: its
    ``@advantage_estimator("<name>")`` and ``@policy_loss("<name>")`` calls."""
    names: set[str] = set()
    for path in (CORE.parent / "plugins" / "advantages").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            called = getattr(func, "id", getattr(func, "attr", None))
            if isinstance(node, ast.Call) and called in ("advantage_estimator", "policy_loss"):
                names.add(node.args[0].value)
    return names


def _strings_the_code_uses(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant but the prose: a string that is a statement of its own (a docstring, or the
    documentation under an attribute) is text for the kernel's readers, not something the kernel does or says."""
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose
    ]


def test_the_kernel_names_no_plugin_and_no_estimator():
    """No string the kernel's code uses (a default, a key it looks up, a message it logs or raises) names a plugin
    under plugins/ or an estimator or policy loss of plugins/advantages: what a plugin provides, the kernel learns from
    the registry, so a plugin can be renamed, replaced or left out without a change here. A name counts where it stands
    as a word of its own; within a dotted path, a package or a path (plugrl_advantages.estimators.grpo,
    plugrl-advantages, openai/gsm8k) it is part of another name. Docstrings and comments may cite algorithms and
    libraries (GRPO, verifiers), and identifiers are Python's (``import math``). The exceptions are listed, with why,
    in NAMED_ON_PURPOSE."""
    import re

    names = _plugin_names() | _estimator_names()
    assert {"advantages", "classifier_openai", "grpo", "gae", "remax", "grpo_weighted_add", "gspo", "sapo"} <= names
    word = re.compile(
        r"(?<![\w./-])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w/-]|\.\w)"
    )
    bad = []
    for path in sorted((CORE / "plugrl").rglob("*.py")):
        file = path.relative_to(CORE / "plugrl").as_posix()
        for node in _strings_the_code_uses(ast.parse(path.read_text())):
            for name in {m.group(1) for m in word.finditer(node.value)}:
                allowed = [
                    s
                    for (f, n, s) in NAMED_ON_PURPOSE
                    if n == name and f in ("*", file) and (node.value == s if s == name else s in node.value)
                ]
                if not allowed:
                    bad.append(f"core/plugrl/{file}:{node.lineno}: {name!r} in {node.value!r:.120}")
    assert not bad, "the kernel names plugins or estimators (learn them from the registry instead):\n" + "\n".join(bad)
