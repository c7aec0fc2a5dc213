"""One verifiers rollout, driven turn by turn by plugrl's episode loop.

verifiers' own ``MultiTurnEnv.rollout`` owns its loop and asks a client for each reply; plugrl batches the
replies of every live episode into one engine call per turn, so the loop is plugrl's and each of its steps
calls the environment's own hooks, in the order ``rollout`` calls them:

- ``start``: ``init_state`` (the row as verifiers' ``RolloutInput``), ``setup_state``, then the first
  ``get_prompt_messages`` (the row's prompt, system prompt and few-shot included) and ``state["tool_defs"]``,
  shown to the model and run by the environment itself (``EnvStart.tool_schemas``);
- ``step``: the reply becomes the trajectory step (``add_trajectory_step``), then the stop conditions
  (``is_completed``: ``@vf.stop`` methods, ``max_turns``, ``no_tools_called``, errors), then
  ``get_prompt_messages``, which calls ``env_response`` (the environment's feedback, its tools' results);
- ``reward``: the cleanup handlers (``render_completion`` included), then the rubric's ``score_rollout``:
  the weighted sum is the episode's reward, each function's value a part of it (``reward/<name>/mean``).

A ``vf.Error`` raised by a hook is recorded in ``state["error"]`` and ends the rollout through its stop
condition, scored by the rubric, as verifiers does; any other exception ends the episode as an error.
"""

from __future__ import annotations

import json
import time
from typing import Any

import verifiers as vf
from verifiers.clients import Client
from verifiers.types import AssistantMessage, TrajectoryStep
from verifiers.types import ToolCall as VfToolCall
from verifiers.utils.message_utils import maybe_normalize_messages

from plugrl.rollout.environment import EnvStart, EnvStep, EpisodeScore, Turn

MODEL = "plugrl-policy"  # the model name verifiers records in a rollout's state


class PolicyClient(Client):
    """Stands in for verifiers' model client. plugrl samples the policy's replies itself, so a hook that asks
    the client for one (outside the rollout loop) gets an error that says so."""

    def __init__(self) -> None:
        super().__init__(None)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "plugrl samples the policy's replies in its own batched loop; a verifiers hook that calls the model "
            "client itself (get_model_response outside rollout()) is not supported"
        )

    setup_client = _refuse

    async def to_native_tool(self, tool: Any) -> Any:
        return self._refuse()

    async def to_native_prompt(self, messages: Any) -> Any:
        return self._refuse()

    async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse()

    async def raise_from_native_response(self, response: Any) -> None:
        return self._refuse()

    async def from_native_response(self, response: Any) -> Any:
        return self._refuse()

    async def close(self) -> None:
        return None


