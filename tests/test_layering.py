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
        "hub",
        "tracking",
        "rewards.outcomes",
        "rollout.tools",
        "rollout.environment",
        "vision",
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
        "rollout.chat",
        "rollout.adapters",
        "lora",
    },
    {
        "plugins",
        "dist",
        "sharding",
        "prompts",
        "classify",
        "rollout.hf_engine",
        "rollout.engines",
        "rollout.vllm_engine",
        "rollout",
        "rollout.multiturn",
        "rollout.first_prompts",
    },
    {
        "rollouts_ahead",
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
    {"evaluate", "check"},
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
    } <= set(packages)
    bad = []
    for path in (CORE / "plugrl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{path.relative_to(CORE)} imports {n}" for n in names if n.split(".")[0] in packages]
    assert not bad, "\n".join(bad)
