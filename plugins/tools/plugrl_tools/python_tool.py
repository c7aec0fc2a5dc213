"""The ``python`` tool: :func:`plugrl_tools.sandbox.python_tool`, registered for every run (this module is in the
entry-point group ``plugrl.extensions``: its records join the kernel's own, plugin ``plugrl``)."""

from __future__ import annotations

from plugrl_tools.authoring import make_tool
from plugrl_tools.sandbox import python_tool

PYTHON = make_tool(python_tool, name="python")
