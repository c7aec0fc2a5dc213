"""The options plugins declare, validated against the config: a plugin function's ``options=`` model (a pydantic
model class) checks the config's mapping for it, every problem named by its dotted key.

:func:`validate_options` is the check itself; :func:`checked` gives the validated values as plain values for the
config and collects the problems; :func:`did_you_mean` suggests the closest known name. The loader's
:func:`plugrl.plugins.check_options` runs them over every plugin-owned part of the config.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from plugrl.config import is_secret_key


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean '<prefix><closest>'?"`` for the known name closest to ``name``, or "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def validate_options(model: Any, raw: Any, where: str, *, extra_known: Iterable[str] = ()) -> tuple[Any, list[str]]:
    """``raw`` (the config's mapping at ``where``) validated by ``model`` (a pydantic model class):
    (the model instance, []) or (None, problems), each problem naming ``where.key``.

    Keys the model does not declare are refused with a "did you mean" among its fields and
    ``extra_known`` (the kernel's own keys beside them, e.g. the ``algorithm`` section's).
    A value under a secret-looking key is never echoed.
    """
    from pydantic import ValidationError

    if not isinstance(raw, Mapping):
        return None, [f"{where} must be a mapping of options, got {type(raw).__name__}"]
    fields = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    unknown = sorted(k for k in raw if k not in fields)
    settable = sorted(name for name, f in model.model_fields.items() if not f.exclude)  # excluded: always refused
    problems = [
        f"unknown key '{where}.{k}'{did_you_mean(str(k), [*settable, *extra_known], where + '.')}; "
        f"known: {', '.join(settable) or 'none'}"
        for k in unknown
    ]
    try:
        value = model.model_validate({k: v for k, v in raw.items() if k in fields})
    except ValidationError as e:
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "missing":
                field = model.model_fields.get(str(err["loc"][0])) if err["loc"] else None
                about = f": {field.description}" if field is not None and field.description else ""
                problems.append(f"'{where}.{key}' is required{about}")
                continue
            # the value is not echoed under a secret-looking key, nor where a secret's NAME belongs (api_key_env):
            # a key pasted there by mistake must not reach the terminal
            hidden = is_secret_key(key) or key.lower().endswith(("_env", "_var")) or isinstance(err.get("input"), dict)
            got = "" if hidden else f" (got {err.get('input')!r})"
            place = f"{where}.{key}" if key else where  # a model validator's error belongs to the whole mapping
            problems.append(f"{place}: {err['msg'].removeprefix('Value error, ')}{got}")
        return None, problems
    return (None, problems) if problems else (value, [])


def checked(model: Any, raw: Any, where: str, problems: list[str], **kw: Any) -> dict[str, Any] | None:
    """The validated options as plain values (JSON types, so the run's config.yaml can hold them), or
    None after adding the problems to ``problems``."""
    value, found = validate_options(model, raw, where, **kw)
    problems.extend(found)
    return None if value is None else value.model_dump(mode="json")
