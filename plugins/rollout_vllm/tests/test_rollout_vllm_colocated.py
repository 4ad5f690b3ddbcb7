"""The colocated engine's sleep / weight update / wake-up sequence against a fake ``vllm.LLM``
(no vLLM import): what is woken when, torch's cached blocks handed back before each wake-up, and
weights loaded as real tensors even while an FP8 model's layerwise reload holds its parameters on
the meta device."""

from __future__ import annotations

import functools

import pytest
import torch
from rlcore_rollout_vllm import colocated
from rlcore_rollout_vllm.colocated import VLLMColocatedEngine
from rlcore_rollout_vllm.options import VLLMOptions

from rlcore.engine_kit import device_memory


class ReloadingModel(torch.nn.Module):
    """A worker's model during a layerwise reload: parameters on the meta device; ``load_weights``
    records what it was given, as vLLM's models copy it into their rebuilt layers."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights):
        self.loaded.extend(weights)
        return {name for name, _ in self.loaded}


class FakeLLM:
    """Shaped like ``vllm.LLM``'s sleep and weight-loading methods; records every call."""

    def __init__(self, calls: list):
        self.calls = calls
        self.model = ReloadingModel()
        self.wake_failure: Exception | None = None

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))
        if self.wake_failure is not None:
            raise self.wake_failure

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", None))

    def apply_model(self, fn):
        inner = fn.func if isinstance(fn, functools.partial) else fn
        self.calls.append(("apply_model", inner.__name__))
        if inner is colocated._load_bucket:
            return [fn(self.model)]
        return [None]  # the reload's begin and finish need vLLM itself

    @property
    def llm_engine(self):
        return type("Engine", (), {"model_config": None})()


@pytest.fixture
def engine(monkeypatch):
    calls: list = []
    monkeypatch.setattr(
        device_memory, "release_cached_blocks", lambda: calls.append(("release_cached_blocks", None))
    )

    def build(**options) -> VLLMColocatedEngine:
        made = VLLMColocatedEngine.__new__(VLLMColocatedEngine)  # no vLLM: the fake stands in for LLM(...)
        made.options = VLLMOptions(**options)
        made.llm, made.version, made.multiprocess = FakeLLM(calls), "0.26.0", False
        made.asleep = made._weights_asleep = False
        made.weight_version = 0
        return made

    build.calls = calls
    return build


def test_sleep_update_wake_hands_torch_cache_back_before_each_wake_up(engine):
    made = engine(sleep_level=1)
    made.sleep()
    made.update_weights([("w", torch.ones(2))])
    made.wake_up()
    made.sleep()
    made.wake_up()  # no update in between: weights and cache wake together
    assert engine.calls == [
        ("reset_prefix_cache", None),
        ("sleep", 1),
        ("release_cached_blocks", None),
        ("wake_up", ["weights"]),
        ("apply_model", "_load_bucket"),
        ("reset_prefix_cache", None),
        ("release_cached_blocks", None),
        ("wake_up", ["kv_cache"]),
        ("reset_prefix_cache", None),
        ("sleep", 1),
        ("release_cached_blocks", None),
        ("wake_up", None),
    ]


def test_fp8_update_loads_real_tensors_while_the_reload_holds_parameters_on_meta(engine):
    made = engine(quantization="fp8")
    made.update_weights([("model.embed_tokens.weight", torch.ones(3, 4)), ("lm_head.weight", torch.ones(2))])
    applied = [name for kind, name in engine.calls if kind == "apply_model"]
    assert applied == ["_begin_quantized_reload", "_load_bucket", "_finish_quantized_reload"]
    loaded = made.llm.model.loaded
    assert [name for name, _ in loaded] == ["model.embed_tokens.weight", "lm_head.weight"]
    # Before the fix the worker's device came from its (meta) parameters: vLLM then failed with
    # "Cannot copy out of meta tensor; no data!" at the first FP8 update (H100, 2026-12-06).
    assert all(t.device.type != "meta" for _, t in loaded)
    assert torch.equal(loaded[0][1], torch.ones(3, 4))


def test_vllms_own_out_of_memory_at_wake_up_becomes_torchs(engine):
    made = engine()
    made.sleep()
    made.llm.wake_failure = RuntimeError(
        "CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163"
    )
    with pytest.raises(
        torch.OutOfMemoryError, match="vLLM 0.26.0 waking its weights and KV cache: CUDA Error"
    ):
        made.wake_up()
    assert made.asleep  # still asleep: a later wake-up tries again
    made.llm.wake_failure = None
    made.wake_up()
    assert not made.asleep
