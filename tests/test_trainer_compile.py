"""``[model] compile``: compiled decoder layers and log-prob head give the eager results, only in
the trainer's packed forward passes, and fall back to eager code when the compiler fails."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from rlcore.interfaces import Prompt, Trajectory
from rlcore.trainer import compiling
from rlcore.trainer.batch import build_batch, pack
from rlcore.trainer.logprobs import _logit_stats, _logits_grad, token_logprobs

needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler"
)


@pytest.fixture(autouse=True)
def _kernels_off():
    yield
    compiling.enable_kernels(False)
    compiling._state["layers_failed"] = False


def _model(attention: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlcore.trainer.attention import register

    register()
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=257,
        tie_word_embeddings=True,
    )  # head size 16: flash needs a multiple of 8
    model = Qwen2ForCausalLM(config)
    model.set_attn_implementation(attention)
    return model


def _lora_b_nonzero(model):
    """peft starts lora_B at zero, which makes every lora_A gradient zero: nothing to compare."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    return model


def _micros(lengths=((5, 9), (3, 14), (7, 2)), seed: int = 1, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    trajectories = [
        Trajectory(
            prompt=Prompt(token_ids=torch.randint(0, 257, (p,), generator=g).tolist(), messages=[]),
            response_ids=torch.randint(0, 257, (r,), generator=g).tolist(),
            response_mask=[1] * r,
            rollout_logprobs=[0.0] * r,
        )
        for p, r in lengths
    ]
    batch = build_batch(trajectories, [0.0] * len(trajectories), 1)
    return pack(batch, list(range(batch.size)), 4096, device)


def _run(model, micro, temperature: float = 1.0):
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(model, micro, temperature, with_entropy=True, chunk_tokens=8, entropy_grad=False)
    weights = torch.linspace(-1.0, 2.0, lp.shape[0], device=lp.device)
    (lp * weights).sum().backward()
    return (
        lp.detach(),
        ent.detach(),
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
    )


def test_auto_compiles_on_cuda_with_one_rank_only():
    assert compiling.wanted("auto", "cuda", 1) and compiling.wanted("auto", "cuda:0", 1)
    assert not compiling.wanted("auto", "cuda", 2) and not compiling.wanted("auto", "cpu", 1)
    assert compiling.wanted(True, "cpu", 4) and not compiling.wanted(False, "cuda", 1)


def test_head_kernels_match_autograd_eagerly():
    """The two element-wise functions the head compiles, checked against autograd directly."""
    torch.manual_seed(0)
    logits = torch.randn(6, 11, requires_grad=True)
    targets = torch.tensor([0, 3, 10, 5, 5, 1])
    grad = torch.randn(6)
    for temperature in (1.0, 0.7):
        logp, entropy, lse = _logit_stats(logits.detach(), targets, temperature, True)
        reference = torch.log_softmax(logits / temperature, -1)
        torch.testing.assert_close(logp, reference.gather(-1, targets[:, None])[:, 0].detach())
        torch.testing.assert_close(entropy, -(reference.exp() * reference).sum(-1).detach())
        (expected,) = torch.autograd.grad((reference.gather(-1, targets[:, None])[:, 0] * grad).sum(), logits)
        torch.testing.assert_close(_logits_grad(logits.detach(), lse, targets, grad, temperature), expected)


@needs_compiler
@pytest.mark.parametrize(
    "attention, lora", [("sdpa", False), ("rlcore_varlen", False), ("rlcore_varlen", True)]
)
def test_compiled_layers_and_head_equal_eager(attention, lora):
    from rlcore.manifest.schema import LoraTable, ModelTable
    from rlcore.trainer.models import prepare_actor

    table = ModelTable(
        path="unused", lora=LoraTable(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None
    )
    eager = _lora_b_nonzero(prepare_actor(_model(attention), table))
    compiled = copy.deepcopy(eager)
    assert compiling.compile_decoder_layers(compiled) == 2
    assert compiling.compile_decoder_layers(compiled) == 2  # idempotent: no second wrapper
    compiling.enable_kernels()
    calls = []
    real = compiling._layer_forward
    compiling._compiled_layer_forward = None

    def counting(layer, *args, **kwargs):
        calls.append(layer)
        return real(layer, *args, **kwargs)

    compiling._layer_forward = counting
    try:
        # two micro-batches of different lengths: the second one reuses the graphs, dynamic
        for micro in (_micros()[0], _micros(((4, 6), (2, 3)), seed=2)[0]):
            for temperature in (1.0, 0.6):
                lp_a, ent_a, grads_a = _run(eager, micro, temperature)
                lp_b, ent_b, grads_b = _run(compiled, micro, temperature)
                torch.testing.assert_close(lp_b, lp_a, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(ent_b, ent_a, rtol=1e-4, atol=1e-4)
                assert grads_a.keys() == grads_b.keys()
                for name in grads_a:
                    torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-3, atol=1e-5, msg=name)
        assert calls, "the compiled layer function never ran"
        assert not compiling._state["layers_failed"]
        # Outside the trainer's packed forward (the rollout engine's generate loop) the layers run eagerly.
        calls.clear()
        with torch.no_grad():
            out = compiled.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
            ref = eager.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
        assert calls == [] and out.tolist() == ref.tolist()
    finally:
        compiling._layer_forward = real
        compiling._compiled_layer_forward = None


def test_compiler_failure_falls_back_to_eager(monkeypatch):
    eager = _model()
    compiled = copy.deepcopy(eager)
    compiling.compile_decoder_layers(compiled)
    compiling.enable_kernels()

    def broken(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("no compiler here")

        return run

    monkeypatch.setattr(compiling.torch, "compile", broken)
    monkeypatch.setattr(compiling, "_compiled_layer_forward", None)
    stats, grad = compiling._Kernel(_logit_stats.fn), compiling._Kernel(_logits_grad.fn)
    monkeypatch.setattr("rlcore.trainer.logprobs._logit_stats", stats)
    monkeypatch.setattr("rlcore.trainer.logprobs._logits_grad", grad)
    micro = _micros()[0]
    lp_a, _, grads_a = _run(eager, micro)
    lp_b, _, grads_b = _run(compiled, micro)
    torch.testing.assert_close(lp_b, lp_a)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], msg=name)
    assert compiling._state["layers_failed"] and stats.failed and grad.failed


@needs_compiler
def test_gradient_checkpointing_keeps_the_layers_eager_and_the_head_compiled():
    """A checkpointed layer is recomputed during the backward pass, outside the trainer's packed
    forward: compiled once and eager the second time, its saved tensors would differ (torch's
    CheckpointError, seen on an H200). So the layers stay eager; the head is still compiled."""
    from rlcore.manifest.schema import ModelTable
    from rlcore.trainer.models import prepare_actor

    eager = prepare_actor(_model(), ModelTable(path="unused", gradient_checkpointing=True))
    compiled = copy.deepcopy(eager)
    assert compiling.compile_decoder_layers(compiled) == 0
    compiling.enable_kernels()
    lp_a, _, grads_a = _run(eager, _micros()[0])
    lp_b, _, grads_b = _run(compiled, _micros()[0])
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-4, atol=1e-4)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-3, atol=1e-5, msg=name)
    assert _logit_stats.compiled is not None and not _logit_stats.failed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "lora, checkpointing",
    [(False, False), (True, False), (True, True)],
    ids=["full", "lora", "lora+checkpointing"],
)
def test_compiled_training_on_cuda_matches_eager(lora, checkpointing):
    """bfloat16 on the GPU with the flash varlen attention, as `[model] compile = "auto"` runs it,
    also under peft adapters and gradient checkpointing (the trainer's prepare_actor)."""
    from rlcore.manifest.schema import LoraTable, ModelTable
    from rlcore.trainer.models import prepare_actor

    table = ModelTable(
        path="unused",
        gradient_checkpointing=checkpointing,
        lora=LoraTable(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None,
    )
    eager = _lora_b_nonzero(prepare_actor(_model("rlcore_varlen").to("cuda", torch.bfloat16), table))
    compiled = copy.deepcopy(eager)
    assert compiling.compile_decoder_layers(compiled) == (0 if checkpointing else 2)
    compiling.enable_kernels()
    micro = _micros(device="cuda")[0]
    lp_a, ent_a, grads_a = _run(eager, micro)
    lp_b, ent_b, grads_b = _run(compiled, micro)
    torch.testing.assert_close(lp_b, lp_a, rtol=0.02, atol=0.05)
    torch.testing.assert_close(ent_b, ent_a, rtol=0.02, atol=0.05)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        a, b = grads_a[name].float().flatten(), grads_b[name].float().flatten()
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99, name
    assert not compiling._state["layers_failed"]
