"""Options and argument translation, checked against vLLM's real names (data files), no vLLM import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rlcore_rollout_vllm.names import VERSIONS, names
from rlcore_rollout_vllm.options import VLLMOptions
from rlcore_rollout_vllm.translate import completion_body, engine_kwargs, lora_rank, sampling_kwargs

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, SamplingParams


def test_name_lists_are_the_real_ones():
    for version in VERSIONS:
        args = names("engine-args", version)
        assert {"gpu_memory_utilization", "enable_sleep_mode", "max_lora_rank", "logprobs_mode"} <= args
        assert "top_k" in names("sampling-params", version)
        assert {"return_token_ids", "return_tokens_as_token_ids"} <= names("completion-request", version)
    assert "max_long_partial_prefills" in names("engine-args", "0.26.0")
    assert "max_long_partial_prefills" not in names("engine-args", "0.33.0")


@pytest.mark.parametrize("version", VERSIONS)
def test_translated_names_exist_in_every_supported_version(version):
    opts = VLLMOptions(
        max_num_seqs=64, max_model_len=1024, lora_rank=12, engine_args={"kv_cache_dtype": "auto"}
    )
    kwargs = engine_kwargs(opts, BuildContext(model_path="/m", dtype="bfloat16", seed=3))
    assert set(kwargs) <= names("engine-args", version)
    assert (
        kwargs["max_lora_rank"] == 16
        and kwargs["enable_lora"]
        and kwargs["seed"] == 3
        and kwargs["dtype"] == "bfloat16"
    )
    params = SamplingParams(n=2, temperature=0.7, top_k=-1, stop=["\n"], seed=1)
    assert set(sampling_kwargs(params)) <= names("sampling-params", version)
    assert sampling_kwargs(params)["top_k"] == 0
    assert set(completion_body("m", [1, 2], params)) <= names("completion-request", version)


def test_greedy_asks_for_one_sample():
    assert sampling_kwargs(SamplingParams(n=4, temperature=0.0))["n"] == 1
    assert completion_body("m", [1], SamplingParams(n=4, temperature=0.0))["n"] == 1
    assert lora_rank(VLLMOptions(lora_rank=100)) == 128


def _error(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        VLLMOptions(**kwargs)
    return str(info.value)


def test_unknown_engine_arg_names_the_valid_ones():
    msg = _error(engine_args={"kv_cache_dtpye": "fp8"})
    assert "did you mean 'kv_cache_dtype'" in msg and "Valid names:" in msg
    assert "kv_cache_dtpye" in msg


def test_engine_arg_with_its_own_option_is_refused():
    assert "set rollout.gpu_memory_utilization instead" in _error(engine_args={"gpu_memory_utilization": 0.3})


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(gpu_memory_utilization=1.5), "less than or equal to 1"),
        (dict(tensor_parallel_size=0), "greater than or equal to 1"),
        (dict(mode="server"), "needs servers"),
        (dict(servers=["http://a:1"]), "only used with mode = 'server'"),
        (dict(mode="server", servers=["a:1"]), "base URL"),
        (dict(sleep_level=3), "sleep_level"),
    ],
)
def test_out_of_range_values(kwargs, needle):
    assert needle in _error(**kwargs)


def test_rlcore_validate_rejects_bad_engine_options(tmp_path):
    manifest = tmp_path / "run.toml"
    manifest.write_text(
        '[model]\npath = "m"\n[data]\ntrain = "synthetic:addition"\n[reward]\nfunction = "exact_match"\n'
        '[trainer]\nsteps = 1\n[rollout]\nengine = "vllm"\ngpu_memory_utilisation = 0.3\n'
        "engine_args = { enforce_eagre = true }\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "validate", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "rollout.gpu_memory_utilisation" in out and "gpu_memory_utilization" in out
    assert "enforce_eagre" in out and "did you mean 'enforce_eager'" in out
    assert "Traceback" not in out


def test_plugin_module_imports_nothing_heavy():
    code = "import sys, rlcore_rollout_vllm.plugin, rlcore_rollout_vllm.options; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert out == "False False"


def test_gguf_and_missing_model_are_usage_errors():
    with pytest.raises(UsageError, match=r"the vllm engine needs a model: set \[model\] path"):
        engine_kwargs(VLLMOptions(), BuildContext())
    with pytest.raises(UsageError, match="gguf_file is not supported, use the hf engine"):
        engine_kwargs(VLLMOptions(), BuildContext(model_path="/m", gguf_file="x.gguf"))
    assert engine_kwargs(VLLMOptions(model="/own"), BuildContext(model_path="/m"))["model"] == "/own"


@pytest.mark.parametrize("version", VERSIONS)
def test_fp8_quantization_passes_through_with_the_mismatch_correction_on(version):
    opts = VLLMOptions(quantization="fp8")
    corrected = BuildContext(
        model_path="/m", manifest={"algorithm": {"rollout_correction": "token_truncate"}}
    )
    kwargs = engine_kwargs(opts, corrected)
    assert kwargs["quantization"] == "fp8" and set(kwargs) <= names("engine-args", version)
    assert "quantization" not in engine_kwargs(VLLMOptions(), corrected)
    with pytest.raises(UsageError, match=r'quantization = "fp8".*rollout_correction'):
        engine_kwargs(opts, BuildContext(model_path="/m", manifest={"algorithm": {"advantage": "grpo"}}))
    assert "set rollout.quantization instead" in _error(engine_args={"quantization": "fp8"})
    assert "fp8" in _error(quantization="int4")


def test_lora_adapters_are_taken_only_when_vllm_starts_with_lora():
    from rlcore_rollout_vllm.colocated import VLLMColocatedEngine
    from rlcore_rollout_vllm.server import VLLMServerEngine

    from rlcore.trainer.lora import takes_adapters

    for cls in (VLLMColocatedEngine, VLLMServerEngine):
        engine = cls.__new__(cls)  # the options alone decide; nothing is started
        engine.options = VLLMOptions(lora_rank=16)
        assert takes_adapters(engine)
        engine.options = VLLMOptions()
        assert not takes_adapters(engine)
