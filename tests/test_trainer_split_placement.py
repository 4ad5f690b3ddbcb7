"""``[rollout] placement = "split"``: the engine in a process of its own, weights in buckets.

The engine process must be indistinguishable from the engine itself: the conformance kit passes
through it, the weights arrive bit for bit whatever the bucket size and transport, a failure is
raised in the trainer with the engine's own message, and a run reproduces the colocated one.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from rlcore.cli import main
from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, SamplingParams
from rlcore.manifest.loader import load_manifest
from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN_PLUGINS, read_metrics, write_run_manifest

FIXTURES = Path(__file__).parent / "fixtures"
UNTIMED = ("timing_s/", "perf/", "async/", "reward/time_s")

require_plugins(*TINY_RUN_PLUGINS)


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(UNTIMED)} for row in rows]


def _engine_process(tmp_path, tiny_model, transport: str = "shared", bucket_mb: int = 1, model_path=None):
    from rlcore.trainer.engine_process import EngineProcess
    from rlcore.trainer.models import load_tokenizer

    manifest = load_manifest(write_run_manifest(tmp_path, tiny_model))
    selected = manifest.component("rollout.engine")
    context = BuildContext.from_manifest(
        manifest, device="cpu", concurrent=True, tokenizer=load_tokenizer(manifest.core.model)
    )
    if model_path is not None:
        context.model_path = str(model_path)
    return EngineProcess(selected.component, selected.options, context, "cpu", transport, bucket_mb)


def _model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def _teacher_forced(model, prompt, response):
    from rlcore.testing.engines import teacher_forced_logprobs

    return torch.tensor(teacher_forced_logprobs(model, prompt, response, 1.0)[0])


PROMPTS = [[5, 17, 300, 42], [7, 8, 9], [1000, 2, 3, 4, 5, 6]]


@pytest.mark.slow
def test_a_split_engine_passes_the_engine_conformance_kit(tmp_path, tiny_model):
    from rlcore.testing.engines import check_rollout_engine
    from rlcore.trainer.models import load_tokenizer

    engine = _engine_process(tmp_path, tiny_model)
    try:
        model = _model(tiny_model)
        tokenizer = load_tokenizer(load_manifest(write_run_manifest(tmp_path, tiny_model)).core.model)
        results = check_rollout_engine(
            engine, vocab_size=model.config.vocab_size, tokenizer=tokenizer, reference_model=model
        )
        assert all(v == "passed" or v.startswith("skipped: ") for v in results.values()), results
        assert results["update_weights_identity"] == results["reference_logprobs"] == "passed"
    finally:
        engine.close()
    assert not engine._process.is_alive()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shared", "gloo"])
def test_weights_arrive_exactly_in_buckets_smaller_than_a_tensor(tmp_path, tiny_model, transport):
    """The embedding (vocabulary x hidden, float32) is several 1 MiB buckets: it must arrive
    whole. Sent in bfloat16, the engine gets the bfloat16 values."""
    engine = _engine_process(tmp_path, tiny_model, transport=transport, bucket_mb=1)
    try:
        model = _model(tiny_model)
        embedding = model.get_input_embeddings().weight
        assert embedding.numel() * 4 > 2 * 2**20  # split over buckets
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)
        before = engine.generate(PROMPTS, params)
        engine.update_weights(list(model.state_dict().items()))
        after = engine.generate(PROMPTS, params)
        assert [c.token_ids for (c,) in after] != [c.token_ids for (c,) in before]
        for prompt, (completion,) in zip(PROMPTS, after):
            want = _teacher_forced(model, prompt, completion.token_ids)
            assert torch.allclose(torch.tensor(completion.logprobs), want, atol=1e-5)

        engine.update_weights([(name, t.to(torch.bfloat16)) for name, t in model.state_dict().items()])
        rounded = copy.deepcopy(model)
        with torch.no_grad():
            for p in rounded.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        for prompt, (completion,) in zip(PROMPTS, engine.generate(PROMPTS, params)):
            assert torch.allclose(
                torch.tensor(completion.logprobs),
                _teacher_forced(rounded, prompt, completion.token_ids),
                atol=1e-5,
            )
    finally:
        engine.close()


@pytest.mark.slow
def test_a_rejected_update_is_raised_here_and_the_engine_stays_usable(tmp_path, tiny_model):
    engine = _engine_process(tmp_path, tiny_model)
    try:
        params = SamplingParams(max_new_tokens=5, temperature=0.0)
        reference = engine.generate(PROMPTS, params)
        big = torch.zeros(3 * 2**20, dtype=torch.uint8)  # several buckets follow the bad name
        with pytest.raises(UsageError, match="no_such.weight"):
            engine.update_weights([("no_such.weight", torch.zeros(2)), ("model.norm.weight", big)])
        with pytest.raises(ZeroDivisionError):
            engine.update_weights(_failing_stream())
        assert engine.generate(PROMPTS, params) == reference
    finally:
        engine.close()


def _failing_stream():
    yield "model.norm.weight", torch.ones(64)
    raise ZeroDivisionError("the trainer's side failed mid-sync")


@pytest.mark.slow
def test_a_dead_engine_process_is_named(tmp_path, tiny_model):
    from rlcore.trainer.engine_process import EngineProcessError

    engine = _engine_process(tmp_path, tiny_model)
    try:
        os.kill(engine.pid, signal.SIGKILL)
        engine._process.join(timeout=10)
        with pytest.raises(EngineProcessError, match=rf"pid {engine.pid}\) exited with code -9"):
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    finally:
        engine.close()


@pytest.mark.slow
def test_an_engine_that_cannot_start_says_why(tmp_path, tiny_model):
    with pytest.raises(UsageError, match="could not load \\[model\\] path .*nowhere"):
        _engine_process(tmp_path, tiny_model, model_path=tmp_path / "nowhere")


def _dense_run(tmp_path, tiny_model, name: str, **rollout):
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(
        FIXTURES / "dense_rewards.py", directory / "dense_rewards.py"
    )  # a reward that varies: weights move
    return write_run_manifest(
        directory,
        tiny_model,
        rollout=rollout,
        trainer={"steps": 3, "lr": 5e-3, "save_every": 1},
        reward={"function": "python:dense_rewards.py:upper", "method": None},
    )


@pytest.mark.slow
def test_split_runs_reproduce_the_colocated_run(tmp_path, tiny_model):
    """The same engine holding its own weights, in the trainer's process or in its own (both
    transports, buckets smaller than the embedding): the same metrics, step for step, and the
    engine's log-probs are the trainer's (a missed update would part them by far more)."""
    colocated = _dense_run(tmp_path, tiny_model, "colocated", share_actor=False)
    assert main(["run", str(colocated), "--run-dir", str(tmp_path / "colocated" / "run")]) == 0
    expected = read_metrics(tmp_path / "colocated" / "run")
    assert max(r["actor/grad_norm"] for r in expected if "actor/grad_norm" in r) > 0  # the weights moved
    for transport in ("shared", "gloo"):
        manifest = _dense_run(
            tmp_path, tiny_model, transport, placement="split", weight_transport=transport, weight_bucket_mb=1
        )
        assert main(["run", str(manifest), "--run-dir", str(tmp_path / transport / "run")]) == 0
        got = read_metrics(tmp_path / transport / "run")
        assert _untimed(got) == _untimed(expected), transport
        assert all(
            r["rollout_corr/logprob_diff/max"] < 1e-4 for r in got if "rollout_corr/logprob_diff/max" in r
        )
        assert all(r["timing_s/update_weights"] > 0 for r in got if "actor/pg_loss" in r)


@pytest.mark.slow
def test_one_step_off_policy_with_a_split_engine_stays_in_bound_and_resumes(tmp_path, tiny_model):
    manifest = _dense_run(tmp_path, tiny_model, "async", placement="split", max_staleness=1)
    run_dir = tmp_path / "async" / "run"
    assert main(["run", str(manifest), "--run-dir", str(run_dir)]) == 0
    rows = [r for r in read_metrics(run_dir) if "actor/pg_loss" in r]
    assert [r["rollout/staleness/max"] for r in rows] == [0, 1, 1]
    assert all("rollout_corr/ratio/mean" in r and 0 <= r["async/engine_busy_fraction"] <= 1 for r in rows)
    assert (
        main(["run", str(manifest), "--run-dir", str(run_dir), "--resume", "--set", "trainer.steps=5"]) == 0
    )
    rows = [r for r in read_metrics(run_dir) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["rollout/staleness/max"] for r in rows[3:]] == [1, 1]  # the saved in-flight batch first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_weights_reach_an_engine_process_on_the_gpu_through_cuda_ipc(tmp_path):
    """The trainer's CUDA tensors go through one IPC bucket buffer (tensors larger than a bucket
    split over several) into an engine process on the same GPU: its log-probs are then the
    perturbed model's, not the saved one's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlcore.registry import Registry
    from rlcore.trainer.engine_process import EngineProcess

    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8192,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "model")
    component = Registry.discover().get("rollout_engine", "hf")
    context = BuildContext(
        model_path=str(tmp_path / "model"), device="cuda:0", dtype="float32", concurrent=True
    )
    engine = EngineProcess(component, component.options(), context, "cuda:0", "shared", bucket_mb=1)
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        model.cuda()
        assert model.get_input_embeddings().weight.numel() * 4 > 2**21  # several 1 MiB buckets
        engine.update_weights(list(model.state_dict().items()))
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
        for prompt, (completion,) in zip(PROMPTS, engine.generate(PROMPTS, params)):
            want = _teacher_forced(model, prompt, completion.token_ids)
            assert torch.allclose(torch.tensor(completion.logprobs), want.cpu(), atol=2e-3)
    finally:
        engine.close()


