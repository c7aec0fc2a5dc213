"""plugrl's tools: the sandboxed Python interpreter (:mod:`.sandbox`: :func:`run_python`), the ``python`` tool
built on it (:mod:`.python_tool`), which every run has, as the kernel's own tools protocol's first tool, the worker
pool that runs tool calls (:mod:`.executor`, which checks each call first: :mod:`.screening`) and tools made of
Python functions (:mod:`.authoring`: ``@plugrl.tool``)."""

from plugrl_tools.sandbox import SandboxLimits, SandboxResult, format_result, python_tool, run_python

__all__ = ["SandboxLimits", "SandboxResult", "format_result", "python_tool", "run_python"]
