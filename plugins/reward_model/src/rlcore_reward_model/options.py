"""Manifest options of the model-based rewards (kept apart from the scorers: listing and validating
them imports neither torch, transformers nor httpx)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options

# The placeholders a judge's prompt_template may use.
PLACEHOLDERS = ("prompt", "response", "ground_truth", "raw_prompt")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_]\w*)\}")


class RuleMix(Options):
    """Adding a per-item rule reward to the model's score: ``model_weight * model + rule_weight * rule``."""

    rule: str | None = Field(
        None,
        description="a per-item reward added to the model's score: FILE.py:FUNCTION (relative to the manifest) or "
        "package.module:FUNCTION, taking a RewardInput (or verl's compute_score(data_source, solution_str, "
        "ground_truth, extra_info)) and returning a number or a RewardResult",
    )
    rule_weight: float = Field(1.0, ge=-1000.0, le=1000.0, description="weight of the rule's score")
    model_weight: float = Field(
        1.0, ge=-1000.0, le=1000.0, description="weight of the model's (or judge's) score"
    )

    @field_validator("rule")
    @classmethod
    def _rule_form(cls, value: str | None) -> str | None:
        if value is None:
            return value
        where, sep, name = value.rpartition(":")
        if not sep or not where or not name:
            raise ValueError(f"expected 'FILE.py:FUNCTION' or 'package.module:FUNCTION', got {value!r}")
        return value


class RewardModelOptions(RuleMix):
    path: str = Field(
        ...,
        min_length=1,
        description="a local Hugging Face directory holding a sequence-classification model and its tokenizer "
        "(relative to the manifest's directory)",
    )
    label: int | str = Field(
        0,
        description="the output whose logit is the score: an index, or a name from the model's id2label",
    )
    batch_size: int = Field(8, ge=1, le=4096, description="sequences per forward pass")
    max_length: int = Field(2048, ge=8, description="longer inputs are truncated to this many tokens")
    truncation: Literal["left", "right"] = Field(
        "left",
        description="which end a long input loses: left keeps the response's end, where the score is read",
    )
    input: Literal["auto", "chat", "text"] = Field(
        "auto",
        description="chat: the prompt's messages and the response rendered with the reward model's chat template; "
        "text: the decoded prompt (the policy's template) followed by the response; auto: chat when the reward "
        "model's tokenizer has a chat template, else text",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: the run's compute dtype on a GPU, float32 on the CPU"
    )
    device: str = Field(
        "auto", min_length=1, description='auto: the trainer\'s device; or "cpu", "cuda", "cuda:1", ...'
    )
    offload: Literal["cpu", "free", "none"] = Field(
        "cpu",
        description="what sleep() does on a GPU while the actor trains: cpu moves the weights to host memory; free "
        "drops them (reloaded from disk at wake-up); none keeps them on the GPU",
    )
    sigmoid: bool = Field(False, description="pass the logit through a sigmoid (a probability in [0, 1])")
    scale: float = Field(1.0, description="score = scale * x + shift, x the logit (or its sigmoid)")
    shift: float = Field(0.0, description="see scale")
    trust_remote_code: bool = Field(False, description="allow the model directory's own Python code")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps|xpu(:\d+)?", value):
            raise ValueError(f'expected "auto", "cpu", "cuda" or "cuda:N", got {value!r}')
        return value


DEFAULT_JUDGE_TEMPLATE = """\
Rate the assistant's answer to the question below on a scale from 0 to 10, where 10 is a correct,
complete and clear answer and 0 is a wrong or missing one.

[Question]
{prompt}

[Reference answer]
{ground_truth}

[Assistant's answer]
{response}

Reply with a short justification, then the score alone on the last line."""


class JudgeOptions(RuleMix):
    base_url: str = Field(
        ..., min_length=1, description="the OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"
    )
    model: str = Field(..., min_length=1, description="the model name the server serves")
    api_key_env: str | None = Field(
        None,
        min_length=1,
        description="the name of an environment variable holding the API key (never the key itself); unset: no key",
    )
    prompt_template: str = Field(
        DEFAULT_JUDGE_TEMPLATE,
        min_length=1,
        description="the user message sent to the judge, with {prompt}, {response}, {ground_truth} and "
        "{raw_prompt}; {{ and }} are literal braces",
    )
    system_prompt: str | None = Field(None, description="a system message before it")
    score_pattern: str = Field(
        r"-?\d+(?:\.\d+)?",
        min_length=1,
        description="a regular expression; its last match in the judge's reply (its first group, if it has one) is "
        "the score. Default: the last number",
    )
    max_score: float = Field(
        10.0, gt=0, description="the score is the judge's number divided by this: in [0, 1]"
    )
    strip_thinking: bool = Field(
        True, description="ignore <think>...</think> (and an unclosed <think>) in replies"
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(512, ge=1)
    extra_body: dict = Field(default_factory=dict, description="more fields for the request body")
    concurrency: int = Field(8, ge=1, le=1024, description="requests in flight at once")
    retries: int = Field(
        3, ge=0, le=20, description="retries of a request after 429, 5xx, a timeout or no connection"
    )
    backoff_s: float = Field(
        1.0, ge=0.0, le=60.0, description="wait before the first retry, doubled each time"
    )
    request_timeout_s: float = Field(
        60.0,
        gt=0,
        description="limit of one request ([reward] timeout_s, rlcore's own key, bounds the whole batch)",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"https?://[^/\s]+", value):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(
                "expected the name of an environment variable (e.g. JUDGE_API_KEY), and this is not one (the value "
                "is not shown, in case it is a key); never put the key itself in the manifest"
            )
        return value

    @field_validator("prompt_template")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        used = template_placeholders(value)
        unknown = sorted(used - set(PLACEHOLDERS))
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{unknown[0]}}}; known: "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                + " (write {{ and }} for literal braces)"
            )
        if "response" not in used:
            raise ValueError("the template never shows the judge the response: put {response} in it")
        return value

    @field_validator("score_pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _extra_body(self) -> JudgeOptions:
        taken = sorted({"model", "messages"} & set(self.extra_body))
        if taken:
            raise ValueError(f"extra_body may not set {', '.join(taken)}: the judge sets them")
        return self


def template_placeholders(template: str) -> set[str]:
    """The ``{name}`` placeholders of a template (``{{`` and ``}}`` are literal braces)."""
    return {m.group(1) for m in _PLACEHOLDER.finditer(template) if m.group(1)}


def fill_template(template: str, values: dict[str, str]) -> str:
    """``template`` with each known ``{name}`` replaced; ``{{`` and ``}}`` become single braces."""

    def replace(match: re.Match) -> str:
        if match.group(1) is None:
            return match.group(0)[0]
        return values.get(match.group(1), match.group(0))

    return _PLACEHOLDER.sub(replace, template)
