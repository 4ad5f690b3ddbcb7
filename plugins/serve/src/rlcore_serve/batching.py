"""Batching the server's requests into engine calls.

One worker thread owns the engine (engines are not required to be thread-safe). Whenever the
engine is free it takes the oldest waiting request and every other waiting request that can share
its engine call, up to ``max_batch_size`` sequences (prompts x n), and generates them together:
a long request no longer holds all the others behind it for a whole generation of its own.

Requests share a call when their sampling parameters are equal except ``max_new_tokens``, which
an engine whose ``generate`` takes per-prompt ``max_new_tokens`` (the ``hf`` engine) caps per
prompt; other engines also need equal budgets. A request with a ``seed`` always runs alone, so
that its answer does not depend on which requests arrived beside it. When a shared call fails,
each of its requests is run again alone, so that one bad request fails only itself.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlcore.interfaces import Completion, RolloutEngine, SamplingParams

logger = logging.getLogger("rlcore.serve")

# Per sample, per generated token: the top tokens as (token id, log-prob), most likely first.
TopLogprobs = list[list[tuple[int, float]]]


@dataclass
class Result:
    """One request's answer: ``groups[p][s]`` is sample ``s`` of prompt ``p``; ``top[p][s]`` its
    top log-probs (empty lists when none were asked for)."""

    groups: list[list[Completion]]
    top: list[list[TopLogprobs]]


@dataclass
class _Job:
    prompts: list[list[int]]
    params: SamplingParams
    top_logprobs: int
    key: str
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.params.n


def reports_top_logprobs(engine: Any) -> bool:
    """Whether the engine can say which tokens were most likely at each generated position: a
    ``top_logprobs(prompts, completions, k, temperature)`` method (the ``hf`` engine has one)."""
    return callable(getattr(engine, "top_logprobs", None))


def _caps_per_prompt(engine: Any) -> bool:
    try:
        return "max_new_tokens" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False


class Batcher:
    """Runs :meth:`submit`-ted requests on ``engine`` from one worker thread, batched as the module
    docstring says. ``calls`` records the number of requests in each engine call."""

    def __init__(self, engine: RolloutEngine, max_batch_size: int = 64):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.calls: list[int] = []
        self._per_prompt = _caps_per_prompt(engine)
        self._waiting: list[_Job] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._serial = 0

    def submit(
        self, prompts: list[list[int]], params: SamplingParams, top_logprobs: int = 0
    ) -> concurrent.futures.Future:
        """Queue one request; the future resolves to a :class:`Result` or to the engine's exception."""
        shared = params.model_dump(exclude={"max_new_tokens"} if self._per_prompt else set())
        with self._cond:
            if params.seed is not None:
                self._serial += 1
                shared["alone"] = self._serial
            job = _Job(prompts, params, top_logprobs, json.dumps(shared, sort_keys=True))
            self._waiting.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="rlcore-serve-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return job.future

    def waiting(self) -> int:
        """Requests queued and not yet handed to the engine."""
        with self._cond:
            return len(self._waiting)

    def _next_batch(self) -> list[_Job]:
        """The oldest waiting request and those that can join its call. A request whose future
        was cancelled is dropped; the others are marked running, after which they can no longer
        be cancelled (setting the result of a cancelled future would raise in the worker)."""
        with self._cond:
            while True:
                while not self._waiting:
                    self._cond.wait()
                head = self._waiting[0]
                batch, size, rest = [], 0, []
                for job in self._waiting:
                    if job.key == head.key and (not batch or size + job.sequences <= self.max_batch_size):
                        if job.future.set_running_or_notify_cancel():
                            batch.append(job)
                            size += job.sequences
                    else:
                        rest.append(job)
                self._waiting = rest
                if batch:
                    return batch

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            try:
                results = self._run(batch)
            except BaseException as exc:  # noqa: BLE001 - handed to the requests, never kills the worker
                if len(batch) == 1:
                    batch[0].future.set_exception(exc)
                    continue
                logger.warning(
                    "an engine call for %d requests failed (%s); running each alone", len(batch), exc
                )
                for job in batch:
                    try:
                        [result] = self._run([job])
                    except BaseException as alone:  # noqa: BLE001
                        job.future.set_exception(alone)
                    else:
                        job.future.set_result(result)
                continue
            for job, result in zip(batch, results):
                job.future.set_result(result)

    def _run(self, batch: list[_Job]) -> list[Result]:
        self.calls.append(len(batch))
        prompts = [p for job in batch for p in job.prompts]
        budgets = [job.params.max_new_tokens for job in batch for _ in job.prompts]
        params = batch[0].params.model_copy(update={"max_new_tokens": max(budgets)})
        if self._per_prompt and len(set(budgets)) > 1:
            groups = self.engine.generate(prompts, params, max_new_tokens=budgets)  # type: ignore[call-arg]
        else:
            groups = self.engine.generate(prompts, params)
        if len(groups) != len(prompts):
            raise RuntimeError(f"the engine returned {len(groups)} groups for {len(prompts)} prompts")
        results, at = [], 0
        for job in batch:
            mine = [list(g) for g in groups[at : at + len(job.prompts)]]
            at += len(job.prompts)
            results.append(Result(mine, self._top(job, mine)))
        return results

    def _top(self, job: _Job, groups: list[list[Completion]]) -> list[list[TopLogprobs]]:
        if job.top_logprobs <= 0:
            return [[[] for _ in group] for group in groups]
        pairs = [(prompt, c.token_ids) for prompt, group in zip(job.prompts, groups) for c in group]
        flat: Sequence[TopLogprobs] = self.engine.top_logprobs(  # type: ignore[attr-defined]
            [p for p, _ in pairs], [list(t) for _, t in pairs], job.top_logprobs, job.params.temperature
        )
        out, at = [], 0
        for group in groups:
            out.append([list(x) for x in flat[at : at + len(group)]])
            at += len(group)
        return out
