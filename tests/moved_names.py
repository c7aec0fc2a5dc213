"""What a plugin that imports a name a plugin API change moved is told (:func:`plugrl.api.import_hint`)."""

from __future__ import annotations

import pytest

import plugrl
from plugrl.api import import_hint


def hint_of(statement: str) -> str:
    """The hint for ``statement`` (``from plugrl.x import y``), which must fail with an ImportError."""
    with pytest.raises(ImportError) as e:
        exec(statement, {})
    return import_hint(e.value, plugrl.__version__)
