"""The ``judge`` reward: an LLM behind an OpenAI-compatible endpoint grades each response.

One chat completion per item, ``concurrency`` in flight at once (a thread pool sharing one httpx
client). A request that meets 429, a 5xx, a timeout or a refused connection is retried
``retries`` times, waiting ``backoff_s`` (doubled each time, or the server's Retry-After). The
score is the last match of ``score_pattern`` in the reply divided by ``max_score``.

An item whose request fails for good, whose reply holds no number, or whose number lies outside
[0, max_score] scores 0, and its metric ``judge_failed`` is 1: rlcore averages it per step as
``reward/judge_failed``, the share of the batch the judge could not grade. ``score_batch`` never
raises for one item. The batch as a whole stops short of ``[reward] batch_timeout_s``: what is not
graded by then counts as failed, so a slow judge costs its unfinished items, not the batch.
"""

from __future__ import annotations

import concurrent.futures
import email.utils
import os
import random
import re
import time
from collections.abc import Sequence
from typing import Any

from loguru import logger

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, RewardInput, RewardResult
from rlcore_reward_model.conversation import conversation_text, prompt_messages
from rlcore_reward_model.options import JudgeOptions, fill_template, template_placeholders
from rlcore_reward_model.rule import combine, load_rule

_RETRY_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S)
# Room left before [reward] batch_timeout_s for the trainer to collect the batch.
_DEADLINE_MARGIN = 0.9


def build(options: JudgeOptions, context: BuildContext | None = None) -> Judge:
    context = context or BuildContext()
    api_key = None
    if options.api_key_env is not None:
        api_key = os.environ.get(options.api_key_env)
        if not api_key:
            raise UsageError(
                f"[reward] api_key_env = {options.api_key_env!r}: that environment variable is not set "
                "(or empty); export the judge's API key in it"
            )
    rule = load_rule(options.rule, options.rule_weight, context.manifest_dir, "judge")
    reward = (context.manifest or {}).get("reward") or {}
    batch_limit = reward.get("batch_timeout_s") if isinstance(reward, dict) else None
    return Judge(options, api_key=api_key, rule=rule, batch_timeout_s=batch_limit)


class _Failure(Exception):
    """One item the judge could not grade; ``str()`` says why."""


