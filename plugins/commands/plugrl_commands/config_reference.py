"""The config reference of docs/configuration.md: every key of :class:`plugrl.config.Config` (the kernel's, and
those the installed packages add, each named with its package) with its type, default and meaning, as a markdown
table. ``python -m plugrl_commands.config_reference docs/configuration.md`` rewrites that page's table; without a
path it prints the table (tests/test_config.py fails when the page is stale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from plugrl.config import Config, key_packages

BEGIN, END = "<!-- config:begin -->\n", "<!-- config:end -->"


def _type_name(ann: Any) -> str:
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    return text or str(ann).replace("typing.", "")


def _default(field: Any, section: BaseModel | None, name: str) -> Any:
    """The field's default as the reference shows it: the section's own where its parent makes one, a nested
    model as its dict, ``(required)`` for a key without one."""
    if section is not None:
        value = getattr(section, name)
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "(required)" if field.is_required() else field.default
    return value.model_dump() if isinstance(value, BaseModel) else value


def _rows(model: type[BaseModel], prefix: str, owners: dict[str, str], section: BaseModel | None = None) -> list[str]:
    """``owners``: the keys the installed packages add, with their package (:func:`plugrl.config.key_packages`, read
    once per page). ``section``: the section's default instance where its parent makes one, whose values win over
    the class's field defaults (the critic's optimizer is ``OptimConfig(lr=1e-5)``, not ``OptimConfig()``)."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if section is not None:
                sub = getattr(section, name)
            else:
                sub = f.default_factory() if f.default_factory is not None else None
            out += _rows(ann, f"{prefix}{name}.", owners, sub)
            continue
        key = f"{prefix}{name}"
        package = next((p for k, p in owners.items() if key == k or key.startswith(k + ".")), None)
        meaning = f"({package}) {f.description or ''}".rstrip() if package else f.description or ""
        cells = [f"`{key}`", f"`{_type_name(ann)}`", f"`{_default(f, section, name)!r}`", meaning]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def reference_markdown() -> str:
    """Every config key with its type, default and meaning, as a markdown table (docs/configuration.md)."""
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |", *_rows(Config, "", key_packages())]
    return "\n".join(lines) + "\n"


def write_reference(path: str | Path) -> None:
    """Replace the table between ``<!-- config:begin -->`` and ``<!-- config:end -->`` in ``path``."""
    text = Path(path).read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN.strip()} ... {END} markers to put the reference between")
    head, rest = text.split(BEGIN, 1)
    Path(path).write_text(head + BEGIN + reference_markdown() + END + rest.split(END, 1)[1])


if __name__ == "__main__":  # with a path, updates that page in place; else prints the reference
    import sys

    if len(sys.argv) > 1:
        write_reference(sys.argv[1])
    else:
        print(reference_markdown(), end="")
