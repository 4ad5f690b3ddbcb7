"""Options and translation checked against SGLang 0.5.23's real names (data files), and the
colocated engine driven through a fake ``sglang.Engine`` answering in SGLang's documented shapes.
No SGLang import anywhere."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from rlcore_rollout_sglang.colocated import SGLangColocatedEngine, import_sglang
from rlcore_rollout_sglang.names import names
from rlcore_rollout_sglang.options import SGLangOptions
from rlcore_rollout_sglang.translate import (
    GENERATE_FIELDS,
    engine_kwargs,
    generate_body,
    group_outputs,
    sampling_params,
)

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, SamplingParams
from rlcore.testing import require_plugins


def test_name_lists_are_the_real_ones():
    server = names("server-args")
    assert len(server) > 400
    assert {
        "tp_size",
        "mem_fraction_static",
        "disable_radix_cache",
        "enable_memory_saver",
        "skip_tokenizer_init",
    } <= server
    assert "gpu_memory_utilization" not in server and "tensor_parallel_size" not in server
    assert {"max_new_tokens", "sampling_seed", "stop_token_ids", "no_stop_trim"} <= names("sampling-params")
    assert "max_tokens" not in names("sampling-params")


def test_every_produced_name_exists_in_sglang():
    aliased = SGLangOptions(
        gpu_memory_utilization=0.3, tp_size=2, max_num_seqs=8, max_model_len=64, seed=5, enforce_eager=True
    )
    assert (
        aliased.mem_fraction_static,
        aliased.tensor_parallel_size,
        aliased.max_running_requests,
        aliased.context_length,
        aliased.random_seed,
        aliased.disable_cuda_graph,
    ) == (0.3, 2, 8, 64, 5, True)
    opts = SGLangOptions(
        gpu_memory_utilization=0.3,
        tp_size=2,
        max_running_requests=64,
        context_length=1024,
        enable_prefix_caching=False,
        lora_rank=16,
        engine_args={"chunked_prefill_size": 4096},
    )
    kwargs = engine_kwargs(opts, BuildContext(model_path="/m", dtype="bfloat16", seed=3))
    assert set(kwargs) <= names("server-args")
    assert (
        kwargs["mem_fraction_static"] == 0.3
        and kwargs["tp_size"] == 2
        and kwargs["disable_radix_cache"] is True
    )
    assert (
        kwargs["random_seed"] == 3 and kwargs["dtype"] == "bfloat16" and kwargs["skip_tokenizer_init"] is True
    )
    assert (
        kwargs["enable_memory_saver"]
        and kwargs["enable_weights_cpu_backup"]
        and kwargs["max_lora_rank"] == 16
    )
    assert "enable_weights_cpu_backup" not in engine_kwargs(
        SGLangOptions(sleep_level=2), BuildContext(model_path="/m")
    )
    params = SamplingParams(
        n=2, temperature=0.7, top_k=0, stop=["\n"], stop_token_ids=[2], seed=1, max_new_tokens=9
    )
    sp = sampling_params(params)
    assert set(sp) <= names("sampling-params")
    assert sp == {
        "n": 2,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 9,
        "stop_token_ids": [2],
        "stop": ["\n"],
        "no_stop_trim": True,
        "sampling_seed": 1,
    }
    body = generate_body([1, 2], params, "adapter")
    assert set(body) <= GENERATE_FIELDS and body["input_ids"] == [[1, 2]] and body["lora_path"] == ["adapter"]
    assert sampling_params(SamplingParams(n=4, temperature=0.0))["n"] == 1


def test_gguf_and_missing_model_are_usage_errors():
    with pytest.raises(UsageError, match="model"):
        engine_kwargs(SGLangOptions(), BuildContext())
    with pytest.raises(UsageError, match="gguf"):
        engine_kwargs(SGLangOptions(), BuildContext(model_path="/m", gguf_file="x.gguf"))


def _error(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        SGLangOptions(**kwargs)
    return str(info.value)


def test_unknown_engine_arg_names_the_valid_ones():
    msg = _error(engine_args={"chunked_prefil_size": 1})
    assert "did you mean 'chunked_prefill_size'" in msg and "Valid names:" in msg and "SGLang 0.5.23" in msg


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(engine_args={"mem_fraction_static": 0.3}), "set rollout.mem_fraction_static instead"),
        (dict(engine_args={"disable_radix_cache": True}), "set rollout.enable_prefix_caching instead"),
        (dict(gpu_memory_utilization=0.3, mem_fraction_static=0.2), "two names for the same option"),
        (dict(mem_fraction_static=1.0), "less than 1"),
        (dict(tp_size=0), "greater than or equal to 1"),
        (dict(mode="server"), "needs servers"),
        (dict(servers=["http://a:1"]), "only used with mode = 'server'"),
        (dict(mode="server", servers=["a:1"]), "base URL"),
        (dict(sleep_level=3), "sleep_level"),
    ],
)
def test_bad_values(kwargs, needle):
    assert needle in _error(**kwargs)


def test_rlcore_validate_rejects_bad_sglang_options(tmp_path):
    manifest = tmp_path / "run.toml"
    manifest.write_text(
        '[model]\npath = "m"\n[data]\ntrain = "synthetic:addition"\n[reward]\nfunction = "exact_match"\n'
        '[trainer]\nsteps = 1\n[rollout]\nengine = "sglang"\nmem_fraction_statik = 0.3\n'
        "engine_args = { disable_cuda_grahp = true }\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "validate", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "rollout.mem_fraction_statik" in out and "mem_fraction_static" in out
    assert "disable_cuda_grahp" in out and "did you mean 'disable_cuda_graph'" in out
    assert "Traceback" not in out


def test_rlcore_validate_accepts_the_vllm_names_and_checks_their_ranges(tmp_path):
    require_plugins("rlcore_reward_rule", "rlcore_algo_grpo")  # exact_match, grpo (the default estimator)
    manifest = tmp_path / "run.toml"
    head = (
        '[model]\npath = "m"\n[data]\ntrain = "synthetic:addition"\n[reward]\nfunction = "exact_match"\n'
        '[trainer]\nsteps = 1\n[rollout]\nengine = "sglang"\nsamples_per_prompt = 4\nenforce_eager = true\n'
    )
    manifest.write_text(head + "gpu_memory_utilization = 0.3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "validate", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest.write_text(head + "gpu_memory_utilization = 1.5\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "validate", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        proc.returncode != 0
        and "run.toml:13: [rollout.gpu_memory_utilization] Input should be less than 1"
        in proc.stdout + proc.stderr
    )


def test_plugin_module_imports_nothing_heavy():
    code = "import sys, rlcore_rollout_sglang.plugin; print('torch' in sys.modules, 'sglang' in sys.modules, 'httpx' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert out == "False False False"


# ----------------------------------------------------------------------------- answers


def _answer(ids, lps, finish):
    return {
        "output_ids": ids,
        "meta_info": {
            "id": "x",
            "finish_reason": finish,
            "prompt_tokens": 1,
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids)],
        },
    }


def test_answers_are_grouped_prompt_major_and_checked():
    flat = [
        _answer([p * 10 + j], [-0.1 * j], {"type": "length", "length": 1}) for p in range(2) for j in range(3)
    ]
    groups = group_outputs(flat, 2, 3, "here")
    assert [[c.token_ids for c in g] for g in groups] == [[[0], [1], [2]], [[10], [11], [12]]]
    one = group_outputs(_answer([5, 6], [-1.0, -2.0], {"type": "stop", "matched": 6}), 1, 1, "here")[0][0]
    assert one.finish_reason == "stop" and one.logprobs == [-1.0, -2.0]
    with pytest.raises(RlcoreError, match="here: unexpected SGLang answer.*expected 2 x 3"):
        group_outputs(flat[:5], 2, 3, "here")
    mismatched = _answer([5], [-1.0], {"type": "length"})
    mismatched["meta_info"]["output_token_logprobs"] = [(-1.0, 4, None)]
    with pytest.raises(RlcoreError, match="for token 4"):
        group_outputs(mismatched, 1, 1, "here")
    with pytest.raises(RlcoreError, match="aborted.*out of memory"):
        group_outputs(_answer([1], [-1.0], {"type": "abort", "message": "out of memory"}), 1, 1, "here")


# ----------------------------------------------------------------------------- colocated, with a fake Engine


class FakeEngine:
    """Shaped like ``sglang.Engine`` 0.5.23: same method names and keyword arguments, answers in
    its documented formats; tokens are a deterministic function of the prompt."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple[str, dict]] = []
        self.reject_weights = False

    def generate(self, *, input_ids, sampling_params, return_logprob, lora_path=None):
        self.calls.append(
            ("generate", dict(input_ids=input_ids, sampling_params=sampling_params, lora_path=lora_path))
        )
        assert return_logprob is True and set(sampling_params) <= names("sampling-params")
        out = []
        for prompt in input_ids:
            for j in range(sampling_params["n"]):
                ids = [(sum(prompt) + 3 * k + j) % 50 for k in range(sampling_params["max_new_tokens"])]
                out.append(_answer(ids, [-0.01 * t for t in ids], {"type": "length", "length": len(ids)}))
        return out

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", {"tags": tags}))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", {"tags": tags}))

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update", {"names": [n for n, _ in named_tensors], "flush_cache": flush_cache}))
        return (
            (False, "size mismatch") if self.reject_weights else (True, "Succeeded to update model weights.")
        )

    def load_lora_adapter(self, lora_name, lora_path, pinned=False):
        self.calls.append(("load_lora", {"lora_name": lora_name, "lora_path": lora_path}))
        return SimpleNamespace(success=True, error_message=None, loaded_adapters={lora_name: lora_path})

    def unload_lora_adapter(self, lora_name):
        self.calls.append(("unload_lora", {"lora_name": lora_name}))
        return SimpleNamespace(success=True, error_message=None, loaded_adapters={})

    def shutdown(self):
        self.calls.append(("shutdown", {}))