def test_each_rank_gets_its_engine_device(tmp_path, tiny_model):
    from types import SimpleNamespace

    from rlcore.trainer.startup_checks import engine_device

    def device_for(wanted, world=1, local_rank=0, device="cuda:0"):
        manifest = load_manifest(
            write_run_manifest(tmp_path, tiny_model, rollout={"placement": "split", "engine_device": wanted})
        )
        return engine_device(manifest, SimpleNamespace(world=world, local_rank=local_rank), device)

    assert device_for(None, world=2, local_rank=1, device="cuda:1") == "cuda:1"  # the rank's own
    assert device_for("cuda:1") == "cuda:1"
    assert device_for(["cuda:4", "cuda:5"], world=2, local_rank=1) == "cuda:5"
    with pytest.raises(UsageError, match="every rank's engine on one GPU"):
        device_for("cuda:1", world=2)
    with pytest.raises(UsageError, match=r"lists 1 device\(s\), and local rank 1 needs one"):
        device_for(["cuda:4"], world=2, local_rank=1)


def test_an_engine_whose_factory_cannot_travel_is_refused_by_name(tmp_path, tiny_model):
    from rlcore.components import Component
    from rlcore.trainer.engine_process import EngineProcess, EngineProcessError

    local = Component("inline", lambda options, context: None)  # a lambda: no name to import it by
    with pytest.raises(EngineProcessError, match="'inline' cannot be sent to a process of its own"):
        EngineProcess(local, None, BuildContext(device="cpu"), "cpu")
