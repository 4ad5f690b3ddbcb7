"""The lm_head's hand-written backward (entropy as a metric) against autograd through the
checkpointed log-softmax: the same log-probs, entropy and gradients of every parameter."""

from __future__ import annotations

import copy

import pytest
import torch

from rlcore.interfaces import Prompt, Trajectory
from rlcore.trainer.batch import build_batch, pack
from rlcore.trainer.logprobs import token_logprobs


def _model(bias: bool, tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=257,
        tie_word_embeddings=tied,
    )
    model = Qwen2ForCausalLM(config)
    if bias:  # no transformers LM has a head bias by default; check the code path anyway
        model.lm_head.bias = torch.nn.Parameter(torch.randn(config.vocab_size) * 0.1)
    return model


def _micro():
    g = torch.Generator().manual_seed(1)
    trajectories = [
        Trajectory(
            prompt=Prompt(token_ids=torch.randint(0, 257, (p,), generator=g).tolist(), messages=[]),
            response_ids=torch.randint(0, 257, (r,), generator=g).tolist(),
            response_mask=[1] * r,
            rollout_logprobs=[0.0] * r,
        )
        for p, r in [(5, 9), (3, 14), (7, 2)]
    ]
    batch = build_batch(trajectories, [0.0] * 3, 1)
    return pack(batch, list(range(batch.size)), 4096)[0]


def _run(model, micro, entropy_grad: bool, temperature: float, chunk_tokens: int):
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(
        model, micro, temperature, with_entropy=True, chunk_tokens=chunk_tokens, entropy_grad=entropy_grad
    )
    weights = torch.linspace(-1.0, 2.0, lp.shape[0])  # an uneven loss, like advantages
    (lp * weights).sum().backward()
    return (
        lp.detach(),
        ent.detach(),
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
    )


@pytest.mark.parametrize("bias, tied", [(False, True), (True, False)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_hand_written_head_backward_equals_autograd(bias, tied, temperature):
    reference = _model(bias, tied)
    fused = copy.deepcopy(reference)
    micro = _micro()
    lp_a, ent_a, grads_a = _run(reference, micro, entropy_grad=True, temperature=temperature, chunk_tokens=8)
    lp_b, ent_b, grads_b = _run(fused, micro, entropy_grad=False, temperature=temperature, chunk_tokens=8)
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=1e-5, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    assert {
        "lm_head.weight",
        "model.embed_tokens.weight",
    } & grads_a.keys()  # the head (or its tied embedding)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)


def test_entropy_is_a_metric_without_gradient_on_the_fast_path():
    model = _model(False, True)
    lp, ent = token_logprobs(model, _micro(), with_entropy=True, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad and bool((ent > 0).all())