class Judge:
    batched = True

    def __init__(
        self,
        options: JudgeOptions,
        *,
        api_key: str | None = None,
        rule=None,
        batch_timeout_s: float | None = None,
    ) -> None:
        import httpx

        self.options, self.rule = options, rule
        self.url = options.base_url + "/chat/completions"
        self.pattern = re.compile(options.score_pattern)
        self.uses = template_placeholders(options.prompt_template)
        fields = {"ground_truth"} if "ground_truth" in self.uses else set()
        self.required_fields = frozenset(fields | (rule.required_fields if rule is not None else set()))
        self.batch_timeout_s = float(batch_timeout_s) if batch_timeout_s else None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(
            max_connections=options.concurrency, max_keepalive_connections=options.concurrency
        )
        self.client = httpx.Client(headers=headers, limits=limits, timeout=options.request_timeout_s)
        self.pool = concurrent.futures.ThreadPoolExecutor(
            options.concurrency, thread_name_prefix="rlcore-judge"
        )
        self._generation = 0  # bumped by sleep(): requests of an abandoned batch stop retrying
        if self.batch_timeout_s is not None and options.request_timeout_s > self.batch_timeout_s:
            logger.warning(
                "judge: [reward] batch_timeout_s = {:g} s bounds all of a step's judge requests together, less than "
                "one request may take (request_timeout_s = {:g} s); items not graded in time score 0, counted in "
                "reward/judge_failed: raise [reward] batch_timeout_s for a slow judge",
                self.batch_timeout_s,
                options.request_timeout_s,
            )
        logger.info(
            "judge: {} at {}, {} requests at once, batch time limit {}",
            options.model,
            self.url,
            options.concurrency,
            f"{self.batch_timeout_s:g} s" if self.batch_timeout_s else "none",
        )

    # ------------------------------------------------------------------ the batch protocol

    def sleep(self) -> None:
        self._generation += 1

    def score_batch(self, items: Sequence[RewardInput]) -> list[RewardResult]:
        started = time.monotonic()
        deadline = started + _DEADLINE_MARGIN * self.batch_timeout_s if self.batch_timeout_s else None
        generation = self._generation
        futures = [self.pool.submit(self._grade, item, deadline, generation) for item in items]
        scores, metrics, failures = [], [], []
        for future in futures:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                score, retries = future.result(timeout=remaining)
                scores.append(score)
                metrics.append({"judge_score": score, "judge_failed": 0.0, "judge_retries": float(retries)})
            except concurrent.futures.TimeoutError:
                future.cancel()
                failures.append("no answer before the batch's time limit ([reward] timeout_s)")
                scores.append(0.0)
                metrics.append({"judge_failed": 1.0})
            except _Failure as exc:
                failures.append(str(exc))
                scores.append(0.0)
                metrics.append({"judge_failed": 1.0})
        if failures:
            logger.warning(
                "judge: {} of {} items could not be graded and score 0 (reward/judge_failed); the first: {}",
                len(failures),
                len(items),
                failures[0],
            )
        return combine(scores, metrics, items, self.rule, self.options.model_weight)

    def close(self) -> None:
        self._generation += 1
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    # ------------------------------------------------------------------ one item

    def messages(self, item: RewardInput) -> list[dict[str, str]]:
        """The chat messages sent to the judge for ``item``."""
        values = {
            "response": item.response,
            "raw_prompt": item.prompt or "",
            "ground_truth": "" if item.ground_truth is None else str(item.ground_truth),
        }
        if "prompt" in self.uses:
            values["prompt"] = conversation_text(prompt_messages(item)[0])
        messages = [{"role": "user", "content": fill_template(self.options.prompt_template, values)}]
        if self.options.system_prompt:
            messages.insert(0, {"role": "system", "content": self.options.system_prompt})
        return messages

    def parse(self, reply: str) -> float:
        """The normalised score in a reply; raises _Failure when there is none."""
        text = _THINK.sub("", reply) if self.options.strip_thinking else reply
        matches = list(self.pattern.finditer(text))
        if not matches:
            raise _Failure(
                f"no match of score_pattern {self.options.score_pattern!r} in the reply {_short(reply)}"
            )
        last = matches[-1]
        found = last.group(1) if last.re.groups else last.group(0)
        try:
            value = float(found)
        except (TypeError, ValueError):
            raise _Failure(f"the score {found!r} in the reply {_short(reply)} is not a number") from None
        if not 0.0 <= value <= self.options.max_score:
            raise _Failure(
                f"the score {value:g} in the reply {_short(reply)} is outside [0, max_score = "
                f"{self.options.max_score:g}]"
            )
        return value / self.options.max_score

    def _grade(self, item: RewardInput, deadline: float | None, generation: int) -> tuple[float, int]:
        import httpx

        o = self.options
        body = {
            **o.extra_body,
            "model": o.model,
            "messages": self.messages(item),
            "temperature": o.temperature,
            "max_tokens": o.max_tokens,
        }
        attempt = 0
        while True:
            if generation != self._generation:
                raise _Failure("abandoned: the batch ran past its time limit")
            timeout = (
                o.request_timeout_s
                if deadline is None
                else min(o.request_timeout_s, deadline - time.monotonic())
            )
            if timeout <= 0:
                raise _Failure("no time left before the batch's time limit ([reward] timeout_s)")
            wait = None
            try:
                response = self.client.post(self.url, json=body, timeout=timeout)
            except httpx.TransportError as exc:  # refused, reset, timed out, DNS...
                problem = f"{type(exc).__name__}: {exc or 'no detail'} ({self.url})"
            else:
                if response.status_code == 200:
                    return self.parse(_content(response)), attempt
                problem = f"HTTP {response.status_code} from {self.url}: {_short(response.text)}"
                if response.status_code not in _RETRY_STATUS:
                    hint = (
                        " (check api_key_env)"
                        if response.status_code in (401, 403)
                        else " (check base_url and model)"
                        if response.status_code == 404
                        else ""
                    )
                    raise _Failure(problem + hint)
                wait = _retry_after(response)
            if attempt >= o.retries:
                raise _Failure(f"{problem}, after {attempt} retr{'y' if attempt == 1 else 'ies'}")
            if wait is None:
                wait = o.backoff_s * (2**attempt) * (1 + 0.25 * random.random())
            wait = min(wait, 60.0)
            if deadline is not None and time.monotonic() + wait >= deadline:
                raise _Failure(f"{problem}; no time left to retry before the batch's time limit")
            time.sleep(wait)
            attempt += 1


def _content(response: Any) -> str:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Failure(f"not a chat completion: {_short(response.text)}") from None
    if not isinstance(content, str) or not content.strip():
        raise _Failure("the reply has no content (a reasoning model that ran out of max_tokens?)")
    return content


def _retry_after(response: Any) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _short(text: str, limit: int = 120) -> str:
    text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
