"""Tool authoring is plugrl-tools' (plugins/tools, module plugrl_tools.authoring), found through the entry-point
group plugrl.tool_authoring: ``@plugrl.tool`` and the functions an environment offers as tools are made into
records there; without the package both name it, and the kernel keeps only the protocol (plugrl.rollout.tools)."""

from __future__ import annotations

import pytest

import plugrl
from moved_names import hint_of
from plugrl.api import import_hint
from plugrl.rollout import tools
from plugrl.rollout.environment import Environment, EnvStart, EnvStep
from plugrl.rollout.tools import NoToolExecutor, tool_authoring
from test_env_own_tools_and_scores import _sample
from test_multiturn import SAMPLING, _runner, _start
from test_trl_environments import _scripted

MISSING = (
    r"tools made from Python functions are in the package plugrl-tools, which is not installed: "
    r"pip install plugrl-tools \(in a plugrl checkout: pip install -e plugins/tools\)"
)


@pytest.fixture
def without_the_package(hide_entry_points):
    """plugrl-tools' authoring entry point gone, as where the package is not installed (the kernel's cache of it
    emptied around the test)."""
    hide_entry_points(tools.AUTHORING_GROUP)
    tool_authoring.cache_clear()
    yield
    tool_authoring.cache_clear()


def test_plugrl_tool_is_plugrl_tools_decorator():
    import plugrl_tools.authoring
    from plugrl import tool

    assert tool_authoring() is plugrl_tools.authoring
    assert tool is plugrl.tool is plugrl_tools.authoring.tool
    assert "tool" in plugrl.__all__


def test_without_the_package_plugrl_tool_names_it(without_the_package):
    with pytest.raises(NoToolExecutor, match=rf"^{MISSING}$"):
        plugrl.tool  # noqa: B018 (the attribute's lookup is what is tested)
    with pytest.raises(NoToolExecutor, match=MISSING):
        from plugrl import tool  # noqa: F401
    assert plugrl.EnvStart is EnvStart  # the other lazy names are untouched


def test_without_the_package_a_star_import_leaves_out_plugrl_tool(without_the_package):
    names: dict = {}
    exec("from plugrl import *", names)  # raised NoToolExecutor while __all__ named `tool` unconditionally
    assert "tool" not in names and "tool" not in plugrl.__all__ and names["EnvStart"] is EnvStart


class OffersAFunction(Environment):
    """Offers a closure as its own tool (``EnvStart.tools``): made into a record by plugrl-tools."""

    def start(self, sample):
        def count(text: str) -> int:
            """Count the characters.

            Args:
                text: What to count.
            """
            return len(text)

        return EnvStart(tools=[count])

    def step(self, turn):
        return EnvStep(done=True)


def test_without_the_package_an_environment_offering_a_function_ends_the_run_naming_it(
    smol_tokenizer, without_the_package
):
    """A missing package is the run's problem, not the episode's: the error ends the run rather than every
    episode as ``error``."""
    tok = smol_tokenizer
    runner, _, _ = _runner(_scripted(tok, {"(0)": ["x"]}), tok)
    with pytest.raises(NoToolExecutor, match=rf"^{MISSING}$"):
        runner.run([_start(tok, _sample(0), OffersAFunction)], SAMPLING)


def test_with_the_package_the_function_is_offered(smol_tokenizer):
    tok = smol_tokenizer
    runner, _, _ = _runner(_scripted(tok, {"(0)": ["x"]}), tok)
    ((rollout, conv),) = runner.run([_start(tok, _sample(0), OffersAFunction)], SAMPLING)
    assert conv.finish == "done" and '"name": "count"' in tok.decode(rollout.prompt_ids)


@pytest.mark.parametrize("name", ["make_tool", "tool_schema", "check_schema", "is_importable", "tool"])
def test_a_plugin_reading_a_moved_name_is_told_where_it_went(name):
    with pytest.raises(AttributeError) as e:
        getattr(tools, name)
    where = "plugrl.tool" if name == "tool" else f"plugrl_tools.authoring.{name} (package plugrl-tools)"
    assert (
        import_hint(e.value, plugrl.__version__)
        == f"; plugrl.rollout.tools.{name} moved in plugin API 2: import {where}"
    )


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("ToolCheck", "plugrl_tools.screening"),
        ("screen_call", "plugrl_tools.screening"),
        ("bad_arguments", "plugrl_tools.screening"),
        ("call_in_process", "plugrl_tools.executor"),
        ("tool_where", "plugrl_tools.authoring"),
        ("strip_optional", "plugrl_tools.authoring"),
    ],
)
def test_a_plugin_importing_a_moved_tool_execution_name_is_told_where_it_went(name, where):
    """Checking a call's arguments and running an episode's own tools are plugrl-tools'; the kernel keeps the
    protocol, and a stale ``from plugrl.rollout.tools import <name>`` names the new place."""
    import importlib

    assert (
        hint_of(f"from plugrl.rollout.tools import {name}")
        == f"; plugrl.rollout.tools.{name} moved in plugin API 2: import {where}.{name} (package plugrl-tools)"
    )
    assert getattr(importlib.import_module(where), name).__module__ == where


def test_the_executor_runs_an_episodes_own_tools_for_the_multi_turn_loop():
    """plugrl-multiturn reaches call_in_process through the kernel's seam, not by importing plugrl-tools."""
    from plugrl_tools.executor import ToolExecutor, call_in_process

    assert tools.tool_executor() is ToolExecutor and ToolExecutor.call_in_process is call_in_process