class CharTokenizer:
    """Token t decodes to chr(ord('a') + t % 26)."""

    def decode(self, ids, **_):
        return "".join(chr(ord("a") + t % 26) for t in ids)


def _colocated(**kw):
    engines = []

    def factory(**kwargs):
        engines.append(FakeEngine(**kwargs))
        return engines[-1]

    engine = SGLangColocatedEngine(
        SGLangOptions(**kw), BuildContext(model_path="/m", tokenizer=CharTokenizer()), engine_factory=factory
    )
    return engine, engines[0]


def test_colocated_generates_from_token_ids_with_the_right_kwargs():
    engine, fake = _colocated(lora_rank=8)
    assert fake.kwargs["skip_tokenizer_init"] is True and fake.kwargs["model_path"] == "/m"
    out = engine.generate([[1, 2], [5]], SamplingParams(n=2, max_new_tokens=3))
    assert [[c.token_ids for c in g] for g in out] == [[[3, 6, 9], [4, 7, 10]], [[5, 8, 11], [6, 9, 12]]]
    assert out[0][1].logprobs == [-0.04, -0.07, -0.1]
    greedy = engine.generate([[1]], SamplingParams(n=3, temperature=0.0, max_new_tokens=2))[0]
    assert len(greedy) == 3 and fake.calls[-1][1]["sampling_params"]["n"] == 1


