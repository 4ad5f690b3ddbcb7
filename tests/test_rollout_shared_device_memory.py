"""rlcore.engine_kit.device_memory: torch's cached blocks handed back before a colocated engine
wakes, and the engine allocator's out-of-memory failure reported like torch's own."""

from __future__ import annotations

import pytest
import torch

from rlcore.engine_kit import device_memory
from rlcore.engine_kit.device_memory import waking
from rlcore.trainer.phases import OutOfMemory, Timer


def test_release_cached_blocks_empties_torchs_cache_only_once_cuda_runs(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    device_memory.release_cached_blocks()
    assert emptied == []  # CUDA never started: nothing cached, and no context created for it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    device_memory.release_cached_blocks()
    assert emptied == [True]


def test_waking_releases_first_and_turns_an_allocator_failure_into_torchs_out_of_memory(monkeypatch):
    order = []
    monkeypatch.setattr(device_memory, "release_cached_blocks", lambda: order.append("released"))
    with waking("an engine waking"):
        order.append("woke")
    assert order == ["released", "woke"]
    failure = RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163")
    with pytest.raises(torch.OutOfMemoryError, match="an engine waking: CUDA Error: out of memory") as raised:
        with waking("an engine waking"):
            raise failure
    assert raised.value.__cause__ is failure
    with pytest.raises(RuntimeError, match="unrelated") as raised, waking("an engine waking"):
        raise RuntimeError("an unrelated failure")
    assert not isinstance(raised.value, torch.OutOfMemoryError)


def test_the_trainer_reports_it_as_the_generation_phase_out_of_memory_naming_the_engines_options():
    timer = Timer(knobs={"gen": "[rollout] gpu_memory_utilization (the vllm engine's)"})
    with pytest.raises(
        OutOfMemory, match=r"'gen' phase \(vLLM waking.*lower \[rollout\] gpu_memory_utilization"
    ):
        with timer("gen"), waking("vLLM waking its KV cache"):
            raise RuntimeError("CUDA Error: out of memory at cumem_allocator.cpp:163")
