"""Token-in, token-out chat: the tokens a multi-turn episode appends between policy turns (here and in the agents of
plugrl-agents).

An episode's context is built only by appending: the prompt's tokens, then for each turn the tokens the
policy sampled (exactly those: never decoded and re-encoded, the most reported multi-turn bug in verl
and TRL), then the tokens that close the assistant turn and open the next messages, then the next
generation prompt. Those in-between tokens are what the chat template itself writes there, found by
rendering a fixed conversation with and without the new messages and taking the difference:

    render([user, assistant])                 = P + "A" + CLOSE          (CLOSE: e.g. "<|im_end|>\\n")
    render([user, assistant, *new], gen=True) = P + "A" + CLOSE + OPEN   (OPEN: the new messages + generation prompt)

This holds only for a template that renders earlier turns the same whatever follows them
(prefix-preserving). :class:`ChatFormat` checks that when it is built and refuses a template that is not,
naming the tokenizer: such a template (e.g. one that drops earlier turns' reasoning) would make the
trained context differ from what a fresh render shows the model at the next turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugrl.rollout.environment import Message

_USER = {"role": "user", "content": "U"}
_ASSISTANT = {"role": "assistant", "content": "A"}


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot serve multi-turn episodes; the message says why and what to do."""


class ChatFormat:
    """Renders an episode's messages as token ids for one tokenizer, with the tools' schemas
    (``apply_chat_template(tools=...)``) when the episode offers tools."""

    def __init__(self, tokenizer: Any, name: str = "the tokenizer", template_kwargs: dict[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"{name} has no chat template: multi-turn episodes (environment, rollout.tools) need one to write "
                "the turns; use an instruct model's tokenizer (model.tokenizer_path)"
            )
        self.tokenizer = tokenizer
        self.name = name
        self.template_kwargs = dict(template_kwargs or {})  # data.apply_chat_template_kwargs
        self._close: dict[Any, list[int]] = {}

    # ------------------------------------------------------------------ rendering
    def render(self, messages: Sequence[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        kwargs = {**self.template_kwargs, **({"tools": tools} if tools else {})}
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )

    def encode(self, text: str) -> list[int]:
        # chat-templated text holds its special tokens already
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Sequence[Message], tools: list[dict] | None) -> list[int]:
        """The first context of an episode: ``messages`` and the generation prompt."""
        return self.encode(self.render(messages, tools, True))

    def shows_tools(self, tools: list[dict]) -> bool:
        """Whether the chat template writes the tools' schemas into the prompt at all (some ignore ``tools``)."""
        return self.render([_USER], tools, True) != self.render([_USER], None, True)

    def with_tool_prompt(self, messages: list[Message], tools: list[dict] | None) -> list[Message]:
        """``messages``, with the tools described in the system message (:func:`tool_system_prompt`) when the
        chat template ignores ``tools=``; unchanged when it writes them itself or there are none."""
        if not tools or self.shows_tools(tools):
            return messages
        block = tool_system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": messages[0]["content"] + "\n\n" + block}, *messages[1:]]
        return [{"role": "system", "content": block}, *messages]

    # ------------------------------------------------------------------ between turns
    def _key(self, tools: list[dict] | None) -> Any:
        return None if not tools else tuple(t.get("function", t).get("name", "") for t in tools)

    def close_ids(self, tools: list[dict] | None = None) -> list[int]:
        """The tokens the template writes after an assistant message's content (e.g. ``<|im_end|>`` and a
        newline); checks on first use that the template is prefix-preserving."""
        key = self._key(tools)
        if key not in self._close:
            opened = self.render([_USER], tools, True)
            closed = self.render([_USER, _ASSISTANT], tools, False)
            if not closed.startswith(opened + "A"):
                raise ChatTemplateError(
                    f"the chat template of {self.name} does not render an assistant message as the generation "
                    "prompt followed by its content, so plugrl cannot tell which tokens close a turn; multi-turn "
                    "episodes need a template that does (model.tokenizer_path)"
                )
            followed = self.render([_USER, _ASSISTANT, _USER], tools, True)
            if not followed.startswith(closed):
                raise ChatTemplateError(
                    f"the chat template of {self.name} is not prefix-preserving: it renders an assistant turn "
                    "differently once another message follows it, so the context trained on would differ from "
                    "the one the model is shown; multi-turn episodes need a template that renders earlier turns "
                    "unchanged (model.tokenizer_path: a tokenizer whose template does)"
                )
            self._close[key] = self.encode(closed[len(opened) + 1 :])
        return self._close[key]

    def turn_end(self, reply_ids: Sequence[int], tools: list[dict] | None = None) -> list[int]:
        """The tokens to append after a policy reply so the assistant turn is closed as the template closes
        it: the rest of :meth:`close_ids` after what the reply already ends with (its EOS token, usually)."""
        close = self.close_ids(tools)
        for k in range(min(len(close), len(reply_ids)), 0, -1):
            if list(reply_ids[-k:]) == close[:k]:
                return close[k:]
        return list(close)

    def continuation(self, messages: Sequence[Message], tools: list[dict] | None = None) -> list[int]:
        """The tokens of ``messages`` (tool results, the environment's answer) and the next generation prompt,
        as the template writes them after a closed assistant turn."""
        closed = self.render([_USER, _ASSISTANT], tools, False)
        full = self.render([_USER, _ASSISTANT, *messages], tools, True)
        if not full.startswith(closed):
            raise ChatTemplateError(
                f"the chat template of {self.name} is not prefix-preserving for these messages (roles "
                f"{[m['role'] for m in messages]}): it renders the earlier turns differently once they follow"
            )
        return self.encode(full[len(closed) :])


def tool_system_prompt(schemas: list[dict]) -> str:
    """A description of the tools and of the Hermes call format, for a chat template that does not write
    the tools itself (``apply_chat_template`` ignores ``tools=``): put into the system message."""
    import json

    listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "You can call tools. Their JSON schemas are listed between <tools> and </tools>:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a tool, write one block per call, with a JSON object holding its name and arguments:\n"
        '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
        "The result comes back in the next message."
    )
