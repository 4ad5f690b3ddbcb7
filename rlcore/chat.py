"""Token ids between model turns, taken from the chat template without re-tokenising the conversation.

After a model turn the conversation continues with: the rest of the assistant turn that the model
did not generate itself (e.g. the newline the template writes after ``<|im_end|>``), the tool
messages, and the next assistant header. That *glue* is found by rendering the conversation with
and without the tool messages and taking the suffix (checking the prefix matches), and only the
glue is tokenised. The model's own tokens are kept exactly as sampled.

Where this differs from tokenising the whole rendered conversation:

* a model may sample a non-canonical tokenisation of its text (``"Hel" "lo"``); we keep what it
  sampled, since that is what its log-probabilities belong to;
* templates that rewrite earlier assistant turns (strip whitespace, drop ``<think>`` blocks,
  re-render tool calls from a ``tool_calls`` field) render the past differently from what the
  model saw; we keep what the model saw. The loop counts such turns in ``agent/template_mismatch``.

In the core (part of the plugin API) because every multi-turn agent loop needs the same glue: the
``tool`` loop of rlcore-agent and the ``verifiers`` loop of rlcore-verifiers use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_SENTINEL = "RLCORE7SENTINEL"
_PROBE = [{"role": "user", "content": "Hi"}]


def tools_system_text(schemas: list[dict[str, Any]]) -> str:
    """Tool instructions for chat templates that do not render tools themselves."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "You can call tools. Their JSON schemas:\n<tools>\n"
        f"{lines}\n</tools>\n"
        'To call a tool, write <tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>. '
        "The result comes back in a tool message."
    )


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters by dropping its middle (a tool's output: its
    start and its end, where errors are, both matter), saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n... [{len(text) - 2 * keep} characters cut] ...\n{text[-keep:]}"


@dataclass
class Glue:
    ids: list[int]
    assistant: dict[str, Any]  # the assistant message to keep in the conversation
    mismatch: bool  # the template re-renders the past differently from what the model saw


class ChatGlue:
    """Renders prompts and inter-turn glue for one tokenizer and one set of tool schemas."""

    def __init__(self, tokenizer: Any, schemas: list[dict[str, Any]] | None = None, **template_kwargs: Any):
        self.tok = tokenizer
        self.schemas = list(schemas or [])
        self.template_kwargs = template_kwargs
        self.template_renders_tools = bool(self.schemas) and self._render(
            _PROBE, True, tools=True
        ) != self._render(_PROBE, True, tools=False)
        rendered = self._render([*_PROBE, {"role": "assistant", "content": _SENTINEL}], False)
        at = rendered.rfind(_SENTINEL)
        self.closing = rendered[at + len(_SENTINEL) :] if at >= 0 else (tokenizer.eos_token or "")

    # ------------------------------------------------------------------ rendering

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool, tools: bool = True) -> str:
        kwargs = dict(self.template_kwargs)
        if tools and self.schemas:
            kwargs["tools"] = self.schemas
        return self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self._render(messages, generation_prompt, tools=self.template_renders_tools)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def with_tools(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages to render a prompt from: unchanged when the template shows the tools,
        else with the tool instructions in the system message."""
        if not self.schemas or self.template_renders_tools:
            return list(messages)
        text = tools_system_text(self.schemas)
        if messages and messages[0].get("role") == "system":
            first = dict(messages[0])
            first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
            return [first, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, True))

    # ------------------------------------------------------------------ glue

    def split_generated(self, text: str) -> tuple[str, str]:
        """Split a turn's text (special tokens kept) into the assistant content and the part of
        the template's end-of-turn text the model did not generate."""
        for k in range(min(len(self.closing), len(text)), 0, -1):
            if text.endswith(self.closing[:k]):
                return text[: len(text) - k], self.closing[k:]
        return text, self.closing

    def turn_glue(
        self, messages: list[dict[str, Any]], generated_text: str, tool_messages: list[dict[str, Any]]
    ) -> Glue:
        """Glue after an assistant turn whose text was ``generated_text``, before the next turn."""
        content, remainder = self.split_generated(generated_text)
        assistant = {"role": "assistant", "content": content}
        before = self.render([*messages, assistant], False)
        after = self.render([*messages, assistant, *tool_messages], True)
        mismatch = not before.endswith(content + self.closing)
        if after.startswith(before):
            delta = after[len(before) :]
        else:  # the template rewrites the past when tools follow: take the delta from a probe
            mismatch = True
            probe = [*_PROBE, {"role": "assistant", "content": "Hi"}]
            base = self.render(probe, False)
            delta = self.render([*probe, *tool_messages], True)[len(base) :]
        return Glue(ids=self.encode(remainder + delta), assistant=assistant, mismatch=mismatch)
