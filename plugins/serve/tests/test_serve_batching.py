"""rlcore_serve.batching: which waiting requests share an engine call. The engine is the scripted
one (its ``generate`` takes no per-prompt budgets), held busy on a first request so that the
others queue up before the worker looks at them."""

from __future__ import annotations

import threading

import pytest
from rlcore_serve.batching import Batcher

from rlcore.interfaces import SamplingParams
from rlcore.testing.tools import ScriptedEngine, make_chat_tokenizer


class HeldEngine(ScriptedEngine):
    """Records each call's (prompts, params); the first call waits until ``release``."""

    def __init__(self):
        super().__init__(make_chat_tokenizer(), lambda text, i: f"answer {i}")
        self.log: list[tuple[list[list[int]], SamplingParams]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def generate(self, prompts, params):
        self.log.append(([list(p) for p in prompts], params))
        self.entered.set()
        assert self.gate.wait(30)
        return super().generate(prompts, params)


def _params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_new_tokens": 8, **kw})


def _queue_behind_a_busy_engine(batcher: Batcher, engine: HeldEngine, requests):
    """Submit one request that occupies the engine, then ``requests`` while it is busy; return
    the futures of ``requests`` once all are waiting, with the engine released."""
    batcher.submit([[1]], _params())
    assert engine.entered.wait(10)
    futures = [batcher.submit(prompts, params) for prompts, params in requests]
    assert batcher.waiting() == len(requests)
    return futures


def test_only_equal_sampling_parameters_share_a_call():
    engine = HeldEngine()
    batcher = Batcher(engine)
    requests = [
        ([[2]], _params(temperature=0.5)),
        ([[3]], _params(temperature=0.9)),
        ([[4], [5]], _params(temperature=0.5)),
        ([[6]], _params(temperature=0.5, max_new_tokens=4)),  # this engine has no per-prompt budgets
        ([[7]], _params(temperature=0.5, seed=1)),  # a seeded request runs alone
        ([[8]], _params(temperature=0.5, seed=1)),
    ]
    futures = _queue_behind_a_busy_engine(batcher, engine, requests)
    engine.gate.set()
    results = [f.result(30) for f in futures]
    assert [prompts for prompts, _ in engine.log] == [[[1]], [[2], [4], [5]], [[3]], [[6]], [[7]], [[8]]]
    assert batcher.calls == [1, 2, 1, 1, 1, 1]
    assert [len(r.groups) for r in results] == [1, 1, 2, 1, 1, 1]
    answer = engine.tokenizer.encode("answer 0", add_special_tokens=False)
    assert results[2].groups[1][0].token_ids[: len(answer)] == answer


def test_max_batch_size_bounds_the_sequences_of_one_call():
    engine = HeldEngine()
    batcher = Batcher(engine, max_batch_size=4)
    requests = [
        ([[2]], _params(n=2)),
        ([[3]], _params(n=2)),
        ([[4]], _params(n=2)),
        ([[5], [6], [7], [8], [9]], _params(n=2)),
    ]
    futures = _queue_behind_a_busy_engine(batcher, engine, requests)
    engine.gate.set()
    for f in futures:
        f.result(30)
    # two requests of 2 sequences fill a call; a request larger than the bound runs alone
    assert [len(prompts) * params.n for prompts, params in engine.log[1:]] == [4, 2, 10]
    assert batcher.calls == [1, 2, 1, 1]


def test_a_cancelled_waiting_request_is_skipped_and_the_worker_carries_on():
    engine = HeldEngine()
    batcher = Batcher(engine)
    gone, kept = _queue_behind_a_busy_engine(
        batcher, engine, [([[2]], _params()), ([[3]], _params(temperature=0.3))]
    )
    assert gone.cancel()  # the client went away while queued
    engine.gate.set()
    assert len(kept.result(30).groups) == 1
    assert [prompts for prompts, _ in engine.log] == [[[1]], [[3]]]
    later = batcher.submit([[4]], _params())
    assert len(later.result(30).groups) == 1


def test_an_engine_error_reaches_the_request_and_the_worker_survives():
    engine = HeldEngine()
    engine.gate.set()
    batcher = Batcher(engine)
    engine.generate = lambda prompts, params: (_ for _ in ()).throw(ValueError("engine says no"))  # type: ignore[method-assign]
    bad = batcher.submit([[1]], _params(n=3))
    with pytest.raises(ValueError, match="engine says no"):
        bad.result(30)
    del engine.generate
    good = batcher.submit([[2]], _params())
    assert len(good.result(30).groups) == 1
