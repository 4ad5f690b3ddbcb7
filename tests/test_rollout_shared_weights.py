"""rlcore.engine_kit.weights: buckets, safetensors shards and PEFT adapter directories, read back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from rlcore.engine_kit.weights import adapter_config, adapter_name, buckets, write_adapter, write_shards
from rlcore.errors import UsageError


def _tensors():
    torch.manual_seed(0)
    return {
        "a.weight": torch.randn(256),
        "b.weight": torch.randn(256),
        "c.weight": torch.randn(1024),
        "d.bias": torch.randn(8),
    }


def test_buckets_stay_under_the_limit_keep_order_and_let_a_big_tensor_travel_alone():
    tensors = _tensors()  # 1 KiB, 1 KiB, 4 KiB, 32 B
    got = list(buckets(tensors, 2048))
    assert [[n for n, _ in b] for b in got] == [["a.weight", "b.weight"], ["c.weight"], ["d.bias"]]
    assert [[n for n, _ in b] for b in buckets(list(tensors.items()), 1 << 20)] == [list(tensors)]
    assert list(buckets({}, 10)) == []


def test_buckets_detach():
    w = torch.nn.Parameter(torch.ones(3))
    ((name, t),) = next(buckets({"w": w}, 100))
    assert not t.requires_grad and t.data_ptr() == w.data_ptr()


def test_write_shards_takes_views_of_one_allocation(tmp_path):
    """The hf engine lays a shared actor's gate and up weights back to back in one allocation
    (views of one storage); the shards a server loads must take them as they are (safetensors
    refuses only tensors that overlap)."""
    block = torch.arange(24.0).reshape(6, 4)
    gate, up = block[:3], block[3:]
    (shard,) = write_shards({"gate.weight": gate, "up.weight": up}.items(), tmp_path / "ck", 1 << 20)
    loaded = load_file(str(shard))
    assert torch.equal(loaded["gate.weight"], gate) and torch.equal(loaded["up.weight"], up)


def test_write_shards_round_trips_with_an_index(tmp_path):
    tensors = _tensors()
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "stale.safetensors").write_text("old")
    shards = write_shards(tensors.items(), tmp_path / "ck", 2048)
    assert [p.name for p in shards] == [
        "model-00001.safetensors",
        "model-00002.safetensors",
        "model-00003.safetensors",
    ]
    assert not (tmp_path / "ck" / "stale.safetensors").exists()
    loaded = {}
    for p in shards:
        loaded.update(load_file(str(p)))
    assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["c.weight"] == "model-00002.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in tensors.values())
    write_shards(tensors, tmp_path / "plain", 1 << 20, index=False)
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["model-00001.safetensors"]
    with pytest.raises(UsageError, match="update_weights received no tensors"):
        write_shards([], tmp_path / "none", 10)


def test_adapter_config_from_the_shapes_engines_are_given():
    plain = adapter_config({"rank": 8, "alpha": 16, "target_modules": ("q_proj", "v_proj")})
    assert plain["r"] == 8 and plain["lora_alpha"] == 16.0 and plain["target_modules"] == ["q_proj", "v_proj"]
    assert plain["peft_type"] == "LORA" and plain["inference_mode"] and plain["lora_dropout"] == 0.0
    assert adapter_config({"r": 4, "lora_alpha": 8})["target_modules"] == "all-linear"
    table = SimpleNamespace(rank=2, alpha=4, target_modules="all-linear", dropout=0.1)
    assert adapter_config(table)["r"] == 2 and adapter_config(table)["lora_dropout"] == 0.1
    peft = {"peft_type": "LORA", "r": 3, "lora_alpha": 6, "custom": 1}
    assert adapter_config(peft) == peft
    assert adapter_config(SimpleNamespace(rank=1, alpha=1, peft_config=peft)) == peft
    with pytest.raises(UsageError, match="needs the adapter's rank and alpha"):
        adapter_config({"target_modules": ["q_proj"]})


def test_adapter_name():
    assert adapter_name({"rank": 1, "alpha": 1}) == "rlcore"
    assert adapter_name(SimpleNamespace(name="mine")) == "mine"
    assert adapter_name({"name": "d"}) == "d"


def test_write_adapter_writes_a_peft_directory_and_refuses_non_lora_tensors(tmp_path):
    tensors = {
        "base_model.model.q_proj.lora_A.weight": torch.randn(4, 16),
        "base_model.model.q_proj.lora_B.weight": torch.zeros(16, 4),
    }
    out = write_adapter(
        tensors.items(), {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}, tmp_path / "ad"
    )
    loaded = load_file(str(out / "adapter_model.safetensors"))
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    with pytest.raises(
        UsageError, match=r"only LoRA adapter tensors \(PEFT names\), got e.g. 'model.q_proj.weight'"
    ):
        write_adapter({"model.q_proj.weight": torch.ones(1)}, {"rank": 1, "alpha": 1}, tmp_path / "bad")
    with pytest.raises(UsageError, match="received no adapter tensors"):
        write_adapter({}, {"rank": 1, "alpha": 1}, tmp_path / "empty")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "empty").exists()


def test_the_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, rlcore.engine_kit.weights, rlcore.engine_kit.samples; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