def test_colocated_cuts_at_stop_strings_with_the_run_tokenizer():
    engine, fake = _colocated()
    # prompt [1, 2] sample 0 gives tokens 3, 6, 9, 12 -> "d", "g", "j", "m"
    c = engine.generate([[1, 2]], SamplingParams(max_new_tokens=4, stop=["gj"]))[0][0]
    assert c.token_ids == [3, 6, 9] and c.finish_reason == "stop" and len(c.logprobs) == 3
    assert "stop" not in fake.calls[-1][1]["sampling_params"]  # SGLang has no tokenizer here
    untouched = engine.generate([[1, 2]], SamplingParams(max_new_tokens=4, stop=["zz"]))[0][0]
    assert untouched.token_ids == [3, 6, 9, 12] and untouched.finish_reason == "length"


def test_colocated_sleep_update_wake_sequence_and_buckets(monkeypatch):
    from rlcore.engine_kit import device_memory

    engine, fake = _colocated(weight_bucket_mb=1)
    # torch's cached blocks go back to the driver before SGLang maps its memory again
    monkeypatch.setattr(
        device_memory, "release_cached_blocks", lambda: fake.calls.append(("release_cached", {}))
    )
    engine.sleep()
    with pytest.raises(RlcoreError, match="asleep"):
        engine.generate([[1]], SamplingParams())
    tensors = [
        ("a.weight", torch.zeros(600, 512)),
        ("b.weight", torch.zeros(8, 8)),
        ("c.bias", torch.zeros(4)),
    ]
    engine.update_weights(tensors)
    engine.wake_up()
    assert [(n, c) for n, c in fake.calls] == [
        ("release", {"tags": None}),
        ("release_cached", {}),
        ("resume", {"tags": ["weights"]}),
        ("update", {"names": ["a.weight"], "flush_cache": False}),
        ("update", {"names": ["b.weight", "c.bias"], "flush_cache": True}),
        ("release_cached", {}),
        ("resume", {"tags": ["kv_cache", "cuda_graph"]}),
    ]
    engine.sleep()
    engine.wake_up()
    assert fake.calls[-2:] == [("release_cached", {}), ("resume", {"tags": None})]
    fake.reject_weights = True
    with pytest.raises(RlcoreError, match="size mismatch"):
        engine.update_weights(tensors[:1])
    with pytest.raises(RlcoreError, match="no tensors"):
        engine.update_weights([])


