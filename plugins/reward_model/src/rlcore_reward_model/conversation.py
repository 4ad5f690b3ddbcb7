"""The prompt's chat messages, as a reward model or a judge should see them.

A :class:`rlcore.interfaces.RewardInput` carries the prompt as the policy saw it: the decoded
token ids, the policy's chat template included (``<|im_start|>user\\n...<|im_end|>``). A reward
model has its own chat template, and a judge wants the question without the markup, so the
messages are read back from that text for the templates most models use: ChatML (Qwen, SmolLM,
...), Llama 3 and Gemma. The policy's generation prompt (the open assistant turn at the end) is
dropped. A prompt in none of these forms (a plain-text prompt, another template) is one user
message holding the whole text.

When a ``RewardInput`` carries the messages themselves (a ``messages`` attribute, or
``extra_info["messages"]``), those are used instead.
"""

from __future__ import annotations

import re
from typing import Any

# (name, one turn, the text before the first turn that may be dropped)
_FORMATS: tuple[tuple[str, re.Pattern, re.Pattern], ...] = (
    (
        "chatml",
        re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|(?=<\|im_start\|>)|\Z)", re.S),
        re.compile(r"\A(?:<\|endoftext\|>|<s>)?\s*\Z"),
    ),
    (
        "llama3",
        re.compile(
            r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|(?=<\|start_header_id\|>)|\Z)",
            re.S,
        ),
        re.compile(r"\A(?:<\|begin_of_text\|>)?\s*\Z"),
    ),
    (
        "gemma",
        re.compile(r"<start_of_turn>(\w+)\n(.*?)(?:<end_of_turn>\n?|(?=<start_of_turn>)|\Z)", re.S),
        re.compile(r"\A(?:<bos>)?\s*\Z"),
    ),
)
_ROLES = {"model": "assistant"}


def prompt_messages(item: Any) -> tuple[list[dict[str, str]], str]:
    """The prompt's messages and how they were found: "given", "chatml", "llama3", "gemma" or
    "text" (the whole prompt as one user message)."""
    given = getattr(item, "messages", None)
    if not given and isinstance(getattr(item, "extra_info", None), dict):
        given = item.extra_info.get("messages")
    if _is_messages(given):
        return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in given], "given"
    return parse_rendered(item.prompt or "")


def parse_rendered(text: str) -> tuple[list[dict[str, str]], str]:
    """Read the messages back from a prompt rendered by a chat template (see the module's docstring)."""
    for name, turn, preamble in _FORMATS:
        matches = list(turn.finditer(text))
        if not matches or not preamble.match(text[: matches[0].start()]):
            continue
        covered = "".join(text[a.end() : b.start()] for a, b in zip(matches, matches[1:]))
        if covered.strip() or text[matches[-1].end() :].strip():
            continue  # text between or after the turns: not this format
        messages = [{"role": _ROLES.get(m.group(1), m.group(1)), "content": m.group(2)} for m in matches]
        if messages[-1]["role"] == "assistant" and not messages[-1]["content"].strip():
            messages.pop()  # the generation prompt
        if messages:
            return messages, name
    return [{"role": "user", "content": text}], "text"


def conversation_text(messages: list[dict[str, str]]) -> str:
    """The messages as plain text for a judge: a lone user message as it is, else ``Role: content`` blocks."""
    shown = [m for m in messages if m["role"] != "system"] or messages
    if len(shown) == 1 and shown[0]["role"] == "user":
        return shown[0]["content"].strip()
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content'].strip()}" for m in shown)


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    )
