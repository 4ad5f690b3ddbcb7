"""Test helpers for agent loops, tools and the server: a tiny chat tokenizer that understands
tools, a scripted rollout engine, and a conformance check for :class:`rlcore.interfaces.Tool`.

The tokenizer is trained in milliseconds (byte-level BPE, so any text encodes) and carries a
ChatML chat template that renders tool schemas and Hermes-style ``<tool_call>`` blocks, so tests
exercise real template rendering without downloading or parsing a model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rlcore.interfaces import Completion, SamplingParams, ToolResult

# A ChatML template with tools (written for rlcore's tests; Hermes-style calls).
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these functions:\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'Call one as <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.<|im_end|>\n'
    "{% elif messages and messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}{% if not (loop.first and m.role == 'system') %}"
    "{% if m.role == 'tool' %}<|im_start|>tool\n{{ m.content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% if m.tool_calls is defined and m.tool_calls %}{% for c in m.tool_calls %}"
    '<tool_call>{"name": "{{ c.function.name }}", "arguments": '
    "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}"
    "}</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
    "{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "What is 12 + 30? Use the python tool to compute it.",
    'print(12 + 30) <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>',
    "The answer is \\boxed{42}. Traceback (most recent call last): Error: timed out",
    "system user assistant tool You are a helpful assistant. 0123456789 + - * / = ( ) [ ] { } : , .",
]


def make_chat_tokenizer(vocab_size: int = 600) -> Any:
    """A small byte-level BPE tokenizer (transformers) with a tool-aware ChatML template.

    EOS (and the end of every chat turn) is ``<|im_end|>``; pad is ``<|endoftext|>``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )


Script = Callable[[str, int], str]


class ScriptedEngine:
    """A rollout engine whose replies come from ``script(prompt_text, sample_index)``.

    The reply is tokenised canonically, EOS is appended (finish ``stop``), ``max_new_tokens`` cuts
    it (finish ``length``), and every token gets the log-probability ``logprob``. ``calls`` records
    the batch size of every ``generate`` call, so tests can check that a loop batches.
    """

    shares_actor = False

    def __init__(self, tokenizer: Any, script: Script, logprob: float = -0.5, append_eos: bool = True):
        self.tokenizer = tokenizer
        self.script = script
        self.logprob = logprob
        self.append_eos = append_eos
        self.calls: list[int] = []
        self.prompts: list[list[int]] = []
        self.weight_updates = 0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        self.calls.append(len(prompts) * params.n)
        out: list[list[Completion]] = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            text = self.tokenizer.decode(list(prompt), skip_special_tokens=False)
            group = []
            for i in range(params.n):
                ids = self.tokenizer.encode(self.script(text, i), add_special_tokens=False)
                if self.append_eos:
                    ids.append(self.tokenizer.eos_token_id)
                finish = "stop"
                stops = set(params.stop_token_ids) | (
                    {self.tokenizer.eos_token_id} if self.append_eos else set()
                )
                for k, t in enumerate(ids):
                    if t in stops:
                        ids = ids[: k + 1]
                        break
                if len(ids) > params.max_new_tokens:
                    ids, finish = ids[: params.max_new_tokens], "length"
                elif not self.append_eos:
                    finish = "length"
                group.append(
                    Completion(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish)
                )
            out.append(group)
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        for _ in named_tensors:
            pass
        self.weight_updates += 1

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass


def assert_tool_conforms(
    tool: Any, arguments: dict[str, Any], trajectory_id: str = "conformance-0"
) -> ToolResult:
    """Check a tool against the :class:`rlcore.interfaces.Tool` contract and return one result.

    The schema must be an OpenAI function schema naming the tool, JSON-serialisable, with object
    parameters; create/execute/release must be coroutines; execute must return a ToolResult.
    """
    schema = tool.schema()
    json.dumps(schema)
    assert schema.get("type") == "function", f"schema type must be 'function', got {schema.get('type')!r}"
    fn = schema.get("function") or {}
    assert fn.get("name") == tool.name, f"schema name {fn.get('name')!r} differs from tool.name {tool.name!r}"
    assert isinstance(fn.get("description", ""), str)
    params = fn.get("parameters", {"type": "object"})
    assert params.get("type") == "object", "function parameters must be a JSON object schema"

    async def go() -> ToolResult:
        await tool.create(trajectory_id)
        try:
            return await tool.execute(trajectory_id, arguments)
        finally:
            await tool.release(trajectory_id)

    result = asyncio.run(go())
    assert isinstance(result, ToolResult), f"execute must return ToolResult, got {type(result).__name__}"
    assert isinstance(result.text, str)
    return result
