"""``plugrl plugins``: the installed plugins and what each registers; with ``--check``, every registered function's
signature checked against how the kernel calls it. Its help lists the hooks a plugin may implement."""

from __future__ import annotations

import argparse
from typing import Any

from plugrl.api import kernel
from plugrl.plugins import check_registry, hook_form, hook_names, installed_plugins, load_plugins
from plugrl.specs import Registry


def describe(registry: Registry) -> dict[str, dict[str, list[str]]]:
    """What each plugin registers: {plugin: {kind: [names]}}."""
    out: dict[str, dict[str, list[str]]] = {p: {} for p in registry.plugins}
    for r in registry.rewards:
        out.setdefault(r.plugin, {}).setdefault("rewards", []).append(f"{r.name} -> {', '.join(r.data_sources)}")
    for kind, table in registry.named():
        label = "policy losses" if kind == "policy loss" else f"{kind}s"
        for name, spec in table.items():
            if spec.plugin not in registry.plugins:
                continue  # the kernel's own or an extension's: not a plugin the user loaded
            out.setdefault(spec.plugin, {}).setdefault(label, []).append(name)
    for record in registry.plugin_records:  # a plugin's own kinds, under the label the kind gives itself
        label = getattr(type(record), "label", type(record).__name__)
        out.setdefault(getattr(record, "plugin", "?"), {}).setdefault(label, []).append(getattr(record, "name", "?"))
    return out


def list_plugins(args: argparse.Namespace) -> int:
    found = installed_plugins()
    if not found:
        print("no plugrl plugins installed (entry point group 'plugrl')")
        return 0
    status = 0
    for p in found:
        print(f"{p.name}  ({p.distribution} {p.version}, {p.value})")
        try:
            registry = load_plugins([p.name])
        except Exception as e:  # show every plugin even if one is broken
            print(f"    ERROR: {e}")
            status = 1
            continue
        for kind, names in describe(registry).get(p.name, {}).items():
            print(f"    {kind}: {', '.join(names)}")
        if args.check:
            problems = check_registry(registry)
            for problem in problems:
                print(f"    ERROR: {problem}")
            print("    check: " + ("FAILED" if problems else "ok"))
            status = status or int(bool(problems))
    return status


def hooks_epilog() -> str:
    """The hooks of this kernel, each with the arguments it may take."""
    import plugrl

    forms = "\n".join(f"  {hook_form(name)}" for name in hook_names())
    head = f"the hooks of {kernel(plugrl.__version__)}; a plugin implements any with @plugrl.hookimpl, taking any of "
    return f"{head}its arguments:\n{forms}"


def register(commands: Any) -> None:
    """``plugrl plugins``: added to the kernel's command line (entry point ``plugins`` in group plugrl.commands)."""
    p = commands.add_parser(
        "plugins",
        help="list installed plugins and what they register",
        epilog=hooks_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--check", action="store_true", help="also check every registered function's signature")
    p.set_defaults(fn=list_plugins)