def test_colocated_lora_load_then_switch():
    engine, fake = _colocated(lora_rank=8)
    adapter = [("base_model.model.layers.0.q_proj.lora_A.weight", torch.zeros(4, 8))]
    engine.update_weights(adapter, lora={"rank": 4, "alpha": 8})
    engine.update_weights(adapter, lora={"rank": 4, "alpha": 8})
    assert [c[1]["lora_name"] for c in fake.calls if c[0] in ("load_lora", "unload_lora")] == [
        "rlcore-lora-v1",
        "rlcore-lora-v2",
        "rlcore-lora-v1",
    ]
    engine.generate([[1], [2]], SamplingParams(max_new_tokens=1))
    assert fake.calls[-1][1]["lora_path"] == ["rlcore-lora-v2", "rlcore-lora-v2"]
    root = engine._adapters.root  # the unloaded adapter's files go; the loaded one's stay until close
    assert [p.name for p in root.iterdir()] == ["rlcore-lora-v2"]
    with pytest.raises(UsageError, match="above rollout.lora_rank"):
        engine.update_weights(adapter, lora={"rank": 16, "alpha": 8})
    engine.close()
    assert not root.exists()
    plain, _ = _colocated()
    with pytest.raises(UsageError, match="lora_rank"):
        plain.update_weights(adapter, lora={"rank": 4, "alpha": 8})
    assert plain._adapters.root is None  # no adapter, no folder


def test_colocated_reports_rejected_engine_args_and_missing_sglang():
    def refuse(**kwargs):
        raise TypeError("__init__() got an unexpected keyword argument 'bogus'")

    with pytest.raises(UsageError, match="SGLang rejected the engine arguments.*bogus"):
        SGLangColocatedEngine(SGLangOptions(), BuildContext(model_path="/m"), engine_factory=refuse)
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(RlcoreError, match=r"pip install 'sglang==0\.5\.23'.*mode = 'server'"):
            import_sglang()