class VerifiersEpisode:
    """One episode of the shared verifiers environment ``env`` (set on the subclass the loader makes per
    environment); its rollout state lives here."""

    env: vf.MultiTurnEnv

    def __init__(self) -> None:
        self.state: Any = None
        self.prompt: list[Any] = []  # the verifiers messages the last reply answered
        self.names: dict[str, str] = {}  # tool call id -> tool name, for the tool messages' "name"

    async def start(self, sample: Any) -> EnvStart:
        env = self.env
        self.state = await env.init_state(rollout_input(sample.row), PolicyClient(), MODEL, {})
        self.state["timing"].generation.start = self.state["timing"].setup.start = time.time()
        try:
            state = await env.setup_state(self.state)
            self.state = self.state if state is None else state
        except vf.Error as e:
            self.state["error"] = e
        finally:
            self.state["timing"].setup.end = time.time()
        if await env.is_completed(self.state):  # setup failed: nothing for the policy to answer
            raise RuntimeError(f"the rollout ended before its first turn ({self.state.get('stop_condition')})")
        self.prompt = maybe_normalize_messages(await env.get_prompt_messages(self.state), field_name="prompt")
        return EnvStart(messages=to_chat(self.prompt), tool_schemas=[tool_schema(t) for t in self.state["tool_defs"]])

    async def step(self, turn: Turn) -> EnvStep:
        env, state = self.env, self.state
        reply = AssistantMessage(content=turn.reply, tool_calls=self._calls(turn) or None)
        await env.add_trajectory_step(state, _trajectory_step(self.prompt, reply, state, turn))
        if await env.is_completed(state):
            return EnvStep(done=True)
        if turn.last:  # plugrl's rollout.max_turns ends it: no environment response to compute
            return EnvStep()
        before = [*self.prompt, reply]
        try:
            prompt = maybe_normalize_messages(await env.get_prompt_messages(state), field_name="prompt_messages")
        except vf.Error as e:
            state["error"] = e
            await env.is_completed(state)
            return EnvStep(done=True)
        final = state.get("final_env_response")
        if final is not None:  # the environment's last word: kept in the conversation, no turn answers it
            await env.is_completed(state)
            return EnvStep(done=True, messages=self._chat(maybe_normalize_messages(final)))
        self.prompt = prompt
        if _dumps(prompt[: len(before)]) == _dumps(before):
            return EnvStep(messages=self._chat(prompt[len(before) :]))
        # get_prompt_messages rewrote the history (a non-linear rollout): the next turn reads it afresh
        return EnvStep(context=self._chat(prompt))

    async def reward(self) -> EpisodeScore:
        env, state = self.env, self.state
        await env.cleanup(state)  # render_completion: state["completion"], which the rubric scores
        if env.score_rollouts:
            await env.rubric.score_rollout(state)
        else:
            await env.rubric.dummy_score_rollout(state)
        await env.rubric.cleanup(state)
        parts = {k: float(v) for k, v in (state.get("metrics") or {}).items() if isinstance(v, (int, float))}
        return EpisodeScore(float(state["reward"] or 0.0), parts)

    def _calls(self, turn: Turn) -> list[VfToolCall]:
        """The reply's well-formed calls of the environment's tools, as verifiers' tool calls (the kernel
        answered the malformed ones)."""
        own = {t.name for t in self.state["tool_defs"]}
        calls = [c for c in turn.tool_calls if c.error is None and c.name in own]
        self.names.update({c.id: c.name for c in calls})
        return [VfToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments)) for c in calls]

    def _chat(self, messages: list[Any]) -> list[dict[str, Any]]:
        return to_chat(messages, self.names)


def rollout_input(row: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as verifiers' ``RolloutInput``: every column, ``example_id`` an int as it requires."""
    if not isinstance(row.get("prompt"), list):
        raise ValueError(
            "the row's 'prompt' must be a list of chat messages (verifiers' completion-format string prompts are "
            "not supported)"
        )
    out = dict(row)
    out.setdefault("example_id", 0)
    return out


def tool_schema(tool: Any) -> dict[str, Any]:
    """verifiers' provider-agnostic ``vf.Tool`` in OpenAI's function form, as chat templates take tools."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }


def to_chat(messages: list[Any], names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """verifiers messages as plain chat dicts (``role``, ``content`` text; a tool message with its call's id
    and name). Text content parts are joined; any other part (an image) is refused: plugrl has no image path."""
    out = []
    for m in messages:
        m = m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"a {role!r} message: plugrl trains chat messages (system, user, assistant, tool)")
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"))}
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id", "")
            msg["name"] = (names or {}).get(msg["tool_call_id"], "")
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in m["tool_calls"]
            ]
        out.append(msg)
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        part = part.model_dump() if hasattr(part, "model_dump") else dict(part)
        if part.get("type") != "text":
            raise ValueError(f"a message holds a {part.get('type')!r} part: plugrl trains text only (no images yet)")
        parts.append(part["text"])
    return "".join(parts)


def _dumps(messages: list[Any]) -> list[Any]:
    return [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in messages]


def _trajectory_step(prompt: list[Any], reply: AssistantMessage, state: Any, turn: Turn) -> TrajectoryStep:
    """The turn as verifiers records it; plugrl keeps the tokens, so ``response`` and ``tokens`` are None."""
    return TrajectoryStep(
        prompt=prompt,
        completion=[reply],
        response=None,
        tokens=None,
        reward=None,
        advantage=None,
        is_truncated=False,
        trajectory_id=state["trajectory_id"],
        extras={"plugrl_turn": turn.index},
    )
